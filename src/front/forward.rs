//! Forwarding an admitted request to its room's origin.
//!
//! hyper's HTTP/1.1 client connections carry the request, pooled per
//! origin ([`Pool`]): both bodies stream (the request's frames go up as
//! they arrive, the origin's come down as they arrive; nothing is
//! buffered whole), and a connection is reused once its answer has been
//! read whole. The request is rewritten the way a proxy must: hop-by-hop
//! headers (RFC 9110 §7.6.1: `Connection` and every header it names,
//! `Keep-Alive`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`,
//! `Proxy-*`) are dropped both ways; `Host` becomes the origin's unless the
//! room keeps it; `X-Forwarded-For`/`-Proto`/`-Host` (or RFC 7239
//! `Forwarded`, per `--client-address-header`) say who asked, replacing
//! what the client sent unless the client is a trusted proxy, whose chain
//! is extended. A WebSocket upgrade goes over a connection of its own
//! (`upgrade.rs`).
//!
//! An `https://` origin's requests go through the same steps on the TLS
//! client of `tls.rs`.
//!
//! Failures are the gateway's: the origin unreachable or breaking off is
//! `502 origin_unreachable`, no response head within the room's timeout is
//! `504 origin_timeout`; a browser gets them as a short page.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Uri, uri::PathAndQuery};
use axum::response::Response;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::rooms::RoomSpec;
use super::tls::OriginTls;
use crate::error::ApiError;
use crate::http::client::{ClientInfo, ForwardedHeader};

/// How long to wait for the origin.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// A TCP connection to the origin.
    pub connect: Duration,
    /// The origin's response head, from the request sent (its body then
    /// streams as long as it takes).
    pub response: Duration,
}

/// The pooled connections every room's requests share.
#[derive(Clone)]
pub struct Upstream {
    pool: Arc<Pool>,
    /// The `https://` origins' client (`tls.rs`), when a room has one.
    tls: Option<OriginTls>,
    timeouts: Timeouts,
    forwarded: ForwardedHeader,
}

/// How many idle connections are kept per origin: enough for a busy
/// origin's steady load without a connect per request.
pub(super) const IDLE_PER_ORIGIN: usize = 256;

/// How long an idle connection is kept for reuse.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

impl Upstream {
    pub fn new(timeouts: Timeouts, forwarded: ForwardedHeader) -> Self {
        Self {
            pool: Arc::default(),
            tls: None,
            timeouts,
            forwarded,
        }
    }

    /// With `tls` for the `https://` origins.
    pub fn with_tls(mut self, tls: OriginTls) -> Self {
        self.tls = Some(tls);
        self
    }

    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// The `https://` origins' client, if any room has one.
    pub fn tls(&self) -> Option<&OriginTls> {
        self.tls.as_ref()
    }

    /// Sends `request` (its path already normalized into `path_and_query`)
    /// to `room`'s origin and returns the origin's answer, streaming.
    pub async fn forward(
        &self,
        room: &RoomSpec,
        mut request: Request,
        path_and_query: PathAndQuery,
        who: &Asker,
    ) -> Result<Response, ApiError> {
        if room.origin.tls
            && let Some(tls) = &self.tls
        {
            return self
                .forward_tls(tls, room, request, path_and_query, who)
                .await;
        }
        // Origin-form (`/path?query`): the connection is the origin's.
        *request.uri_mut() = Uri::from(path_and_query);
        *request.version_mut() = axum::http::Version::HTTP_11;
        strip_hop_by_hop(request.headers_mut());
        self.rewrite_request_headers(room, request.headers_mut(), who);
        if !request.headers().contains_key(header::HOST)
            && let Ok(host) = HeaderValue::from_str(&room.origin.authority)
        {
            // HTTP/1.1 wants one: a client that sent none asks the origin.
            request.headers_mut().insert(header::HOST, host);
        }
        let origin = room.origin.authority.as_str();
        let exchange = self.pool.exchange(origin, request, self.timeouts.connect);
        let (sender, response) = match tokio::time::timeout(self.timeouts.response, exchange).await
        {
            Err(_) => return Err(origin_timeout(room)),
            Ok(Err(e)) => return Err(origin_unreachable(room, &e)),
            Ok(Ok(answered)) => answered,
        };
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let body = GiveBack {
            body,
            back: Some((self.pool.clone(), sender)),
            origin: origin.into(),
        };
        Ok(Response::from_parts(parts, Body::new(body)))
    }

