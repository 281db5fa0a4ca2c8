//! The [`EntryPass`] extractor: identity headers, then the whole body, then
//! the claim; the claim's renewal while the handler runs; release on drop.

use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{FromRef, FromRequest, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::{Claim, Gate, GateError, PendingConsume};
use crate::http::ApiError;
use crate::http::body::{BodyError, read_whole};
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
        let presented = Presented::from_headers(&parts.headers, &gate.identity)?;
        // The body comes in before the claim: a slow upload holds nothing,
        // so no claim can lapse while its order is still arriving.
        let body = match read_body(body, gate.body_limit).await {
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

impl GateError {
    /// The HTTP status and error code of the contract.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::MissingUser => (StatusCode::UNAUTHORIZED, "missing_user_id"),
            Self::Identity(e) => (StatusCode::UNAUTHORIZED, e.code()),
            Self::MissingToken => (StatusCode::UNAUTHORIZED, "missing_token"),
            Self::InvalidToken => (StatusCode::UNAUTHORIZED, "invalid_token"),
            Self::DuplicateHeader(_) => (StatusCode::BAD_REQUEST, "duplicate_header"),
            Self::BodyTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Self::BodyTimeout => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            Self::BodyUnreadable => (StatusCode::BAD_REQUEST, "invalid_body"),
            Self::InUse => (StatusCode::CONFLICT, "token_in_use"),
            Self::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
        }
    }
}

/// The gate's rejections keep their codes (`GateError::status_and_code`)
/// and messages; only the rendering is shared. Here rather than in
/// `crate::http::error`, so the arrow runs one way: the gate uses the
/// error shape, the error shape knows no gate.
impl From<GateError> for ApiError {
    fn from(e: GateError) -> Self {
        let (_, code) = e.status_and_code();
        match e {
            GateError::MissingUser
            | GateError::Identity(_)
            | GateError::MissingToken
            | GateError::InvalidToken => Self::unauthorized(code, e.to_string()),
            GateError::DuplicateHeader(_) | GateError::BodyUnreadable => {
                Self::bad_request(code, e.to_string())
            }
            GateError::BodyTooLarge => Self::PayloadTooLarge,
            GateError::BodyTimeout => Self::RequestTimeout,
            GateError::InUse => Self::conflict(code, e.to_string()),
            GateError::Store(e) => Self::Unavailable(e),
        }
    }
}

/// Renders through the service's one error shape
/// (`{"error": "<code>", "message": "..."}`, see [`crate::http::ApiError`]).
impl IntoResponse for GateError {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}
