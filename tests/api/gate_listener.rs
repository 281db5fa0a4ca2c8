//! The gateway listener (`--gate-addr`): the gateway check alone, answered
//! as on the public listener (but for the page's security headers on a
//! `200`), its connections bounded by deadlines kept without a timer per
//! request, only their total capped.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{TestApp, skip_redis};
use crate::pass::pass_of;

/// Follows no redirect: the tests read each one.
fn client() -> reqwest::Client {
    crate::front::no_redirects()
}

async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = client().request(method.parse().unwrap(), format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn the_gateway_listener_answers_the_check_as_the_public_listener_does() {
    let mut apps = vec![TestApp::memory(&["--queues", "default,other"]).await];
    if !skip_redis("gate listener") {
        apps.push(TestApp::redis("gatelistener", &["--queues", "default,other"]).await);
    }
    for app in apps {
        let pass = pass_of(&app, "default", "alice").await;
        let cookie = format!("theme=dark; waitroom_pass={pass}");
        let check = "/api/gate/check?queue=default";
        let origin = [
            ("cookie", cookie.as_str()),
            ("x-original-uri", "/product/42?size=9"),
        ];

        // Let through: the same names as on --addr, `no-store`, none of
        // the page's headers (no gateway passes an accepting answer on).
        let public = send(app.addr, "GET", check, &origin).await;
        let gate = send(app.gate_addr, "GET", check, &origin).await;
        assert_eq!(
            (public.status().as_u16(), gate.status().as_u16()),
            (200, 200)
        );
        for name in [
            "x-waitroom-visitor",
            "x-waitroom-room",
            "x-waitroom-session",
        ] {
            assert_eq!(header(&gate, name), header(&public, name), "{name}");
            assert!(header(&gate, name).is_some(), "{name}");
        }
        assert_eq!(header(&gate, "x-waitroom-visitor").unwrap(), "alice");
        assert_eq!(header(&gate, "cache-control").unwrap(), "no-store");
        assert_eq!(header(&gate, "content-security-policy"), None);
        assert!(header(&public, "content-security-policy").is_some());

        // Refused: the same reason and waiting page, every header kept
        // (Caddy and Traefik pass a refusal on to the browser).
        for (headers, reason) in [
            (
                vec![("x-original-uri", "/product/42?size=9")],
                Some("missing"),
            ),
            (
                vec![
                    ("cookie", "waitroom_pass=e30.e30.AAAA"),
                    ("x-original-uri", "/a"),
                ],
                None,
            ),
        ] {
            let public = send(app.addr, "GET", check, &headers).await;
            let gate = send(app.gate_addr, "GET", check, &headers).await;
            assert_eq!(
                (public.status().as_u16(), gate.status().as_u16()),
                (401, 401)
            );
            let why = header(&gate, "x-waitroom-reason").unwrap();
            assert_eq!(Some(why.clone()), header(&public, "x-waitroom-reason"));
            if let Some(reason) = reason {
                assert_eq!(why, reason);
            }
            assert_eq!(header(&gate, "location"), header(&public, "location"));
            assert_eq!(
                header(&gate, "x-waitroom-location"),
                header(&public, "x-waitroom-location")
            );
            assert!(
                header(&gate, "location")
                    .unwrap()
                    .contains("return=%2Fproduct%2F42%3Fsize%3D9")
                    || reason.is_none()
            );
            assert!(header(&gate, "content-security-policy").is_some());
            assert_eq!(header(&gate, "x-frame-options").unwrap(), "DENY");
        }
        // Another room's pass; a browser with `redirect=1` gets a 303.
        let other = send(
            app.gate_addr,
            "GET",
            "/api/gate/check?queue=other",
            &[("cookie", &cookie)],
        )
        .await;
        assert_eq!(other.status(), 401);
        assert_eq!(header(&other, "x-waitroom-reason").unwrap(), "other_room");
        let browser = send(
            app.gate_addr,
            "GET",
            "/api/gate/check?queue=default&redirect=1",
            &[("accept", "text/html"), ("x-original-uri", "/p")],
        )
        .await;
        assert_eq!(browser.status(), 303);
        assert!(
            header(&browser, "location")
                .unwrap()
                .contains("return=%2Fp")
        );

        // Bad input: the JSON error shape, as on --addr.
        for (path, headers, code, error) in [
            ("/api/gate/check?queue=nope", vec![], 404, "unknown_queue"),
            (
                "/api/gate/check?queue=default&queue=other",
                vec![],
                400,
                "invalid_check_query",
            ),
            (
                check,
                vec![("x-user-id", "a"), ("x-user-id", "b")],
                400,
                "duplicate_header",
            ),
            ("/waitroom/api/gate/check", vec![], 404, "not_found"),
            ("/api/queues/default/entries", vec![], 404, "not_found"),
            ("/", vec![], 404, "not_found"),
        ] {
            let r = send(app.gate_addr, "GET", path, &headers).await;
            assert_eq!(r.status().as_u16(), code, "{path}");
            assert_eq!(header(&r, "content-type").unwrap(), "application/json");
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"], error, "{path}");
        }
        // Every method a gateway may forward; HEAD gets the head alone;
        // TRACE is refused as the public router refuses it.
        for method in ["HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PROPFIND"] {
            let r = send(app.gate_addr, method, check, &[("cookie", &cookie)]).await;
            assert_eq!(r.status(), 200, "{method}");
            let r = send(app.gate_addr, method, check, &[]).await;
            assert_eq!(r.status(), 401, "{method}");
        }
        let r = send(app.gate_addr, "HEAD", check, &[]).await;
        assert!(r.bytes().await.unwrap().is_empty());
        let r = send(app.gate_addr, "TRACE", check, &[("cookie", &cookie)]).await;
        assert_eq!(r.status(), 405);
        assert!(header(&r, "allow").is_some());
        // A body (which no gateway sends) is not read, and costs nothing:
        // the answer is the check's.
        let r = client()
            .post(format!("http://{}{check}", app.gate_addr))
            .header("cookie", &cookie)
            .body(vec![b'x'; 100_000])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        app.stop().await;
    }
}

/// Reads until the peer closes; `None` if it has not within `limit`.
async fn closed_within(socket: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, socket.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

const CHECK: &[u8] =
    b"GET /api/gate/check?queue=default HTTP/1.1\r\nhost: gate\r\nx-original-uri: /\r\n\r\n";

/// Reads one whole answer to [`CHECK`] without a pass (a `401` with no
/// body).
async fn read_answer(socket: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf))
            .await
            .expect("an answer in time")
            .unwrap();
        assert!(n > 0, "closed before answering");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(got).unwrap()
}

