//! The Redis adapter: production storage shared by every instance.
//!
//! Each state change is one Lua script (`lua/*.lua`, each headed with its
//! keys, arguments, return value and why it must be atomic). Every key of a
//! queue carries the `{queue}` hash tag, so a queue's scripts touch one
//! cluster slot, and every key a script touches is in its `KEYS` wherever
//! the user is known (only `admit` learns its users inside the script).
//! Calls go over one multiplexed, self-reconnecting connection — to one
//! Redis or to a Redis Cluster, see `conn.rs`, the only place that knows
//! which — with a short response timeout, and each call as a whole is
//! bounded by [`CALL_TIMEOUT`], so an unreachable or silent Redis turns
//! into [`StoreError::Unavailable`] quickly instead of hanging requests,
//! background tasks or a shutdown.
//!
//! Joins of one queue are grouped (group commit, `batch.rs`): many joins
//! per `enter_many.lua` call, each answered from its own row, in order.
//!
//! With `wait_replicas` (`--redis-wait-replicas`), a join and an admission
//! pass are answered or published only after that many replicas
//! acknowledged them (`WAIT`), so a master killed right after cannot take
//! an acknowledged place or an announced token along.

mod adaptive;
mod audit;
mod batch;
mod conn;
mod door;
mod events;
mod lottery;
mod scripts;
mod settings;

pub use batch::{
    DEFAULT_DEPTH as DEFAULT_JOIN_BATCH_DEPTH, DEFAULT_MAX as DEFAULT_JOIN_BATCH_MAX,
    DEFAULT_WINDOW_US as DEFAULT_JOIN_BATCH_WINDOW_US, JoinBatch,
};
pub use conn::Topology;

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use redis::{AsyncCommands, RedisError};

use super::{
    AdaptiveRead, AdaptiveState, AddressLimits, ClaimOutcome, DrawStep, EnterOutcome, JoinLimits,
    LimitKind, Limited, LotteryRefusal, LotteryState, OrderSignal, PLACES_RETRY_MS, Pass, PreEntry,
    PreJoin, QueueEvent, QueueStats, Rate, StockState, Store, StoreError, StoreEvent, StoreResult,
};
use crate::queue::audit::{AuditEntry, AuditId, AuditPage, AuditQuery};
use crate::queue::{
    EntryToken, Policy, QueueName, QueueSettings, Snapshot, Standing, StockReport, StoredSettings,
    UserId,
};
use batch::{Batcher, JoinCall, JoinShared};
use conn::Conn;
use scripts::{Publishing, Scripts};

/// The Redis store.
pub struct RedisStore {
    topology: Topology,
    conn: Conn,
    prefix: String,
    scripts: Scripts,
    wait_replicas: u32,
    /// `lua/note_joins.lua` (join challenges, `door.rs`).
    note_joins: redis::Script,
    /// `lua/put_settings.lua` (live queue settings, `settings.rs`).
    put_settings: redis::Script,
    /// Group commit of joins (`batch.rs`); `None`: one call per join.
    batcher: Option<Batcher>,
    /// How joins are grouped, kept so the batcher can be rebuilt when the
    /// scripts are ([`RedisStore::with_audit_max_len`]).
    join_batch: Option<JoinBatch>,
    /// How the scripts publish and log (their prelude).
    publishing: Publishing,
    /// This store's id as the holder of a queue's admission turn
    /// (`lua/turn.lua`): random, so two instances never share one.
    turn_holder: String,
}

/// How to reach Redis and how safe a write must be before it counts.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// One Redis or a cluster.
    pub topology: Topology,
    /// Replicas that must acknowledge a join or an admission pass before it
    /// is answered or published (0: none, asynchronous replication).
    pub wait_replicas: u32,
}

/// How long `WAIT` may wait for replicas before the write counts as not
/// safe (the call then fails closed, `503`). Well inside [`CALL_TIMEOUT`].
const WAIT_TIMEOUT: Duration = Duration::from_secs(1);

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

