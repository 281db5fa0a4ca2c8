//! Adaptive admission: the rate follows the demo order service's health.
//! A buyer simulator orders with every token a pass hands out; the demo
//! service slowed on purpose (delay over the target) makes the stored rate
//! fall to the floor, and restored makes it climb back (memory and Redis).
//! Two instances on one Redis cut once per slow window, not twice; the
//! token API's claim-to-consume time counts; bad settings and bad knobs
//! are `400` naming the field and change nothing; Redis down → the
//! controller decides nothing and nothing panics.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use waitroom::queue::QueueName;
use waitroom::store::redis::RedisStore;
use waitroom::store::{OrderSignal, QueueEvent, SharedStore, StoreEvent};

use crate::common::{RedisProcess, TestApp, config, eventually, redis_url, unique_prefix};

const ADMIN: &str = "admin-token-for-adaptive-tests-0123";
const SERVICE: &str = "service-token-for-adaptive-01234";
const WINDOW_MS: u64 = 500;

fn q() -> QueueName {
    QueueName::parse("default").unwrap()
}

/// 40 per second (4 per 100 ms pass), adaptive between 10 and 40 per
/// second, p95 target 250 ms, half-second windows.
fn args() -> Vec<&'static str> {
    vec![
        "--admin-token",
        ADMIN,
        "--service-token",
        SERVICE,
        "--admission-batch",
        "4",
        "--admission-interval-ms",
        "100",
        "--adaptive",
        "--adaptive-floor",
        "10",
        "--adaptive-ceiling",
        "40",
        "--adaptive-target-p95-ms",
        "250",
        "--adaptive-window-ms",
        "500",
    ]
}

