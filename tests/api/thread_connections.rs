//! Each serving thread's own connection to a single Redis
//! (`store/redis/conn/local.rs`): the buyers' calls go over it once it is
//! open, it is one per thread (not one per call or per request), and it
//! comes back by itself after Redis does, as the shared one does.

use std::sync::Arc;
use std::time::Duration;

use waitroom::store::redis::RedisStore;

use crate::common::redis_proc::query;
use crate::common::{RedisProcess, TestApp, eventually, eventually_every, test_config};

/// Polls this far apart stay inside a buyer's budget (2 a second).
const PACE: Duration = Duration::from_millis(600);

/// The serving threads of one listener (`server/workers.rs`).
fn serving_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(8)
}

/// The app's command connections to the test's Redis (its subscriptions
/// left out), and how many of them last ran a script.
fn clients(redis: &RedisProcess) -> (usize, usize) {
    let list: String = query(redis.port, redis::cmd("CLIENT").arg("LIST")).unwrap_or_default();
    // The test's own `CLIENT LIST` connection is not the app's.
    let lines: Vec<&str> = list
        .lines()
        .filter(|l| !l.is_empty() && !l.contains("cmd=client"))
        .filter(|l| l.contains(" sub=0 ") && l.contains(" psub=0 ") && l.contains(" ssub=0 "))
        .collect();
    let apps = lines.len();
    let scripts = lines.iter().filter(|l| l.contains("cmd=evalsha")).count();
    (apps, scripts)
}

/// Polls over fresh TCP connections, so every serving thread gets some
/// (connections are handed to the threads in turn).
async fn poll_on_every_thread(app: &TestApp, ticket: &str, times: usize) -> Vec<u16> {
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut codes = Vec::new();
    for _ in 0..times {
        let r = fresh
            .get(app.url("/api/queues/default/position"))
            .header("x-queue-ticket", ticket)
            .send()
            .await
            .unwrap();
        codes.push(r.status().as_u16());
    }
    codes
}

#[tokio::test]
async fn serving_threads_call_redis_over_their_own_connections_and_get_them_back() {
    crate::needs_redis!();
    let mut redis = RedisProcess::start(false);
    let store = Arc::new(RedisStore::connect(&redis.url(), "own").await.unwrap());
    let app = TestApp::spawn_with(test_config(), store).await;
    // Before any request: the shared connection.
    let before = clients(&redis).0;
    let (code, body) = app.enter("default", "first").await;
    assert!(code == 201 || code == 200, "{code} {body}");
    let ticket = body["ticket"].as_str().unwrap().to_owned();
    // The buyer's budget (2 a second, a burst of 10) is not what this
    // tests: polls spaced inside it.
    let spaced = || async {
        let mut codes = Vec::new();
        for _ in 0..serving_threads() * 2 {
            codes.extend(poll_on_every_thread(&app, &ticket, 1).await);
            tokio::time::sleep(PACE).await;
        }
        codes
    };

    // Each thread's first call opens its connection in the background;
    // the calls after go over it: one more client per thread, no more.
    let codes = spaced().await;
    assert!(codes.iter().all(|&c| c == 200), "{codes:?}");
    eventually(
        Duration::from_secs(10),
        "a connection per serving thread",
        || async { (clients(&redis).0 == before + serving_threads()).then_some(()) },
    )
    .await;
    // More requests open no more connections.
    let codes = spaced().await;
    assert!(codes.iter().all(|&c| c == 200), "{codes:?}");
    let (after, scripts) = clients(&redis);
    assert_eq!(
        after,
        before + serving_threads(),
        "one per thread, not per call"
    );
    assert!(
        scripts >= serving_threads(),
        "the threads' connections ran the polls' scripts ({scripts} clients last ran one)"
    );

    // Redis goes away: fail closed, over the threads' connections too.
    redis.kill();
    let codes = poll_on_every_thread(&app, &ticket, serving_threads() * 2).await;
    assert!(codes.iter().all(|&c| c == 503), "{codes:?}");

    // And comes back (empty: no persistence): joins and polls work again
    // on every thread, over connections of the threads' own again.
    redis.restart();
    let ticket = eventually_every(PACE, Duration::from_secs(15), "joins again", || async {
        let (code, body) = app.enter("default", "second").await;
        (code == 201).then(|| body["ticket"].as_str().unwrap().to_owned())
    })
    .await;
    eventually_every(
        PACE,
        Duration::from_secs(15),
        "polls again on every thread",
        || async {
            let codes = poll_on_every_thread(&app, &ticket, serving_threads()).await;
            let (now, _) = clients(&redis);
            (codes.iter().all(|&c| c == 200) && now == before + serving_threads()).then_some(())
        },
    )
    .await;
    app.stop().await;
}
