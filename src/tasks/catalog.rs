//! The catalog refresh: each instance re-reads the live queues and their
//! settings from the store every second ([`Catalog::reload`]).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::catalog::{Catalog, RELOAD_EVERY};

/// Re-reads `catalog` every [`RELOAD_EVERY`] until `shutdown`.
pub async fn run(catalog: Arc<Catalog>, shutdown: CancellationToken) {
    let mut failing = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(RELOAD_EVERY) => {}
        }
        match catalog.reload().await {
            Ok(()) if failing => {
                tracing::info!("queue catalog reloads again");
                failing = false;
            }
            Ok(()) => {}
            Err(e) if !failing => {
                tracing::warn!(error = %e, "queue catalog reload failed: keeping the last one");
                failing = true;
            }
            Err(_) => {}
        }
    }
}
