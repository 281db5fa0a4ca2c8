//! Operator surfaces apart from buyers: `/metrics`, the admin API and the
//! token API on their own listener (`--admin-addr`), answering `404` on the
//! public port; the admin and service tokens as separate scopes; the
//! generated admin token written once to stderr, a configured one never.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{
    TestApp, clean_env, die_with_the_test, get_from, read_to_close, ready, socket_from,
};

const ADMIN: &str = "admin-token-for-listener-tests-0123";
const SERVICE: &str = "service-token-for-listener-tests-01";

/// The operator paths, as (method, path, body).
const OPERATOR_ROUTES: [(&str, &str, Option<&str>); 8] = [
    ("GET", "/metrics", None),
    ("GET", "/api/admin/queues", None),
    ("POST", "/api/admin/queues/default/pause", None),
    ("POST", "/api/admin/queues/default/resume", None),
    ("PUT", "/api/admin/products/demo-sneaker", Some("{}")),
    ("POST", "/api/tokens/claim", Some("{}")),
    ("POST", "/api/tokens/consume", Some("{}")),
    ("POST", "/api/tokens/release", Some("{}")),
];

async fn send(
    app: &TestApp,
    url: String,
    method: &str,
    body: Option<&str>,
    bearer: Option<&str>,
) -> (u16, Value) {
    let mut req = app
        .client
        .request(method.parse().unwrap(), url)
        .header("content-type", "application/json");
    if let Some(b) = body {
        req = req.body(b.to_owned());
    }
    if let Some(t) = bearer {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The public port knows nothing of the operator paths, with or without
/// the right bearer: the same JSON `404` as any unknown path. The
/// operator port serves them, and none of the buyers' paths.
#[tokio::test]
async fn operator_paths_live_only_on_the_operator_listener() {
    let app = TestApp::memory(&["--admin-token", ADMIN, "--service-token", SERVICE]).await;
    assert_ne!(app.addr.port(), app.admin_addr.port());
    for (method, path, body) in OPERATOR_ROUTES {
        for bearer in [None, Some(ADMIN), Some(SERVICE)] {
            let (status, json) = send(&app, app.url(path), method, body, bearer).await;
            assert_eq!(
                (status, json["error"].as_str()),
                (404, Some("not_found")),
                "public {method} {path} with {bearer:?}"
            );
        }
        // Without a bearer the operator listener asks for one.
        let (status, json) = send(&app, app.admin_url(path), method, body, None).await;
        let expected = if path == "/metrics" { 200 } else { 401 };
        assert_eq!(status, expected, "operator {method} {path}: {json}");
    }
    let metrics = app
        .client
        .get(app.admin_url("/metrics"))
        .send()
        .await
        .unwrap();
    assert!(
        metrics
            .headers()
            .get("content-type")
            .is_some_and(|v| v.to_str().unwrap().starts_with("text/plain")),
    );
    // Admin API works on the operator listener with the admin token.
    let (status, overview) = send(
        &app,
        app.admin_url("/api/admin/queues"),
        "GET",
        None,
        Some(ADMIN),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(overview["queues"][0]["queue"], "default");
    // Buyers' paths are not served to operators.
    for (method, path) in [
        ("POST", "/api/queues/default/entries"),
        ("GET", "/api/products"),
        ("GET", "/"),
        ("GET", "/index.html"),
        ("GET", "/api/openapi.json"),
    ] {
        let (status, json) = send(&app, app.admin_url(path), method, None, None).await;
        assert_eq!(
            (status, json["error"].as_str()),
            (404, Some("not_found")),
            "operator {method} {path}"
        );
    }
    // Both answer the probes.
    assert_eq!(app.get_status("/healthz").await, 200);
    let r = app
        .client
        .get(app.admin_url("/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let admin = app.admin_addr;
    app.stop().await;
    // The operator listener shuts down with the instance.
    assert!(
        tokio::net::TcpStream::connect(admin).await.is_err(),
        "the operator port is closed after shutdown"
    );
}

/// The admin token never opens the token API and the service token never
/// opens the admin API; without `--service-token` the token API is off
/// (`404 token_api_disabled`, whatever bearer), and the queue cannot be
/// paused by an order service.
#[tokio::test]
async fn admin_and_service_tokens_are_separate_scopes() {
    let app = TestApp::memory(&[
        "--admin-token",
        ADMIN,
        "--service-token",
        SERVICE,
        "--admission-interval-ms",
        "100",
    ])
    .await;
    let token = ready(&app, "scoped").await;
    let claim = json!({"userId": "scoped", "token": token}).to_string();
    let (status, json) = send(
        &app,
        app.admin_url("/api/tokens/claim"),
        "POST",
        Some(&claim),
        Some(ADMIN),
    )
    .await;
    assert_eq!(
        (status, json["error"].as_str()),
        (401, Some("unauthorized")),
        "the admin token on the token API"
    );
    for (method, path, body) in OPERATOR_ROUTES
        .iter()
        .filter(|r| r.1.starts_with("/api/admin"))
    {
        let (status, _) = send(&app, app.admin_url(path), method, *body, Some(SERVICE)).await;
        assert_eq!(status, 401, "the service token on {method} {path}");
    }
    let (_, overview) = send(
        &app,
        app.admin_url("/api/admin/queues"),
        "GET",
        None,
        Some(ADMIN),
    )
    .await;
    assert_eq!(overview["queues"][0]["paused"], false, "nothing was paused");
    // The right token in the right place still works.
    let (status, granted) = send(
        &app,
        app.admin_url("/api/tokens/claim"),
        "POST",
        Some(&claim),
        Some(SERVICE),
    )
    .await;
    assert_eq!(status, 200, "{granted}");
    app.stop().await;

    // No --service-token: the token API is off, even to the admin token.
    let off = TestApp::memory(&["--admin-token", ADMIN]).await;
    for (method, path, body) in OPERATOR_ROUTES
        .iter()
        .filter(|r| r.1.starts_with("/api/tokens"))
    {
        for bearer in [None, Some(ADMIN), Some("anything-at-all-0123456789")] {
            let (status, json) = send(&off, off.admin_url(path), method, *body, bearer).await;
            assert_eq!(
                (status, json["error"].as_str()),
                (404, Some("token_api_disabled")),
                "{method} {path} with {bearer:?}"
            );
        }
    }
    off.stop().await;
}

/// Every path under `/api/admin/` and `/api/tokens/` asks for its token
/// first, known or not: without the right bearer, `401` (an unknown path
/// or a wrong method tells an unauthenticated caller nothing about which
/// paths exist); with it, an unknown path is `404` and a wrong method
/// `405`, as anywhere.
#[tokio::test]
async fn unknown_operator_paths_ask_for_the_token_first() {
    let app = TestApp::memory(&["--admin-token", ADMIN, "--service-token", SERVICE]).await;
    let cases: [(&str, &str, &str, u16); 9] = [
        ("GET", "/api/admin/nope", ADMIN, 404),
        ("GET", "/api/admin", ADMIN, 404),
        ("POST", "/api/admin/queues/default/nope", ADMIN, 404),
        ("GET", "/api/admin/queues/default/pause/more", ADMIN, 404),
        ("DELETE", "/api/admin/products", ADMIN, 405),
        ("POST", "/api/tokens/nope", SERVICE, 404),
        ("GET", "/api/tokens", SERVICE, 404),
        ("GET", "/api/tokens/claim", SERVICE, 405),
        ("PUT", "/api/tokens/claim/extra", SERVICE, 404),
    ];
    for (method, path, right, with_token) in cases {
        let wrong = if right == ADMIN { SERVICE } else { ADMIN };
        for bearer in [None, Some("not-a-token-of-this-instance-0123"), Some(wrong)] {
            let (status, json) = send(&app, app.admin_url(path), method, None, bearer).await;
            assert_eq!(
                (status, json["error"].as_str()),
                (401, Some("unauthorized")),
                "{method} {path} with {bearer:?}"
            );
        }
        let (status, json) = send(&app, app.admin_url(path), method, None, Some(right)).await;
        assert_eq!(status, with_token, "{method} {path} with its token: {json}");
        assert!(json["error"].is_string(), "{method} {path}: {json}");
    }
    // Other unknown paths of the operator listener are `404` to anyone.
    let (status, _) = send(&app, app.admin_url("/api/nope"), "GET", None, None).await;
    assert_eq!(status, 404);
    app.stop().await;

    // Without --service-token the token API is off, unknown paths too.
    let off = TestApp::memory(&["--admin-token", ADMIN]).await;
    let (status, json) = send(&off, off.admin_url("/api/tokens/nope"), "POST", None, None).await;
    assert_eq!(
        (status, json["error"].as_str()),
        (404, Some("token_api_disabled"))
    );
    off.stop().await;
}

/// The same token for both scopes is refused at start.
#[tokio::test]
async fn one_token_for_both_scopes_is_refused() {
    let config = crate::common::config(&["--admin-token", ADMIN, "--service-token", ADMIN]);
    let state = waitroom::App::with_store(
        config,
        crate::common::store("memory", "scopes").await,
        None,
        tokio_util::sync::CancellationToken::new(),
    )
    .await;
    let error = state.err().expect("refused").to_string();
    assert!(error.contains("--service-token"), "{error}");
}

/// The binary with `args` (no `--addr` beyond port 0), its whole stdout
/// and stderr kept.
struct Bin {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Bin {
    fn spawn(args: &[&str]) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_waitroom"));
        cmd.args(["--addr", "127.0.0.1:0", "--orders-db", ":memory:"])
            .args(args)
            .env("RUST_LOG", "warn,waitroom=info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        clean_env(&mut cmd);
        die_with_the_test(&mut cmd);
        let mut child = cmd.spawn().expect("spawn waitroom");
        let keep = |stream: Box<dyn std::io::Read + Send>| {
            let lines = Arc::new(Mutex::new(Vec::new()));
            let kept = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    kept.lock().unwrap().push(line);
                }
            });
            lines
        };
        let stdout = keep(Box::new(child.stdout.take().unwrap()));
        let stderr = keep(Box::new(child.stderr.take().unwrap()));
        Self {
            child,
            stdout,
            stderr,
        }
    }

    /// The `addr=` of the first stderr line containing `what`, once logged.
    async fn logged_addr(&mut self, what: &str) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(addr) = self.stderr.lock().unwrap().iter().find_map(|l| {
                l.contains(what)
                    .then(|| {
                        l.split_whitespace()
                            .find_map(|w| w.strip_prefix("addr="))
                            .map(str::to_owned)
                    })
                    .flatten()
            }) {
                return Ok(addr);
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited {status}: {:?}", self.stderr()));
            }
            if Instant::now() > deadline {
                return Err(format!("not logged: {:?}", self.stderr()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    fn stdout(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }
}

impl Drop for Bin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// With `--admin-addr` unset an instance takes 127.0.0.1:9090, or, when
/// that is taken (here: by the test itself, or by anything else), a free
/// loopback port that it logs; so two instances on one host start with the
/// defaults. An address that was set and cannot be bound stops the start.
#[tokio::test]
async fn the_default_operator_port_never_stops_a_second_instance() {
    // Hold the default port if nothing else does, so the fallback is what
    // this test sees whoever else runs on the machine.
    let _held = std::net::TcpListener::bind("127.0.0.1:9090");
    let mut first = Bin::spawn(&[]);
    let mut second = Bin::spawn(&[]);
    let client = reqwest::Client::new();
    let mut operator_ports = Vec::new();
    for bin in [&mut first, &mut second] {
        let public = bin.logged_addr("waitroom listening").await.unwrap();
        let admin = bin.logged_addr("operator listener").await.unwrap();
        assert!(admin.starts_with("127.0.0.1:"), "loopback: {admin}");
        assert_ne!(admin, "127.0.0.1:9090");
        assert!(
            bin.stderr()
                .iter()
                .any(|l| l.contains("default operator address is taken")),
            "the fallback is logged: {:?}",
            bin.stderr()
        );
        let metrics = client
            .get(format!("http://{admin}/metrics"))
            .send()
            .await
            .unwrap();
        assert_eq!(metrics.status(), 200);
        let public_metrics = client
            .get(format!("http://{public}/metrics"))
            .send()
            .await
            .unwrap();
        assert_eq!(public_metrics.status(), 404);
        operator_ports.push(admin);
    }
    assert_ne!(operator_ports[0], operator_ports[1]);

    // An explicit address that is taken is an error at start.
    let taken = operator_ports[0].clone();
    let mut refused = Bin::spawn(&["--admin-addr", &taken]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = refused.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "still running: {:?}",
            refused.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success());
    // The readers may still be draining the pipe.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = refused.stderr().join("\n");
    assert!(log.contains(&format!("--admin-addr {taken}")), "{log}");
}

/// A generated admin token is written once, to stderr, and works; a
/// configured one is written nowhere; stdout stays empty either way.
#[tokio::test]
async fn the_admin_token_is_printed_only_when_generated() {
    let mut generated = Bin::spawn(&["--admin-addr", "127.0.0.1:0"]);
    let admin = generated.logged_addr("operator listener").await.unwrap();
    let printed: Vec<String> = generated
        .stderr()
        .iter()
        .filter_map(|l| {
            l.strip_prefix("admin token (set --admin-token to choose one): ")
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(printed.len(), 1, "once: {:?}", generated.stderr());
    let token = &printed[0];
    assert!(token.len() >= 32, "{token}");
    assert!(generated.stdout().is_empty(), "{:?}", generated.stdout());
    let client = reqwest::Client::new();
    let r = client
        .get(format!("http://{admin}/api/admin/queues"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the printed token is the admin token");
    drop(generated);

    let configured = "configured-admin-token-never-printed";
    let mut quiet = Bin::spawn(&[
        "--admin-addr",
        "127.0.0.1:0",
        "--admin-token",
        configured,
        "--service-token",
        "configured-service-token-never-print",
    ]);
    let admin = quiet.logged_addr("operator listener").await.unwrap();
    let r = client
        .get(format!("http://{admin}/api/admin/queues"))
        .bearer_auth(configured)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let all: Vec<String> = quiet.stderr().into_iter().chain(quiet.stdout()).collect();
    assert!(
        all.iter()
            .all(|l| !l.contains("admin token") && !l.contains("never-print")),
        "{all:?}"
    );
    assert!(quiet.stdout().is_empty());
}

/// Product input an operator (or a leaked admin token) sends is checked
/// field by field before anything is written: `400 invalid_product` naming
/// the field, and the products as they were.
#[tokio::test]
async fn bad_product_input_is_refused_and_changes_nothing() {
    let app = TestApp::memory(&["--admin-token", ADMIN]).await;
    let products = || async {
        app.client
            .get(app.url("/api/products"))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    let before = products().await;
    let good = json!({"name": "Sneaker", "queue": "default", "priceCents": 100, "stock": 5});
    let with = |field: &str, value: Value| {
        let mut body = good.clone();
        body[field] = value;
        body
    };
    let long_id = "x".repeat(65);
    let cases: Vec<(&str, Value, &str)> = vec![
        ("demo-sneaker", with("name", json!("nul\u{0}byte")), "name:"),
        ("demo-sneaker", with("name", json!("two\nlines")), "name:"),
        (
            "demo-sneaker",
            with("name", json!("evil \u{202E}gpj.exe")),
            "name:",
        ),
        (
            "demo-sneaker",
            with("name", json!("n".repeat(16 * 1024 / 2))),
            "name:",
        ),
        ("demo-sneaker", with("name", json!("  ")), "name:"),
        (
            "demo-sneaker",
            with("priceCents", json!(i64::MAX)),
            "priceCents:",
        ),
        ("demo-sneaker", with("priceCents", json!(-1)), "priceCents:"),
        ("demo-sneaker", with("stock", json!(i64::MAX)), "stock:"),
        (
            "demo-sneaker",
            with("maxPerOrder", json!(0)),
            "maxPerOrder:",
        ),
        ("a%2Fb", good.clone(), "id:"),
        ("a%0Ab", good.clone(), "id:"),
        ("a%00b", good.clone(), "id:"),
        ("caf%C3%A9", good.clone(), "id:"),
        (&long_id, good.clone(), "id:"),
    ];
    for (id, body, field) in &cases {
        let r = app
            .client
            .put(app.admin_url(&format!("/api/admin/products/{id}")))
            .bearer_auth(ADMIN)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let json: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(
            (status, json["error"].as_str()),
            (400, Some("invalid_product")),
            "{id} {body}"
        );
        let message = json["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{id}: {message}");
    }
    assert_eq!(products().await, before, "nothing was written");
    // The same body, valid, is taken.
    let r = app
        .client
        .put(app.admin_url("/api/admin/products/demo-sneaker"))
        .bearer_auth(ADMIN)
        .json(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    app.stop().await;
}

/// An instance on the defaults (not the tests' limits-off flags) with the
/// admin and service tokens set.
async fn operator_defaults() -> TestApp {
    let config = waitroom::Config::from_args([
        "--orders-db",
        ":memory:",
        "--admin-token",
        ADMIN,
        "--service-token",
        SERVICE,
    ])
    .unwrap();
    TestApp::memory_with(config).await
}

/// Idle sockets (connected, never a byte) cannot lock operators out of
/// their listener. From one address they get at most its share, so any
/// other address is served; from many addresses they may fill every
/// ordinary slot, and then a connection over the cap is served only if
/// its request carries the admin or the service token (the reserve), any
/// other answered `503 server_busy`.
#[tokio::test]
async fn operators_reach_their_listener_through_an_idle_socket_flood() {
    let app = operator_defaults().await;
    let mut flood = Vec::new();
    for _ in 0..64 {
        flood.push(socket_from("127.0.0.21", app.admin_addr).await);
    }
    let (status, answer) = get_from("127.0.0.22", app.admin_addr, "/metrics", &[]).await;
    assert_eq!(status, 200, "another address: {answer}");
    let over = read_to_close(flood.last_mut().unwrap()).await;
    assert!(over.starts_with("HTTP/1.1 429 "), "{over}");
    drop(flood);
    app.stop().await;

    let app = operator_defaults().await;
    let mut flood = Vec::new();
    for address in 31..35 {
        for _ in 0..20 {
            flood.push(socket_from(&format!("127.0.0.{address}"), app.admin_addr).await);
        }
    }
    let bearer = format!("Bearer {ADMIN}");
    let (status, answer) = get_from(
        "127.0.0.40",
        app.admin_addr,
        "/api/admin/queues",
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 200, "the operator: {answer}");
    let service = format!("Bearer {SERVICE}");
    let (status, answer) = get_from(
        "127.0.0.41",
        app.admin_addr,
        "/api/tokens/claim",
        &[("authorization", &service)],
    )
    .await;
    // Past the reserve's door: the router's own answer (the route takes
    // POST only).
    assert_eq!(status, 405, "the order service: {answer}");
    let (status, answer) = get_from("127.0.0.42", app.admin_addr, "/metrics", &[]).await;
    assert_eq!(status, 503, "no token, over the cap: {answer}");
    assert!(answer.contains("\"error\":\"server_busy\""), "{answer}");
    let (status, answer) = get_from(
        "127.0.0.43",
        app.admin_addr,
        "/api/admin/queues",
        &[("authorization", "Bearer not-the-admin-token-0123456")],
    )
    .await;
    assert_eq!(status, 503, "a wrong token, over the cap: {answer}");
    drop(flood);
    app.stop().await;
}

/// DNS rebinding: a page on another name whose DNS now points at the
/// operator listener would reach it with that name in `Host`. Only
/// loopback names, IP literals and `--admin-hosts` are answered; any other
/// `Host` gets `421 misdirected_request` on every path, token or not.
#[tokio::test]
async fn the_operator_listener_answers_only_its_own_host_names() {
    let app = TestApp::memory(&["--admin-token", ADMIN]).await;
    let port = app.admin_addr.port();
    let send = |host: String, path: &'static str| {
        let client = app.client.clone();
        let url = app.admin_url(path);
        async move {
            let r = client
                .get(url)
                .header("host", host)
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    for host in [
        "rebind.attacker.example".to_owned(),
        format!("rebind.attacker.example:{port}"),
        format!("localhost.attacker.example:{port}"),
        format!("127.0.0.1.nip.io:{port}"),
    ] {
        for path in ["/metrics", "/api/admin/queues", "/readyz"] {
            let (status, body) = send(host.clone(), path).await;
            assert_eq!(
                (status, body["error"].as_str()),
                (421, Some("misdirected_request")),
                "{host} {path}: {body}"
            );
        }
    }
    for host in [
        format!("localhost:{port}"),
        "LocalHost".to_owned(),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        format!("10.1.2.3:{port}"),
        format!("[2001:db8::1]:{port}"),
    ] {
        for path in ["/metrics", "/api/admin/queues"] {
            let (status, _) = send(host.clone(), path).await;
            assert_eq!(status, 200, "{host} {path}");
        }
    }
    app.stop().await;

    let app = TestApp::memory(&[
        "--admin-token",
        ADMIN,
        "--admin-hosts",
        "ops.internal,Waitroom-0.Metrics.Example.",
    ])
    .await;
    let port = app.admin_addr.port();
    for (host, expected) in [
        (format!("ops.internal:{port}"), 200),
        ("OPS.INTERNAL".to_owned(), 200),
        (format!("waitroom-0.metrics.example.:{port}"), 200),
        ("waitroom-0.metrics.example".to_owned(), 200),
        (format!("localhost:{port}"), 200),
        ("other.internal".to_owned(), 421),
        ("ops.internal.attacker.example".to_owned(), 421),
    ] {
        let r = app
            .client
            .get(app.admin_url("/metrics"))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), expected, "{host}");
    }
    app.stop().await;
}
