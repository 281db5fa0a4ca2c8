//! The Redis adapter: production storage shared by every instance.
//!
//! Each state change is one Lua script (`lua/*.lua`, each headed with its
//! keys, arguments, return value and why it must be atomic). Every key of a
//! queue carries the `{queue}` hash tag, so a queue's scripts touch one
//! cluster slot. Calls go over one multiplexed, self-reconnecting
//! connection with a short response timeout, and each call as a whole is
//! bounded by [`CALL_TIMEOUT`], so an unreachable or silent Redis turns
//! into [`StoreError::Unavailable`] quickly instead of hanging requests,
//! background tasks or a shutdown.

mod door;
mod events;
mod scripts;

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Client, RedisError};

use super::{
    ClaimOutcome, EnterOutcome, Pass, QueueEvent, QueueStats, Store, StoreError, StoreEvent,
    StoreResult,
};
use crate::queue::{EntryToken, Policy, QueueName, Snapshot, Standing, UserId};
use scripts::Scripts;

/// The Redis store.
pub struct RedisStore {
    client: Client,
    conn: ConnectionManager,
    prefix: String,
    scripts: Scripts,
    /// `lua/note_joins.lua` (join challenges, `door.rs`).
    note_joins: redis::Script,
}

/// How long Redis may take to answer one command, or to accept one
/// connection attempt.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// The most one store call may take in all, then it fails closed (`503`).
/// The response timeout alone does not bound a call: one that waits for a
/// reconnection to a Redis that accepts connections but never answers (a
/// frozen process, a silent partition) waits for every connection attempt
/// in turn, the response timeout each. Room for two slow commands: a
/// script call after a Redis restart is a reload and a second call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs one store call within [`CALL_TIMEOUT`].
async fn bounded<T>(call: impl Future<Output = Result<T, RedisError>>) -> StoreResult<T> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(StoreError::Unavailable(format!(
            "no answer within {CALL_TIMEOUT:?}"
        ))),
    }
}

impl From<RedisError> for StoreError {
    fn from(e: RedisError) -> Self {
        if e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
        {
            StoreError::Unavailable(e.to_string())
        } else {
            StoreError::Protocol(e.to_string())
        }
    }
}

/// One row of `describe()` in `common.lua`.
type Row = (String, i64, i64, i64, String, i64, i64, u64, u64);

impl RedisStore {
    /// Connects to `url` with keys under `prefix`. Fails if Redis does not
    /// answer now; later outages are survived by reconnecting.
    pub async fn connect(url: &str, prefix: &str) -> StoreResult<Self> {
        let client = Client::open(url).map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client.clone(), config).await?;
        Ok(Self {
            client,
            conn,
            prefix: prefix.to_owned(),
            scripts: Scripts::load(),
            note_joins: door::note_joins_script(),
        })
    }

    /// The key prefix this store writes under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The ticket secret shared by every instance: generated once, kept in
    /// Redis with `SET NX`, so instances started without `--ticket-secret`
    /// still accept each other's tickets.
    pub async fn shared_secret(&self) -> StoreResult<String> {
        let key = format!("{}:ticket-secret", self.prefix);
        let candidate = EntryToken::generate();
        let mut conn = self.conn.clone();
        let _: Option<String> = bounded(
            redis::cmd("SET")
                .arg(&key)
                .arg(candidate.as_str())
                .arg("NX")
                .query_async(&mut conn),
        )
        .await?;
        bounded(conn.get(&key)).await
    }

    fn keys(&self, queue: &QueueName) -> QueueKeys {
        QueueKeys::new(&self.prefix, queue)
    }

    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        queue: &QueueName,
        args: impl FnOnce(&mut redis::ScriptInvocation<'_>),
    ) -> StoreResult<T> {
        let keys = self.keys(queue);
        let mut invocation = script.prepare_invoke();
        for key in keys.script_keys() {
            invocation.key(key);
        }
        invocation.arg(&keys.token_prefix).arg(&keys.channel);
        args(&mut invocation);
        let mut conn = self.conn.clone();
        bounded(invocation.invoke_async(&mut conn)).await
    }
}

