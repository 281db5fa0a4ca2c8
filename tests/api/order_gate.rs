//! The order gate as an integrator uses it: `EntryPass` mounted in an order
//! service's own router (no waitroom middleware in front), written the way
//! the `waitroom::gate` doc example is. A slow upload holds no claim, a
//! working handler keeps its claim past the lease, a dead one's lapses, and
//! the idempotency key is the token's SHA-256. Also the demo service's
//! per-product `maxPerOrder`, auth-first admin and token APIs, and
//! duplicate identity headers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use waitroom::gate::Gate;
use waitroom::http::EntryPass;
use waitroom::queue::QueueName;

use crate::common::{TestApp, eventually, ready};

const ADMIN: &str = "admin-token-for-tests-0123456789";
const SERVICE: &str = "service-token-for-tests-0123";
const PRODUCT: &str = "demo-sneaker";
/// The claim lease of the order services built here.
const LEASE: Duration = Duration::from_secs(2);

fn both() -> Vec<&'static str> {
    crate::common::backends(&["memory", "redis"])
}

async fn app_of(kind: &str, extra: &[&'static str]) -> TestApp {
    let mut args = vec![
        "--admission-interval-ms",
        "100",
        "--admission-batch",
        "100",
        "--admin-token",
        ADMIN,
        "--service-token",
        SERVICE,
    ];
    args.extend_from_slice(extra);
    match kind {
        "memory" => TestApp::memory(&args).await,
        _ => TestApp::redis("gate", &args).await,
    }
}

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Where a handler may be held: the first order to reach it announces
/// itself and waits for `proceed` (a slow transaction); later ones pass.
#[derive(Default)]
struct Hold {
    armed: AtomicBool,
    started: Notify,
    proceed: Notify,
    /// Hold forever instead of waiting for `proceed` (a hung process).
    forever: AtomicBool,
}

/// The state of an integrator's order service: the gate, and an order
/// "table" that, like a careless integrator's, stores no idempotency key.
#[derive(Clone)]
struct Shop {
    gate: Gate,
    orders: Arc<std::sync::Mutex<Vec<String>>>,
    hold: Arc<Hold>,
}

impl FromRef<Shop> for Gate {
    fn from_ref(shop: &Shop) -> Gate {
        shop.gate.clone()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct NewOrder {
    product_id: String,
    quantity: i64,
}

/// The doc example's handler, minus the `UNIQUE` key: only the gate stands
/// between one token and two orders.
async fn place_order(State(shop): State<Shop>, pass: EntryPass) -> (StatusCode, String) {
    let Ok(_order) = pass.json::<NewOrder>() else {
        pass.rolled_back().await;
        return (StatusCode::BAD_REQUEST, "bad order".into());
    };
    if shop.hold.armed.swap(false, Ordering::SeqCst) {
        shop.hold.started.notify_one();
        if shop.hold.forever.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        shop.hold.proceed.notified().await;
    }
    shop.orders.lock().unwrap().push(pass.user().to_string());
    pass.commit_succeeded().await;
    (StatusCode::CREATED, "ordered".into())
}

/// The idempotency key as the extractor hands it over.
async fn show_key(pass: EntryPass) -> String {
    let key = pass.idempotency_key().to_owned();
    pass.rolled_back().await;
    key
}

fn shop_of(app: &TestApp, shutdown: CancellationToken) -> Shop {
    Shop {
        gate: Gate::new(
            app.state.store().clone(),
            vec![QueueName::parse("default").unwrap()],
            LEASE,
            Duration::from_secs(30),
            shutdown,
        ),
        orders: Arc::default(),
        hold: Arc::default(),
    }
}

/// Serves `shop` on a port of its own, on the current runtime; the second
/// value counts request heads that reached the router.
async fn serve_shop(shop: Shop) -> (SocketAddr, Arc<Notify>) {
    let heads = Arc::new(Notify::new());
    let seen = heads.clone();
    let app = Router::new()
        .route("/orders", post(place_order))
        .route("/key", post(show_key))
        .with_state(shop)
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let seen = seen.clone();
                async move {
                    seen.notify_one();
                    next.run(req).await
                }
            },
        ));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, heads)
}

