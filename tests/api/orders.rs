//! The order gate and the demo order service: one order per entry token,
//! deleted after commit, kept after rollback, never oversold.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use waitroom::gate::Gate;
use waitroom::http::EntryPass;
use waitroom::queue::{QueueName, Standing, UserId};
use waitroom::store::SharedStore;
use waitroom::store::redis::RedisStore;

use crate::common::{RedisProcess, TestApp, config, eventually, ready};

const ADMIN: &str = "admin-token-for-tests-0123456789";
const SERVICE: &str = "service-token-for-tests-0123";
const PRODUCT: &str = "demo-sneaker";

/// Fast admission so buyers become READY quickly.
fn fast(extra: &[&'static str]) -> Vec<&'static str> {
    let mut v = vec![
        "--admission-interval-ms",
        "100",
        "--admission-batch",
        "100",
        "--admin-token",
        ADMIN,
        "--service-token",
        SERVICE,
    ];
    v.extend_from_slice(extra);
    v
}

async fn order(app: &TestApp, user: &str, token: Option<&str>, body: Value) -> (u16, Value) {
    let mut req = app
        .client
        .post(app.url("/api/orders"))
        .header("x-user-id", user)
        .json(&body);
    if let Some(t) = token {
        req = req.header("x-entry-token", t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn buy(qty: i64) -> Value {
    json!({ "productId": PRODUCT, "quantity": qty })
}

async fn stock(app: &TestApp) -> i64 {
    app.state
        .orders()
        .unwrap()
        .product(PRODUCT)
        .await
        .unwrap()
        .unwrap()
        .stock
}

async fn orders_made(app: &TestApp) -> i64 {
    app.state
        .orders()
        .unwrap()
        .order_count(PRODUCT)
        .await
        .unwrap()
}

async fn set_stock(app: &TestApp, stock: i64) {
    let r = app
        .client
        .put(app.admin_url(&format!("/api/admin/products/{PRODUCT}")))
        .bearer_auth(ADMIN)
        .json(&json!({ "name": "Limited sneaker drop", "queue": "default", "priceCents": 12900, "stock": stock }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// The stores and order databases every order test runs on: memory and
/// Redis with SQLite, Redis with PostgreSQL.
fn both() -> Vec<&'static str> {
    crate::common::backends(&["memory", "redis", "postgres"])
}

async fn app_of(kind: &str, extra: &[&'static str]) -> TestApp {
    match kind {
        "memory" => TestApp::memory(&fast(extra)).await,
        "postgres" => TestApp::redis_postgres("orders", &fast(extra)).await,
        _ => TestApp::redis("orders", &fast(extra)).await,
    }
}

#[tokio::test]
async fn bad_tokens_are_refused_before_any_order_logic() {
    for kind in both() {
        let app = app_of(kind, &[]).await;
        let token = ready(&app, "buyer").await;
        let other = ready(&app, "other").await;
        let before = stock(&app).await;
        for (user, token, code) in [
            ("buyer", None, "missing_token"),
            ("buyer", Some("A".repeat(43)), "invalid_token"),
            ("buyer", Some(other.clone()), "invalid_token"),
            ("someone-else", Some(token.clone()), "invalid_token"),
        ] {
            let (status, body) = order(&app, user, token.as_deref(), buy(1)).await;
            assert_eq!(status, 401, "{kind} {code}: {body}");
            assert_eq!(body["error"], code);
        }
        // Garbage body with a made-up token: still 401, the token comes first.
        let (status, _) = order(&app, "buyer", Some("nope"), json!("garbage")).await;
        assert_eq!(status, 401);
        let r = app
            .client
            .post(app.url("/api/orders"))
            .header("x-entry-token", &token)
            .json(&buy(1))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "no identity");
        assert_eq!(stock(&app).await, before, "{kind}: stock unchanged");
        assert_eq!(orders_made(&app).await, 0, "{kind}: no order row");
        // The positive control: the same token, by its own buyer, buys.
        // So the refusals above came from the checks, not from a token
        // that had lapsed or a setup that could not sell.
        let (status, body) = order(&app, "buyer", Some(&token), buy(1)).await;
        assert_eq!(status, 201, "{kind}: the right buyer and token: {body}");
        assert_eq!(stock(&app).await, before - 1);
        app.stop().await;
    }
}

#[tokio::test]
async fn an_expired_token_is_refused() {
    for kind in both() {
        let app = app_of(kind, &["--token-ttl-secs", "1"]).await;
        let token = ready(&app, "buyer").await;
        let before = stock(&app).await;
        // Wait on the store's own view of the token, not on a copied TTL.
        let expired = eventually(Duration::from_secs(5), "the token to expire", || {
            let app = &app;
            async move {
                let gone = app
                    .state
                    .store()
                    .status(
                        &QueueName::parse("default").unwrap(),
                        &UserId::parse("buyer").unwrap(),
                        false,
                    )
                    .await
                    .unwrap();
                matches!(gone.standing, Standing::NotEntered).then_some(())
            }
        });
        expired.await;
        let (status, body) = order(&app, "buyer", Some(&token), buy(1)).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (401, Some("invalid_token")),
            "{kind}: expired"
        );
        assert_eq!(stock(&app).await, before, "{kind}: stock unchanged");
        assert_eq!(orders_made(&app).await, 0, "{kind}: no order row");
        app.stop().await;
    }
}

#[tokio::test]
async fn one_token_twenty_concurrent_orders_exactly_one() {
    for kind in both() {
        let app = Arc::new(app_of(kind, &[]).await);
        let token = ready(&app, "racer").await;
        let before = stock(&app).await;
        let attempts = (0..20).map(|_| {
            let app = app.clone();
            let token = token.clone();
            tokio::spawn(async move { order(&app, "racer", Some(&token), buy(1)).await })
        });
        let results: Vec<(u16, Value)> = futures::future::join_all(attempts)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let created = results.iter().filter(|r| r.0 == 201).count();
        assert_eq!(created, 1, "{kind}: {results:?}");
        for (status, body) in &results {
            match status {
                201 => assert_eq!(body["status"], "CONFIRMED"),
                409 => assert_eq!(body["error"], "token_in_use"),
                401 => assert_eq!(body["error"], "invalid_token", "consumed by the winner"),
                other => panic!("{kind}: unexpected {other} {body}"),
            }
        }
        assert_eq!(stock(&app).await, before - 1);
        assert_eq!(orders_made(&app).await, 1);
        let (status, _) = order(&app, "racer", Some(&token), buy(1)).await;
        assert_eq!(status, 401, "{kind}: the used token is gone");
        let (_, pos) = app.enter("default", "racer").await;
        assert_ne!(pos["entryToken"].as_str(), Some(token.as_str()));
        Arc::into_inner(app).unwrap().stop().await;
    }
}

#[tokio::test]
async fn out_of_stock_rolls_back_and_keeps_the_token() {
    for kind in both() {
        let app = app_of(kind, &[]).await;
        set_stock(&app, 2).await;
        let token = ready(&app, "greedy").await;
        let (status, body) = order(&app, "greedy", Some(&token), buy(3)).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (409, Some("out_of_stock")),
            "{kind}"
        );
        assert_eq!(stock(&app).await, 2);
        let (status, body) = order(&app, "greedy", Some(&token), buy(2)).await;
        assert_eq!(status, 201, "{kind}: retry with less succeeds: {body}");
        assert_eq!(stock(&app).await, 0);
        // The order is the buyer's to read, nobody else's.
        let id = body["orderId"].as_str().unwrap();
        let mine = app
            .client
            .get(app.url(&format!("/api/orders/{id}")))
            .header("x-user-id", "greedy")
            .send()
            .await
            .unwrap();
        assert_eq!(mine.status(), 200);
        let mine: Value = mine.json().await.unwrap();
        assert_eq!(mine["userId"], "greedy", "{kind}");
        let theirs = app
            .client
            .get(app.url(&format!("/api/orders/{id}")))
            .header("x-user-id", "snoop")
            .send()
            .await
            .unwrap();
        assert_eq!(theirs.status(), 404);
        app.stop().await;
    }
}

/// Header mode: an order is read by its buyer only. A request without
/// `X-User-Id` names nobody and is refused `401` (the order id alone is
/// no credential: it shows up in logs, links and receipts); another
/// buyer gets `404`, exactly as for an order that does not exist.
#[tokio::test]
async fn header_mode_order_reads_need_the_buyer() {
    for kind in crate::common::backends(&["memory", "redis"]) {
        let app = app_of(kind, &[]).await;
        let token = ready(&app, "owner").await;
        let (status, body) = order(&app, "owner", Some(&token), buy(1)).await;
        assert_eq!(status, 201, "{kind}: {body}");
        let id = body["orderId"].as_str().unwrap().to_owned();
        let read = |user: Option<&'static str>, id: String| {
            let mut req = app.client.get(app.url(&format!("/api/orders/{id}")));
            if let Some(u) = user {
                req = req.header("x-user-id", u);
            }
            async move {
                let r = req.send().await.unwrap();
                let status = r.status().as_u16();
                (status, r.json::<Value>().await.unwrap_or(Value::Null))
            }
        };
        let (status, anonymous) = read(None, id.clone()).await;
        assert_eq!(
            (status, anonymous["error"].as_str()),
            (401, Some("missing_user_id")),
            "{kind}: {anonymous}"
        );
        assert!(
            !anonymous.to_string().contains(PRODUCT),
            "{kind}: {anonymous}"
        );
        // Nobody named, for an order that does not exist: the same 401,
        // so the answer tells nothing about which ids exist.
        let (status, _) = read(None, "ord_does-not-exist".into()).await;
        assert_eq!(status, 401, "{kind}");
        let (status, theirs) = read(Some("snoop"), id.clone()).await;
        assert_eq!(
            (status, theirs["error"].as_str()),
            (404, Some("unknown_order")),
            "{kind}: {theirs}"
        );
        let (status, mine) = read(Some("owner"), id.clone()).await;
        assert_eq!(status, 200, "{kind}: {mine}");
        assert_eq!(mine["userId"], "owner", "{kind}");
        app.stop().await;
    }
}

/// An order service that only knows the buyer's entry token (visitor
/// mode: the buyer is a visitor cookie the service cannot read) claims
/// with the token alone and learns the buyer from the answer, then
/// settles with it. A `userId` sent with the token must still be the
/// token's own.
#[tokio::test]
async fn the_token_api_claims_with_the_token_alone() {
    for kind in crate::common::backends(&["memory", "redis"]) {
        let args = fast(&[]);
        let config = waitroom::Config {
            identity: waitroom::config::IdentityMode::Visitor,
            ..config(&args)
        };
        let app = match kind {
            "memory" => TestApp::memory_with(config).await,
            _ => TestApp::redis_with("orders-by-token", config).await,
        };
        // A visitor joins as the page would; the service never sees the
        // cookie, only the token the buyer hands over.
        let joined = app
            .client
            .post(app.url("/api/queues/default/entries"))
            .send()
            .await
            .unwrap();
        assert_eq!(joined.status(), 201, "{kind}");
        let visitor = joined
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|c| c.strip_prefix("waitroom_visitor="))
            .and_then(|rest| rest.split(';').next())
            .and_then(|value| value.rsplit_once('.'))
            .map(|(id, _)| id.to_owned())
            .expect("a visitor cookie");
        let joined: Value = joined.json().await.unwrap();
        let token = joined["entryToken"]
            .as_str()
            .expect("fast-tracked")
            .to_owned();
        let claim = |body: Value| {
            app.client
                .post(app.admin_url("/api/tokens/claim"))
                .bearer_auth(SERVICE)
                .json(&body)
                .send()
        };

        // Refused, changing nothing: a made-up token, and another user's id
        // with the real token.
        for body in [
            json!({"token": "A".repeat(43)}),
            json!({"token": token, "userId": "someone-else"}),
        ] {
            let r = claim(body.clone()).await.unwrap();
            assert_eq!(r.status(), 401, "{kind}: {body}");
            let err: Value = r.json().await.unwrap();
            assert_eq!(err["error"], "invalid_token", "{kind}: {body}");
        }

        let r = claim(json!({"token": token})).await.unwrap();
        assert_eq!(r.status(), 200, "{kind}: the token alone claims");
        let granted: Value = r.json().await.unwrap();
        assert_eq!(granted["userId"], visitor.as_str(), "{kind}: {granted}");
        assert_eq!(granted["queue"], "default", "{kind}");
        // Held: a second claim by the token alone is refused as in use.
        let r = claim(json!({"token": token, "queue": "default"}))
            .await
            .unwrap();
        assert_eq!(r.status(), 409, "{kind}");
        let reference = json!({
            "userId": granted["userId"],
            "queue": granted["queue"],
            "claimId": granted["claimId"],
        });
        let released = app
            .client
            .post(app.admin_url("/api/tokens/release"))
            .bearer_auth(SERVICE)
            .json(&reference)
            .send()
            .await
            .unwrap();
        assert_eq!(released.status(), 204, "{kind}");

        // The caller that knows the user claims as before.
        let r = claim(json!({"token": token, "userId": visitor}))
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{kind}: with the user");
        let granted: Value = r.json().await.unwrap();
        let reference = json!({
            "userId": granted["userId"],
            "queue": granted["queue"],
            "claimId": granted["claimId"],
        });
        let consumed = app
            .client
            .post(app.admin_url("/api/tokens/consume"))
            .bearer_auth(SERVICE)
            .json(&reference)
            .send()
            .await
            .unwrap();
        assert_eq!(consumed.status(), 204, "{kind}");
        // Used up: the token alone no longer claims.
        let r = claim(json!({"token": token})).await.unwrap();
        assert_eq!(r.status(), 401, "{kind}: consumed");
        app.stop().await;
    }
}

/// A claim by the token alone fails closed when the store is away: `503`,
/// never a claim granted on a guess.
#[tokio::test]
async fn a_claim_by_token_alone_with_redis_down_is_503() {
    crate::needs_redis!();
    let mut redis = RedisProcess::start(false);
    let store: SharedStore = Arc::new(
        RedisStore::connect(&redis.url(), "claim-by-token")
            .await
            .unwrap(),
    );
    let app = TestApp::spawn_with(config(&fast(&[])), store).await;
    let token = ready(&app, "offline").await;
    redis.kill();
    let r = app
        .client
        .post(app.admin_url("/api/tokens/claim"))
        .bearer_auth(SERVICE)
        .json(&json!({"token": token}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "store_unavailable");
    app.stop().await;
}

#[tokio::test]
async fn bad_body_releases_the_claim_at_once() {
    crate::needs_redis!();
    let app = app_of("redis", &[]).await;
    let token = ready(&app, "typo").await;
    for bad in [
        json!({"productId": PRODUCT}),
        json!({"productId": PRODUCT, "quantity": 0}),
        json!("x"),
    ] {
        let (status, body) = order(&app, "typo", Some(&token), bad).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_body"))
        );
    }
    let (status, body) = order(
        &app,
        "typo",
        Some(&token),
        json!({"productId": "nope", "quantity": 1}),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("unknown_product"))
    );
    let (status, _) = order(&app, "typo", Some(&token), buy(1)).await;
    assert_eq!(status, 201, "the token survived every refused request");
    app.stop().await;
}

#[tokio::test]
async fn a_claim_whose_order_service_died_lapses_back_to_ready() {
    crate::needs_redis!();
    let app = app_of("redis", &["--claim-lease-secs", "1"]).await;
    let token = ready(&app, "crashy").await;
    // An order service in another language claims, then dies.
    let claim = |body: Value| {
        app.client
            .post(app.admin_url("/api/tokens/claim"))
            .bearer_auth(SERVICE)
            .json(&body)
            .send()
    };
    let r = claim(json!({"userId": "crashy", "token": token}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let claimed: Value = r.json().await.unwrap();
    assert_eq!(claimed["queue"], "default");
    let (status, body) = order(&app, "crashy", Some(&token), buy(1)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("token_in_use"))
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (status, _) = order(&app, "crashy", Some(&token), buy(1)).await;
    assert_eq!(status, 201, "the lapsed claim returned the token to READY");
    // The dead service's late consume no longer holds anything.
    let late = app
        .client
        .post(app.admin_url("/api/tokens/consume"))
        .bearer_auth(SERVICE)
        .json(&json!({"userId": "crashy", "queue": "default", "claimId": claimed["claimId"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(late.status(), 409);
    app.stop().await;
}

#[tokio::test]
async fn token_api_for_other_languages() {
    let app = app_of("memory", &[]).await;
    let token = ready(&app, "polyglot").await;
    let call = |path: &'static str, body: Value, auth: bool| {
        let mut req = app.client.post(app.admin_url(path)).json(&body);
        if auth {
            req = req.bearer_auth(SERVICE);
        }
        req.send()
    };
    let r = call(
        "/api/tokens/claim",
        json!({"userId": "polyglot", "token": token}),
        false,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 401, "service authentication required");
    let r = call(
        "/api/tokens/claim",
        json!({"userId": "polyglot", "token": "wrong"}),
        true,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 401);
    let r = call(
        "/api/tokens/claim",
        json!({"userId": "polyglot", "token": token, "queue": "default"}),
        true,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let claim: Value = r.json().await.unwrap();
    let r = call(
        "/api/tokens/claim",
        json!({"userId": "polyglot", "token": token}),
        true,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 409);
    let reference = json!({"userId": "polyglot", "queue": "default", "claimId": claim["claimId"]});
    assert_eq!(
        call("/api/tokens/release", reference.clone(), true)
            .await
            .unwrap()
            .status(),
        204
    );
    let r = call(
        "/api/tokens/claim",
        json!({"userId": "polyglot", "token": token}),
        true,
    )
    .await
    .unwrap();
    let claim: Value = r.json().await.unwrap();
    let reference = json!({"userId": "polyglot", "queue": "default", "claimId": claim["claimId"]});
    assert_eq!(
        call("/api/tokens/consume", reference.clone(), true)
            .await
            .unwrap()
            .status(),
        204
    );
    assert_eq!(
        call("/api/tokens/consume", reference, true)
            .await
            .unwrap()
            .status(),
        409
    );
    let r = call(
        "/api/tokens/claim",
        json!({"userId": "polyglot", "token": token}),
        true,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 401, "consumed");
    let r = call("/api/tokens/claim", json!({"nonsense": 1}), true)
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    app.stop().await;
}

#[tokio::test]
async fn five_hundred_buyers_three_hundred_in_stock() {
    crate::needs_redis!();
    let app = Arc::new(
        TestApp::redis(
            "oversell",
            &[
                "--admission-interval-ms",
                "50",
                "--admission-batch",
                "500",
                "--admin-token",
                ADMIN,
            ],
        )
        .await,
    );
    set_stock(&app, 300).await;
    let mut tokens = Vec::new();
    for i in 0..500 {
        tokens.push((format!("b{i:03}"), ready(&app, &format!("b{i:03}")).await));
    }
    let attempts = tokens.iter().cloned().map(|(user, token)| {
        let app = app.clone();
        tokio::spawn(async move { (order(&app, &user, Some(&token), buy(1)).await, user, token) })
    });
    let results: Vec<_> = futures::future::join_all(attempts)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let created = results.iter().filter(|r| r.0.0 == 201).count();
    let sold_out = results
        .iter()
        .filter(|r| r.0.0 == 409 && r.0.1["error"] == "out_of_stock")
        .count();
    assert_eq!((created, sold_out), (300, 200), "no oversell, no lost sale");
    assert_eq!(stock(&app).await, 0);
    assert_eq!(orders_made(&app).await, 300);
    let queue = QueueName::parse("default").unwrap();
    for ((status, _), user, _) in &results {
        let s = app
            .state
            .store()
            .status(&queue, &UserId::parse(user).unwrap(), false)
            .await
            .unwrap();
        match status {
            201 => assert_eq!(
                s.standing,
                Standing::NotEntered,
                "{user}'s used token is deleted"
            ),
            _ => assert!(
                matches!(s.standing, Standing::Ready { .. }),
                "{user} keeps the token after a rollback"
            ),
        }
    }
    Arc::into_inner(app).unwrap().stop().await;
}

#[tokio::test]
async fn consuming_frees_the_only_active_slot() {
    crate::needs_redis!();
    let app = app_of(
        "redis",
        &["--max-active", "1", "--admission-interval-ms", "150"],
    )
    .await;
    let first = ready(&app, "one").await;
    let (_, second) = app.enter("default", "two").await;
    let ticket = second["ticket"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, p) = app.position("default", &ticket).await;
    assert_eq!(p["status"], "WAITING", "maxActive 1 is taken");
    let (status, _) = order(&app, "one", Some(&first), buy(1)).await;
    assert_eq!(status, 201);
    eventually(Duration::from_secs(2), "two admitted after one's order", || {
        let ticket = ticket.clone();
        let app = &app;
        async move { (app.position("default", &ticket).await.1["status"] == "READY").then_some(()) }
    })
    .await;
    app.stop().await;
}

#[tokio::test]
async fn redis_down_refuses_orders_and_writes_nothing() {
    crate::needs_redis!();
    let mut redis = RedisProcess::start(false);
    let store = Arc::new(RedisStore::connect(&redis.url(), "o503").await.unwrap());
    let app = TestApp::spawn_with(config(&fast(&[])), store).await;
    let token = ready(&app, "unlucky").await;
    let before = stock(&app).await;
    redis.kill();
    let (status, body) = order(&app, "unlucky", Some(&token), buy(1)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("store_unavailable"))
    );
    assert_eq!(stock(&app).await, before);
    assert_eq!(orders_made(&app).await, 0);
    app.stop().await;
}

/// An order service whose token store fails right after its transaction
/// committed: the buyer still gets 201, and the token is deleted by the
/// gate's retry once Redis is back.
#[tokio::test]
async fn consume_failing_after_commit_is_retried_until_it_succeeds() {
    crate::needs_redis!();
    let redis = Arc::new(Mutex::new(RedisProcess::start(true)));
    let url = redis.lock().await.url();
    let store: SharedStore = Arc::new(RedisStore::connect(&url, "retry").await.unwrap());
    let app = TestApp::spawn_with(config(&fast(&[])), store.clone()).await;
    let token = ready(&app, "durable").await;
    let gate: Gate = app.state.gate().clone();

    // A Rust order service built on the gate; its "database commit" is
    // followed by the token store going down.
    let crash = redis.clone();
    let order_service = Router::new()
        .route(
            "/orders",
            post(move |pass: EntryPass| {
                let crash = crash.clone();
                async move {
                    crash.lock().await.kill(); // after commit, before consume
                    pass.commit_succeeded().await;
                    (axum::http::StatusCode::CREATED, "committed")
                }
            }),
        )
        .with_state(gate.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, order_service).await.unwrap() });

    let r = reqwest::Client::new()
        .post(format!("http://{addr}/orders"))
        .header("x-user-id", "durable")
        .header("x-entry-token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "the order's success is the answer");
    assert_eq!(gate.pending_consumes(), 1, "the delete is being retried");
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.lock().await.restart(); // AOF: the token is still there
    eventually(
        Duration::from_secs(10),
        "the retry deleted the token",
        || async { (gate.pending_consumes() == 0).then_some(()) },
    )
    .await;
    let user = UserId::parse("durable").unwrap();
    let s = store
        .status(&QueueName::parse("default").unwrap(), &user, false)
        .await
        .unwrap();
    assert_eq!(s.standing, Standing::NotEntered);
    app.stop().await;
}