/// The names of one queue's keys.
pub(crate) struct QueueKeys {
    base: String,
    token_prefix: String,
    channel: String,
}

impl QueueKeys {
    pub(crate) fn new(prefix: &str, queue: &QueueName) -> Self {
        let base = format!("{prefix}:{{{queue}}}:");
        Self {
            token_prefix: format!("{base}token:"),
            channel: format!("{base}events"),
            base,
        }
    }

    fn script_keys(&self) -> [String; 8] {
        [
            "waiting", "seq", "entered", "seen", "active", "bucket", "pass", "paused",
        ]
        .map(|k| format!("{}{k}", self.base))
    }

    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }
}

fn snapshot(row: Row) -> StoreResult<(bool, Snapshot)> {
    // `seq` is the entry id: the line's order while waiting, the entry the
    // token was issued to once admitted.
    let (kind, created, rank, seq, token, ttl_ms, entered_at, total, pass) = row;
    let standing = match kind.as_str() {
        "ready" => Standing::Ready {
            token: EntryToken::from_stored(token),
            expires_in_ms: ttl_ms.max(0) as u64,
        },
        "waiting" => Standing::Waiting {
            rank: rank.max(0) as u64,
            seq: seq.max(0) as u64,
        },
        "none" => Standing::NotEntered,
        other => return Err(StoreError::Protocol(format!("unknown standing {other}"))),
    };
    let entered = standing != Standing::NotEntered;
    let entered_at_ms = (entered_at >= 0 && entered).then_some(entered_at as u64);
    let entry = (seq >= 0 && entered).then_some(seq as u64);
    Ok((
        created == 1,
        Snapshot {
            standing,
            total_waiting: total,
            entered_at_ms,
            pass,
            entry,
        },
    ))
}

fn max_active_arg(policy: &Policy) -> i64 {
    policy.max_active.map_or(-1, |m| m as i64)
}

#[async_trait]
impl Store for RedisStore {
    async fn enter(
        &self,
        queue: &QueueName,
        user: &UserId,
        policy: &Policy,
        fast_track_token: &EntryToken,
    ) -> StoreResult<EnterOutcome> {
        let row: Row = self
            .run(&self.scripts.enter, queue, |inv| {
                inv.arg(user.as_str())
                    .arg(fast_track_token.as_str())
                    .arg(policy.token_ttl_ms)
                    .arg(policy.batch)
                    .arg(policy.interval_ms)
                    .arg(max_active_arg(policy))
                    .arg(super::first_entry_id());
            })
            .await?;
        let (created, snapshot) = snapshot(row)?;
        Ok(EnterOutcome { created, snapshot })
    }

    async fn status(&self, queue: &QueueName, user: &UserId, touch: bool) -> StoreResult<Snapshot> {
        let row: Row = self
            .run(&self.scripts.status, queue, |inv| {
                inv.arg(user.as_str()).arg(if touch { "1" } else { "0" });
            })
            .await?;
        Ok(snapshot(row)?.1)
    }

