//! The admin API for operators: queue counts and rates, holding and
//! resuming admission (when the order service struggles), and products of
//! the demo order service (restocking, per-order caps).
//! `Authorization: Bearer <admin token>`, checked before anything else.

use axum::extract::{Path, State};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::AdminAuth;
use super::error::ApiError;
use super::extract::{JsonBody, Queue};
use crate::app::AppState;
use crate::orders::{Product, ProductUpdate};
use crate::queue::QueueName;

/// `/api/admin/queues`, `/api/admin/queues/{queue}/{pause,resume}`,
/// `/api/admin/products/{id}`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/admin/queues", get(queues))
        .route("/api/admin/queues/{queue}/pause", post(pause))
        .route("/api/admin/queues/{queue}/resume", post(resume))
        .route("/api/admin/products/{id}", put(put_product))
}

async fn queues(_: AdminAuth, State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let policy = state.policy();
    let mut out = Vec::new();
    for queue in state.queue_names() {
        let stats = state.store().stats(queue).await?;
        out.push(json!({
            "queue": queue.as_str(),
            "waiting": stats.waiting,
            "active": stats.active,
            "pass": stats.pass,
            "paused": stats.paused,
            "observedAdmissionsPerSecond": state.admission_rate(queue),
            "streamsOnThisInstance": state.hub().registered(queue),
        }));
    }
    Ok(Json(json!({
        "queues": out,
        "policy": {
            "admissionBatch": policy.batch,
            "admissionIntervalMs": policy.interval_ms,
            "tokenTtlSeconds": policy.token_ttl_ms / 1000,
            "maxActive": policy.max_active,
            "abandonAfterSeconds": policy.abandon_after_ms.map(|m| m / 1000),
        },
        "streamsOpen": state.hub().open_streams(),
        "maxStreams": state.max_streams(),
    })))
}

async fn pause(
    _: AdminAuth,
    state: State<AppState>,
    queue: Queue,
) -> Result<Json<Value>, ApiError> {
    set_paused(state, queue, true).await
}

async fn resume(
    _: AdminAuth,
    state: State<AppState>,
    queue: Queue,
) -> Result<Json<Value>, ApiError> {
    set_paused(state, queue, false).await
}

/// Holds or resumes admission for every instance at once (the flag lives in
/// the store); buyers keep their places and their streams.
async fn set_paused(
    State(state): State<AppState>,
    Queue(queue): Queue,
    paused: bool,
) -> Result<Json<Value>, ApiError> {
    let changed = state.store().set_paused(&queue, paused).await?;
    tracing::info!(%queue, paused, changed, "admission hold changed by an operator");
    Ok(Json(
        json!({ "queue": queue.as_str(), "paused": paused, "changed": changed }),
    ))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProductBody {
    name: String,
    queue: String,
    price_cents: i64,
    stock: i64,
    /// The most one order may buy; absent keeps the current cap (a new
    /// product gets the default).
    max_per_order: Option<i64>,
}

/// The largest `maxPerOrder` accepted (the order API's own quantity cap).
const MAX_PER_ORDER_LIMIT: i64 = 1_000_000_000;

async fn put_product(
    _: AdminAuth,
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ProductBody>,
) -> Result<Json<Product>, ApiError> {
    let orders = state
        .orders()
        .ok_or_else(|| ApiError::not_found("orders_disabled", "the demo order service is off"))?;
    let queue_ok = QueueName::parse(&body.queue).is_ok_and(|q| state.has_queue(&q));
    if !queue_ok {
        return Err(ApiError::bad_request(
            "unknown_queue",
            "the product's queue is not configured",
        ));
    }
    if id.is_empty()
        || id.len() > 64
        || body.name.is_empty()
        || body.price_cents < 0
        || body.stock < 0
        || body
            .max_per_order
            .is_some_and(|m| !(1..=MAX_PER_ORDER_LIMIT).contains(&m))
    {
        return Err(ApiError::bad_request(
            "invalid_product",
            format!(
                "id (1-64 chars), name, priceCents >= 0 and stock >= 0 are required; \
                 maxPerOrder, if given, is 1-{MAX_PER_ORDER_LIMIT}"
            ),
        ));
    }
    let update = ProductUpdate {
        id,
        name: body.name,
        queue: body.queue,
        price_cents: body.price_cents,
        stock: body.stock,
        max_per_order: body.max_per_order,
    };
    orders
        .upsert_product(&update)
        .await
        .map(Json)
        .map_err(|e| ApiError::Internal(e.to_string()))
}
