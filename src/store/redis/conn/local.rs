//! One Redis, spoken to over a connection of each serving thread's own.
//!
//! **Why.** A request is served on one thread's single-threaded runtime
//! (`server/workers.rs`); the store's shared connection has its task on
//! the instance's work-stealing runtime. So each store call crossed
//! threads twice: the command handed to that task (a wake-up of another
//! thread), the reply handed back (a wake-up of the serving thread,
//! parked in `epoll_wait`). A poll is one store call, and those wake-ups
//! and the context switches they cost were the largest part of its CPU
//! (docs/benchmarks/server-cpu-20261203T1330Z.md). A connection whose task runs on the serving thread
//! itself hands the command and the reply on within the thread.
//!
//! **How.** A thread says it is a serving thread
//! ([`serve_calls_from_this_thread`], which the transport calls as each
//! starts). There, a store's first call opens the thread's own connection
//! in the background (its task on that runtime, so it lives and ends with
//! the thread) and goes over the shared one meanwhile; the later calls go
//! over the thread's own. A connection that cannot be opened is tried
//! again a second later, the calls going over the shared one until then.
//! Once any call of the store finds its connection broken (Redis went
//! away), each thread's connection opened before that is replaced by a
//! new one at the thread's next call, before the call goes out: an idle
//! thread's connection is not found broken by failing a buyer's request.
//! Anywhere else (the background loops, a store used outside a server)
//! calls go over the shared connection, as before.
//!
//! **What does not change.** Each call is still one script on one
//! connection; a thread's calls go over its connection in the order they
//! are made, and an instance's groups of joins keep one connection while
//! any of them is in flight (`batch.rs`, [`Single::pinned`]), so they
//! reach Redis in the order they were made, as on the shared connection. The thread's
//! connection reconnects as the shared one does (the same settings).
//! Only a single Redis: behind Sentinel or in a cluster the shared
//! connection is what follows a failover.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// How long after a failed attempt a thread's connection is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

thread_local! {
    /// Whether this thread is a serving thread.
    static SERVING: Cell<bool> = const { Cell::new(false) };
    /// This thread's connections, one per store (by `Shared::id`).
    static OWN: RefCell<HashMap<u64, Own>> = RefCell::new(HashMap::new());
}

/// Marks the calling thread as a serving thread: a thread running a
/// single-threaded runtime for its whole life, whose tasks never move to
/// another thread. Store calls made on it then go over its own connection.
pub fn serve_calls_from_this_thread() {
    SERVING.set(true);
}

/// A thread's connection to one store.
enum Own {
    Opening,
    /// Open, as of this count of [`Shared::broken`].
    Open(ConnectionManager, u64),
    /// The last attempt failed at this instant.
    Failed(Instant),
}

/// A single Redis: the connection calls go over, and what picks a
/// thread's own. Cloning picks: a clone made on a serving thread goes
/// over that thread's connection once it is open (see [`Single::pinned`]
/// for a clone that keeps its connection wherever it is used).
pub(in crate::store::redis) struct Single {
    conn: ConnectionManager,
    /// When `conn` is a thread's own: the count of [`Shared::broken`] it
    /// was opened at.
    since: Option<u64>,
    /// Clones keep `conn` rather than pick again.
    pinned: bool,
    shared: Arc<Shared>,
}

/// What every clone of one store's connection shares.
struct Shared {
    conn: ConnectionManager,
    client: Client,
    config: ConnectionManagerConfig,
    /// Tells this store's connections from other stores' on one thread
    /// (tests open many stores in one process).
    id: u64,
    /// How many calls, on any of the store's connections, found their
    /// connection broken (dropped, refused). A thread's connection opened
    /// before the last of them is given up at its thread's next call and
    /// opened anew before the call goes over it: Redis went away, so it
    /// most likely broke too, and redis-rs would learn that only by
    /// failing a call on it. (The shared one, which the background loops
    /// keep busy, learns it from theirs.)
    broken: AtomicU64,
}

