//! The connections the API is served on: the accept loop, and the two
//! paths an event stream can take.
//!
//! **Three listeners, one door.** [`serve`] runs for the public listener
//! (buyers: `crate::http::router`) and for the operator listener (metrics,
//! the admin and token APIs: `crate::http::admin_router`), each with its
//! own connection cap, the same limits and the same shutdown token. A
//! router without the events route never hands a connection to the lean
//! writer, so the operator listener is plain hyper. The gateway listener
//! (`--gate-addr`, `gate.rs`) serves the gateway check alone, without a
//! router. All three take connections through one `Acceptor` (the caps
//! and the refusals).
//!
//! **Serving threads.** Each listener accepts on the instance's runtime
//! (its caps and refusals are decided there) and hands every connection
//! it takes to one of its own single-threaded runtimes, one per core
//! (`workers.rs`): the connection's socket, its tasks, its timers and the
//! origin connections the proxy opens for it are all woken on one thread,
//! where the work-stealing runtime spread them over all (measured: the
//! gateway check 0.7× and a proxied request 0.7× the CPU; the background
//! tasks and the store's connections stay on the instance's runtime).
//!
//! **Why two paths.** Waiting is the long part of a waiting room: most open
//! connections are idle event streams. Served through hyper, each keeps a
//! read buffer, a write buffer and hyper's connection state: about 34 KiB
//! of server memory per idle stream, measured with the load test. Served
//! straight on its socket it keeps the socket and its session: about
//! 3 KiB. So one instance holds several times more waiting buyers.
//!
//! **The hyper path** serves every connection first: hyper (HTTP/1.1, one
//! task per connection) calls the axum router, tower middleware included,
//! and streams an event stream as a chunked body. It is always correct,
//! and it is what a connection falls back to whenever a handover is not
//! certain to be safe (a stream head that arrives in pieces, a pipelined
//! request, a body nobody read, `Transfer-Encoding`, …).
//!
//! **The lean path** takes over a connection when, at a true message
//! boundary (every earlier request read whole, body included, every
//! response written and flushed), one read brings exactly one complete
//! bodyless `GET` head for the event-stream route. `handover.rs` decides
//! that and recovers the socket from hyper; `lean.rs` runs the request
//! through the same router and writes its answer, then the stream's frames,
//! on the socket, closing the connection when the stream ends.
//!
//! **What middleware reaches.** Both paths run each request through the
//! whole router: routing, extractors (identity binding, tickets, limits),
//! handlers, error JSON and every router layer (the trace layer, …) see
//! the same request either way. On the lean path the stream's frames do not
//! pass through a response body, so a layer that wraps response bodies
//! sees an empty one there (the trace layer logs the stream's start, not
//! its end); response framing (`Content-Length`, chunking, `Connection`) is
//! the transport's. The layers added here, per connection — the request
//! body deadline (`--body-timeout-secs`) and the in-flight tracking of
//! `handover.rs` — are hyper-path only: a lean request has no body.
//!
//! **The client's address.** Both paths put the socket's peer in every
//! request as `ConnectInfo<SocketAddr>`, so the extractors find the client
//! (`crate::http::client`) the same way whichever path carries it.
//!
//! **Limits.** A new connection must send its first byte within
//! `--first-byte-timeout-secs` (5 s) or is closed unanswered: a socket
//! that connects and never speaks holds a slot that long, not for the idle
//! timeout. Heads are capped at `handover::MAX_HEAD` (`431`, from
//! hyper), must arrive within [`HEAD_TIMEOUT`] of their first byte, and
//! bodies within the body timeout (`408`). A keep-alive connection idle
//! (every request answered, no byte of the next) for `--idle-timeout-secs`
//! is closed; the default, 75 s, is longer than the upstream keep-alive of
//! common proxies and load balancers (nginx, AWS ALB: 60 s), so the proxy
//! always closes first and never sends a request on a connection this side
//! is closing (which it would answer `502`). Both deadlines are kept by
//! `handover.rs`'s IO, which frames the request bytes; where it lost the
//! framing, hyper's header timeout (idle + head) bounds the wait.
//! At most `--max-connections` connections, streams included, are open at
//! once, and at most `--connections-per-address` from one address; one
//! over either is answered (`503 server_busy`, `429
//! address_connections_limited`, with `Retry-After`) and closed. The
//! operator listener keeps a reserve for the admin and service tokens
//! beyond its cap (`admit.rs`).

mod admit;
mod gate;
mod handover;
mod lean;
mod workers;

pub use gate::serve as serve_gate;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::response::IntoResponse;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_http::timeout::RequestBodyDeadlineLayer;

use crate::error::ErrorCode;
use crate::http::ApiError;
use crate::http::AppState;
use admit::{Admission, Admitted, Held, Knock, Limits, ReserveConfig};
use handover::{HandoverIo, Shared, Timeouts, Tracked};

