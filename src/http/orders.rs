//! The demo order service: `POST /api/orders`, `GET /api/orders/{id}`,
//! `GET /api/products`.
//!
//! Checks run in the contract's order: identity and entry token (`401`,
//! by the [`EntryPass`] extractor, before any order logic), then the body
//! (`400`, releasing the claim), then the transaction. The extractor reads
//! the whole body before it claims, and keeps the claim alive while the
//! order runs. The token is deleted only after the transaction commits; a
//! rolled-back order (out of stock, over the product's `maxPerOrder`)
//! keeps it. The delete is recorded with the order in its transaction and
//! confirmed once the store took it; a delete the store could not take is
//! finished by the reconciler (`crate::orders::reconcile`), even after a
//! restart.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::EntryPass;
use crate::error::ErrorCode;
use crate::error::{ApiError, ErrorBody};
use crate::identity::IdentityError;
use crate::orders::{Order, OrderError, OrderStore, Product};
use crate::store::StoreError;

/// `/api/orders`, `/api/orders/{id}`, `/api/products`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(place))
        .routes(routes!(order))
        .routes(routes!(products))
}

/// An order's body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct OrderRequest {
    /// A product id from `GET /api/products`.
    product_id: String,
    /// 1 to the product's `maxPerOrder`.
    #[schema(minimum = 1, maximum = 1_000_000_000)]
    quantity: i64,
}

/// The largest quantity one order may ask for.
const MAX_QUANTITY: i64 = 1_000_000_000;

fn orders(state: &AppState) -> Result<&OrderStore, ApiError> {
    state.orders().ok_or_else(|| {
        ApiError::not_found(ErrorCode::OrdersDisabled, "the demo order service is off")
    })
}