    /// [`forward`](Self::forward) for an `https://` origin: the same
    /// rewriting, over the TLS client's own pool (`tls.rs`).
    async fn forward_tls(
        &self,
        tls: &OriginTls,
        room: &RoomSpec,
        mut request: Request,
        path_and_query: PathAndQuery,
        who: &Asker,
    ) -> Result<Response, ApiError> {
        let uri = Uri::builder()
            .scheme(room.origin.scheme())
            .authority(room.origin.authority.as_str())
            .path_and_query(path_and_query)
            .build()
            .map_err(|e| ApiError::Internal(format!("origin URI: {e}")))?;
        *request.uri_mut() = uri;
        *request.version_mut() = axum::http::Version::HTTP_11;
        strip_hop_by_hop(request.headers_mut());
        self.rewrite_request_headers(room, request.headers_mut(), who);
        let response =
            match tokio::time::timeout(self.timeouts.response, tls.request(request)).await {
                Err(_) => return Err(origin_timeout(room)),
                Ok(Err(e)) => return Err(origin_unreachable(room, &e)),
                Ok(Ok(response)) => response,
            };
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        Ok(Response::from_parts(parts, Body::new(body)))
    }

    /// `Host` and the forwarding headers, as the origin must see them.
    pub fn rewrite_request_headers(&self, room: &RoomSpec, headers: &mut HeaderMap, who: &Asker) {
        let asked_host = headers.get(header::HOST).cloned();
        if !room.preserve_host
            && let Ok(value) = HeaderValue::from_str(&room.origin.authority)
        {
            headers.insert(header::HOST, value);
        }
        let proto = if who.client.https { "https" } else { "http" };
        let from_proxy = who.peer_trusted;
        match self.forwarded {
            ForwardedHeader::XForwardedFor => {
                let chain = chain_with(
                    from_proxy
                        .then(|| joined(headers, "x-forwarded-for"))
                        .flatten(),
                    &who.peer.to_string(),
                );
                set(headers, "x-forwarded-for", &chain);
                headers.remove(header::FORWARDED);
            }
            ForwardedHeader::Forwarded => {
                let node = forwarded_node(who.peer);
                let mut element = format!("for={node};proto={proto}");
                if let Some(host) = asked_host.as_ref().and_then(|h| h.to_str().ok()) {
                    element.push_str(&format!(";host=\"{}\"", host.replace('"', "")));
                }
                let chain = chain_with(
                    from_proxy.then(|| joined(headers, "forwarded")).flatten(),
                    &element,
                );
                set(headers, "forwarded", &chain);
                headers.remove("x-forwarded-for");
            }
        }
        // What the client asked for, as this proxy was asked: a trusted
        // proxy's word on it is kept, anyone else's replaced.
        let asked_host = if from_proxy {
            headers
                .get("x-forwarded-host")
                .cloned()
                .or(asked_host.clone())
        } else {
            asked_host
        };
        match asked_host {
            Some(host) => {
                headers.insert("x-forwarded-host", host);
            }
            None => {
                headers.remove("x-forwarded-host");
            }
        }
        set(headers, "x-forwarded-proto", proto);
    }
}

/// Idle HTTP/1.1 connections to the origins, most recently used last,
/// kept per serving thread.
///
/// Each connection is driven by a task of its own (hyper's client
/// connection); a request takes one out, and its response body gives it
/// back once the origin's answer has been read whole, so a connection
/// is only ever reused at a message boundary, and the hot path spawns
/// nothing. A connection whose answer is dropped half-read is not given
/// back (hyper closes it).
///
/// **Per thread.** A connection's task runs on the runtime of the thread
/// that opened it (`crate::server`'s serving threads each run one), and
/// a request handed to a connection of another thread's wakes that
/// thread twice per exchange. So a thread takes back only the
/// connections it opened: 1.42× the proxied requests per second of one
/// shared pool, measured
/// (docs/benchmarks/serving-threads-20261202T1930Z.md), for at most
/// [`IDLE_PER_ORIGIN`] idle connections per origin on each thread.
#[derive(Default)]
struct Pool {
    idle: Mutex<HashMap<ThreadId, IdleByOrigin>>,
}

/// One thread's idle connections, by origin.
type IdleByOrigin = HashMap<Box<str>, VecDeque<Idle>>;

struct Idle {
    sender: SendRequest<Body>,
    since: Instant,
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

impl Pool {
    /// Sends `request` to `origin` on an idle connection, else a new one
    /// (connected within `connect`): the connection it went on and the
    /// origin's answer. A pooled connection the origin closed before the
    /// request was written costs one more try, on a new connection.
    async fn exchange(
        &self,
        origin: &str,
        mut request: Request,
        connect: Duration,
    ) -> Result<(SendRequest<Body>, hyper::Response<Incoming>), Failure> {
        let mut pooled = true;
        loop {
            let idle = if pooled { self.take(origin) } else { None };
            let mut sender = match idle {
                Some(sender) => sender,
                None => {
                    pooled = false;
                    open(origin, connect).await?
                }
            };
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((sender, response)),
                Err(mut failed) => match failed.take_message() {
                    Some(unsent) if pooled => {
                        request = unsent;
                        pooled = false;
                    }
                    _ => return Err(failed.into_error().into()),
                },
            }
        }
    }

