//! The connection layer: one Redis, a Redis behind Sentinel, or a Redis
//! Cluster, behind one type.
//!
//! Every store method runs its script through [`Conn`], which implements
//! [`redis::aio::ConnectionLike`]; only this module knows which of the three
//! it speaks to. A single Redis is one multiplexed, self-reconnecting
//! connection ([`ConnectionManager`]), and on each serving thread one of
//! that thread's own (`local.rs`); behind Sentinel it is one multiplexed
//! connection to whichever node the sentinels name master, found again
//! after a failover (`sentinel.rs`); a cluster is redis-rs's async cluster
//! connection, which routes each call by the slot of its first key, follows
//! `MOVED`/`ASK` and refreshes its slot map after a failover (built with
//! the `redis-cluster` cargo feature). Every key of one call shares the
//! queue's hash tag, so a call never spans two slots.
//! redis-rs never repairs a cluster connection whose calls only time out
//! (a node connection open but silent, a slot refresh that never ends), so
//! it is kept behind one shared slot (`cluster.rs`) and built anew from the
//! seeds after a few calls in a row timed out over a few seconds.
//!
//! The two commands that are not routed by a key — `WAIT` and the
//! publication of a deferred admission pass — are sent explicitly to the
//! master of the queue's slot. `WAIT` counts the replicas that hold the
//! writes of the connection it arrives on, so it only means something on
//! the very connection the write went over: [`Conn::eval_and_wait`] sends
//! the script and its `WAIT` as one pipeline on one connection, and in a
//! cluster over a connection that never retries — a retried `WAIT` would
//! land on a fresh connection (or on the promoted replica after a
//! failover), where it answers at once, for a write it never saw.

#[cfg(feature = "redis-cluster")]
mod cluster;
mod local;
mod sentinel;

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
#[cfg(feature = "redis-cluster")]
use redis::cluster::ClusterClientBuilder;
#[cfg(feature = "redis-cluster")]
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Client, Cmd, Pipeline, RedisFuture, RedisResult, Value};

#[cfg(feature = "redis-cluster")]
use cluster::ClusterConn;
use local::Single;
pub use local::serve_calls_from_this_thread;
use sentinel::SentinelConn;
pub(super) use sentinel::{Endpoint, Locator};

/// What a build without the `redis-cluster` cargo feature says of a
/// Cluster topology (the configuration refuses `--redis-cluster` before
/// that, `config::features`; a store opened in code is told here).
#[cfg(not(feature = "redis-cluster"))]
pub(super) const NO_CLUSTER: &str =
    "a Redis Cluster needs the `redis-cluster` cargo feature, and this build was made without it";

/// The scheme of a `--redis-url` that names sentinels, not a Redis.
const SENTINEL_SCHEME: &str = "redis+sentinel://";

/// Where the store's data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One Redis (`redis://host:port/db`), replicas or not.
    Single(String),
    /// A Redis Cluster, found through these seed nodes (any of them will
    /// do; the others are learnt from `CLUSTER SLOTS`).
    Cluster(Vec<String>),
    /// One master with replicas, found through Redis Sentinel.
    Sentinel(SentinelUrl),
}

impl Topology {
    /// Reads `--redis-url` with `--redis-cluster`: a cluster's seeds are
    /// comma-separated; a `redis+sentinel://` URL names sentinels.
    pub fn from_flags(url: &str, cluster: bool) -> Result<Self, String> {
        if url.starts_with(SENTINEL_SCHEME) {
            if cluster {
                return Err(
                    "--redis-cluster takes redis:// seed nodes, not a redis+sentinel:// URL".into(),
                );
            }
            return SentinelUrl::parse(url).map(Topology::Sentinel);
        }
        Ok(if cluster {
            Topology::Cluster(
                url.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
            )
        } else {
            Topology::Single(url.to_owned())
        })
    }

    /// Whether events use sharded pub/sub (`SPUBLISH`/`SSUBSCRIBE`): in a
    /// cluster a plain `PUBLISH` is copied to every node.
    pub fn sharded(&self) -> bool {
        matches!(self, Topology::Cluster(_))
    }
}

