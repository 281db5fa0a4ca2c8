//! The transport on raw sockets: when a connection may be handed from
//! hyper to the lean stream writer (only at a true message boundary), what
//! both paths answer, and the HTTP limits (head size, body timeout,
//! connection cap, JSON errors for unknown routes and methods).
//!
//! Every byte the server sends is parsed strictly as a sequence of HTTP/1.1
//! responses (status line, headers, then a chunked, `Content-Length` or
//! close-delimited body), so a response written into another one's body
//! is caught.

use std::net::SocketAddr;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::common::{IDLE, TestApp, eventually, ready};

/// One response as read off the wire.
#[derive(Debug, Clone)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    /// The body, de-chunked.
    body: Vec<u8>,
    /// Whether the body ended (a stream's has not).
    complete: bool,
    chunked: bool,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn is_stream(&self) -> bool {
        self.header("content-type")
            .is_some_and(|t| t.starts_with("text/event-stream"))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn find(bytes: &[u8], needle: &[u8]) -> Option<usize> {
    bytes.windows(needle.len()).position(|w| w == needle)
}

/// Parses `bytes` strictly as consecutive responses. `closed`: the server
/// closed the connection after them, so a body cut short is an error.
/// The last response may be incomplete while the connection is open.
fn parse_responses(bytes: &[u8], closed: bool) -> Result<Vec<Resp>, String> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let rest = &bytes[pos..];
        let Some(end) = find(rest, b"\r\n\r\n") else {
            let prefix = &rest[..rest.len().min(9)];
            if closed || rest.len() > 64 * 1024 || !b"HTTP/1.1 ".starts_with(prefix) {
                return Err(format!(
                    "not a response head at byte {pos}: {:?}",
                    String::from_utf8_lossy(rest)
                ));
            }
            break; // a head still arriving
        };
        let head = std::str::from_utf8(&rest[..end]).map_err(|_| "a head that is not text")?;
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = status_line
            .strip_prefix("HTTP/1.1 ")
            .and_then(|s| s.get(..3))
            .filter(|code| code.bytes().all(|b| b.is_ascii_digit()))
            .filter(|_| status_line.as_bytes().get(12) == Some(&b' '))
            .and_then(|code| code.parse::<u16>().ok())
            .ok_or_else(|| format!("bad status line at byte {pos}: {status_line:?}"))?;
        let mut headers = Vec::new();
        for line in lines {
            let (name, value) = line
                .split_once(':')
                .filter(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_graphic()))
                .ok_or_else(|| format!("bad header line {line:?}"))?;
            headers.push((name.to_owned(), value.trim().to_owned()));
        }
        let mut resp = Resp {
            status,
            headers,
            body: Vec::new(),
            complete: false,
            chunked: false,
        };
        let mut at = end + 4;
        let body = &rest[at..];
        if (100..200).contains(&status) || status == 204 || status == 304 {
            resp.complete = true;
        } else if resp
            .header("transfer-encoding")
            .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
        {
            resp.chunked = true;
            if resp.header("content-length").is_some() {
                return Err("both chunked and a length".into());
            }
            let mut cur = 0;
            loop {
                let Some(line_end) = find(&body[cur..], b"\r\n") else {
                    if closed || body.len() - cur > 32 {
                        return Err(format!(
                            "bad chunk size line: {:?}",
                            String::from_utf8_lossy(&body[cur..])
                        ));
                    }
                    break;
                };
                let size_text = std::str::from_utf8(&body[cur..cur + line_end]).unwrap_or("?");
                let size = usize::from_str_radix(size_text, 16)
                    .ok()
                    .filter(|_| {
                        !size_text.is_empty() && size_text.bytes().all(|b| b.is_ascii_hexdigit())
                    })
                    .ok_or_else(|| format!("bad chunk size {size_text:?} inside a chunked body"))?;
                let data = cur + line_end + 2;
                if size == 0 {
                    if body.len() < data + 2 {
                        if closed {
                            return Err("chunked body cut short".into());
                        }
                        break;
                    }
                    if &body[data..data + 2] != b"\r\n" {
                        return Err("trailers or garbage after the last chunk".into());
                    }
                    resp.complete = true;
                    cur = data + 2;
                    break;
                }
                if body.len() < data + size + 2 {
                    if closed {
                        return Err("chunk cut short".into());
                    }
                    break;
                }
                if &body[data + size..data + size + 2] != b"\r\n" {
                    return Err("a chunk not followed by CRLF".into());
                }
                resp.body.extend_from_slice(&body[data..data + size]);
                cur = data + size + 2;
            }
            at += cur;
        } else if let Some(len) = resp.header("content-length") {
            let len: usize = len.parse().map_err(|_| format!("bad length {len:?}"))?;
            if body.len() >= len {
                resp.body = body[..len].to_vec();
                resp.complete = true;
                at += len;
            } else {
                if closed {
                    return Err("body shorter than its length".into());
                }
                resp.body = body.to_vec();
                at += body.len();
            }
        } else {
            // Close-delimited: everything to the end is this body.
            resp.body = body.to_vec();
            resp.complete = closed;
            at += body.len();
        }
        let complete = resp.complete;
        out.push(resp);
        pos += at;
        if !complete {
            if pos < bytes.len() {
                return Err("bytes after an unfinished response".into());
            }
            break;
        }
    }
    Ok(out)
}

