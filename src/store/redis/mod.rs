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

// The transport and what the capabilities share: the connection (one
// Redis or a cluster), the scripts, the key names, and reply decoding.
mod batch;
mod conn;
mod decode;
mod keys;
mod reply;
mod scripts;

// One file per capability of the port, each `impl <Capability> for
// RedisStore` with the key layouts and decoding it alone uses.
mod adaptive;
mod audit;
mod challenge;
mod claims;
mod events;
mod fairness;
mod limits;
mod line;
mod lottery;
mod sessions;
mod settings;
mod stock;

pub use batch::{
    DEFAULT_DEPTH as DEFAULT_JOIN_BATCH_DEPTH, DEFAULT_MAX as DEFAULT_JOIN_BATCH_MAX,
    DEFAULT_WINDOW_US as DEFAULT_JOIN_BATCH_WINDOW_US, JoinBatch,
};
pub use conn::{Topology, serve_calls_from_this_thread};

use std::time::Duration;

use redis::{AsyncCommands, RedisError};

use super::{StoreError, StoreResult};
use crate::queue::{EntryToken, QueueName, UserId};
use batch::Batcher;
use conn::Conn;
pub(crate) use keys::QueueKeys;
use scripts::{Publishing, Scripts};

/// The Redis store.
pub struct RedisStore {
    topology: Topology,
    conn: Conn,
    prefix: String,
    scripts: Scripts,
    wait_replicas: u32,
    /// `lua/note_joins.lua` (join challenges, `challenge.rs`).
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

/// An `EVALSHA` of `script` with the layout [`RedisStore::run_for`]
/// describes: the queue's keys, each of `users`' token keys, `extra_keys`,
/// then the queue's two common arguments; the script's own arguments are
/// the caller's to add. Each key name is written straight into the
/// command (a poll's call is this and little else, so it is built without
/// a string per key).
fn evalsha_for(
    script: &redis::Script,
    keys: &QueueKeys,
    users: &[&UserId],
    extra_keys: Vec<String>,
) -> redis::Cmd {
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha
        .arg(script.get_hash())
        .arg(QueueKeys::SCRIPT_KEYS.len() + users.len() + extra_keys.len());
    let mut name = Vec::with_capacity(keys.token_prefix.len() + 64);
    for suffix in QueueKeys::SCRIPT_KEYS {
        name.clear();
        name.extend_from_slice(keys.base.as_bytes());
        name.extend_from_slice(suffix.as_bytes());
        evalsha.arg(name.as_slice());
    }
    for user in users {
        name.clear();
        name.extend_from_slice(keys.token_prefix.as_bytes());
        name.extend_from_slice(user.as_str().as_bytes());
        evalsha.arg(name.as_slice());
    }
    evalsha
        .arg(extra_keys)
        .arg(&keys.token_prefix)
        .arg(&keys.channel);
    evalsha
}

/// Sends `evalsha` (an `EVALSHA` of `script`, built by the caller), loading
/// the script first where the node's cache misses it; with
/// `wait_replicas`, the script and `WAIT` go as one pipeline on one
/// connection, and the call fails closed when fewer replicas acknowledged
/// within [`WAIT_TIMEOUT`]. `channel` names the queue's
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

/// Says at start when `--redis-wait-replicas` cannot keep its promise on
/// this master. `WAIT n` counts any `n` replicas, and Sentinel may promote
/// any replica: with fewer than all of them, a write one replica holds can
/// be lost to the promotion of another. The window is real, not
/// theoretical: a master paused past `down-after-milliseconds` resumes
/// still a master, with the replica not yet moved to the new one
/// acknowledging its writes until a sentinel demotes it (the fault
/// campaign's Sentinel runs, docs/faults.md). A warning, not a refusal:
/// fewer is a legitimate trade (a replica down then does not stop
/// writes), but the operator must know it is one. Read once from the
/// master's `INFO replication` (`connected_slaves`); a read that fails
/// says nothing.
async fn check_wait_covers_replicas(conn: &Conn, topology: &Topology, wait: u32) {
    let mut conn = conn.clone();
    let mut info = redis::cmd("INFO");
    info.arg("replication");
    let Ok(Ok(info)) =
        tokio::time::timeout(RESPONSE_TIMEOUT, info.query_async::<String>(&mut conn)).await
    else {
        return;
    };
    let Some(replicas) = info
        .lines()
        .find_map(|l| l.strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse::<u32>().ok())
    else {
        return;
    };
    if replicas < wait {
        tracing::warn!(
            replicas,
            wait,
            "--redis-wait-replicas {wait}: the master has {replicas} replicas attached now; \
             joins and admissions answer 503 until {wait} acknowledge"
        );
    } else if replicas > wait && matches!(topology, Topology::Sentinel(_)) {
        tracing::warn!(
            replicas,
            wait,
            "--redis-wait-replicas {wait} with {replicas} replicas behind Sentinel: a failover may \
             promote a replica that did not acknowledge, and lose what was answered; \
             set --redis-wait-replicas {replicas} to lose nothing"
        );
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
        if durable && !options.topology.sharded() {
            check_wait_covers_replicas(&conn, &options.topology, options.wait_replicas).await;
        }
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
            note_joins: challenge::note_joins_script(),
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
                self.scripts.enter.clone(),
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

    /// Runs a script whose write must be on `wait_replicas` replicas before
    /// it counts (a join, an admission pass): see [`send_durable`]. The
    /// keys are laid out as [`RedisStore::run_for`] lays them out.
    async fn run_durable<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        queue: &QueueName,
        users: &[&UserId],
        extra_keys: Vec<String>,
        args: impl FnOnce(&mut redis::Cmd),
    ) -> StoreResult<T> {
        let keys = self.keys(queue);
        let mut evalsha = evalsha_for(script, &keys, users, extra_keys);
        args(&mut evalsha);
        let value = send_durable(
            &self.conn,
            script,
            &evalsha,
            &keys.channel,
            self.wait_replicas,
        )
        .await?;
        Ok(redis::from_redis_value(value).map_err(RedisError::from)?)
    }

    /// Runs a queue-wide script: the queue's keys in `KEYS[1..8]`.
    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        queue: &QueueName,
        args: impl FnOnce(&mut redis::Cmd),
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
        args: impl FnOnce(&mut redis::Cmd),
    ) -> StoreResult<T> {
        let keys = self.keys(queue);
        let mut evalsha = evalsha_for(script, &keys, users, extra_keys);
        args(&mut evalsha);
        let value = send_durable(&self.conn, script, &evalsha, &keys.channel, 0).await?;
        Ok(redis::from_redis_value(value).map_err(RedisError::from)?)
    }
}
