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
//! call of [`crate::http::gate_answer`]: the same answer, byte for byte,
//! as the public listener's check. A gateway is also one client address
//! holding many connections, which the public listener's
//! `--connections-per-address` would count against it; here only the
//! total is capped (`--max-connections`).
//!
//! **Threads of its own.** The rest of the instance runs on tokio's
//! work-stealing runtime, whose cross-thread wake-ups cost a request this
//! small more than the request itself: 7.5 µs of CPU per check there
//! against 5.3 µs on a single-threaded runtime, measured under the same
//! load (docs/benchmarks/gate-listener-20261202T1900Z.md). So the
//! listener accepts on the instance's runtime and hands each connection,
//! in turn, to one of its own threads (one per core, up to
//! [`MAX_THREADS`]), each a single-threaded runtime serving what it was
//! handed. They share the instance's state (the pass service, the
//! catalog) and the shutdown token, and end with it.
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
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use super::admit::{Admission, Admitted, Held, Limits};
use super::{HEAD_TIMEOUT, Settings, TURN_AWAY_AT_ONCE, turn_away};
use crate::http::{ApiError, AppState};

/// Most threads the gateway listener serves on (one per core up to this).
const MAX_THREADS: usize = 8;

/// An accepted connection on its way to a serving thread, with its slot.
type Handed = (std::net::TcpStream, Held);

/// Serves the gateway check on `listener` until the state's shutdown
/// fires and every connection has finished (a request in flight is
/// answered; anything still open `drain + 5 s` after shutdown is
/// dropped). Accepts here, serves on threads of its own (see the module
/// doc), handing connections out in turn.
pub async fn serve(
    state: AppState,
    settings: Settings,
    listener: TcpListener,
) -> std::io::Result<()> {
    let shutdown = state.shutdown().clone();
    let admission = Admission::new(Limits {
        max_connections: settings.max_connections,
        per_address: None,
        proxies: state.trusted_proxies().clone(),
        reserve: None,
    });
    let deadlines = Deadlines {
        first_byte: settings.first_byte_timeout.min(settings.idle_timeout),
        idle: settings.idle_timeout,
    };
    let drain = settings.drain + Duration::from_secs(5);
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_THREADS);
    let mut workers = Vec::with_capacity(threads);
    let mut stopped = Vec::with_capacity(threads);
    for n in 0..threads {
        let (hand, incoming) = tokio::sync::mpsc::unbounded_channel::<Handed>();
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let state = state.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name(format!("waitroom-gate-{n}"))
            .spawn(move || {
                runtime.block_on(work(state, incoming, deadlines, drain));
                let _ = done.send(());
            })?;
        workers.push(hand);
        stopped.push(finished);
    }
    let refusals = TaskTracker::new();
    let turning_away = Arc::new(Semaphore::new(TURN_AWAY_AT_ONCE));
    let mut next = 0;
    loop {
        let (socket, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "gateway listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // No per-address count (`per_address: None`): only the cap.
        let Admitted::Open(held) = admission.admit(peer) else {
            metrics::counter!("waitroom_connections_refused_total").increment(1);
            if let Ok(slot) = turning_away.clone().try_acquire_owned() {
                refusals.spawn(turn_away(socket, ApiError::ServerBusy, slot));
            }
            continue;
        };
        let _ = socket.set_nodelay(true);
        // Out of this runtime's reactor, into the serving thread's.
        let Ok(socket) = socket.into_std() else {
            continue;
        };
        next = (next + 1) % workers.len();
        // A worker that is gone (it panicked) drops what it is handed.
        let _ = workers[next].send((socket, held));
    }
    drop(listener);
    // Closing the hand-over ends each worker's loop: it finishes what it
    // serves within the drain window, then its thread ends.
    drop(workers);
    refusals.close();
    refusals.wait().await;
    for finished in stopped {
        finished
            .await
            .map_err(|_| std::io::Error::other("a gateway listener thread panicked"))?;
    }
    Ok(())
}

/// One serving thread: the connections it is handed, each a task of its
/// runtime, until the hand-over closes; then what is open gets `drain`.
async fn work(
    state: AppState,
    mut incoming: tokio::sync::mpsc::UnboundedReceiver<Handed>,
    deadlines: Deadlines,
    drain: Duration,
) {
    let connections = TaskTracker::new();
    let shutdown = state.shutdown().clone();
    while let Some((socket, held)) = incoming.recv().await {
        let Ok(socket) = tokio::net::TcpStream::from_std(socket) else {
            continue;
        };
        let state = state.clone();
        let stopping = shutdown.clone();
        connections.spawn(async move {
            let _held = held;
            serve_connection(state, socket, deadlines, stopping).await;
        });
    }
    connections.close();
    if tokio::time::timeout(drain, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!("gateway connections still open after the drain window; closing them");
    }
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
