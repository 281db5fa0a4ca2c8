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

use crate::common::{SseStream, TestApp, config, eventually};

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
    // admitted the rest; seven wait. Every admission counts, on either
    // path.
    assert!((1..=3).contains(&fast), "{fast} on the fast track");
    let s = snapshot_where(&app, |s| {
        let q = queue(s, "default");
        q["active"] == 3 && q["admittedSeen"] == 3
    })
    .await;
    assert_eq!(
        queue(&s, "default")["admittedByPath"],
        serde_json::json!({"pass": 3 - fast, "fastTrack": fast})
    );
    assert_eq!(queue(&s, "default")["state"], "full", "maxActive holders");
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

/// Every metric the dashboard queries is one the operating guide documents.
#[test]
fn the_dashboard_reads_documented_metrics() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dashboard = std::fs::read_to_string(format!("{root}/docs/grafana/waitroom.json")).unwrap();
    let guide = std::fs::read_to_string(format!("{root}/docs/operating.md")).unwrap();
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
    let documented = names(&guide);
    let used = names(&dashboard);
    assert!(used.len() >= 10, "{used:?}");
    let missing: Vec<&String> = used.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "undocumented metrics in the dashboard: {missing:?}"
    );
}

/// `GET` (or another method) of an admin path with the admin token: (status, body).
async fn admin(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = app
        .client
        .request(method, app.admin_url(path))
        .bearer_auth(ADMIN);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

/// The audit log's entries of `kind` in `queue`.
async fn audited(app: &TestApp, queue: &str, kind: &str) -> Vec<Value> {
    let path = format!("/api/admin/queues/{queue}/audit?kind={kind}&limit=1000");
    let (code, page) = admin(app, reqwest::Method::GET, &path, None).await;
    assert_eq!(code, 200, "{page}");
    page["entries"].as_array().unwrap().clone()
}

/// Buyers admitted on the fast track are admissions like any other: the
/// feed counts them, by path, as the audit log has them, and the observed
/// rate is theirs (not the configured rate, nor zero).
#[tokio::test]
async fn fast_track_admissions_are_counted_by_path() {
    fast_track_counted(TestApp::memory(FAST_TRACK_ARGS).await).await;
}

/// The same on Redis, whose join script announces each fast track.
#[tokio::test]
async fn fast_track_admissions_are_counted_by_path_on_redis() {
    crate::needs_redis!();
    fast_track_counted(TestApp::redis("console-ft", FAST_TRACK_ARGS).await).await;
}

const FAST_TRACK_ARGS: &[&str] = &[
    "--admin-token",
    ADMIN,
    "--admission-batch",
    "20",
    "--admission-interval-ms",
    "600000",
];

async fn fast_track_counted(app: TestApp) {
    for i in 0..12 {
        let (code, body) = app.enter("default", &format!("ft{i}")).await;
        assert_eq!((code, body["status"].as_str()), (201, Some("READY")));
    }
    let s = snapshot_where(&app, |s| queue(s, "default")["admittedSeen"] == 12).await;
    let q = queue(&s, "default");
    assert_eq!(q["admittedByPath"]["fastTrack"], 12, "{q}");
    assert_eq!(q["admittedByPath"]["pass"], 0, "{q}");
    assert_eq!(q["active"], 12);
    let rate = q["observedRate"].as_f64().unwrap();
    assert!(rate > 0.0 && rate <= 12.0, "{rate}");
    // The audit log: twelve admissions, none by a pass.
    let admitted = audited(&app, "default", "admitted").await;
    assert_eq!(admitted.len(), 12);
    assert!(admitted.iter().all(|e| e["pass"].is_null()));
    app.stop().await;
}

/// Orders settled through the token API are the queue's orders too: the
/// feed counts the consume and the release, as the audit log has them.
#[tokio::test]
async fn token_api_settles_show_in_the_feed() {
    const SERVICE: &str = "console-service-token-0123456789ab";
    let app = TestApp::memory(&[
        "--admin-token",
        ADMIN,
        "--service-token",
        SERVICE,
        "--queues",
        "default,tokapi",
        "--admission-batch",
        "5",
        "--admission-interval-ms",
        "600000",
    ])
    .await;
    let mut claims = Vec::new();
    for user in ["c0", "c1"] {
        let (_, body) = app.enter("tokapi", user).await;
        let token = body["entryToken"].as_str().expect("the fast track");
        let r = app
            .client
            .post(app.admin_url("/api/tokens/claim"))
            .bearer_auth(SERVICE)
            .json(&serde_json::json!({"userId": user, "token": token, "queue": "tokapi"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let claim: Value = r.json().await.unwrap();
        claims.push((user, claim["claimId"].as_str().unwrap().to_owned()));
    }
    for ((user, claim), how) in claims.iter().zip(["consume", "release"]) {
        let r = app
            .client
            .post(app.admin_url(&format!("/api/tokens/{how}")))
            .bearer_auth(SERVICE)
            .json(&serde_json::json!({"userId": user, "queue": "tokapi", "claimId": claim}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 204, "{how}");
    }
    let s = snapshot_where(&app, |s| {
        let q = queue(s, "tokapi");
        q["ordersCommitted"] == 1 && q["tokensReleased"] == 1
    })
    .await;
    assert!(s["ordersCommitted"].as_u64().unwrap() >= 1, "{s}");
    assert!(s["tokensReleased"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(audited(&app, "tokapi", "consumed").await.len(), 1);
    assert_eq!(audited(&app, "tokapi", "released").await.len(), 1);
    app.stop().await;
}

/// Stock that lets nobody in shows as such, in units and in buyers, not
/// as "admitting".
#[tokio::test]
async fn stock_that_blocks_admission_is_shown() {
    let app = TestApp::memory(&[
        "--admin-token",
        ADMIN,
        "--admission-batch",
        "10",
        "--admission-interval-ms",
        "100",
    ])
    .await;
    let (code, _) = admin(
        &app,
        reqwest::Method::PUT,
        "/api/admin/queues/default/stock",
        Some(serde_json::json!({"remaining": 4, "maxPerBuyer": 2})),
    )
    .await;
    assert_eq!(code, 200);
    for i in 0..3 {
        app.enter("default", &format!("s{i}")).await;
    }
    let s = snapshot_where(&app, |s| queue(s, "default")["state"] == "stockBlocked").await;
    let q = queue(&s, "default");
    assert_eq!(
        q["stock"],
        serde_json::json!({
            "remaining": 4, "maxPerBuyer": 2, "buyersServed": 2, "holders": 2,
            "consumedSinceReport": 0, "admissible": 0, "soldOut": false
        }),
        "{q}"
    );
    assert_eq!(q["waiting"], 1);
    // Two were admitted a moment ago, but nobody more can be: no wait.
    assert!(q["waitForLastSecs"].is_null(), "{q}");
    // Sold out is said so.
    admin(
        &app,
        reqwest::Method::PUT,
        "/api/admin/queues/default/stock",
        Some(serde_json::json!({"remaining": 0})),
    )
    .await;
    snapshot_where(&app, |s| queue(s, "default")["state"] == "soldOut").await;
    app.stop().await;
}

/// A queue that never admitted anyone observed no admissions: 0, not the
/// configured rate; and each queue's policy is its live one.
#[tokio::test]
async fn the_overview_tells_observed_rates_and_live_policies() {
    let app = TestApp::memory(&[
        "--admin-token",
        ADMIN,
        "--admission-batch",
        "50",
        "--admission-interval-ms",
        "1000",
    ])
    .await;
    let (code, _) = admin(
        &app,
        reqwest::Method::PUT,
        "/api/admin/queues/default",
        Some(serde_json::json!({"batch": 7, "intervalMs": 500, "paused": true})),
    )
    .await;
    assert_eq!(code, 200);
    app.enter("default", "held-one").await;
    let (code, o) = admin(&app, reqwest::Method::GET, "/api/admin/queues", None).await;
    assert_eq!(code, 200);
    let q = o["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "default")
        .unwrap()
        .clone();
    assert_eq!(q["observedAdmissionsPerSecond"], 0.0, "{q}");
    assert_eq!(q["policy"]["admissionBatch"], 7, "{q}");
    assert_eq!(q["policy"]["admissionIntervalMs"], 500, "{q}");
    // The policy a new queue starts from stays the start-up flags.
    assert_eq!(o["policy"]["admissionBatch"], 50);
    let s = snapshot_where(&app, |s| queue(s, "default")["waiting"] == 1).await;
    let q = queue(&s, "default");
    assert_eq!(
        (q["observedRate"].as_f64(), q["state"].as_str()),
        (Some(0.0), Some("held"))
    );
    assert!(q["waitForLastSecs"].is_null());
    app.stop().await;
}

/// A scheduled opening's pre-queue shows in the feed: the lottery's
/// state and how many wait for its draw.
#[tokio::test]
async fn a_lottery_pre_queue_shows_in_the_feed() {
    let app = TestApp::memory(&["--admin-token", ADMIN]).await;
    let opens_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 600_000;
    let (code, body) = admin(
        &app,
        reqwest::Method::PUT,
        "/api/admin/queues/default/lottery",
        Some(serde_json::json!({"opensAt": opens_at})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    for i in 0..3 {
        let (_, body) = app.enter("default", &format!("p{i}")).await;
        assert_eq!(body["status"], "PRE_QUEUE");
    }
    let s = snapshot_where(&app, |s| queue(s, "default")["lottery"]["entries"] == 3).await;
    let q = queue(&s, "default");
    assert_eq!(q["state"], "preQueue");
    assert_eq!(q["lottery"]["state"], "scheduled");
    assert_eq!(q["lottery"]["opensAt"], opens_at);
    assert_eq!(q["waiting"], 0);
    app.stop().await;
}

/// Live texts and the shop link reach the buyer's page; a bad link is
/// refused whole and changes nothing.
#[tokio::test]
async fn live_texts_and_the_shop_link_are_served_to_the_page() {
    let app = TestApp::memory(&[
        "--admin-token",
        ADMIN,
        "--orders",
        "off",
        "--shop-url",
        "https://shop.example/buy#token={token}",
    ])
    .await;
    let page = || async {
        let r = app
            .client
            .get(app.url("/api/queues/default/page"))
            .send()
            .await
            .unwrap();
        r.json::<Value>().await.unwrap()
    };
    assert_eq!(
        page().await["shopUrl"],
        "https://shop.example/buy#token={token}"
    );
    let (code, _) = admin(
        &app,
        reqwest::Method::PUT,
        "/api/admin/queues/default",
        Some(serde_json::json!({
            "texts": {"waiting.heading": "Hang on"},
            "shopUrl": "https://other.example/q/{queue}#t={token}"
        })),
    )
    .await;
    assert_eq!(code, 200);
    let served = eventually(Duration::from_secs(5), "the live texts", || async {
        let p = page().await;
        (p["queueTexts"]["waiting.heading"] == "Hang on").then_some(p)
    })
    .await;
    assert_eq!(
        served["shopUrl"],
        "https://other.example/q/{queue}#t={token}"
    );
    for bad in [
        serde_json::json!({"shopUrl": "javascript:alert(1)", "texts": {"a": "b"}}),
        serde_json::json!({"shopUrl": "https://x.example/{user}"}),
        serde_json::json!({"shopUrl": 5}),
    ] {
        let (code, body) = admin(
            &app,
            reqwest::Method::PUT,
            "/api/admin/queues/default",
            Some(bad),
        )
        .await;
        assert_eq!(code, 400, "{body}");
    }
    let p = page().await;
    assert_eq!(p["shopUrl"], "https://other.example/q/{queue}#t={token}");
    assert_eq!(
        p["queueTexts"],
        serde_json::json!({"waiting.heading": "Hang on"})
    );
    // Removed: the flag's link again.
    admin(
        &app,
        reqwest::Method::PUT,
        "/api/admin/queues/default",
        Some(serde_json::json!({"shopUrl": null})),
    )
    .await;
    assert_eq!(
        page().await["shopUrl"],
        "https://shop.example/buy#token={token}"
    );
    app.stop().await;
}
