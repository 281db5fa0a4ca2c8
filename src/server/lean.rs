//! The lean writer: serves an event-stream request straight on its socket
//! once [`super::handover`] has taken the connection from hyper.
//!
//! The request still runs through the application's router (routing,
//! percent-decoding, extractors, identity binding, limits, error JSON and
//! middleware are the hyper path's own); only the bytes around it differ.
//! A [`LeanStream`] in the request's extensions tells the events handler
//! to leave its session here instead of building a hyper body. The
//! router's answer is then written as produced, framed by the connection's
//! close: a stream as its head and the session's frames, anything else
//! with a `Content-Length`. Nothing of the request or the router outlives
//! that first answer: a stream keeps its socket and its session, no more.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Body;
use axum::http::{
    HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version, header,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tower::ServiceExt;

use super::handover::{MAX_HEAD, MAX_HEADERS};
use crate::http::{EVENTS_PATH, LeanStream};
use crate::push::StreamSession;

/// A client that takes longer than this to accept a frame is dropped:
/// its stream shows only the latest state, so it loses nothing it needs.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest non-stream answer written here (error JSON, a shed frame).
const MAX_PLAIN_BODY: usize = 64 * 1024;

/// The event-stream route below `base_path` (`--base-path`, validated to
/// need no escaping), matched by axum's own matcher on the raw path, as
/// the router matches it.
pub fn stream_route(base_path: &str) -> matchit::Router<()> {
    let mut route = matchit::Router::new();
    route
        .insert(format!("{base_path}{EVENTS_PATH}"), ())
        .expect("a valid route");
    route
}

/// `bytes` as a request for the lean writer: exactly one complete,
/// bodyless HTTP/1.1 `GET` head for the event-stream route `route`, which
/// hyper would accept as it is; `None` for anything else (hyper serves it).
pub fn stream_request(bytes: &[u8], route: &matchit::Router<()>) -> Option<Request<Body>> {
    if bytes.len() > MAX_HEAD || !may_be_stream(bytes) {
        return None;
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut head = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(len) = head.parse(bytes).ok()? else {
        return None;
    };
    if len != bytes.len() || head.method != Some("GET") || head.version != Some(1) {
        return None;
    }
    // hyper parses the target the same way (`Uri::from_maybe_shared`).
    let uri: Uri = head.path?.parse().ok()?;
    route.at(uri.path()).ok()?;
    let mut request = Request::new(Body::empty());
    *request.method_mut() = Method::GET;
    *request.version_mut() = Version::HTTP_11;
    *request.uri_mut() = uri;
    for h in head.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).ok()?;
        // A body, or a protocol switch: hyper's business.
        if name == header::CONTENT_LENGTH
            || name == header::TRANSFER_ENCODING
            || name == header::UPGRADE
        {
            return None;
        }
        request
            .headers_mut()
            .append(name, HeaderValue::from_bytes(h.value).ok()?);
    }
    Some(request)
}

/// A first look, before any parsing (every request at a message boundary
/// comes here): a `GET` whose target's path ends in `/events`, as the
/// stream route's does. Anything else cannot match the route.
fn may_be_stream(bytes: &[u8]) -> bool {
    let Some(target) = bytes.strip_prefix(b"GET ") else {
        return false;
    };
    let end = target
        .iter()
        .position(|&b| b == b' ' || b == b'?')
        .unwrap_or(target.len());
    target[..end].ends_with(b"/events")
}

/// Serves `request`, already read off `socket`, through `router`: writes
/// its answer and, for a stream, every frame until the stream ends. Boxed:
/// the caller's task keeps one pointer for it, whatever it holds.
pub fn serve(
    router: Router,
    socket: TcpStream,
    request: Request<Body>,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    // Boxed and finished before the stream starts, so neither the request
    // nor the routing's state stays in this task for the stream's life (an
    // async fn keeps room for its arguments until it returns).
    let respond = Box::pin(respond(router, request));
    Box::pin(answer(socket, respond))
}

type Respond = Pin<Box<dyn Future<Output = (Vec<u8>, Option<Box<StreamSession>>)> + Send>>;

