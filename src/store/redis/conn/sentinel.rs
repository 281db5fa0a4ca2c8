//! Redis behind Sentinel: one master, its replicas, and sentinels that
//! promote a replica when the master dies.
//!
//! redis-rs finds the master through the sentinels but has no connection
//! that finds it again, so [`SentinelConn`] is the small piece that does:
//! one multiplexed connection to the node the sentinels name master (each
//! lookup checks its `ROLE`), replaced after the first call that shows it
//! is no longer good — a dropped or silent connection, or a `READONLY`
//! refusal from a master demoted to replica. A call that failed on a
//! broken connection is not sent again (it may have run: the caller gets
//! its error, `503`, and tries again); one refused with `READONLY` did not
//! run, so it is sent once more to the master found anew. While the
//! sentinels still name a dead master, the lookup fails and calls fail
//! closed until they promote a replica.
//!
//! A node that says `master` is not always the one the sentinels name: an
//! old master killed and restarted before the failover finished comes back
//! as a master with what it had, and stays one until a sentinel turns it
//! into a replica (seconds later). A connection made to it in between would
//! keep serving stale reads (and writes nobody will keep) until then, so a
//! watcher asks the sentinels every second which node is master and drops
//! the connection once a majority of them name another one.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ErrorKind, Pipeline, RedisConnectionInfo, RedisError,
    RedisFuture, RedisResult, ServerErrorKind, Value,
};
use tokio::sync::Mutex;

use super::SentinelUrl;

/// How often the watcher asks the sentinels whether the node in use is
/// still their master.
const RECHECK_EVERY: Duration = Duration::from_secs(1);

/// Finds the current master through the sentinels.
#[derive(Clone)]
pub(in crate::store::redis) struct Locator {
    /// Keeps one connection per sentinel between lookups.
    sentinel: Arc<Mutex<Sentinel>>,
    master: String,
    node: SentinelNodeConnectionInfo,
    /// Bounds one lookup: a frozen sentinel or master must not hang it.
    timeout: Duration,
}

impl Locator {
    pub(in crate::store::redis) fn new(url: &SentinelUrl, timeout: Duration) -> RedisResult<Self> {
        let mut info = RedisConnectionInfo::default().set_db(url.db);
        if let Some(user) = &url.username {
            info = info.set_username(user);
        }
        if let Some(password) = &url.password {
            info = info.set_password(password);
        }
        Ok(Self {
            sentinel: Arc::new(Mutex::new(Sentinel::build(url.sentinels.clone())?)),
            master: url.master.clone(),
            node: SentinelNodeConnectionInfo::default().set_redis_connection_info(info),
            timeout,
        })
    }

    /// A client for the node the sentinels name master now (checked to say
    /// `master` itself).
    pub(in crate::store::redis) async fn master(&self) -> RedisResult<Client> {
        let lookup = async {
            let mut sentinel = self.sentinel.lock().await;
            sentinel
                .async_master_for(&self.master, Some(&self.node))
                .await
        };
        tokio::time::timeout(self.timeout, lookup)
            .await
            .unwrap_or_else(|_| Err(timed_out("no master from the sentinels in time")))
    }
}

/// Where the pub/sub subscriber connects: a fixed Redis, or the master of
/// the moment.
pub(in crate::store::redis) enum Endpoint {
    Fixed(Client),
    Sentinel(Locator),
}

impl Endpoint {
    /// The client to connect with now.
    pub(in crate::store::redis) async fn client(&self) -> RedisResult<Client> {
        match self {
            Endpoint::Fixed(client) => Ok(client.clone()),
            Endpoint::Sentinel(locator) => locator.master().await,
        }
    }

    /// Whether the sentinels now name a master other than `addr` (a
    /// client's `host:port`): a subscription on a node that is no longer
    /// master hears nothing published on the new one. False for a fixed
    /// Redis, and when the sentinels cannot say now.
    pub(in crate::store::redis) async fn moved_from(&self, addr: &str) -> bool {
        match self {
            Endpoint::Fixed(_) => false,
            Endpoint::Sentinel(locator) => locator
                .master()
                .await
                .is_ok_and(|c| c.get_connection_info().addr().to_string() != addr),
        }
    }
}

