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

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

use super::error::ApiError;
use crate::app::AppState;
use crate::gate::EntryPass;
use crate::orders::{Order, OrderError, OrderStore, Product};
use crate::store::StoreError;

/// `/api/orders`, `/api/orders/{id}`, `/api/products`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/orders", post(place))
        .route("/api/orders/{id}", get(order))
        .route("/api/products", get(products))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct OrderRequest {
    product_id: String,
    quantity: i64,
}

/// The largest quantity one order may ask for.
const MAX_QUANTITY: i64 = 1_000_000_000;

fn orders(state: &AppState) -> Result<&OrderStore, ApiError> {
    state
        .orders()
        .ok_or_else(|| ApiError::not_found("orders_disabled", "the demo order service is off"))
}

async fn place(State(state): State<AppState>, pass: EntryPass) -> Result<Response, ApiError> {
    let store = orders(&state)?;
    let request = match pass.json::<OrderRequest>() {
        Ok(r) if (1..=MAX_QUANTITY).contains(&r.quantity) => r,
        Ok(_) => {
            pass.rolled_back().await;
            return Err(ApiError::bad_request(
                "invalid_body",
                format!("quantity must be 1-{MAX_QUANTITY}"),
            ));
        }
        Err(e) => {
            pass.rolled_back().await;
            return Err(ApiError::bad_request(
                "invalid_body",
                format!("the body is not valid JSON for this endpoint: {e}"),
            ));
        }
    };
    let product = match store.product(&request.product_id).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            pass.rolled_back().await;
            return Err(ApiError::not_found("unknown_product", "no such product"));
        }
        Err(e) => {
            pass.rolled_back().await;
            return Err(ApiError::Internal(e.to_string()));
        }
    };
    if product.queue != pass.queue().as_str() {
        pass.rolled_back().await;
        return Err(ApiError::unauthorized(
            "invalid_token",
            "this entry token is for another queue than the product's",
        ));
    }
    let pending = pass.pending_consume();
    match store
        .place(
            &product.id,
            request.quantity,
            pass.idempotency_key(),
            &pending,
        )
        .await
    {
        Ok(order) => {
            confirm(store, &order.order_id, pass.commit_recorded().await).await;
            metrics::counter!("waitroom_orders_total", "result" => "created").increment(1);
            Ok((StatusCode::CREATED, Json(order)).into_response())
        }
        Err(OrderError::OutOfStock) => {
            pass.rolled_back().await;
            metrics::counter!("waitroom_orders_total", "result" => "out_of_stock").increment(1);
            Err(ApiError::conflict(
                "out_of_stock",
                "not enough stock left; your entry token is still valid",
            ))
        }
        Err(OrderError::OverLimit { max }) => {
            pass.rolled_back().await;
            metrics::counter!("waitroom_orders_total", "result" => "over_limit").increment(1);
            Err(ApiError::bad_request(
                "quantity_over_limit",
                format!("at most {max} of this product per order; your entry token is still valid"),
            ))
        }
        Err(OrderError::UnknownProduct) => {
            pass.rolled_back().await;
            Err(ApiError::not_found("unknown_product", "no such product"))
        }
        Err(OrderError::TokenAlreadyUsed) => {
            // The database saw this token buy already: finish deleting it.
            pass.commit_succeeded().await;
            Err(ApiError::unauthorized(
                "invalid_token",
                "this entry token was already used",
            ))
        }
        Err(OrderError::Database(e)) => {
            pass.rolled_back().await;
            Err(ApiError::Internal(e.to_string()))
        }
    }
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

async fn order(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Order>, ApiError> {
    let identity = state.identity();
    let asker = identity.presented(&headers)?;
    // Behind a gateway a request naming nobody may read by the id (128
    // random bits); a visitor or a signed-in buyer sees only their own.
    let anonymous_ok = identity.anonymous_reads();
    let order = orders(&state)?
        .order(&id)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    match order {
        // Another user's order is answered exactly like a missing one.
        Some(o)
            if asker
                .as_ref()
                .map_or(anonymous_ok, |u| u.as_str() == o.user_id) =>
        {
            Ok(Json(o))
        }
        _ => Err(ApiError::not_found("unknown_order", "no such order")),
    }
}

async fn products(State(state): State<AppState>) -> Result<Json<Vec<Product>>, ApiError> {
    orders(&state)?
        .products()
        .await
        .map(Json)
        .map_err(|e| ApiError::Internal(e.to_string()))
}
