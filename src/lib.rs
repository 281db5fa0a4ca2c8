//! waitroom: a virtual waiting room in front of an order API.
//!
//! [`run`] serves a configured instance until its shutdown token fires;
//! [`serve`] does the same for an already built [`App`] (tests share a
//! store between several instances that way).
//!
//! The top-level modules, bottom-up; each uses only the modules named
//! after "uses" (`tests/api/layering.rs` holds this table, `LAYERS`, and
//! checks every module against it, that the arrows form no circle, that
//! nothing but this file names `app`, that `queue` names nothing else of
//! the crate and that `gate` names neither `http` nor axum):
//!
//! - `queue` holds the rules, knowing neither Redis nor HTTP (uses nothing);
//!   `clock` is the one wall clock; `telemetry` sets up logs and metrics;
//!   [`tls`] is the TLS client both outgoing `https://` paths share;
//! - [`store`] keeps the state, Redis or memory (uses `queue`, `clock`);
//! - [`identity`] says who a request is for; [`brand`] reads operators'
//!   page branding (`--page-dir`); [`pass`] signs and verifies the
//!   admission passes a protected site's gateway checks (the Ed25519 key
//!   ring, JWKS, return URLs) (all three use `queue`);
//! - [`error`] is the one error shape, `ApiError` and its `ErrorCode`s
//!   (uses `store`);
//! - [`catalog`] is the instance's copy of the live queues; [`push`] fans
//!   queue events out to this instance's streams (both use `queue`,
//!   `store`);
//! - [`challenge`] (join challenges), [`lottery`] (the draw of a scheduled
//!   opening), [`webhook`] (audit-log delivery; also `tls`) and [`fairness`] (signed
//!   receipts, the public admission log; it signs with `pass`'s key ring)
//!   use `queue`, `store`, `clock`;
//! - [`gate`] guards entry tokens for order services, framework-free (uses
//!   `queue`, `store`, `identity`); [`orders`] is the demo order service
//!   (uses `queue`, `store`, `gate`);
//! - [`tasks`] is everything that runs in the background (uses the domain
//!   modules above: `queue`, `store`, `clock`, `catalog`, `push`,
//!   `lottery`, `webhook`, `fairness`, `gate`, `orders`, `pass`);
//! - [`http`] is the API: its state ([`AppState`], typed `HttpSettings`),
//!   routes, extractors (the order gate's `EntryPass` too), request limits
//!   (uses the modules above but `tasks` and `webhook`);
//! - [`server`] owns the connections: the buyers', operators' and
//!   gateways' (`--gate-addr`) listeners, their serving threads, the lean
//!   stream writer, caps, shutdown (uses `http`, `error`, `push`);
//! - [`front`] is the built-in reverse proxy (`--origin`, `[[rooms]]`):
//!   waitroom's own paths under one reserved prefix, every other path
//!   forwarded to the room's origin with a valid pass, the waiting page
//!   without one (uses `queue`, `clock`, `error`, `http`, `pass`, `tls`);
//! - [`config`] is the configuration file, environment and command line,
//!   in that order of precedence, and the cargo features a build has
//!   (`config::features`: a flag needing a missing one is refused) (uses `queue`,
//!   `store`, `identity`, `challenge`, `webhook`, `http`, `pass`, `front`: the types it
//!   configures live with their behaviour);
//! - `app`, the composition root, builds the services and the HTTP state
//!   from the configuration and starts the tasks; only this file uses it
//!   (re-exported as [`App`], [`StartError`]);
//! - `main` parses the command line and calls [`run_until_signal`].

#![forbid(unsafe_code)]

mod app;
pub mod brand;
pub mod catalog;
pub mod challenge;
pub mod clock;
pub mod config;
pub mod error;
pub mod fairness;
pub mod front;
pub mod gate;
pub mod http;
pub mod identity;
pub mod lottery;
#[cfg(feature = "demo-orders")]
pub mod orders;
pub mod pass;
pub mod push;
pub mod queue;
pub mod server;
pub mod store;
pub mod tasks;
pub mod telemetry;
#[cfg(feature = "https-webhooks")]
pub mod tls;
pub mod webhook;

use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use app::{App, StartError};
pub use config::Config;
pub use http::AppState;

/// The listeners of an instance: buyers on `public` (`--addr`),
/// operators on `admin` (`--admin-addr`: metrics, the admin API, the token
/// API), so the operator surfaces need not be reachable where buyers are,
/// and gateways on `gate` (`--gate-addr`, when set: the gateway check
/// alone).
pub struct Listeners {
    pub public: TcpListener,
    pub admin: TcpListener,
    pub gate: Option<TcpListener>,
}

impl Listeners {
    /// Binds `--addr` and `--admin-addr` as configured (see
    /// [`bind_admin`]).
    pub async fn bind(config: &Config) -> Result<Self, StartError> {
        // A configuration that cannot run says so before any port is taken.
        config.validate()?;
        let public = bind_public(config.addr, config.listen_backlog)?;
        let admin = bind_admin(config.admin_addr).await?;
        let gate = match config.gate_addr {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| {
                StartError::Io(std::io::Error::new(
                    e.kind(),
                    format!("--gate-addr {addr}: {e}"),
                ))
            })?),
            None => None,
        };
        Ok(Self {
            public,
            admin,
            gate,
        })
    }
}

