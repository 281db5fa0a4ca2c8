//! The queue API over HTTP: join, position, leave, errors, cookies.

use serde_json::Value;

use crate::common::{IDLE, TestApp};

async fn both(args: &[&str]) -> Vec<TestApp> {
    let mut apps = vec![TestApp::memory(args).await];
    if !crate::common::skip_redis("both stores") {
        apps.push(TestApp::redis("api", args).await);
    }
    apps
}

#[tokio::test]
async fn join_position_and_leave() {
    for app in both(IDLE).await {
        let (code, first) = app.enter("default", "alice").await;
        assert_eq!(code, 201);
        assert_eq!(first["status"], "READY", "empty queue: fast track");
        assert_eq!(first["entryToken"].as_str().unwrap().len(), 43);
        let (code, bob) = app.enter("default", "bob").await;
        assert_eq!(code, 201);
        assert_eq!(bob["status"], "WAITING");
        assert_eq!(
            (bob["rank"].as_u64(), bob["position"].as_u64()),
            (Some(0), Some(1))
        );
        assert_eq!(bob["pollingIntervalSeconds"], 1);
        assert!(bob["enteredAt"].as_str().unwrap().ends_with('Z'));
        let ticket = bob["ticket"].as_str().unwrap().to_owned();

        let (code, again) = app.enter("default", "bob").await;
        assert_eq!(code, 200);
        assert_eq!(again["rank"], 0);
        assert_eq!(again["enteredAt"], bob["enteredAt"]);

        let (code, pos) = app.position("default", &ticket).await;
        assert_eq!(code, 200);
        assert_eq!(pos["status"], "WAITING");
        assert!(pos.get("ticket").is_none());
        for field in ["entryToken", "tokenExpiresInSeconds"] {
            assert!(
                pos[field].is_null(),
                "{field} present and null while waiting"
            );
        }

        assert_eq!(app.leave("default", &ticket).await, 204);
        let (code, gone) = app.position("default", &ticket).await;
        assert_eq!(
            (code, gone["error"].as_str()),
            (401, Some("ticket_ended")),
            "a ticket ends with its place"
        );
        app.stop().await;
    }
}

#[tokio::test]
async fn ticket_cookie_is_scoped_and_accepted() {
    let app = TestApp::memory(&["--queues", "default,shoes"]).await;
    let r = app
        .client
        .post(app.url("/api/queues/shoes/entries"))
        .header("x-user-id", "carol")
        .send()
        .await
        .unwrap();
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.contains("HttpOnly"));
    assert!(cookie.contains("SameSite=Strict"));
    assert!(cookie.contains("Path=/api/queues/shoes"));
    assert!(!cookie.contains("Secure"), "plain HTTP gets no Secure flag");
    let pair = cookie.split(';').next().unwrap().to_owned();

    let by_cookie = app
        .client
        .get(app.url("/api/queues/shoes/position"))
        .header("cookie", &pair)
        .send()
        .await
        .unwrap();
    assert_eq!(by_cookie.status(), 200);
    let ticket = pair.split_once('=').unwrap().1;
    let by_query = app
        .client
        .get(app.url(&format!("/api/queues/shoes/position?ticket={ticket}")))
        .send()
        .await
        .unwrap();
    // `?ticket=` is ignored unless `--ticket-in-query` (access logs).
    assert_eq!(by_query.status(), 401);
    let body: serde_json::Value = by_query.json().await.unwrap();
    assert_eq!(body["error"], "missing_ticket");
    // A ticket for "shoes" is foreign to "default".
    let (code, body) = app.position("default", ticket).await;
    assert_eq!(code, 401);
    assert_eq!(body["error"], "foreign_ticket");

    // `X-Forwarded-Proto` is believed from trusted proxies only (this
    // peer is not one); `--cookie-secure always` is what forces Secure
    // (tests/api/client_limits.rs has the trusted-proxy cases).
    let https = app
        .client
        .post(app.url("/api/queues/default/entries"))
        .header("x-user-id", "carol")
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .unwrap();
    assert!(
        !https.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Secure")
    );
    app.stop().await;
}