/// How long a client may take to send a request head, from its first
/// byte. (How long an idle keep-alive connection stays open is
/// `--idle-timeout-secs`.)
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections over the cap being answered at once; more are closed
/// unanswered. Bounds the descriptors refusing can take.
const TURN_AWAY_AT_ONCE: usize = 64;

/// How long a turned-away client has to read its answer.
const TURN_AWAY_LINGER: Duration = Duration::from_secs(1);

/// Connections the operator listener holds at once: scrapers and
/// operators, a handful; its own cap, so buyers filling the public one
/// never lock operators out. (Beyond it, the reserve for tokens.)
pub const ADMIN_MAX_CONNECTIONS: usize = 64;

/// Which listener [`serve`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// Buyers (`--addr`): `--max-connections`.
    Public,
    /// Operators (`--admin-addr`): [`ADMIN_MAX_CONNECTIONS`] and the
    /// reserve. Its router must not serve the event stream: a handed-over
    /// stream request would pass the reserve's check unseen.
    Operator,
}

/// What the transport reads of the configuration, typed (built by the
/// composition root).
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a request body may take to arrive (`408` after).
    pub body_timeout: std::time::Duration,
    /// How long a new connection may stay silent.
    pub first_byte_timeout: std::time::Duration,
    /// How long a kept-alive connection may stay idle.
    pub idle_timeout: std::time::Duration,
    /// `--drain-secs`: how long streams get to close at shutdown.
    pub drain: std::time::Duration,
    /// Most connections of the public listener, streams included.
    pub max_connections: usize,
    /// Most connections from one client address (`None`: no cap).
    pub connections_per_address: Option<usize>,
    /// The operator listener's reserve for bearers of a token.
    pub admin_reserved_connections: usize,
    /// Run first on each serving thread (`workers.rs`): what the parts
    /// below the transport set up per thread (the store's connection of
    /// the thread's own).
    pub thread_start: Option<fn()>,
}

impl Settings {
    /// How long a connection that has sent nothing yet may stay silent:
    /// it is at least as idle as a kept-alive one, so never longer.
    fn first_byte_wait(&self) -> Duration {
        self.first_byte_timeout.min(self.idle_timeout)
    }

    /// How long connections get to finish after shutdown: the drain
    /// window, then 5 s more before what is left is dropped.
    fn drain_window(&self) -> Duration {
        self.drain + Duration::from_secs(5)
    }
}

impl Listener {
    /// The name of its serving threads.
    fn thread_name(self) -> &'static str {
        match self {
            Self::Public => "waitroom-public",
            Self::Operator => "waitroom-operator",
        }
    }

    /// How this listener takes connections, from the transport's settings.
    fn limits(self, state: &AppState, settings: &Settings) -> Limits {
        let per_address = settings.connections_per_address;
        match self {
            Self::Public => Limits {
                max_connections: settings.max_connections,
                per_address,
                proxies: state.trusted_proxies().clone(),
                reserve: None,
            },
            Self::Operator => Limits {
                max_connections: ADMIN_MAX_CONNECTIONS,
                // At most half the ordinary slots from one address.
                per_address: per_address.map(|n| n.min(ADMIN_MAX_CONNECTIONS / 2)),
                proxies: state.trusted_proxies().clone(),
                reserve: (settings.admin_reserved_connections > 0).then(|| ReserveConfig {
                    slots: settings.admin_reserved_connections,
                    admin_token: state.admin_token().to_owned(),
                    service_token: state.service_token().map(str::to_owned),
                }),
            },
        }
    }
}

