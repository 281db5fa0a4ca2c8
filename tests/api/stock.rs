//! Stock-aware admission: a queue linked to stock admits no more buyers
//! than can still buy, a sold-out line is told so at once (streams `gone:
//! sold_out`, polls and joins `SOLD_OUT`), a restock reopens it in its
//! order, orders never oversell, and bad reports change nothing.

#[cfg(feature = "demo-orders")]
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
#[cfg(feature = "demo-orders")]
use std::time::Instant;

use futures::future::join_all;
use serde_json::{Value, json};
use waitroom::queue::QueueName;
use waitroom::store::redis::RedisStore;

use crate::common::{
    RedisProcess, SseStream, TestApp, config, eventually, redis_url, test_config, unique_prefix,
};

const ADMIN: &str = "admin-token-for-stock-tests-0123456";
const SERVICE: &str = "service-token-for-stock-tests-01";
const WAIT: Duration = Duration::from_secs(15);

fn args(extra: &[&'static str]) -> Vec<&'static str> {
    let mut v = vec![
        "--admission-interval-ms",
        "100",
        "--admission-batch",
        "500",
        "--token-ttl-secs",
        "600",
        "--abandon-after-secs",
        "600",
        "--admin-token",
        ADMIN,
        "--service-token",
        SERVICE,
    ];
    v.extend_from_slice(extra);
    v
}

async fn app_of(kind: &str, extra: &[&'static str]) -> TestApp {
    match kind {
        "memory" => TestApp::memory(&args(extra)).await,
        _ => TestApp::redis("stock", &args(extra)).await,
    }
}

fn q() -> QueueName {
    QueueName::parse("default").unwrap()
}

/// `PUT /api/admin/queues/default/stock` with `body`: (status, body).
async fn put_stock(app: &TestApp, body: Value) -> (u16, Value) {
    let r = app
        .client
        .put(app.admin_url("/api/admin/queues/default/stock"))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn get_stock(app: &TestApp) -> (u16, Value) {
    let r = app
        .client
        .get(app.admin_url("/api/admin/queues/default/stock"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Joins `users` to `default`, fifty at a time: their tickets, in order.
async fn join_all_of(app: &TestApp, users: &[String]) -> Vec<String> {
    let mut tickets = Vec::new();
    for chunk in users.chunks(50) {
        for (code, body) in join_all(chunk.iter().map(|u| app.enter("default", u))).await {
            assert_eq!(code, 201, "{body}");
            tickets.push(body["ticket"].as_str().unwrap().to_owned());
        }
    }
    tickets
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:04}")).collect()
}

/// The case: 1,000 in line for 100 units, one each. Admission
/// stops at 100 however many passes run; when the stock is gone every
/// open stream hears `gone: sold_out`, every poll and a new join answer
/// `SOLD_OUT`, and the holders keep their tokens.
#[tokio::test]
async fn a_thousand_wait_for_a_hundred_and_hear_sold_out() {
    for kind in crate::common::backends(&["memory", "redis"]) {
        let app = app_of(kind, &[]).await;
        let (code, body) = put_stock(&app, json!({ "remaining": 100, "maxPerBuyer": 1 })).await;
        assert_eq!(
            (code, body["admissible"].as_u64()),
            (200, Some(100)),
            "{body}"
        );
        let users = names("b", 1_000);
        let tickets = join_all_of(&app, &users).await;
        let stats = eventually(WAIT, "100 holders", || async {
            let s = app.state.store().stats(&q()).await.unwrap();
            (s.active + s.waiting == 1_000 && s.active == 100).then_some(s)
        })
        .await;
        // Passes keep running (ten a second): none admits past the stock.
        let pass = stats.pass;
        eventually(WAIT, "five more passes", || async {
            let s = app.state.store().stats(&q()).await.unwrap();
            (s.pass >= pass + 5).then_some(())
        })
        .await;
        let s = app.state.store().stats(&q()).await.unwrap();
        assert_eq!((s.active, s.waiting), (100, 900), "{kind}");

        let mut waiting = Vec::new();
        let mut holders = Vec::new();
        for (i, ticket) in tickets.iter().enumerate() {
            let (code, p) = app.position("default", ticket).await;
            assert_eq!(code, 200);
            match p["status"].as_str().unwrap() {
                "WAITING" => waiting.push(i),
                "READY" => holders.push(i),
                other => panic!("{kind}: {other}"),
            }
        }
        assert_eq!((holders.len(), waiting.len()), (100, 900), "{kind}");
        let mut streams = Vec::new();
        for &i in waiting.iter().step_by(30) {
            let mut s = SseStream::open(&app, "default", &tickets[i], None).await;
            assert_eq!(s.next(WAIT).await.unwrap().event, "waiting");
            streams.push(s);
        }

        // The order service sold the lot.
        let (code, body) = put_stock(&app, json!({ "remaining": 0 })).await;
        assert_eq!(
            (code, body["soldOut"].as_bool()),
            (200, Some(true)),
            "{body}"
        );
        for s in &mut streams {
            let events = s.until("gone", WAIT).await;
            let gone = events.last().unwrap();
            assert_eq!(gone.data["reason"], "sold_out", "{kind}: {events:?}");
            assert!(
                s.next(Duration::from_secs(5)).await.is_none(),
                "ends after gone"
            );
        }
        for &i in &waiting {
            let (code, p) = app.position("default", &tickets[i]).await;
            assert_eq!(
                (code, p["status"].as_str()),
                (200, Some("SOLD_OUT")),
                "{kind}"
            );
            assert!(p["position"].as_u64().is_some(), "the place is kept: {p}");
        }
        let (_, p) = app.position("default", &tickets[holders[0]]).await;
        assert_eq!(p["status"], "READY", "a holder keeps the token");
        let (code, body) = app.enter("default", "latecomer").await;
        assert_eq!(
            (code, body["status"].as_str()),
            (201, Some("SOLD_OUT")),
            "{body}"
        );
        let s = app.state.store().stats(&q()).await.unwrap();
        assert_eq!(s.active, 100, "{kind}: nobody admitted after");
        app.stop().await;
    }
}

#[cfg(feature = "demo-orders")]
async fn order(app: &TestApp, user: &str, token: &str) -> (u16, Value) {
    let r = app
        .client
        .post(app.url("/api/orders"))
        .header("x-user-id", user)
        .header("x-entry-token", token)
        .json(&json!({ "productId": "demo-sneaker", "quantity": 1 }))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[cfg(feature = "demo-orders")]
async fn restock(app: &TestApp, stock: i64) {
    let r = app
        .client
        .put(app.admin_url("/api/admin/products/demo-sneaker"))
        .bearer_auth(ADMIN)
        .json(&json!({ "name": "Limited sneaker drop", "queue": "default",
                       "priceCents": 12900, "stock": stock, "maxPerOrder": 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Polls every buyer until none is `WAITING` (or `deadline`), buying one
/// unit for each who is READY: (bought, sold out) user indexes.
#[cfg(feature = "demo-orders")]
async fn buy_until_settled(
    app: &TestApp,
    users: &[String],
    tickets: &[String],
    skip: &HashSet<usize>,
) -> (HashSet<usize>, HashSet<usize>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut bought, mut sold_out) = (HashSet::new(), HashSet::new());
    loop {
        let mut waiting = 0;
        for (i, ticket) in tickets.iter().enumerate() {
            if skip.contains(&i) || bought.contains(&i) {
                continue;
            }
            let (code, p) = app.position("default", ticket).await;
            if code == 429 {
                waiting += 1;
                continue;
            }
            assert_eq!(code, 200, "{p}");
            match p["status"].as_str().unwrap() {
                "READY" => {
                    let token = p["entryToken"].as_str().unwrap();
                    let (code, body) = order(app, &users[i], token).await;
                    assert_eq!(code, 201, "an admitted buyer finds stock: {body}");
                    bought.insert(i);
                    sold_out.remove(&i);
                }
                "SOLD_OUT" => {
                    sold_out.insert(i);
                }
                "WAITING" => waiting += 1,
                other => panic!("{other}: {p}"),
            }
        }
        if waiting == 0 {
            return (bought, sold_out);
        }
        assert!(Instant::now() < deadline, "{waiting} still waiting");
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
}

/// The demo order service reports its stock after every order and
/// restock (`--stock-from-orders`): 60 buyers for 20 units, one each. Just
/// 20 are admitted, each buys, nobody is refused for stock, the other 40
/// are told sold out; a restock of 5 admits the next 5 in line.
#[cfg(feature = "demo-orders")]
#[tokio::test]
async fn the_demo_service_sells_out_exactly_and_a_restock_reopens() {
    for kind in crate::common::backends(&["memory", "redis"]) {
        let app = app_of(kind, &["--stock-from-orders", "--admission-batch", "5"]).await;
        // The report made at start first, so it cannot land after ours.
        eventually(WAIT, "the start-up report", || async {
            (get_stock(&app).await.0 == 200).then_some(())
        })
        .await;
        restock(&app, 20).await;
        let (_, stock) = get_stock(&app).await;
        assert_eq!(
            (stock["remaining"].as_u64(), stock["maxPerBuyer"].as_u64()),
            (Some(20), Some(1))
        );
        let users = names("d", 60);
        let tickets = join_all_of(&app, &users).await;
        let (bought, sold_out) = buy_until_settled(&app, &users, &tickets, &HashSet::new()).await;
        assert_eq!((bought.len(), sold_out.len()), (20, 40), "{kind}");
        let orders = app.state.orders().unwrap();
        assert_eq!(orders.order_count("demo-sneaker").await.unwrap(), 20);
        assert_eq!(
            orders.product("demo-sneaker").await.unwrap().unwrap().stock,
            0
        );

        // The line's order is the entries' order: the restock must go to
        // the five at its head.
        let mut line = Vec::new();
        for &i in &sold_out {
            let user = waitroom::queue::UserId::parse(&users[i]).unwrap();
            let s = app.state.store().status(&q(), &user, false).await.unwrap();
            line.push((s.entry.expect("kept in line"), i));
        }
        line.sort_unstable();
        let head: HashSet<usize> = line[..5].iter().map(|&(_, i)| i).collect();
        restock(&app, 5).await;
        let (more, still) = buy_until_settled(&app, &users, &tickets, &bought).await;
        assert_eq!((more.len(), still.len()), (5, 35), "{kind}");
        assert_eq!(
            more, head,
            "{kind}: the restock went to the head of the line"
        );
        assert_eq!(orders.order_count("demo-sneaker").await.unwrap(), 25);
        app.stop().await;
    }
}

/// Two instances on one Redis: the stock reported through one holds the
/// other's admissions, and its sold-out reaches the other's streams.
#[tokio::test]
async fn a_sold_out_reported_on_one_instance_ends_the_streams_of_another() {
    crate::needs_redis!();
    let prefix = unique_prefix("stock2");
    let mut flags = args(&[]);
    flags.extend(["--ticket-secret", "stock-two-instances-secret-0123456"]);
    let cfg = || waitroom::Config {
        key_prefix: prefix.clone(),
        ..config(&flags)
    };
    let store = || async { Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap()) };
    let a = TestApp::spawn_with(cfg(), store().await).await;
    let b = TestApp::spawn_with(cfg(), store().await).await;
    assert_eq!(put_stock(&a, json!({ "remaining": 2 })).await.0, 200);
    let users = names("t", 8);
    let tickets = join_all_of(&b, &users).await;
    eventually(WAIT, "two holders", || async {
        let s = b.state.store().stats(&q()).await.unwrap();
        (s.active == 2 && s.waiting == 6).then_some(())
    })
    .await;
    let mut streams = Vec::new();
    for ticket in &tickets {
        let (_, p) = b.position("default", ticket).await;
        if p["status"] == "WAITING" {
            let mut s = SseStream::open(&b, "default", ticket, None).await;
            assert_eq!(s.next(WAIT).await.unwrap().event, "waiting");
            streams.push(s);
        }
    }
    assert_eq!(streams.len(), 6);
    assert_eq!(put_stock(&a, json!({ "remaining": 0 })).await.0, 200);
    for s in &mut streams {
        let events = s.until("gone", WAIT).await;
        assert_eq!(events.last().unwrap().data["reason"], "sold_out");
    }
    // A stream opened afterwards, on either instance, ends at once.
    let (_, p) = a.position("default", &tickets[7]).await;
    assert_eq!(p["status"], "SOLD_OUT");
    let mut late = SseStream::open(&a, "default", &tickets[7], None).await;
    let first = late.next(WAIT).await.unwrap();
    assert_eq!(
        (first.event.as_str(), &first.data["reason"]),
        ("gone", &json!("sold_out"))
    );
    a.stop().await;
    b.stop().await;
}

/// Redis gone: a report, a poll and a join are `503`, never a sold-out
/// answer made up from nothing; back, the stock is as it was.
#[tokio::test]
async fn redis_down_is_503_not_sold_out() {
    crate::needs_redis!();
    let mut redis = RedisProcess::start(false);
    let store = Arc::new(
        RedisStore::connect(&redis.url(), "stockdown")
            .await
            .unwrap(),
    );
    let cfg = waitroom::Config {
        admission_interval_ms: 200,
        admin_token: Some(ADMIN.into()),
        service_token: Some(SERVICE.into()),
        ..test_config()
    };
    let app = TestApp::spawn_with(cfg, store).await;
    assert_eq!(put_stock(&app, json!({ "remaining": 1 })).await.0, 200);
    app.enter("default", "first").await;
    let (_, body) = app.enter("default", "second").await;
    let ticket = body["ticket"].as_str().unwrap().to_owned();
    redis.kill();
    let (code, body) = put_stock(&app, json!({ "remaining": 0 })).await;
    assert_eq!(
        (code, body["error"].as_str()),
        (503, Some("store_unavailable"))
    );
    let r = app
        .client
        .post(app.admin_url("/api/tokens/stock"))
        .bearer_auth(SERVICE)
        .json(&json!({ "queue": "default", "remaining": 0 }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let (code, _) = app.position("default", &ticket).await;
    assert_eq!(code, 503);
    let (code, _) = app.enter("default", "third").await;
    assert_eq!(code, 503);
    assert_eq!(get_stock(&app).await.0, 503);
    app.stop().await;
}

/// Every malformed report is `400` and changes nothing; the queue, the
/// bearer and the service token are checked as everywhere else.
#[tokio::test]
async fn bad_stock_reports_are_refused_and_change_nothing() {
    let app = TestApp::memory(&args(&[])).await;
    for body in [
        json!({}),
        json!({ "remaining": -1 }),
        json!({ "remaining": "5" }),
        json!({ "remaining": 5.5 }),
        json!({ "remaining": null }),
        json!({ "remaining": 5, "maxPerBuyer": 0 }),
        json!({ "remaining": 5, "maxPerBuyer": -2 }),
        json!({ "remaining": 1_000_000_000_001u64 }),
        json!({ "remaining": 5, "maxPerBuyer": 1_000_000_000_001u64 }),
        json!({ "remaining": 5, "soldOut": true }),
        json!([5]),
    ] {
        let (code, answer) = put_stock(&app, body.clone()).await;
        assert_eq!(code, 400, "{body}: {answer}");
        assert!(
            matches!(
                answer["error"].as_str(),
                Some("invalid_body" | "invalid_stock")
            ),
            "{body}: {answer}"
        );
    }
    let r = app
        .client
        .put(app.admin_url("/api/admin/queues/default/stock"))
        .bearer_auth(ADMIN)
        .header("content-type", "application/json")
        .body("{\"remaining\": 5")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "truncated JSON");
    let (code, body) = get_stock(&app).await;
    assert_eq!(
        (code, body["error"].as_str()),
        (404, Some("no_stock")),
        "nothing was linked"
    );
    // The fast track still works: no stock was recorded.
    let (code, body) = app.enter("default", "free").await;
    assert_eq!((code, body["status"].as_str()), (201, Some("READY")));

    let unknown = app
        .client
        .put(app.admin_url("/api/admin/queues/nope/stock"))
        .bearer_auth(ADMIN)
        .json(&json!({ "remaining": 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let unauthorized = app
        .client
        .put(app.admin_url("/api/admin/queues/default/stock"))
        .bearer_auth(SERVICE)
        .json(&json!({ "remaining": 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status(), 401);

    let report = |bearer: &'static str, body: Value| {
        let app = &app;
        async move {
            let r = app
                .client
                .post(app.admin_url("/api/tokens/stock"))
                .bearer_auth(bearer)
                .json(&body)
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    assert_eq!(
        report(ADMIN, json!({ "queue": "default", "remaining": 1 }))
            .await
            .0,
        401
    );
    assert_eq!(
        report(SERVICE, json!({ "queue": "nope", "remaining": 1 }))
            .await
            .0,
        404
    );
    assert_eq!(
        report(SERVICE, json!({ "queue": "default", "remaining": -1 }))
            .await
            .0,
        400
    );
    assert_eq!(report(SERVICE, json!({ "remaining": 1 })).await.0, 400);
    assert_eq!(get_stock(&app).await.0, 404, "still nothing linked");
    let (code, body) = report(
        SERVICE,
        json!({ "queue": "default", "remaining": 3, "maxPerBuyer": 2 }),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        (
            body["remaining"].as_u64(),
            body["maxPerBuyer"].as_u64(),
            body["holders"].as_u64(),
            body["admissible"].as_u64()
        ),
        (Some(3), Some(2), Some(1), Some(1)),
        "{body}"
    );
    app.stop().await;
}
