//! Every `gone` reason the server sends reaches an open stream, with the
//! stream still open when it happens (so the server, not the client's own
//! departure, is what ends it): `abandoned`, `expired` and `consumed`.
//! (`left` and `replaced` are covered in `sse.rs`.)

use std::time::Duration;

use serde_json::json;
use waitroom::queue::{EntryToken, QueueName};

use crate::common::{SseStream, TestApp};

const WAIT: Duration = Duration::from_secs(10);

async fn both(args: &[&str]) -> Vec<TestApp> {
    let mut apps = vec![TestApp::memory(args).await];
    if !crate::common::skip_redis("both stores") {
        apps.push(TestApp::redis("gone", args).await);
    }
    apps
}

/// The stream's events up to and including `gone`; the stream then ends.
async fn reason_of_gone(stream: &mut SseStream) -> String {
    let events = stream.until("gone", WAIT).await;
    let gone = events.last().unwrap();
    assert!(
        stream.next(Duration::from_secs(2)).await.is_none(),
        "the stream ends after gone"
    );
    gone.data["reason"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_buyer_dropped_as_absent_hears_abandoned() {
    let args = [
        "--admission-interval-ms",
        "600000",
        "--admission-batch",
        "1",
    ];
    for app in both(&args).await {
        app.enter("default", "holder").await; // fast track
        let (_, waiting) = app.enter("default", "absent").await;
        let mut stream =
            SseStream::open(&app, "default", waiting["ticket"].as_str().unwrap(), None).await;
        assert_eq!(stream.next(WAIT).await.unwrap().event, "waiting");
        // A pass that counts anyone unseen for a millisecond as absent: the
        // stream's presence marks are older than that, so the pass drops
        // the buyer while the stream is still open.
        tokio::time::sleep(Duration::from_millis(20)).await;
        // (Stored as the queue's settings: a pass runs on those.)
        let queue = QueueName::parse("default").unwrap();
        let mut settings = app.state.catalog().defaults().clone();
        settings.abandon_after_ms = Some(1);
        app.state
            .store()
            .put_queue_settings(&queue, &settings, false)
            .await
            .unwrap();
        let strict = settings.policy();
        let pass = app
            .state
            .store()
            .admit(&queue, &strict, &[EntryToken::generate()])
            .await
            .unwrap();
        assert!(
            pass.abandoned.iter().any(|a| a.user.as_str() == "absent"),
            "{pass:?}"
        );
        assert_eq!(reason_of_gone(&mut stream).await, "abandoned");
        app.stop().await;
    }
}

#[tokio::test]
async fn an_unused_token_running_out_is_expired() {
    let args = ["--token-ttl-secs", "2", "--admission-interval-ms", "200"];
    for app in both(&args).await {
        let (_, ready) = app.enter("default", "idle-buyer").await;
        assert_eq!(ready["status"], "READY");
        let mut stream =
            SseStream::open(&app, "default", ready["ticket"].as_str().unwrap(), None).await;
        assert_eq!(stream.next(WAIT).await.unwrap().event, "ready");
        assert_eq!(reason_of_gone(&mut stream).await, "expired");
        app.stop().await;
    }
}

#[tokio::test]
async fn a_token_used_for_an_order_is_consumed() {
    let args = ["--admission-interval-ms", "200"];
    for app in both(&args).await {
        let (_, ready) = app.enter("default", "buyer").await;
        assert_eq!(ready["status"], "READY");
        let mut stream =
            SseStream::open(&app, "default", ready["ticket"].as_str().unwrap(), None).await;
        assert_eq!(stream.next(WAIT).await.unwrap().event, "ready");
        let order = app
            .client
            .post(app.url("/api/orders"))
            .header("x-user-id", "buyer")
            .header("x-entry-token", ready["entryToken"].as_str().unwrap())
            .json(&json!({ "productId": "demo-sneaker", "quantity": 1 }))
            .send()
            .await
            .unwrap();
        assert_eq!(order.status(), 201);
        assert_eq!(reason_of_gone(&mut stream).await, "consumed");
        app.stop().await;
    }
}
