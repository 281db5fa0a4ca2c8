//! Proof of work at the door: joins that must carry a solved ALTCHA
//! challenge (`--join-challenge always|auto`), refused without one, with a
//! bad, foreign, expired or replayed one, on one instance and across two
//! on one Redis; and the default (`off`) unchanged.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use waitroom::challenge::{IssuedChallenge, solve};
use waitroom::queue::QueueName;
use waitroom::store::redis::RedisStore;

use crate::common::{RedisProcess, TestApp, config, eventually, redis_url, unique_prefix};

/// Fast challenges for tests (the real default is 100,000).
const EASY: &[&str] = &["--join-challenge-difficulty", "1000"];

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut all = EASY.to_vec();
    all.extend_from_slice(extra);
    all
}

/// `GET …/challenge`: (status, body).
async fn get_challenge(app: &TestApp, queue: &str) -> (u16, Value) {
    let r = app
        .client
        .get(app.url(&format!("/api/queues/{queue}/challenge")))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    if status == 200 {
        assert_eq!(r.headers()["cache-control"], "no-store");
    }
    (status, r.json().await.unwrap_or(Value::Null))
}

/// A fresh challenge of `queue`, solved: the `X-Altcha` value.
async fn solution(app: &TestApp, queue: &str) -> String {
    let (status, body) = get_challenge(app, queue).await;
    assert_eq!(status, 200, "a challenge is handed out: {body}");
    let challenge: IssuedChallenge = serde_json::from_value(body).unwrap();
    solve(&challenge).expect("solvable")
}

/// A join of `user` with `altcha` (if any) in `X-Altcha`: (status, body).
async fn join(app: &TestApp, queue: &str, user: &str, altcha: Option<&str>) -> (u16, Value) {
    let mut request = app
        .client
        .post(app.url(&format!("/api/queues/{queue}/entries")))
        .header("x-user-id", user);
    if let Some(a) = altcha {
        request = request.header("x-altcha", a);
    }
    let r = request.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn waiting(app: &TestApp, queue: &str) -> u64 {
    let q = QueueName::parse(queue).unwrap();
    let s = app.state.store().stats(&q).await.unwrap();
    s.waiting + s.active
}

fn assert_refused(got: (u16, Value), status: u16, code: &str) {
    assert_eq!(
        (got.0, got.1["error"].as_str()),
        (status, Some(code)),
        "{}",
        got.1
    );
    assert_eq!(
        got.1["challengeUrl"].as_str(),
        Some("/api/queues/default/challenge"),
        "where to get one"
    );
}

#[tokio::test]
async fn always_a_join_needs_a_fresh_solution_of_its_own_queue() {
    let app = TestApp::memory(&args(&[
        "--join-challenge",
        "always",
        "--queues",
        "default,other",
    ]))
    .await;

    // No solution: 428 with where to get one; nothing changed.
    assert_refused(
        join(&app, "default", "nobody", None).await,
        428,
        "challenge_required",
    );
    assert_eq!(waiting(&app, "default").await, 0);

    let (status, body) = get_challenge(&app, "default").await;
    assert_eq!(status, 200);
    assert_eq!(body["algorithm"], "SHA-256");
    assert_eq!(body["maxnumber"], 1000);
    assert!(
        body["salt"].as_str().unwrap().contains("q=default&"),
        "{body}"
    );

    let first = solution(&app, "default").await;
    let (status, body) = join(&app, "default", "alice", Some(&first)).await;
    assert_eq!(status, 201, "{body}");
    assert!(body["ticket"].is_string());

    // The same solution again, by anyone: refused, nothing changed.
    assert_refused(
        join(&app, "default", "alice", Some(&first)).await,
        403,
        "challenge_replayed",
    );
    assert_refused(
        join(&app, "default", "mallory", Some(&first)).await,
        403,
        "challenge_replayed",
    );
    assert_eq!(waiting(&app, "default").await, 1);

    // Another queue's solution, garbage, an altered number: invalid.
    let foreign = solution(&app, "other").await;
    let got = join(&app, "default", "mallory", Some(&foreign)).await;
    assert_refused(got.clone(), 403, "challenge_invalid");
    assert!(
        got.1["message"].as_str().unwrap().contains("another queue"),
        "{}",
        got.1
    );
    for garbage in [
        "",
        "not base64!",
        "e30=",
        "eyJhbGdvcml0aG0iOiJTSEEtMjU2In0=",
    ] {
        assert_refused(
            join(&app, "default", "mallory", Some(garbage)).await,
            403,
            "challenge_invalid",
        );
    }
    let fresh = solution(&app, "default").await;
    let mut payload: Value = serde_json::from_slice(&base64_decode(&fresh)).unwrap();
    let n = payload["number"].as_u64().unwrap();
    payload["number"] = (n + 1).into();
    let altered = base64_encode(&payload.to_string());
    assert_refused(
        join(&app, "default", "mallory", Some(&altered)).await,
        403,
        "challenge_invalid",
    );
    // The refusal did not spend it: the honest solution still opens the door.
    assert_eq!(join(&app, "default", "bob", Some(&fresh)).await.0, 201);

    // The header twice: 400, whatever the values.
    let r = app
        .client
        .post(app.url("/api/queues/default/entries"))
        .header("x-user-id", "carol")
        .header("x-altcha", solution(&app, "default").await)
        .header("x-altcha", solution(&app, "default").await)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"],
        "duplicate_header"
    );
    assert_eq!(waiting(&app, "default").await, 2, "alice and bob only");
    // The other queue took its own solution.
    let own = solution(&app, "other").await;
    assert_eq!(join(&app, "other", "dave", Some(&own)).await.0, 201);
    app.stop().await;
}

