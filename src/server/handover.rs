//! Taking a connection away from hyper at a true message boundary, so an
//! event stream can be served by the lean writer instead.
//!
//! Three observers must agree before a connection is handed over:
//!
//! - [`HandoverIo`], the socket hyper reads through, frames the request
//!   byte stream itself as the bytes pass ([`Framer`]: each head parsed with
//!   httparse, as hyper parses it; `Content-Length` bodies counted down).
//!   Anything it cannot frame exactly — `Transfer-Encoding`, a missing,
//!   repeated or malformed length, HTTP/1.0, upgrades, a head over
//!   [`MAX_HEAD`], a read that brings bytes past the end of a message
//!   (pipelining) — taints the connection: it is never handed over, and
//!   hyper serves everything on it, which is always correct.
//! - [`Tracked`], the service hyper calls, counts a request as in flight
//!   from the call until hyper has dropped its response body (which hyper
//!   does only after the body ended and its last bytes are in hyper's write
//!   buffer); a request body dropped before its end taints the connection
//!   (hyper may still hold or be reading its bytes).
//! - The IO notes any write not yet followed by a completed flush.
//!
//! A read is a handover candidate only if it starts with the framer
//! between messages, every head it has seen answered (`heads ==
//! finished`), nothing tainted and nothing unflushed; and it is handed over
//! only if the bytes it brings are exactly one complete bodyless `GET` head
//! for the event-stream route ([`super::lean::stream_request`]). Anything
//! else passes to hyper and through the framer. So a body that looks like a
//! stream request (after a `100 Continue`, say) is always read as the body
//! it is, and a stream head never lands while a response is being written.
//!
//! What this relies on in hyper 1.x (`proto/h1/conn.rs`, `dispatch.rs`):
//!
//! - hyper reads the socket in three situations: for a head (`Reading::Init`),
//!   for a body the service polls (`Reading::Body`/`Continue`; the `100
//!   Continue` is queued when the body is first polled), and while writing
//!   a response whose request is fully read (`poll_read_keep_alive` →
//!   `mid_message_detect_eof`: bytes read there are kept for the next head).
//!   Only the first can happen with every head answered, the framer between
//!   messages and no body pending; the other two always have a request in
//!   flight or a body unread.
//! - hyper calls the service once per head it parsed; a head it refuses (a
//!   parse error) gets an automatic answer and the connection closes, so
//!   `heads` can only run ahead of `finished`, which blocks handover.
//! - A read returning end-of-file while idle makes hyper close cleanly
//!   without writing anything; its shutdown flushes whatever it still
//!   buffers first (`Buffered::poll_shutdown`). So after the handover the
//!   IO keeps passing writes to the socket (only the tail of an earlier,
//!   already finished response can come), turns the shutdown into a no-op,
//!   and gives the socket to the connection task when hyper drops it: the
//!   lean writer's first byte follows hyper's last one.
//! - hyper's own read buffer is empty at that read: pipelined bytes taint
//!   the connection, and a body hyper had buffered but nobody read taints it
//!   too.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response};
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tower::ServiceExt;

use super::admit::Knock;
use super::lean::stream_request;
use axum::response::IntoResponse;

/// Largest request head accepted, on either path (`431` beyond, from
/// hyper). Heads here are a request line, a cookie and a few headers.
pub const MAX_HEAD: usize = 16 * 1024;

/// Most headers in a head: hyper's default, so both parse alike.
pub const MAX_HEADERS: usize = 100;

/// What the connection task, its IO and its service share.
#[derive(Default)]
pub struct Shared {
    /// Responses hyper is done with (their bodies dropped).
    finished: AtomicU64,
    /// Exact framing was lost: never hand this connection over.
    tainted: AtomicBool,
    /// The socket and its stream request, once hyper has let go of them.
    handed: Mutex<Option<HandedOver>>,
}

impl Shared {
    /// The socket taken from hyper, if the connection was handed over.
    pub fn take_handed_over(&self) -> Option<HandedOver> {
        self.handed.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn taint(&self) {
        self.tainted.store(true, Ordering::Relaxed);
    }
}

/// A socket taken from hyper with the stream request read off it.
pub struct HandedOver {
    pub socket: TcpStream,
    pub request: Request<Body>,
}

/// How long a new connection may stay silent, how long a connection may
/// stay idle, and how long a request head may take once its first byte is
/// in.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// From the connection's start to its first byte: the connection
    /// closes cleanly after this (a socket that never speaks must not hold
    /// a connection for the idle timeout).
    pub first_byte: Duration,
    /// Between requests (every earlier one answered), before the next
    /// head's first byte: the connection closes cleanly after this.
    pub idle: Duration,
    /// From a head's first byte to its last: the connection is dropped
    /// after this (a client trickling a head holds a connection for free).
    pub head: Duration,
}

