//! Stock reports (`crate::queue::stock`): how an order service tells the
//! waiting room what it has left, so admission admits no more buyers than
//! can still buy and a sold-out line is told so at once.
//!
//! Three ways in, one store call: operators (`PUT
//! /api/admin/queues/{queue}/stock`), order services with the service token
//! (`POST /api/tokens/stock`, after each commit and each restock), and the
//! demo order service itself with `--stock-from-orders`
//! (`report_demo_stock`). Bad input is `400` and changes nothing.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::{AdminAuth, ServiceAuth};
use super::extract::{JsonBody, Queue};
use crate::error::ErrorCode;
use crate::error::{ApiError, ErrorBody};
use crate::queue::stock::MAX_UNITS;
use crate::queue::{QueueName, StockReport};
use crate::store::StockState;

/// `/api/admin/queues/{queue}/stock` and `/api/tokens/stock`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(put_stock, get_stock))
        .routes(routes!(report_stock))
}

/// What is left to sell through a queue.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StockBody {
    /// Units left (0-1,000,000,000,000); 0 is sold out.
    #[schema(minimum = 0, maximum = 1_000_000_000_000u64)]
    remaining: u64,
    /// The most one buyer (one entry token) may take (1-1,000,000,000,000);
    /// 1 if absent.
    #[schema(minimum = 1, maximum = 1_000_000_000_000u64)]
    max_per_buyer: Option<u64>,
}

/// A stock report of an order service: [`StockBody`] and its queue.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ServiceStockBody {
    queue: String,
    #[schema(minimum = 0, maximum = 1_000_000_000_000u64)]
    remaining: u64,
    #[schema(minimum = 1, maximum = 1_000_000_000_000u64)]
    max_per_buyer: Option<u64>,
}

/// A queue's stock as the waiting room applies it.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct StockView {
    queue: String,
    /// Units left, as last reported.
    remaining: u64,
    /// The most one buyer may take, as last reported.
    max_per_buyer: u64,
    /// Entry tokens used for orders since the last report.
    consumed_since_report: u64,
    /// Buyers holding an unexpired token (each may still take
    /// `maxPerBuyer`).
    holders: u64,
    /// Buyers admission may admit now.
    admissible: u64,
    /// Nothing left: those in line are told `SOLD_OUT` and keep their
    /// places for a restock.
    sold_out: bool,
}

impl StockView {
    fn new(queue: &QueueName, s: StockState) -> Self {
        Self {
            queue: queue.as_str().to_owned(),
            remaining: s.remaining,
            max_per_buyer: s.per_buyer,
            consumed_since_report: s.consumed_since_report,
            holders: s.holders,
            admissible: s.admissible,
            sold_out: s.sold_out,
        }
    }
}

/// Checks a report's numbers: `400 invalid_stock`, naming the field.
fn checked(remaining: u64, max_per_buyer: Option<u64>) -> Result<StockReport, ApiError> {
    let per_buyer = max_per_buyer.unwrap_or(1);
    if remaining > MAX_UNITS {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidStock,
            format!("remaining: 0-{MAX_UNITS}"),
        ));
    }
    if !(1..=MAX_UNITS).contains(&per_buyer) {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidStock,
            format!("maxPerBuyer: 1-{MAX_UNITS}"),
        ));
    }
    Ok(StockReport {
        remaining,
        per_buyer,
    })
}

async fn record(
    state: &AppState,
    queue: &QueueName,
    report: StockReport,
    by: &str,
) -> Result<Json<StockView>, ApiError> {
    let stock = state.store().set_stock(queue, report).await?;
    tracing::info!(%queue, remaining = report.remaining, per_buyer = report.per_buyer, sold_out = stock.sold_out, by, "stock reported");
    Ok(Json(StockView::new(queue, stock)))
}

/// Links the queue to a stock, or updates it (a restock reopens a
/// sold-out line for those still in it, in their order).
#[utoipa::path(
    put,
    path = "/api/admin/queues/{queue}/stock",
    tag = "admin",
    security(("admin" = [])),
    params(("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name.")),
    request_body = StockBody,
    responses(
        (status = 200, description = "The stock as applied.", body = StockView),
        (status = 400, description = "`invalid_stock`, `invalid_body`.", body = ErrorBody),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 408, description = "`request_timeout`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn put_stock(
    _: AdminAuth,
    State(state): State<AppState>,
    Queue(queue): Queue,
    JsonBody(body): JsonBody<StockBody>,
) -> Result<Json<StockView>, ApiError> {
    let report = checked(body.remaining, body.max_per_buyer)?;
    record(&state, &queue, report, "operator").await
}

/// The queue's stock.
#[utoipa::path(
    get,
    path = "/api/admin/queues/{queue}/stock",
    tag = "admin",
    security(("admin" = [])),
    params(("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name.")),
    responses(
        (status = 200, description = "The stock.", body = StockView),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`; `no_stock`: nothing reported for this queue.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn get_stock(
    _: AdminAuth,
    State(state): State<AppState>,
    Queue(queue): Queue,
) -> Result<Json<StockView>, ApiError> {
    match state.store().stock(&queue).await? {
        Some(stock) => Ok(Json(StockView::new(&queue, stock))),
        None => Err(ApiError::not_found(
            ErrorCode::NoStock,
            "no stock was reported for this queue",
        )),
    }
}

/// An order service reports what it has left: after each commit (after
/// the consume) and after each restock.
#[utoipa::path(
    post,
    path = "/api/tokens/stock",
    tag = "tokens",
    operation_id = "report_stock",
    security(("service" = [])),
    request_body = ServiceStockBody,
    responses(
        (status = 200, description = "The stock as applied.", body = StockView),
        (status = 400, description = "`invalid_stock`, `invalid_body`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`: no valid service token (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`; `token_api_disabled` (no `--service-token`; checked before the bearer).", body = ErrorBody),
        (status = 408, description = "`request_timeout`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn report_stock(
    _: ServiceAuth,
    State(state): State<AppState>,
    JsonBody(body): JsonBody<ServiceStockBody>,
) -> Result<Json<StockView>, ApiError> {
    let queue = QueueName::parse(&body.queue)
        .ok()
        .filter(|q| state.has_queue(q))
        .ok_or_else(|| ApiError::not_found(ErrorCode::UnknownQueue, "no such queue"))?;
    let report = checked(body.remaining, body.max_per_buyer)?;
    record(&state, &queue, report, "order service").await
}

/// With `--stock-from-orders`, reports the demo products of `queue` to the
/// store. A failure is logged, not returned: the order or restock it
/// follows is done, and the next report (or an operator's) catches up.
#[cfg(feature = "demo-orders")]
pub(super) async fn report_demo_stock(state: &AppState, queue: &str) {
    if !state.settings().stock_from_orders {
        return;
    }
    let (Some(orders), Ok(queue)) = (state.orders(), QueueName::parse(queue)) else {
        return;
    };
    if let Err(e) = crate::orders::stock::report_from(state.store(), orders, &queue).await {
        tracing::warn!(%queue, error = %e, "cannot report the demo stock");
    }
}
