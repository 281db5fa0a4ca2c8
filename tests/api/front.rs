//! The built-in reverse proxy (`--origin`, `[[rooms]]`, `src/front/`) in
//! front of the shop of `tests/front/origin.mjs` (Node, which logs every
//! request it receives): what reaches the shop and what never does.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{TestApp, config, config_with_file, die_with_the_test};

/// The shop, on a port of its own, logging to a file of its own.
pub struct Shop {
    pub port: u16,
    log: PathBuf,
    child: Child,
}

impl Shop {
    pub fn start() -> Self {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/front/origin.mjs");
        let log = std::env::temp_dir().join(format!(
            "waitroom-shop-{:016x}.jsonl",
            rand::random::<u64>()
        ));
        let mut cmd = Command::new("node");
        cmd.arg(&script)
            .args(["--port", "0", "--log"])
            .arg(&log)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        die_with_the_test(&mut cmd);
        let mut child = cmd.spawn().expect("node runs tests/front/origin.mjs");
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let started: Value = serde_json::from_str(&first).expect("the shop's first line");
        Self {
            port: started["listening"].as_u64().unwrap() as u16,
            log,
            child,
        }
    }

    pub fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request the shop received, in order.
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    /// Every request it received carried a pass cookie.
    pub fn all_with_pass(&self) -> bool {
        self.requests().iter().all(|r| {
            r["cookies"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c == "waitroom_pass")
        })
    }
}

impl Drop for Shop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// An instance in front of `shop`, flags as on the command line.
pub async fn front_of(shop: &Shop, args: &[&str]) -> TestApp {
    let origin = shop.origin();
    let mut all = vec!["--origin", origin.as_str()];
    all.extend_from_slice(args);
    TestApp::memory_with(config(&all)).await
}

/// A client that follows no redirect (the tests read each one).
pub fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Holds the queue's admission (the admin API), so visitors wait.
pub async fn hold(app: &TestApp, queue: &str) {
    let answer = app
        .client
        .post(app.admin_url(&format!("/api/admin/queues/{queue}/pause")))
        .bearer_auth(app.state.admin_token())
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{answer:?}");
}

/// `name=value` of each cookie an answer sets.
fn set_cookies(answer: &reqwest::Response) -> Vec<String> {
    answer
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_owned())
        .collect()
}

/// Asks for `path` as a browser of `user` until admitted: the `303` to
/// the pass endpoint under the reserved prefix, whose `303` goes back to
/// exactly `path` with the pass; returns the pass cookie
/// (`waitroom_pass=…`). Asks four times a second, past the buyer's
/// budget of requests when the wait is long (a loaded machine): a `429`
/// is waited out as its `Retry-After` says, as a browser's waiting page
/// does, for 30 s at most.
pub async fn admitted(app: &TestApp, path: &str, user: &str) -> String {
    let client = no_redirects();
    let mut jar: Vec<String> = Vec::new();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let answer = client
            .get(app.url(path))
            .header("accept", "text/html")
            .header("x-user-id", user)
            .header("cookie", jar.join("; "))
            .send()
            .await
            .unwrap();
        let set = set_cookies(&answer);
        jar.extend(set);
        if answer.status() == 303 {
            let to_pass = answer.headers()["location"].to_str().unwrap().to_owned();
            let encoded: String = form_urlencoded::byte_serialize(path.as_bytes()).collect();
            assert_eq!(
                to_pass,
                format!("/_waitroom/api/queues/default/pass?return={encoded}"),
                "on to the pass endpoint, carrying the exact URL"
            );
            let answer = client
                .get(app.url(&to_pass))
                .header("accept", "text/html")
                .header("x-user-id", user)
                .header("cookie", jar.join("; "))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 303, "{answer:?}");
            assert_eq!(answer.headers()["location"], path, "back to the exact URL");
            return set_cookies(&answer)
                .into_iter()
                .find(|c| c.starts_with("waitroom_pass="))
                .expect("the pass comes with the pass endpoint's 303");
        }
        if answer.status() == 429 {
            let wait = answer
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .unwrap_or(1);
            tokio::time::sleep(Duration::from_secs(wait.clamp(1, 5))).await;
            continue;
        }
        assert_eq!(answer.status(), 200);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("{user} was never admitted");
}

