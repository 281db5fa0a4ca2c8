//! The token API, for order services not written in Rust: claim a buyer's
//! entry token before the order, consume it after commit, release it after
//! a rollback. Authenticated with `Authorization: Bearer <service token>`,
//! checked before anything else.
//!
//! A claim's answer carries the token's `idempotencyKey` (its SHA-256):
//! the order service stores it with the order under a `UNIQUE` constraint.
//!
//! A claim needs only the token: the answer names the buyer (`userId`),
//! whom consume and release then name. An order service behind visitor
//! cookies cannot know the buyer otherwise (the cookie is waitroom's,
//! `HttpOnly` and signed, and its format is no contract), and one that
//! does know may still send `userId`, which must then be the token's.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::ServiceAuth;
use super::extract::JsonBody;
use crate::clock::now_ms;
use crate::error::ErrorCode;
use crate::error::{ApiError, ErrorBody};
use crate::gate::Settle;
use crate::queue::{QueueName, UserId};

/// `/api/tokens/claim`, `/api/tokens/consume`, `/api/tokens/release`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(claim))
        .routes(routes!(consume))
        .routes(routes!(release))
}

/// A claim of a buyer's entry token, before the order's transaction.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClaimRequest {
    /// The buyer, if the order service knows it: the token must then be
    /// theirs. Left out, the token names its buyer, and the answer's
    /// `userId` says who that is.
    #[schema(pattern = r"^[A-Za-z0-9_.:-]{1,64}$")]
    user_id: Option<String>,
    /// The buyer's entry token.
    token: String,
    /// The token's queue; found among the queues if absent.
    queue: Option<String>,
}

/// A held claim, to consume or release.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClaimRef {
    user_id: String,
    queue: String,
    /// The `claimId` a claim answered.
    claim_id: String,
}

/// A claim granted.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct ClaimGranted {
    claim_id: String,
    queue: String,
    /// The buyer the token was issued to: name them in consume and release.
    user_id: String,
    /// The token's SHA-256, hex: store it with the order under `UNIQUE`.
    idempotency_key: String,
    /// The claim lapses back to READY after this long unless consumed or
    /// released.
    lease_seconds: u64,
}

fn user(raw: &str) -> Result<UserId, ApiError> {
    UserId::parse(raw).map_err(|e| ApiError::bad_request(ErrorCode::InvalidUserId, e.0))
}

fn queue(state: &AppState, raw: &str) -> Result<QueueName, ApiError> {
    QueueName::parse(raw)
        .ok()
        .filter(|q| state.has_queue(q))
        .ok_or_else(|| ApiError::not_found(ErrorCode::UnknownQueue, "no such queue"))
}

/// Claims a buyer's entry token for one order: no other order can use it
/// until the claim is consumed, released or lapses. The token alone is
/// enough; the answer names its buyer.
#[utoipa::path(
    post,
    path = "/api/tokens/claim",
    tag = "tokens",
    operation_id = "claim",
    security(("service" = [])),
    request_body = ClaimRequest,
    responses(
        (status = 200, description = "Claimed; `userId` is the token's buyer (whether or not the request named one).", body = ClaimGranted),
        (status = 400, description = "`invalid_body`, `invalid_user_id`.", body = ErrorBody),
        (status = 401, description = "`unauthorized` (no valid service token, checked first), `invalid_token` (no live token, or not the `userId` sent).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`; `token_api_disabled` (no `--service-token`; checked before the bearer).", body = ErrorBody),
        (status = 408, description = "`request_timeout`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
        (status = 409, description = "`token_in_use`: another order holds a claim.", body = ErrorBody),
    )
)]
async fn claim(
    _: ServiceAuth,
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ClaimRequest>,
) -> Result<Response, ApiError> {
    let user = req.user_id.as_deref().map(user).transpose()?;
    let queue = req.queue.as_deref().map(|q| queue(&state, q)).transpose()?;
    let gate = state.gate();
    let claim = match &user {
        Some(user) => gate.claim(queue.as_ref(), user, &req.token).await?,
        None => gate.claim_token(queue.as_ref(), &req.token).await?,
    };
    Ok(Json(ClaimGranted {
        claim_id: stamp(&claim.claim_id),
        queue: claim.queue.as_str().to_owned(),
        user_id: claim.user.as_str().to_owned(),
        idempotency_key: claim.idempotency_key,
        lease_seconds: state.settings().claim_lease_secs,
    })
    .into_response())
}