impl Single {
    pub(super) fn new(
        conn: ConnectionManager,
        client: Client,
        config: ConnectionManagerConfig,
    ) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Self {
            conn: conn.clone(),
            since: None,
            pinned: false,
            shared: Arc::new(Shared {
                conn,
                client,
                config,
                id: NEXT.fetch_add(1, Ordering::Relaxed),
                broken: AtomicU64::new(0),
            }),
        }
    }

    /// Counts `result` in [`Shared::broken`] when it shows a broken
    /// connection (not a timeout: a silent Redis leaves it whole).
    fn note<T>(shared: &Shared, result: &RedisResult<T>) {
        if let Err(e) = result
            && !e.is_timeout()
            && (e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal())
        {
            shared.broken.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A clone over the connection a call made here would use, which its
    /// own clones keep wherever they are used: calls whose order matters
    /// (an instance's groups of joins in flight) go over one connection.
    pub(super) fn pinned(&self) -> Self {
        let (conn, since) = self.shared.pick();
        Self {
            conn,
            since,
            pinned: true,
            shared: self.shared.clone(),
        }
    }

    /// A thread's own connection opened before the last broken one seen
    /// is given up for a new one (this thread's, if another call opened
    /// it already), so no call goes over a connection that most likely
    /// broke. Fails when the new one cannot be opened: Redis is away.
    async fn renew_if_stale(&mut self) -> RedisResult<()> {
        let Some(since) = self.since else {
            return Ok(());
        };
        let broken = self.shared.broken.load(Ordering::Relaxed);
        if since == broken {
            return Ok(());
        }
        let id = self.shared.id;
        let renewed = OWN.with_borrow(|own| match own.get(&id) {
            Some(Own::Open(conn, at)) if *at == broken => Some(conn.clone()),
            _ => None,
        });
        let conn = match renewed {
            Some(conn) => conn,
            None => {
                let opened = ConnectionManager::new_with_config(
                    self.shared.client.clone(),
                    self.shared.config.clone(),
                )
                .await;
                let conn = OWN.with_borrow_mut(|own| match opened {
                    Ok(conn) => {
                        own.insert(id, Own::Open(conn.clone(), broken));
                        Ok(conn)
                    }
                    Err(e) => {
                        own.insert(id, Own::Failed(Instant::now()));
                        Err(e)
                    }
                });
                Self::note(&self.shared, &conn);
                conn?
            }
        };
        self.conn = conn;
        self.since = Some(broken);
        Ok(())
    }
}

impl Clone for Single {
    fn clone(&self) -> Self {
        let (conn, since) = if self.pinned {
            (self.conn.clone(), self.since)
        } else {
            self.shared.pick()
        };
        Self {
            conn,
            since,
            pinned: self.pinned,
            shared: self.shared.clone(),
        }
    }
}

impl Shared {
    /// The connection a call made now goes over, and when it is a
    /// thread's own the count of broken ones it was opened at: the
    /// thread's own when it is open, else the shared one (opening the
    /// thread's own when this is a serving thread that has none yet).
    fn pick(&self) -> (ConnectionManager, Option<u64>) {
        if !SERVING.get() {
            return (self.conn.clone(), None);
        }
        let broken = self.broken.load(Ordering::Relaxed);
        OWN.with_borrow_mut(|own| {
            match own.get(&self.id) {
                Some(Own::Open(conn, since)) => return (conn.clone(), Some(*since)),
                Some(Own::Opening) => return (self.conn.clone(), None),
                Some(Own::Failed(at)) if at.elapsed() < RETRY_AFTER => {
                    return (self.conn.clone(), None);
                }
                _ => {}
            }
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                own.insert(self.id, Own::Opening);
                let (id, client, config) = (self.id, self.client.clone(), self.config.clone());
                // On a serving thread's runtime, so it runs on this thread
                // and the connection's task is spawned here too.
                runtime.spawn(async move {
                    let opened = ConnectionManager::new_with_config(client, config).await;
                    OWN.with_borrow_mut(|own| {
                        own.insert(
                            id,
                            match opened {
                                Ok(conn) => Own::Open(conn, broken),
                                Err(_) => Own::Failed(Instant::now()),
                            },
                        )
                    });
                });
            }
            (self.conn.clone(), None)
        })
    }
}

impl ConnectionLike for Single {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            self.renew_if_stale().await?;
            let result = self.conn.req_packed_command(cmd).await;
            Single::note(&self.shared, &result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.renew_if_stale().await?;
            let result = self.conn.req_packed_commands(pipeline, offset, count).await;
            Single::note(&self.shared, &result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}