async fn admin(app: &TestApp, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = app
        .client
        .request(method.parse().unwrap(), app.admin_url(path))
        .bearer_auth(ADMIN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Tunes the rule for short tests and stocks the demo product.
async fn prepare(app: &TestApp) {
    let (code, body) = admin(
        app,
        "PUT",
        "/api/admin/queues/default",
        Some(json!({"adaptive": {"factor": 0.5, "stepPerSec": 10, "minSamples": 3, "holdWindows": 1}})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = admin(
        app,
        "PUT",
        "/api/admin/products/demo-sneaker",
        Some(json!({"name": "Sneaker", "queue": "default", "priceCents": 100, "stock": 1_000_000})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
}

/// The stored batch per 100 ms pass (the rate in tens per second).
async fn batch(store: &SharedStore) -> u32 {
    store
        .queue_settings(&q())
        .await
        .unwrap()
        .unwrap()
        .settings
        .batch
}

/// Buyers: keeps about 100 in line, and orders with every token a pass
/// hands out (through the demo service, so the gate measures each
/// order). Counts orders placed.
fn buyers(app: &TestApp, stop: CancellationToken) -> Arc<AtomicU64> {
    let placed = Arc::new(AtomicU64::new(0));
    let store = app.state.store().clone();
    let (client, base) = (app.client.clone(), app.url(""));
    let mut events = store.subscribe(&[q()]);
    let orders = placed.clone();
    let stopped = stop.clone();
    let (oc, ob) = (client.clone(), base.clone());
    tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                _ = stopped.cancelled() => return,
                e = events.next() => e,
            };
            let Some(StoreEvent::Queue {
                event: QueueEvent::Pass(pass),
                ..
            }) = event
            else {
                continue;
            };
            for a in pass.admitted {
                let (client, base, orders) = (oc.clone(), ob.clone(), orders.clone());
                tokio::spawn(async move {
                    let r = client
                        .post(format!("{base}/api/orders"))
                        .header("x-user-id", a.user.as_str())
                        .header("x-entry-token", &a.token)
                        .header("x-queue", "default")
                        .json(&json!({"productId": "demo-sneaker", "quantity": 1}))
                        .send()
                        .await;
                    if r.is_ok_and(|r| r.status().as_u16() == 201) {
                        orders.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        }
    });
    tokio::spawn(async move {
        let mut n = 0u64;
        while !stop.is_cancelled() {
            let waiting = store.stats(&q()).await.map_or(0, |s| s.waiting);
            for _ in waiting..100 {
                n += 1;
                let _ = client
                    .post(format!("{base}/api/queues/default/entries"))
                    .header("x-user-id", format!("buyer{n}"))
                    .send()
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    placed
}

async fn slowdown(app: &TestApp, delay_ms: u64) {
    let (code, body) = admin(
        app,
        "PUT",
        "/api/admin/orders/slowdown",
        Some(json!({"delayMs": delay_ms})),
    )
    .await;
    assert_eq!((code, body["delayMs"].as_u64()), (200, Some(delay_ms)));
}

async fn rate_falls_when_slowed_and_climbs_back(app: TestApp) {
    prepare(&app).await;
    let store = app.state.store().clone();
    let stop = CancellationToken::new();
    let placed = buyers(&app, stop.clone());

    // Healthy: orders are measured and the rate stays at the ceiling.
    let state = eventually(Duration::from_secs(12), "a healthy decision", || async {
        let (_, view) = admin(&app, "GET", "/api/admin/queues/default", None).await;
        let s = view["adaptiveState"].clone();
        // At the ceiling after a healthy window (a slow start on a busy
        // machine may cut it first; it climbs back).
        let healthy = s["verdict"] == "increase" && s["commits"].as_u64() >= Some(3);
        (healthy && s["ratePerSec"] == 40.0).then_some(s)
    })
    .await;
    assert!(state["p95Ms"].as_u64().is_some_and(|p| p <= 250), "{state}");
    assert_eq!(batch(&store).await, 4);

    // Slowed past the target: cut by half a window, down to the floor.
    slowdown(&app, 400).await;
    eventually(Duration::from_secs(8), "the rate at the floor", || async {
        (batch(&store).await == 1).then_some(())
    })
    .await;
    let (_, view) = admin(&app, "GET", "/api/admin/queues/default", None).await;
    let s = &view["adaptiveState"];
    assert_eq!(s["ratePerSec"], 10.0, "{view}");
    assert!(s["p95Ms"].as_u64().is_some_and(|p| p > 250), "{view}");
    // Held at the floor while slow, never below.
    tokio::time::sleep(Duration::from_millis(3 * WINDOW_MS)).await;
    assert_eq!(batch(&store).await, 1, "stays at the floor while slow");

    // Restored: climbs back step by step.
    slowdown(&app, 0).await;
    eventually(Duration::from_secs(12), "the rate back up", || async {
        (batch(&store).await >= 3).then_some(())
    })
    .await;
    stop.cancel();
    assert!(placed.load(Ordering::Relaxed) > 20, "the simulator ordered");

    let metrics = app
        .client
        .get(app.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("waitroom_adaptive_rate{queue=\"default\"}")),
        "{metrics}"
    );
    assert!(metrics.contains("waitroom_adaptive_decisions_total"));
    app.stop().await;
}

#[tokio::test]
async fn memory_rate_falls_when_slowed_and_climbs_back() {
    rate_falls_when_slowed_and_climbs_back(TestApp::memory(&args()).await).await;
}

#[tokio::test]
async fn redis_rate_falls_when_slowed_and_climbs_back() {
    crate::needs_redis!();
    rate_falls_when_slowed_and_climbs_back(TestApp::redis("adaptive", &args()).await).await;
}

/// Waits until a fresh window of the store clock has most of its length
/// left; answers it.
async fn fresh_window(store: &SharedStore) -> u64 {
    loop {
        let read = store.adaptive_read(&q(), WINDOW_MS).await.unwrap();
        let into = read.now_ms % WINDOW_MS;
        if (40..WINDOW_MS / 3).contains(&into) {
            return read.window + 1;
        }
        tokio::time::sleep(Duration::from_millis((WINDOW_MS + 45 - into) % WINDOW_MS)).await;
    }
}

#[tokio::test]
async fn two_instances_cut_once_per_slow_window() {
    crate::needs_redis!();
    let prefix = unique_prefix("adaptive2");
    let mut flags = args();
    flags.extend(["--key-prefix", &prefix]);
    let store = || async {
        let s: SharedStore = Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap());
        s
    };
    let watcher = store().await;
    let a = TestApp::spawn_with(config(&flags), store().await).await;
    let b = TestApp::spawn_with(config(&flags), store().await).await;
    // A long hold: after the cut, nothing but another cut could move it.
    let (code, body) = admin(
        &a,
        "PUT",
        "/api/admin/queues/default",
        Some(json!({"adaptive": {"factor": 0.5, "minSamples": 3, "holdWindows": 50}})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let version = watcher.queue_settings(&q()).await.unwrap().unwrap().version;

    let window = fresh_window(&watcher).await;
    for _ in 0..5 {
        watcher
            .record_order(&q(), OrderSignal::Committed { ms: 1_000 }, WINDOW_MS)
            .await
            .unwrap();
    }
    let state = eventually(
        Duration::from_secs(5),
        "the slow window decided",
        || async {
            let read = watcher.adaptive_read(&q(), WINDOW_MS).await.unwrap();
            read.state.filter(|s| s.window >= window)
        },
    )
    .await;
    assert_eq!(state.window, window, "{state:?}");
    assert_eq!(
        (state.verdict.as_str(), state.rate_per_sec, state.commits),
        ("decrease_slow", 20.0, 5)
    );
    // Two more windows without orders: no change, and one write in all.
    tokio::time::sleep(Duration::from_millis(3 * WINDOW_MS)).await;
    let read = watcher.adaptive_read(&q(), WINDOW_MS).await.unwrap();
    let last = read.state.unwrap();
    assert!(last.window > window, "later windows were decided: {last:?}");
    assert_eq!(
        (last.verdict.as_str(), last.rate_per_sec),
        ("too_few_samples", 20.0)
    );
    let now = watcher.queue_settings(&q()).await.unwrap().unwrap();
    assert_eq!(
        (now.settings.batch, now.version),
        (2, version + 1),
        "cut once: {now:?}"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn token_api_claim_to_consume_time_is_counted() {
    let app = TestApp::memory(&args()).await;
    // Long windows, so the decision that counted the order stays readable.
    let (code, _) = admin(
        &app,
        "PUT",
        "/api/admin/queues/default",
        Some(json!({"adaptive": {"windowMs": 2000}})),
    )
    .await;
    assert_eq!(code, 200);
    let token = crate::common::ready(&app, "polyglot").await;
    let claim = app
        .client
        .post(app.admin_url("/api/tokens/claim"))
        .bearer_auth(SERVICE)
        .json(&json!({"userId": "polyglot", "token": token}))
        .send()
        .await
        .unwrap();
    assert_eq!(claim.status().as_u16(), 200);
    let claim: Value = claim.json().await.unwrap();
    tokio::time::sleep(Duration::from_millis(220)).await;
    let consumed = app
        .client
        .post(app.admin_url("/api/tokens/consume"))
        .bearer_auth(SERVICE)
        .json(&json!({"userId": "polyglot", "queue": "default", "claimId": claim["claimId"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(consumed.status().as_u16(), 204);
    // Too few to act on (one order), but counted, with its time.
    let state = eventually(Duration::from_secs(8), "the order counted", || async {
        let (_, view) = admin(&app, "GET", "/api/admin/queues/default", None).await;
        let s = view["adaptiveState"].clone();
        (s["commits"] == 1).then_some(s)
    })
    .await;
    assert_eq!(state["verdict"], "too_few_samples", "{state}");
    assert_eq!(
        state["p95Ms"], 300,
        "220 ms is in the 200-300 bucket: {state}"
    );
    assert_eq!(batch(app.state.store()).await, 4, "unchanged");
    app.stop().await;
}

#[tokio::test]
async fn bad_settings_and_knobs_are_refused_naming_the_field() {
    let app = TestApp::memory(&args()).await;
    let before = app
        .state
        .store()
        .queue_settings(&q())
        .await
        .unwrap()
        .unwrap();
    for (body, field) in [
        (
            json!({"adaptive": {"floorPerSec": 50}}),
            "adaptive.ceilingPerSec",
        ),
        (
            json!({"adaptive": {"floorPerSec": 1}}),
            "adaptive.floorPerSec",
        ),
        (
            json!({"adaptive": {"targetP95Ms": 0}}),
            "adaptive.targetP95Ms",
        ),
        (json!({"adaptive": {"factor": 1.0}}), "adaptive.factor"),
        (json!({"adaptive": {"windowMs": 5}}), "adaptive.windowMs"),
        (
            json!({"adaptive": {"maxFailureRatio": -1}}),
            "adaptive.maxFailureRatio",
        ),
    ] {
        let (code, err) = admin(&app, "PUT", "/api/admin/queues/default", Some(body)).await;
        assert_eq!(
            (code, err["error"].as_str()),
            (400, Some("invalid_settings")),
            "{err}"
        );
        let message = err["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{message} names {field}");
    }
    let (code, err) = admin(
        &app,
        "PUT",
        "/api/admin/queues/default",
        Some(json!({"adaptive": {"florPerSec": 5}})),
    )
    .await;
    assert_eq!(
        (code, err["error"].as_str()),
        (400, Some("invalid_body")),
        "{err}"
    );
    let after = app
        .state
        .store()
        .queue_settings(&q())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after, before, "nothing written");

    for (body, field) in [
        (json!({"delayMs": 60_001}), "delayMs"),
        (json!({"failRatio": 1.5}), "failRatio"),
    ] {
        let (code, err) = admin(&app, "PUT", "/api/admin/orders/slowdown", Some(body)).await;
        assert_eq!(
            (code, err["error"].as_str()),
            (400, Some("invalid_slowdown")),
            "{err}"
        );
        assert!(err["message"].as_str().unwrap().starts_with(field), "{err}");
    }
    let (code, knob) = admin(&app, "GET", "/api/admin/orders/slowdown", None).await;
    assert_eq!((code, knob), (200, json!({"delayMs": 0, "failRatio": 0.0})));

    // Switched off, then removed: the batch stays as it was.
    let (code, view) = admin(
        &app,
        "PUT",
        "/api/admin/queues/default",
        Some(json!({"adaptive": {"enabled": false}})),
    )
    .await;
    assert_eq!((code, &view["adaptive"]["enabled"]), (200, &json!(false)));
    assert_eq!(view["adaptive"]["floorPerSec"], 10.0, "the rest kept");
    let (code, view) = admin(
        &app,
        "PUT",
        "/api/admin/queues/default",
        Some(json!({"adaptive": null})),
    )
    .await;
    assert_eq!(code, 200);
    assert!(view.get("adaptive").is_none(), "{view}");
    assert_eq!(view["batch"], 4);
    app.stop().await;
}

#[tokio::test]
async fn redis_down_decides_nothing_and_nothing_panics() {
    crate::needs_redis!();
    let mut redis = RedisProcess::start(false);
    let store: SharedStore = Arc::new(
        RedisStore::connect(&redis.url(), "adaptive-down")
            .await
            .unwrap(),
    );
    let app = TestApp::spawn_with(config(&args()), store.clone()).await;
    let before = store.queue_settings(&q()).await.unwrap().unwrap();
    redis.kill();
    assert!(
        waitroom::tasks::adaptive::step(&store, &q()).await.is_err(),
        "no decision without the store"
    );
    let (code, err) = admin(&app, "GET", "/api/admin/queues/default", None).await;
    assert_eq!(
        (code, err["error"].as_str()),
        (503, Some("store_unavailable"))
    );
    tokio::time::sleep(Duration::from_millis(2 * WINDOW_MS)).await;
    let health = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200, "still serving");
    assert_eq!(
        app.state.catalog().get(&q()).unwrap().settings.batch,
        before.settings.batch,
        "the rate stays where it was"
    );
    app.stop().await;
}

/// An order service written against the token API, as a team's own code
/// in another language would be: for each buyer who hands it an entry
/// token, claim it, run the order's transaction (`transaction_ms`, which
/// the test changes), consume the claim. 24 workers, as a small pool of
/// database connections would allow.
struct OrderService {
    transaction_ms: Arc<AtomicU64>,
    orders: tokio::sync::mpsc::Sender<(String, String)>,
    committed: Arc<AtomicU64>,
}

impl OrderService {
    fn start(app: &TestApp, stop: CancellationToken) -> Self {
        let (orders, rx) = tokio::sync::mpsc::channel::<(String, String)>(10_000);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let transaction_ms = Arc::new(AtomicU64::new(10));
        let committed = Arc::new(AtomicU64::new(0));
        for _ in 0..24 {
            let (rx, client, stop) = (rx.clone(), app.client.clone(), stop.clone());
            let (claim_url, consume_url) = (
                app.admin_url("/api/tokens/claim"),
                app.admin_url("/api/tokens/consume"),
            );
            let (ms, committed) = (transaction_ms.clone(), committed.clone());
            tokio::spawn(async move {
                loop {
                    let next = tokio::select! {
                        _ = stop.cancelled() => return,
                        next = async { rx.lock().await.recv().await } => next,
                    };
                    let Some((user, token)) = next else { return };
                    let Ok(claim) = client
                        .post(&claim_url)
                        .bearer_auth(SERVICE)
                        .json(&json!({"userId": user, "token": token}))
                        .send()
                        .await
                    else {
                        continue;
                    };
                    let Ok(claim) = claim.json::<Value>().await else {
                        continue;
                    };
                    let Some(claim_id) = claim["claimId"].as_str() else {
                        continue;
                    };
                    // The order's transaction.
                    tokio::time::sleep(Duration::from_millis(ms.load(Ordering::Relaxed))).await;
                    let done = client
                        .post(&consume_url)
                        .bearer_auth(SERVICE)
                        .json(&json!({"userId": user, "queue": "default", "claimId": claim_id}))
                        .send()
                        .await;
                    if done.is_ok_and(|r| r.status().as_u16() == 204) {
                        committed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        Self {
            transaction_ms,
            orders,
            committed,
        }
    }
}

/// Buyers in a browser's place: each joins over HTTP, polls its place
/// until it holds an entry token, and hands it to the order service. About
/// `waiting` are in line at any time.
fn polling_buyers(app: &TestApp, service: &OrderService, waiting: u64, stop: CancellationToken) {
    let in_line = Arc::new(AtomicU64::new(0));
    let (client, base) = (app.client.clone(), app.url(""));
    let orders = service.orders.clone();
    tokio::spawn(async move {
        let mut n = 0u64;
        while !stop.is_cancelled() {
            while in_line.load(Ordering::Relaxed) < waiting {
                n += 1;
                in_line.fetch_add(1, Ordering::Relaxed);
                let (client, base, orders) = (client.clone(), base.clone(), orders.clone());
                let (in_line, stop) = (in_line.clone(), stop.clone());
                tokio::spawn(async move {
                    let user = format!("recovering-buyer-{n}");
                    let ticket = client
                        .post(format!("{base}/api/queues/default/entries"))
                        .header("x-user-id", &user)
                        .send()
                        .await
                        .ok();
                    let ticket = match ticket {
                        Some(r) => r.json::<Value>().await.ok(),
                        None => None,
                    };
                    let ticket = ticket.and_then(|t| t["ticket"].as_str().map(str::to_owned));
                    // A buyer gives up after a minute, as a person would.
                    for _ in 0..300 {
                        let Some(ticket) = ticket.as_deref() else {
                            break;
                        };
                        if stop.is_cancelled() {
                            break;
                        }
                        let place = client
                            .get(format!("{base}/api/queues/default/position"))
                            .header("x-queue-ticket", ticket)
                            .send()
                            .await;
                        let place = match place {
                            Ok(r) => r.json::<Value>().await.unwrap_or(Value::Null),
                            Err(_) => Value::Null,
                        };
                        if let Some(token) = place["entryToken"].as_str() {
                            let _ = orders.send((user.clone(), token.to_owned())).await;
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    in_line.fetch_sub(1, Ordering::Relaxed);
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

/// The controller's rate and verdict, as the admin API shows them.
async fn adaptive_rate(app: &TestApp) -> (f64, String) {
    let (_, view) = admin(app, "GET", "/api/admin/queues/default", None).await;
    let s = &view["adaptiveState"];
    (
        s["ratePerSec"].as_f64().unwrap_or(0.0),
        s["verdict"].as_str().unwrap_or("").to_owned(),
    )
}

/// Fast, then slow, then fast again, with settings whose floor sees fewer
/// orders in a window than a decision needs (2 a second over 1-s windows,
/// 5 needed): the rate falls to the floor while slow, and once fast again
/// the decision gathers orders over several windows and climbs, back to
/// half its earlier rate within 15 s.
async fn rate_recovers_from_the_floor_with_an_order_service_on_the_token_api(app: TestApp) {
    let (code, body) = admin(
        &app,
        "PUT",
        "/api/admin/queues/default",
        Some(json!({"batch": 10, "intervalMs": 500, "adaptive": {
            "floorPerSec": 2, "ceilingPerSec": 20, "targetP95Ms": 250, "windowMs": 1000,
            "stepPerSec": 4, "factor": 0.5, "minSamples": 5, "holdWindows": 1}})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let stop = CancellationToken::new();
    let service = OrderService::start(&app, stop.clone());
    polling_buyers(&app, &service, 40, stop.clone());

    // Fast: healthy decisions at the ceiling.
    eventually(
        Duration::from_secs(15),
        "healthy at the ceiling",
        || async {
            let (rate, verdict) = adaptive_rate(&app).await;
            (verdict == "increase" && rate == 20.0).then_some(())
        },
    )
    .await;
    let earlier = 20.0;

    // Slow: every order's transaction takes 600 ms, over the 250-ms target.
    service.transaction_ms.store(600, Ordering::Relaxed);
    eventually(Duration::from_secs(20), "the rate at the floor", || async {
        let (rate, _) = adaptive_rate(&app).await;
        (rate <= 2.0).then_some(())
    })
    .await;
    // A few windows at the floor while still slow: it stays there.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rate, verdict) = adaptive_rate(&app).await;
    assert!(rate <= 2.0 * 1.5, "stays low while slow: {rate} {verdict}");

    // Fast again: back to at least half the earlier rate within 15 s.
    service.transaction_ms.store(10, Ordering::Relaxed);
    let fast_again = tokio::time::Instant::now();
    let (rate, verdict) = eventually(
        Duration::from_secs(15),
        "the rate climbing back",
        || async {
            let (rate, verdict) = adaptive_rate(&app).await;
            (rate >= earlier / 2.0).then_some((rate, verdict))
        },
    )
    .await;
    let took = fast_again.elapsed();
    stop.cancel();
    assert!(
        service.committed.load(Ordering::Relaxed) > 30,
        "the order service committed orders through the token API"
    );
    eprintln!("back to {rate}/s ({verdict}) {took:?} after the service was fast again");
    app.stop().await;
}

#[tokio::test]
async fn memory_rate_recovers_from_the_floor_with_an_order_service_on_the_token_api() {
    rate_recovers_from_the_floor_with_an_order_service_on_the_token_api(
        TestApp::memory(&args()).await,
    )
    .await;
}

#[tokio::test]
async fn redis_rate_recovers_from_the_floor_with_an_order_service_on_the_token_api() {
    crate::needs_redis!();
    rate_recovers_from_the_floor_with_an_order_service_on_the_token_api(
        TestApp::redis("adaptive-recovery", &args()).await,
    )
    .await;
}

#[tokio::test]
async fn settings_whose_floor_cannot_reach_a_decision_are_refused() {
    let app = TestApp::memory(&args()).await;
    // 10/s x 0.5 s x 8 windows = 40 orders at the floor: 41 never decide.
    let (code, err) = admin(
        &app,
        "PUT",
        "/api/admin/queues/default",
        Some(json!({"adaptive": {"minSamples": 41}})),
    )
    .await;
    assert_eq!(
        (code, err["error"].as_str()),
        (400, Some("invalid_settings")),
        "{err}"
    );
    let message = err["message"].as_str().unwrap();
    assert!(message.starts_with("adaptive.minSamples"), "{message}");
    let (code, view) = admin(
        &app,
        "PUT",
        "/api/admin/queues/default",
        Some(json!({"adaptive": {"minSamples": 40}})),
    )
    .await;
    assert_eq!((code, &view["adaptive"]["minSamples"]), (200, &json!(40)));
    app.stop().await;
}
