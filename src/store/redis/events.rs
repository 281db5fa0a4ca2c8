//! The pub/sub subscriber: one connection per instance, never one per
//! client. When it drops, it reconnects with backoff, resubscribes and
//! yields [`StoreEvent::Resync`], since messages published during the gap
//! are lost by pub/sub (state is not).

use std::collections::HashMap;
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use redis::Client;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::QueueKeys;
use crate::queue::QueueName;
use crate::store::{QueueEvent, StoreEvent};

/// How often the subscriber connection is checked with a ping.
const HEALTH_EVERY: Duration = Duration::from_secs(5);
/// How long a ping may go unanswered before the connection counts as lost.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(3);

pub(super) fn subscribe(
    client: Client,
    prefix: &str,
    queues: &[QueueName],
) -> BoxStream<'static, StoreEvent> {
    let channels: HashMap<String, QueueName> = queues
        .iter()
        .map(|q| (QueueKeys::new(prefix, q).channel().to_owned(), q.clone()))
        .collect();
    let (tx, rx) = mpsc::channel(1024);
    // Ends when the receiving stream is dropped (the hub shut down).
    tokio::spawn(pump(client, channels, tx));
    ReceiverStream::new(rx).boxed()
}

async fn pump(client: Client, channels: HashMap<String, QueueName>, tx: mpsc::Sender<StoreEvent>) {
    let mut backoff = Duration::from_millis(100);
    let mut first = true;
    while !tx.is_closed() {
        let connected = tokio::time::timeout(HEALTH_TIMEOUT, client.get_async_pubsub()).await;
        match connected
            .unwrap_or_else(|_| Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()))
        {
            Ok(pubsub) => {
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