/// Runs `script` with `keys` (every key it touches) and, after the queue's
/// two common arguments, `args`. With `wait_replicas`, the script and
/// `WAIT` go as one pipeline on one connection, and the call fails closed
/// when fewer replicas acknowledged within [`WAIT_TIMEOUT`].
async fn eval_durable<'a>(
    conn: &Conn,
    script: &redis::Script,
    queue: &QueueKeys,
    keys: &[String],
    args: impl Iterator<Item = &'a [u8]>,
    wait_replicas: u32,
) -> StoreResult<redis::Value> {
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha
        .arg(script.get_hash())
        .arg(keys.len())
        .arg(keys)
        .arg(&queue.token_prefix)
        .arg(&queue.channel);
    for arg in args {
        evalsha.arg(arg);
    }
    send_durable(conn, script, &evalsha, &queue.channel, wait_replicas).await
}

/// Sends `evalsha` (an `EVALSHA` of `script`, built by the caller), loading
/// the script first where the node's cache misses it; with
/// `wait_replicas`, as [`eval_durable`] says. `channel` names the queue's
/// slot (the master the pair must go to in a cluster).
async fn send_durable(
    conn: &Conn,
    script: &redis::Script,
    evalsha: &redis::Cmd,
    channel: &str,
    wait_replicas: u32,
) -> StoreResult<redis::Value> {
    let mut conn = conn.clone();
    if wait_replicas == 0 {
        return bounded(async {
            match evalsha.query_async(&mut conn).await {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    script.load_async(&mut conn).await?;
                    evalsha.query_async(&mut conn).await
                }
                other => other,
            }
        })
        .await;
    }
    let (value, acked) =
        bounded(conn.eval_and_wait(script, evalsha, channel, wait_replicas, WAIT_TIMEOUT)).await?;
    if acked < i64::from(wait_replicas) {
        return Err(StoreError::Unavailable(format!(
            "{acked} of {wait_replicas} replicas acknowledged within {WAIT_TIMEOUT:?}"
        )));
    }
    Ok(value)
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

/// A reply row: `describe()` with the flags `with_stock()` appends
/// (`common.lua`), or a refusal of `gcra.lua`, which has none.
fn split_row(mut values: Vec<redis::Value>) -> StoreResult<(Row, Flags)> {
    let flags = if values.len() == 10 {
        let flag = values.pop().unwrap_or(redis::Value::Nil);
        let bits = redis::from_redis_value::<i64>(flag).map_err(RedisError::from)?;
        Flags {
            sold_out: bits & 1 == 1,
            paused: bits & 2 == 2,
        }
    } else {
        Flags::default()
    };
    let row = redis::from_redis_value(redis::Value::Array(values)).map_err(RedisError::from)?;
    Ok((row, flags))
}

/// The flags `row_flags()` (`common.lua`) appends to a row.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Flags {
    pub sold_out: bool,
    pub paused: bool,
}

impl RedisStore {
    /// Connects to `url` with keys under `prefix`. Fails if Redis does not
    /// answer now; later outages are survived by reconnecting.
    pub async fn connect(url: &str, prefix: &str) -> StoreResult<Self> {
        let options = RedisOptions {
            topology: Topology::Single(url.to_owned()),
            wait_replicas: 0,
        };
        Self::open(&options, prefix).await
    }