    /// The most recently used idle connection to `origin` this thread
    /// opened that is still open and ready; older and closed ones are
    /// dropped on the way.
    fn take(&self, origin: &str) -> Option<SendRequest<Body>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let waiting = idle
            .get_mut(&std::thread::current().id())?
            .get_mut(origin)?;
        while let Some(candidate) = waiting.pop_back() {
            if candidate.since.elapsed() < IDLE_TIMEOUT && candidate.sender.is_ready() {
                return Some(candidate.sender);
            }
        }
        None
    }

    /// Keeps `sender` for the next request to `origin`, once its
    /// connection is ready for one (at once when the answer's end was
    /// the connection's last work, else when it becomes ready).
    fn give_back(self: Arc<Self>, origin: Box<str>, mut sender: SendRequest<Body>) {
        if sender.is_ready() {
            self.keep(origin, sender);
            return;
        }
        if sender.is_closed() {
            return;
        }
        tokio::spawn(async move {
            if let Ok(Ok(())) = tokio::time::timeout(IDLE_TIMEOUT, sender.ready()).await {
                self.keep(origin, sender);
            }
        });
    }

    fn keep(&self, origin: Box<str>, sender: SendRequest<Body>) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let waiting = idle
            .entry(std::thread::current().id())
            .or_default()
            .entry(origin)
            .or_default();
        // The oldest are at the front: those past their time, and any
        // beyond the bound, go.
        while waiting
            .front()
            .is_some_and(|old| old.since.elapsed() >= IDLE_TIMEOUT || old.sender.is_closed())
            || waiting.len() >= IDLE_PER_ORIGIN
        {
            waiting.pop_front();
        }
        waiting.push_back(Idle {
            sender,
            since: Instant::now(),
        });
    }
}

/// A new connection to `origin`, its task spawned.
async fn open(origin: &str, connect: Duration) -> Result<SendRequest<Body>, Failure> {
    let stream = match tokio::time::timeout(connect, TcpStream::connect(origin)).await {
        Ok(stream) => stream?,
        Err(_) => return Err("connect timed out".into()),
    };
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "origin connection ended");
        }
    });
    Ok(sender)
}

/// The origin's answer body: gives its connection back to the pool once
/// read to its end.
struct GiveBack {
    body: Incoming,
    back: Option<(Arc<Pool>, SendRequest<Body>)>,
    origin: Box<str>,
}

impl GiveBack {
    fn give_back(&mut self) {
        if let Some((pool, sender)) = self.back.take() {
            pool.give_back(std::mem::take(&mut self.origin), sender);
        }
    }
}

impl HttpBody for GiveBack {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.give_back(),
            // A broken answer: its connection is not reused.
            Poll::Ready(Some(Err(_))) => self.back = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        // A bodiless answer (`HEAD`, `204`, `304`) is never polled.
        if self.body.is_end_stream() {
            self.give_back();
        }
    }
}

/// Who asked: the socket's peer (whether it is a trusted proxy), and the
/// client as `crate::http::client` reads it.
pub struct Asker {
    pub peer: IpAddr,
    pub peer_trusted: bool,
    pub client: ClientInfo,
}

fn origin_timeout(room: &RoomSpec) -> ApiError {
    tracing::warn!(room = %room.name, origin = %room.origin.authority, "origin timed out");
    metrics::counter!("waitroom_front_origin_errors_total", "error" => "timeout").increment(1);
    ApiError::Origin {
        timeout: true,
        message: "the site did not answer in time; please retry".into(),
    }
}

pub(super) fn origin_unreachable(room: &RoomSpec, error: &dyn std::fmt::Display) -> ApiError {
    tracing::warn!(room = %room.name, origin = %room.origin.authority, %error, "origin unreachable");
    metrics::counter!("waitroom_front_origin_errors_total", "error" => "unreachable").increment(1);
    ApiError::Origin {
        timeout: false,
        message: "the site could not be reached; please retry".into(),
    }
}

/// Every value of `name`, comma-joined (a client may split a list over
/// several lines).
fn joined(headers: &HeaderMap, name: &str) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

fn chain_with(existing: Option<String>, hop: &str) -> String {
    match existing {
        Some(chain) if !chain.trim().is_empty() => format!("{chain}, {hop}"),
        _ => hop.to_owned(),
    }
}

fn set(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), value);
    } else {
        headers.remove(name);
    }
}

/// RFC 7239's node: IPv6 quoted in brackets.
fn forwarded_node(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("\"[{v6}]\""),
    }
}

/// The hop-by-hop headers of RFC 9110 §7.6.1 and the ones `Connection`
/// names: they describe one connection, not the message.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_go() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("upgrade", HeaderValue::from_static("h2c"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn chains_extend_only_what_exists() {
        assert_eq!(chain_with(None, "1.2.3.4"), "1.2.3.4");
        assert_eq!(
            chain_with(Some("5.6.7.8".into()), "1.2.3.4"),
            "5.6.7.8, 1.2.3.4"
        );
        assert_eq!(forwarded_node("::1".parse().unwrap()), "\"[::1]\"");
    }
}
