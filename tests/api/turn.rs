//! The admission turn: instances sharing a Redis make one pass an interval
//! between them, not one each (every pass sends each waiting stream a rank
//! update), while the bucket keeps the rate and a stopped holder hands the
//! turn on within an interval.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use waitroom::queue::QueueName;
use waitroom::store::redis::RedisStore;
use waitroom::store::{EventStore, LineStore, QueueEvent, StoreEvent};

use crate::common::{TestApp, config, redis_url, unique_prefix};

/// Two stores on one prefix (two instances): the turn is one's until its
/// hold lapses, renewed by its holder, and a queue's turn is its own.
#[tokio::test]
async fn the_turn_is_one_instances_until_its_hold_lapses() {
    crate::needs_redis!();
    let prefix = unique_prefix("turn");
    let a = RedisStore::connect(&redis_url(), &prefix).await.unwrap();
    let b = RedisStore::connect(&redis_url(), &prefix).await.unwrap();
    let q = QueueName::parse("default").unwrap();
    let other = QueueName::parse("other").unwrap();
    assert!(a.take_pass_turn(&q, 400).await.unwrap());
    assert!(!b.take_pass_turn(&q, 400).await.unwrap(), "a holds it");
    assert!(
        a.take_pass_turn(&q, 400).await.unwrap(),
        "renewed by its holder"
    );
    assert!(
        b.take_pass_turn(&other, 400).await.unwrap(),
        "another queue's turn"
    );
    tokio::time::sleep(Duration::from_millis(550)).await;
    assert!(
        b.take_pass_turn(&q, 400).await.unwrap(),
        "lapsed: b takes it"
    );
    assert!(!a.take_pass_turn(&q, 400).await.unwrap(), "now b holds it");
}

/// Every published pass in `window`, after `settle`: (passes, admitted).
async fn passes_in(watcher: &RedisStore, settle: Duration, window: Duration) -> (usize, usize) {
    let q = QueueName::parse("default").unwrap();
    let mut events = watcher.subscribe(std::slice::from_ref(&q));
    tokio::time::sleep(settle).await;
    let (mut passes, mut admitted) = (0, 0);
    let until = Instant::now() + window;
    // Passes already queued when the window opens belong to the settling.
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(1), events.next()).await {}
    while let Ok(Some(event)) = tokio::time::timeout_at(until, events.next()).await {
        if let StoreEvent::Queue {
            event: QueueEvent::Pass(pass),
            ..
        } = event
        {
            passes += 1;
            admitted += pass.admitted.len();
        }
    }
    (passes, admitted)
}

/// Two instances, passes due every 200 ms on each: one pass every 200 ms
/// between them (not two), each admitting the batch, so the configured
/// rate holds; with one of them stopped, the other passes on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_make_one_pass_an_interval_between_them() {
    crate::needs_redis!();
    let prefix = unique_prefix("turn2");
    let flags = [
        "--key-prefix",
        &prefix,
        "--admission-interval-ms",
        "200",
        "--admission-batch",
        "2",
        "--token-ttl-secs",
        "600",
        "--ticket-secret",
        "turn-two-instances-secret-0123456",
    ];
    let store = || async { Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap()) };
    let watcher = store().await;
    let a = TestApp::spawn_with(config(&flags), store().await).await;
    let b = TestApp::spawn_with(config(&flags), store().await).await;
    for i in 0..120 {
        let app = if i % 2 == 0 { &a } else { &b };
        let (code, _) = app.enter("default", &format!("t{i:03}")).await;
        assert!(code == 200 || code == 201, "{code}");
    }

    // 3 s: 15 intervals. Without the turn, two instances made about 30
    // passes of about one buyer each.
    let (passes, admitted) =
        passes_in(&watcher, Duration::from_millis(300), Duration::from_secs(3)).await;
    assert!(
        (11..=18).contains(&passes),
        "{passes} passes in 15 intervals from two instances"
    );
    assert!(
        (24..=32).contains(&admitted),
        "{admitted} admitted in 15 intervals of 2"
    );

    // The holder may be either; with `a` stopped, `b` goes on alone.
    a.stop().await;
    let (passes, admitted) =
        passes_in(&watcher, Duration::from_millis(400), Duration::from_secs(2)).await;
    assert!(
        (7..=12).contains(&passes),
        "{passes} passes in 10 intervals from one"
    );
    // A loaded machine may run a pass late (the loop does not catch up a
    // missed interval), as the pass count's own lower bound allows.
    assert!(
        (13..=22).contains(&admitted),
        "{admitted} admitted in 10 intervals of 2"
    );
    b.stop().await;
}
