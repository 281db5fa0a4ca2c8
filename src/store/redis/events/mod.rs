//! The pub/sub subscriber: one connection per instance, never one per
//! client. When it drops, it reconnects with backoff, resubscribes and
//! yields [`StoreEvent::Resync`], since messages published during the gap
//! are lost by pub/sub (state is not).
//!
//! In a cluster the events are sharded: `sharded.rs` (the `redis-cluster`
//! cargo feature).

#[cfg(feature = "redis-cluster")]
mod sharded;

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use redis::Client;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::conn::{Endpoint, Locator};
use super::{QueueKeys, RedisStore, Topology, bounded};
use crate::queue::QueueName;
use crate::store::{EventStore, QueueEvent, StoreEvent, StoreResult};

/// How often the subscriber connection is checked with a ping.
const HEALTH_EVERY: Duration = Duration::from_secs(5);
/// How long a ping may go unanswered before the connection counts as lost.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(3);

pub(super) fn subscribe(
    topology: Topology,
    prefix: &str,
    queues: &[QueueName],
) -> BoxStream<'static, StoreEvent> {
    let channels: HashMap<String, QueueName> = queues
        .iter()
        .map(|q| (QueueKeys::new(prefix, q).channel().to_owned(), q.clone()))
        .collect();
    let (tx, rx) = mpsc::channel(1024);
    // Ends when the receiving stream is dropped (the hub shut down).
    match topology {
        Topology::Single(url) => match Client::open(url.as_str()) {
            Ok(client) => {
                tokio::spawn(pump(Endpoint::Fixed(client), channels, tx));
            }
            // Unreachable: the store connected with this URL.
            Err(e) => tracing::error!(error = %e, "pub/sub: bad Redis URL"),
        },
        // Each reconnection asks the sentinels again: after a failover the
        // master is another node.
        Topology::Sentinel(url) => match Locator::new(&url, HEALTH_TIMEOUT) {
            Ok(locator) => {
                tokio::spawn(pump(Endpoint::Sentinel(locator), channels, tx));
            }
            // Unreachable: the store connected with this URL.
            Err(e) => tracing::error!(error = %e, "pub/sub: bad sentinel URL"),
        },
        #[cfg(feature = "redis-cluster")]
        Topology::Cluster(seeds) => {
            tokio::spawn(sharded::pump(seeds, channels, tx));
        }
        // Unreachable: the store could not connect without the feature.
        #[cfg(not(feature = "redis-cluster"))]
        Topology::Cluster(_) => tracing::error!("pub/sub: {}", super::conn::NO_CLUSTER),
    }
    ReceiverStream::new(rx).boxed()
}

async fn pump(
    endpoint: Endpoint,
    channels: HashMap<String, QueueName>,
    tx: mpsc::Sender<StoreEvent>,
) {
    let mut backoff = Duration::from_millis(100);
    let mut first = true;
    while !tx.is_closed() {
        let connect = async {
            let client = endpoint.client().await?;
            let addr = client.get_connection_info().addr().to_string();
            Ok::<_, redis::RedisError>((client.get_async_pubsub().await?, addr))
        };
        let connected = tokio::time::timeout(HEALTH_TIMEOUT, connect).await;
        match connected
            .unwrap_or_else(|_| Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()))
        {
            Ok((pubsub, addr)) => {
                let (mut sink, mut messages) = pubsub.split();
                let mut subscribed = true;
                for channel in channels.keys() {
                    let done = tokio::time::timeout(HEALTH_TIMEOUT, sink.subscribe(channel)).await;
                    if !matches!(done, Ok(Ok(()))) {
                        tracing::warn!("pub/sub subscribe failed");
                        subscribed = false;
                        break;
                    }
                }
                if subscribed {
                    backoff = Duration::from_millis(100);
                    if !first && tx.send(StoreEvent::Resync).await.is_err() {
                        return;
                    }
                    tracing::debug!("pub/sub subscribed");
                    // A connection can die without a reset (a partition):
                    // a ping that goes unanswered counts as lost too.
                    let mut health = tokio::time::interval(HEALTH_EVERY);
                    health.tick().await;
                    loop {
                        tokio::select! {
                            _ = tx.closed() => return,
                            _ = health.tick() => {
                                let pong = tokio::time::timeout(HEALTH_TIMEOUT, sink.ping::<redis::Value>()).await;
                                if !matches!(pong, Ok(Ok(_))) {
                                    break;
                                }
                                // A node that answers but is no longer the
                                // master (an old master back before a
                                // sentinel demoted it) hears nothing the
                                // new master publishes: subscribe anew there.
                                if endpoint.moved_from(&addr).await {
                                    tracing::warn!("pub/sub: the sentinels name another master");
                                    break;
                                }
                            }
                            msg = messages.next() => {
                                let Some(msg) = msg else { break };
                                let Some(queue) = channels.get(msg.get_channel_name()) else { continue };
                                match serde_json::from_slice::<QueueEvent>(msg.get_payload_bytes()) {
                                    Ok(event) => {
                                        let ev = StoreEvent::Queue { queue: queue.clone(), event };
                                        if tx.send(ev).await.is_err() {
                                            return;
                                        }
                                    }
                                    Err(e) => tracing::warn!(error = %e, "unreadable queue event"),
                                }
                            }
                        }
                    }
                    tracing::warn!("pub/sub connection lost; reconnecting");
                    if tx.send(StoreEvent::Interrupted).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "pub/sub connect failed"),
        }
        first = false;
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

#[async_trait]
impl EventStore for RedisStore {
    async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let _: String = bounded(redis::cmd("PING").query_async(&mut conn)).await?;
        Ok(())
    }

    fn subscribe(&self, queues: &[QueueName]) -> BoxStream<'static, StoreEvent> {
        self::subscribe(self.topology.clone(), &self.prefix, queues)
    }

    /// Stream reports live in one hash, `<prefix>:instances`: id →
    /// `"<streams> <until ms>"` (the reporter's clock; a TTL of seconds
    /// makes small clock skews harmless). Stale fields are dropped by
    /// whoever reads them.
    async fn report_streams(
        &self,
        instance: &str,
        streams: u64,
        ttl_ms: u64,
    ) -> StoreResult<Vec<(String, u64)>> {
        let key = format!("{}:instances", self.prefix);
        let now = crate::clock::now_ms();
        let mut conn = self.conn.clone();
        let (_, all): (i64, HashMap<String, String>) = bounded(
            redis::pipe()
                .cmd("HSET")
                .arg(&key)
                .arg(instance)
                .arg(format!("{streams} {}", now + ttl_ms))
                .cmd("HGETALL")
                .arg(&key)
                .query_async(&mut conn),
        )
        .await?;
        let mut live = Vec::new();
        let mut stale = Vec::new();
        for (id, report) in all {
            let parsed = report
                .split_once(' ')
                .and_then(|(n, until)| Some((n.parse::<u64>().ok()?, until.parse::<u64>().ok()?)));
            match parsed {
                Some((n, until)) if until > now => live.push((id, n)),
                _ => stale.push(id),
            }
        }
        if !stale.is_empty() {
            let _: i64 = bounded(
                redis::cmd("HDEL")
                    .arg(&key)
                    .arg(&stale)
                    .query_async(&mut conn),
            )
            .await?;
        }
        live.sort();
        Ok(live)
    }
}