fn buy(qty: i64) -> Value {
    json!({ "productId": PRODUCT, "quantity": qty })
}

/// `POST http://{addr}{path}` as `user` with `token`: (status, body text).
async fn post_order(addr: SocketAddr, path: &str, user: &str, token: &str) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(format!("http://{addr}{path}"))
        .header("x-user-id", user)
        .header("x-entry-token", token)
        .json(&buy(1))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// An order whose body arrives slowly: the head and half the body now,
/// the rest on [`finish_slow_order`].
async fn start_slow_order(addr: SocketAddr, user: &str, token: &str) -> (TcpStream, Vec<u8>) {
    let body = serde_json::to_vec(&buy(1)).unwrap();
    let head = format!(
        "POST /orders HTTP/1.1\r\nHost: shop\r\nX-User-Id: {user}\r\nX-Entry-Token: {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(head.as_bytes()).await.unwrap();
    let half = body.len() / 2;
    conn.write_all(&body[..half]).await.unwrap();
    (conn, body[half..].to_vec())
}

async fn finish_slow_order(mut conn: TcpStream, rest: Vec<u8>) -> u16 {
    conn.write_all(&rest).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut answer))
        .await
        .expect("the slow order is answered")
        .unwrap();
    let text = String::from_utf8_lossy(&answer);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The lapse scenario: request 1 holds its body back past the
/// lease while other requests with the same token go through. With the
/// claim taken before the body, request 1 claimed, its claim lapsed, a
/// later request bought, and request 1 then bought again: two orders for
/// one token in a service that stores no key. The body now comes in
/// before the claim, so exactly one order is made.
#[tokio::test]
async fn a_slow_upload_holds_no_claim_and_one_token_makes_one_order() {
    for kind in both() {
        let app = app_of(kind, &[]).await;
        let token = ready(&app, "slowpoke").await;
        let shop = shop_of(&app, CancellationToken::new());
        let orders = shop.orders.clone();
        let (addr, heads) = serve_shop(shop).await;

        let (slow, rest) = start_slow_order(addr, "slowpoke", &token).await;
        tokio::time::timeout(Duration::from_secs(10), heads.notified())
            .await
            .expect("the slow order's head reached the service");
        // Another order with the same token goes through, at once now;
        // when the slow one held a claim, only once that claim lapsed.
        let (status, body) = eventually(Duration::from_secs(10), "an order goes through", || {
            let token = token.clone();
            async move {
                let (status, body) = post_order(addr, "/orders", "slowpoke", &token).await;
                match status {
                    409 => None,
                    _ => Some((status, body)),
                }
            }
        })
        .await;
        assert_eq!(status, 201, "{kind}: {body}");
        let late = finish_slow_order(slow, rest).await;
        assert_eq!(late, 401, "{kind}: the slow order finds the token used");
        assert_eq!(
            orders.lock().unwrap().len(),
            1,
            "{kind}: one token, one order"
        );
        app.stop().await;
    }
}