/// `redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master[/db]`:
/// the sentinels (port 26379 unless given), the name they monitor the
/// master under, and the database and credentials of the Redis nodes (the
/// sentinels themselves are spoken to without). No percent-decoding: a
/// password holding `@`, `/` or `,` cannot be written here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    /// `redis://host:port` of each sentinel.
    pub sentinels: Vec<String>,
    /// The master's name in the sentinels' configuration.
    pub master: String,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
}

impl SentinelUrl {
    /// Parses a `redis+sentinel://` URL; the error says what is wrong.
    pub fn parse(url: &str) -> Result<Self, String> {
        let bad = |what: &str| Err(format!("--redis-url {SENTINEL_SCHEME}...: {what}"));
        let Some(rest) = url.strip_prefix(SENTINEL_SCHEME) else {
            return bad("wrong scheme");
        };
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((auth, rest)) => (Some(auth), rest),
            None => (None, rest),
        };
        let (username, password) = match auth.map(|a| a.split_once(':')) {
            None => (None, None),
            Some(Some((user, pass))) if !pass.is_empty() => (
                (!user.is_empty()).then(|| user.to_owned()),
                Some(pass.to_owned()),
            ),
            Some(_) => return bad("credentials are written user:password@ or :password@"),
        };
        let Some((hosts, path)) = rest.split_once('/') else {
            return bad("the master's name is missing (.../master-name)");
        };
        let mut path = path.split('/');
        let master = path.next().unwrap_or_default();
        if master.is_empty() {
            return bad("the master's name is missing (.../master-name)");
        }
        let db = match path.next() {
            None | Some("") => 0,
            Some(db) => match db.parse::<i64>() {
                Ok(db) if db >= 0 => db,
                _ => return bad("the database must be a number"),
            },
        };
        if path.next().is_some() {
            return bad("the path is /master-name or /master-name/db");
        }
        let mut sentinels = Vec::new();
        for host in hosts.split(',').map(str::trim) {
            // `[::1]:26379`: the port follows the last colon outside brackets.
            let (name, port) = match host.rsplit_once(':') {
                Some((name, port)) if !port.contains(']') => match port.parse::<u16>() {
                    Ok(port) if port > 0 => (name, port),
                    _ => return bad("a sentinel's port must be 1-65535"),
                },
                _ => (host, 26379),
            };
            if name.is_empty() {
                return bad("a sentinel's host is empty");
            }
            sentinels.push(format!("redis://{name}:{port}"));
        }
        Ok(Self {
            sentinels,
            master: master.to_owned(),
            db,
            username,
            password,
        })
    }
}

/// One multiplexed connection to the store, cheap to clone.
#[derive(Clone)]
pub(super) enum Conn {
    Single(Single),
    Sentinel(SentinelConn),
    /// Built anew when its calls keep timing out (`cluster.rs`).
    #[cfg(feature = "redis-cluster")]
    Cluster(ClusterConn),
}

/// A cluster client builder with the adapter's timeouts.
#[cfg(feature = "redis-cluster")]
pub(super) fn cluster_builder(seeds: &[String], timeout: Duration) -> ClusterClientBuilder {
    ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(timeout)
        .response_timeout(timeout)
        // Retries wait 2^n * 10 ms, at most 500 ms: a failover's MOVED is
        // followed quickly, and the store call as a whole stays bounded by
        // the adapter's call timeout anyway.
        .retries(6)
        .min_retry_wait(10)
        .max_retry_wait(500)
}

impl Conn {
    /// A clone whose calls, and its clones', all go over the connection
    /// a call made here would: for calls whose order on the wire matters
    /// (one Redis: `local.rs`; the other topologies have one connection).
    pub(super) fn pinned(&self) -> Self {
        match self {
            Conn::Single(c) => Conn::Single(c.pinned()),
            other => other.clone(),
        }
    }