/// The IO hyper serves a connection through.
pub struct HandoverIo {
    socket: Option<TcpStream>,
    /// The event-stream route a handed-over request must be for.
    route: Arc<matchit::Router<()>>,
    timeouts: Timeouts,
    /// Armed while the connection waits idle, or while a head is partial.
    deadline: Option<(Waiting, Pin<Box<Sleep>>)>,
    shared: Arc<Shared>,
    framer: Framer,
    /// Request heads the framer has seen complete.
    heads: u64,
    /// A byte has come from the client.
    spoke: bool,
    /// Bytes were written since the last completed flush.
    unflushed: bool,
    /// The stream request taken off the socket: from then on hyper reads
    /// end-of-file, and the socket goes to `shared` when hyper drops this.
    taken: Option<Request<Body>>,
}

/// What [`HandoverIo`]'s deadline is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiting {
    /// Not a byte yet since the connection opened.
    FirstByte,
    Idle,
    Head,
}

impl HandoverIo {
    pub fn new(
        socket: TcpStream,
        shared: Arc<Shared>,
        route: Arc<matchit::Router<()>>,
        timeouts: Timeouts,
    ) -> Self {
        Self {
            socket: Some(socket),
            route,
            timeouts,
            deadline: None,
            shared,
            framer: Framer::default(),
            heads: 0,
            spoke: false,
            unflushed: false,
            taken: None,
        }
    }

    /// What a read now waits for: the first byte, idle (every head
    /// answered, none begun), the rest of a head, or neither (a body, a
    /// response being written, or framing lost: then hyper's own header
    /// timeout is the bound).
    fn waiting(&self) -> Option<Waiting> {
        if self.shared.tainted.load(Ordering::Relaxed) {
            return None;
        }
        match &self.framer {
            _ if !self.spoke => Some(Waiting::FirstByte),
            Framer::Head(partial) if !partial.is_empty() => Some(Waiting::Head),
            Framer::Head(_) if self.heads == self.shared.finished.load(Ordering::Relaxed) => {
                Some(Waiting::Idle)
            }
            _ => None,
        }
    }

    /// Arms, keeps or disarms the deadline for what a read now waits for;
    /// `Some` when it has passed.
    fn deadline_passed(&mut self, cx: &mut Context<'_>) -> Option<Waiting> {
        let waiting = self.waiting();
        match (&mut self.deadline, waiting) {
            (_, None) => self.deadline = None,
            (Some((armed, _)), Some(w)) if *armed == w => {}
            (_, Some(w)) => {
                let after = match w {
                    Waiting::FirstByte => self.timeouts.first_byte,
                    Waiting::Idle => self.timeouts.idle,
                    Waiting::Head => self.timeouts.head,
                };
                self.deadline = Some((w, Box::pin(tokio::time::sleep(after))));
            }
        }
        let (armed, sleep) = self.deadline.as_mut()?;
        sleep.as_mut().poll(cx).is_ready().then_some(*armed)
    }

    /// Whether the next read may be handed over (see the module doc).
    fn at_boundary(&self) -> bool {
        self.framer.between_messages()
            && !self.unflushed
            && !self.shared.tainted.load(Ordering::Relaxed)
            && self.heads == self.shared.finished.load(Ordering::Relaxed)
    }
}

impl Drop for HandoverIo {
    fn drop(&mut self) {
        if let (Some(request), Some(socket)) = (self.taken.take(), self.socket.take()) {
            *self.shared.handed.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(HandedOver { socket, request });
        }
    }
}

