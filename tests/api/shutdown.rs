//! SIGTERM with an open stream and a consume that could not be done: the
//! binary exits 0 within `--drain-secs` + 5 s, its streams closed, and the
//! consume is done after the restart, from the order's own record.
//!
//! The consume is made to fail after the commit without any timing: the
//! test holds SQLite's write lock, so the order (its token already claimed)
//! waits inside its transaction; the test freezes Redis, then lets the
//! transaction commit, so the delete that follows meets a Redis that keeps
//! its connection open and never answers.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use sqlx::ConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;

use crate::common::{BinApp, IDLE, RedisProcess, eventually, unique_prefix};

const DRAIN_SECS: u64 = 2;
const SECRET: &str = "shutdown-test-ticket-secret-0123456789";

/// The binary's arguments: its own Redis and database, admission idle (the
/// first joiner takes the one slot, the next one waits).
fn args<'a>(redis: &'a str, prefix: &'a str, db: &'a str) -> Vec<&'a str> {
    let mut v = vec![
        "--redis-url",
        redis,
        "--key-prefix",
        prefix,
        "--orders-db",
        db,
        "--drain-secs",
        "2",
        "--ticket-secret",
        SECRET,
    ];
    v.extend_from_slice(IDLE);
    v
}

async fn join(client: &reqwest::Client, app: &BinApp, user: &str) -> Value {
    let r = client
        .post(app.url("/api/queues/default/entries"))
        .header("x-user-id", user)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{user} joins");
    r.json().await.unwrap()
}

/// Whether the buyer's token (claimed or not) is still in Redis; `None`
/// while Redis does not answer (a restarted one loads its AOF first).
async fn token_in_store(redis: &str, prefix: &str, user: &str) -> Option<bool> {
    let client = redis::Client::open(redis).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let token = crate::common::stored_token(&mut conn, prefix, "default", user)
        .await
        .ok()?;
    Some(token.is_some())
}

/// The claim id on the buyer's token, once an order has claimed it.
async fn claimed(redis: &str, prefix: &str, user: &str) -> Option<String> {
    let client = redis::Client::open(redis).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    crate::common::stored_token(&mut conn, prefix, "default", user)
        .await
        .ok()??
        .remove("claim")
}

async fn committed_order(db: &Path, user: &str) -> Option<String> {
    let mut conn = SqliteConnectOptions::new()
        .filename(db)
        .connect()
        .await
        .ok()?;
    sqlx::query_scalar::<_, String>("SELECT id FROM orders WHERE user_id = ?")
        .bind(user)
        .fetch_optional(&mut conn)
        .await
        .ok()?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_an_open_stream_and_a_pending_consume_exits_and_consumes_after_restart() {
    crate::needs_redis!();
    let mut redis = RedisProcess::start(true);
    let url = redis.url();
    let prefix = unique_prefix("shutdown");
    let dir =
        std::env::temp_dir().join(format!("waitroom-shutdown-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("orders.db");
    let db_arg = db.to_str().unwrap().to_owned();
    let mut app = BinApp::spawn(&args(&url, &prefix, &db_arg)).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    // The buyer takes the fast track; the waiter waits with a stream open.
    let buyer = join(&client, &app, "buyer").await;
    assert_eq!(buyer["status"], "READY");
    let token = buyer["entryToken"].as_str().unwrap().to_owned();
    let buyer_ticket = buyer["ticket"].as_str().unwrap().to_owned();
    let waiter = join(&client, &app, "waiter").await;
    assert_eq!(waiter["status"], "WAITING");
    let stream = reqwest::Client::new()
        .get(app.url("/api/queues/default/events"))
        .header("x-queue-ticket", waiter["ticket"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let mut stream = stream.bytes_stream();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the stream's first event")
        .expect("the stream is open")
        .unwrap();
    assert!(
        String::from_utf8_lossy(&first).contains("event: waiting"),
        "{first:?}"
    );

    // Hold SQLite's write lock: the order will claim, then wait in its
    // transaction (the service's busy timeout is far longer than this).
    let mut lock = SqliteConnectOptions::new()
        .filename(&db)
        .connect()
        .await
        .unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut lock)
        .await
        .unwrap();
    let ordering = {
        let client = client.clone();
        let url = app.url("/api/orders");
        let token = token.clone();
        tokio::spawn(async move {
            let r = client
                .post(url)
                .header("x-user-id", "buyer")
                .header("x-entry-token", token)
                .json(&json!({ "productId": "demo-sneaker", "quantity": 1 }))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        })
    };
    eventually(
        Duration::from_secs(10),
        "the order claims the token",
        || claimed(&url, &prefix, "buyer"),
    )
    .await;
    redis.freeze();
    sqlx::query("ROLLBACK").execute(&mut lock).await.unwrap();
    drop(lock);
    let order_id = eventually(Duration::from_secs(10), "the order commits", || {
        committed_order(&db, "buyer")
    })
    .await;

    // Deploy: SIGTERM while the delete after the commit meets a frozen Redis.
    let sent = Instant::now();
    let window = Duration::from_secs(DRAIN_SECS + 5);
    app.terminate();
    let status = app.exited_by(sent + window).await;
    let took = sent.elapsed();
    assert!(
        status.is_some(),
        "still running {window:?} after SIGTERM; last log lines: {:?}",
        app.log.lock().unwrap()
    );
    assert!(
        status.unwrap().success(),
        "exit status {status:?}; last log lines: {:?}",
        app.log.lock().unwrap()
    );
    eprintln!("exited {took:?} after SIGTERM");
    let (code, body) = tokio::time::timeout(Duration::from_secs(5), ordering)
        .await
        .expect("the order's answer came before the exit")
        .unwrap();
    assert_eq!(
        (code, body["orderId"].as_str()),
        (201, Some(order_id.as_str()))
    );
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(chunk) = stream.next().await {
            if chunk.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the waiter's stream was closed");

    // The delete never reached Redis. Whether a command left with a frozen
    // Redis runs when it thaws is not something to rely on either way;
    // killing the frozen server makes the loss certain, and its AOF keeps
    // all it had acknowledged: the claimed token is back after the restart.
    redis.restart();
    let survived = eventually(
        Duration::from_secs(10),
        "the restarted Redis answers",
        || token_in_store(&url, &prefix, "buyer"),
    )
    .await;
    assert!(survived, "the token survived the lost consume");
    let app = BinApp::spawn(&args(&url, &prefix, &db_arg)).await;
    eventually(
        Duration::from_secs(15),
        "the restarted service consumes the token of its committed order",
        || async { (token_in_store(&url, &prefix, "buyer").await == Some(false)).then_some(()) },
    )
    .await;
    // The used token ended the buyer's place: their ticket says so.
    let r = client
        .get(app.url("/api/queues/default/position"))
        .header("x-queue-ticket", &buyer_ticket)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let position: Value = r.json().await.unwrap();
    assert_eq!(position["error"], "ticket_ended", "{position}");
    let r = client
        .get(app.url(&format!("/api/orders/{order_id}")))
        .header("x-user-id", "buyer")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let order: Value = r.json().await.unwrap();
    assert_eq!(
        (order["orderId"].as_str(), order["quantity"].as_i64()),
        (Some(order_id.as_str()), Some(1))
    );
    drop(app);
    let _ = std::fs::remove_dir_all(&dir);
}