#[tokio::test]
async fn silent_idle_and_dribbling_gateway_connections_are_closed_and_new_ones_served() {
    let app =
        TestApp::memory(&["--first-byte-timeout-secs", "1", "--idle-timeout-secs", "2"]).await;

    // Silent: closed after the first-byte deadline (at most twice it),
    // never answered.
    let started = Instant::now();
    let mut silent = TcpStream::connect(app.gate_addr).await.unwrap();
    let got = closed_within(&mut silent, Duration::from_secs(5))
        .await
        .expect("a silent connection is closed");
    assert!(got.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(900));

    // Kept alive while used: requests 0.7 s apart for 4 s, past both
    // deadlines, all answered on the one connection.
    let mut busy = TcpStream::connect(app.gate_addr).await.unwrap();
    for _ in 0..6 {
        busy.write_all(CHECK).await.unwrap();
        assert!(read_answer(&mut busy).await.starts_with("HTTP/1.1 401"));
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    // Then idle: closed within two idle deadlines, not before one.
    let idle_from = Instant::now();
    closed_within(&mut busy, Duration::from_secs(6))
        .await
        .expect("an idle connection is closed");
    let idle = idle_from.elapsed();
    assert!(idle >= Duration::from_millis(1_200), "{idle:?}");

    // A head dribbled and never finished: cut off within the first-byte
    // deadline and the head's time (10 s), unanswered.
    let mut dribble = TcpStream::connect(app.gate_addr).await.unwrap();
    dribble
        .write_all(b"GET /api/gate/check HTTP/1.1\r\nhost: g")
        .await
        .unwrap();
    let got = closed_within(&mut dribble, Duration::from_secs(15))
        .await
        .expect("a dribbled head is cut off");
    assert!(!String::from_utf8_lossy(&got).contains(" 200 "));

    // The way back: a new connection is served at once.
    let mut fresh = TcpStream::connect(app.gate_addr).await.unwrap();
    fresh.write_all(CHECK).await.unwrap();
    assert!(read_answer(&mut fresh).await.starts_with("HTTP/1.1 401"));
    app.stop().await;
}

#[tokio::test]
async fn gateway_connections_are_capped_in_total_not_per_address_and_a_freed_one_lets_the_next_in()
{
    // One address may hold one connection on --addr; a gateway is one
    // address holding many, and here only the total (2) counts.
    let app = TestApp::memory(&[
        "--max-connections",
        "2",
        "--connections-per-address",
        "1",
        "--max-streams",
        "1",
    ])
    .await;
    let mut first = TcpStream::connect(app.gate_addr).await.unwrap();
    let mut second = TcpStream::connect(app.gate_addr).await.unwrap();
    for socket in [&mut first, &mut second] {
        socket.write_all(CHECK).await.unwrap();
        assert!(read_answer(socket).await.starts_with("HTTP/1.1 401"));
    }
    // Over the cap: 503 server_busy, closed.
    let mut third = TcpStream::connect(app.gate_addr).await.unwrap();
    let _ = third.write_all(CHECK).await;
    let got = closed_within(&mut third, Duration::from_secs(5))
        .await
        .expect("turned away and closed");
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 503"), "{got}");
    assert!(got.contains("server_busy"), "{got}");

    // One closes: the next gets in (the slot is given back).
    drop(first);
    let mut served = None;
    for _ in 0..50 {
        let mut next = TcpStream::connect(app.gate_addr).await.unwrap();
        next.write_all(CHECK).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), next.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        let got = String::from_utf8_lossy(&buf[..n]).into_owned();
        if got.starts_with("HTTP/1.1 401") {
            served = Some(next);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served.is_some(), "a freed slot lets the next connection in");
    // The second connection still works throughout.
    second.write_all(CHECK).await.unwrap();
    assert!(read_answer(&mut second).await.starts_with("HTTP/1.1 401"));

    // Shutdown: the listener's threads end with the instance; a kept-alive
    // connection is closed and the port refuses new ones.
    let gate = app.gate_addr;
    app.stop().await;
    closed_within(&mut second, Duration::from_secs(5))
        .await
        .expect("closed at shutdown");
    assert!(TcpStream::connect(gate).await.is_err(), "still listening");
}

#[tokio::test]
async fn a_gate_address_that_collides_is_refused_before_anything_binds() {
    for args in [
        &[
            "--addr",
            "127.0.0.1:18080",
            "--gate-addr",
            "127.0.0.1:18080",
        ][..],
        &[
            "--admin-addr",
            "127.0.0.1:19090",
            "--gate-addr",
            "127.0.0.1:19090",
        ][..],
    ] {
        let config = crate::common::config(args);
        let err = config.validate().expect_err("refused").to_string();
        assert!(err.contains("--gate-addr"), "{err}");
    }
    crate::common::config(&["--gate-addr", "127.0.0.1:0"])
        .validate()
        .unwrap();
}
