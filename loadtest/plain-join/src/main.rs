//! The baseline of `loadtest/group-commit.sh`: the plainest axum server
//! that places a join with one Lua call per join, on the same Redis as the
//! waitroom it is compared with. `POST /api/queues/{queue}/entries` with
//! `X-User-Id` puts the user in the queue's line (or keeps their place)
//! and answers `201` with their position, as waitroom's join does, but
//! with nothing else: no tickets, no limits, no fast track, no grouping.
//! So waitroom's join is measured against the cost of one script call
//! per join, not against a slower server.

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
        prefix: args.prefix,
    });
    let router = Router::new()
        .route("/api/queues/{queue}/entries", post(join))
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

async fn join(
    State(app): State<Arc<App>>,
    Path(queue): Path<String>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let Some(user) = headers.get("x-user-id").and_then(|v| v.to_str().ok()) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": "X-User-Id"})),
        );
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