    /// Connects to one Redis or a cluster as `options` say, with keys under
    /// `prefix`. Fails if the store does not answer now.
    pub async fn open(options: &RedisOptions, prefix: &str) -> StoreResult<Self> {
        if let Topology::Single(url) = &options.topology {
            // A malformed URL is a configuration mistake, reported as such.
            redis::Client::open(url.as_str())
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        }
        let durable = options.wait_replicas > 0;
        // Not bounded by CALL_TIMEOUT: a Redis still loading its AOF at
        // start is waited for by the connection's own retries.
        let conn = Conn::connect(&options.topology, RESPONSE_TIMEOUT, durable).await?;
        let publishing = Publishing {
            sharded: options.topology.sharded(),
            pass_in_script: options.wait_replicas == 0,
            audit_max_len: crate::queue::audit::DEFAULT_AUDIT_MAX_LEN,
        };
        Ok(Self {
            topology: options.topology.clone(),
            conn,
            prefix: prefix.to_owned(),
            scripts: Scripts::load(publishing),
            wait_replicas: options.wait_replicas,
            note_joins: door::note_joins_script(),
            put_settings: settings::put_settings_script(),
            batcher: None,
            join_batch: None,
            publishing,
            turn_holder: format!("{:016x}", rand::random::<u64>()),
        }
        .with_join_batch(Some(JoinBatch::default())))
    }

    /// Groups joins as `batch` says (group commit), or sends one script
    /// call per join with `None`. Grouped by default.
    pub fn with_join_batch(mut self, batch: Option<JoinBatch>) -> Self {
        self.join_batch = batch;
        self.batcher = batch.map(|batch| {
            Batcher::new(
                self.conn.clone(),
                self.scripts.enter_many.clone(),
                &self.prefix,
                self.wait_replicas,
                batch,
            )
        });
        self
    }

    /// Keeps about `max_len` entries of each queue's audit log (`MAXLEN ~`),
    /// or none at all with 0: no script then writes the log. The default is
    /// [`crate::queue::audit::DEFAULT_AUDIT_MAX_LEN`].
    pub fn with_audit_max_len(mut self, max_len: u64) -> Self {
        self.publishing.audit_max_len = max_len;
        self.scripts = Scripts::load(self.publishing);
        let batch = self.join_batch;
        self.with_join_batch(batch)
    }

    /// The key prefix this store writes under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The ticket secret shared by every instance: generated once, kept in
    /// Redis with `SET NX`, so instances started without `--ticket-secret`
    /// still accept each other's tickets.
    /// In a cluster the key lives on whichever master owns its slot; it is
    /// written once and read by every instance at start only.
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

    /// The audit log's key, as the last key of a script that writes it.
    fn audit_key(&self, queue: &QueueName) -> Vec<String> {
        vec![self.keys(queue).audit()]
    }

    /// Runs a script whose write must be on `wait_replicas` replicas before
    /// it counts (a join, an admission pass): see [`eval_durable`]. The
    /// keys are laid out as [`RedisStore::run_for`] lays them out.
    async fn run_durable<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        queue: &QueueName,
        users: &[&UserId],
        extra_keys: Vec<String>,
        args: impl FnOnce(&mut redis::Cmd),
    ) -> StoreResult<T> {
        let mut extra = redis::Cmd::new();
        args(&mut extra);
        let keys = self.keys(queue);
        let mut all: Vec<String> = keys.script_keys().into();
        all.extend(users.iter().map(|u| keys.token_key(u)));
        all.extend(extra_keys);
        let args = extra.args_iter().filter_map(|arg| match arg {
            redis::Arg::Simple(bytes) => Some(bytes),
            _ => None,
        });
        let value = eval_durable(&self.conn, script, &keys, &all, args, self.wait_replicas).await?;
        Ok(redis::from_redis_value(value).map_err(RedisError::from)?)
    }

    /// Runs a queue-wide script: the queue's keys in `KEYS[1..8]`.
    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        queue: &QueueName,
        args: impl FnOnce(&mut redis::ScriptInvocation<'_>),
    ) -> StoreResult<T> {
        self.run_for(script, queue, &[], Vec::new(), args).await
    }

    /// Runs a script about `users`: the queue's keys, then each user's
    /// token key (`KEYS[9..]`), then `extra_keys` of the script's own
    /// (built from the queue's key names, so they share its hash tag), so
    /// every key the script touches is declared.
    async fn run_for<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        queue: &QueueName,
        users: &[&UserId],
        extra_keys: Vec<String>,
        args: impl FnOnce(&mut redis::ScriptInvocation<'_>),
    ) -> StoreResult<T> {
        let keys = self.keys(queue);
        let mut invocation = script.prepare_invoke();
        for key in keys.script_keys() {
            invocation.key(key);
        }
        for user in users {
            invocation.key(keys.token_key(user));
        }
        for key in extra_keys {
            invocation.key(key);
        }
        invocation.arg(&keys.token_prefix).arg(&keys.channel);
        args(&mut invocation);
        let mut conn = self.conn.clone();
        bounded(invocation.invoke_async(&mut conn)).await
    }
}

