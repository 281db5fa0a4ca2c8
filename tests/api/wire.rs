//! One wire form for a buyer's state: a stream's events carry the object a
//! position poll answers, field for field, and `gone` says `NOT_ENTERED`.

use std::time::Duration;

use crate::common::{SseStream, TestApp};

const SECS: Duration = Duration::from_secs(1);

#[tokio::test]
async fn stream_events_are_the_polled_status() {
    // One admitted per minute: the fast track takes the first buyer, and
    // nothing moves while the test compares.
    let app =
        TestApp::memory(&["--admission-interval-ms", "60000", "--admission-batch", "1"]).await;
    let (_, first) = app.enter("default", "wire-first").await;
    assert_eq!(first["status"], "READY");
    let (_, second) = app.enter("default", "wire-second").await;
    assert_eq!(second["status"], "WAITING");

    for body in [&first, &second] {
        let ticket = body["ticket"].as_str().unwrap();
        let mut stream = SseStream::open(&app, "default", ticket, None).await;
        let event = stream.next(SECS).await.expect("the current state at once");
        let (_, polled) = app.position("default", ticket).await;
        let mut data = event.data.clone();
        let fields = data.as_object_mut().unwrap();
        if event.event == "ready" {
            assert!(fields.remove("admittedAt").is_some(), "{data}");
            // Seconds left are read at two moments: allow the one between.
            let (s, p) = (
                fields["tokenExpiresInSeconds"].as_u64().unwrap(),
                polled["tokenExpiresInSeconds"].as_u64().unwrap(),
            );
            assert!(s == p || s == p + 1, "{s} vs {p}");
            fields.insert("tokenExpiresInSeconds".into(), p.into());
        }
        assert_eq!(
            event.event,
            polled["status"].as_str().unwrap().to_lowercase()
        );
        assert_eq!(data, polled, "{} event vs poll", event.event);
    }

    // Leaving ends the stream with `gone`, in the same terms.
    let ticket = second["ticket"].as_str().unwrap();
    let mut stream = SseStream::open(&app, "default", ticket, None).await;
    assert_eq!(stream.next(SECS).await.unwrap().event, "waiting");
    assert_eq!(app.leave("default", ticket).await, 204);
    let gone = stream.until("gone", Duration::from_secs(10)).await;
    let gone = gone.last().expect("a gone event");
    assert_eq!(gone.event, "gone");
    assert_eq!(
        gone.data,
        serde_json::json!({ "status": "NOT_ENTERED", "reason": "left" })
    );
    app.stop().await;
}

/// The API document is served, as OpenAPI 3.1 JSON, and names the stream's
/// events with the same status schema a poll answers.
#[tokio::test]
async fn the_api_document_is_served() {
    let app = TestApp::memory(&[]).await;
    let response = reqwest::get(app.url("/api/openapi.json")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    let doc: serde_json::Value = response.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let stream = &doc["paths"]["/api/queues/{queue}/events"]["get"]["responses"]["200"];
    assert_eq!(
        stream["content"]["text/event-stream"]["schema"]["$ref"],
        "#/components/schemas/StreamEvent"
    );
    let polled = &doc["paths"]["/api/queues/{queue}/position"]["get"]["responses"]["200"];
    assert_eq!(
        polled["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/QueueStatus"
    );
    app.stop().await;
}
