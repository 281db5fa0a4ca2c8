//! The per-buyer request budget (polls, stream opens and repeat joins share
//! one) and event ids that only grow across a restart between instances.

use std::sync::Arc;
use std::time::{Duration, Instant};

use waitroom::http::limit::{BURST, PER_SECOND, REPEAT_JOIN_GRACE};
use waitroom::store::redis::RedisStore;

use crate::common::{IDLE, SseEvent, SseStream, TestApp, config, redis_url, unique_prefix};

const SECS: Duration = Duration::from_secs(1);

/// Repeat joins of `queue` that reached the store, from `/metrics` (the
/// recorder is shared by every test of the process; the queue is this
/// test's own).
async fn repeat_joins_at_store(app: &TestApp, queue: &str) -> f64 {
    let text = app
        .client
        .get(app.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = format!("waitroom_enters_total{{queue=\"{queue}\",new=\"false\"}}");
    let series_alt = format!("waitroom_enters_total{{new=\"false\",queue=\"{queue}\"}}");
    text.lines()
        .find(|l| l.starts_with(&series) || l.starts_with(&series_alt))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Most requests a budget lets through in `elapsed`: the burst, the refill,
/// and one for the refill under way.
fn allowed_in(elapsed: Duration) -> u64 {
    u64::from(BURST) + (elapsed.as_secs_f64() * f64::from(PER_SECOND)).ceil() as u64 + 1
}

/// Asserts `r` is a well-formed 429: JSON error, `Retry-After` in whole
/// seconds, no status (and so no token) in the body.
async fn assert_limited(r: reqwest::Response) {
    assert_eq!(r.status().as_u16(), 429);
    let retry: u64 = r
        .headers()
        .get("retry-after")
        .expect("Retry-After")
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in seconds");
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    let body: serde_json::Value = r.json().await.expect("a JSON body");
    assert_eq!(body["error"], "rate_limited", "{body}");
    assert!(body["message"].is_string(), "{body}");
    assert!(body.get("entryToken").is_none() && body.get("ticket").is_none());
}

async fn join(app: &TestApp, user: &str) -> reqwest::Response {
    join_in(app, "default", user).await
}

async fn join_in(app: &TestApp, queue: &str, user: &str) -> reqwest::Response {
    app.client
        .post(app.url(&format!("/api/queues/{queue}/entries")))
        .header("x-user-id", user)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn rapid_repeat_joins_past_the_grace_window_are_limited_before_the_store() {
    const Q: &str = "limits-flood";
    let mut args = vec!["--queues", Q];
    args.extend_from_slice(IDLE);
    let app = TestApp::memory(&args).await;
    // The first joiner takes the fast track: a READY buyer whose every
    // answer would carry the entry token.
    let r = join_in(&app, Q, "holder").await;
    assert_eq!(r.status().as_u16(), 201);
    let first: serde_json::Value = r.json().await.unwrap();
    assert_eq!(first["status"], "READY", "{first}");
    tokio::time::sleep(REPEAT_JOIN_GRACE + Duration::from_millis(100)).await;

    let before = repeat_joins_at_store(&app, Q).await;
    let started = Instant::now();
    let (mut ok, mut limited) = (0u64, 0u64);
    for _ in 0..40 {
        let r = join_in(&app, Q, "holder").await;
        match r.status().as_u16() {
            200 => ok += 1,
            429 => {
                limited += 1;
                assert_limited(r).await;
            }
            other => panic!("repeat join answered {other}"),
        }
    }
    let elapsed = started.elapsed();
    assert!(
        ok <= allowed_in(elapsed),
        "{ok} of 40 repeat joins answered in {elapsed:?}"
    );
    assert!(limited >= 40 - allowed_in(elapsed));
    // Once over budget, a join is refused without asking the store.
    let reached = repeat_joins_at_store(&app, Q).await - before;
    assert!(
        reached <= (allowed_in(elapsed) + 1) as f64,
        "{reached} of 40 repeat joins reached the store"
    );
    // Another buyer is not affected.
    assert_eq!(
        join_in(&app, Q, "someone-else").await.status().as_u16(),
        201
    );
    app.stop().await;
}

#[tokio::test]
async fn a_first_join_is_never_refused() {
    let app = TestApp::memory(IDLE).await;
    join(&app, "first").await; // takes the fast track
    let (code, body) = app.enter("default", "poller").await;
    assert_eq!(code, 201);
    let ticket = body["ticket"].as_str().unwrap().to_owned();
    // Spend the whole budget on polls.
    let mut spent = false;
    for _ in 0..(BURST * 4) {
        let (code, _) = app.position("default", &ticket).await;
        if code == 429 {
            spent = true;
            break;
        }
        assert_eq!(code, 200);
    }
    assert!(spent, "the polls never ran out");
    // Over budget, a repeat join is refused...
    assert_limited(join(&app, "poller").await).await;
    // ...but after leaving, the next join is a first one again.
    assert_eq!(app.leave("default", &ticket).await, 204);
    let r = join(&app, "poller").await;
    assert_eq!(r.status().as_u16(), 201, "a rejoin after leaving");
    // Brand-new buyers meanwhile.
    for i in 0..20 {
        assert_eq!(join(&app, &format!("new{i}")).await.status().as_u16(), 201);
    }
    app.stop().await;
}

#[tokio::test]
async fn concurrent_first_joins_of_one_buyer_give_one_201_and_49_200() {
    crate::needs_redis!();
    for app in [
        TestApp::memory(IDLE).await,
        TestApp::redis("limits50", IDLE).await,
    ] {
        join(&app, "ahead").await;
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (client, url) = (app.client.clone(), app.url("/api/queues/default/entries"));
            tasks.push(tokio::spawn(async move {
                let r = client
                    .post(url)
                    .header("x-user-id", "same-user")
                    .send()
                    .await
                    .unwrap();
                let code = r.status().as_u16();
                (code, r.json::<serde_json::Value>().await.unwrap())
            }));
        }
        let mut codes = Vec::new();
        let mut ranks = std::collections::HashSet::new();
        for t in tasks {
            let (code, body) = t.await.unwrap();
            codes.push(code);
            ranks.insert(body["rank"].as_u64());
        }
        assert_eq!(codes.iter().filter(|&&c| c == 201).count(), 1, "{codes:?}");
        assert_eq!(codes.iter().filter(|&&c| c == 200).count(), 49, "{codes:?}");
        assert_eq!(ranks.len(), 1, "{ranks:?}");
        app.stop().await;
    }
}

#[tokio::test]
async fn stream_opens_share_the_budget() {
    let app = TestApp::memory(IDLE).await;
    join(&app, "first").await;
    let (code, body) = app.enter("default", "reloader").await;
    assert_eq!(code, 201);
    let ticket = body["ticket"].as_str().unwrap().to_owned();
    let open = || async {
        // A fresh client per open, as a reloading page's new connection.
        reqwest::Client::new()
            .get(app.url("/api/queues/default/events"))
            .header("x-queue-ticket", &ticket)
            .send()
            .await
            .unwrap()
    };
    let started = Instant::now();
    let mut opened = 0;
    let refused = loop {
        let r = open().await;
        if r.status().as_u16() == 429 {
            break r;
        }
        assert_eq!(r.status().as_u16(), 200);
        opened += 1;
        assert!(opened <= allowed_in(started.elapsed()), "{opened} opens");
        drop(r);
    };
    assert_limited(refused).await;
    // Polls and stream opens share it: the next poll is refused too.
    let (code, body) = app.position("default", &ticket).await;
    assert_eq!(code, 429, "{body}");
    app.stop().await;
}

/// `(pass, n)` of an SSE id, as the server numbers them.
fn id_of(e: &SseEvent) -> (u64, u32) {
    let (pass, n) = e.id.split_once('.').unwrap_or((&e.id, "0"));
    (pass.parse().unwrap(), n.parse().unwrap())
}

#[tokio::test]
async fn event_ids_only_grow_across_a_restart_between_instances() {
    crate::needs_redis!();
    let prefix = unique_prefix("restart");
    let mut args = vec![
        "--key-prefix",
        &prefix,
        "--ticket-secret",
        "limits-restart-secret-0123456789abcdef",
        "--drain-secs",
        "0",
    ];
    args.extend_from_slice(IDLE);
    let store = || async { Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap()) };
    let a = TestApp::spawn_with(config(&args), store().await).await;
    let b = TestApp::spawn_with(config(&args), store().await).await;

    a.enter("default", "fast").await; // the fast track's one slot
    let mut tickets = Vec::new();
    for user in ["ahead0", "ahead1", "me"] {
        let (code, body) = a.enter("default", user).await;
        assert_eq!(code, 201, "{body}");
        tickets.push(body["ticket"].as_str().unwrap().to_owned());
    }
    // On A: the current state, then a change (someone ahead leaves, and
    // the near-front re-read shows it), so A's ids include `<pass>.<n>`.
    let mut on_a = SseStream::open(&a, "default", &tickets[2], None).await;
    assert_eq!(on_a.status, 200);
    let mut seen_a = vec![on_a.next(5 * SECS).await.expect("the current state")];
    assert_eq!(seen_a[0].data["rank"], 2, "{:?}", seen_a[0]);
    assert_eq!(a.leave("default", &tickets[1]).await, 204);
    loop {
        let e = on_a.next(10 * SECS).await.expect("A's stream goes on");
        let moved = e.data["rank"] == 1;
        seen_a.push(e);
        if moved {
            break;
        }
    }
    // A shuts down; its stream ends.
    a.stop().await;
    while let Some(e) = on_a.next(10 * SECS).await {
        seen_a.push(e);
    }
    let last_a = seen_a.last().unwrap().id.clone();
    let max_a = seen_a.iter().map(id_of).max().unwrap();

    // The client reconnects to B with the last id it saw.
    let mut on_b = SseStream::open(&b, "default", &tickets[2], Some(&last_a)).await;
    assert_eq!(on_b.status, 200);
    let first_b = on_b
        .next(5 * SECS)
        .await
        .expect("the current state at once");
    assert_eq!(first_b.event, "waiting");
    assert_eq!(first_b.data["rank"], 1, "{first_b:?}");
    let mut seen_b = vec![first_b];
    // And a change on B.
    assert_eq!(b.leave("default", &tickets[0]).await, 204);
    loop {
        let e = on_b.next(10 * SECS).await.expect("B's stream goes on");
        let moved = e.data["rank"] == 0;
        seen_b.push(e);
        if moved {
            break;
        }
    }
    let ids_b: Vec<(u64, u32)> = seen_b.iter().map(id_of).collect();
    for id in &ids_b {
        assert!(
            *id > max_a,
            "B sent id {id:?}, not after A's {max_a:?} (A: {seen_a:?}, B: {seen_b:?})"
        );
    }
    assert!(ids_b.windows(2).all(|w| w[0] < w[1]), "{ids_b:?}");
    b.stop().await;
}

#[tokio::test]
async fn a_malformed_or_absurd_last_event_id_is_ignored() {
    let app = TestApp::memory(IDLE).await;
    app.enter("default", "first").await;
    let (_, body) = app.enter("default", "me").await;
    let ticket = body["ticket"].as_str().unwrap().to_owned();
    let plain = SseStream::open(&app, "default", &ticket, None)
        .await
        .next(5 * SECS)
        .await
        .unwrap();
    for bad in [
        "garbage",
        "-1",
        "3.x",
        "99999999999999999999999",
        "18446744073709551615.4294967295",
        "1000000.0",
    ] {
        let mut s = SseStream::open(&app, "default", &ticket, Some(bad)).await;
        assert_eq!(s.status, 200, "{bad}");
        let e = s.next(5 * SECS).await.expect("the current state");
        assert_eq!(e.event, "waiting", "{bad}");
        assert_eq!(e.id, plain.id, "{bad} ignored");
    }
    app.stop().await;
}