    async fn statuses(&self, queue: &QueueName, users: &[UserId]) -> StoreResult<Vec<Snapshot>> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<Row> = self
            .run(&self.scripts.statuses, queue, |inv| {
                for u in users {
                    inv.arg(u.as_str());
                }
            })
            .await?;
        rows.into_iter().map(|r| snapshot(r).map(|s| s.1)).collect()
    }

    async fn touch(&self, queue: &QueueName, users: &[UserId]) -> StoreResult<()> {
        if users.is_empty() {
            return Ok(());
        }
        let _: i64 = self
            .run(&self.scripts.touch, queue, |inv| {
                for u in users {
                    inv.arg(u.as_str());
                }
            })
            .await?;
        Ok(())
    }

    async fn leave(&self, queue: &QueueName, user: &UserId, entry: u64) -> StoreResult<bool> {
        let n: i64 = self
            .run(&self.scripts.leave, queue, |inv| {
                inv.arg(user.as_str()).arg(entry);
            })
            .await?;
        Ok(n == 1)
    }

    async fn admit(
        &self,
        queue: &QueueName,
        policy: &Policy,
        tokens: &[EntryToken],
    ) -> StoreResult<Pass> {
        let json: String = self
            .run(&self.scripts.admit, queue, |inv| {
                inv.arg(policy.token_ttl_ms)
                    .arg(policy.batch)
                    .arg(policy.interval_ms)
                    .arg(max_active_arg(policy))
                    .arg(policy.abandon_after_ms.unwrap_or(0));
                for t in tokens {
                    inv.arg(t.as_str());
                }
            })
            .await?;
        match serde_json::from_str(&json) {
            Ok(QueueEvent::Pass(pass)) => Ok(pass),
            Ok(other) => Err(StoreError::Protocol(format!("admit returned {other:?}"))),
            Err(e) => Err(StoreError::Protocol(format!(
                "admit returned bad JSON: {e}"
            ))),
        }
    }

    async fn claim(
        &self,
        queue: &QueueName,
        user: &UserId,
        presented: &str,
        lease_ms: u64,
    ) -> StoreResult<ClaimOutcome> {
        let claim_id = EntryToken::generate();
        let reply: Vec<String> = self
            .run(&self.scripts.claim, queue, |inv| {
                inv.arg(user.as_str())
                    .arg(presented)
                    .arg(lease_ms)
                    .arg(claim_id.as_str());
            })
            .await?;
        match reply.first().map(String::as_str) {
            Some("claimed") => Ok(ClaimOutcome::Claimed {
                claim_id: claim_id.as_str().to_owned(),
            }),
            Some("invalid") => Ok(ClaimOutcome::Invalid),
            Some("in_use") => Ok(ClaimOutcome::InUse),
            other => Err(StoreError::Protocol(format!("claim returned {other:?}"))),
        }
    }

    async fn consume(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool> {
        let n: i64 = self
            .run(&self.scripts.consume, queue, |inv| {
                inv.arg(user.as_str()).arg(claim_id);
            })
            .await?;
        Ok(n == 1)
    }

    async fn release(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool> {
        let n: i64 = self
            .run(&self.scripts.release, queue, |inv| {
                inv.arg(user.as_str()).arg(claim_id);
            })
            .await?;
        Ok(n == 1)
    }

    async fn stats(&self, queue: &QueueName) -> StoreResult<QueueStats> {
        let (waiting, active, pass, paused): (u64, u64, u64, u8) =
            self.run(&self.scripts.stats, queue, |_| {}).await?;
        Ok(QueueStats {
            waiting,
            active,
            pass,
            paused: paused == 1,
        })
    }

    async fn set_paused(&self, queue: &QueueName, paused: bool) -> StoreResult<bool> {
        let changed: i64 = self
            .run(&self.scripts.pause, queue, |inv| {
                inv.arg(if paused { "1" } else { "0" });
            })
            .await?;
        Ok(changed == 1)
    }

    async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let _: String = bounded(redis::cmd("PING").query_async(&mut conn)).await?;
        Ok(())
    }

    fn subscribe(&self, queues: &[QueueName]) -> BoxStream<'static, StoreEvent> {
        events::subscribe(self.client.clone(), &self.prefix, queues)
    }

    async fn renew_claim(
        &self,
        queue: &QueueName,
        user: &UserId,
        claim_id: &str,
        lease_ms: u64,
    ) -> StoreResult<bool> {
        let n: i64 = self
            .run(&self.scripts.renew_claim, queue, |inv| {
                inv.arg(user.as_str()).arg(claim_id).arg(lease_ms);
            })
            .await?;
        Ok(n == 1)
    }
    async fn spend_once(&self, queue: &QueueName, key: &str, ttl_ms: u64) -> StoreResult<bool> {
        self.door_spend_once(queue, key, ttl_ms).await
    }

    async fn note_joins(
        &self,
        queue: &QueueName,
        joins: u64,
        threshold: u64,
        hold_ms: u64,
    ) -> StoreResult<u64> {
        self.door_note_joins(queue, joins, threshold, hold_ms).await
    }
}