/// The store's connection behind Sentinel; cheap to clone, every clone
/// sharing the one connection.
#[derive(Clone)]
pub(in crate::store::redis) struct SentinelConn {
    shared: Arc<Shared>,
    db: i64,
}

struct Shared {
    locator: Locator,
    config: AsyncConnectionConfig,
    /// The connection in use; `None` once it failed, until the next call
    /// finds the master again. Locked across that lookup, so calls wait
    /// for one reconnection instead of each making its own.
    current: Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    conn: Option<Current>,
    /// Numbers connections, so a failure forgets only the one it met.
    made: u64,
}

#[derive(Clone)]
struct Current {
    id: u64,
    conn: MultiplexedConnection,
    /// `host:port` of the node it goes to, as the sentinels name nodes.
    addr: String,
}

/// What a reply says about the connection it came over.
enum Health {
    Good,
    /// Dropped, refused or silent: replace it, do not resend.
    Broken,
    /// The node is a replica now: nothing ran; find the master and resend.
    Demoted,
}

impl SentinelConn {
    /// Finds the master and connects; fails if that is not possible now.
    pub(in crate::store::redis) async fn connect(
        url: &SentinelUrl,
        timeout: Duration,
    ) -> RedisResult<Self> {
        let me = Self {
            shared: Arc::new(Shared {
                locator: Locator::new(url, timeout)?,
                config: AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout)),
                current: Mutex::default(),
            }),
            db: url.db,
        };
        me.current().await?;
        let sentinels = url
            .sentinels
            .iter()
            .map(|s| Client::open(s.as_str()))
            .collect::<RedisResult<Vec<_>>>()?;
        tokio::spawn(watch(
            Arc::downgrade(&me.shared),
            sentinels,
            url.master.clone(),
            timeout,
        ));
        Ok(me)
    }

    async fn current(&self) -> RedisResult<Current> {
        let mut slot = self.shared.current.lock().await;
        if let Some(current) = &slot.conn {
            return Ok(current.clone());
        }
        let client = self.shared.locator.master().await?;
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.shared.config)
            .await?;
        slot.made += 1;
        let current = Current {
            id: slot.made,
            conn,
            addr: client.get_connection_info().addr().to_string(),
        };
        slot.conn = Some(current.clone());
        tracing::info!(master = ?client.get_connection_info().addr(), "connected to the master named by the sentinels");
        Ok(current)
    }

    async fn forget(&self, id: u64) {
        let mut slot = self.shared.current.lock().await;
        if slot.conn.as_ref().is_some_and(|c| c.id == id) {
            slot.conn = None;
        }
    }

    /// Runs `call` on the current connection: once more on the master
    /// found anew when the node refused it as a replica, never again when
    /// the connection broke under it.
    async fn run<T, F, Fut>(&self, mut call: F, demoted: impl Fn(&T) -> bool) -> RedisResult<T>
    where
        F: FnMut(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let mut resent = false;
        loop {
            let current = self.current().await?;
            let reply = call(current.conn).await;
            let health = match &reply {
                Ok(value) if demoted(value) => Health::Demoted,
                Ok(_) => Health::Good,
                Err(e) => health_of(e),
            };
            match health {
                Health::Good => return reply,
                Health::Demoted if !resent => {
                    self.forget(current.id).await;
                    resent = true;
                }
                Health::Broken | Health::Demoted => {
                    self.forget(current.id).await;
                    return reply;
                }
            }
        }
    }
}

