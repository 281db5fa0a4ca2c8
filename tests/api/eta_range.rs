//! The wait range on the wire: once passes are observed (from the queue's
//! events, on every instance), a poll and the stream carry
//! `estimatedWaitRange` around `estimatedWaitSeconds`; the shapes agree.

use std::time::Duration;

use crate::common::{SseStream, TestApp};

async fn ticket(app: &TestApp, user: &str) -> String {
    let (code, body) = app.enter("default", user).await;
    assert!(code == 201 || code == 200, "{code} {body}");
    body["ticket"].as_str().unwrap().to_owned()
}

fn check_range(status: &serde_json::Value) -> (u64, u64) {
    let range = &status["estimatedWaitRange"];
    let (low, high) = (
        range["low"].as_u64().unwrap(),
        range["high"].as_u64().unwrap(),
    );
    let eta = status["estimatedWaitSeconds"].as_u64().unwrap();
    assert!(low <= eta && eta <= high, "{status}");
    (low, high)
}

#[tokio::test]
async fn polls_and_streams_carry_the_range_once_passes_are_observed() {
    crate::needs_redis!();
    let args = ["--admission-interval-ms", "200", "--admission-batch", "2"];
    for app in [
        TestApp::memory(&args).await,
        TestApp::redis("etarange", &args).await,
    ] {
        let mut tickets = Vec::new();
        for i in 0..60 {
            tickets.push(ticket(&app, &format!("buyer{i:03}")).await);
        }
        let last = tickets.last().unwrap().clone();
        // Polled as a page does, within the buyer's request budget (2 a
        // second): a faster loop would leave nothing for the stream's open.
        let mut polled = None;
        for _ in 0..40 {
            let (code, body) = app.position("default", &last).await;
            assert_eq!(code, 200, "{body}");
            if !body["estimatedWaitRange"].is_null() {
                polled = Some(body);
                break;
            }
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        check_range(&polled.expect("a range on the poll within 24 s"));

        let mut stream = SseStream::open(&app, "default", &last, None).await;
        assert_eq!(stream.status, 200, "the stream opens");
        let events = stream.until("ready", Duration::from_secs(60)).await;
        let waiting: Vec<_> = events.iter().filter(|e| e.event == "waiting").collect();
        assert!(waiting.len() >= 3, "{} waiting events", waiting.len());
        for e in &waiting {
            if !e.data["estimatedWaitRange"].is_null() {
                check_range(&e.data);
            }
        }
        let ranged = waiting
            .iter()
            .filter(|e| !e.data["estimatedWaitRange"].is_null())
            .count();
        assert!(ranged * 2 >= waiting.len(), "{ranged} of {}", waiting.len());
        let ready = events.last().unwrap();
        assert!(ready.data["estimatedWaitRange"].is_null(), "{}", ready.data);
        app.stop().await;
    }
}
