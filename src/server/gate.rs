//! The gateway listener (`--gate-addr`): the gateway check alone, on a
//! port of its own, for the auth subrequests nginx `auth_request`, Caddy
//! `forward_auth`, Traefik `ForwardAuth` or HAProxy send before every
//! request to the protected site.
//!
//! **Why a listener of its own.** The check runs once per request to the
//! protected site, so its cost is the gateway's added latency on every
//! page, image and API call. On the public listener each request also pays
//! for what buyers' connections need: the IO that follows every request's
//! framing so an event stream can be handed over (`handover.rs`), hyper's
//! head timer armed and dropped per request, the per-connection service
//! wrapping and the router. None of that concerns a gateway, which sends
//! bodiless heads on a pool of kept-alive connections and never opens a
//! stream. Here hyper serves the socket directly and each request is one
//! call of [`crate::http::gate_answer`]: the public listener's answer,
//! but for the page's security headers on a `200`, which no gateway
//! passes on. A gateway is also one client address
//! holding many connections, which the public listener's
//! `--connections-per-address` would count against it; here only the
//! total is capped (`--max-connections`).
//!
//! **Threads of its own.** Like the other listeners, it serves each
//! connection on one of its own single-threaded runtimes
//! ([`super::workers`]): a request this small costs more in cross-thread
//! wake-ups than in work on a work-stealing runtime.
//!
//! **Deadlines without a timer per request.** A connection that sends
//! nothing within `--first-byte-timeout-secs`, or no new request for
//! `--idle-timeout-secs`, is closed. Rather than arm a timer on every
//! read, each connection counts its requests and keeps one sleep: when it
//! fires and the count has not moved since it was armed, the connection
//! has been idle at least that long and is closed (gracefully: a request
//! in flight is answered first, within [`super::HEAD_TIMEOUT`]); else it
//! is armed again. So an idle keep-alive connection closes between one
//! and two idle timeouts after its last request: never before the
//! default 75 s, which outlasts the upstream keep-alive of common
//! gateways (nginx, 60 s) so the gateway always closes first.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::admit::Limits;
use super::workers::Workers;
use super::{Acceptor, HEAD_TIMEOUT, Settings};
use crate::http::AppState;

/// Serves the gateway check on `listener` until the state's shutdown
/// fires and every connection has finished (a request in flight is
/// answered; anything still open `drain + 5 s` after shutdown is
/// dropped). Accepts here, serves on the listener's own threads
/// (`workers.rs`).
pub async fn serve(
    state: AppState,
    settings: Settings,
    listener: TcpListener,
) -> std::io::Result<()> {
    let shutdown = state.shutdown().clone();
    // No per-address count (`per_address: None`): only the cap.
    let acceptor = Acceptor::new(
        listener,
        Limits {
            max_connections: settings.max_connections,
            per_address: None,
            proxies: state.trusted_proxies().clone(),
            reserve: None,
        },
    );
    let deadlines = Deadlines {
        first_byte: settings.first_byte_wait(),
        idle: settings.idle_timeout,
    };
    let mut workers = Workers::start(
        "waitroom-gate",
        settings.drain_window(),
        settings.thread_start,
    )?;
    while let Some((socket, _, held, _)) = acceptor.next(&shutdown).await {
        let _ = socket.set_nodelay(true);
        let (state, stopping) = (state.clone(), shutdown.clone());
        workers.hand(socket, move |socket| async move {
            let _held = held;
            serve_connection(state, socket, deadlines, stopping).await;
        });
    }
    acceptor.close(workers).await
}

/// How long a connection may wait for its first request, and between two.
#[derive(Debug, Clone, Copy)]
struct Deadlines {
    first_byte: Duration,
    idle: Duration,
}

/// One kept-alive connection, until the client closes it, it stays idle
/// past its deadline, or shutdown.
async fn serve_connection(
    state: AppState,
    socket: tokio::net::TcpStream,
    deadlines: Deadlines,
    stopping: tokio_util::sync::CancellationToken,
) {
    let requests = Arc::new(AtomicU64::new(0));
    let counted = requests.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        counted.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Ok::<_, Infallible>(crate::http::gate_answer(
            &state, &request,
        )))
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .max_header_size(super::handover::MAX_HEAD)
        .serve_connection(TokioIo::new(socket), service);
    let mut connection = std::pin::pin!(connection);
    let mut seen = 0;
    let mut wait = deadlines.first_byte;
    loop {
        tokio::select! {
            _ = connection.as_mut() => return,
            _ = stopping.cancelled() => break,
            _ = tokio::time::sleep(wait) => {
                let now = requests.load(Ordering::Relaxed);
                if now == seen {
                    break;
                }
                seen = now;
                wait = deadlines.idle;
            }
        }
    }
    // Idle past the deadline, or shutting down: an idle connection closes
    // at once, a request in flight is answered first (bounded: a head
    // dribbled in never finishes).
    connection.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(HEAD_TIMEOUT, connection).await;
}
