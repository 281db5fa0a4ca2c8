//! Live queue settings through the admin API: create, read, change and
//! delete a queue with validation (a bad request changes nothing), on the
//! memory store and on Redis; two instances on one Redis following each
//! other's changes (the next pass obeys, a hold stops both, a queue opened
//! on one is joinable on the other, a deleted one is gone on both); Redis
//! down → 503.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use waitroom::queue::QueueName;
use waitroom::store::redis::RedisStore;
use waitroom::store::{EventStore, LineStore, QueueEvent, StoreEvent};

use crate::common::{RedisProcess, TestApp, config, eventually, redis_url, unique_prefix};

const ADMIN: &str = "admin-token-for-settings-tests-0123";
const BOUND: Duration = Duration::from_secs(10);

async fn send(app: &TestApp, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    send_as(app, method, path, body, Some(ADMIN)).await
}

async fn send_as(
    app: &TestApp,
    method: &str,
    path: &str,
    body: Option<&str>,
    bearer: Option<&str>,
) -> (u16, Value) {
    let mut req = app
        .client
        .request(method.parse().unwrap(), app.admin_url(path))
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

fn args() -> Vec<&'static str> {
    vec![
        "--admin-token",
        ADMIN,
        "--admission-batch",
        "3",
        "--admission-interval-ms",
        "600000",
        "--token-ttl-secs",
        "60",
    ]
}

async fn both() -> Vec<TestApp> {
    let mut apps = vec![TestApp::memory(&args()).await];
    if !crate::common::skip_redis("both stores") {
        apps.push(TestApp::redis("settings", &args()).await);
    }
    apps
}