async fn expect_error(r: reqwest::Response, status: u16, code: &str) {
    assert_eq!(r.status().as_u16(), status);
    let body: Value = r.json().await.expect("a JSON error body");
    assert_eq!(body["error"], code, "{body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
}

#[tokio::test]
async fn bad_input_gets_json_errors_and_changes_nothing() {
    for app in both(IDLE).await {
        let (_, first) = app.enter("default", "first").await;
        let (_, waiting) = app.enter("default", "second").await;
        let ticket = waiting["ticket"].as_str().unwrap().to_owned();
        let total_before = waiting["totalWaiting"].as_u64().unwrap();
        let post = |path: &str| app.client.post(app.url(path));

        expect_error(
            post("/api/queues/default/entries").send().await.unwrap(),
            400,
            "missing_user_id",
        )
        .await;
        for bad in ["bad user!", &"x".repeat(65), "", "ünï"] {
            // Raw bytes: a client library would refuse to send the non-ASCII
            // value as text, and the case would never reach the server.
            let value = reqwest::header::HeaderValue::from_bytes(bad.as_bytes()).unwrap();
            let r = post("/api/queues/default/entries")
                .header("x-user-id", value)
                .send()
                .await
                .unwrap();
            expect_error(r, 400, "invalid_user_id").await;
        }
        expect_error(
            post("/api/queues/default/entries")
                // Under the 16 KiB head cap (above it: 431, tests/api/transport.rs).
                .header("x-user-id", &"a".repeat(10_000))
                .send()
                .await
                .unwrap(),
            400,
            "invalid_user_id",
        )
        .await;
        expect_error(
            post("/api/queues/nope/entries")
                .header("x-user-id", "z")
                .send()
                .await
                .unwrap(),
            404,
            "unknown_queue",
        )
        .await;
        expect_error(
            post("/api/queues/NOPE/entries")
                .header("x-user-id", "z")
                .send()
                .await
                .unwrap(),
            404,
            "unknown_queue",
        )
        .await;
        expect_error(
            post("/api/queues/default/entries")
                .header("x-user-id", "garbage")
                .header("content-type", "application/json")
                .body("{not json")
                .send()
                .await
                .unwrap(),
            400,
            "invalid_body",
        )
        .await;
        expect_error(
            post("/api/queues/default/entries")
                .header("x-user-id", "huge")
                .body(vec![b'{'; 100_000])
                .send()
                .await
                .unwrap(),
            413,
            "payload_too_large",
        )
        .await;

        let get = |t: &str| {
            app.client
                .get(app.url("/api/queues/default/position"))
                .header("x-queue-ticket", t.to_owned())
                .send()
        };
        expect_error(
            get("forged.AAAAAAAAAAAAAAAAAAAAAAAA").await.unwrap(),
            401,
            "invalid_ticket",
        )
        .await;
        let mut tampered = ticket.clone();
        tampered.insert(3, 'x');
        expect_error(get(&tampered).await.unwrap(), 401, "invalid_ticket").await;
        expect_error(
            app.client
                .get(app.url("/api/queues/default/position"))
                .send()
                .await
                .unwrap(),
            401,
            "missing_ticket",
        )
        .await;
        expect_error(
            app.client
                .get(app.url("/api/queues/default/position"))
                .header("x-queue-ticket", &ticket)
                .header("x-user-id", "someone-else")
                .send()
                .await
                .unwrap(),
            401,
            "ticket_user_mismatch",
        )
        .await;
        expect_error(
            app.client
                .delete(app.url("/api/queues/default/entries/me"))
                .header("x-queue-ticket", "forged.x")
                .send()
                .await
                .unwrap(),
            401,
            "invalid_ticket",
        )
        .await;

        // Nothing changed: same line, same holder.
        let (_, pos) = app.position("default", &ticket).await;
        assert_eq!(pos["rank"], 0);
        assert_eq!(pos["totalWaiting"].as_u64(), Some(total_before));
        let (_, f) = app
            .position("default", first["ticket"].as_str().unwrap())
            .await;
        assert_eq!(f["status"], "READY");
        app.stop().await;
    }
}

#[tokio::test]
async fn an_admitted_user_turns_ready_with_the_token_position_shows() {
    crate::needs_redis!();
    let app = TestApp::redis(
        "ready",
        &["--admission-interval-ms", "100", "--admission-batch", "2"],
    )
    .await;
    let mut tickets = Vec::new();
    for i in 0..6 {
        let (_, b) = app.enter("default", &format!("w{i}")).await;
        tickets.push(b["ticket"].as_str().unwrap().to_owned());
    }
    let last = tickets.last().unwrap().clone();
    let status = crate::common::eventually(std::time::Duration::from_secs(5), "w5 READY", || {
        let app = &app;
        let last = last.clone();
        async move {
            let (_, p) = app.position("default", &last).await;
            (p["status"] == "READY").then_some(p)
        }
    })
    .await;
    assert_eq!(status["entryToken"].as_str().unwrap().len(), 43);
    let ttl = status["tokenExpiresInSeconds"].as_u64().unwrap();
    assert!((299..=300).contains(&ttl), "{ttl}");
    assert!(
        status["enteredAt"].is_string(),
        "entry time survives admission"
    );
    assert!(status["rank"].is_null());
    app.stop().await;
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let app = TestApp::memory(&[]).await;
    assert_eq!(app.get_status("/healthz").await, 200);
    assert_eq!(app.get_status("/readyz").await, 200);
    app.enter("default", "m1").await;
    let metrics = app
        .client
        .get(app.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("waitroom_enters_total"), "{metrics}");
    let page = app.client.get(app.url("/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(
        page.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    app.stop().await;
}

#[tokio::test]
async fn admin_api_shows_counts_and_requires_its_token() {
    crate::needs_redis!();
    let admin = "admin-secret-for-this-test-000";
    let app = TestApp::redis(
        "admin",
        &[
            "--admission-interval-ms",
            "600000",
            "--admission-batch",
            "1",
            "--admin-token",
            admin,
        ],
    )
    .await;
    app.enter("default", "first").await; // fast track: active
    app.enter("default", "second").await; // waits
    let url = app.admin_url("/api/admin/queues");
    assert_eq!(app.client.get(&url).send().await.unwrap().status(), 401);
    assert_eq!(
        app.client
            .get(&url)
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let r = app
        .client
        .get(&url)
        .bearer_auth(admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    let q = &body["queues"][0];
    assert_eq!(q["queue"], "default");
    assert_eq!(
        (q["waiting"].as_u64(), q["active"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(body["policy"]["admissionBatch"], 1);
    assert!(body["maxStreams"].as_u64().unwrap() > 0);
    assert_eq!(q["paused"], false);

    // Hold admission: a newcomer to an empty line no longer skips it.
    let post = |path: &str, auth: bool| {
        let mut r = app.client.post(app.admin_url(path));
        if auth {
            r = r.bearer_auth(admin);
        }
        r.send()
    };
    assert_eq!(
        post("/api/admin/queues/default/pause", false)
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        post("/api/admin/queues/nope/pause", true)
            .await
            .unwrap()
            .status(),
        404
    );
    let held: Value = post("/api/admin/queues/default/pause", true)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (held["paused"].as_bool(), held["changed"].as_bool()),
        (Some(true), Some(true))
    );
    let body: Value = app
        .client
        .get(&url)
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["queues"][0]["paused"], true);
    let resumed: Value = post("/api/admin/queues/default/resume", true)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (resumed["paused"].as_bool(), resumed["changed"].as_bool()),
        (Some(false), Some(true))
    );
    app.stop().await;
}

/// A held queue gives no fast track even when the line is empty and the
/// budget has room; resuming brings it back (the positive control).
#[tokio::test]
async fn holding_admission_stops_the_fast_track() {
    let admin = "admin-secret-for-the-hold-test";
    let args = [
        "--admission-interval-ms",
        "600000",
        "--admission-batch",
        "5",
        "--admin-token",
        admin,
    ];
    for app in both(&args).await {
        let admin_post = |path: &str| {
            app.client
                .post(app.admin_url(path))
                .bearer_auth(admin)
                .send()
        };
        let held: Value = admin_post("/api/admin/queues/default/pause")
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(held["changed"], true);
        let (code, early) = app.enter("default", "early").await;
        assert_eq!(code, 201);
        assert_eq!(early["status"], "WAITING", "held: no fast track");
        assert_eq!(early["rank"], 0);

        let resumed: Value = admin_post("/api/admin/queues/default/resume")
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(resumed["changed"], true);
        let again: Value = admin_post("/api/admin/queues/default/resume")
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(again["changed"], false, "resuming twice changes nothing");

        let ticket = early["ticket"].as_str().unwrap();
        assert_eq!(app.leave("default", ticket).await, 204);
        let (_, late) = app.enter("default", "late").await;
        assert_eq!(late["status"], "READY", "resumed: the fast track is back");
        app.stop().await;
    }
}

#[tokio::test]
async fn polling_faster_than_told_is_limited_per_buyer() {
    let app = TestApp::memory(IDLE).await;
    app.enter("default", "first").await;
    let (_, eager) = app.enter("default", "eager").await;
    let (_, calm) = app.enter("default", "calm").await;
    let eager = eager["ticket"].as_str().unwrap().to_owned();
    let mut limited = None;
    for _ in 0..30 {
        let r = app
            .client
            .get(app.url("/api/queues/default/position"))
            .header("x-queue-ticket", &eager)
            .send()
            .await
            .unwrap();
        if r.status() == 429 {
            limited = Some(r);
            break;
        }
    }
    let r = limited.expect("30 polls at once are limited");
    assert!(
        r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "rate_limited");
    // Another buyer is not affected; a repeat join shares the budget
    // (tests/api/limits.rs has the rule).
    let (code, _) = app
        .position("default", calm["ticket"].as_str().unwrap())
        .await;
    assert_eq!(code, 200);
    let (code, _) = app.enter("default", "eager").await;
    assert_eq!(code, 429);
    // The limit recovers at two polls a second.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let (code, _) = app.position("default", &eager).await;
    assert_eq!(code, 200);
    app.stop().await;
}
