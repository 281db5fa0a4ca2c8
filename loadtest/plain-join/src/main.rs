//! The baseline of `loadtest/group-commit.sh` and `loadtest/poll-e2e.sh`:
//! the plainest axum server that places a join with one Lua call per join,
//! and answers a poll with one more, on the same Redis as the waitroom it
//! is compared with. `POST /api/queues/{queue}/entries` with `X-User-Id`
//! puts the user in the queue's line (or keeps their place) and answers
//! `201` with their position, as waitroom's join does, but with nothing
//! else: no tickets, no limits, no fast track, no grouping.
//! `GET /api/queues/{queue}/position` with `X-User-Id` answers their
//! place as JSON of waitroom's shape, from one Lua call: no ticket, no
//! budget, no presence, no entry time. So waitroom's join and poll are
//! measured against the cost of one script call each, not against a
//! slower server.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use clap::Parser;

/// One join (`join.lua`: its header gives keys, arguments and reply).
const JOIN: &str = include_str!("join.lua");
/// One poll (`poll.lua`).
const POLL: &str = include_str!("poll.lua");

#[derive(Parser)]
struct Args {
    /// Listen address (loopback).
    #[arg(long, default_value = "127.0.0.1:8090")]
    addr: SocketAddr,
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Key prefix (the queue's keys share its hash tag).
    #[arg(long, default_value = "plain")]
    prefix: String,
}

struct App {
    conn: redis::aio::MultiplexedConnection,
    script: redis::Script,
    poll: redis::Script,
    prefix: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.addr.ip().is_loopback(), "--addr must be loopback");
    let client = redis::Client::open(args.redis_url.as_str()).context("--redis-url")?;
    let conn = client.get_multiplexed_async_connection().await?;
    let app = Arc::new(App {
        conn,
        script: redis::Script::new(JOIN),
        poll: redis::Script::new(POLL),
        prefix: args.prefix,
    });
    let router = Router::new()
        .route("/api/queues/{queue}/entries", post(join))
        .route("/api/queues/{queue}/position", axum::routing::get(poll))
        .route("/readyz", axum::routing::get(|| async { "ok" }))
        .with_state(app);
    // The same listen backlog as waitroom's default: with tokio's 128 a
    // burst's first connects wait out a dropped SYN (one second) and the
    // baseline would measure the kernel's retry, not its joins.
    let socket = match args.addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(args.addr)?;
    let listener = socket.listen(4096)?;
    axum::serve(listener, router).await?;
    Ok(())
}

/// The request's `X-User-Id`, or the `400` that says it is missing.
fn user_of(headers: &HeaderMap) -> Result<&str, (StatusCode, Json<serde_json::Value>)> {
    headers
        .get("x-user-id")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            (
                StatusCode::BAD_REQUEST,
                Json(serde_json::json!({"error": "X-User-Id"})),
            )
        })
}

async fn join(
    State(app): State<Arc<App>>,
    Path(queue): Path<String>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let user = match user_of(&headers) {
        Ok(user) => user,
        Err(refused) => return refused,
    };
    let base = format!("{}:{{{queue}}}:", app.prefix);
    let mut conn = app.conn.clone();
    let reply: redis::RedisResult<(i64, i64, i64)> = app
        .script
        .key(format!("{base}waiting"))
        .key(format!("{base}seq"))
        .arg(user)
        .invoke_async(&mut conn)
        .await;
    match reply {
        Ok((created, rank, total)) => (
            if created == 1 {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            },
            Json(serde_json::json!({
                "status": "WAITING",
                "position": rank + 1,
                "waiting": total,
            })),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"error": e.to_string()})),
        ),
    }
}

async fn poll(
    State(app): State<Arc<App>>,
    Path(queue): Path<String>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let user = match user_of(&headers) {
        Ok(user) => user,
        Err(refused) => return refused,
    };
    let mut conn = app.conn.clone();
    let reply: redis::RedisResult<(i64, i64)> = app
        .poll
        .key(format!("{}:{{{queue}}}:waiting", app.prefix))
        .arg(user)
        .invoke_async(&mut conn)
        .await;
    match reply {
        Ok((rank, total)) if rank >= 0 => (
            StatusCode::OK,
            Json(serde_json::json!({
                "status": "WAITING",
                "rank": rank,
                "position": rank + 1,
                "totalWaiting": total,
                "estimatedWaitSeconds": null,
                "pollingIntervalSeconds": if rank < 100 { 1 } else if rank < 1000 { 3 } else { 5 },
                "enteredAt": null,
                "entryToken": null,
                "tokenExpiresInSeconds": null,
            })),
        ),
        Ok(_) => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({"error": "not_entered"})),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"error": e.to_string()})),
        ),
    }
}