/// Writes the router's answer, then the stream's frames. The session is
/// boxed: a local keeps its room in the future while the stream runs, and
/// the session passes through two of them here.
async fn answer(mut socket: TcpStream, respond: Respond) {
    let (head, session) = respond.await;
    let Some(mut session) = session else {
        let _ = tokio::time::timeout(WRITE_TIMEOUT, socket.write_all(&head)).await;
        let _ = socket.shutdown().await;
        return;
    };
    let _ = socket.set_nodelay(true);
    match tokio::time::timeout(WRITE_TIMEOUT, socket.write_all(&head)).await {
        Ok(Ok(())) => {}
        _ => return,
    }
    drop(head);
    let mut scratch = [0u8; 8];
    // One readiness wait for the stream's life, not one per frame: a pass
    // writes a frame to every stream at once, and each new wait takes (and
    // each dropped one retakes) the socket's waiter lock.
    {
        let closed = socket.readable();
        tokio::pin!(closed);
        loop {
            tokio::select! {
                frame = session.next_frame() => {
                    let Some(frame) = frame else { break };
                    if !write_frame(&socket, &frame).await {
                        break;
                    }
                }
                // The client sends nothing on a stream: readable means it
                // closed (or misbehaves); either way the stream is over.
                readable = &mut closed => {
                    if readable.is_err() {
                        break;
                    }
                    match socket.try_read(&mut scratch) {
                        Ok(0) => break,
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(_) => break,
                    }
                    closed.set(socket.readable());
                }
            }
        }
    }
    let _ = socket.shutdown().await;
}

/// Writes `frame` whole; `false` if the client is gone or took longer than
/// [`WRITE_TIMEOUT`]. A frame is a few hundred bytes and an idle stream's
/// send buffer is empty, so the first try almost always takes it all; the
/// wait for room, with its deadline, is boxed, so every idle stream's task
/// does not keep space for it beside its readiness wait.
async fn write_frame(socket: &TcpStream, frame: &[u8]) -> bool {
    let sent = match socket.try_write(frame) {
        Ok(n) if n == frame.len() => return true,
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
        Err(_) => return false,
    };
    Box::pin(write_rest(socket, &frame[sent..])).await
}

