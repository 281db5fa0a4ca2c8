//! waitroom: a virtual waiting room in front of an order API.
//!
//! [`run`] serves a configured instance until its shutdown token fires;
//! [`serve`] does the same for an already built [`AppState`] (tests share a
//! store between several instances that way).
//!
//! The modules, with dependencies pointing one way (each uses only the ones
//! after it):
//!
//! - `main` parses the command line ([`config`]) and calls [`run`];
//! - [`server`] owns the connections: the listener, the lean stream writer
//!   and the hyper fallback, connection caps, shutdown;
//! - [`app`] builds the [`AppState`] from the configuration and starts the
//!   background tasks, handing each only its own handles;
//! - [`http`] is the API: routes, extractors, the one error type, the
//!   per-buyer request limits;
//! - [`identity`] says who a request is for (visitor cookie, gateway
//!   header or signed login token), for the API and the gate alike;
//! - [`push`] fans the store's queue events out to this instance's streams;
//!   [`gate`] guards entry tokens for order services; [`admission`] runs the
//!   admission passes; [`orders`] is the demo order service;
//! - [`store`] keeps the state (Redis, or memory for one instance);
//! - [`queue`] holds the rules, knowing neither Redis nor HTTP;
//! - [`telemetry`] sets up logs and metrics.

pub mod admission;
pub mod app;
pub mod challenge;
pub mod config;
pub mod gate;
pub mod http;
pub mod identity;
pub mod orders;
pub mod push;
pub mod queue;
pub mod server;
pub mod store;
pub mod telemetry;

use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use app::{AppState, StartError};
pub use config::Config;

/// Serves `config` on `listener` until `shutdown` fires, then stops every
/// background task before returning.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    telemetry::install_metrics();
    let state = AppState::new(config, shutdown.clone()).await?;
    if state.config().admin_token.is_none() {
        println!(
            "admin token (set --admin-token to choose one): {}",
            state.admin_token()
        );
    }
    serve(state, listener).await
}

/// Serves an already built state; see [`run`].
pub async fn serve(state: AppState, listener: TcpListener) -> Result<(), StartError> {
    let shutdown = state.shutdown().clone();
    let state_gate = state.gate().clone();
    // The whole shutdown fits in `--drain-secs` + 5 s from the signal: the
    // server's own hard cap, and what is left of it for the tasks below.
    let grace = Duration::from_secs(state.config().drain_secs) + SHUTDOWN_SLACK;
    let stop_by = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            tokio::time::Instant::now() + grace
        })
    };
    let tasks = TaskTracker::new();
    state.spawn_background(&tasks);
    tracing::info!(addr = %listener.local_addr()?, queues = state.queue_names().len(), "waitroom listening");
    let served = server::serve(state, listener).await;
    shutdown.cancel();
    let stop_by = stop_by
        .await
        .unwrap_or_else(|_| tokio::time::Instant::now());
    tasks.close();
    let stopped = async {
        state_gate.drain().await;
        tasks.wait().await;
    };
    // Whatever is cut off here is safe to drop: recorded token deletes are
    // finished by the next process, claims lapse by themselves.
    if tokio::time::timeout_at(stop_by, stopped).await.is_err() {
        tracing::warn!("background tasks still running at the end of the shutdown window");
    }
    Ok(served?)
}

/// What the shutdown window adds to `--drain-secs`: in-flight requests
/// finish and background tasks stop within it.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(5);