/// The watcher of one [`SentinelConn`] (ends with it): every
/// [`RECHECK_EVERY`], which node each sentinel names master; the connection
/// in use is dropped when a majority of the sentinels name one other node,
/// so the next call finds the master anew. Sentinels that do not answer
/// count for nothing (the connection stays): dropping it on their silence
/// would only add outages.
async fn watch(shared: Weak<Shared>, sentinels: Vec<Client>, master: String, timeout: Duration) {
    let mut links: Vec<Option<MultiplexedConnection>> = vec![None; sentinels.len()];
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let mut tick = tokio::time::interval(RECHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let in_use = strong.current.lock().await.conn.clone();
        let Some(in_use) = in_use else {
            continue;
        };
        let mut named: Vec<String> = Vec::new();
        for (client, link) in sentinels.iter().zip(links.iter_mut()) {
            if let Some(addr) = named_master(client, link, &config, &master, timeout).await {
                named.push(addr);
            }
        }
        if let Some(other) = majority_elsewhere(&named, sentinels.len(), &in_use.addr) {
            tracing::warn!(
                in_use = %in_use.addr,
                named = %other,
                "the sentinels name another master: finding it again"
            );
            let mut slot = strong.current.lock().await;
            if slot.conn.as_ref().is_some_and(|c| c.id == in_use.id) {
                slot.conn = None;
            }
        }
    }
}

/// `host:port` of the master one sentinel names, over a connection kept
/// between checks (`None`: no answer now; the link is made again next time).
async fn named_master(
    client: &Client,
    link: &mut Option<MultiplexedConnection>,
    config: &AsyncConnectionConfig,
    master: &str,
    timeout: Duration,
) -> Option<String> {
    let ask = async {
        if link.is_none() {
            *link = Some(
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await?,
            );
        }
        let conn = link.as_mut().expect("connected above");
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(master)
            .query_async::<Option<(String, u16)>>(conn)
            .await
    };
    match tokio::time::timeout(timeout, ask).await {
        Ok(Ok(named)) => named.map(|(host, port)| format!("{host}:{port}")),
        _ => {
            *link = None;
            None
        }
    }
}

/// The node a majority of `of` sentinels name, when it is not `in_use`.
fn majority_elsewhere(named: &[String], of: usize, in_use: &str) -> Option<String> {
    named
        .iter()
        .find(|addr| addr.as_str() != in_use && named.iter().filter(|a| a == addr).count() * 2 > of)
        .cloned()
}

fn demoted_value(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::ReadOnly))
}

fn health_of(e: &RedisError) -> Health {
    if e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) {
        Health::Demoted
    } else if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
    {
        Health::Broken
    } else {
        Health::Good
    }
}

fn timed_out(what: &'static str) -> RedisError {
    RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.run(
            move |mut c| async move { c.req_packed_command(cmd).await },
            demoted_value,
        ))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.run(
            move |mut c| async move { c.req_packed_commands(pipeline, offset, count).await },
            |values: &Vec<Value>| values.iter().any(demoted_value),
        ))
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

#[cfg(test)]
mod tests {
    use super::majority_elsewhere;

    fn named(addrs: &[&str]) -> Vec<String> {
        addrs.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn the_connection_moves_only_when_a_majority_names_another_master() {
        let (old, new) = ("127.0.0.1:1111", "127.0.0.1:2222");
        // Two of three name the new master: move.
        assert_eq!(
            majority_elsewhere(&named(&[new, new, old]), 3, old).as_deref(),
            Some(new)
        );
        assert_eq!(
            majority_elsewhere(&named(&[new, new]), 3, old).as_deref(),
            Some(new)
        );
        // One sentinel (a restarted one, still on the old view, or the
        // one ahead of the others) is not enough, nor is silence.
        assert_eq!(majority_elsewhere(&named(&[new]), 3, old), None);
        assert_eq!(majority_elsewhere(&named(&[new, old, old]), 3, old), None);
        assert_eq!(majority_elsewhere(&named(&[]), 3, old), None);
        // Everyone names the node in use: stay.
        assert_eq!(majority_elsewhere(&named(&[old, old, old]), 3, old), None);
        // Split between two other nodes, neither a majority: stay.
        assert_eq!(
            majority_elsewhere(&named(&[new, "127.0.0.1:3333"]), 3, old),
            None
        );
    }
}
