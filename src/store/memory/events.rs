//! Events in the memory store: one broadcast channel stands in for Redis
//! pub/sub (one process, so every subscriber is local), and the stream
//! reports of the one instance.

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use tokio_stream::wrappers::BroadcastStream;

use super::{MemoryStore, now_ms};
use crate::queue::QueueName;
use crate::store::{EventStore, StoreEvent, StoreResult};

#[async_trait]
impl EventStore for MemoryStore {
    async fn ping(&self) -> StoreResult<()> {
        Ok(())
    }

    fn subscribe(&self, queues: &[QueueName]) -> BoxStream<'static, StoreEvent> {
        let wanted: Vec<QueueName> = queues.to_vec();
        BroadcastStream::new(self.events.subscribe())
            .filter_map(move |item| {
                let out = match item {
                    Ok(StoreEvent::Queue { queue, event }) if wanted.contains(&queue) => {
                        Some(StoreEvent::Queue { queue, event })
                    }
                    Ok(StoreEvent::Queue { .. }) => None,
                    Ok(StoreEvent::Resync) => Some(StoreEvent::Resync),
                    Ok(StoreEvent::Interrupted) => Some(StoreEvent::Interrupted),
                    // A slow listener missed events: it must re-read state.
                    Err(_) => Some(StoreEvent::Resync),
                };
                futures::future::ready(out)
            })
            .boxed()
    }

    async fn report_streams(
        &self,
        instance: &str,
        streams: u64,
        ttl_ms: u64,
    ) -> StoreResult<Vec<(String, u64)>> {
        let now = now_ms();
        Ok(self
            .settings
            .report_streams(instance, streams, now + ttl_ms, now))
    }
}
