//! Paths the other suites do not reach: concurrent fast tracks, a lost
//! pub/sub message for buyers far back, and instances that share their
//! ticket secret through Redis (the production default).

use std::sync::Arc;
use std::time::Duration;

use waitroom::queue::{EntryToken, QueueName, Standing, UserId};
use waitroom::store::redis::RedisStore;
use waitroom::store::{LineStore, SettingsStore};

use crate::common::{BinApp, RedisProcess, SseStream, TestApp, config, redis_url, unique_prefix};

/// 200 joins at once on an empty queue: exactly min(batch, maxActive) take
/// the fast track, and everyone else gets a distinct rank, 0..n-1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_joins_on_an_empty_queue_fast_track_exactly_min_batch_max_active() {
    crate::needs_redis!();
    for (batch, max_active) in [("7", "5"), ("3", "10")] {
        let args = [
            "--admission-interval-ms",
            "600000",
            "--admission-batch",
            batch,
            "--max-active",
            max_active,
        ];
        let expected_ready = batch
            .parse::<usize>()
            .unwrap()
            .min(max_active.parse().unwrap());
        for app in [
            TestApp::memory(&args).await,
            TestApp::redis("fast200", &args).await,
        ] {
            let app = Arc::new(app);
            let joins = (0..200).map(|i| {
                let app = app.clone();
                tokio::spawn(async move { app.enter("default", &format!("c{i:03}")).await })
            });
            let mut ready = 0;
            let mut ranks = Vec::new();
            for join in futures::future::join_all(joins).await {
                let (code, body) = join.unwrap();
                assert_eq!(code, 201, "{body}");
                match body["status"].as_str() {
                    Some("READY") => ready += 1,
                    Some("WAITING") => ranks.push(body["rank"].as_u64().unwrap()),
                    other => panic!("unexpected status {other:?}"),
                }
            }
            assert_eq!(
                ready, expected_ready,
                "batch {batch}, maxActive {max_active}"
            );
            // Ranks at join time can only be checked for distinctness; the
            // positions read now must be exactly 0..n-1.
            ranks.sort_unstable();
            ranks.dedup();
            assert_eq!(ranks.len(), 200 - expected_ready, "distinct ranks");
            let queue = QueueName::parse("default").unwrap();
            let users: Vec<UserId> = (0..200)
                .map(|i| UserId::parse(&format!("c{i:03}")).unwrap())
                .collect();
            let now = app.state.store().statuses(&queue, &users).await.unwrap();
            let mut now_ranks: Vec<u64> = now
                .iter()
                .filter_map(|s| match s.standing {
                    Standing::Waiting { rank, .. } => Some(rank),
                    _ => None,
                })
                .collect();
            now_ranks.sort_unstable();
            assert_eq!(
                now_ranks,
                (0..(200 - expected_ready) as u64).collect::<Vec<_>>()
            );
            Arc::try_unwrap(app).ok().unwrap().stop().await;
        }
    }
}

/// A buyer far back (rank ≥ 1,000: no exact re-read is due for minutes)
/// whose instance loses the pub/sub message of the pass that admits them
/// still hears `ready`: the subscriber notices, resubscribes and resyncs.
#[tokio::test]
async fn a_lost_pass_still_reaches_a_buyer_far_back() {
    crate::needs_redis!();
    let redis = RedisProcess::start(false);
    let store = Arc::new(RedisStore::connect(&redis.url(), "far").await.unwrap());
    let app = TestApp::spawn_with(
        config(&[
            "--admission-interval-ms",
            "600000",
            "--admission-batch",
            "1",
        ]),
        store.clone(),
    )
    .await;
    let queue = QueueName::parse("default").unwrap();
    let policy = app.state.policy(&queue);
    let users: Vec<UserId> = (0..1_100)
        .map(|i| UserId::parse(&format!("far{i:04}")).unwrap())
        .collect();
    for chunk in users.chunks(100) {
        let enters = chunk.iter().map(|u| {
            let (store, queue, policy) = (&store, &queue, &policy);
            async move { store.enter(queue, u, policy, &EntryToken::generate()).await }
        });
        for r in futures::future::join_all(enters).await {
            r.unwrap();
        }
    }
    let (_, last) = app.enter("default", "far1099").await;
    assert!(last["rank"].as_u64().unwrap() >= 1_000, "{last}");
    let mut stream = SseStream::open(&app, "default", last["ticket"].as_str().unwrap(), None).await;
    assert_eq!(
        stream.next(Duration::from_secs(5)).await.unwrap().event,
        "waiting"
    );

    // Cut every subscriber, then run the pass that admits everyone at once,
    // before the instance can have subscribed again.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(killed >= 1, "the instance's subscriber was cut");
    // A budget that refills completely within a millisecond (stored as the
    // queue's settings: a pass runs on those).
    let mut settings = app.state.catalog().defaults().clone();
    settings.batch = 2_000;
    settings.interval_ms = 1;
    store
        .put_queue_settings(&queue, &settings, false)
        .await
        .unwrap();
    let everyone = settings.policy();
    let tokens: Vec<EntryToken> = (0..1_100).map(|_| EntryToken::generate()).collect();
    let pass = store.admit(&queue, &everyone, &tokens).await.unwrap();
    assert!(pass.admitted.iter().any(|a| a.user.as_str() == "far1099"));

    let events = stream.until("ready", Duration::from_secs(15)).await;
    assert_eq!(events.last().unwrap().event, "ready");
    app.stop().await;
}

/// Two instances with no `--ticket-secret` share the secret kept in Redis:
/// a ticket from one works on the other, and on both after a restart.
#[tokio::test]
async fn tickets_work_across_instances_and_restarts_without_a_configured_secret() {
    crate::needs_redis!();
    let prefix = unique_prefix("shared-secret");
    let url = redis_url();
    let args = ["--redis-url", url.as_str(), "--key-prefix", prefix.as_str()];
    let client = reqwest::Client::new();
    let position = |app: &BinApp, ticket: &str| {
        client
            .get(app.url("/api/queues/default/position"))
            .header("x-queue-ticket", ticket)
            .send()
    };
    let (a, b) = (BinApp::spawn(&args).await, BinApp::spawn(&args).await);
    let first = a.enter(&client, "sharer0").await;
    let second = b.enter(&client, "sharer1").await;
    assert_eq!(position(&b, &first).await.unwrap().status(), 200);
    assert_eq!(position(&a, &second).await.unwrap().status(), 200);
    drop((a, b));

    let (a, b) = (BinApp::spawn(&args).await, BinApp::spawn(&args).await);
    for app in [&a, &b] {
        for ticket in [&first, &second] {
            let r = position(app, ticket).await.unwrap();
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        }
    }
    // A different prefix is a different deployment: its secret differs.
    let other_prefix = unique_prefix("other-secret");
    let other = BinApp::spawn(&[
        "--redis-url",
        url.as_str(),
        "--key-prefix",
        other_prefix.as_str(),
    ])
    .await;
    assert_eq!(position(&other, &first).await.unwrap().status(), 401);
}