/// The rest of a frame the socket did not take at once.
async fn write_rest(socket: &TcpStream, mut rest: &[u8]) -> bool {
    let wait = async {
        while !rest.is_empty() {
            socket.writable().await?;
            match socket.try_write(rest) {
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok::<_, std::io::Error>(())
    };
    matches!(tokio::time::timeout(WRITE_TIMEOUT, wait).await, Ok(Ok(())))
}

/// Runs `request` through the router: the bytes to write first, and the
/// session when the answer is a stream.
async fn respond(
    router: Router,
    mut request: Request<Body>,
) -> (Vec<u8>, Option<Box<StreamSession>>) {
    let lean = LeanStream::default();
    request.extensions_mut().insert(lean.clone());
    let Ok(response) = router.oneshot(request).await;
    match lean.take() {
        Some(session) if response.status() == StatusCode::OK => {
            let (parts, _) = response.into_parts();
            (head_bytes(&parts, None), Some(Box::new(session)))
        }
        // Anything else is written whole (a stream session the answer
        // does not carry is dropped).
        _ => (plain_response(response).await, None),
    }
}

/// A whole answer, closing the connection: the router's head with a
/// `Content-Length`, then its body.
pub async fn plain_response(response: Response<Body>) -> Vec<u8> {
    let (parts, body) = response.into_parts();
    let body = tokio::time::timeout(WRITE_TIMEOUT, axum::body::to_bytes(body, MAX_PLAIN_BODY))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let bodiless = parts.status.is_informational()
        || parts.status == StatusCode::NO_CONTENT
        || parts.status == StatusCode::NOT_MODIFIED;
    let mut out = head_bytes(&parts, (!bodiless).then_some(body.len()));
    if !bodiless {
        out.extend_from_slice(&body);
    }
    out
}

/// The response head as hyper would write it (lower-case names, a `date`),
/// with this writer's own framing: `Content-Length` when given, and
/// `connection: close` always.
fn head_bytes(parts: &axum::http::response::Parts, content_length: Option<usize>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        if name == header::CONTENT_LENGTH
            || name == header::TRANSFER_ENCODING
            || name == header::CONNECTION
        {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !parts.headers.contains_key(header::DATE) {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(httpdate::fmt_http_date(SystemTime::now()).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(len) = content_length {
        out.extend_from_slice(format!("content-length: {len}\r\n").as_bytes());
    }
    out.extend_from_slice(b"connection: close\r\n\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_only_one_complete_bodyless_stream_get() {
        let route = stream_route("");
        let stream_request = |bytes: &[u8]| super::stream_request(bytes, &route);
        let ok = stream_request(
            b"GET /api/queues/def%61ult/events?ticket=abc HTTP/1.1\r\nHost: x\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n",
        )
        .unwrap();
        assert_eq!(ok.uri().path(), "/api/queues/def%61ult/events");
        assert_eq!(ok.uri().query(), Some("ticket=abc"));
        assert_eq!(
            ok.headers().get_all("cookie").iter().count(),
            2,
            "duplicates kept"
        );
        // The first look lets through every spelling the route takes.
        for taken in [
            &b"GET http://x/api/queues/default/events HTTP/1.1\r\n\r\n"[..],
            b"GET /api/queues/default/events?a=/b HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                stream_request(taken).is_some(),
                "{}",
                String::from_utf8_lossy(taken)
            );
        }
        for refused in [
            &b"GET /api/queues/default/events HTTP/1.1\r\nHost: x\r\n"[..],
            b"GET /api/queues/default/events HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n",
            b"POST /api/queues/default/events HTTP/1.1\r\n\r\n",
            b"GET /api/queues/default/events HTTP/1.0\r\n\r\n",
            b"GET /api/queues/default/events HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            b"GET /api/queues/default/events HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET /api/queues/default/position HTTP/1.1\r\n\r\n",
            b"GET /api/queues/a/b/events HTTP/1.1\r\n\r\n",
            b"GET /api/queues/default/events/ HTTP/1.1\r\n\r\n",
            b"garbage",
        ] {
            assert!(
                stream_request(refused).is_none(),
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
    }

    #[test]
    fn the_stream_route_follows_the_base_path() {
        let route = stream_route("/shop");
        assert!(
            stream_request(
                b"GET /shop/api/queues/default/events HTTP/1.1\r\n\r\n",
                &route
            )
            .is_some()
        );
        for refused in [
            &b"GET /api/queues/default/events HTTP/1.1\r\n\r\n"[..],
            b"GET /shopx/api/queues/default/events HTTP/1.1\r\n\r\n",
            b"GET /shop/shop/api/queues/default/events HTTP/1.1\r\n\r\n",
        ] {
            assert!(stream_request(refused, &route).is_none());
        }
    }

    /// Every idle stream holds its task: what the writer's future keeps
    /// beside the session is memory per stream (see `crate::server`).
    #[tokio::test]
    async fn a_stream_task_stays_small() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socket = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let task = serve(Router::new(), socket, Request::new(Body::empty()));
        let size = std::mem::size_of_val(&*task);
        // 504 bytes in a debug build at the time of writing. Keeping the
        // request (~240 bytes) or the session twice for the stream's life
        // would break this.
        assert!(size <= 640, "the stream's future holds {size} bytes");
    }

    /// A client that stops reading: the frame the socket cannot take at
    /// once is finished when the client reads again, byte for byte, and a
    /// client that leaves instead ends the write with `false`.
    #[tokio::test]
    async fn a_frame_larger_than_the_socket_takes_waits_for_the_reader() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        // Far more than loopback's send and receive buffers hold.
        let frame: Vec<u8> = (0..16 << 20).map(|i: u32| (i % 251) as u8).collect();
        let writer = {
            let frame = frame.clone();
            tokio::spawn(async move { write_frame(&server, &frame).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!writer.is_finished(), "the socket cannot have taken it all");
        let mut got = vec![0u8; frame.len()];
        let read = tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut got));
        read.await.expect("the whole frame arrives").unwrap();
        assert!(writer.await.unwrap(), "finished once the client read");
        assert!(got == frame, "every byte, in order");

        let (client, accepted) = tokio::join!(
            TcpStream::connect(listener.local_addr().unwrap()),
            listener.accept()
        );
        let (mut client, (server, _)) = (client.unwrap(), accepted.unwrap());
        let writer = {
            let frame = frame.clone();
            tokio::spawn(async move { write_frame(&server, &frame).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut some = [0u8; 1024];
        client.read_exact(&mut some).await.unwrap();
        drop(client);
        let ended = tokio::time::timeout(Duration::from_secs(10), writer).await;
        assert!(
            !ended.expect("the write ends").unwrap(),
            "the client left mid-frame"
        );
    }

    #[test]
    fn heads_carry_the_answer_and_close_framing() {
        let response = Response::builder()
            .status(401)
            .header("content-type", "application/json")
            .header("retry-after", "2")
            .body(())
            .unwrap();
        let (parts, ()) = response.into_parts();
        let head = String::from_utf8(head_bytes(&parts, Some(12))).unwrap();
        assert!(head.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{head}");
        assert!(head.contains("\r\ncontent-type: application/json\r\n"));
        assert!(head.contains("\r\nretry-after: 2\r\n"));
        assert!(head.contains("\r\ndate: "));
        assert!(head.ends_with("content-length: 12\r\nconnection: close\r\n\r\n"));
    }
}
