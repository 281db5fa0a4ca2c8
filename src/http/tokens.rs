//! The token API, for order services not written in Rust: claim a buyer's
//! entry token before the order, consume it after commit, release it after
//! a rollback. Authenticated with `Authorization: Bearer <service token>`,
//! checked before anything else.
//!
//! A claim's answer carries the token's `idempotencyKey` (its SHA-256):
//! the order service stores it with the order under a `UNIQUE` constraint.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::auth::ServiceAuth;
use super::error::ApiError;
use super::extract::JsonBody;
use crate::AppState;
use crate::queue::{QueueName, UserId};

/// `/api/tokens/claim`, `/api/tokens/consume`, `/api/tokens/release`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/tokens/claim", post(claim))
        .route("/api/tokens/consume", post(consume))
        .route("/api/tokens/release", post(release))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClaimRequest {
    user_id: String,
    token: String,
    queue: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClaimRef {
    user_id: String,
    queue: String,
    claim_id: String,
}

fn user(raw: &str) -> Result<UserId, ApiError> {
    UserId::parse(raw).map_err(|e| ApiError::bad_request("invalid_user_id", e.0))
}

fn queue(state: &AppState, raw: &str) -> Result<QueueName, ApiError> {
    QueueName::parse(raw)
        .ok()
        .filter(|q| state.has_queue(q))
        .ok_or_else(|| ApiError::not_found("unknown_queue", "no such queue"))
}

async fn claim(
    _: ServiceAuth,
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ClaimRequest>,
) -> Result<Response, ApiError> {
    let user = user(&req.user_id)?;
    let queue = req.queue.as_deref().map(|q| queue(&state, q)).transpose()?;
    let claim = state
        .gate()
        .claim(queue.as_ref(), &user, &req.token)
        .await?;
    Ok(Json(json!({
        "claimId": claim.claim_id,
        "queue": claim.queue.as_str(),
        "userId": claim.user.as_str(),
        "idempotencyKey": claim.idempotency_key,
        "leaseSeconds": state.config().claim_lease_secs,
    }))
    .into_response())
}

/// What to do with a held claim.
#[derive(Clone, Copy)]
enum Settle {
    /// The order committed: delete the token.
    Consume,
    /// The order rolled back: return the token to READY.
    Release,
}

async fn consume(
    _: ServiceAuth,
    state: State<AppState>,
    body: JsonBody<ClaimRef>,
) -> Result<Response, ApiError> {
    settle(state, body, Settle::Consume).await
}

async fn release(
    _: ServiceAuth,
    state: State<AppState>,
    body: JsonBody<ClaimRef>,
) -> Result<Response, ApiError> {
    settle(state, body, Settle::Release).await
}

/// Settles a claim; the caller is already authenticated.
async fn settle(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ClaimRef>,
    how: Settle,
) -> Result<Response, ApiError> {
    let (queue, user) = (queue(&state, &req.queue)?, user(&req.user_id)?);
    let store = state.store();
    let held = match how {
        Settle::Consume => store.consume(&queue, &user, &req.claim_id).await?,
        Settle::Release => store.release(&queue, &user, &req.claim_id).await?,
    };
    if held {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::conflict(
            "claim_not_held",
            "this claim no longer holds the token",
        ))
    }
}
