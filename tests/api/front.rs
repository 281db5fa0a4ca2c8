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

    pub fn paths(&self) -> Vec<String> {
        self.requests()
            .iter()
            .map(|r| r["path"].as_str().unwrap().to_owned())
            .collect()
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
    let app = front_of(&shop, &["--admission-interval-ms", "60000"]).await;
    let answer = browse(&app, "/product/42?size=9", "ann").await;
    assert_eq!(answer.status(), 200);
    assert!(
        answer
            .headers()
            .get_all("set-cookie")
            .iter()
            .any(|c| c.to_str().unwrap().starts_with("__Host-wr_ticket")
                || c.to_str().unwrap().contains("ticket")),
        "the join's ticket comes with the page: {:?}",
        answer.headers()
    );
    let html = answer.text().await.unwrap();
    assert!(html.contains(r#"<base href="/_waitroom/">"#), "{html}");
    assert!(html.contains(r#"<meta name="waitroom-queue" content="default">"#));
    assert!(html.contains(r#"<meta name="waitroom-front" content="/product/42?size=9">"#));
    // Without scripts: the place in the HTML and a refresh.
    assert!(html.contains(r#"<noscript><meta http-equiv="refresh" content=""#), "{html}");
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
    assert_eq!(joined.status(), 200);
    assert!(shop.requests().is_empty(), "{:?}", shop.requests());
    app.stop().await;
}

#[tokio::test]
async fn programs_without_a_pass_get_503_pass_required() {
    let shop = Shop::start();
    let app = front_of(&shop, &[]).await;
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
    // Resolved, then decided on: a climb out of the prefix is a room path
    // (the waiting page), a climb into it is waitroom's own.
    let html = browse(&app, "/_waitroom/../product/7", "tr").await;
    assert_eq!(html.status(), 200);
    let html = html.text().await.unwrap();
    assert!(html.contains(r#"content="/product/7""#), "{html}");
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
    let drops = page("shop.example", "/drop/shoes").await.text().await.unwrap();
    assert!(drops.contains(r#"content="drops""#), "{drops}");
    let tickets = page("eu.tickets.example:8080", "/").await.text().await.unwrap();
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
            "[[rooms]]\nqueue = \"default\"\norigin = \"https://shop.example\"\n",
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
        assert!(stderr.contains(&format!("{}", path.display())), "{text}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
