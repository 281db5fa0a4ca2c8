//! The operator console's server side: the page only on the operator
//! listener, the live feed behind the admin token (never in a URL), what
//! the feed reports, and the Grafana dashboard reading only documented
//! metrics.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

use std::sync::Arc;

use waitroom::store::SharedStore;
use waitroom::store::memory::MemoryStore;

use crate::common::{SseStream, TestApp, config};

const ADMIN: &str = "admin-token-for-console-tests-01234";

/// The console's files are served on the operator listener, not the
/// public one, with the strict CSP; the page itself carries no secret.
#[tokio::test]
async fn the_console_page_is_served_on_the_operator_listener_only() {
    let app = TestApp::memory(&["--admin-token", ADMIN]).await;
    for (path, kind) in [
        ("/admin", "text/html"),
        ("/admin/", "text/html"),
        ("/admin/admin.js", "javascript"),
        ("/admin/admin.css", "text/css"),
    ] {
        let r = app.client.get(app.admin_url(path)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
        let headers = r.headers().clone();
        assert!(
            headers["content-type"].to_str().unwrap().contains(kind),
            "{path}"
        );
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self'"), "{csp}");
        let body = r.text().await.unwrap();
        assert!(!body.contains(ADMIN));
        let public = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(public.status().as_u16(), 404, "public {path}");
    }
    let public = app
        .client
        .get(app.url("/admin/index.html"))
        .send()
        .await
        .unwrap();
    assert_eq!(public.status().as_u16(), 404);
    let r = app
        .client
        .get(app.admin_url("/admin/nothing.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    app.stop().await;
}

/// Reads the feed's events until one satisfies `done`.
async fn snapshot_where(app: &TestApp, done: impl Fn(&Value) -> bool) -> Value {
    let r = app
        .client
        .get(app.admin_url("/api/admin/events"))
        .bearer_auth(ADMIN)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut body = r.bytes_stream();
    let mut buffer = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .expect("a matching snapshot in time")
            .expect("the feed stays open")
            .unwrap();
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let frame: String = buffer.drain(..end + 2).collect();
            assert!(frame.starts_with("event: snapshot\ndata: "), "{frame}");
            let data = frame
                .trim_end()
                .trim_start_matches("event: snapshot\ndata: ");
            let snapshot: Value = serde_json::from_str(data).unwrap();
            if done(&snapshot) {
                return snapshot;
            }
        }
    }
}

fn queue<'a>(snapshot: &'a Value, name: &str) -> &'a Value {
    snapshot["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == name)
        .unwrap_or_else(|| panic!("{name} in {snapshot}"))
}

/// The feed needs the admin token in the header (a query parameter is no
/// way in), and reports what the store holds: waiting, holders, the hold,
/// the settings, admissions heard of.
#[tokio::test]
async fn the_feed_needs_the_token_and_reports_the_queues() {
    let app = TestApp::memory(&[
        "--admin-token",
        ADMIN,
        "--admission-interval-ms",
        "100",
        "--admission-batch",
        "2",
        "--max-active",
        "3",
    ])
    .await;
    for bearer in [None, Some("wrong")] {
        let mut req = app.client.get(app.admin_url("/api/admin/events"));
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        assert_eq!(req.send().await.unwrap().status().as_u16(), 401);
    }
    let r = app
        .client
        .get(app.admin_url(&format!("/api/admin/events?token={ADMIN}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "never a token in the URL");

    let mut fast = 0;
    for i in 0..10 {
        let (code, body) = app.enter("default", &format!("f{i}")).await;
        assert_eq!(code, 201);
        fast += u64::from(body["status"] == "READY");
    }
    // Three hold tokens (maxActive): those of the fast track (how many
    // depends on the budget's refill while they joined), and passes
    // admitted the rest; seven wait.
    assert!((1..=3).contains(&fast), "{fast} on the fast track");
    let s = snapshot_where(&app, |s| {
        let q = queue(s, "default");
        q["active"] == 3 && q["admittedSeen"] == 3 - fast
    })
    .await;
    let q = queue(&s, "default");
    assert_eq!(q["waiting"], 7, "{q}");
    assert_eq!(q["paused"], false);
    assert_eq!(q["settings"]["batch"], 2);
    assert_eq!(q["settings"]["maxActive"], 3);
    assert!(q["waitForLastSecs"].is_null() || q["waitForLastSecs"].is_u64());
    assert!(s["maxStreams"].as_u64().unwrap() > 0);
    let me = s["instance"].as_str().unwrap();
    assert!(
        s["instances"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["instance"] == me),
        "{s}"
    );
    for k in ["ordersCommitted", "tokensReleased", "errors", "streamsOpen"] {
        assert!(s[k].is_u64(), "{k} in {s}");
    }
    // A hold and a new queue show up in the feed.
    let r = app
        .client
        .put(app.admin_url("/api/admin/queues/second"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"paused": true, "batch": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let s = snapshot_where(&app, |s| {
        s["queues"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["queue"] == "second")
    })
    .await;
    let second = queue(&s, "second");
    assert_eq!(
        (
            second["paused"].clone(),
            second["settings"]["batch"].clone()
        ),
        (Value::Bool(true), 4.into())
    );
    app.stop().await;
}

/// Each instance reports its streams to the store: the console of one
/// instance shows the streams open on another.
#[tokio::test]
async fn the_feed_shows_the_streams_of_every_instance() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let args = [
        "--admin-token",
        ADMIN,
        "--ticket-secret",
        "console-two-instances-secret-0123",
    ];
    let a = TestApp::spawn_with(config(&args), store.clone()).await;
    let b = TestApp::spawn_with(config(&args), store.clone()).await;
    a.enter("default", "first").await; // the fast track; the next one waits
    let (_, waiting) = b.enter("default", "streamer").await;
    let _stream = SseStream::open(&b, "default", waiting["ticket"].as_str().unwrap(), None).await;
    let b_id = b.state.instance().to_owned();
    let s = snapshot_where(&a, |s| {
        s["instances"].as_array().is_some_and(|all| {
            all.iter()
                .any(|i| i["instance"] == b_id.as_str() && i["streams"] == 1)
        })
    })
    .await;
    let all = s["instances"].as_array().unwrap();
    assert_eq!(all.len(), 2, "{s}");
    assert_eq!(s["streamsOpen"], 0, "none on A itself");
    a.stop().await;
    b.stop().await;
}

/// Every metric the dashboard queries is one the README documents.
#[test]
fn the_dashboard_reads_documented_metrics() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dashboard = std::fs::read_to_string(format!("{root}/docs/grafana/waitroom.json")).unwrap();
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let parsed: Value = serde_json::from_str(&dashboard).unwrap();
    assert!(!parsed["panels"].as_array().unwrap().is_empty());
    let names = |text: &str| -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for (i, _) in text.match_indices("waitroom_") {
            let name: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            out.insert(name.trim_end_matches("_bucket").to_owned());
        }
        out
    };
    let documented = names(&readme);
    let used = names(&dashboard);
    assert!(used.len() >= 10, "{used:?}");
    let missing: Vec<&String> = used.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "undocumented metrics in the dashboard: {missing:?}"
    );
}