impl RedisStore {
    /// `lua/stock.lua`: records `report`, or only reads without one.
    async fn run_stock(
        &self,
        queue: &QueueName,
        report: Option<StockReport>,
    ) -> StoreResult<Option<StockState>> {
        let reply: Vec<u64> = self
            .run_for(
                &self.scripts.stock,
                queue,
                &[],
                vec![self.keys(queue).stock(), self.keys(queue).audit()],
                |inv| match report {
                    Some(r) => {
                        inv.arg(r.remaining).arg(r.per_buyer.max(1));
                    }
                    None => {
                        inv.arg("").arg(0);
                    }
                },
            )
            .await?;
        match reply[..] {
            [] => Ok(None),
            [
                remaining,
                per_buyer,
                consumed,
                holders,
                admissible,
                sold_out,
            ] => Ok(Some(StockState {
                remaining,
                per_buyer,
                consumed_since_report: consumed,
                holders,
                admissible,
                sold_out: sold_out == 1,
            })),
            _ => Err(StoreError::Protocol(format!(
                "stock.lua returned {reply:?}"
            ))),
        }
    }

    /// One join as `join.lua` takes it: who joins, and what every join of
    /// a group shares (the queue's policy, the limits' numbers).
    fn join_call(
        &self,
        user: &UserId,
        policy: &Policy,
        fast_track_token: &EntryToken,
        limits: &JoinLimits,
    ) -> JoinCall {
        let (budget_period, budget_burst) = rate_args(limits.buyer.map(|b| b.rate));
        let address = limits.address.as_ref();
        let (join_period, join_burst) = rate_args(address.and_then(|a| a.joins));
        JoinCall {
            user: user.clone(),
            token: fast_track_token.clone(),
            address: address.map(|a| a.key.clone()),
            shared: JoinShared {
                token_ttl_ms: policy.token_ttl_ms,
                batch: policy.batch,
                interval_ms: policy.interval_ms,
                max_active: max_active_arg(policy),
                budget_period,
                budget_burst,
                grace_ms: limits.buyer.map_or(0, |b| b.grace_ms),
                join_period,
                join_burst,
                places: address.and_then(|a| a.places).unwrap_or(0),
            },
        }
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

    /// The queue's admission turn (`lua/turn.lua`).
    fn turn(&self) -> String {
        format!("{}turn", self.base)
    }

    /// The queue's settings hash (`lua/put_settings.lua`).
    fn settings(&self) -> String {
        format!("{}settings", self.base)
    }

    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// The key of `user`'s token hash.
    fn token_key(&self, user: &UserId) -> String {
        format!("{}{}", self.token_prefix, user.as_str())
    }

    /// The queue's audit log (a STREAM, `lua/common.lua`'s `audit`).
    pub(crate) fn audit(&self) -> String {
        format!("{}audit", self.base)
    }

    /// The queue's stock (`lua/stock.lua`).
    fn stock(&self) -> String {
        format!("{}stock", self.base)
    }

    /// `user`'s request budget in this queue.
    fn budget(&self, user: &UserId) -> String {
        format!("{}{user}", self.budget_prefix())
    }

    /// What [`QueueKeys::budget`] puts before the user id.
    fn budget_prefix(&self) -> String {
        format!("{}budget:", self.base)
    }

    /// A client address's join rate and places in this queue.
    fn address(&self, address: &str) -> [String; 2] {
        let prefix = self.address_prefix();
        [
            format!("{prefix}{address}:joins"),
            format!("{prefix}{address}:places"),
        ]
    }

    /// What [`QueueKeys::address`] puts before the address.
    fn address_prefix(&self) -> String {
        format!("{}addr:", self.base)
    }
}

/// A refusal row of `gcra.lua`'s `limited()`, if `row` is one.
fn refusal(row: &Row) -> StoreResult<Option<Limited>> {
    if row.0 != "limited" {
        return Ok(None);
    }
    let kind = match row.4.as_str() {
        "buyer" => LimitKind::Buyer,
        "address_joins" => LimitKind::AddressJoins,
        "address_places" => LimitKind::AddressPlaces,
        other => return Err(StoreError::Protocol(format!("unknown limit {other}"))),
    };
    let retry_after_ms = match kind {
        LimitKind::AddressPlaces => PLACES_RETRY_MS,
        _ => row.5.max(1) as u64,
    };
    Ok(Some(Limited {
        kind,
        retry_after_ms,
    }))
}

/// The arguments of a rate: period and burst, `0 0` for none.
fn rate_args(rate: Option<Rate>) -> (u64, u32) {
    rate.map_or((0, 0), |r| (r.period_ms.max(1), r.burst.max(1)))
}

fn snapshot((row, flags): (Row, Flags)) -> StoreResult<(bool, Snapshot)> {
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
            sold_out: flags.sold_out,
            paused: flags.paused,
        },
    ))
}