impl AsyncRead for HandoverIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.taken.is_some() {
            return Poll::Ready(Ok(())); // handed over: end-of-file for hyper
        }
        let candidate = this.at_boundary();
        match this.deadline_passed(cx) {
            // hyper closes an idle connection that reads end-of-file
            // quietly, as if the client had closed it.
            Some(Waiting::FirstByte | Waiting::Idle) => return Poll::Ready(Ok(())),
            Some(Waiting::Head) => {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the request head did not arrive in time",
                )));
            }
            None => {}
        }
        let Some(socket) = this.socket.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let before = buf.filled().len();
        std::task::ready!(Pin::new(socket).poll_read(cx, buf))?;
        let fresh = &buf.filled()[before..];
        if fresh.is_empty() {
            return Poll::Ready(Ok(())); // the peer's end-of-file
        }
        // Bytes came: the idle wait is over (a head's deadline runs on).
        this.spoke = true;
        if matches!(this.deadline, Some((Waiting::Idle | Waiting::FirstByte, _))) {
            this.deadline = None;
        }
        if candidate && let Some(request) = stream_request(fresh, &this.route) {
            buf.set_filled(before);
            this.taken = Some(request);
            return Poll::Ready(Ok(()));
        }
        this.heads += this.framer.feed(fresh);
        if this.framer.is_tainted() {
            this.shared.taint();
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for HandoverIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let Some(socket) = this.socket.as_mut() else {
            return Poll::Ready(Err(io::ErrorKind::NotConnected.into()));
        };
        let written = Pin::new(socket).poll_write(cx, data);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.unflushed = true;
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let Some(socket) = this.socket.as_mut() else {
            return Poll::Ready(Err(io::ErrorKind::NotConnected.into()));
        };
        let written = Pin::new(socket).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.unflushed = true;
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.socket.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some(socket) = this.socket.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let flushed = Pin::new(socket).poll_flush(cx);
        if matches!(flushed, Poll::Ready(Ok(()))) {
            this.unflushed = false;
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.socket.as_mut() {
            // The socket lives on in the lean writer: nothing to shut down.
            _ if this.taken.is_some() => Poll::Ready(Ok(())),
            Some(socket) => Pin::new(socket).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

/// Follows a request byte stream exactly as hyper frames it, or gives up.
#[derive(Debug)]
enum Framer {
    /// Between messages (empty) or inside a head (its bytes so far).
    Head(Vec<u8>),
    /// Inside a `Content-Length` body: the bytes still to come.
    Body(u64),
    /// Exact framing was lost.
    Tainted,
}

impl Default for Framer {
    fn default() -> Self {
        Self::Head(Vec::new())
    }
}

/// What one head says about the message it starts.
enum HeadParse {
    /// More bytes are needed.
    Partial,
    /// A complete head of `len` bytes followed by a body of `body` bytes.
    Complete { len: usize, body: u64 },
    /// Not something this framer follows exactly.
    Unframable,
}

impl Framer {
    fn between_messages(&self) -> bool {
        matches!(self, Self::Head(partial) if partial.is_empty())
    }

    fn is_tainted(&self) -> bool {
        matches!(self, Self::Tainted)
    }

    /// Follows `bytes`, the next bytes hyper reads; returns how many request
    /// heads they completed.
    fn feed(&mut self, mut bytes: &[u8]) -> u64 {
        let mut heads = 0;
        // A message ended inside these bytes: anything after it is a
        // pipelined request.
        let mut ended = false;
        while !bytes.is_empty() {
            match self {
                Self::Tainted => break,
                Self::Body(left) => {
                    let take = usize::try_from(*left).map_or(bytes.len(), |l| l.min(bytes.len()));
                    *left -= take as u64;
                    bytes = &bytes[take..];
                    if *left == 0 {
                        *self = Self::default();
                        ended = true;
                    }
                }
                Self::Head(_) if ended => *self = Self::Tainted,
                Self::Head(partial) => {
                    let before = partial.len();
                    let parsed = if before == 0 {
                        parse_head(bytes)
                    } else {
                        partial.extend_from_slice(bytes);
                        parse_head(partial)
                    };
                    match parsed {
                        HeadParse::Partial => {
                            if before == 0 {
                                partial.extend_from_slice(bytes);
                            }
                            if partial.len() > MAX_HEAD {
                                *self = Self::Tainted;
                            }
                            bytes = &[];
                        }
                        HeadParse::Complete { len, body } => {
                            heads += 1;
                            bytes = &bytes[len - before..];
                            if body == 0 {
                                *self = Self::default();
                                ended = true;
                            } else {
                                *self = Self::Body(body);
                            }
                        }
                        HeadParse::Unframable => *self = Self::Tainted,
                    }
                }
            }
        }
        heads
    }
}

/// Parses `bytes` as the start of a request head the way hyper does, and
/// reads its body length; only plain `Content-Length` framing is followed.
fn parse_head(bytes: &[u8]) -> HeadParse {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut head = httparse::Request::new(&mut headers);
    let len = match head.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return HeadParse::Partial,
        Err(_) => return HeadParse::Unframable,
    };
    if len > MAX_HEAD || head.version != Some(1) || head.method == Some("CONNECT") {
        return HeadParse::Unframable;
    }
    let mut body = None;
    for header in head.headers.iter() {
        let name = header.name;
        if name.eq_ignore_ascii_case("transfer-encoding") || name.eq_ignore_ascii_case("upgrade") {
            return HeadParse::Unframable;
        }
        if name.eq_ignore_ascii_case("content-length") {
            let value = header.value;
            let digits =
                !value.is_empty() && value.len() <= 18 && value.iter().all(u8::is_ascii_digit);
            if body.is_some() || !digits {
                return HeadParse::Unframable;
            }
            body = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.parse::<u64>().ok());
            if body.is_none() {
                return HeadParse::Unframable;
            }
        }
    }
    HeadParse::Complete {
        len,
        body: body.unwrap_or(0),
    }
}

/// The application as hyper calls it on one connection: counts responses
/// and watches request bodies for [`HandoverIo`], and on a connection over
/// the operator listener's cap serves only what the reserve admits.
#[derive(Clone)]
pub struct Tracked<S> {
    app: S,
    shared: Arc<Shared>,
    /// The connection's peer, put in every request (`ConnectInfo`).
    peer: std::net::SocketAddr,
    /// Over the cap: the way into the operator reserve.
    knock: Option<Arc<Knock>>,
}

impl<S> Tracked<S> {
    pub fn new(app: S, shared: Arc<Shared>, peer: std::net::SocketAddr) -> Self {
        Self {
            app,
            shared,
            peer,
            knock: None,
        }
    }

    /// On a connection over the cap, serves a request only if `knock`
    /// admits it; any other is answered `503 server_busy` and the
    /// connection closed.
    pub fn knocking(mut self, knock: Option<Arc<Knock>>) -> Self {
        self.knock = knock;
        self
    }
}

impl<S> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: tower::Service<Request<Watched>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Counted<Body>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let shared = self.shared.clone();
        if let Some(knock) = &self.knock
            && !knock.admits(request.headers())
        {
            // Its body is left unread: the connection closes after this.
            let mut busy = crate::http::ApiError::ServerBusy.into_response();
            crate::http::security::apply(busy.headers_mut(), true);
            busy.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
            let response = busy.map(|body| Counted { body, shared });
            return Box::pin(std::future::ready(Ok(response)));
        }
        let mut request = request.map(|body| Watched {
            body,
            ended: false,
            shared: shared.clone(),
        });
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(self.peer));
        let app = self.app.clone();
        Box::pin(async move {
            let response = app.oneshot(request).await?;
            Ok(response.map(|body| Counted { body, shared }))
        })
    }
}