/// Binds the buyers' listener with a listen backlog of `backlog`
/// (`--listen-backlog`), not the 128 of `TcpListener::bind`: a sale's
/// opening connects arrive together, and each one the kernel cannot queue
/// is a SYN dropped and a buyer kept a second or more before the page even
/// loads.
pub fn bind_public(addr: std::net::SocketAddr, backlog: u32) -> Result<TcpListener, StartError> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restart rebinds while the last run's
    // connections are still in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr).map_err(|e| {
        StartError::Io(std::io::Error::new(e.kind(), format!("--addr {addr}: {e}")))
    })?;
    let listener = socket.listen(backlog)?;
    if let Some(cap) = kernel_backlog_cap().filter(|&cap| cap < backlog) {
        tracing::warn!(
            listen_backlog = backlog,
            somaxconn = cap,
            "the kernel caps the listen backlog below --listen-backlog; raise net.core.somaxconn for a sale's opening burst"
        );
    }
    Ok(listener)
}

/// `net.core.somaxconn` where the kernel tells it (Linux).
fn kernel_backlog_cap() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Binds the operator listener. An address that was set must bind (an
/// error otherwise: an operator who chose a port wants that port). Unset,
/// it is [`config::DEFAULT_ADMIN_ADDR`], and when another process (a second
/// instance on the same host) holds that, a free loopback port: the
/// instance still starts, with a warning and the address in the log.
pub async fn bind_admin(addr: Option<std::net::SocketAddr>) -> Result<TcpListener, StartError> {
    if let Some(addr) = addr {
        return TcpListener::bind(addr).await.map_err(|e| {
            StartError::Io(std::io::Error::new(
                e.kind(),
                format!("--admin-addr {addr}: {e}"),
            ))
        });
    }
    match TcpListener::bind(config::DEFAULT_ADMIN_ADDR).await {
        Ok(listener) => Ok(listener),
        Err(e) => {
            let fallback = std::net::SocketAddr::new(config::DEFAULT_ADMIN_ADDR.ip(), 0);
            let listener = TcpListener::bind(fallback).await?;
            tracing::warn!(
                default = %config::DEFAULT_ADMIN_ADDR,
                error = %e,
                admin_addr = %listener.local_addr()?,
                "the default operator address is taken; serving operators on a free loopback port instead (set --admin-addr to choose)"
            );
            Ok(listener)
        }
    }
}

/// Runs an instance as the binary does: a Tokio runtime of its own, the
/// log, the open-file limit raised, the configured listeners, until
/// SIGINT or SIGTERM; then [`run`]'s shutdown.
///
/// It lives here rather than in `main.rs` because the futures of an `async
/// fn` are compiled in the crate that polls them: polled from the binary,
/// the whole server was compiled again there, after the library (about
/// 20 s of a release build on two cores).
#[tokio::main]
pub async fn run_until_signal(config: Config) -> Result<(), StartError> {
    telemetry::init_tracing();
    raise_open_file_limit();
    let listeners = Listeners::bind(&config).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    run(config, listeners, shutdown).await
}

/// Each open event stream is a socket: use the whole hard limit.
fn raise_open_file_limit() {
    if let Ok(limit) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::debug!(limit, "open-file limit");
    }
}

/// Fires `shutdown` on the first SIGINT or SIGTERM.
async fn stop_on_signal(shutdown: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
    shutdown.cancel();
}

/// Serves `config` on `listeners` until `shutdown` fires, then stops every
/// background task before returning.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    telemetry::install_metrics();
    let app = App::new(config, shutdown.clone()).await?;
    if app.config().admin_token.is_none() {
        // Never through the log macros, whatever RUST_LOG says: written
        // once, to stderr beside the log, and only when it was made up
        // here. A configured token is never written anywhere.
        eprintln!(
            "admin token (set --admin-token to choose one): {}",
            app.state().admin_token()
        );
    }
    serve(app, listeners).await
}

/// Serves an already built instance on both listeners; see [`run`].
pub async fn serve(app: App, listeners: Listeners) -> Result<(), StartError> {
    let state = app.state().clone();
    let settings = app.server_settings().clone();
    let Listeners {
        public: listener,
        admin,
        gate,
    } = listeners;
    let shutdown = state.shutdown().clone();
    let state_gate = state.gate().clone();
    // The whole shutdown fits in `--drain-secs` + 5 s from the signal: the
    // server's own hard cap, and what is left of it for the tasks below.
    let grace = settings.drain + SHUTDOWN_SLACK;
    let stop_by = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            tokio::time::Instant::now() + grace
        })
    };
    let tasks = TaskTracker::new();
    app.spawn_background(&tasks);
    tracing::info!(addr = %listener.local_addr()?, queues = state.queue_names().len(), features = %config::features::enabled().join(","), "waitroom listening");
    tracing::info!(addr = %admin.local_addr()?, "operator listener (metrics, admin and token APIs)");
    let operators = tokio::spawn(server::serve(
        state.clone(),
        settings.clone(),
        admin,
        http::admin_router(state.clone()),
        server::Listener::Operator,
    ));
    let gateways = match gate {
        Some(gate) => {
            tracing::info!(addr = %gate.local_addr()?, "gateway listener (the gateway check)");
            Some(tokio::spawn(server::serve_gate(
                state.clone(),
                settings.clone(),
                gate,
            )))
        }
        None => None,
    };
    let router = app.public_router();
    let served = server::serve(state, settings, listener, router, server::Listener::Public).await;
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
    // The operator listener stops on the same token, within the same window.
    let operators = operators
        .await
        .map_err(|e| std::io::Error::other(format!("operator listener: {e}")))?;
    if let Some(gateways) = gateways {
        gateways
            .await
            .map_err(|e| std::io::Error::other(format!("gateway listener: {e}")))??;
    }
    served?;
    Ok(operators?)
}

/// What the shutdown window adds to `--drain-secs`: in-flight requests
/// finish and background tasks stop within it.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(5);
