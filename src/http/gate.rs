//! The [`EntryPass`] extractor of the order gate ([`crate::gate`], which
//! knows no HTTP framework): identity headers, then the whole body, then
//! the claim; the claim's renewal while the handler runs; release on drop.
//! Also the gate's rejections as API errors (one mapping: [`gate_error`]).

use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{FromRef, FromRequest, Request};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::body::{BodyError, read_whole};
use super::identity::identity_code;
use crate::error::{ApiError, ErrorCode};
use crate::gate::{Claim, Gate, GateError, PendingConsume};
use crate::identity::{Identity, IdentityError};
use crate::queue::{QueueName, UserId};
use crate::store::StoreError;

/// A claimed entry token for one order, with the order's body. Call
/// [`commit_succeeded`] after the order's transaction commits, or
/// [`rolled_back`] if it did not; dropped without either, the claim is
/// released. Until then the claim's lease is renewed in the background.
///
/// It takes the request body, so it is the handler's last argument; read
/// the body with [`EntryPass::json`] or [`EntryPass::body`].
///
/// The queue is taken from an optional `X-Queue` header, else found among
/// the gate's queues.
///
/// For a delete that survives restarts (the outbox pattern), record
/// [`EntryPass::pending_consume`] with the order in the order's own
/// transaction, then call [`EntryPass::commit_recorded`] instead of
/// `commit_succeeded` and mark the record confirmed when it returns `Ok`;
/// a reconciler retries unconfirmed records with [`Gate::consume_pending`]
/// at start-up and periodically. Keep [`EntryPass::idempotency_key`] under
/// `UNIQUE` as the safety net. The module docs of [`crate::gate`] describe
/// it step by step.
///
/// [`commit_succeeded`]: EntryPass::commit_succeeded
/// [`rolled_back`]: EntryPass::rolled_back
pub struct EntryPass {
    gate: Gate,
    claim: Option<Claim>,
    token: String,
    body: Bytes,
    /// Cancelled when the order settles or the pass is dropped: stops the
    /// lease renewal.
    renewal: CancellationToken,
    /// When the token was claimed: the order's commit time is measured
    /// from here (adaptive admission follows it).
    claimed_at: Instant,
}

impl EntryPass {
    fn claim(&self) -> &Claim {
        self.claim
            .as_ref()
            .expect("claim held until the pass settles")
    }

    /// The queue the token was claimed in.
    pub fn queue(&self) -> &QueueName {
        &self.claim().queue
    }

    /// The user the token belongs to.
    pub fn user(&self) -> &UserId {
        &self.claim().user
    }

    /// The entry token that was claimed. Never log or store it; store
    /// [`EntryPass::idempotency_key`] instead.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The token's fingerprint (SHA-256, hex). Store it with the order
    /// under a `UNIQUE` constraint: one token then makes at most one order
    /// row even if the token store lost track of a claim or a used token.
    pub fn idempotency_key(&self) -> &str {
        &self.claim().idempotency_key
    }

    /// What to record with the order, in its transaction, so the token's
    /// delete can be retried after a restart: queue, user and claim id.
    pub fn pending_consume(&self) -> PendingConsume {
        let claim = self.claim();
        PendingConsume {
            queue: claim.queue.clone(),
            user: claim.user.clone(),
            claim_id: claim.claim_id.clone(),
        }
    }

    /// The order's body, read in full before the token was claimed.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The body as JSON. On an error, answer `400` and call
    /// [`EntryPass::rolled_back`] (or return: dropping releases too).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    /// The order committed: delete the token (durably; see [`Gate::consume`]).
    pub async fn commit_succeeded(mut self) {
        self.renewal.cancel();
        let claimed_ms = self.claimed_ms();
        if let Some(claim) = self.claim.take() {
            self.gate.consume(claim, Some(claimed_ms)).await;
        }
    }

