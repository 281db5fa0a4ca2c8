//! The entry-time marks a Redis store keeps beside the line. An admitted
//! buyer's time is read from them while their token may live, so they
//! outlive their entries by one to two token lives, and no longer: in a
//! sale that never pauses (the line never empty, holders always present)
//! they stay bounded, and they go once nobody waits or holds a place.

use std::time::Duration;

use redis::AsyncCommands;
use waitroom::queue::{EntryToken, Policy, QueueName, UserId};
use waitroom::store::LineStore;
use waitroom::store::redis::RedisStore;

use crate::common::{IDLE, TestApp, redis_url, unique_prefix};

/// The token life of the test's passes.
const LIFE: u64 = 300;

/// Buyers a round joins and a pass admits.
const ROUND: usize = 32;

fn policy(batch: u32) -> Policy {
    Policy {
        batch,
        interval_ms: 1,
        token_ttl_ms: LIFE,
        max_active: None,
        abandon_after_ms: None,
    }
}

/// The spans of marks the queue keeps (its fields named '^' and a number).
async fn spans(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> usize {
    let fields: Vec<String> = conn.hkeys(key).await.unwrap();
    fields
        .iter()
        .filter(|f| f.len() > 1 && f.starts_with('^') && f[1..].bytes().all(|b| b.is_ascii_digit()))
        .count()
}

#[tokio::test]
async fn marks_stay_bounded_while_a_sale_runs_and_go_with_its_last_holder() {
    crate::needs_redis!();
    let prefix = unique_prefix("entry-marks");
    let store = RedisStore::connect(&redis_url(), &prefix).await.unwrap();
    let q = QueueName::parse("default").unwrap();
    let mut conn = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let entered = format!("{prefix}:{{default}}:entered");
    let join = |name: String| {
        let (store, q) = (&store, &q);
        async move {
            let user = UserId::parse(&name).unwrap();
            store
                .enter(q, &user, &policy(1), &EntryToken::generate())
                .await
                .unwrap();
        }
    };
    // A line that stays about 40 long while rounds join and admit 32.
    for i in 0..40 {
        join(format!("first{i:02}")).await;
    }
    let rounds = 20;
    let mut most = 0;
    for round in 0..rounds {
        for i in 0..ROUND {
            join(format!("r{round:02}-{i:02}")).await;
        }
        let tokens: Vec<EntryToken> = (0..ROUND).map(|_| EntryToken::generate()).collect();
        let pass = store
            .admit(&q, &policy(ROUND as u32), &tokens)
            .await
            .unwrap();
        assert_eq!(pass.admitted.len(), ROUND, "{pass:?}");
        assert!(pass.waiting >= 30, "the line never empties: {pass:?}");
        most = most.max(spans(&mut conn, &entered).await);
        tokio::time::sleep(Duration::from_millis(LIFE / 3)).await;
    }
    // Joined: 40 + 20 rounds of 32, about 43 spans of 16. Kept: the line's
    // (3 or 4) and those of the entries admitted in the last two token
    // lives (a round each LIFE / 3 at most: 7 rounds, 14 spans), and the
    // spans at either edge.
    assert!(most <= 24, "{most} spans kept at most");
    assert!(most >= 8, "the holders' spans are kept: {most}");

    // The rest admitted, the line empty: the marks stay for the last
    // holders, then go once their tokens expire.
    let tokens: Vec<EntryToken> = (0..100).map(|_| EntryToken::generate()).collect();
    let pass = store.admit(&q, &policy(100), &tokens).await.unwrap();
    assert_eq!(pass.waiting, 0, "{pass:?}");
    assert!(spans(&mut conn, &entered).await > 0, "kept for the holders");
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(LIFE + 100)).await;
        store.admit(&q, &policy(1), &[]).await.unwrap();
    }
    let left: bool = conn.exists(&entered).await.unwrap();
    assert!(!left, "the marks go with the line's last holder");
}

/// A join again on the instance that answered the buyer's entry carries
/// the entry time it answered with, not read again from the marks
/// (`src/http/entry_times.rs`, `enter.lua`): with the marks gone, that
/// instance still answers it, where one that never answered this buyer
/// reads the marks and finds none.
#[tokio::test]
async fn a_join_again_carries_the_time_this_instance_answered() {
    crate::needs_redis!();
    // The first join takes the one slot (the fast track), the buyer waits.
    let app = TestApp::redis("join-known", IDLE).await;
    let (code, held) = app.enter("default", "holder").await;
    assert_eq!(
        (code, held["status"].as_str()),
        (201, Some("READY")),
        "{held}"
    );
    let (code, first) = app.enter("default", "buyer").await;
    assert_eq!(
        (code, first["status"].as_str()),
        (201, Some("WAITING")),
        "{first}"
    );
    let at = first["enteredAt"]
        .as_str()
        .expect("an entry time")
        .to_owned();

    // The marks go: a join that read them would find no time.
    let prefix = &app.config.key_prefix;
    let mut conn = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = conn
        .del(&[
            format!("{prefix}:{{default}}:entered"),
            format!("{prefix}:{{default}}:seq:mark"),
        ])
        .await
        .unwrap();

    let (code, again) = app.enter("default", "buyer").await;
    assert_eq!(
        (code, again["status"].as_str()),
        (200, Some("WAITING")),
        "{again}"
    );
    assert_eq!(again["position"], first["position"], "{again}");
    assert_eq!(again["enteredAt"].as_str(), Some(at.as_str()), "{again}");

    let other = TestApp::spawn_with(app.config.clone(), app.state.store().clone()).await;
    let (code, elsewhere) = other.enter("default", "buyer").await;
    assert_eq!(code, 200, "{elsewhere}");
    assert_eq!(elsewhere["position"], first["position"], "{elsewhere}");
    assert_ne!(
        elsewhere["enteredAt"].as_str(),
        Some(at.as_str()),
        "{elsewhere}"
    );
    other.stop().await;
    app.stop().await;
}
