//! The streams report: this instance's open streams, written to the store
//! every 2 s, so the console of any instance shows the streams of all.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::push;
use crate::store::SharedStore;

/// Reports this instance's open streams to the store every 2 s, so the
/// console of any instance shows the streams of all.
pub async fn run(
    store: SharedStore,
    hub: Arc<push::Hub>,
    instance: String,
    shutdown: CancellationToken,
) {
    let ttl = push::STREAMS_REPORT_TTL.as_millis() as u64;
    loop {
        let streams = hub.open_streams() as u64;
        if let Err(e) = store.report_streams(&instance, streams, ttl).await {
            tracing::debug!(error = %e, "streams report failed");
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}