    /// The order committed with its [`EntryPass::pending_consume`]
    /// recorded: delete the token once, now. `Ok` (deleted, or nothing
    /// left to delete; see [`Gate::consume_pending`]): mark the record
    /// confirmed. `Err`: the store is away; leave the record unconfirmed
    /// for the reconciler. Nothing is retried in the background: the
    /// record is the retry, and it survives a restart.
    pub async fn commit_recorded(mut self) -> Result<bool, StoreError> {
        self.renewal.cancel();
        let claimed_ms = self.claimed_ms();
        let pending = self.pending_consume();
        // Taken first: a pass dropped mid-consume must not release a claim
        // whose order committed.
        self.claim.take();
        self.gate.consume_pending(&pending, Some(claimed_ms)).await
    }

    /// The order rolled back: keep the token so the buyer can retry.
    pub async fn rolled_back(mut self) {
        self.renewal.cancel();
        if let Some(claim) = self.claim.take() {
            self.gate.release(claim).await;
        }
    }
}

impl EntryPass {
    /// The claim-to-commit time, for adaptive admission (counted by the
    /// settle, `Gate::settle`).
    fn claimed_ms(&self) -> u64 {
        self.claimed_at.elapsed().as_millis() as u64
    }
}

impl Drop for EntryPass {
    fn drop(&mut self) {
        self.renewal.cancel();
        if let Some(claim) = self.claim.take() {
            // A pass dropped unsettled is an order that did not go through
            // (the release counts it so).
            let gate = self.gate.clone();
            // Drop cannot await; outside a runtime the lease lapses instead.
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move { gate.release(claim).await });
            }
        }
    }
}

/// What the identity headers present.
struct Presented {
    user: UserId,
    token: String,
    queue: Option<QueueName>,
}

/// The one value of `name`, `None` if absent; sent twice is an error, since
/// which copy a gateway vouched for cannot be known.
fn single<'a>(
    headers: &'a HeaderMap,
    name: &'static str,
    shown: &'static str,
) -> Result<Option<&'a HeaderValue>, GateError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(GateError::DuplicateHeader(shown));
    }
    Ok(first)
}

impl Presented {
    fn from_headers(headers: &HeaderMap, identity: &Identity) -> Result<Self, GateError> {
        single(headers, "x-user-id", "X-User-Id")?;
        let token = single(headers, "x-entry-token", "X-Entry-Token")?;
        let queue = single(headers, "x-queue", "X-Queue")?;
        let user = identity.required(headers).map_err(|e| match e {
            IdentityError::MissingUserHeader | IdentityError::InvalidUserHeader(_) => {
                GateError::MissingUser
            }
            other => GateError::Identity(other),
        })?;
        let token = token
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(GateError::MissingToken)?
            .to_owned();
        let queue = match queue.map(|v| v.to_str()) {
            Some(Ok(raw)) => Some(QueueName::parse(raw).map_err(|_| GateError::InvalidToken)?),
            Some(Err(_)) => return Err(GateError::InvalidToken),
            None => None,
        };
        Ok(Self { user, token, queue })
    }
}

/// The whole order body, through the API's one body reader, so a slow
/// upload is the same `408` here as on every other endpoint.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, GateError> {
    read_whole(body, limit).await.map_err(|e| match e {
        BodyError::TooLarge => GateError::BodyTooLarge,
        BodyError::TimedOut => GateError::BodyTimeout,
        BodyError::Broken => GateError::BodyUnreadable,
    })
}

impl<S> FromRequest<S> for EntryPass
where
    Gate: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = GateError;

    async fn from_request(req: Request, state: &S) -> Result<Self, GateError> {
        let gate = Gate::from_ref(state);
        let (parts, body) = req.into_parts();
        let presented = Presented::from_headers(&parts.headers, gate.identity())?;
        // The body comes in before the claim: a slow upload holds nothing,
        // so no claim can lapse while its order is still arriving.
        let body = match read_body(body, gate.body_limit()).await {
            Ok(body) => body,
            Err(body_error) => {
                // The token is still answered first (401/409 before a body
                // error), as when the claim came before the body.
                let claim = gate
                    .claim(presented.queue.as_ref(), &presented.user, &presented.token)
                    .await?;
                gate.release(claim).await;
                return Err(body_error);
            }
        };
        let claim = gate
            .claim(presented.queue.as_ref(), &presented.user, &presented.token)
            .await?;
        let renewal = gate.keep_alive(&claim);
        Ok(EntryPass {
            claimed_at: Instant::now(),
            gate,
            claim: Some(claim),
            token: presented.token,
            body,
            renewal,
        })
    }
}

