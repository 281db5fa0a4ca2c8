//! What browsers and the proxies in front of them meet: the security
//! headers on every kind of answer (on both stream paths and on the
//! transport's own `503`), the refusal of cross-origin requests that act
//! on a buyer's cookies, a base path end to end (the page, the cookies, the
//! stream on both paths, the API document), `?ticket=` left out of the
//! query by default, and the idle keep-alive timeout.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::common::{IDLE, TestApp, config};

/// A response head read off a raw socket, and the body bytes read so far.
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads one response from `s`: the head, then a `Content-Length` body
/// whole, or (a stream) whatever arrives until `until` appears in it.
async fn read_response(s: &mut TcpStream, until: &str) -> Raw {
    let mut bytes = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .expect("a response head within 10 s")
            .unwrap();
        assert!(n > 0, "closed before a response head: {bytes:?}");
        bytes.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8(bytes[..head_end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()))
        .collect();
    let mut raw = Raw {
        status,
        headers,
        body: bytes[head_end..].to_vec(),
    };
    let length: Option<usize> = raw.header("content-length").map(|v| v.parse().unwrap());
    loop {
        let done = match length {
            Some(len) => raw.body.len() >= len,
            None => raw.text().contains(until),
        };
        if done {
            return raw;
        }
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .expect("the body within 10 s")
            .unwrap();
        if n == 0 {
            return raw;
        }
        raw.body.extend_from_slice(&buf[..n]);
    }
}

/// Sends `head` in one write (the lean path takes a stream request sent
/// so) or, with `split`, in two writes 200 ms apart (a head in pieces
/// stays on hyper), then reads the answer.
async fn raw(addr: SocketAddr, head: &str, split: bool, until: &str) -> Raw {
    let mut s = TcpStream::connect(addr).await.unwrap();
    if split {
        let (a, b) = head.split_at(10);
        s.write_all(a.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        s.write_all(b.as_bytes()).await.unwrap();
    } else {
        s.write_all(head.as_bytes()).await.unwrap();
    }
    read_response(&mut s, until).await
}

fn get(path: &str, host: SocketAddr, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n")
}

/// The headers every answer must carry.
fn assert_secure(r: &Raw, what: &str) {
    let csp = r.header("content-security-policy").unwrap_or_default();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self' data:",
        "worker-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(
            csp.contains(directive),
            "{what}: CSP {csp:?} lacks {directive}"
        );
    }
    assert_eq!(r.header("x-frame-options"), Some("DENY"), "{what}");
    assert_eq!(
        r.header("x-content-type-options"),
        Some("nosniff"),
        "{what}"
    );
    assert_eq!(r.header("referrer-policy"), Some("no-referrer"), "{what}");
}

fn assert_no_store(r: &Raw, what: &str) {
    let cache = r.header("cache-control").unwrap_or_default();
    assert!(
        cache.contains("no-store"),
        "{what}: cache-control {cache:?}"
    );
}