/// A handler whose transaction outlasts the lease keeps its claim (the
/// pass renews it): a second order meanwhile gets 409, the first commits.
#[tokio::test]
async fn a_working_handler_keeps_its_claim_past_the_lease() {
    for kind in both() {
        let app = app_of(kind, &[]).await;
        let token = ready(&app, "patient").await;
        let shop = shop_of(&app, CancellationToken::new());
        shop.hold.armed.store(true, Ordering::SeqCst);
        let (hold, orders) = (shop.hold.clone(), shop.orders.clone());
        let (addr, _) = serve_shop(shop).await;

        let first = tokio::spawn({
            let token = token.clone();
            async move { post_order(addr, "/orders", "patient", &token).await }
        });
        tokio::time::timeout(Duration::from_secs(10), hold.started.notified())
            .await
            .expect("the first order reached its transaction");
        // Past the lease: only renewal keeps the claim now.
        tokio::time::sleep(LEASE + Duration::from_millis(700)).await;
        let (status, body) = post_order(addr, "/orders", "patient", &token).await;
        assert_eq!(
            (status, body.contains("token_in_use")),
            (409, true),
            "{kind}: the working handler still holds the token: {body}"
        );
        hold.proceed.notify_one();
        let (status, body) = first.await.unwrap();
        assert_eq!(status, 201, "{kind}: {body}");
        let (status, _) = post_order(addr, "/orders", "patient", &token).await;
        assert_eq!(status, 401, "{kind}: the token is gone after the commit");
        assert_eq!(orders.lock().unwrap().len(), 1, "{kind}");
        app.stop().await;
    }
}

/// An order service that dies mid-order stops renewing: its claim lapses
/// and the token returns to READY for the buyer's next try.
#[tokio::test]
async fn a_dead_handlers_claim_lapses() {
    for kind in both() {
        let app = app_of(kind, &[]).await;
        let token = ready(&app, "orphan").await;
        let shop = shop_of(&app, CancellationToken::new());
        shop.hold.armed.store(true, Ordering::SeqCst);
        shop.hold.forever.store(true, Ordering::SeqCst);
        let hold = shop.hold.clone();

        // The service runs on a runtime of its own, so it can die whole.
        let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
        let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
        let process = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let (addr, _) = rt.block_on(serve_shop(shop));
            addr_tx.send(addr).unwrap();
            let _ = kill_rx.blocking_recv();
            rt.shutdown_background();
        });
        let addr = addr_rx.await.unwrap();
        let doomed = tokio::spawn({
            let token = token.clone();
            async move {
                reqwest::Client::new()
                    .post(format!("http://{addr}/orders"))
                    .header("x-user-id", "orphan")
                    .header("x-entry-token", token)
                    .json(&buy(1))
                    .send()
                    .await
            }
        });
        tokio::time::timeout(Duration::from_secs(10), hold.started.notified())
            .await
            .expect("the doomed order reached its transaction");
        // Alive past the lease, it still holds the token.
        tokio::time::sleep(LEASE + Duration::from_millis(700)).await;
        let demo = |qty| {
            app.client
                .post(app.url("/api/orders"))
                .header("x-user-id", "orphan")
                .header("x-entry-token", &token)
                .json(&buy(qty))
                .send()
        };
        assert_eq!(
            demo(1).await.unwrap().status(),
            409,
            "{kind}: held while alive"
        );
        kill_tx.send(()).unwrap();
        process.join().unwrap();
        assert!(doomed.await.unwrap().is_err(), "{kind}: the process died");
        eventually(Duration::from_secs(10), "the dead claim lapses", || async {
            match demo(1).await.unwrap().status().as_u16() {
                409 => None,
                201 => Some(()),
                other => panic!("{kind}: unexpected {other}"),
            }
        })
        .await;
        app.stop().await;
    }
}

