//! Several instances on one Redis: one global admission rate, strict FIFO,
//! and each other's tickets.

use std::sync::Arc;
use std::time::{Duration, Instant};

use waitroom::store::redis::RedisStore;

use crate::common::{TestApp, config, redis_url, unique_prefix};

#[tokio::test]
async fn two_instances_admit_at_one_global_rate_in_fifo_order() {
    crate::needs_redis!();
    let prefix = unique_prefix("two");
    let args = [
        "--key-prefix",
        &prefix,
        "--admission-interval-ms",
        "300",
        "--admission-batch",
        "4",
        "--ticket-secret",
        "two-instances-secret-0123456789",
    ];
    let store = || async { Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap()) };
    let a = TestApp::spawn_with(config(&args), store().await).await;
    let b = TestApp::spawn_with(config(&args), store().await).await;

    let started = Instant::now();
    let mut tickets = Vec::new();
    for i in 0..80 {
        let app = if i % 2 == 0 { &a } else { &b };
        let (code, body) = app.enter("default", &format!("u{i:03}")).await;
        assert_eq!(code, 201);
        tickets.push(body["ticket"].as_str().unwrap().to_owned());
    }
    // Five intervals, both loops running; then hold admission so the
    // positions below are read from a line that no pass moves mid-sweep.
    tokio::time::sleep(Duration::from_millis(1500).saturating_sub(started.elapsed())).await;
    let queue = waitroom::queue::QueueName::parse("default").unwrap();
    a.state.store().set_paused(&queue, true).await.unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    let mut ready = Vec::new();
    for (i, t) in tickets.iter().enumerate() {
        // Each instance accepts the other's tickets.
        let app = if i % 2 == 0 { &b } else { &a };
        let (code, p) = app.position("default", t).await;
        assert_eq!(code, 200);
        if p["status"] == "READY" {
            ready.push(i);
        }
    }
    let intervals = elapsed / 0.3;
    // Budget starts full (4) and refills 4 per interval, whoever spends it.
    let bound = (4.0 * intervals + 4.0).floor() as usize;
    assert!(
        ready.len() <= bound,
        "{} admitted in {intervals:.1} intervals, bound {bound}",
        ready.len()
    );
    assert!(ready.len() >= 4 * 3, "admissions run: only {}", ready.len());
    assert_eq!(
        ready,
        (0..ready.len()).collect::<Vec<_>>(),
        "admitted in arrival order"
    );
    a.stop().await;
    b.stop().await;
}