/// Places an order with an entry token, which it uses up once the order
/// commits; a refused order keeps the token.
#[utoipa::path(
    post,
    path = "/api/orders",
    tag = "orders",
    operation_id = "place_order",
    params(
        ("X-User-Id" = String, Header, pattern = r"^[A-Za-z0-9_.:-]{1,64}$", description = "The buyer."),
        ("X-Entry-Token" = String, Header, description = "The buyer's entry token (READY)."),
        ("X-Queue" = Option<String>, Header, description = "The token's queue; found among the queues if absent."),
    ),
    request_body = OrderRequest,
    responses(
        (status = 201, description = "Ordered; the token is used up.", body = Order),
        (status = 400, description = "`invalid_body`, `quantity_over_limit`, `duplicate_header` (the token is kept).", body = ErrorBody),
        (status = 401, description = "`missing_user_id`, `missing_token`, `invalid_token`.", body = ErrorBody),
        (status = 404, description = "`unknown_product`, `orders_disabled`.", body = ErrorBody),
        (status = 408, description = "`request_timeout`.", body = ErrorBody),
        (status = 409, description = "`token_in_use` (another order holds it), `out_of_stock` (the token is kept).", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `database_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn place(State(state): State<AppState>, pass: EntryPass) -> Result<Response, ApiError> {
    let store = orders(&state)?;
    // The operator's slowdown, inside the claim: counted in the order's
    // claim-to-commit time like a slow database would be.
    if store.slowdown().apply().await {
        pass.rolled_back().await;
        return Err(ApiError::DatabaseUnavailable(
            "the demo order service is slowed on purpose".into(),
        ));
    }
    match attempt(store, &pass).await {
        Ok(order) => {
            let queue = pass.queue().clone();
            confirm(store, &order.order_id, pass.commit_recorded().await).await;
            // After the consume: the report then counts this order.
            super::stock::report_demo_stock(&state, queue.as_str()).await;
            metrics::counter!("waitroom_orders_total", "result" => "created").increment(1);
            Ok((StatusCode::CREATED, Json(order)).into_response())
        }
        Err(NotPlaced::RolledBack(e)) => {
            pass.rolled_back().await;
            Err(e)
        }
        Err(NotPlaced::AlreadyUsed) => {
            // The database saw this token buy already: finish deleting it.
            pass.commit_succeeded().await;
            Err(ApiError::unauthorized(
                ErrorCode::InvalidToken,
                "this entry token was already used",
            ))
        }
    }
}

/// Why an order was not placed, which decides what becomes of its token.
enum NotPlaced {
    /// Nothing was sold: the claim is released, the token stays usable.
    RolledBack(ApiError),
    /// The order table already holds this token's idempotency key.
    AlreadyUsed,
}

impl From<ApiError> for NotPlaced {
    fn from(e: ApiError) -> Self {
        Self::RolledBack(e)
    }
}

/// Checks the body and the product, then runs the order's transaction;
/// the caller settles the claim from the outcome.
async fn attempt(store: &OrderStore, pass: &EntryPass) -> Result<Order, NotPlaced> {
    let request = match pass.json::<OrderRequest>() {
        Ok(r) if (1..=MAX_QUANTITY).contains(&r.quantity) => r,
        Ok(_) => {
            return Err(ApiError::bad_request(
                ErrorCode::InvalidBody,
                format!("quantity must be 1-{MAX_QUANTITY}"),
            )
            .into());
        }
        Err(e) => {
            return Err(ApiError::bad_request(
                ErrorCode::InvalidBody,
                format!("the body is not valid JSON for this endpoint: {e}"),
            )
            .into());
        }
    };
    let product = store
        .product(&request.product_id)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::not_found(ErrorCode::UnknownProduct, "no such product"))?;
    if product.queue != pass.queue().as_str() {
        return Err(ApiError::unauthorized(
            ErrorCode::InvalidToken,
            "this entry token is for another queue than the product's",
        )
        .into());
    }
    let placed = store
        .place(
            &product.id,
            request.quantity,
            pass.idempotency_key(),
            &pass.pending_consume(),
        )
        .await;
    placed.map_err(|e| match e {
        OrderError::OutOfStock => {
            metrics::counter!("waitroom_orders_total", "result" => "out_of_stock").increment(1);
            ApiError::conflict(
                ErrorCode::OutOfStock,
                "not enough stock left; your entry token is still valid",
            )
            .into()
        }
        OrderError::OverLimit { max } => {
            metrics::counter!("waitroom_orders_total", "result" => "over_limit").increment(1);
            ApiError::bad_request(
                ErrorCode::QuantityOverLimit,
                format!("at most {max} of this product per order; your entry token is still valid"),
            )
            .into()
        }
        OrderError::UnknownProduct => {
            ApiError::not_found(ErrorCode::UnknownProduct, "no such product").into()
        }
        OrderError::TokenAlreadyUsed => NotPlaced::AlreadyUsed,
        OrderError::Database(e) => ApiError::from(e).into(),
    })
}

/// Marks the order's recorded token delete confirmed if the store took it;
/// otherwise leaves it to the reconciler, rung to retry soon. The buyer's
/// answer is the order's success either way.
async fn confirm(store: &OrderStore, order_id: &str, consumed: Result<bool, StoreError>) {
    match consumed {
        Ok(_) => {
            if let Err(e) = store.confirm_consume(order_id).await {
                // The reconciler's next round deletes nothing and confirms it.
                tracing::warn!(order = %order_id, error = %e, "cannot confirm the token delete; the reconciler will");
            }
        }
        Err(e) => {
            tracing::warn!(order = %order_id, error = %e, "token delete failed after commit; the reconciler retries it");
            metrics::counter!("waitroom_consume_retries_total").increment(1);
            store.ring_reconciler();
        }
    }
}

/// An order, to its own buyer only.
#[utoipa::path(
    get,
    path = "/api/orders/{id}",
    tag = "orders",
    operation_id = "get_order",
    params(
        ("id" = String, Path, description = "The order's id."),
        ("X-User-Id" = Option<String>, Header, pattern = r"^[A-Za-z0-9_.:-]{1,64}$", description = "The buyer (header mode; required)."),
    ),
    responses(
        (status = 200, description = "The order.", body = Order),
        (status = 400, description = "`invalid_user_id`, `duplicate_header`.", body = ErrorBody),
        (status = 401, description = "The request names no buyer: `missing_user_id` (header mode), `missing_identity` (visitor and signed modes), `invalid_identity`, `identity_expired` (signed mode).", body = ErrorBody),
        (status = 404, description = "`unknown_order` (also another buyer's order), `orders_disabled`.", body = ErrorBody),
        (status = 503, description = "`database_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn order(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Order>, ApiError> {
    // In every mode the reader must be named: an order id is no
    // credential (it ends up in receipts, logs, support tickets and the
    // browser's history), and behind a gateway a request without
    // `X-User-Id` is one the gateway did not vouch for.
    let asker = state.identity().required(&headers).map_err(|e| match e {
        IdentityError::MissingUserHeader => {
            ApiError::unauthorized(ErrorCode::MissingUserId, e.to_string())
        }
        other => other.into(),
    })?;
    let order = orders(&state)?.order(&id).await.map_err(ApiError::from)?;
    match order {
        Some(o) if asker.as_str() == o.user_id => Ok(Json(o)),
        // Another buyer's order is answered exactly like a missing one.
        _ => Err(ApiError::not_found(
            ErrorCode::UnknownOrder,
            "no such order",
        )),
    }
}

/// The demo service's products.
#[utoipa::path(
    get,
    path = "/api/products",
    tag = "orders",
    responses(
        (status = 200, description = "Every product, with its stock.", body = Vec<Product>),
        (status = 404, description = "`orders_disabled`.", body = ErrorBody),
        (status = 503, description = "`database_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn products(State(state): State<AppState>) -> Result<Json<Vec<Product>>, ApiError> {
    orders(&state)?
        .products()
        .await
        .map(Json)
        .map_err(ApiError::from)
}