/// The idempotency key is the token's SHA-256 (hex), from the extractor and
/// from the token API alike.
#[tokio::test]
async fn the_idempotency_key_is_the_tokens_sha256() {
    for kind in both() {
        let app = app_of(kind, &[]).await;
        let token = ready(&app, "keyed").await;
        let (addr, _) = serve_shop(shop_of(&app, CancellationToken::new())).await;
        let (status, key) = post_order(addr, "/key", "keyed", &token).await;
        assert_eq!(
            (status, key.as_str()),
            (200, sha256_hex(&token).as_str()),
            "{kind}"
        );

        let r = app
            .client
            .post(app.admin_url("/api/tokens/claim"))
            .bearer_auth(SERVICE)
            .json(&json!({"userId": "keyed", "token": token}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{kind}: the pass above released its claim");
        let claim: Value = r.json().await.unwrap();
        assert_eq!(claim["idempotencyKey"], sha256_hex(&token), "{kind}");
        app.stop().await;
    }
}

async fn products(app: &TestApp) -> Value {
    app.client
        .get(app.url("/api/products"))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()
}

async fn put_product(app: &TestApp, body: Value) -> (u16, Value) {
    let r = app
        .client
        .put(app.admin_url(&format!("/api/admin/products/{PRODUCT}")))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn demo_order(app: &TestApp, user: &str, token: &str, qty: i64) -> (u16, Value) {
    let r = app
        .client
        .post(app.url("/api/orders"))
        .header("x-user-id", user)
        .header("x-entry-token", token)
        .json(&buy(qty))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn one_order_buys_at_most_max_per_order() {
    for kind in both() {
        let app = app_of(kind, &[]).await;
        let listed = products(&app).await;
        assert_eq!(
            listed[0]["maxPerOrder"], 10,
            "{kind}: the page's cap: {listed}"
        );
        let stock = listed[0]["stock"].as_i64().unwrap();
        let token = ready(&app, "greedy").await;

        let (status, body) = demo_order(&app, "greedy", &token, 999).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("quantity_over_limit")),
            "{kind}: {body}"
        );
        // More than the stock left is still out_of_stock (the contract).
        let (status, body) = demo_order(&app, "greedy", &token, 1_000_000_000).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (409, Some("out_of_stock")),
            "{kind}"
        );
        assert_eq!(
            products(&app).await[0]["stock"],
            stock,
            "{kind}: nothing sold"
        );
        let (status, body) = demo_order(&app, "greedy", &token, 10).await;
        assert_eq!(
            status, 201,
            "{kind}: the token survived; 10 is allowed: {body}"
        );
        assert_eq!(products(&app).await[0]["stock"], stock - 10, "{kind}");

        // The operator raises the cap; a restock without it keeps it.
        let product = json!({"name": "Limited sneaker drop", "queue": "default",
                             "priceCents": 12900, "stock": 500, "maxPerOrder": 20});
        let (status, stored) = put_product(&app, product).await;
        assert_eq!(
            (status, stored["maxPerOrder"].as_i64()),
            (200, Some(20)),
            "{kind}"
        );
        let restock = json!({"name": "Limited sneaker drop", "queue": "default",
                             "priceCents": 12900, "stock": 400});
        let (status, stored) = put_product(&app, restock).await;
        assert_eq!(
            (status, stored["maxPerOrder"].as_i64()),
            (200, Some(20)),
            "{kind}"
        );
        assert_eq!(products(&app).await[0]["maxPerOrder"], 20, "{kind}");
        let token = ready(&app, "bulk").await;
        let (status, _) = demo_order(&app, "bulk", &token, 21).await;
        assert_eq!(status, 400, "{kind}");
        let (status, _) = demo_order(&app, "bulk", &token, 20).await;
        assert_eq!(status, 201, "{kind}");
        assert_eq!(products(&app).await[0]["stock"], 380, "{kind}");
        for bad in [0, -1] {
            let product = json!({"name": "x", "queue": "default", "priceCents": 1,
                                 "stock": 1, "maxPerOrder": bad});
            let (status, body) = put_product(&app, product).await;
            assert_eq!(
                (status, body["error"].as_str()),
                (400, Some("invalid_product")),
                "{kind}"
            );
        }
        app.stop().await;
    }
}

/// Every admin and token route answers 401 to a caller without the right
/// bearer before it looks at the path or the body.
#[tokio::test]
async fn admin_and_token_routes_check_auth_before_anything_else() {
    let app = app_of("memory", &[]).await;
    let routes: [(&str, &str, Option<&str>); 7] = [
        ("GET", "/api/admin/queues", None),
        (
            "POST",
            "/api/admin/queues/no-such-queue/pause",
            Some("garbage"),
        ),
        ("POST", "/api/admin/queues/no-such-queue/resume", None),
        ("PUT", "/api/admin/products/some-id", Some("{not json")),
        ("POST", "/api/tokens/claim", Some("{not json")),
        ("POST", "/api/tokens/consume", Some("[]")),
        ("POST", "/api/tokens/release", None),
    ];
    let send = |method: &str, path: &str, body: Option<&str>, bearer: Option<&str>| {
        let mut req = app
            .client
            .request(method.parse().unwrap(), app.admin_url(path))
            .header("content-type", "application/json");
        if let Some(b) = body {
            req = req.body(b.to_owned());
        }
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    for (method, path, body) in routes {
        // The other API's token is as wrong as none.
        let other = if path.starts_with("/api/admin") {
            SERVICE
        } else {
            ADMIN
        };
        for bearer in [None, Some("wrong"), Some(other)] {
            let r = send(method, path, body, bearer).await.unwrap();
            let status = r.status().as_u16();
            let json: Value = r.json().await.unwrap_or(Value::Null);
            assert_eq!(
                (status, json["error"].as_str()),
                (401, Some("unauthorized")),
                "{method} {path} with {bearer:?}"
            );
        }
    }
    // With the right bearer the path and body are checked as before.
    let r = send(
        "POST",
        "/api/admin/queues/no-such-queue/pause",
        None,
        Some(ADMIN),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 404);
    let r = send(
        "POST",
        "/api/tokens/claim",
        Some("{not json"),
        Some(SERVICE),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    app.stop().await;
}

/// Two `X-User-Id` or two `X-Entry-Token` headers are refused by the
/// extractor itself, mounted without waitroom's middleware; nothing is
/// claimed, and the token still buys with one of each.
#[tokio::test]
async fn duplicate_identity_headers_are_refused_by_the_extractor() {
    for kind in both() {
        let app = app_of(kind, &[]).await;
        let token = ready(&app, "victim").await;
        let shop = shop_of(&app, CancellationToken::new());
        let orders = shop.orders.clone();
        let (addr, _) = serve_shop(shop).await;
        let client = reqwest::Client::new();
        let cases = [
            [("x-user-id", "victim"), ("x-user-id", "attacker")],
            [("x-entry-token", token.as_str()), ("x-entry-token", "junk")],
        ];
        for dup in cases {
            let mut req = client.post(format!("http://{addr}/orders")).json(&buy(1));
            if dup[0].0 == "x-user-id" {
                req = req.header("x-entry-token", &token);
            } else {
                req = req.header("x-user-id", "victim");
            }
            for (name, value) in dup {
                req = req.header(name, value);
            }
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap();
            assert_eq!(
                (status, body["error"].as_str()),
                (400, Some("duplicate_header")),
                "{kind}: {dup:?}"
            );
        }
        assert!(orders.lock().unwrap().is_empty());
        let (status, _) = post_order(addr, "/orders", "victim", &token).await;
        assert_eq!(status, 201, "{kind}: nothing was claimed");
        app.stop().await;
    }
}

/// Body errors come after the token: a bad token is 401 whatever the body;
/// a good token with an oversized body is 413 and stays usable.
#[tokio::test]
async fn body_errors_are_answered_after_the_token_and_keep_it() {
    crate::needs_redis!();
    let app = app_of("redis", &[]).await;
    let token = ready(&app, "bulky").await;
    let huge = "x".repeat(64 * 1024);
    let send = |token: String, body: String| {
        app.client
            .post(app.url("/api/orders"))
            .header("x-user-id", "bulky")
            .header("x-entry-token", token)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let r = send("A".repeat(43), huge.clone()).await.unwrap();
    assert_eq!(r.status(), 401, "the token comes first");
    let r = send(token.clone(), huge).await.unwrap();
    assert_eq!(r.status(), 413);
    let r = send(token.clone(), "{not json".into()).await.unwrap();
    assert_eq!(r.status(), 400);
    let (status, body) = demo_order(&app, "bulky", &token, 1).await;
    assert_eq!(status, 201, "the token survived: {body}");
    app.stop().await;
}
