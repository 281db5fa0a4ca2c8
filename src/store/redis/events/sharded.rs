//! The subscriber on a Redis Cluster (the `redis-cluster` cargo feature).
//!
//! Events are sharded (`SPUBLISH` in the scripts, on a channel with the
//! queue's hash tag): each queue's channel lives on the master of the
//! queue's slot, and the subscriber `SSUBSCRIBE`s each queue there, over a
//! RESP3 cluster connection whose pushes arrive on a channel. redis-rs
//! re-sends subscriptions after it reconnects a node or refreshes its slot
//! map, but does not say when a gap began or ended, and does not react when
//! a server drops a sharded subscription because the slot moved
//! (`sunsubscribe` push). So any disconnection push, unrequested
//! `sunsubscribe` or failed health check ends the whole connection: a fresh
//! one learns the current slot map, subscribes every queue anew and yields
//! [`StoreEvent::Resync`] — the same gap handling as on one Redis.

use std::collections::HashMap;
use std::time::Duration;

use redis::PushKind;
use tokio::sync::mpsc;

use super::super::conn::cluster_builder;
use super::{HEALTH_EVERY, HEALTH_TIMEOUT};
use crate::queue::QueueName;
use crate::store::{QueueEvent, StoreEvent};

/// What ended a sharded subscription session.
enum Ended {
    /// The hub is gone: stop.
    Closed,
    /// Connection trouble: reconnect, then resync.
    Lost,
}

/// The cluster subscriber: sessions of one RESP3 cluster connection each,
/// a gap between two sessions announced by `Interrupted` and `Resync`.
pub(super) async fn pump(
    seeds: Vec<String>,
    channels: HashMap<String, QueueName>,
    tx: mpsc::Sender<StoreEvent>,
) {
    let mut backoff = Duration::from_millis(100);
    let mut first = true;
    while !tx.is_closed() {
        let (push_tx, push_rx) = mpsc::unbounded_channel();
        let client = cluster_builder(&seeds, HEALTH_TIMEOUT)
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(push_tx)
            .build();
        let connected = match client {
            Ok(client) => tokio::time::timeout(HEALTH_TIMEOUT, client.get_async_connection()).await,
            Err(e) => Ok(Err(e)),
        };
        match connected {
            Ok(Ok(conn)) => {
                let mut session = Session {
                    conn,
                    pushes: push_rx,
                    channels: &channels,
                    tx: &tx,
                };
                if session.subscribe_all().await {
                    backoff = Duration::from_millis(100);
                    if !first && tx.send(StoreEvent::Resync).await.is_err() {
                        return;
                    }
                    tracing::debug!("sharded pub/sub subscribed");
                    match session.run().await {
                        Ended::Closed => return,
                        Ended::Lost => {}
                    }
                    tracing::warn!("sharded pub/sub lost a node; reconnecting");
                    if tx.send(StoreEvent::Interrupted).await.is_err() {
                        return;
                    }
                } else {
                    tracing::warn!("sharded pub/sub subscribe failed");
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "cluster pub/sub connect failed"),
            Err(_) => tracing::warn!("cluster pub/sub connect timed out"),
        }
        first = false;
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// One cluster connection's subscriptions.
struct Session<'a> {
    conn: redis::cluster_async::ClusterConnection,
    pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
    channels: &'a HashMap<String, QueueName>,
    tx: &'a mpsc::Sender<StoreEvent>,
}

impl Session<'_> {
    /// `SSUBSCRIBE`s every queue's channel, one command each (channels of
    /// different slots live on different masters). Re-subscribing is
    /// harmless, so this doubles as the health check: every master that
    /// holds one of our queues must answer.
    async fn subscribe_all(&mut self) -> bool {
        for channel in self.channels.keys() {
            let done = tokio::time::timeout(HEALTH_TIMEOUT, self.conn.ssubscribe(channel)).await;
            if !matches!(done, Ok(Ok(()))) {
                return false;
            }
        }
        true
    }

    async fn run(&mut self) -> Ended {
        let mut health = tokio::time::interval(HEALTH_EVERY);
        health.tick().await;
        loop {
            tokio::select! {
                _ = self.tx.closed() => return Ended::Closed,
                _ = health.tick() => {
                    if !self.subscribe_all().await {
                        return Ended::Lost;
                    }
                }
                push = self.pushes.recv() => {
                    let Some(push) = push else { return Ended::Lost };
                    match push.kind {
                        PushKind::SMessage if !self.forward(&push.data).await => {
                            return Ended::Closed;
                        }
                        // A node's connection closed (its master died, or
                        // a partition): messages may be lost from here on.
                        PushKind::Disconnection => return Ended::Lost,
                        // We never unsubscribe: the server dropped us
                        // because the channel's slot moved to another node.
                        PushKind::SUnsubscribe => return Ended::Lost,
                        _ => {}
                    }
                }
            }
        }
    }

    /// Passes one `smessage` push (`[channel, payload]`) on; false when the
    /// hub is gone.
    async fn forward(&self, data: &[redis::Value]) -> bool {
        let (Some(redis::Value::BulkString(channel)), Some(redis::Value::BulkString(payload))) =
            (data.first(), data.get(1))
        else {
            tracing::warn!("malformed sharded message");
            return true;
        };
        let Some(queue) = std::str::from_utf8(channel)
            .ok()
            .and_then(|c| self.channels.get(c))
        else {
            return true;
        };
        match serde_json::from_slice::<QueueEvent>(payload) {
            Ok(event) => {
                let ev = StoreEvent::Queue {
                    queue: queue.clone(),
                    event,
                };
                self.tx.send(ev).await.is_ok()
            }
            Err(e) => {
                tracing::warn!(error = %e, "unreadable queue event");
                true
            }
        }
    }
}
