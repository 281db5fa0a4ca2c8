//! The accept loop: hyper (HTTP/1.1) serves each connection with the axum
//! router, reading through [`HandoverIo`]; an event-stream request is taken
//! off hyper and served by the lean writer. Shutdown stops accepting, lets
//! hyper finish in-flight requests, and lets streams close over the drain
//! window.

use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use super::handover::{HandedOver, HandoverIo, Slot};
use super::lean;
use crate::AppState;

/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `listener` until the state's shutdown fires and every connection
/// has finished (streams close within the drain window; anything still
/// open `drain + 5 s` after shutdown is dropped).
pub async fn serve(state: AppState, listener: TcpListener) -> std::io::Result<()> {
    let router = crate::app(state.clone());
    let shutdown = state.shutdown().clone();
    let graceful = GracefulShutdown::new();
    let connections = TaskTracker::new();
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let state = state.clone();
        let router = router.clone();
        let watcher = graceful.watcher();
        connections.spawn(async move {
            let slot = Slot::default();
            let io = HandoverIo::new(stream, slot.clone());
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .serve_connection(TokioIo::new(io), TowerToHyperService::new(router));
            // Boxed, so a lean stream's task does not keep hyper's size.
            let _ = Box::pin(watcher.watch(connection)).await;
            let handed = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(HandedOver { stream, request }) = handed {
                Box::pin(lean::serve(&state, stream, request)).await;
            }
        });
    }
    drop(listener);
    connections.close();
    let drain = Duration::from_secs(state.config().drain_secs) + Duration::from_secs(5);
    let finished = async {
        graceful.shutdown().await;
        connections.wait().await;
    };
    if tokio::time::timeout(drain, finished).await.is_err() {
        tracing::warn!("connections still open after the drain window; closing them");
    }
    Ok(())
}
