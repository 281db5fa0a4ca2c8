//! A Redis Cluster connection that is built anew when it stays silent.
//!
//! redis-rs's cluster connection repairs itself after what it is told: a
//! node connection that drops, `MOVED`, `READONLY`. It does nothing after
//! a timeout: a request whose caller gave up is dropped without a result,
//! so a node connection that stays open but silent, or a slot refresh that
//! never finishes, is used for ever. That is how one instance answered
//! every store call "timed out" for two minutes after a failover while new
//! connections to the same nodes worked (docs/faults.md, "an instance stuck
//! after a Cluster failover").
//!
//! [`ClusterConn`] is the piece that notices. Every clone shares one
//! current connection (and, with `--redis-wait-replicas`, the
//! never-retrying one of a script and its `WAIT`). It counts the calls
//! that time out with no answered call in between; after
//! [`REBUILD_AFTER`] of them spanning at least [`REBUILD_SPAN`] it builds a
//! new client and connection(s) from the seeds in the background (one
//! rebuild at a time, bounded by [`REBUILD_WITHIN`]) and swaps them in. A
//! rebuild that fails is tried again on the next timeout. Calls already in
//! flight finish on the old connection, which closes its sockets once its
//! last clone is dropped.
//!
//! Nothing is ever sent again: a call that timed out fails (`503`, the
//! caller tries again); the rebuild only changes which connection the next
//! calls take. So the script + `WAIT` pair still goes once, on one
//! connection, and never lands on a fresh one where `WAIT` means nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::cluster_builder;

/// Consecutive timed-out calls (no answer in between) that, spanning at
/// least [`REBUILD_SPAN`], make the connection be built anew.
///
/// A timeout takes the whole response timeout (2 s) to come back, so
/// three of them over at least 5 s mean no call was answered for about
/// 7 s: longer than a node's short stall (a fork, a pause, a burst of
/// loss) that the connection rides out by itself, and far shorter than
/// the two minutes of the incident. Both sides of the trade are cheap to
/// get wrong in one direction only: a rebuild of a connection that was
/// fine costs one connection per master and a slot-map read; keeping a
/// wedged one costs every call until something else restarts the process.
/// The span matters as much as the count: under load dozens of calls time
/// out in the same two seconds, and a count alone would rebuild on any
/// stall. While a master is frozen or cut off until the cluster fails it
/// over (`cluster-node-timeout`), an instance whose calls all go to it may
/// rebuild every few seconds; each rebuild is harmless, and one of them
/// follows the failover at once.
pub(super) const REBUILD_AFTER: u32 = 3;

/// See [`REBUILD_AFTER`].
pub(super) const REBUILD_SPAN: Duration = Duration::from_secs(5);

/// How long one rebuild may take: a connection to a seed, its `CLUSTER
/// SLOTS`, and a connection to each master (several round trips, each
/// bounded by the response timeout, in parallel for the two connections).
/// A rebuild that runs out is abandoned and tried again on the next
/// timeout.
const REBUILD_WITHIN: Duration = Duration::from_secs(4);

/// The store's connection to a cluster; cheap to clone, every clone
/// sharing the current connection.
#[derive(Clone)]
pub(in crate::store::redis) struct ClusterConn {
    shared: Arc<Shared>,
}

struct Shared {
    seeds: Vec<String>,
    /// The response and connection timeout of every connection built.
    timeout: Duration,
    /// Whether the never-retrying connection is built too.
    with_durable: bool,
    /// Read (uncontended but for a swap) by every call, to clone the
    /// channel handle it sends on.
    current: RwLock<Current>,
    /// The timeouts since the last answered call, on the current
    /// connection. Locked only on a timeout, and on the first answer after
    /// one ([`Shared::failing`] tells calls whether there is anything to
    /// reset), so answered calls touch one atomic.
    streak: Mutex<Streak>,
    failing: AtomicBool,
    /// Set while a rebuild runs: one at a time.
    rebuilding: AtomicBool,
}

struct Current {
    /// Numbers connections, so a call's outcome counts only for the
    /// connection it went over.
    id: u64,
    /// Follows redirects and retries: every ordinary call.
    conn: ClusterConnection,
    /// Never retries: a script and its `WAIT` (with
    /// `--redis-wait-replicas`); a failure is answered `503` and the
    /// caller tries again.
    durable: Option<ClusterConnection>,
}

struct Streak {
    /// The connection these timeouts were on.
    id: u64,
    count: u32,
    /// When the first of them came back.
    first: Instant,
}

impl ClusterConn {
    /// Connects (and with `durable` the never-retrying connection too);
    /// fails if the cluster does not answer now.
    pub(super) async fn connect(
        seeds: &[String],
        timeout: Duration,
        durable: bool,
    ) -> RedisResult<Self> {
        let (conn, durable_conn) = build(seeds, timeout, durable).await?;
        Ok(Self {
            shared: Arc::new(Shared {
                seeds: seeds.to_vec(),
                timeout,
                with_durable: durable,
                current: RwLock::new(Current {
                    id: 0,
                    conn,
                    durable: durable_conn,
                }),
                streak: Mutex::new(Streak {
                    id: 0,
                    count: 0,
                    first: Instant::now(),
                }),
                failing: AtomicBool::new(false),
                rebuilding: AtomicBool::new(false),
            }),
        })
    }

