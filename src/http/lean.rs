//! The lean stream writer: event streams are served here, straight on the
//! socket, instead of through hyper (`handover.rs` takes them from hyper).
//!
//! Waiting is the long part of a waiting room: most open connections are
//! idle streams. Through hyper each one keeps a read and a write buffer of
//! 8 KiB; here a stream keeps its socket, its session and nothing else, so
//! one instance holds several times more waiting buyers in the same memory.

use std::time::Duration;

use axum::response::IntoResponse;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::error::ApiError;
use super::events::{Opening, STREAM_HEADERS, open_stream};
use super::extract::{Member, raw_ticket};
use crate::AppState;

/// A client that takes longer than this to accept a frame is dropped:
/// its stream shows only the latest state, so it loses nothing it needs.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// An event-stream request read off a socket.
pub struct StreamRequest {
    /// Length of the request head in bytes.
    pub head_len: usize,
    queue: String,
    ticket: Option<String>,
    user: Option<Vec<u8>>,
}

/// Parses `bytes` as a complete `GET /api/queues/{queue}/events` head;
/// `None` for anything else (which hyper serves).
pub fn parse_stream_request(bytes: &[u8]) -> Option<StreamRequest> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(head_len) = req.parse(bytes).ok()? else {
        return None;
    };
    if req.method? != "GET" {
        return None;
    }
    let (path, query) = match req.path?.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (req.path?, None),
    };
    let queue = path.strip_prefix("/api/queues/")?.strip_suffix("/events")?;
    if queue.contains('/') {
        return None;
    }
    if super::headers::repeated_identity_header(req.headers.iter().map(|h| h.name)).is_some() {
        return None; // hyper's router refuses it: 400 duplicate_header
    }
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
    };
    let ticket = raw_ticket(
        header("x-queue-ticket").and_then(|h| std::str::from_utf8(h.value).ok()),
        query,
        req.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("cookie"))
            .filter_map(|h| std::str::from_utf8(h.value).ok()),
    );
    Some(StreamRequest {
        head_len,
        queue: queue.to_owned(),
        ticket,
        user: header("x-user-id").map(|h| h.value.to_vec()),
    })
}

/// Serves `request`, already read off `stream`, until the stream ends.
pub async fn serve(state: &AppState, mut stream: TcpStream, request: StreamRequest) {
    let opening = match Member::authenticate(
        state,
        &request.queue,
        request.ticket,
        request.user.as_deref(),
    ) {
        Ok(member) => open_stream(state, &member).await,
        Err(e) => Err(e),
    };
    let mut session = match opening {
        Ok(Opening::Stream(session)) => session,
        Ok(Opening::NotEntered) => {
            let _ = stream
                .write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
                .await;
            return;
        }
        Ok(Opening::Shed(frame)) => {
            if stream.write_all(&stream_head()).await.is_ok() {
                let _ = stream.write_all(&frame).await;
            }
            return;
        }
        Err(e) => {
            let _ = stream.write_all(&error_response(e).await).await;
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    if stream.write_all(&stream_head()).await.is_err() {
        return;
    }
    let mut scratch = [0u8; 64];
    loop {
        tokio::select! {
            frame = session.next_frame() => {
                let Some(frame) = frame else { break };
                match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&frame)).await {
                    Ok(Ok(())) => {}
                    _ => break,
                }
            }
            // The client sends nothing on a stream: readable means it
            // closed (or misbehaves); either way the stream is over.
            readable = stream.readable() => {
                if readable.is_err() {
                    break;
                }
                match stream.try_read(&mut scratch) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => break,
                }
            }
        }
    }
    let _ = stream.shutdown().await;
}

/// A close-delimited event-stream response head: no chunked framing, so a
/// frame is written as it is.
fn stream_head() -> Vec<u8> {
    let mut head = b"HTTP/1.1 200 OK\r\nConnection: close\r\n".to_vec();
    for (name, value) in STREAM_HEADERS {
        head.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// An [`ApiError`]'s response, serialized by hand for the raw socket.
async fn error_response(error: ApiError) -> Vec<u8> {
    let response = error.into_response();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_complete_event_requests_only() {
        let ok = parse_stream_request(b"GET /api/queues/default/events?ticket=abc HTTP/1.1\r\nHost: x\r\nX-User-Id: u\r\n\r\n").unwrap();
        assert_eq!(ok.queue, "default");
        assert_eq!(ok.ticket.as_deref(), Some("abc"));
        assert_eq!(ok.user.as_deref(), Some(&b"u"[..]));
        let cookie = parse_stream_request(
            b"GET /api/queues/q/events HTTP/1.1\r\nCookie: a=1; waitroom_ticket=t.x\r\n\r\n",
        )
        .unwrap();
        assert_eq!(cookie.ticket.as_deref(), Some("t.x"));
        let header = parse_stream_request(
            b"GET /api/queues/q/events?ticket=q HTTP/1.1\r\nX-Queue-Ticket: h\r\n\r\n",
        )
        .unwrap();
        assert_eq!(header.ticket.as_deref(), Some("h"), "the header wins");
        assert!(
            parse_stream_request(b"GET /api/queues/default/events HTTP/1.1\r\nHost: x\r\n")
                .is_none(),
            "partial"
        );
        assert!(
            parse_stream_request(b"POST /api/queues/default/events HTTP/1.1\r\n\r\n").is_none()
        );
        assert!(
            parse_stream_request(b"GET /api/queues/default/position HTTP/1.1\r\n\r\n").is_none()
        );
        assert!(parse_stream_request(b"GET /api/queues/a/b/events HTTP/1.1\r\n\r\n").is_none());
        assert!(parse_stream_request(b"garbage").is_none());
    }
}