/// A raw client connection and everything it received.
struct Raw {
    socket: TcpStream,
    got: Vec<u8>,
    /// The server closed (or reset) the connection.
    closed: bool,
    reset: bool,
}

impl Raw {
    async fn connect(addr: SocketAddr) -> Self {
        let socket = TcpStream::connect(addr).await.unwrap();
        socket.set_nodelay(true).unwrap();
        Self {
            socket,
            got: Vec::new(),
            closed: false,
            reset: false,
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        if self.socket.write_all(bytes).await.is_err() {
            self.closed = true;
        }
    }

    /// The responses so far, strictly parsed. After a reset the last
    /// answer may be cut short; what came whole before it must still be
    /// well formed.
    fn responses(&self) -> Result<Vec<Resp>, String> {
        parse_responses(&self.got, self.closed && !self.reset)
    }

    /// Reads until `done` holds for the responses so far, the server
    /// closes, or `limit` passes; a malformed byte stream is an error.
    async fn read_until(
        &mut self,
        limit: Duration,
        done: impl Fn(&[Resp]) -> bool,
    ) -> Result<Vec<Resp>, String> {
        let deadline = Instant::now() + limit;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let so_far = self.responses()?;
            if self.closed || done(&so_far) {
                return Ok(so_far);
            }
            match tokio::time::timeout_at(deadline, self.socket.read(&mut buf)).await {
                Err(_) => return Ok(so_far),
                Ok(Ok(0)) => self.closed = true,
                Ok(Ok(n)) => self.got.extend_from_slice(&buf[..n]),
                Ok(Err(_)) => {
                    self.closed = true;
                    self.reset = true;
                }
            }
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.got).into_owned()
    }
}

/// Final (non-1xx) responses.
fn finals(resps: &[Resp]) -> Vec<&Resp> {
    resps.iter().filter(|r| r.status >= 200).collect()
}

