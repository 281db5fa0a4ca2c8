//! The demo order service on a PostgreSQL that several instances share:
//! one stock and one order table, whichever instance takes the order, and
//! orders refused (`503`, the token kept) while the database is gone.
//!
//! Each test has a database of its own on the shared server
//! ([`PgDatabase`]), dropped at the end. "The database is gone" is that
//! database dropped `WITH (FORCE)` (its connections cut): the shared server
//! itself is never stopped.

use std::time::Duration;

use serde_json::{Value, json};
use waitroom::Config;

use crate::common::{PgDatabase, TestApp, config, ready, store};

const ADMIN: &str = "admin-token-for-pg-tests-0123456789";
const PRODUCT: &str = "demo-sneaker";

/// Two instances on one Redis prefix and one PostgreSQL database, started
/// at once (both create the schema: the advisory lock keeps them apart).
async fn two_instances(db: &PgDatabase) -> (TestApp, TestApp) {
    let shared = store("redis", "orders-pg").await;
    let config = Config {
        orders_db: db.url.clone(),
        // Tickets from one instance are read by the other.
        ticket_secret: Some("pg-tests-ticket-secret-0123456789".into()),
        ..config(&[
            "--admission-interval-ms",
            "50",
            "--admission-batch",
            "200",
            "--admin-token",
            ADMIN,
        ])
    };
    tokio::join!(
        TestApp::spawn_with(config.clone(), shared.clone()),
        TestApp::spawn_with(config, shared),
    )
}

async fn order(app: &TestApp, user: &str, token: &str, quantity: i64) -> (u16, Value) {
    let r = app
        .client
        .post(app.url("/api/orders"))
        .header("x-user-id", user)
        .header("x-entry-token", token)
        .json(&json!({"productId": PRODUCT, "quantity": quantity}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn stock_seen_by(app: &TestApp) -> i64 {
    let products: Value = app
        .client
        .get(app.url("/api/products"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    products
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == PRODUCT)
        .unwrap()["stock"]
        .as_i64()
        .unwrap()
}

async fn set_stock(app: &TestApp, stock: i64) {
    let r = app
        .client
        .put(app.admin_url(&format!("/api/admin/products/{PRODUCT}")))
        .bearer_auth(ADMIN)
        .json(&json!({"name": "Limited sneaker drop", "queue": "default", "priceCents": 12900, "stock": stock}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Forty buyers, twenty in stock, orders spread over two instances (each
/// buyer joins through one and orders through the other): exactly twenty
/// sold, both instances show the same stock, and an order placed through
/// one is read through the other.
#[tokio::test]
async fn two_instances_sell_exactly_the_stock_between_them() {
    crate::needs_redis!();
    let db = PgDatabase::create("sell").await;
    let (a, b) = two_instances(&db).await;
    assert_eq!(stock_seen_by(&a).await, 1000, "seeded once");
    assert_eq!(stock_seen_by(&b).await, 1000, "the same stock");
    set_stock(&a, 20).await;
    assert_eq!(
        stock_seen_by(&b).await,
        20,
        "a restock on one is seen by both"
    );

    let mut buyers = Vec::new();
    for i in 0..40 {
        let user = format!("pg{i:02}");
        let joined_at = if i % 2 == 0 { &a } else { &b };
        buyers.push((user.clone(), ready(joined_at, &user).await));
    }
    let attempts = buyers.iter().enumerate().map(|(i, (user, token))| {
        let at = if i % 2 == 0 { &b } else { &a };
        order(at, user, token, 1)
    });
    let results = futures::future::join_all(attempts).await;
    let sold: Vec<&Value> = results
        .iter()
        .filter(|(s, _)| *s == 201)
        .map(|(_, b)| b)
        .collect();
    let out: usize = results
        .iter()
        .filter(|(s, b)| *s == 409 && b["error"] == "out_of_stock")
        .count();
    assert_eq!(sold.len(), 20, "{results:?}");
    assert_eq!(out, 20, "the rest are out of stock: {results:?}");
    assert_eq!(stock_seen_by(&a).await, 0);
    assert_eq!(stock_seen_by(&b).await, 0);
    assert_eq!(
        a.state
            .orders()
            .unwrap()
            .order_count(PRODUCT)
            .await
            .unwrap(),
        20
    );

    // Every order is found through either instance, by its own buyer.
    for o in &sold {
        let id = o["orderId"].as_str().unwrap();
        let buyer = o["userId"].as_str().unwrap();
        for app in [&a, &b] {
            let r = app
                .client
                .get(app.url(&format!("/api/orders/{id}")))
                .header("x-user-id", buyer)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let read: Value = r.json().await.unwrap();
            assert_eq!(read["userId"], buyer);
        }
    }
    // A token that bought through one instance cannot buy through the
    // other (the store deleted it; the database's UNIQUE key backs it up).
    let (user, token) = buyers
        .iter()
        .zip(&results)
        .find(|(_, (s, _))| *s == 201)
        .map(|(b, _)| b)
        .unwrap();
    set_stock(&b, 5).await;
    assert_eq!(order(&a, user, token, 1).await.0, 401);
    assert_eq!(order(&b, user, token, 1).await.0, 401);
    assert_eq!(stock_seen_by(&a).await, 5, "nothing more was sold");
    a.stop().await;
    b.stop().await;
    drop(db);
}

/// The database goes away under a running instance: orders and product
/// reads fail closed (`503 database_unavailable`, quickly, never a `500`
/// nor a hang), the buyer's token is not used up, and the queue keeps
/// working.
#[tokio::test]
async fn orders_fail_closed_while_the_database_is_gone() {
    crate::needs_redis!();
    let db = PgDatabase::create("gone").await;
    let app = TestApp::redis(
        "orders-pg-gone",
        &[
            "--admission-interval-ms",
            "50",
            "--admission-batch",
            "50",
            "--orders-db",
            &db.url,
        ],
    )
    .await;
    let token = ready(&app, "patient").await;
    let name = db.name.clone();
    // Dropping the database cuts every connection of the instance's pool.
    drop(db);
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let (status, body) = order(&app, "patient", &token, 1).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (503, Some("database_unavailable")),
            "{body}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "refused promptly, not after a long wait"
        );
    }
    let r = app
        .client
        .get(app.url("/api/products"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "2");
    // Nothing was sold: the token is still the buyer's, unclaimed.
    let (_, joined) = app.enter("default", "patient").await;
    assert_eq!(joined["status"], "READY", "{joined}");
    assert_eq!(joined["entryToken"], token.as_str(), "{name}: token kept");
    assert_eq!(app.get_status("/healthz").await, 200);
    app.stop().await;
}

/// A database that cannot be reached at start is a start-up error, not an
/// instance that answers `503` to every order from its first minute.
#[tokio::test]
async fn an_unreachable_database_stops_the_start() {
    let db = PgDatabase::create("absent").await;
    let url = format!("{}_never_created", db.url);
    let state = waitroom::App::with_store(
        Config {
            orders_db: url,
            ..config(&[])
        },
        store("memory", "absent").await,
        None,
        tokio_util::sync::CancellationToken::new(),
    )
    .await;
    let error = state.err().expect("refused").to_string();
    assert!(error.contains("order database"), "{error}");
}