#[tokio::test]
async fn every_kind_of_answer_carries_the_security_headers() {
    let app = TestApp::memory(IDLE).await;
    let a = app.addr;
    let page = raw(a, &get("/", a, ""), false, "").await;
    assert_eq!(page.status, 200);
    assert_secure(&page, "the page");
    let script = raw(a, &get("/app.js", a, ""), false, "").await;
    assert_secure(&script, "a script");
    assert_eq!(
        script.header("cache-control"),
        Some("no-cache"),
        "assets revalidate"
    );
    let missing = raw(a, &get("/nope", a, ""), false, "").await;
    assert_eq!(missing.status, 404);
    assert_secure(&missing, "404");
    let method = raw(
        a,
        "PUT /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        false,
        "",
    )
    .await;
    assert_eq!(method.status, 405);
    assert_secure(&method, "405");

    // A join carries a ticket (and a token when READY): never stored.
    let join = raw(
        a,
        "POST /api/queues/default/entries HTTP/1.1\r\nHost: x\r\nX-User-Id: hdr-a\r\nContent-Length: 0\r\n\r\n",
        false,
        "",
    )
    .await;
    assert_eq!(join.status, 201, "{}", join.text());
    assert_secure(&join, "join");
    assert_no_store(&join, "join");
    let ticket = serde_json::from_slice::<Value>(&join.body).unwrap()["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    let bad = raw(
        a,
        "POST /api/queues/default/entries HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        false,
        "",
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_secure(&bad, "400");
    assert_no_store(&bad, "400");
    let position = raw(
        a,
        &get(
            "/api/queues/default/position",
            a,
            &format!("X-Queue-Ticket: {ticket}\r\n"),
        ),
        false,
        "",
    )
    .await;
    assert_eq!(position.status, 200);
    assert_secure(&position, "position");
    assert_no_store(&position, "position");

    // The stream, on the lean path (one write) and on hyper (in pieces).
    for split in [false, true] {
        let what = if split { "hyper stream" } else { "lean stream" };
        let stream = raw(
            a,
            &get(
                "/api/queues/default/events",
                a,
                &format!("X-Queue-Ticket: {ticket}\r\n"),
            ),
            split,
            "event: ",
        )
        .await;
        assert_eq!(stream.status, 200, "{what}");
        assert_eq!(
            stream.header("connection") == Some("close"),
            !split,
            "{what}"
        );
        assert_secure(&stream, what);
        let cache = stream.header("cache-control").unwrap();
        assert!(
            cache.contains("no-cache") && cache.contains("no-store"),
            "{what}: {cache}"
        );
        // An error on each path too.
        let refused = raw(
            a,
            &get(
                "/api/queues/default/events",
                a,
                "X-Queue-Ticket: forged\r\n",
            ),
            split,
            "",
        )
        .await;
        assert_eq!(refused.status, 401, "{what}");
        assert_secure(&refused, what);
        assert_no_store(&refused, what);
    }
    app.stop().await;

    // The transport's own answer over the connection cap.
    let app = TestApp::memory(&["--max-connections", "1", "--max-streams", "1"]).await;
    let mut held = TcpStream::connect(app.addr).await.unwrap();
    held.write_all(get("/healthz", app.addr, "").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_response(&mut held, "").await.status, 200);
    let busy = raw(app.addr, &get("/healthz", app.addr, ""), false, "").await;
    assert_eq!(busy.status, 503);
    assert_secure(&busy, "server_busy");
    assert_no_store(&busy, "server_busy");
    drop(held);
    app.stop().await;
}

/// (status, error code) of `method path` with `headers`.
async fn call(app: &TestApp, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut r = app.client.request(method.parse().unwrap(), app.url(path));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    if method == "POST" && path.ends_with("/orders") {
        r = r
            .header("content-type", "application/json")
            .body(r#"{"productId":"demo-sneaker","quantity":1}"#);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn cross_origin_requests_are_refused_and_change_nothing() {
    let app =
        TestApp::memory(&[IDLE, &["--allowed-origins", "https://shop.example"]].concat()).await;
    let own = format!("http://{}", app.addr);
    let sibling = format!("http://127.0.0.1:{}", app.addr.port() + 1);
    let join = "/api/queues/default/entries";
    let refusals: [&[(&str, &str)]; 5] = [
        &[("sec-fetch-site", "same-site")],
        &[("sec-fetch-site", "cross-site")],
        &[("origin", &sibling)],
        &[("origin", "null")],
        &[("sec-fetch-site", "same-site"), ("origin", &sibling)],
    ];
    for headers in refusals {
        let mut with_user = headers.to_vec();
        with_user.push(("x-user-id", "victim"));
        let (code, body) = call(&app, "POST", join, &with_user).await;
        assert_eq!(
            (code, body["error"].as_str()),
            (403, Some("cross_origin")),
            "{headers:?}"
        );
    }
    // None of those joined: the victim's first join creates the place.
    let (code, entered) = call(&app, "POST", join, &[("x-user-id", "victim")]).await;
    assert_eq!(code, 201, "refused joins created nothing");
    let ticket = entered["ticket"].as_str().unwrap().to_owned();
    let t = ("x-queue-ticket", ticket.as_str());

    for (method, path) in [
        ("GET", "/api/queues/default/position"),
        ("GET", "/api/queues/default/events"),
        ("DELETE", "/api/queues/default/entries/me"),
        ("POST", "/api/orders"),
        ("GET", "/api/orders/ord_x"),
    ] {
        for bad in [
            ("sec-fetch-site", "same-site"),
            ("origin", sibling.as_str()),
        ] {
            let (code, body) = call(&app, method, path, &[t, bad, ("x-user-id", "victim")]).await;
            assert_eq!(
                (code, body["error"].as_str()),
                (403, Some("cross_origin")),
                "{method} {path} {bad:?}"
            );
        }
    }
    // The place is still there: the refused leave changed nothing.
    let (code, _) = app.position("default", &ticket).await;
    assert_eq!(code, 200);

    // Same origin, a typed URL, no header at all, the own origin in
    // `Origin`, an allowed origin: all pass.
    let passes: [&[(&str, &str)]; 5] = [
        &[("sec-fetch-site", "same-origin")],
        &[("sec-fetch-site", "none")],
        &[],
        &[("origin", &own), ("sec-fetch-site", "same-origin")],
        &[
            ("origin", "https://shop.example"),
            ("sec-fetch-site", "cross-site"),
        ],
    ];
    for headers in passes {
        let mut all = headers.to_vec();
        all.push(t);
        let (code, body) = call(&app, "GET", "/api/queues/default/position", &all).await;
        assert_eq!(code, 200, "{headers:?}: {body}");
    }
    // The stream of the page's own origin opens; pages, assets and the
    // bearer APIs are not guarded.
    let own_stream = raw(
        app.addr,
        &get(
            "/api/queues/default/events",
            app.addr,
            &format!(
                "X-Queue-Ticket: {ticket}\r\nSec-Fetch-Site: same-origin\r\nOrigin: {own}\r\n"
            ),
        ),
        false,
        "event: ",
    )
    .await;
    assert_eq!(own_stream.status, 200);
    for path in ["/", "/app.js", "/api/products", "/healthz"] {
        let (code, _) = call(&app, "GET", path, &[("sec-fetch-site", "cross-site")]).await;
        assert_eq!(code, 200, "{path}");
    }
    // The refused stream on the lean path is the same JSON error.
    let lean = raw(
        app.addr,
        &get(
            "/api/queues/default/events",
            app.addr,
            &format!("X-Queue-Ticket: {ticket}\r\nSec-Fetch-Site: same-site\r\n"),
        ),
        false,
        "",
    )
    .await;
    assert_eq!(lean.status, 403);
    assert!(lean.text().contains("cross_origin"));
    app.stop().await;
}

#[tokio::test]
async fn a_ticket_in_the_query_is_ignored_unless_opted_in() {
    let app = TestApp::memory(IDLE).await;
    let (_, body) = app.enter("default", "q-user").await;
    let ticket = body["ticket"].as_str().unwrap();
    for path in ["position", "events"] {
        let (code, body) = call(
            &app,
            "GET",
            &format!("/api/queues/default/{path}?ticket={ticket}"),
            &[],
        )
        .await;
        assert_eq!(
            (code, body["error"].as_str()),
            (401, Some("missing_ticket")),
            "{path}"
        );
    }
    let (code, _) = call(
        &app,
        "DELETE",
        &format!("/api/queues/default/entries/me?ticket={ticket}"),
        &[],
    )
    .await;
    assert_eq!(code, 401);
    assert_eq!(app.position("default", ticket).await.0, 200, "not left");
    app.stop().await;

    let app = TestApp::memory(&[IDLE, &["--ticket-in-query"]].concat()).await;
    let (_, body) = app.enter("default", "q-user").await;
    let ticket = body["ticket"].as_str().unwrap();
    let (code, _) = call(
        &app,
        "GET",
        &format!("/api/queues/default/position?ticket={ticket}"),
        &[],
    )
    .await;
    assert_eq!(code, 200, "opted in");
    app.stop().await;
}

/// The `name=value` of the `set-cookie` called `name`, and its attributes.
fn cookie<'a>(r: &'a Raw, name: &str) -> (&'a str, &'a str) {
    let line = r
        .all("set-cookie")
        .into_iter()
        .find(|c| c.starts_with(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} cookie in {:?}", r.headers));
    line.split_once(';').unwrap_or((line, ""))
}

#[tokio::test]
async fn a_base_path_serves_page_cookies_stream_and_document_below_it() {
    let app =
        TestApp::memory(&[IDLE, &["--identity", "visitor", "--base-path", "/shop"]].concat()).await;
    let a = app.addr;
    let redirect = raw(a, &get("/shop", a, ""), false, "").await;
    assert_eq!(redirect.status, 308);
    assert_eq!(redirect.header("location"), Some("/shop/"));
    assert_secure(&redirect, "redirect");
    let page = raw(a, &get("/shop/", a, ""), false, "").await;
    assert_eq!(page.status, 200);
    assert!(page.text().contains("<html"));
    assert_secure(&page, "page under the base");
    assert_no_store(&page, "the page sets the visitor cookie");
    let (visitor, _) = cookie(&page, "waitroom_visitor");
    let visitor = visitor.to_owned();
    assert_eq!(
        raw(a, &get("/shop/app.js", a, ""), false, "").await.status,
        200
    );
    // Outside the base: nothing but the probes (asked of each instance).
    assert_eq!(raw(a, &get("/healthz", a, ""), false, "").await.status, 200);
    for outside in [
        "/",
        "/app.js",
        "/api/queues/default/position",
        "/shopx/",
        "/api/openapi.json",
    ] {
        let r = raw(a, &get(outside, a, ""), false, "").await;
        assert_eq!(r.status, 404, "{outside}");
        assert_secure(&r, outside);
    }
    assert_eq!(
        raw(a, &get("/shop/healthz", a, ""), false, "").await.status,
        200
    );

    // Join with the visitor cookie: the ticket cookie's path is below the base.
    let join = raw(
        a,
        &format!(
            "POST /shop/api/queues/default/entries HTTP/1.1\r\nHost: {a}\r\nCookie: {visitor}\r\nSec-Fetch-Site: same-origin\r\nOrigin: http://{a}\r\nContent-Length: 0\r\n\r\n"
        ),
        false,
        "",
    )
    .await;
    assert_eq!(join.status, 201, "{}", join.text());
    assert_no_store(&join, "join under the base");
    let (ticket, attrs) = cookie(&join, "waitroom_ticket");
    assert!(attrs.contains("Path=/shop/api/queues/default"), "{attrs}");
    let cookies = format!("Cookie: {visitor}; {ticket}\r\nSec-Fetch-Site: same-origin\r\n");
    // The stream with the cookies alone, on both paths.
    for split in [false, true] {
        let stream = raw(
            a,
            &get("/shop/api/queues/default/events", a, &cookies),
            split,
            "event: ",
        )
        .await;
        assert_eq!(stream.status, 200, "split {split}: {}", stream.text());
        assert!(stream.text().contains("event: ready"), "{}", stream.text());
        assert_secure(&stream, "stream under the base");
        // The lean writer frames by the connection's close; hyper chunks.
        assert_eq!(
            stream.header("connection") == Some("close"),
            !split,
            "lean path taken: {}",
            !split
        );
    }
    let position = raw(
        a,
        &get("/shop/api/queues/default/position", a, &cookies),
        false,
        "",
    )
    .await;
    assert_eq!(position.status, 200);
    // The document says where the API is.
    let doc = raw(a, &get("/shop/api/openapi.json", a, ""), false, "").await;
    let doc: Value = serde_json::from_slice(&doc.body).unwrap();
    assert_eq!(doc["servers"][0]["url"], "/shop");
    assert!(doc["paths"]["/api/queues/{queue}/events"].is_object());
    // Leaving clears the cookie at the same path.
    let leave = raw(
        a,
        &format!(
            "DELETE /shop/api/queues/default/entries/me HTTP/1.1\r\nHost: {a}\r\n{cookies}\r\n"
        ),
        false,
        "",
    )
    .await;
    assert_eq!(leave.status, 204);
    let (_, attrs) = cookie(&leave, "waitroom_ticket");
    assert!(attrs.contains("Path=/shop/api/queues/default"), "{attrs}");
    app.stop().await;
}

/// Whether the server closed `s` within `limit` (a read gives end-of-file
/// or an error).
async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(limit, s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test]
async fn idle_connections_close_after_the_idle_timeout_not_before() {
    let app = TestApp::memory_with(config(&["--idle-timeout-secs", "2"])).await;
    let a = app.addr;
    let mut s = TcpStream::connect(a).await.unwrap();
    // Idle for less than the timeout, three times: still usable.
    for _ in 0..3 {
        s.write_all(get("/healthz", a, "").as_bytes())
            .await
            .unwrap();
        assert_eq!(read_response(&mut s, "").await.status, 200);
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
    s.write_all(get("/healthz", a, "").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_response(&mut s, "").await.status, 200);
    // Then idle past it: closed, about on time.
    let idle_from = Instant::now();
    assert!(
        closed_within(&mut s, Duration::from_secs(5)).await,
        "closed when idle"
    );
    let idle = idle_from.elapsed();
    assert!(
        idle >= Duration::from_millis(1800) && idle < Duration::from_millis(3500),
        "closed after {idle:?}"
    );
    // A fresh connection that never sends anything closes the same way.
    let mut silent = TcpStream::connect(a).await.unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(5)).await);

    // A head that has begun is not idle: its first half, a pause longer
    // than the idle timeout, the rest: answered.
    let mut slow = TcpStream::connect(a).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(3000)).await;
    slow.write_all(format!("Host: {a}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_response(&mut slow, "").await.status, 200);
    app.stop().await;
}

/// A head trickling in is cut off ten seconds after its first byte, even
/// with a long idle timeout.
#[tokio::test]
async fn a_head_that_never_ends_is_dropped_after_the_head_timeout() {
    let app = TestApp::memory_with(config(&["--idle-timeout-secs", "600"])).await;
    let mut s = TcpStream::connect(app.addr).await.unwrap();
    let from = Instant::now();
    s.write_all(b"GET /healthz HTTP/1.1\r\nX-A: 1\r\n")
        .await
        .unwrap();
    assert!(
        closed_within(&mut s, Duration::from_secs(15)).await,
        "dropped"
    );
    let took = from.elapsed();
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(13),
        "after {took:?}"
    );
    app.stop().await;
}