/// Joins `user` on a connection of its own that closes after the answer
/// (so no pooled connection stays open beside a test's own).
async fn join(addr: SocketAddr, user: &str) -> serde_json::Value {
    let mut raw = Raw::connect(addr).await;
    raw.send(
        format!(
            "POST /api/queues/default/entries HTTP/1.1\r\nHost: x\r\nX-User-Id: {user}\r\n\
             Connection: close\r\nContent-Length: 0\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    let got = raw.read_until(5 * SECS, |_| false).await.unwrap();
    assert_eq!(got.first().map(|r| r.status), Some(201), "{}", raw.text());
    serde_json::from_slice(&got[0].body).unwrap()
}

/// An instance with a READY victim (holding an entry token) and a WAITING
/// attacker, both joined through the gateway's `X-User-Id`.
struct World {
    app: TestApp,
    victim_ticket: String,
    victim_token: String,
    attacker_ticket: String,
}

impl World {
    async fn new(extra: &[&str]) -> Self {
        let mut args = IDLE.to_vec();
        args.extend_from_slice(extra);
        let app = TestApp::memory(&args).await;
        let victim = join(app.addr, "victim").await;
        assert_eq!(victim["status"], "READY", "{victim}");
        let attacker = join(app.addr, "attacker").await;
        assert_eq!(attacker["status"], "WAITING", "{attacker}");
        Self {
            victim_ticket: victim["ticket"].as_str().unwrap().to_owned(),
            victim_token: victim["entryToken"].as_str().unwrap().to_owned(),
            attacker_ticket: attacker["ticket"].as_str().unwrap().to_owned(),
            app,
        }
    }

    /// A complete stream head carrying the victim's ticket and no user:
    /// what a smuggler sends as a body.
    fn victim_head(&self) -> String {
        format!(
            "GET /api/queues/default/events HTTP/1.1\r\nHost: x\r\nX-Queue-Ticket: {}\r\n\r\n",
            self.victim_ticket
        )
    }

    /// The attacker's own stream head (optionally at another path).
    fn own_stream(&self, path: &str) -> String {
        format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nX-User-Id: attacker\r\nX-Queue-Ticket: {}\r\n\r\n",
            self.attacker_ticket
        )
    }

    fn assert_no_victim_token(&self, raw: &Raw) {
        assert!(
            !raw.text().contains(&self.victim_token),
            "the victim's entry token reached the attacker: {}",
            raw.text()
        );
    }
}

const SECS: Duration = Duration::from_secs(1);

/// Issue 9, item 1: `Expect: 100-continue`, then a stream head as the body.
/// The body is read as a body; the victim's stream is never served.
#[tokio::test]
async fn a_stream_head_sent_as_a_body_after_100_continue_is_a_body() {
    let w = World::new(&[]).await;
    let body = w.victim_head();
    let mut raw = Raw::connect(w.app.addr).await;
    raw.send(
        format!(
            "POST /api/queues/default/entries HTTP/1.1\r\nHost: x\r\nX-User-Id: attacker\r\n\
             Expect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    let got = raw
        .read_until(5 * SECS, |r| r.iter().any(|r| r.status == 100))
        .await
        .unwrap();
    assert_eq!(got.first().map(|r| r.status), Some(100), "{}", raw.text());
    raw.send(body.as_bytes()).await;
    let got = raw
        .read_until(5 * SECS, |r| finals(r).first().is_some_and(|r| r.complete))
        .await
        .unwrap();
    let answer = finals(&got)[0].clone();
    assert_eq!(answer.status, 400, "answered as a POST: {}", raw.text());
    assert!(answer.text().contains("invalid_body"), "{}", answer.text());
    // Nothing else comes: the connection stays the POST's.
    let got = raw.read_until(SECS, |r| finals(r).len() > 1).await.unwrap();
    assert_eq!(finals(&got).len(), 1, "{}", raw.text());
    assert!(got.iter().all(|r| !r.is_stream()), "{}", raw.text());
    w.assert_no_victim_token(&raw);
    w.app.stop().await;
}

/// Issue 9, item 1: a stream head arriving while hyper streams a chunked
/// response is never answered inside that response's body: neither after
/// a pipelined stream request (the case) nor after one whose head
/// came in two writes (a request in flight, on a connection not tainted).
#[tokio::test]
async fn a_stream_head_during_a_chunked_stream_is_not_written_into_it() {
    let w = World::new(&["--keep-alive-secs", "1"]).await;
    let stream = w.own_stream("/api/queues/default/events");
    let health = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let streaming = |r: &[Resp]| r.len() == 2 && r[1].text().contains("event: waiting");

    let mut raw = Raw::connect(w.app.addr).await;
    raw.send(format!("{health}{stream}").as_bytes()).await;
    raw.read_until(5 * SECS, streaming).await.unwrap();
    check_nothing_lands_inside(&w, raw, &stream).await;

    // The stream head in two writes after an answered request; the reads
    // may coalesce on a busy machine, so widen the gap until they do not.
    let (cut, mut gap) = (stream.len() / 2, Duration::from_millis(50));
    loop {
        let mut raw = Raw::connect(w.app.addr).await;
        raw.send(health.as_bytes()).await;
        raw.read_until(5 * SECS, |r| r.first().is_some_and(|r| r.complete))
            .await
            .unwrap();
        raw.send(&stream.as_bytes()[..cut]).await;
        tokio::time::sleep(gap).await;
        raw.send(&stream.as_bytes()[cut..]).await;
        let got = raw.read_until(5 * SECS, streaming).await.unwrap();
        if got[1].chunked {
            check_nothing_lands_inside(&w, raw, &stream).await;
            break;
        }
        assert!(gap < Duration::from_secs(3), "never served through hyper");
        gap *= 2;
    }
    w.app.stop().await;
}

/// On `raw`, whose second answer is a chunked stream: sends another stream
/// head and checks that the stream goes on well formed, with no answer
/// written into it.
async fn check_nothing_lands_inside(w: &World, mut raw: Raw, head: &str) {
    let got = raw.responses().unwrap();
    assert!(got.len() == 2 && got[1].chunked, "{}", raw.text());
    let seen = got[1].text().matches(": keep-alive").count();
    raw.send(head.as_bytes()).await;
    // Keep-alive comments keep the chunked body going meanwhile.
    let got = raw
        .read_until(5 * SECS, |r| {
            r.len() > 2
                || r.get(1)
                    .is_some_and(|s| s.text().matches(": keep-alive").count() >= seen + 2)
        })
        .await;
    let got = got.unwrap_or_else(|e| panic!("{e}: {}", raw.text()));
    assert_eq!(got.len(), 2, "{}", raw.text());
    assert!(got[1].is_stream() && !got[1].complete, "{}", raw.text());
    w.assert_no_victim_token(&raw);
}

/// Issue 9, item 1: the lean path routes exactly like the router (here a
/// percent-encoded queue name), and a head that arrives in pieces is
/// served through hyper with the same answer.
#[tokio::test]
async fn both_paths_answer_a_stream_request_alike() {
    let w = World::new(&[]).await;
    let head = w.own_stream("/api/queues/def%61ult/events");
    let until_waiting = |r: &[Resp]| {
        r.first()
            .is_some_and(|s| s.text().contains("event: waiting"))
    };

    // One write on a fresh connection: the lean writer.
    let mut raw = Raw::connect(w.app.addr).await;
    raw.send(head.as_bytes()).await;
    let lean = raw.read_until(5 * SECS, until_waiting).await.unwrap();
    let lean = lean
        .first()
        .unwrap_or_else(|| panic!("{}", raw.text()))
        .clone();
    assert_eq!(lean.status, 200, "{}", raw.text());
    assert!(!lean.chunked, "{}", raw.text());
    assert_eq!(lean.header("connection"), Some("close"));
    assert!(lean.text().starts_with("retry: "), "{}", lean.text());
    assert!(lean.text().contains("event: waiting"));
    drop(raw);

    // After a request on the same connection, at the boundary: still lean.
    let mut raw = Raw::connect(w.app.addr).await;
    raw.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    raw.read_until(5 * SECS, |r| r.first().is_some_and(|r| r.complete))
        .await
        .unwrap();
    raw.send(head.as_bytes()).await;
    let got = raw
        .read_until(5 * SECS, |r| {
            r.get(1)
                .is_some_and(|s| s.text().contains("event: waiting"))
        })
        .await
        .unwrap();
    assert!(got.len() == 2 && !got[1].chunked, "{}", raw.text());
    drop(raw);

    // In two writes: hyper. The reads may still coalesce on a busy
    // machine, so wait longer between the writes until one does not.
    let (cut, mut gap) = (head.len() / 2, Duration::from_millis(50));
    let via_hyper = loop {
        let mut raw = Raw::connect(w.app.addr).await;
        raw.send(&head.as_bytes()[..cut]).await;
        tokio::time::sleep(gap).await;
        raw.send(&head.as_bytes()[cut..]).await;
        let got = raw.read_until(5 * SECS, until_waiting).await.unwrap();
        let answer = got
            .first()
            .unwrap_or_else(|| panic!("{}", raw.text()))
            .clone();
        assert_eq!(answer.status, 200, "{}", raw.text());
        assert!(answer.text().contains("event: waiting"), "{}", raw.text());
        if answer.chunked {
            break answer;
        }
        assert!(gap < Duration::from_secs(3), "never served through hyper");
        gap *= 2;
    };
    assert!(
        via_hyper.text().starts_with("retry: "),
        "{}",
        via_hyper.text()
    );
    assert_eq!(via_hyper.header("connection"), None, "hyper keeps it alive");
    for name in ["content-type", "cache-control", "x-accel-buffering"] {
        assert!(lean.header(name).is_some(), "{name}");
        assert_eq!(lean.header(name), via_hyper.header(name), "{name}");
    }
    w.app.stop().await;
}

/// The lean path enforces the router's checks: a foreign user is refused
/// with the router's own JSON, written whole with a length.
#[tokio::test]
async fn the_lean_path_refuses_what_the_router_refuses() {
    let w = World::new(&[]).await;
    let head = format!(
        "GET /api/queues/default/events HTTP/1.1\r\nHost: x\r\nX-User-Id: attacker\r\nX-Queue-Ticket: {}\r\n\r\n",
        w.victim_ticket
    );
    let mut raw = Raw::connect(w.app.addr).await;
    raw.send(head.as_bytes()).await;
    let got = raw.read_until(5 * SECS, |_| false).await.unwrap();
    assert!(raw.closed, "{}", raw.text());
    assert_eq!(got.len(), 1, "{}", raw.text());
    assert_eq!(got[0].status, 401);
    assert!(got[0].header("content-length").is_some());
    assert!(
        got[0].text().contains("ticket_user_mismatch"),
        "{}",
        got[0].text()
    );
    w.assert_no_victim_token(&raw);
    w.app.stop().await;
}

/// Issue 9, item 6: request heads are capped at 16 KiB on both paths.
#[tokio::test]
async fn heads_over_16_kib_get_431() {
    let app = TestApp::memory(IDLE).await;
    let pad = "a".repeat(17 * 1024);
    for path in ["/healthz", "/api/queues/default/events"] {
        let mut raw = Raw::connect(app.addr).await;
        raw.send(format!("GET {path} HTTP/1.1\r\nHost: x\r\nX-Pad: {pad}\r\n\r\n").as_bytes())
            .await;
        let got = raw.read_until(5 * SECS, |r| !r.is_empty()).await.unwrap();
        assert_eq!(
            got.first().map(|r| r.status),
            Some(431),
            "{path}: {}",
            raw.text()
        );
    }
    // Below the cap, still served.
    let pad = "a".repeat(15 * 1024);
    let mut raw = Raw::connect(app.addr).await;
    raw.send(format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {pad}\r\n\r\n").as_bytes())
        .await;
    let got = raw.read_until(5 * SECS, |r| !r.is_empty()).await.unwrap();
    assert_eq!(got.first().map(|r| r.status), Some(200), "{}", raw.text());
    app.stop().await;
}

/// Issue 9, item 6: a body that stops arriving gets `408` within the body
/// timeout instead of holding the connection forever.
/// The next answer on `raw` is `408 request_timeout`, within 5 s of now
/// (the body timeout is 1 s).
async fn answered_408_in_time(raw: &mut Raw) {
    let started = Instant::now();
    let got = raw.read_until(8 * SECS, |r| !r.is_empty()).await.unwrap();
    let answer = got
        .first()
        .unwrap_or_else(|| panic!("no answer within 8 s"));
    assert_eq!(answer.status, 408, "{}", raw.text());
    assert!(
        answer.text().contains("\"error\":\"request_timeout\""),
        "{}",
        answer.text()
    );
    assert!(started.elapsed() < 5 * SECS, "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_stalled_body_gets_408() {
    let mut args = IDLE.to_vec();
    args.extend(["--body-timeout-secs", "1"]);
    let app = TestApp::memory(&args).await;
    let mut raw = Raw::connect(app.addr).await;
    raw.send(
        b"POST /api/queues/default/entries HTTP/1.1\r\nHost: x\r\nX-User-Id: slow\r\n\
          Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    )
    .await;
    answered_408_in_time(&mut raw).await;
    // The stalled join changed nothing: joining now creates the entry.
    let (code, body) = app.enter("default", "slow").await;
    assert_eq!(code, 201, "{body}");
    app.stop().await;
}

/// An order's body that stops arriving gets the same `408` as a join's:
/// the order gate reads its body through the shared reader, which tells a
/// timeout from a broken body. The claim taken meanwhile is released, so
/// the token still buys.
#[tokio::test]
async fn a_stalled_order_body_gets_408_and_keeps_the_token() {
    let mut args = IDLE.to_vec();
    args.extend(["--body-timeout-secs", "1"]);
    let app = TestApp::memory(&args).await;
    let token = ready(&app, "slow-buyer").await;
    let mut raw = Raw::connect(app.addr).await;
    raw.send(
        format!(
            "POST /api/orders HTTP/1.1\r\nHost: x\r\nX-User-Id: slow-buyer\r\n\
             X-Entry-Token: {token}\r\nContent-Type: application/json\r\n\
             Content-Length: 100\r\n\r\n{{\"productId\""
        )
        .as_bytes(),
    )
    .await;
    answered_408_in_time(&mut raw).await;
    // Nothing was sold and the token was not held: it buys now.
    let placed = app
        .client
        .post(app.url("/api/orders"))
        .header("x-user-id", "slow-buyer")
        .header("x-entry-token", &token)
        .json(&serde_json::json!({"productId": "demo-sneaker", "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(placed.status(), 201);
    app.stop().await;
}

/// Issue 9, item 6: at `--max-connections`, a new connection (streams
/// count like any other) gets `503 server_busy` and is closed; a freed
/// slot is served again.
#[tokio::test]
async fn connections_over_the_cap_are_turned_away() {
    let w = World::new(&["--max-connections", "3", "--max-streams", "2"]).await;
    let addr = w.app.addr;
    let mut stream = Raw::connect(addr).await;
    stream
        .send(w.own_stream("/api/queues/default/events").as_bytes())
        .await;
    let got = stream
        .read_until(5 * SECS, |r| {
            r.first()
                .is_some_and(|s| s.text().contains("event: waiting"))
        })
        .await
        .unwrap();
    assert!(got[0].is_stream() && !got[0].chunked, "a lean stream");

    // Beside the stream, exactly two more connections are served; the
    // next is turned away. (Retried while connections of the set-up may
    // still be closing.)
    let (held, over) = eventually(10 * SECS, "two connections, then the cap", || async move {
        let mut held = Vec::new();
        for _ in 0..4 {
            let mut raw = Raw::connect(addr).await;
            raw.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
            let got = raw
                .read_until(5 * SECS, |r| r.first().is_some_and(|r| r.complete))
                .await
                .ok()?;
            match got.first()?.status {
                200 => held.push(raw),
                503 => {
                    let answer = got[0].clone();
                    raw.read_until(5 * SECS, |_| false).await.ok()?;
                    return (held.len() == 2).then_some((held, (raw, answer)));
                }
                _ => return None,
            }
        }
        None
    })
    .await;
    let (over, answer) = over;
    assert!(over.closed, "closed after the answer");
    assert!(answer.complete && answer.header("content-length").is_some());
    assert!(
        answer.text().contains("\"error\":\"server_busy\""),
        "{}",
        answer.text()
    );
    assert!(answer.header("retry-after").is_some());

    // The stream's end frees its slot like any connection's.
    drop(stream);
    eventually(5 * SECS, "the stream's slot", || async move {
        let mut raw = Raw::connect(addr).await;
        raw.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let got = raw.read_until(2 * SECS, |r| !r.is_empty()).await.ok()?;
        (got.first()?.status == 200).then_some(())
    })
    .await;
    drop(held);
    w.app.stop().await;
}

/// Issue 9, item 6: unknown paths and wrong methods answer the JSON error.
#[tokio::test]
async fn unknown_routes_and_methods_answer_json() {
    let app = TestApp::memory(IDLE).await;
    for (method, path, code, error) in [
        ("GET", "/api/nope", 404, "not_found"),
        ("POST", "/api/nope", 404, "not_found"),
        ("DELETE", "/nothing-here", 404, "not_found"),
        ("DELETE", "/healthz", 405, "method_not_allowed"),
        (
            "GET",
            "/api/queues/default/entries",
            405,
            "method_not_allowed",
        ),
        ("POST", "/index.html", 405, "method_not_allowed"),
    ] {
        let r = app
            .client
            .request(method.parse().unwrap(), app.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), code, "{method} {path}");
        if code == 405 {
            assert!(r.headers().get("allow").is_some(), "{method} {path}: Allow");
        }
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"], error, "{method} {path}: {body}");
        assert!(body["message"].is_string());
    }
    app.stop().await;
}

/// A request of the property test's mixes.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Health,
    /// The attacker's own position poll.
    Position,
    /// A join whose body is the victim's stream head, with
    /// `Expect: 100-continue`; `wait` for the `100` before the body.
    SmuggleExpect {
        wait: bool,
    },
    /// The same without `Expect`.
    Smuggle,
    /// A `GET` carrying the victim's stream head as its body (nobody reads it).
    GetWithBody,
    /// The victim's ticket with the attacker's identity.
    VictimStream,
}

#[derive(Debug, Clone)]
struct Step {
    kind: Kind,
    /// Wait for this request's answer before sending the next one.
    wait: bool,
}

#[derive(Debug, Clone)]
struct Case {
    steps: Vec<Step>,
    /// End with the attacker's own stream request.
    own_stream: bool,
    /// Where the bytes of each burst are cut, as fractions.
    cuts: Vec<f64>,
    /// Pause after each piece, in ms.
    pause_ms: u64,
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let kind = prop_oneof![
        Just(Kind::Health),
        Just(Kind::Position),
        any::<bool>().prop_map(|wait| Kind::SmuggleExpect { wait }),
        Just(Kind::Smuggle),
        Just(Kind::GetWithBody),
        Just(Kind::VictimStream),
    ];
    let step = (kind, any::<bool>()).prop_map(|(kind, wait)| Step { kind, wait });
    (
        proptest::collection::vec(step, 1..5),
        any::<bool>(),
        proptest::collection::vec(0.0..1.0f64, 0..4),
        0..15u64,
    )
        .prop_map(|(steps, own_stream, cuts, pause_ms)| Case {
            steps,
            own_stream,
            cuts,
            pause_ms,
        })
}

/// The statuses the router may give each kind (a per-buyer limit may
/// answer `429` to the attacker's repeated requests).
fn allowed(kind: Option<Kind>) -> &'static [u16] {
    match kind {
        Some(Kind::Health) | Some(Kind::GetWithBody) => &[200],
        Some(Kind::Position) => &[200, 429],
        Some(Kind::SmuggleExpect { .. }) | Some(Kind::Smuggle) => &[400, 429],
        Some(Kind::VictimStream) => &[401, 429],
        None => &[200, 429], // the attacker's own stream
    }
}

impl World {
    /// The bytes of one request: its head, and its body if any.
    fn request(&self, kind: Kind) -> (String, String) {
        let smuggled = self.victim_head();
        match kind {
            Kind::Health => (
                "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                String::new(),
            ),
            Kind::Position => (
                format!(
                    "GET /api/queues/default/position HTTP/1.1\r\nHost: x\r\nX-User-Id: attacker\r\nX-Queue-Ticket: {}\r\n\r\n",
                    self.attacker_ticket
                ),
                String::new(),
            ),
            Kind::SmuggleExpect { .. } => (
                format!(
                    "POST /api/queues/default/entries HTTP/1.1\r\nHost: x\r\nX-User-Id: attacker\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
                    smuggled.len()
                ),
                smuggled,
            ),
            Kind::Smuggle => (
                format!(
                    "POST /api/queues/default/entries HTTP/1.1\r\nHost: x\r\nX-User-Id: attacker\r\nContent-Length: {}\r\n\r\n",
                    smuggled.len()
                ),
                smuggled,
            ),
            Kind::GetWithBody => (
                format!(
                    "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
                    smuggled.len()
                ),
                smuggled,
            ),
            Kind::VictimStream => (
                format!(
                    "GET /api/queues/default/events HTTP/1.1\r\nHost: x\r\nX-User-Id: attacker\r\nX-Queue-Ticket: {}\r\n\r\n",
                    self.victim_ticket
                ),
                String::new(),
            ),
        }
    }

    /// Sends `burst` cut at `case.cuts`, pausing between the pieces.
    async fn send_burst(&self, raw: &mut Raw, burst: &[u8], case: &Case) {
        let mut cuts: Vec<usize> = case
            .cuts
            .iter()
            .map(|f| (f * burst.len() as f64) as usize)
            .chain([0, burst.len()])
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        for piece in cuts.windows(2) {
            raw.send(&burst[piece[0]..piece[1]]).await;
            tokio::time::sleep(Duration::from_millis(case.pause_ms)).await;
        }
    }

    /// Plays `case` on one connection and checks every byte that came back.
    async fn check(&self, case: &Case) -> Result<(), String> {
        let mut raw = Raw::connect(self.app.addr).await;
        let mut kinds: Vec<Option<Kind>> = case.steps.iter().map(|s| Some(s.kind)).collect();
        if case.own_stream {
            kinds.push(None);
        }
        let mut burst = Vec::new();
        for (i, step) in case.steps.iter().enumerate() {
            let (head, body) = self.request(step.kind);
            burst.extend_from_slice(head.as_bytes());
            if let Kind::SmuggleExpect { wait: true } = step.kind {
                self.send_burst(&mut raw, &std::mem::take(&mut burst), case)
                    .await;
                // The 100, or a final answer for it (refused unread).
                raw.read_until(2 * SECS, |r| {
                    r.last().is_some_and(|r| r.status == 100) || finals(r).len() > i
                })
                .await?;
            }
            burst.extend_from_slice(body.as_bytes());
            if step.wait {
                self.send_burst(&mut raw, &std::mem::take(&mut burst), case)
                    .await;
                raw.read_until(2 * SECS, |r| finals(r).len() > i && finals(r)[i].complete)
                    .await?;
            }
            if raw.closed {
                break;
            }
        }
        if case.own_stream {
            burst.extend_from_slice(self.own_stream("/api/queues/default/events").as_bytes());
        }
        if !raw.closed {
            self.send_burst(&mut raw, &burst, case).await;
        }
        let want = kinds.len();
        raw.read_until(3 * SECS, |r| {
            let f = finals(r);
            f.len() == want
                && f.last()
                    .is_some_and(|last| last.complete || last.text().contains("event: "))
        })
        .await?;
        // A little longer: nothing more may come (a stream served from body
        // bytes would come now).
        let got = raw
            .read_until(Duration::from_millis(150), |_| false)
            .await?;

        let text = raw.text();
        if text.contains(&self.victim_token) {
            return Err(format!("the victim's token was served: {text}"));
        }
        let answers = finals(&got);
        if answers.len() > want {
            return Err(format!("more answers than requests: {text}"));
        }
        for (i, answer) in answers.iter().enumerate() {
            let kind = kinds[i];
            if !allowed(kind).contains(&answer.status) {
                return Err(format!(
                    "answer {i} to {kind:?} is {}: {text}",
                    answer.status
                ));
            }
            if answer.is_stream() && kind.is_some() {
                return Err(format!("a stream answered {kind:?}: {text}"));
            }
        }
        // Every 1xx answers an Expect request.
        let mut finals_before = 0;
        for r in &got {
            if r.status >= 200 {
                finals_before += 1;
            } else if !matches!(
                kinds.get(finals_before),
                Some(Some(Kind::SmuggleExpect { .. }))
            ) {
                return Err(format!(
                    "a 100 Continue for a request without Expect: {text}"
                ));
            }
        }
        Ok(())
    }
}

/// Issue 9, item 1: random mixes of requests — bodies that are complete
/// stream heads with a READY victim's ticket, pipelines, `Expect:
/// 100-continue`, arbitrary split points and pauses — over one connection:
/// every response is well formed, answers its own request, and no stream
/// (nor the victim's token) ever comes from body bytes.
#[test]
fn random_request_mixes_never_serve_a_stream_from_body_bytes() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let world = rt.block_on(World::new(&[]));
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        max_shrink_iters: 64,
        ..ProptestConfig::default()
    });
    let outcome = runner.run(&case_strategy(), |case| {
        rt.block_on(async {
            match tokio::time::timeout(Duration::from_secs(15), world.check(&case)).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(TestCaseError::fail(e)),
                Err(_) => Err(TestCaseError::fail("the case took over 15 s")),
            }
        })
    });
    rt.block_on(world.app.stop());
    if let Err(e) = outcome {
        panic!("{e}");
    }
}

/// `/position` then `/events` on one socket (the stream goes lean at the
/// boundary after a whole response), a second stream through hyper (its
/// head in two writes), and a shutdown: both streams end within the drain
/// window, whichever transport carries them.
#[tokio::test]
async fn a_poll_then_a_stream_on_one_socket_and_both_transports_close_within_the_drain_window() {
    let w = World::new(&["--drain-secs", "2"]).await;

    let mut lean = Raw::connect(w.app.addr).await;
    lean.send(
        format!(
            "GET /api/queues/default/position HTTP/1.1\r\nHost: x\r\nX-User-Id: attacker\r\n\
             X-Queue-Ticket: {}\r\n\r\n",
            w.attacker_ticket
        )
        .as_bytes(),
    )
    .await;
    let polled = lean
        .read_until(5 * SECS, |r| r.first().is_some_and(|r| r.complete))
        .await
        .unwrap();
    assert_eq!(polled[0].status, 200, "{}", lean.text());
    let status: serde_json::Value = serde_json::from_slice(&polled[0].body).unwrap();
    assert_eq!(status["status"], "WAITING");
    lean.send(w.own_stream("/api/queues/default/events").as_bytes())
        .await;
    let got = lean
        .read_until(5 * SECS, |r| {
            r.get(1)
                .is_some_and(|s| s.text().contains("event: waiting"))
        })
        .await
        .unwrap();
    assert_eq!(got.len(), 2, "{}", lean.text());
    assert!(
        got[1].is_stream() && !got[1].chunked,
        "lean: {}",
        lean.text()
    );

    // The victim's own stream, its head in two writes: hyper serves it.
    let head = w.victim_head();
    let (cut, mut gap) = (head.len() / 2, Duration::from_millis(50));
    let mut hyper = loop {
        let mut raw = Raw::connect(w.app.addr).await;
        raw.send(&head.as_bytes()[..cut]).await;
        tokio::time::sleep(gap).await;
        raw.send(&head.as_bytes()[cut..]).await;
        let got = raw
            .read_until(5 * SECS, |r| {
                r.first().is_some_and(|s| s.text().contains("event: ready"))
            })
            .await
            .unwrap();
        if got.first().is_some_and(|r| r.chunked) {
            break raw;
        }
        assert!(gap < Duration::from_secs(3), "never served through hyper");
        gap *= 2;
    };

    let stopping = Instant::now();
    let (_, lean_closed, hyper_closed) = tokio::join!(
        w.app.stop(),
        async {
            lean.read_until(10 * SECS, |_| false).await.unwrap();
            (lean.closed, stopping.elapsed())
        },
        async {
            hyper.read_until(10 * SECS, |_| false).await.unwrap();
            (hyper.closed, stopping.elapsed())
        },
    );
    // The drain window is 2 s; a second more for a busy machine.
    for (name, (closed, after)) in [("lean", lean_closed), ("hyper", hyper_closed)] {
        assert!(closed, "the {name} stream was closed");
        assert!(
            after <= 3 * SECS,
            "the {name} stream closed after {after:?}"
        );
    }
}

/// A socket that connects and sends nothing is closed after the
/// first-byte timeout (5 s by default), without a byte of answer: it does
/// not hold a connection for the 75 s idle timeout. One that sent its
/// request at once is answered and then kept alive as usual, past that
/// moment.
#[tokio::test]
async fn a_socket_that_sends_nothing_is_closed_after_the_first_byte_timeout() {
    let app = TestApp::memory(IDLE).await;
    let started = Instant::now();
    let mut silent = Raw::connect(app.addr).await;
    let mut spoke = Raw::connect(app.addr).await;
    spoke
        .send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let got = spoke
        .read_until(5 * SECS, |r| r.first().is_some_and(|r| r.complete))
        .await
        .unwrap();
    assert_eq!(got[0].status, 200, "{}", spoke.text());

    silent.read_until(20 * SECS, |_| false).await.unwrap();
    let after = started.elapsed();
    assert!(silent.closed, "still open after {after:?}");
    assert!(
        silent.got.is_empty(),
        "closed unanswered: {}",
        silent.text()
    );
    assert!(
        (Duration::from_millis(4_500)..15 * SECS).contains(&after),
        "closed after {after:?}"
    );
    // The connection that spoke is still open, and served.
    spoke
        .send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let got = spoke
        .read_until(5 * SECS, |r| r.get(1).is_some_and(|r| r.complete))
        .await
        .unwrap();
    assert_eq!(got.len(), 2, "{}", spoke.text());
    assert_eq!(got[1].status, 200);
    assert!(!spoke.closed);
    app.stop().await;
}
