//! The built-in reverse proxy: waitroom in front of a site that knows
//! nothing of it (`--origin URL`, or `[[rooms]]` for several).
//!
//! Every request on the public listener comes here first:
//!
//! - its path is resolved once (`path.rs`): what is matched is what is
//!   forwarded, and a path with two meanings is `400 invalid_path`;
//! - below the reserved prefix (`--base-path`, `/_waitroom` unless set)
//!   it is waitroom's own (the page, its files, the API, the streams, the
//!   pass endpoint, `.well-known`), served by [`crate::http::router`] and
//!   never forwarded;
//! - otherwise its room is found by `Host` and path (`rooms.rs`; none:
//!   `404`, never forwarded). With a valid pass for the room's queue it is
//!   forwarded to the room's origin (`forward.rs`, `upgrade.rs` for
//!   WebSockets); without one it is never forwarded: a browser gets the
//!   waiting page at the same URL, a program `503 pass_required`
//!   (`waiting.rs`).
//!
//! The pass itself (its signature, expiry, sessions, the endpoint that
//! issues it) is `crate::pass`'s; this module asks it through [`Passes`]
//! only. Checking a pass is a signature check and a clock read: a
//! proxied request costs the store nothing, and with the store down live
//! passes keep working until they expire, while new admissions (which
//! need the store) stop.

mod forward;
mod passes;
mod path;
mod refused;
mod rooms;
// Without `https-webhooks`, no TLS crate is built: an `https://` origin
// is refused at start, naming the feature (`config::features`).
#[cfg(feature = "https-webhooks")]
mod tls;
#[cfg(not(feature = "https-webhooks"))]
#[path = "no_tls.rs"]
mod tls;
mod upgrade;
mod waiting;

use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use axum::http::HeaderMap;
use axum::http::header;
use axum::http::request::Parts;
use axum::http::uri::PathAndQuery;
use axum::response::{IntoResponse, Response};
use tower::ServiceExt;

pub use forward::Timeouts;
pub use passes::PassGate;
pub use path::{PathRefused, is_below, normalize};
pub use rooms::{HostMatch, Origin, ROOM_KEYS, RoomSpec, RoomTable, Rooms, SessionTimes};
pub use tls::{Certificate as OriginCertificate, OriginTls, read_origin_ca};

use crate::error::{ApiError, ErrorCode};
use crate::http::AppState;
use crate::queue::QueueName;
use forward::{Asker, Upstream};

/// The reserved prefix when `--base-path` is not set.
pub const DEFAULT_PREFIX: &str = "/_waitroom";

/// What the proxy asks of the pass (`crate::pass`): the one seam between
/// the two.
pub trait Passes: Send + Sync + 'static {
    /// Whether `headers` (the pass cookie, or a bearer) hold a valid pass
    /// for `queue` now; a valid one also counts as the session's activity
    /// (reported in batches, never a store call per request).
    fn admits(&self, headers: &HeaderMap, queue: &QueueName) -> bool;
}

/// The proxy: its rooms, the pooled client to their origins, the reserved
/// prefix and the pass.
pub struct Front {
    rooms: Rooms,
    upstream: Upstream,
    prefix: String,
    passes: Arc<dyn Passes>,
}

impl Front {
    pub fn new(
        rooms: Rooms,
        timeouts: Timeouts,
        forwarded: crate::http::client::ForwardedHeader,
        prefix: String,
        passes: Arc<dyn Passes>,
    ) -> Self {
        Self {
            rooms,
            upstream: Upstream::new(timeouts, forwarded),
            prefix,
            passes,
        }
    }

    /// With `tls` for the rooms whose origin is `https://`.
    pub fn with_origin_tls(mut self, tls: OriginTls) -> Self {
        self.upstream = self.upstream.with_tls(tls);
        self
    }

    pub fn rooms(&self) -> &Rooms {
        &self.rooms
    }
}