    /// The current connection (the durable one with `durable`) and its id.
    fn current(&self, durable: bool) -> (u64, ClusterConnection) {
        let current = self
            .shared
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let conn = if durable {
            current
                .durable
                .as_ref()
                .expect("connected with a durable connection")
        } else {
            &current.conn
        };
        (current.id, conn.clone())
    }

    /// Runs `call` on the current connection and counts its outcome.
    async fn run<T, F, Fut>(&self, durable: bool, call: F) -> RedisResult<T>
    where
        F: FnOnce(ClusterConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let (id, conn) = self.current(durable);
        let reply = call(conn).await;
        match &reply {
            Err(e) if e.is_timeout() => self.timed_out(id),
            // Any other outcome, an error reply included, came from a
            // connection that talks.
            _ => self.answered(id),
        }
        reply
    }

    fn answered(&self, id: u64) {
        if !self.shared.failing.load(Ordering::Relaxed) {
            return;
        }
        let mut streak = self
            .shared
            .streak
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if streak.id == id {
            streak.count = 0;
            self.shared.failing.store(false, Ordering::Relaxed);
        }
    }

    fn timed_out(&self, id: u64) {
        let now = Instant::now();
        let (count, span) = {
            let mut streak = self
                .shared
                .streak
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // A call sent before a swap says nothing about the new
            // connection.
            if streak.id != id {
                return;
            }
            if streak.count == 0 {
                streak.first = now;
            }
            streak.count += 1;
            self.shared.failing.store(true, Ordering::Relaxed);
            (streak.count, now - streak.first)
        };
        if count < REBUILD_AFTER || span < REBUILD_SPAN {
            return;
        }
        if self.shared.rebuilding.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(rebuild(self.shared.clone(), id, count, span));
    }

    /// Sends `cmd` where `routing` says.
    pub(super) async fn route_command(&self, cmd: Cmd, routing: RoutingInfo) -> RedisResult<Value> {
        self.run(
            false,
            |mut c| async move { c.route_command(cmd, routing).await },
        )
        .await
    }

    /// Sends `pipeline` on the never-retrying connection to `route`.
    pub(super) async fn route_pipeline_durable(
        &self,
        pipeline: Pipeline,
        offset: usize,
        count: usize,
        route: SingleNodeRoutingInfo,
    ) -> RedisResult<Vec<Value>> {
        self.run(true, |mut c| async move {
            c.route_pipeline(pipeline, offset, count, route).await
        })
        .await
    }
}

/// Builds the connection (and the durable one with `durable`) from `seeds`.
async fn build(
    seeds: &[String],
    timeout: Duration,
    durable: bool,
) -> RedisResult<(ClusterConnection, Option<ClusterConnection>)> {
    let client = cluster_builder(seeds, timeout).build()?;
    let conn = client.get_async_connection();
    if !durable {
        return Ok((conn.await?, None));
    }
    let once = cluster_builder(seeds, timeout).retries(0).build()?;
    let (conn, once) = tokio::try_join!(conn, once.get_async_connection())?;
    Ok((conn, Some(once)))
}

/// Builds a new connection for the one numbered `id` and swaps it in;
/// `count` timeouts over `span` are why.
async fn rebuild(shared: Arc<Shared>, id: u64, count: u32, span: Duration) {
    // Cleared however this ends, so the next timeout may try again.
    struct Done<'a>(&'a AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(false, Ordering::Release);
        }
    }
    let _done = Done(&shared.rebuilding);
    let built = tokio::time::timeout(
        REBUILD_WITHIN,
        build(&shared.seeds, shared.timeout, shared.with_durable),
    )
    .await;
    let (conn, durable) = match built {
        Ok(Ok(built)) => built,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "rebuilding the cluster connection failed; trying again on the next timeout");
            return;
        }
        Err(_) => {
            tracing::warn!(within = ?REBUILD_WITHIN, "rebuilding the cluster connection timed out; trying again on the next timeout");
            return;
        }
    };
    let new_id = id + 1;
    {
        let mut current = shared
            .current
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if current.id != id {
            return;
        }
        *current = Current {
            id: new_id,
            conn,
            durable,
        };
    }
    {
        let mut streak = shared.streak.lock().unwrap_or_else(PoisonError::into_inner);
        *streak = Streak {
            id: new_id,
            count: 0,
            first: Instant::now(),
        };
        shared.failing.store(false, Ordering::Relaxed);
    }
    metrics::counter!("waitroom_store_reconnects_total").increment(1);
    tracing::warn!(
        "the Redis Cluster connection answered nothing ({count} calls in a row timed out over \
         {span:.1?}): replaced it with a new one built from the seeds"
    );
}

impl ConnectionLike for ClusterConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.run(false, move |mut c| async move {
            c.req_packed_command(cmd).await
        }))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.run(false, move |mut c| async move {
            c.req_packed_commands(pipeline, offset, count).await
        }))
    }

    fn get_db(&self) -> i64 {
        // A cluster has database 0 only.
        0
    }
}