/// The configured queue starts at the flags; a change is stored, versioned
/// and shown; a new queue starts at the flags too and is joinable at once.
#[tokio::test]
async fn queues_are_created_read_changed_and_deleted() {
    for app in both().await {
        let (code, body) = send(&app, "GET", "/api/admin/queues/default", None).await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["batch"], 3);
        assert_eq!(body["tokenTtlMs"], 60_000);
        assert_eq!(body["version"], 1);
        assert_eq!(body["paused"], false);

        let change = r#"{"batch": 7, "maxActive": 40, "texts": {"title": "Drop day"}}"#;
        let (code, body) = send(&app, "PUT", "/api/admin/queues/default", Some(change)).await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["batch"], 7);
        assert_eq!(body["maxActive"], 40);
        assert_eq!(
            body["intervalMs"], 600_000,
            "absent fields keep their value"
        );
        assert_eq!(body["texts"]["title"], "Drop day");
        assert_eq!(body["version"], 2);
        // `null` lifts the cap; absent would keep it.
        let (code, body) = send(
            &app,
            "PUT",
            "/api/admin/queues/default",
            Some(r#"{"maxActive": null}"#),
        )
        .await;
        assert_eq!(code, 200);
        assert_eq!(body["maxActive"], Value::Null);
        assert_eq!(body["batch"], 7);

        assert_eq!(app.enter("fresh", "u1").await.0, 404, "not a queue yet");
        let (code, body) = send(
            &app,
            "PUT",
            "/api/admin/queues/fresh",
            Some(r#"{"paused": true}"#),
        )
        .await;
        assert_eq!(code, 201, "{body}");
        assert_eq!(
            (body["batch"].clone(), body["paused"].clone()),
            (json!(3), json!(true))
        );
        let (code, joined) = app.enter("fresh", "u1").await;
        assert_eq!(code, 201, "{joined}");
        assert_eq!(joined["status"], "WAITING", "held: no fast track");
        let (_, overview) = send(&app, "GET", "/api/admin/queues", None).await;
        let names: Vec<&str> = overview["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["queue"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["default", "fresh"]);

        let (code, body) = send(&app, "DELETE", "/api/admin/queues/fresh", None).await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(app.enter("fresh", "u2").await.0, 404);
        let (code, body) = send(&app, "GET", "/api/admin/queues/fresh", None).await;
        assert_eq!((code, body["error"].as_str()), (404, Some("unknown_queue")));
        let (code, _) = send(&app, "DELETE", "/api/admin/queues/fresh", None).await;
        assert_eq!(code, 404, "already gone");
        // A queue of --queues would come back: refused, kept.
        let (code, body) = send(&app, "DELETE", "/api/admin/queues/default", None).await;
        assert_eq!(
            (code, body["error"].as_str()),
            (409, Some("configured_queue"))
        );
        assert_eq!(app.enter("default", "still").await.0, 201);
        app.stop().await;
    }
}

/// Every bad request is a JSON 4xx naming the problem, and changes nothing.
#[tokio::test]
async fn bad_settings_are_refused_and_change_nothing() {
    for app in both().await {
        let (_, before) = send(&app, "GET", "/api/admin/queues/default", None).await;
        let cases: &[(&str, &str, u16, &str)] = &[
            ("default", "{not json", 400, "invalid_body"),
            ("default", r#"{"batch": 0}"#, 400, "invalid_settings"),
            ("default", r#"{"batch": -1}"#, 400, "invalid_body"),
            ("default", r#"{"batch": 100001}"#, 400, "invalid_settings"),
            ("default", r#"{"batch": 1e3}"#, 400, "invalid_body"),
            ("default", r#"{"batch": "5"}"#, 400, "invalid_body"),
            ("default", r#"{"intervalMs": 0}"#, 400, "invalid_settings"),
            (
                "default",
                r#"{"intervalMs": 18446744073709551615}"#,
                400,
                "invalid_settings",
            ),
            ("default", r#"{"tokenTtlMs": 999}"#, 400, "invalid_settings"),
            (
                "default",
                r#"{"abandonAfterMs": 0}"#,
                400,
                "invalid_settings",
            ),
            (
                "default",
                r#"{"claimLeaseMs": 86400001}"#,
                400,
                "invalid_settings",
            ),
            (
                "default",
                r#"{"maxActive": 100000001}"#,
                400,
                "invalid_settings",
            ),
            ("default", r#"{"rate": 5}"#, 400, "invalid_body"),
            (
                "default",
                r#"{"texts": {"bad key": "x"}}"#,
                400,
                "invalid_settings",
            ),
            (
                "default",
                r#"{"texts": {"t": "a\u0000b"}}"#,
                400,
                "invalid_settings",
            ),
            ("default", r#"{"texts": {"t": 5}}"#, 400, "invalid_body"),
            (
                "default",
                r#"{"paused": true, "batch": 0}"#,
                400,
                "invalid_settings",
            ),
            ("Bad-Name", r#"{"batch": 2}"#, 400, "invalid_queue_name"),
            ("a%7Bb%7D", r#"{"batch": 2}"#, 400, "invalid_queue_name"),
        ];
        for (queue, body, status, error) in cases {
            let path = format!("/api/admin/queues/{queue}");
            let (code, answer) = send(&app, "PUT", &path, Some(body)).await;
            assert_eq!(code, *status, "{body}: {answer}");
            assert_eq!(answer["error"], *error, "{body}: {answer}");
            assert!(answer["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
        let huge = format!(r#"{{"texts": {{"t": "{}"}}}}"#, "x".repeat(20_000));
        let (code, _) = send(&app, "PUT", "/api/admin/queues/default", Some(&huge)).await;
        assert_eq!(code, 413);
        let (_, after) = send(&app, "GET", "/api/admin/queues/default", None).await;
        assert_eq!(before, after, "nothing changed");
        let (code, _) = send(&app, "GET", "/api/admin/queues/bad-name", None).await;
        assert_eq!(code, 404);
        app.stop().await;
    }
}

/// No token or a wrong one: 401 before anything else is looked at, on
/// every method; nothing changes.
#[tokio::test]
async fn settings_need_the_admin_token() {
    let app = TestApp::memory(&args()).await;
    for bearer in [None, Some("wrong"), Some("")] {
        for (method, body) in [
            ("GET", None),
            ("PUT", Some(r#"{"batch": 9}"#)),
            ("PUT", Some("{garbage")),
            ("DELETE", None),
        ] {
            for queue in ["default", "nosuch", "BAD"] {
                let path = format!("/api/admin/queues/{queue}");
                let (code, answer) = send_as(&app, method, &path, body, bearer).await;
                assert_eq!(
                    (code, answer["error"].as_str()),
                    (401, Some("unauthorized"))
                );
            }
        }
    }
    let (_, body) = send(&app, "GET", "/api/admin/queues/default", None).await;
    assert_eq!(
        (body["batch"].clone(), body["version"].clone()),
        (json!(3), json!(1))
    );
    // The public listener does not serve it at all.
    let r = app
        .client
        .get(app.url("/api/admin/queues/default"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    app.stop().await;
}

/// Two instances on one Redis: a batch change on A governs every pass
/// after it, B's included (counted from the store's own pass events); a
/// hold on A stops B; a queue opened on A is joinable on B, and gone on B
/// once A deletes it.
#[tokio::test]
async fn two_instances_follow_each_others_changes() {
    crate::needs_redis!();
    let prefix = unique_prefix("settings2");
    let mut flags: Vec<&str> = args();
    flags.extend([
        "--key-prefix",
        &prefix,
        "--ticket-secret",
        "settings-two-instances-secret-01",
    ]);
    let store = || async { Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap()) };
    let watcher = store().await;
    let a = TestApp::spawn_with(config(&flags), store().await).await;
    let b = TestApp::spawn_with(config(&flags), store().await).await;
    let queue = QueueName::parse("default").unwrap();
    let mut events = watcher.subscribe(std::slice::from_ref(&queue));

    // Held while 120 join through both, so all of them wait.
    let (code, _) = send(
        &a,
        "PUT",
        "/api/admin/queues/default",
        Some(r#"{"paused": true}"#),
    )
    .await;
    assert_eq!(code, 200);
    for i in 0..120 {
        let app = if i % 2 == 0 { &a } else { &b };
        assert_eq!(app.enter("default", &format!("w{i:03}")).await.0, 201);
    }
    // Passes every 100 ms of up to 6, then of 1 from the next pass on.
    let (code, _) = send(
        &a,
        "PUT",
        "/api/admin/queues/default",
        Some(r#"{"batch": 6, "intervalMs": 100, "paused": false}"#),
    )
    .await;
    assert_eq!(code, 200);
    // (Two instances share the budget of 6 per 100 ms: a pass admits what
    // the other left, so only "more than the next batch" is certain.)
    tokio::time::timeout(BOUND, async {
        while admitted_in_next_pass(&mut events)
            .await
            .expect("events flow")
            .1
            <= 1
        {}
    })
    .await
    .expect("a pass of more than one");
    let (code, _) = send(
        &a,
        "PUT",
        "/api/admin/queues/default",
        Some(r#"{"batch": 1}"#),
    )
    .await;
    assert_eq!(code, 200);
    let changed_at = watcher.stats(&queue).await.unwrap().pass;
    // Only B passes from now on.
    a.stop().await;
    let mut after = Vec::new();
    while after.len() < 8 {
        let (pass, n) = tokio::time::timeout(BOUND, admitted_in_next_pass(&mut events))
            .await
            .expect("B keeps passing")
            .expect("events flow");
        if pass > changed_at {
            after.push(n);
        }
    }
    assert!(
        after.iter().all(|&n| n <= 1),
        "passes after the change: {after:?}"
    );
    assert!(after.iter().sum::<usize>() >= 4, "B admits on: {after:?}");

    // A hold made on a third instance stops B at once.
    let c = TestApp::spawn_with(config(&flags), store().await).await;
    let (code, _) = send(
        &c,
        "PUT",
        "/api/admin/queues/default",
        Some(r#"{"paused": true}"#),
    )
    .await;
    assert_eq!(code, 200);
    let held_at = watcher.stats(&queue).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let later = watcher.stats(&queue).await.unwrap();
    assert_eq!(later.waiting, held_at.waiting, "nobody admitted while held");
    assert!(later.pass > held_at.pass, "passes still run");

    // A queue opened on C is joinable on B within the bound, then deleted.
    assert_eq!(b.enter("popup", "p1").await.0, 404);
    let (code, _) = send(&c, "PUT", "/api/admin/queues/popup", Some("{}")).await;
    assert_eq!(code, 201);
    eventually(BOUND, "the new queue on B", || async {
        (b.enter("popup", "p1").await.0 == 201).then_some(())
    })
    .await;
    let (code, _) = send(&c, "DELETE", "/api/admin/queues/popup", None).await;
    assert_eq!(code, 200);
    eventually(BOUND, "the deleted queue gone on B", || async {
        let (code, body) = b.enter("popup", "p2").await;
        (code == 404 && body["error"] == "unknown_queue").then_some(())
    })
    .await;
    b.stop().await;
    c.stop().await;
}

/// The pass number and how many it admitted, of the next pass event
/// (`None` when the subscription ended).
async fn admitted_in_next_pass(
    events: &mut futures::stream::BoxStream<'static, StoreEvent>,
) -> Option<(u64, usize)> {
    loop {
        match events.next().await? {
            StoreEvent::Queue {
                event: QueueEvent::Pass(p),
                ..
            } => return Some((p.pass, p.admitted.len())),
            _ => continue,
        }
    }
}

/// Redis away: reads and writes of settings are 503 `store_unavailable`;
/// the instance keeps serving what it knew once Redis is back.
#[tokio::test]
async fn settings_fail_closed_while_redis_is_down() {
    let mut redis = RedisProcess::start(false);
    let store = Arc::new(
        RedisStore::connect(&redis.url(), "settings-down")
            .await
            .unwrap(),
    );
    let app = TestApp::spawn_with(config(&args()), store).await;
    let (code, _) = send(&app, "PUT", "/api/admin/queues/other", Some("{}")).await;
    assert_eq!(code, 201);
    redis.kill();
    for (method, path, body) in [
        ("GET", "/api/admin/queues/default", None),
        ("PUT", "/api/admin/queues/default", Some(r#"{"batch": 2}"#)),
        ("PUT", "/api/admin/queues/newer", Some("{}")),
        ("DELETE", "/api/admin/queues/other", None),
    ] {
        let (code, answer) = send(&app, method, path, body).await;
        assert_eq!(
            (code, answer["error"].as_str()),
            (503, Some("store_unavailable")),
            "{method} {path}"
        );
    }
    // Bad input is still refused as such, before the store is asked.
    let (code, _) = send(&app, "PUT", "/api/admin/queues/default", Some("{bad")).await;
    assert_eq!(code, 400);
    redis.restart(); // empty: the configured queue is seeded again
    eventually(BOUND, "the configured queue back", || async {
        let (code, body) = send(&app, "GET", "/api/admin/queues/default", None).await;
        (code == 200 && body["batch"] == 3).then_some(())
    })
    .await;
    assert_eq!(app.enter("default", "after").await.0, 201);
    app.stop().await;
}