fn max_active_arg(policy: &Policy) -> i64 {
    policy.max_active.map_or(-1, |m| m as i64)
}

#[async_trait]
impl Store for RedisStore {
    async fn enter_limited(
        &self,
        queue: &QueueName,
        user: &UserId,
        policy: &Policy,
        fast_track_token: &EntryToken,
        limits: &JoinLimits,
    ) -> StoreResult<Result<EnterOutcome, Limited>> {
        let call = self.join_call(user, policy, fast_track_token, limits);
        let row = match &self.batcher {
            Some(batcher) => batcher.join(queue, call).await?,
            None => {
                let queue_keys = self.keys(queue);
                // Placeholder keys, which the script does not touch, for
                // an address without limits.
                let [joins, places] = queue_keys.address(call.address.as_deref().unwrap_or("-"));
                let [lot, pre, _] = queue_keys.lottery();
                let keys = vec![
                    queue_keys.budget(user),
                    joins,
                    places,
                    queue_keys.stock(),
                    queue_keys.audit(),
                    lot,
                    pre,
                ];
                let reply: Vec<redis::Value> = self
                    .run_durable(&self.scripts.enter, queue, &[user], keys, |cmd| {
                        cmd.arg(user.as_str()).arg(call.token.as_str());
                        call.shared.push_args(super::first_entry_id(), cmd);
                    })
                    .await?;
                split_row(reply)?
            }
        };
        if let Some(limited) = refusal(&row.0)? {
            return Ok(Err(limited));
        }
        if row.0.0 == "prequeue" {
            return Ok(Ok(EnterOutcome::pre_queue(row.0.7)));
        }
        let (created, snapshot) = snapshot(row)?;
        Ok(Ok(EnterOutcome {
            created,
            snapshot,
            pre_queue: false,
        }))
    }

