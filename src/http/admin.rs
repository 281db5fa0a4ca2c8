//! The admin API for operators: queue counts and rates, holding and
//! resuming admission (when the order service struggles), and products of
//! the demo order service (restocking, per-order caps).
//! `Authorization: Bearer <admin token>`, checked before anything else.

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::AdminAuth;
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, Queue};
use crate::app::AppState;
use crate::orders::{Product, ProductUpdate};
use crate::queue::QueueName;

/// `/api/admin/queues`, `/api/admin/queues/{queue}/{pause,resume}`,
/// `/api/admin/products/{id}`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(queues))
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(put_product))
}

/// Every queue's counts, the admission policy and this instance's streams.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct Overview {
    queues: Vec<QueueCounts>,
    policy: PolicyView,
    /// Streams open on this instance.
    streams_open: usize,
    /// Streams this instance holds before shedding.
    max_streams: usize,
}

/// One queue's counts.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct QueueCounts {
    queue: String,
    waiting: u64,
    /// Token holders.
    active: u64,
    /// The admission pass counter.
    pass: u64,
    /// Admission held by an operator.
    paused: bool,
    observed_admissions_per_second: f64,
    streams_on_this_instance: usize,
}

/// The admission policy every instance runs.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct PolicyView {
    admission_batch: u32,
    admission_interval_ms: u64,
    token_ttl_seconds: u64,
    max_active: Option<u64>,
    abandon_after_seconds: Option<u64>,
}

/// The answer to a hold or a resume.
#[derive(Serialize, utoipa::ToSchema)]
struct HoldState {
    queue: String,
    paused: bool,
    /// False when the queue already was in that state.
    changed: bool,
}

/// Counts, rates and streams.
#[utoipa::path(
    get,
    path = "/api/admin/queues",
    tag = "admin",
    security(("admin" = [])),
    responses(
        (status = 200, description = "The overview.", body = Overview),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn queues(_: AdminAuth, State(state): State<AppState>) -> Result<Json<Overview>, ApiError> {
    let policy = state.policy();
    let mut out = Vec::new();
    for queue in state.queue_names() {
        let stats = state.store().stats(queue).await?;
        out.push(QueueCounts {
            queue: queue.as_str().to_owned(),
            waiting: stats.waiting,
            active: stats.active,
            pass: stats.pass,
            paused: stats.paused,
            observed_admissions_per_second: state.admission_rate(queue),
            streams_on_this_instance: state.hub().registered(queue),
        });
    }
    Ok(Json(Overview {
        queues: out,
        policy: PolicyView {
            admission_batch: policy.batch,
            admission_interval_ms: policy.interval_ms,
            token_ttl_seconds: policy.token_ttl_ms / 1000,
            max_active: policy.max_active,
            abandon_after_seconds: policy.abandon_after_ms.map(|m| m / 1000),
        },
        streams_open: state.hub().open_streams(),
        max_streams: state.max_streams(),
    }))
}

/// Holds admission on every instance (buyers keep places and streams).
#[utoipa::path(
    post,
    path = "/api/admin/queues/{queue}/pause",
    tag = "admin",
    security(("admin" = [])),
    params(("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name.")),
    responses(
        (status = 200, description = "Held.", body = HoldState),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn pause(
    _: AdminAuth,
    state: State<AppState>,
    queue: Queue,
) -> Result<Json<HoldState>, ApiError> {
    set_paused(state, queue, true).await
}

/// Resumes admission on every instance.
#[utoipa::path(
    post,
    path = "/api/admin/queues/{queue}/resume",
    tag = "admin",
    security(("admin" = [])),
    params(("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name.")),
    responses(
        (status = 200, description = "Resumed.", body = HoldState),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn resume(
    _: AdminAuth,
    state: State<AppState>,
    queue: Queue,
) -> Result<Json<HoldState>, ApiError> {
    set_paused(state, queue, false).await
}

/// Holds or resumes admission for every instance at once (the flag lives in
/// the store); buyers keep their places and their streams.
async fn set_paused(
    State(state): State<AppState>,
    Queue(queue): Queue,
    paused: bool,
) -> Result<Json<HoldState>, ApiError> {
    let changed = state.store().set_paused(&queue, paused).await?;
    tracing::info!(%queue, paused, changed, "admission hold changed by an operator");
    Ok(Json(HoldState {
        queue: queue.as_str().to_owned(),
        paused,
        changed,
    }))
}

/// A product to add or update.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProductBody {
    name: String,
    queue: String,
    price_cents: i64,
    stock: i64,
    /// The most one order may buy (1-1,000,000,000); absent keeps the
    /// current cap (a new product gets the default).
    max_per_order: Option<i64>,
}

/// The largest `maxPerOrder` accepted (the order API's own quantity cap).
const MAX_PER_ORDER_LIMIT: i64 = 1_000_000_000;

/// Adds, restocks or caps a demo product.
#[utoipa::path(
    put,
    path = "/api/admin/products/{id}",
    tag = "admin",
    security(("admin" = [])),
    params(("id" = String, Path, description = "The product's id (1-64 characters).")),
    request_body = ProductBody,
    responses(
        (status = 200, description = "The product as stored.", body = Product),
        (status = 400, description = "`invalid_product`, `unknown_queue`, `invalid_body`.", body = ErrorBody),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`orders_disabled`.", body = ErrorBody),
        (status = 408, description = "`request_timeout`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 503, description = "`server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
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