/// Serves `router` on `listener` as `kind` says (its connection caps),
/// until the state's shutdown fires and every connection has finished
/// (streams close within the drain window; anything still open `drain + 5
/// s` after shutdown is dropped). The public listener serves
/// [`crate::http::router`], the operator listener
/// [`crate::http::admin_router`]; both the same way.
pub async fn serve(
    state: AppState,
    settings: Settings,
    listener: TcpListener,
    router: axum::Router,
    kind: Listener,
) -> std::io::Result<()> {
    let app = tower::ServiceBuilder::new()
        .layer(RequestBodyDeadlineLayer::new(settings.body_timeout))
        .service(router.clone());
    let shutdown = state.shutdown().clone();
    let mut workers = workers::Workers::start(
        kind.thread_name(),
        settings.drain_window(),
        settings.thread_start,
    )?;
    let acceptor = Acceptor::new(listener, kind.limits(&state, &settings));
    let route = Arc::new(lean::stream_route(&state.settings().base_path));
    let timeouts = Timeouts {
        first_byte: settings.first_byte_wait(),
        idle: settings.idle_timeout,
        head: HEAD_TIMEOUT,
    };
    // hyper's own bound, for connections whose framing the IO lost: an
    // idle wait and a head after it.
    let backstop = timeouts.idle.max(timeouts.first_byte) + timeouts.head;
    while let Some((socket, peer, held, knock)) = acceptor.next(&shutdown).await {
        let router = router.clone();
        let app = app.clone();
        let stopping = shutdown.clone();
        let route = route.clone();
        workers.hand(socket, move |socket| async move {
            let _held = held;
            let shared = Arc::new(Shared::default());
            let io = HandoverIo::new(socket, shared.clone(), route, timeouts);
            let service = Tracked::new(app, shared.clone(), peer).knocking(knock);
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(backstop)
                .max_header_size(handover::MAX_HEAD)
                .serve_connection(TokioIo::new(io), service)
                .with_upgrades();
            // Boxed, so a lean stream's task does not keep hyper's size.
            // On shutdown, hyper finishes the request in flight and closes
            // (upgraded connections, the proxy's WebSockets, are their own
            // tasks by then and end with the process's drain window).
            let mut connection = Box::pin(connection);
            let stopping = tokio::select! {
                _ = connection.as_mut() => false,
                _ = stopping.cancelled() => true,
            };
            if stopping {
                connection.as_mut().graceful_shutdown();
                let _ = connection.as_mut().await;
            }
            // Dropped here: a connection hyper did not upgrade still holds
            // its IO, whose drop hands a stream's socket over (below).
            drop(connection);
            // Built in a closure, so the request and the socket are not
            // locals of this task: a local keeps its room in the task for
            // as long as the stream runs, even once moved out.
            let stream = shared.take_handed_over().map(|handed| {
                let mut request = handed.request;
                request.extensions_mut().insert(ConnectInfo(peer));
                lean::serve(router, handed.socket, request)
            });
            drop(shared);
            if let Some(stream) = stream {
                stream.await;
            }
        });
    }
    acceptor.close(workers).await
}

/// A listener's door: takes the next connection and admits it, or turns
/// it away (answered, closed) when it is over the listener's caps.
struct Acceptor {
    listener: TcpListener,
    admission: Admission,
    /// The answers being written to connections turned away.
    refusals: TaskTracker,
    turning_away: Arc<Semaphore>,
}

impl Acceptor {
    fn new(listener: TcpListener, limits: Limits) -> Self {
        Self {
            listener,
            admission: Admission::new(limits),
            refusals: TaskTracker::new(),
            turning_away: Arc::new(Semaphore::new(TURN_AWAY_AT_ONCE)),
        }
    }

    /// The next connection admitted: its socket, peer, slot and (over the
    /// operator listener's cap) knock; `None` once `shutdown` fires.
    async fn next(
        &self,
        shutdown: &CancellationToken,
    ) -> Option<(TcpStream, SocketAddr, Held, Option<Arc<Knock>>)> {
        loop {
            let (socket, peer) = tokio::select! {
                _ = shutdown.cancelled() => return None,
                accepted = self.listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let answer = match self.admission.admit(peer) {
                Admitted::Open(held) => return Some((socket, peer, held, None)),
                Admitted::Knocking(held, knock) => return Some((socket, peer, held, Some(knock))),
                Admitted::AddressFull => {
                    metrics::counter!("waitroom_address_connections_refused_total").increment(1);
                    address_full()
                }
                Admitted::Busy => {
                    metrics::counter!("waitroom_connections_refused_total").increment(1);
                    ApiError::ServerBusy
                }
            };
            if let Ok(slot) = self.turning_away.clone().try_acquire_owned() {
                self.refusals.spawn(turn_away(socket, answer, slot));
            }
        }
    }

    /// Stops taking connections (the listening socket closes at once),
    /// then waits for `workers` to finish what they serve and for the
    /// answers still being written to those turned away.
    async fn close(self, workers: workers::Workers) -> std::io::Result<()> {
        let Self {
            listener, refusals, ..
        } = self;
        drop(listener);
        refusals.close();
        workers.finish().await?;
        refusals.wait().await;
        Ok(())
    }
}

/// The answer to a connection over its address's share.
fn address_full() -> ApiError {
    ApiError::ClientLimited {
        code: ErrorCode::AddressConnectionsLimited,
        message: "too many open connections from this address; close some and retry".into(),
        retry_after_secs: 1,
    }
}

/// Answers a connection that is not taken (`503 server_busy` over the cap,
/// `429 address_connections_limited` over its address's share) and closes
/// it. The client gets [`TURN_AWAY_LINGER`] to read the answer before the
/// close (closing with its request unread would reset the connection and
/// could destroy the answer on the way).
async fn turn_away(mut socket: TcpStream, answer: ApiError, _slot: OwnedSemaphorePermit) {
    let mut refused = answer.into_response();
    crate::http::security::apply(refused.headers_mut(), true);
    let answer = lean::plain_response(refused).await;
    let _ = tokio::time::timeout(TURN_AWAY_LINGER, async {
        socket.write_all(&answer).await?;
        socket.shutdown().await?;
        let mut sink = [0u8; 256];
        while socket.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}