/// The claim id handed out: the store's, stamped with when it was
/// claimed (ms since the epoch), so a consume on any instance can measure
/// the order's claim-to-commit time for adaptive admission.
fn stamp(claim_id: &str) -> String {
    format!("{claim_id}.{}", now_ms())
}

/// The store's claim id and, when stamped, when it was claimed. The
/// store's ids are base64url (no `.`), so an id without a stamp (an older
/// instance's) is passed on whole.
fn unstamp(raw: &str) -> (&str, Option<u64>) {
    match raw.rsplit_once('.') {
        Some((id, at)) => match at.parse() {
            Ok(at) => (id, Some(at)),
            Err(_) => (raw, None),
        },
        None => (raw, None),
    }
}

/// After the order committed: deletes the token.
#[utoipa::path(
    post,
    path = "/api/tokens/consume",
    tag = "tokens",
    operation_id = "consume",
    security(("service" = [])),
    request_body = ClaimRef,
    responses(
        (status = 204, description = "Deleted."),
        (status = 400, description = "`invalid_body`, `invalid_user_id`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`: no valid service token (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`; `token_api_disabled` (no `--service-token`; checked before the bearer).", body = ErrorBody),
        (status = 408, description = "`request_timeout`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
        (status = 409, description = "`claim_not_held`: nothing left for this claim to delete.", body = ErrorBody),
    )
)]
async fn consume(
    _: ServiceAuth,
    state: State<AppState>,
    body: JsonBody<ClaimRef>,
) -> Result<Response, ApiError> {
    settle(state, body, true).await
}

/// After the order rolled back: the token is READY again.
#[utoipa::path(
    post,
    path = "/api/tokens/release",
    tag = "tokens",
    operation_id = "release",
    security(("service" = [])),
    request_body = ClaimRef,
    responses(
        (status = 204, description = "Released."),
        (status = 400, description = "`invalid_body`, `invalid_user_id`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`: no valid service token (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`; `token_api_disabled` (no `--service-token`; checked before the bearer).", body = ErrorBody),
        (status = 408, description = "`request_timeout`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
        (status = 409, description = "`claim_not_held`: the claim no longer holds the token.", body = ErrorBody),
    )
)]
async fn release(
    _: ServiceAuth,
    state: State<AppState>,
    body: JsonBody<ClaimRef>,
) -> Result<Response, ApiError> {
    settle(state, body, false).await
}

/// Settles a claim (`committed`: consume, else release) through the
/// gate's one settle path, the one the Rust extractor takes too, so both
/// are counted alike; the caller is already authenticated.
async fn settle(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ClaimRef>,
    committed: bool,
) -> Result<Response, ApiError> {
    let (queue, user) = (queue(&state, &req.queue)?, user(&req.user_id)?);
    let (claim_id, claimed_at) = unstamp(&req.claim_id);
    let how = if committed {
        // Clocks of two instances may differ a little: never negative.
        Settle::Consume {
            claimed_ms: claimed_at.map(|at| now_ms().saturating_sub(at)),
        }
    } else {
        Settle::Release
    };
    let held = state.gate().settle(&queue, &user, claim_id, how).await?;
    if held {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::conflict(
            ErrorCode::ClaimNotHeld,
            "this claim no longer holds the token",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamped_claim_id_gives_back_the_store_id_and_the_time() {
        let stamped = stamp("AbC-_x");
        let (id, at) = unstamp(&stamped);
        assert_eq!(id, "AbC-_x");
        assert!(at.is_some_and(|at| at <= now_ms() && at + 60_000 > now_ms()));
        // An unstamped or oddly stamped id is passed on whole.
        assert_eq!(unstamp("AbC-_x"), ("AbC-_x", None));
        assert_eq!(unstamp("a.b"), ("a.b", None));
    }
}