/// A request body that taints its connection if dropped before its end.
pub struct Watched {
    body: Incoming,
    ended: bool,
    shared: Arc<Shared>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.ended = true;
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

impl Drop for Watched {
    fn drop(&mut self) {
        if !self.ended && !self.body.is_end_stream() {
            self.shared.taint();
        }
    }
}

/// A response body that marks its request finished when hyper drops it.
pub struct Counted<B> {
    body: B,
    shared: Arc<Shared>,
}

impl<B: HttpBody<Data = Bytes> + Unpin> HttpBody for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B> Drop for Counted<B> {
    fn drop(&mut self) {
        self.shared.finished.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(chunks: &[&[u8]]) -> (Framer, u64) {
        let mut framer = Framer::default();
        let heads = chunks.iter().map(|c| framer.feed(c)).sum();
        (framer, heads)
    }

    #[test]
    fn follows_heads_and_length_bodies_across_reads() {
        let (f, heads) = fed(&[b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"]);
        assert!(f.between_messages());
        assert_eq!(heads, 1);
        let (f, heads) = fed(&[
            b"POST /a HTTP/1.1\r\nContent-",
            b"Length: 5\r\n\r\nab",
            b"cde",
        ]);
        assert!(f.between_messages(), "{f:?}");
        assert_eq!(heads, 1);
        let (f, _) = fed(&[b"POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nab"]);
        assert!(matches!(f, Framer::Body(3)), "{f:?}");
        let (f, _) = fed(&[b"GET /a HTTP/1.1\r\n"]);
        assert!(!f.between_messages() && !f.is_tainted());
    }

    #[test]
    fn a_body_that_looks_like_a_head_is_counted_as_body() {
        let body = b"GET /api/queues/default/events HTTP/1.1\r\nX-Queue-Ticket: t\r\n\r\n";
        let head = format!(
            "POST /api/queues/default/entries HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let (f, heads) = fed(&[head.as_bytes(), body]);
        assert!(f.between_messages());
        assert_eq!(heads, 1, "the body is not a head");
    }

    #[test]
    fn taints_what_it_cannot_frame_exactly() {
        for bytes in [
            &b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST /a HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab",
            b"POST /a HTTP/1.1\r\nContent-Length: +2\r\n\r\nab",
            b"POST /a HTTP/1.1\r\nContent-Length: 1,1\r\n\r\na",
            b"GET /a HTTP/1.0\r\n\r\n",
            b"GET /a HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
            b"CONNECT a:1 HTTP/1.1\r\n\r\n",
            b"\x16\x03\x01garbage",
            // Pipelined: a second head in the same read as the first's end.
            b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n",
            b"POST /a HTTP/1.1\r\nContent-Length: 1\r\n\r\naGET /b HTTP/1.1\r\n\r\n",
        ] {
            let (f, _) = fed(&[bytes]);
            assert!(f.is_tainted(), "{:?}", String::from_utf8_lossy(bytes));
        }
        let big = format!("GET /a HTTP/1.1\r\nX: {}\r\n", "a".repeat(MAX_HEAD));
        assert!(fed(&[big.as_bytes()]).0.is_tainted(), "an over-long head");
    }
}
