//! A queue held by an operator, as its buyers see it: no estimate while
//! nobody is admitted (not even "any moment now" at the front), a held
//! flag to say why, and estimates after the release from the rate before
//! the hold, not one the hold decayed.

use std::time::Duration;

use serde_json::Value;

use crate::common::{SseStream, TestApp, eventually};

const ADMIN: &str = "admin-token-for-held-tests-0123456";

async fn hold(app: &TestApp, held: bool) {
    let path = if held { "pause" } else { "resume" };
    let r = app
        .client
        .post(app.admin_url(&format!("/api/admin/queues/default/{path}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// Held: the front of the line is told the queue is paused, with no
/// estimate, in polls and in the stream; released, estimates come back.
#[tokio::test]
async fn a_held_queue_gives_no_estimate_and_says_it_is_held() {
    held_front(TestApp::memory(HELD_ARGS).await).await;
}

/// The same on Redis, whose scripts read the hold with every standing.
#[tokio::test]
async fn a_held_queue_gives_no_estimate_and_says_it_is_held_on_redis() {
    crate::needs_redis!();
    held_front(TestApp::redis("held", HELD_ARGS).await).await;
}

const HELD_ARGS: &[&str] = &[
    "--admin-token",
    ADMIN,
    "--admission-batch",
    "1",
    "--admission-interval-ms",
    "200",
];

async fn held_front(app: TestApp) {
    hold(&app, true).await;
    let (code, first) = app.enter("default", "front").await;
    assert_eq!(code, 201);
    assert_eq!(first["status"], "WAITING", "no fast track while held");
    assert_eq!(first["held"], true, "{first}");
    assert!(first["estimatedWaitSeconds"].is_null(), "{first}");
    let ticket = first["ticket"].as_str().unwrap().to_owned();
    let (_, p) = app.position("default", &ticket).await;
    assert_eq!(
        (p["rank"].as_u64(), p["held"].as_bool()),
        (Some(0), Some(true)),
        "{p}"
    );
    assert!(p["estimatedWaitSeconds"].is_null(), "{p}");
    assert!(p["estimatedWaitRange"].is_null(), "{p}");

    let (_, second) = app.enter("default", "second").await;
    let mut stream =
        SseStream::open(&app, "default", second["ticket"].as_str().unwrap(), None).await;
    let event = stream
        .next(Duration::from_secs(5))
        .await
        .expect("a first event");
    assert_eq!(event.event, "waiting");
    assert_eq!(event.data["held"], true, "{:?}", event.data);
    assert!(event.data["estimatedWaitSeconds"].is_null());

    hold(&app, false).await;
    // The front is admitted; the second is told an estimate again, and no
    // longer that the queue is held.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let data: Value = loop {
        assert!(tokio::time::Instant::now() < deadline, "an estimate again");
        let Some(e) = stream.next(Duration::from_secs(2)).await else {
            continue;
        };
        if e.event == "waiting" && e.data["estimatedWaitSeconds"].is_u64() {
            break e.data;
        }
    };
    assert!(data.get("held").is_none(), "{data}");
    app.stop().await;
}

/// After a hold, the estimate comes from the rate admissions ran at before
/// it: the passes of the hold, which admitted nobody by design, do not
/// make the line look four times slower.
#[tokio::test]
async fn estimates_after_a_hold_use_the_rate_before_it() {
    let app = TestApp::memory(&[
        "--admin-token",
        ADMIN,
        "--admission-batch",
        "1",
        "--admission-interval-ms",
        "100",
        "--abandon-after-secs",
        "600",
    ])
    .await;
    let mut tickets = Vec::new();
    for i in 0..60 {
        let (_, body) = app.enter("default", &format!("b{i:02}")).await;
        tickets.push(body["ticket"].as_str().unwrap().to_owned());
    }
    // About ten passes at ten a second.
    let last = tickets.last().unwrap().clone();
    eventually(Duration::from_secs(10), "ten admitted", || {
        let last = last.clone();
        let app = &app;
        async move {
            let (_, p) = app.position("default", &last).await;
            (p["rank"].as_u64()? <= 49).then_some(())
        }
    })
    .await;
    hold(&app, true).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    hold(&app, false).await;
    // A few passes after the release, the rate is about ten a second again.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let (_, p) = app.position("default", &last).await;
    let rank = p["rank"].as_u64().unwrap();
    let eta = p["estimatedWaitSeconds"].as_u64().expect("an estimate");
    assert!(rank >= 30, "{p}");
    // At ten a second: rank / 10 s; the hold's passes counted in would
    // have made it about four times that.
    assert!(
        eta <= rank / 10 + rank / 20 + 1,
        "{eta} s for rank {rank}: {p}"
    );
    assert!(eta >= rank / 20, "{eta} s for rank {rank}: {p}");
    app.stop().await;
}