    /// Connects; fails if the store does not answer now. `durable`: also
    /// the non-retrying connection of [`Conn::eval_and_wait`] (a cluster).
    pub(super) async fn connect(
        topology: &Topology,
        timeout: Duration,
        durable: bool,
    ) -> RedisResult<Self> {
        match topology {
            Topology::Single(url) => {
                let client = Client::open(url.as_str())?;
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_response_timeout(Some(timeout))
                    .set_connection_timeout(Some(timeout))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500));
                let conn =
                    ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
                Ok(Conn::Single(Single::new(conn, client, config)))
            }
            Topology::Sentinel(url) => {
                Ok(Conn::Sentinel(SentinelConn::connect(url, timeout).await?))
            }
            #[cfg(feature = "redis-cluster")]
            Topology::Cluster(seeds) => Ok(Conn::Cluster(
                ClusterConn::connect(seeds, timeout, durable).await?,
            )),
            #[cfg(not(feature = "redis-cluster"))]
            Topology::Cluster(_) => {
                let _ = durable;
                Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    NO_CLUSTER,
                )))
            }
        }
    }

    /// Runs `script` (an `EVALSHA`) then `WAIT replicas timeout`, as one
    /// pipeline on one connection to the master of `key`: the script's
    /// reply, and how many replicas acknowledged it. A script missing from
    /// the node's cache is loaded (on every master) and the pair re-sent.
    // `key` routes the pair in a cluster; one Redis needs no routing.
    #[cfg_attr(not(feature = "redis-cluster"), allow(unused_variables))]
    pub(super) async fn eval_and_wait(
        &mut self,
        script: &redis::Script,
        evalsha: &Cmd,
        key: &str,
        replicas: u32,
        timeout: Duration,
    ) -> RedisResult<(Value, i64)> {
        let mut pipe = redis::pipe();
        pipe.add_command(evalsha.clone());
        pipe.cmd("WAIT")
            .arg(replicas)
            .arg(timeout.as_millis() as u64);
        let mut loaded = false;
        loop {
            let values = match self {
                Conn::Single(c) => c.req_packed_commands(&pipe, 0, 2).await,
                // Sent again only when the master refused the script as a
                // replica (`READONLY`): then neither command took effect.
                Conn::Sentinel(c) => c.req_packed_commands(&pipe, 0, 2).await,
                #[cfg(feature = "redis-cluster")]
                Conn::Cluster(c) => {
                    let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                    c.route_pipeline_durable(
                        pipe.clone(),
                        0,
                        2,
                        SingleNodeRoutingInfo::SpecificNode(route),
                    )
                    .await
                }
            };
            let reply = values.and_then(|mut v| {
                if v.len() != 2 {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "script and WAIT: unexpected reply count",
                    )));
                }
                let acked = v.pop().unwrap().extract_error()?;
                let value = v.pop().unwrap().extract_error()?;
                Ok((value, redis::from_redis_value::<i64>(acked)?))
            });
            match reply {
                Err(e)
                    if !loaded
                        && e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    script.load_async(self).await?;
                    loaded = true;
                }
                other => return other,
            }
        }
    }

    /// Publishes `msg` on `channel` (sharded in a cluster, where the channel
    /// carries the queue's hash tag, so it lives on the queue's master).
    pub(super) async fn publish(&mut self, channel: &str, msg: &str) -> RedisResult<i64> {
        let name = match self {
            Conn::Single(_) | Conn::Sentinel(_) => "PUBLISH",
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(_) => "SPUBLISH",
        };
        let mut cmd = redis::cmd(name);
        cmd.arg(channel).arg(msg);
        self.on_master_of(channel, cmd).await
    }

    #[cfg_attr(not(feature = "redis-cluster"), allow(unused_variables))]
    async fn on_master_of<T: redis::FromRedisValue>(
        &mut self,
        key: &str,
        cmd: Cmd,
    ) -> RedisResult<T> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Sentinel(c) => cmd.query_async(c).await,
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => {
                let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                let value = c.route_command(cmd, routing).await?;
                Ok(redis::from_redis_value(value)?)
            }
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