/// The public listener's router with a front: `inner` (waitroom's own
/// router, serving below the prefix) for the reserved prefix, the rooms
/// for everything else.
pub fn router(state: AppState, front: Arc<Front>, inner: Router) -> Router {
    Router::new().fallback_service(tower::service_fn(move |request: Request| {
        let state = state.clone();
        let front = front.clone();
        let inner = inner.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(state, front, inner, request).await) }
    }))
}

async fn handle(
    state: AppState,
    front: Arc<Front>,
    inner: Router,
    mut request: Request,
) -> Response {
    let path = match normalize(request.uri().path()) {
        Ok(path) => path,
        Err(refused) => {
            metrics::counter!("waitroom_front_requests_total", "outcome" => "invalid_path")
                .increment(1);
            return ApiError::bad_request(ErrorCode::InvalidPath, refused.to_string())
                .into_response();
        }
    };
    let as_sent = request
        .uri()
        .path_and_query()
        .filter(|asked| asked.path() == path)
        .cloned();
    let path_and_query = match as_sent {
        // Nothing resolved: the target as it came, not written out again.
        Some(asked) => asked,
        None => {
            let resolved = match request.uri().query() {
                Some(query) => format!("{path}?{query}"),
                None => path.clone(),
            };
            let Ok(resolved) = resolved.parse::<PathAndQuery>() else {
                return ApiError::bad_request(
                    ErrorCode::InvalidPath,
                    "the request target cannot be read",
                )
                .into_response();
            };
            resolved
        }
    };
    if is_below(&path, &front.prefix) {
        if let Ok(uri) = path_and_query.as_str().parse() {
            *request.uri_mut() = uri;
        }
        return inner
            .oneshot(request)
            .await
            .unwrap_or_else(|never| match never {});
    }
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(rooms::host_name)
        .unwrap_or_default();
    let Some(room) = front.rooms.find(&host, &path) else {
        metrics::counter!("waitroom_front_requests_total", "outcome" => "no_room").increment(1);
        return ApiError::not_found(ErrorCode::NotFound, "no such resource").into_response();
    };
    if !front.passes.admits(request.headers(), &room.queue) {
        metrics::counter!("waitroom_front_requests_total", "outcome" => "waiting").increment(1);
        let (parts, _) = request.into_parts();
        return without_pass(
            &state,
            &front,
            &inner,
            room,
            &parts,
            path_and_query.as_str(),
        )
        .await;
    }
    metrics::counter!("waitroom_front_requests_total", "outcome" => "forwarded").increment(1);
    let who = asker(&state, &request);
    let program = waiting::wants_json(request.headers());
    let forwarded = if upgrade::is_upgrade(request.headers()) {
        upgrade::forward(&front.upstream, room, request, path_and_query, &who).await
    } else {
        front
            .upstream
            .forward(room, request, path_and_query, &who)
            .await
    };
    match forwarded {
        Ok(response) => response,
        Err(error) if program => error.into_response(),
        Err(error) => waiting::error_page(error),
    }
}

/// The answer without a pass: the waiting page to a browser's `GET` or
/// `HEAD`, `503 pass_required` to anything else (a program, an upgrade, a
/// form sent without a pass).
async fn without_pass(
    state: &AppState,
    front: &Front,
    inner: &Router,
    room: &RoomSpec,
    request: &Parts,
    return_to: &str,
) -> Response {
    let page_method = matches!(
        request.method,
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    if !page_method
        || upgrade::is_upgrade(&request.headers)
        || waiting::wants_json(&request.headers)
    {
        return waiting::pass_required();
    }
    waiting::answer(state, inner, &front.prefix, room, request, return_to).await
}

/// The socket's peer and the client as the trusted proxies make it.
fn asker(state: &AppState, request: &Request) -> Asker {
    let peer = request
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    let proxies = state.trusted_proxies();
    Asker {
        peer,
        peer_trusted: proxies.trusts(peer),
        client: proxies.client(peer, request.headers()),
    }
}