    async fn status_limited(
        &self,
        queue: &QueueName,
        user: &UserId,
        touch: bool,
        budget: Option<Rate>,
    ) -> StoreResult<Result<Snapshot, Limited>> {
        let (period, burst) = rate_args(budget);
        let keys = self.keys(queue);
        let reply: Vec<redis::Value> = self
            .run_for(
                &self.scripts.status,
                queue,
                &[user],
                vec![keys.budget(user), keys.stock()],
                |inv| {
                    inv.arg(user.as_str())
                        .arg(if touch { "1" } else { "0" })
                        .arg(period)
                        .arg(burst);
                },
            )
            .await?;
        let row = split_row(reply)?;
        if let Some(limited) = refusal(&row.0)? {
            return Ok(Err(limited));
        }
        Ok(Ok(snapshot(row)?.1))
    }

    async fn spend(&self, bucket: &str, rate: Rate) -> StoreResult<Result<(), Limited>> {
        // A bucket of its own hash tag: it belongs to no queue.
        let key = format!("{}:{{limit:{bucket}}}", self.prefix);
        let (period, burst) = rate_args(Some(rate));
        let mut invocation = self.scripts.spend.prepare_invoke();
        invocation.key(key).arg(period).arg(burst);
        let mut conn = self.conn.clone();
        let wait: i64 = bounded(invocation.invoke_async(&mut conn)).await?;
        Ok(if wait > 0 {
            Err(Limited {
                kind: LimitKind::Bucket,
                retry_after_ms: wait as u64,
            })
        } else {
            Ok(())
        })
    }