/// A browser's `GET` (it takes HTML) as `user`.
pub async fn browse(app: &TestApp, path: &str, user: &str) -> reqwest::Response {
    app.client
        .get(app.url(path))
        .header("accept", "text/html,application/xhtml+xml,*/*;q=0.8")
        .header("x-user-id", user)
        .send()
        .await
        .unwrap()
}

/// Writes `head` on a connection of its own and reads the answer's head.
pub async fn raw(app: &TestApp, head: &str) -> String {
    let mut socket = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut got = vec![0u8; 64 * 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut got))
        .await
        .expect("an answer")
        .unwrap();
    String::from_utf8_lossy(&got[..n]).into_owned()
}

#[tokio::test]
async fn a_browser_without_a_pass_gets_the_waiting_page_at_the_url_it_asked() {
    let shop = Shop::start();
    let app = front_of(&shop, &[]).await;
    hold(&app, "default").await;
    let answer = browse(&app, "/product/42?size=9", "ann").await;
    assert_eq!(answer.status(), 200);
    assert!(
        answer
            .headers()
            .get_all("set-cookie")
            .iter()
            .any(|c| c.to_str().unwrap().contains("ticket")),
        "the join's ticket comes with the page: {:?}",
        answer.headers()
    );
    let html = answer.text().await.unwrap();
    assert!(html.contains(r#"<base href="/_waitroom/">"#), "{html}");
    assert!(html.contains(r#"<meta name="waitroom-queue" content="default">"#));
    assert!(html.contains(r#"<meta name="waitroom-front" content="/product/42?size=9">"#));
    // Without scripts: the place in the HTML and a refresh.
    assert!(
        html.contains(r#"<noscript><meta http-equiv="refresh" content=""#),
        "{html}"
    );
    assert!(html.contains("number 1</strong>"), "{html}");
    // A second visitor is behind the first.
    let html = browse(&app, "/", "bob").await.text().await.unwrap();
    assert!(html.contains("number 2</strong>"), "{html}");
    // The page's own files and API answer under the prefix.
    assert_eq!(app.get_status("/_waitroom/app.js").await, 200);
    assert_eq!(app.get_status("/_waitroom/").await, 200);
    let joined = app
        .client
        .post(app.url("/_waitroom/api/queues/default/entries"))
        .header("x-user-id", "carl")
        .send()
        .await
        .unwrap();
    assert!(joined.status().is_success(), "{joined:?}");
    assert!(shop.requests().is_empty(), "{:?}", shop.requests());
    app.stop().await;
}

#[tokio::test]
async fn programs_without_a_pass_get_503_pass_required() {
    let shop = Shop::start();
    let app = front_of(&shop, &[]).await;
    hold(&app, "default").await;
    for (name, value) in [
        ("accept", "application/json"),
        ("x-requested-with", "XMLHttpRequest"),
    ] {
        let answer = app
            .client
            .get(app.url("/api/cart"))
            .header(name, value)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 503);
        assert_eq!(answer.headers()["retry-after"], "5");
        let body: Value = answer.json().await.unwrap();
        assert_eq!(body["error"], "pass_required");
    }
    // A form sent without a pass, OPTIONS, and a WebSocket upgrade: never
    // forwarded.
    let posted = app
        .client
        .post(app.url("/echo"))
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 503);
    let options = app
        .client
        .request(reqwest::Method::OPTIONS, app.url("/product/1"))
        .send()
        .await
        .unwrap();
    assert_eq!(options.status(), 503);
    let upgrade = raw(
        &app,
        "GET /ws HTTP/1.1\r\nHost: shop\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .await;
    assert!(upgrade.starts_with("HTTP/1.1 503"), "{upgrade}");
    // HEAD gets the page's head, no body.
    let head = app
        .client
        .head(app.url("/product/1"))
        .header("accept", "text/html")
        .header("x-user-id", "hd")
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 200);
    assert!(shop.requests().is_empty(), "{:?}", shop.requests());
    app.stop().await;
}

#[tokio::test]
async fn no_path_leaves_the_room_or_reaches_the_shop_around_the_check() {
    let shop = Shop::start();
    let app = front_of(&shop, &[]).await;
    hold(&app, "default").await;
    // Resolved, then decided on: a climb out of the prefix is a room path
    // (the waiting page), a climb into it is waitroom's own.
    let html = raw(
        &app,
        "GET /_waitroom/../product/7 HTTP/1.1\r\nHost: shop\r\nAccept: text/html\r\nX-User-Id: tr\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(html.starts_with("HTTP/1.1 200"), "{html}");
    assert_eq!(app.get_status("/product/../_waitroom/app.js").await, 200);
    assert_eq!(app.get_status("/x/%2e%2e/_waitroom/app.js").await, 200);
    // Two meanings, or above the root: refused.
    for path in [
        "/product%2f42",
        "/product%5c42",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/a/../../b",
        "/product/%00",
    ] {
        let answer = raw(
            &app,
            &format!("GET {path} HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(answer.contains("invalid_path"), "{path}: {answer}");
    }
    // An oversized head (a cookie of 80 KiB) is refused by the transport.
    let big = "a".repeat(80 * 1024);
    let answer = raw(
        &app,
        &format!("GET /product/1 HTTP/1.1\r\nHost: shop\r\nCookie: waitroom_pass={big}\r\n\r\n"),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(shop.requests().is_empty(), "{:?}", shop.requests());
    app.stop().await;
}

#[tokio::test]
async fn rooms_are_matched_by_host_and_prefix_and_nothing_else_is_forwarded() {
    let shop = Shop::start();
    let origin = shop.origin();
    let file = format!(
        "[admission]\nqueues = [\"drops\", \"tickets\"]\n\n\
         [[rooms]]\nmatch_host = \"shop.example\"\npath_prefix = \"/drop\"\nqueue = \"drops\"\norigin = \"{origin}\"\n\n\
         [[rooms]]\nmatch_host = \"*.tickets.example\"\nqueue = \"tickets\"\norigin = \"{origin}\"\npreserve_host = true\n"
    );
    let app = TestApp::memory_with(config_with_file(&file, &[])).await;
    hold(&app, "drops").await;
    hold(&app, "tickets").await;
    let page = |host: &'static str, path: &'static str| {
        let app = &app;
        async move {
            app.client
                .get(app.url(path))
                .header("host", host)
                .header("accept", "text/html")
                .header("x-user-id", "rm")
                .send()
                .await
                .unwrap()
        }
    };
    let drops = page("shop.example", "/drop/shoes")
        .await
        .text()
        .await
        .unwrap();
    assert!(drops.contains(r#"content="drops""#), "{drops}");
    let tickets = page("eu.tickets.example:8080", "/")
        .await
        .text()
        .await
        .unwrap();
    assert!(tickets.contains(r#"content="tickets""#), "{tickets}");
    // No room: 404, whatever X-Forwarded-Host says.
    let none = app
        .client
        .get(app.url("/drop/shoes"))
        .header("host", "other.example")
        .header("x-forwarded-host", "shop.example")
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), 404);
    assert_eq!(page("shop.example", "/dropped").await.status(), 404);
    assert!(shop.requests().is_empty(), "{:?}", shop.requests());
    app.stop().await;
}

#[test]
fn bad_rooms_exit_2_naming_the_key_and_the_file_line() {
    let dir = std::env::temp_dir().join(format!("waitroom-rooms-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        (
            "[[rooms]]\nqueue = \"default\"\norigin = \"ftp://shop.example\"\n",
            "rooms[0].origin",
        ),
        (
            "[[rooms]]\nqueue = \"default\"\norigin = \"http://127.0.0.1:3000\"\nmatch_hots = \"x\"\n",
            "match_hots",
        ),
        (
            "\n\n[[rooms]]\nqueue = \"elsewhere\"\norigin = \"http://127.0.0.1:3000\"\n",
            "rooms[0].queue",
        ),
    ];
    for (i, (text, named)) in cases.iter().enumerate() {
        let path = dir.join(format!("{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
            .arg("check")
            .arg("-c")
            .arg(&path)
            .env_clear()
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {stderr}");
        assert!(stderr.contains(named), "{text}: {stderr}");
        assert!(
            stderr.contains(&format!("{}", path.display())),
            "{text}: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_admitted_visitor_lands_back_and_browses_through_to_the_shop() {
    let shop = Shop::start();
    let app = front_of(&shop, &[]).await;
    let pass = admitted(&app, "/product/42?size=9", "ann").await;
    assert!(
        shop.requests().is_empty(),
        "nothing reached the shop before the pass"
    );
    let client = no_redirects();
    let get = |path: &str| {
        client
            .get(app.url(path))
            .header("accept", "text/html")
            .header("cookie", &pass)
    };
    let page = get("/product/42?size=9").send().await.unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(
        html.contains(r#"data-id="42""#) && html.contains("size=9"),
        "{html}"
    );
    for next in ["/product/43", "/product/44", "/"] {
        assert_eq!(get(next).send().await.unwrap().status(), 200, "{next}");
    }
    let seen = shop.requests();
    assert_eq!(seen[0]["path"], "/product/42?size=9");
    assert_eq!(seen[0]["host"], shop.origin().trim_start_matches("http://"));
    assert_eq!(seen[0]["forwarded"]["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen[0]["forwarded"]["x-forwarded-proto"], "http");
    assert_eq!(
        seen[0]["forwarded"]["x-forwarded-host"],
        app.addr.to_string()
    );

    // Hop-by-hop headers go; the client's forwarding headers are replaced.
    let headers: Value = get("/headers")
        .header("connection", "x-secret")
        .header("x-secret", "1")
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-forwarded-host", "evil.example")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(headers.get("x-secret").is_none(), "{headers}");
    assert_eq!(headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(headers["x-forwarded-host"], app.addr.to_string());

    // Bodies stream: the first chunk arrives long before the last is sent.
    let started = std::time::Instant::now();
    let mut trickle = get("/stream?chunks=4&ms=400").send().await.unwrap();
    let first = trickle.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"chunk 0"), "{first:?}");
    assert!(
        started.elapsed() < Duration::from_millis(1_000),
        "{:?}",
        started.elapsed()
    );
    let mut rest = Vec::new();
    while let Some(chunk) = trickle.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    assert!(String::from_utf8_lossy(&rest).contains("chunk 3"));
    // And up: the echo answers the first part before the second is sent.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(2);
    tx.send(Ok(b"first part\n".to_vec())).await.unwrap();
    let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut echo = client
        .post(app.url("/echo"))
        .header("cookie", &pass)
        .body(body)
        .send()
        .await
        .unwrap();
    let part = echo.chunk().await.unwrap().unwrap();
    assert_eq!(&part[..], b"first part\n");
    tx.send(Ok(b"second part\n".to_vec())).await.unwrap();
    drop(tx);
    let part = echo.chunk().await.unwrap().unwrap();
    assert_eq!(&part[..], b"second part\n");

    // HEAD and OPTIONS reach the shop with a pass.
    let options = client
        .request(reqwest::Method::OPTIONS, app.url("/product/1"))
        .header("cookie", &pass)
        .send()
        .await
        .unwrap();
    assert_eq!(options.status(), 204);
    assert!(options.headers()["allow"].to_str().unwrap().contains("GET"));
    let head = client
        .head(app.url("/product/1"))
        .header("cookie", &pass)
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 200);

    // A WebSocket with the pass: upgraded, and the echo comes back.
    let mut socket = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let handshake = format!(
        "GET /ws HTTP/1.1\r\nHost: shop\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nCookie: {pass}\r\n\r\n"
    );
    socket.write_all(handshake.as_bytes()).await.unwrap();
    let mut got = vec![0u8; 4096];
    let n = socket.read(&mut got).await.unwrap();
    let head = String::from_utf8_lossy(&got[..n]).into_owned();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | 2];
    frame.extend_from_slice(&mask);
    frame.extend(b"hi".iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    socket.write_all(&frame).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got[..n], &[0x81, 2, b'h', b'i']);

    // A forged pass is no pass.
    let forged = client
        .get(app.url("/product/1"))
        .header("accept", "application/json")
        .header(
            "cookie",
            "waitroom_pass=eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 503);
    assert!(shop.all_with_pass(), "{:?}", shop.requests());
    let upgraded = shop
        .requests()
        .iter()
        .filter(|r| r["upgrade"] == "websocket")
        .count();
    assert_eq!(upgraded, 1);
    app.stop().await;
}

#[tokio::test]
async fn an_origin_down_is_502_and_a_slow_one_504() {
    let shop = Shop::start();
    let app = front_of(&shop, &["--origin-timeout-secs", "1"]).await;
    let pass = admitted(&app, "/slow?ms=3000", "sl").await;
    let slow = app
        .client
        .get(app.url("/slow?ms=3000"))
        .header("accept", "application/json")
        .header("cookie", &pass)
        .send()
        .await
        .unwrap();
    assert_eq!(slow.status(), 504);
    let body: Value = slow.json().await.unwrap();
    assert_eq!(body["error"], "origin_timeout");
    app.stop().await;

    let nobody = format!("http://127.0.0.1:{}", crate::common::free_port());
    let app = TestApp::memory_with(config(&["--origin", &nobody])).await;
    let pass = admitted(&app, "/product/1", "dn").await;
    let down = app
        .client
        .get(app.url("/product/1"))
        .header("accept", "application/json")
        .header("cookie", &pass)
        .send()
        .await
        .unwrap();
    assert_eq!(down.status(), 502);
    let body: Value = down.json().await.unwrap();
    assert_eq!(body["error"], "origin_unreachable");
    // A browser gets a page saying so.
    let page = app
        .client
        .get(app.url("/product/1"))
        .header("accept", "text/html")
        .header("cookie", &pass)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 502);
    assert!(page.text().await.unwrap().contains("cannot be reached"));
    app.stop().await;
}

#[tokio::test]
async fn with_the_store_dead_passes_keep_working_and_nobody_new_gets_in() {
    if crate::common::skip_redis("the store dying under the proxy") {
        return;
    }
    let shop = Shop::start();
    let mut redis = crate::common::RedisProcess::start(false);
    let store = std::sync::Arc::new(
        waitroom::store::redis::RedisStore::connect(&redis.url(), "front-dies")
            .await
            .unwrap(),
    );
    let origin = shop.origin();
    let app = TestApp::spawn_with(config(&["--origin", &origin]), store).await;
    let pass = admitted(&app, "/product/1", "alive").await;
    redis.kill();
    let client = no_redirects();
    for _ in 0..3 {
        let page = client
            .get(app.url("/product/2"))
            .header("cookie", &pass)
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 200, "a live pass works without the store");
    }
    let newcomer = client
        .get(app.url("/product/2"))
        .header("accept", "text/html")
        .header("x-user-id", "late")
        .send()
        .await
        .unwrap();
    assert_eq!(newcomer.status(), 503, "nobody new gets in: fail closed");
    assert!(shop.all_with_pass(), "{:?}", shop.requests());
    app.stop().await;
}

/// `maxActive 1`, idle after 2 s, one admission every 200 ms.
const ONE_AT_A_TIME: [&str; 10] = [
    "--max-active",
    "1",
    "--admission-interval-ms",
    "200",
    "--admission-batch",
    "1",
    "--session-idle-secs",
    "2",
    "--session-max-secs",
    "60",
];

/// How many requests the shop received for exactly `path`.
fn seen_at(shop: &Shop, path: &str) -> usize {
    shop.requests().iter().filter(|r| r["path"] == path).count()
}

/// A browser's `GET` of `path` as `user` with the whole `Cookie` header
/// `cookie`, following no redirect: (status, body).
async fn visit(app: &TestApp, path: &str, user: &str, cookie: &str) -> (u16, String) {
    let answer = no_redirects()
        .get(app.url(path))
        .header("accept", "text/html")
        .header("x-user-id", user)
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    (answer.status().as_u16(), answer.text().await.unwrap())
}

fn is_waiting_page(html: &str) -> bool {
    html.contains(r#"<meta name="waitroom-queue" content="default">"#)
}

fn is_product(html: &str, id: &str) -> bool {
    html.contains(&format!(r#"data-id="{id}""#))
}

#[tokio::test]
async fn a_browsing_visitor_keeps_the_only_slot_and_going_idle_hands_it_to_the_next() {
    let shop = Shop::start();
    let app = front_of(&shop, &ONE_AT_A_TIME).await;
    one_slot_passes_from_an_idle_visitor_to_the_next(&shop, &app, &app).await;
    app.stop().await;
}

/// Two instances on one Redis: Ann browses on one, Bob waits on the other,
/// and each refuses Ann's pass by the time Bob, let in, reaches the shop.
#[tokio::test]
async fn across_instances_an_idle_visitors_slot_passes_on_only_once_every_instance_refuses_her() {
    crate::needs_redis!();
    let shop = Shop::start();
    let origin = shop.origin();
    let prefix = crate::common::unique_prefix("front-idle");
    let mut args = vec!["--origin", origin.as_str(), "--key-prefix", &prefix];
    args.extend_from_slice(&ONE_AT_A_TIME);
    let store = || async {
        std::sync::Arc::new(
            waitroom::store::redis::RedisStore::connect(&crate::common::redis_url(), &prefix)
                .await
                .unwrap(),
        )
    };
    let a = TestApp::spawn_with(config(&args), store().await).await;
    let b = TestApp::spawn_with(config(&args), store().await).await;
    one_slot_passes_from_an_idle_visitor_to_the_next(&shop, &a, &b).await;
    a.stop().await;
    b.stop().await;
}

/// Ann (on `ann_at`) holds the only slot while she browses, Bob (on
/// `bob_at`) waits; once she stops, her session idles out and Bob gets in;
/// by then her pass is refused on both instances: the slot is never
/// shared, not even for the second in which an instance has not yet read
/// her session's end.
async fn one_slot_passes_from_an_idle_visitor_to_the_next(
    shop: &Shop,
    ann_at: &TestApp,
    bob_at: &TestApp,
) {
    let ann_page = "/product/1?who=ann";
    let bob_page = "/product/2?who=bob";
    let pass = admitted(ann_at, ann_page, "ann").await;

    // Ann browses for twice the idle time: her session lives, so the only
    // slot stays hers and Bob waits on the waiting page.
    let (code, html) = visit(bob_at, bob_page, "bob", "").await;
    assert_eq!(code, 200);
    assert!(is_waiting_page(&html), "{html}");
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        let (code, html) = visit(ann_at, ann_page, "ann", &pass).await;
        assert_eq!(code, 200, "{html}");
        assert!(is_product(&html, "1"), "ann refused while browsing: {html}");
        let (code, html) = visit(bob_at, bob_page, "bob", "").await;
        assert_eq!(code, 200, "bob let on while the room is full: {html}");
        assert!(is_waiting_page(&html), "{html}");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(
        seen_at(shop, bob_page),
        0,
        "bob reached the shop while waiting"
    );

    // Ann goes idle: her session ends, Bob is admitted and reaches the shop.
    let seen_ann = seen_at(shop, ann_page);
    let bob_pass = admitted(bob_at, bob_page, "bob").await;
    let (code, html) = visit(bob_at, bob_page, "bob", &bob_pass).await;
    assert_eq!(code, 200);
    assert!(is_product(&html, "2"), "{html}");
    assert_eq!(seen_at(shop, bob_page), 1);
    // At once, on either instance, Ann's pass is refused: the waiting page
    // again, and the shop never sees her request.
    for app in [bob_at, ann_at] {
        let (code, html) = visit(app, ann_page, "ann", &pass).await;
        assert_eq!(code, 200, "{html}");
        assert!(
            is_waiting_page(&html),
            "ann's idle pass let through while bob holds the slot: {html}"
        );
    }
    assert_eq!(seen_at(shop, ann_page), seen_ann);
    assert!(shop.all_with_pass(), "{:?}", shop.requests());
}

#[tokio::test]
async fn an_operator_ends_a_session_and_the_proxy_refuses_it_within_seconds() {
    let shop = Shop::start();
    // Idle only after 30 s: nothing but the operator ends Ann's session.
    let mut args = ONE_AT_A_TIME;
    args[7] = "30";
    let app = front_of(&shop, &args).await;
    let ann_page = "/product/1?who=ann";
    let bob_page = "/product/2?who=bob";
    let pass = admitted(&app, ann_page, "ann").await;
    let (code, html) = visit(&app, bob_page, "bob", "").await;
    assert_eq!(code, 200);
    assert!(is_waiting_page(&html), "{html}");
    let (_, html) = visit(&app, ann_page, "ann", &pass).await;
    assert!(is_product(&html, "1"), "{html}");

    let token = pass.trim_start_matches("waitroom_pass=");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let id = app.state.passes().verify(token, now).unwrap().jti.clone();
    let ended = app
        .client
        .delete(app.admin_url(&format!("/api/admin/sessions/{id}")))
        .bearer_auth(app.state.admin_token())
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), 200);
    let asked = std::time::Instant::now();
    // Ann keeps clicking; within about a second (the sessions task's tick)
    // the proxy refuses her pass.
    loop {
        let (code, html) = visit(&app, ann_page, "ann", &pass).await;
        assert_eq!(code, 200, "{html}");
        if is_waiting_page(&html) {
            break;
        }
        assert!(is_product(&html, "1"), "{html}");
        assert!(
            asked.elapsed() < Duration::from_millis(2_500),
            "an ended session still let through after {:?}",
            asked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // From then on the shop never sees her.
    let seen_ann = seen_at(&shop, ann_page);
    for _ in 0..5 {
        let (_, html) = visit(&app, ann_page, "ann", &pass).await;
        assert!(is_waiting_page(&html), "{html}");
    }
    assert_eq!(seen_at(&shop, ann_page), seen_ann);
    // Her slot is Bob's.
    let bob_pass = admitted(&app, bob_page, "bob").await;
    let (_, html) = visit(&app, bob_page, "bob", &bob_pass).await;
    assert!(is_product(&html, "2"), "{html}");
    assert_eq!(seen_at(&shop, ann_page), seen_ann);
    assert!(shop.all_with_pass(), "{:?}", shop.requests());
    app.stop().await;
}

/// How a [`RawOrigin`] treats a connection after each answer.
#[derive(Clone, Copy, PartialEq)]
enum AfterAnswer {
    /// Keeps it open for the next request.
    KeepAlive,
    /// Closes it without saying so (no `Connection: close`), as an
    /// origin whose idle timeout has run out does.
    CloseSilently,
}

/// An origin of a few lines: answers every request head on a connection
/// `200 ok` (or a bodiless `204` to `/empty`), and counts connections and
/// requests.
struct RawOrigin {
    port: u16,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl RawOrigin {
    async fn start(after: AfterAnswer) -> Self {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (c, r) = (connections.clone(), requests.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let r = r.clone();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
                            match socket.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                            }
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
                        buffer.drain(..end + 4);
                        r.fetch_add(1, Ordering::SeqCst);
                        let answer: &[u8] = if head.starts_with("GET /empty ") {
                            b"HTTP/1.1 204 No Content\r\n\r\n"
                        } else {
                            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                        };
                        if socket.write_all(answer).await.is_err() {
                            return;
                        }
                        if after == AfterAnswer::CloseSilently {
                            return;
                        }
                    }
                });
            }
        });
        Self {
            port,
            connections,
            requests,
            task,
        }
    }

    fn counts(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering;
        (
            self.connections.load(Ordering::SeqCst),
            self.requests.load(Ordering::SeqCst),
        )
    }
}

impl Drop for RawOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Proxied requests reuse the connections to the origin (one request at a
/// time: one connection for all), a bodiless answer gives its connection
/// back as well, and a pooled connection the origin has closed costs
/// nothing but a new one: no request fails for it.
#[tokio::test]
async fn connections_to_the_origin_are_reused_and_closed_ones_replaced() {
    let origin = RawOrigin::start(AfterAnswer::KeepAlive).await;
    let url = format!("http://127.0.0.1:{}", origin.port);
    let app = TestApp::memory_with(config(&["--origin", &url])).await;
    let pass = admitted(&app, "/a", "alice").await;
    for i in 0..20 {
        let path = if i % 2 == 0 { "/a" } else { "/empty" };
        let answer = app
            .client
            .get(app.url(path))
            .header("cookie", &pass)
            .send()
            .await
            .unwrap();
        let expected = if i % 2 == 0 { 200 } else { 204 };
        assert_eq!(answer.status().as_u16(), expected, "request {i}");
        answer.bytes().await.unwrap();
    }
    assert_eq!(origin.counts(), (1, 20), "(connections, requests)");
    app.stop().await;

    let origin = RawOrigin::start(AfterAnswer::CloseSilently).await;
    let url = format!("http://127.0.0.1:{}", origin.port);
    let app = TestApp::memory_with(config(&["--origin", &url])).await;
    let pass = admitted(&app, "/a", "bob").await;
    for i in 0..10 {
        let answer = app
            .client
            .get(app.url("/a"))
            .header("cookie", &pass)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 200, "request {i}");
        assert_eq!(answer.text().await.unwrap(), "ok");
        // Give the close time to arrive, or not: both must work.
        if i % 2 == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(origin.counts().1, 10, "each request once");
    app.stop().await;
}