/// The gate's rejections as the API's errors, the one mapping of
/// [`GateError`] to status and code: `401` for who and which token,
/// `400 duplicate_header`/`invalid_body`, `413`, `408`, `409 token_in_use`,
/// `503 store_unavailable`.
pub fn gate_error(e: GateError) -> ApiError {
    let message = e.to_string();
    match e {
        GateError::MissingUser => ApiError::unauthorized(ErrorCode::MissingUserId, message),
        GateError::Identity(e) => ApiError::unauthorized(identity_code(&e), message),
        GateError::MissingToken => ApiError::unauthorized(ErrorCode::MissingToken, message),
        GateError::InvalidToken => ApiError::unauthorized(ErrorCode::InvalidToken, message),
        GateError::DuplicateHeader(_) => ApiError::bad_request(ErrorCode::DuplicateHeader, message),
        GateError::BodyUnreadable => ApiError::bad_request(ErrorCode::InvalidBody, message),
        GateError::BodyTooLarge => ApiError::PayloadTooLarge,
        GateError::BodyTimeout => ApiError::RequestTimeout,
        GateError::InUse => ApiError::conflict(ErrorCode::TokenInUse, message),
        GateError::Store(e) => ApiError::Unavailable(e),
    }
}

impl From<GateError> for ApiError {
    fn from(e: GateError) -> Self {
        gate_error(e)
    }
}

/// Renders through the service's one error shape
/// (`{"error": "<code>", "message": "..."}`, see [`ApiError`]).
impl IntoResponse for GateError {
    fn into_response(self) -> Response {
        gate_error(self).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorBody;
    use axum::http::StatusCode;

    /// Every gate rejection renders with the status and code the gate
    /// documents for integrators.
    #[tokio::test]
    async fn gate_errors_keep_their_status_and_code() {
        for (e, status, code) in [
            (
                GateError::MissingUser,
                StatusCode::UNAUTHORIZED,
                ErrorCode::MissingUserId,
            ),
            (
                GateError::MissingToken,
                StatusCode::UNAUTHORIZED,
                ErrorCode::MissingToken,
            ),
            (
                GateError::InvalidToken,
                StatusCode::UNAUTHORIZED,
                ErrorCode::InvalidToken,
            ),
            (
                GateError::DuplicateHeader("X-User-Id"),
                StatusCode::BAD_REQUEST,
                ErrorCode::DuplicateHeader,
            ),
            (
                GateError::BodyTooLarge,
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::PayloadTooLarge,
            ),
            (
                GateError::BodyTimeout,
                StatusCode::REQUEST_TIMEOUT,
                ErrorCode::RequestTimeout,
            ),
            (
                GateError::BodyUnreadable,
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidBody,
            ),
            (
                GateError::InUse,
                StatusCode::CONFLICT,
                ErrorCode::TokenInUse,
            ),
            (
                GateError::Store(StoreError::Unavailable("down".into())),
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::StoreUnavailable,
            ),
        ] {
            let message = e.to_string();
            let response = e.into_response();
            assert_eq!(response.status(), status);
            if status == StatusCode::SERVICE_UNAVAILABLE {
                // Like every other 503 of the service: retry soon.
                assert_eq!(response.headers()["retry-after"], "2");
            }
            let bytes = axum::body::to_bytes(response.into_body(), 4096)
                .await
                .unwrap();
            let body: ErrorBody = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(body.error, code);
            if status != StatusCode::SERVICE_UNAVAILABLE {
                assert_eq!(body.message, message);
            }
        }
    }
}