    async fn statuses(&self, queue: &QueueName, users: &[UserId]) -> StoreResult<Vec<Snapshot>> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<Vec<redis::Value>> = self
            .run_for(
                &self.scripts.statuses,
                queue,
                &users.iter().collect::<Vec<_>>(),
                vec![self.keys(queue).stock()],
                |inv| {
                    for u in users {
                        inv.arg(u.as_str());
                    }
                },
            )
            .await?;
        rows.into_iter()
            .map(|r| snapshot(split_row(r)?).map(|s| s.1))
            .collect()
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
            .run_for(
                &self.scripts.leave,
                queue,
                &[user],
                self.audit_key(queue),
                |inv| {
                    inv.arg(user.as_str()).arg(entry);
                },
            )
            .await?;
        Ok(n == 1)
    }

    async fn admit(
        &self,
        queue: &QueueName,
        policy: &Policy,
        tokens: &[EntryToken],
    ) -> StoreResult<Pass> {
        let keys = self.keys(queue);
        let json: String = self
            .run_durable(
                &self.scripts.admit,
                queue,
                &[],
                vec![keys.settings(), keys.stock(), keys.audit()],
                |inv| {
                    inv.arg(policy.token_ttl_ms)
                        .arg(policy.batch)
                        .arg(policy.interval_ms)
                        .arg(max_active_arg(policy))
                        .arg(policy.abandon_after_ms.unwrap_or(0));
                    for t in tokens {
                        inv.arg(t.as_str());
                    }
                },
            )
            .await?;
        let pass = match serde_json::from_str(&json) {
            Ok(QueueEvent::Pass(pass)) => pass,
            Ok(other) => return Err(StoreError::Protocol(format!("admit returned {other:?}"))),
            Err(e) => {
                return Err(StoreError::Protocol(format!(
                    "admit returned bad JSON: {e}"
                )));
            }
        };
        if self.wait_replicas > 0 {
            // The script left publishing to us: the tokens are announced
            // only now that replicas hold them.
            if pass.busy || !pass.abandoned.is_empty() {
                let mut conn = self.conn.clone();
                bounded(conn.publish(self.keys(queue).channel(), &json)).await?;
            }
        }
        Ok(pass)
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
            .run_for(&self.scripts.claim, queue, &[user], Vec::new(), |inv| {
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

    async fn token_holder(
        &self,
        queue: &QueueName,
        presented: &str,
    ) -> StoreResult<Option<UserId>> {
        let user: Option<String> = self
            .run_for(&self.scripts.token_holder, queue, &[], Vec::new(), |inv| {
                inv.arg(presented);
            })
            .await?;
        user.map(|u| {
            UserId::parse(&u).map_err(|e| {
                StoreError::Protocol(format!("token_holder returned a bad user id: {}", e.0))
            })
        })
        .transpose()
    }

    async fn consume(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool> {
        let stock = vec![self.keys(queue).stock(), self.keys(queue).audit()];
        let n: i64 = self
            .run_for(&self.scripts.consume, queue, &[user], stock, |inv| {
                inv.arg(user.as_str()).arg(claim_id);
            })
            .await?;
        Ok(n == 1)
    }

    async fn release(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool> {
        let n: i64 = self
            .run_for(
                &self.scripts.release,
                queue,
                &[user],
                self.audit_key(queue),
                |inv| {
                    inv.arg(user.as_str()).arg(claim_id);
                },
            )
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

    async fn take_pass_turn(&self, queue: &QueueName, hold_ms: u64) -> StoreResult<bool> {
        let mut inv = self.scripts.turn.prepare_invoke();
        inv.key(self.keys(queue).turn())
            .arg(self.turn_holder.as_str())
            .arg(hold_ms.max(1));
        let mut conn = self.conn.clone();
        let taken: i64 = bounded(inv.invoke_async(&mut conn)).await?;
        Ok(taken == 1)
    }

    async fn set_paused(&self, queue: &QueueName, paused: bool) -> StoreResult<bool> {
        let changed: i64 = self
            .run(&self.scripts.pause, queue, |inv| {
                inv.arg(if paused { "1" } else { "0" });
            })
            .await?;
        Ok(changed == 1)
    }

    async fn set_stock(&self, queue: &QueueName, report: StockReport) -> StoreResult<StockState> {
        self.run_stock(queue, Some(report))
            .await?
            .ok_or_else(|| StoreError::Protocol("stock.lua recorded no stock".into()))
    }

    async fn stock(&self, queue: &QueueName) -> StoreResult<Option<StockState>> {
        self.run_stock(queue, None).await
    }

    async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let _: String = bounded(redis::cmd("PING").query_async(&mut conn)).await?;
        Ok(())
    }

    fn subscribe(&self, queues: &[QueueName]) -> BoxStream<'static, StoreEvent> {
        events::subscribe(self.topology.clone(), &self.prefix, queues)
    }

    async fn renew_claim(
        &self,
        queue: &QueueName,
        user: &UserId,
        claim_id: &str,
        lease_ms: u64,
    ) -> StoreResult<bool> {
        let n: i64 = self
            .run_for(
                &self.scripts.renew_claim,
                queue,
                &[user],
                Vec::new(),
                |inv| {
                    inv.arg(user.as_str()).arg(claim_id).arg(lease_ms);
                },
            )
            .await?;
        Ok(n == 1)
    }
    async fn spend_once(&self, queue: &QueueName, key: &str, ttl_ms: u64) -> StoreResult<bool> {
        self.door_spend_once(queue, key, ttl_ms).await
    }

    async fn list_queues(&self) -> StoreResult<Vec<QueueName>> {
        self.settings_list().await
    }

    async fn queue_settings(&self, queue: &QueueName) -> StoreResult<Option<StoredSettings>> {
        self.settings_get(queue).await
    }

    async fn put_queue_settings(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
        only_if_new: bool,
    ) -> StoreResult<(StoredSettings, bool)> {
        self.settings_put(queue, settings, only_if_new).await
    }

    async fn report_streams(
        &self,
        instance: &str,
        streams: u64,
        ttl_ms: u64,
    ) -> StoreResult<Vec<(String, u64)>> {
        self.settings_report_streams(instance, streams, ttl_ms)
            .await
    }

    async fn delete_queue(&self, queue: &QueueName) -> StoreResult<bool> {
        self.settings_delete(queue).await
    }

    async fn record_order(
        &self,
        queue: &QueueName,
        signal: OrderSignal,
        window_ms: u64,
    ) -> StoreResult<()> {
        self.adaptive_record(queue, signal, window_ms).await
    }

    async fn adaptive_read(&self, queue: &QueueName, window_ms: u64) -> StoreResult<AdaptiveRead> {
        self.adaptive_load(queue, window_ms).await
    }

    async fn adaptive_apply(
        &self,
        queue: &QueueName,
        decision: &AdaptiveState,
        batch: Option<u32>,
        settings_version: u64,
        window_ms: u64,
    ) -> StoreResult<bool> {
        self.adaptive_store(queue, decision, batch, settings_version, window_ms)
            .await
    }

    async fn schedule_lottery(
        &self,
        queue: &QueueName,
        opens_at: u64,
        seed: &str,
    ) -> StoreResult<Result<LotteryState, LotteryRefusal>> {
        self.lottery_set(queue, opens_at, seed).await
    }

    async fn clear_lottery(&self, queue: &QueueName) -> StoreResult<Result<bool, LotteryRefusal>> {
        self.lottery_clear(queue).await
    }

    async fn lottery(&self, queue: &QueueName) -> StoreResult<Option<LotteryState>> {
        Ok(self.lottery_read(queue, false).await?.map(|(l, _)| l))
    }

    async fn pre_join_limited(
        &self,
        queue: &QueueName,
        user: &UserId,
        nonce: &str,
        address: Option<&AddressLimits>,
    ) -> StoreResult<Result<PreJoin, Limited>> {
        self.lottery_pre_join(queue, user, nonce, address).await
    }

    async fn pre_entry(&self, queue: &QueueName, user: &UserId) -> StoreResult<Option<PreEntry>> {
        self.lottery_pre_entry(queue, user).await
    }

    async fn pre_leave(
        &self,
        queue: &QueueName,
        user: &UserId,
        pre_entry: u64,
    ) -> StoreResult<bool> {
        self.lottery_pre_leave(queue, user, pre_entry).await
    }

    async fn pre_queue(&self, queue: &QueueName) -> StoreResult<(u64, Vec<(UserId, PreEntry)>)> {
        self.lottery_scan(queue).await
    }

    async fn draw_begin(
        &self,
        queue: &QueueName,
        draw: &str,
        version: u64,
        entries: u64,
        list: &str,
        abandon_ms: u64,
    ) -> StoreResult<DrawStep> {
        self.lottery_begin(queue, draw, version, entries, list, abandon_ms)
            .await
    }

    async fn draw_stage(
        &self,
        queue: &QueueName,
        draw: &str,
        offset: u64,
        users: &[UserId],
    ) -> StoreResult<DrawStep> {
        self.lottery_stage_chunk(queue, draw, offset, users).await
    }

    async fn draw_commit(&self, queue: &QueueName, draw: &str) -> StoreResult<DrawStep> {
        self.lottery_commit(queue, draw).await
    }

    async fn lottery_list(&self, queue: &QueueName) -> StoreResult<Option<String>> {
        self.lottery_published(queue).await
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

    async fn audit_page(&self, queue: &QueueName, query: AuditQuery) -> StoreResult<AuditPage> {
        self.audit_read(queue, query).await
    }

    async fn audit_take(
        &self,
        queue: &QueueName,
        group: &str,
        start: AuditId,
        consumer: &str,
        idle_ms: u64,
        count: usize,
    ) -> StoreResult<Vec<AuditEntry>> {
        self.audit_group_read(queue, group, start, consumer, idle_ms, count)
            .await
    }

    async fn audit_hold(
        &self,
        queue: &QueueName,
        group: &str,
        consumer: &str,
        ids: &[AuditId],
    ) -> StoreResult<()> {
        self.audit_group_hold(queue, group, consumer, ids).await
    }

    async fn audit_ack(&self, queue: &QueueName, group: &str, ids: &[AuditId]) -> StoreResult<()> {
        self.audit_group_ack(queue, group, ids).await
    }
}
