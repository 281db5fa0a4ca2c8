//! Presence: who keeps a place while absent buyers are dropped. A poll
//! writes no presence in its store call; the instance notes the buyer and
//! its presence loop marks them seen with the streaming buyers, in one
//! write per queue, at the pace of that queue's abandonment window as it
//! is now (an operator may shorten it mid-sale).

use std::time::Duration;

use crate::common::{SseStream, TestApp};

const ADMIN: &str = "admin-token-for-presence-tests-0123";
const SECS: Duration = Duration::from_secs(1);

async fn ticket(app: &TestApp, user: &str) -> String {
    let (code, body) = app.enter("default", user).await;
    assert!(code == 201 || code == 200, "{code} {body}");
    body["ticket"].as_str().unwrap().to_owned()
}

/// Both stores, each serving `args` plus a fast-track holder's settings:
/// one token holder at most, held for a minute, so nobody is admitted and
/// only presence decides who stays.
async fn apps(tag: &str, args: &[&str]) -> Vec<TestApp> {
    let mut all = vec![
        "--admission-interval-ms",
        "200",
        "--admission-batch",
        "1",
        "--max-active",
        "1",
        "--token-ttl-secs",
        "60",
    ];
    all.extend_from_slice(args);
    let mut apps = vec![TestApp::memory(&all).await];
    if !crate::common::skip_redis("presence") {
        apps.push(TestApp::redis(tag, &all).await);
    }
    apps
}

/// Polls `ticket` every `every` for `total`; each poll must find them
/// waiting.
async fn keep_polling(app: &TestApp, ticket: &str, every: Duration, total: Duration) {
    let started = std::time::Instant::now();
    while started.elapsed() < total {
        let (code, body) = app.position("default", ticket).await;
        assert_eq!(
            (code, body["status"].as_str()),
            (200, Some("WAITING")),
            "{body}"
        );
        tokio::time::sleep(every).await;
    }
}

#[tokio::test]
async fn a_polling_buyer_keeps_the_place_and_a_silent_one_is_dropped() {
    for app in apps("presence-poll", &["--abandon-after-secs", "1"]).await {
        ticket(&app, "holder").await; // the fast track: maxActive is full
        let polling = ticket(&app, "polling").await;
        let silent = ticket(&app, "silent").await;
        keep_polling(
            &app,
            &polling,
            Duration::from_millis(300),
            Duration::from_millis(2500),
        )
        .await;
        let (code, body) = app.position("default", &silent).await;
        assert_eq!(
            (code, body["error"].as_str()),
            (401, Some("ticket_ended")),
            "the silent buyer was dropped: {body}"
        );
        let (_, body) = app.position("default", &polling).await;
        assert_eq!(
            (body["status"].as_str(), body["rank"].as_u64()),
            (Some("WAITING"), Some(0))
        );
        app.stop().await;
    }
}

/// Abandonment turned on for a queue mid-sale, shorter than the presence
/// pace the instance started with: streaming and polling buyers keep
/// their places from the setting's next reload on.
#[tokio::test]
async fn a_window_shortened_mid_sale_keeps_present_buyers() {
    for app in apps(
        "presence-window",
        &["--abandon-after-secs", "600", "--admin-token", ADMIN],
    )
    .await
    {
        let r = app
            .client
            .put(app.admin_url("/api/admin/queues/default"))
            .bearer_auth(ADMIN)
            .header("content-type", "application/json")
            .body(r#"{"abandonAfterMs": 1500}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
        ticket(&app, "holder").await;
        let streaming = ticket(&app, "streaming").await;
        let polling = ticket(&app, "polling").await;
        let silent = ticket(&app, "silent").await;
        let mut stream = SseStream::open(&app, "default", &streaming, None).await;
        assert_eq!(stream.next(SECS).await.unwrap().event, "waiting");
        keep_polling(
            &app,
            &polling,
            Duration::from_millis(300),
            Duration::from_secs(4),
        )
        .await;
        let (code, body) = app.position("default", &silent).await;
        assert_eq!(
            (code, body["error"].as_str()),
            (401, Some("ticket_ended")),
            "{body}"
        );
        for (who, t) in [("streaming", &streaming), ("polling", &polling)] {
            let (code, body) = app.position("default", t).await;
            assert_eq!(
                (code, body["status"].as_str()),
                (200, Some("WAITING")),
                "{who} kept the place: {body}"
            );
        }
        drop(stream);
        app.stop().await;
    }
}