#[tokio::test]
async fn an_expired_challenge_is_refused() {
    let app = TestApp::memory(&args(&[
        "--join-challenge",
        "always",
        "--join-challenge-ttl-secs",
        "1",
    ]))
    .await;
    let late = solution(&app, "default").await;
    // Expiry is in whole seconds: past it for sure after two.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_refused(
        join(&app, "default", "slow", Some(&late)).await,
        403,
        "challenge_expired",
    );
    assert_eq!(waiting(&app, "default").await, 0);
    app.stop().await;
}

#[tokio::test]
async fn off_by_default_joins_as_before() {
    let app = TestApp::memory(&[]).await;
    assert_eq!(
        get_challenge(&app, "default").await.0,
        204,
        "no challenge needed"
    );
    assert_eq!(get_challenge(&app, "nope").await.0, 404);
    assert_eq!(join(&app, "default", "plain", None).await.0, 201);
    // A stray header is not looked at.
    assert_eq!(join(&app, "default", "stray", Some("garbage")).await.0, 201);
    app.stop().await;
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

fn base64_encode(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Two instances on one Redis with one ticket secret.
async fn pair(tag: &str, extra: &[&str]) -> (TestApp, TestApp) {
    let prefix = unique_prefix(tag);
    let mut all = args(&[
        "--key-prefix",
        &prefix,
        "--ticket-secret",
        "challenge-pair-secret-0123456789",
    ]);
    all.extend_from_slice(extra);
    let store = || async { Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap()) };
    let a = TestApp::spawn_with(config(&all), store().await).await;
    let b = TestApp::spawn_with(config(&all), store().await).await;
    (a, b)
}

#[tokio::test]
async fn two_instances_share_the_single_use_memory() {
    crate::needs_redis!();
    let (a, b) = pair("altcha-pair", &["--join-challenge", "always"]).await;
    // Issued by one, used on the other (one key from the shared secret).
    let s = solution(&a, "default").await;
    assert_eq!(join(&b, "default", "u1", Some(&s)).await.0, 201);
    assert_refused(
        join(&a, "default", "u2", Some(&s)).await,
        403,
        "challenge_replayed",
    );
    assert_refused(
        join(&b, "default", "u2", Some(&s)).await,
        403,
        "challenge_replayed",
    );

    // One solution raced by 20 joins over both instances: exactly one gets in.
    let s = solution(&b, "default").await;
    let joins = (0..20).map(|i| {
        let app = if i % 2 == 0 { &a } else { &b };
        let s = s.clone();
        async move { join(app, "default", &format!("racer{i}"), Some(&s)).await.0 }
    });
    let codes = futures::future::join_all(joins).await;
    assert_eq!(codes.iter().filter(|c| **c == 201).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 403).count(), 19, "{codes:?}");
    assert_eq!(waiting(&a, "default").await, 2);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn two_instances_share_the_auto_switch() {
    crate::needs_redis!();
    let (a, b) = pair(
        "altcha-auto",
        &[
            "--join-challenge",
            "auto",
            "--join-challenge-threshold",
            "10",
            "--join-challenge-hold-secs",
            "2",
        ],
    )
    .await;
    // Quiet: no challenge anywhere, joins as usual.
    assert_eq!(get_challenge(&b, "default").await.0, 204);
    assert_eq!(join(&b, "default", "early", None).await.0, 201);

    // A burst on instance a only: 60 joins, well over 10 a second.
    for i in 0..60 {
        let (status, _) = join(&a, "default", &format!("bot{i}"), None).await;
        assert!(status == 201 || status == 428, "{status}");
    }
    // Instance b switches on too, from the shared count.
    eventually(Duration::from_secs(5), "b asks for a challenge", || async {
        (get_challenge(&b, "default").await.0 == 200).then_some(())
    })
    .await;
    assert_refused(
        join(&b, "default", "late", None).await,
        428,
        "challenge_required",
    );
    let s = solution(&b, "default").await;
    assert_eq!(join(&b, "default", "late", Some(&s)).await.0, 201);

    // Quiet again: off on both after the hold.
    for app in [&a, &b] {
        eventually(Duration::from_secs(8), "the switch turns off", || async {
            (get_challenge(app, "default").await.0 == 204).then_some(())
        })
        .await;
    }
    assert_eq!(join(&a, "default", "after", None).await.0, 201);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_dead_store_fails_closed() {
    crate::needs_redis!();
    let mut redis = RedisProcess::start(false);
    let store = Arc::new(
        RedisStore::connect(&redis.url(), "altcha-down")
            .await
            .unwrap(),
    );
    let app = TestApp::spawn_with(config(&args(&["--join-challenge", "always"])), store).await;
    let s = solution(&app, "default").await;
    redis.kill();
    // The solution verifies, but whether it was spent cannot be known: 503.
    let (status, body) = join(&app, "default", "u", Some(&s)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("store_unavailable")),
        "{body}"
    );
    // Bad solutions are still refused without the store.
    assert_refused(
        join(&app, "default", "u", Some("garbage")).await,
        403,
        "challenge_invalid",
    );
    app.stop().await;
}
