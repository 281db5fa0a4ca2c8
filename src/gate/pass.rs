//! The [`EntryPass`] extractor and its release-on-drop guard.

use axum::extract::{FromRef, FromRequestParts};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use super::{Claim, Gate, GateError};
use crate::queue::{QueueName, UserId};

/// A claimed entry token for one order. Call [`commit_succeeded`] after the
/// order's transaction commits, or [`rolled_back`] if it did not; dropped
/// without either, the claim is released.
///
/// The queue is taken from an optional `X-Queue` header, else found among
/// the gate's queues.
///
/// [`commit_succeeded`]: EntryPass::commit_succeeded
/// [`rolled_back`]: EntryPass::rolled_back
pub struct EntryPass {
    gate: Gate,
    claim: Option<Claim>,
    token: String,
}

impl EntryPass {
    /// The queue the token was claimed in.
    pub fn queue(&self) -> &QueueName {
        &self
            .claim
            .as_ref()
            .expect("claim held until consumed")
            .queue
    }

    /// The user the token belongs to.
    pub fn user(&self) -> &UserId {
        &self.claim.as_ref().expect("claim held until consumed").user
    }

    /// The entry token that was claimed (for recording which token bought
    /// an order; never log it).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The order committed: delete the token (durably; see [`Gate::consume`]).
    pub async fn commit_succeeded(mut self) {
        if let Some(claim) = self.claim.take() {
            self.gate.consume(claim).await;
        }
    }

    /// The order rolled back: keep the token so the buyer can retry.
    pub async fn rolled_back(mut self) {
        if let Some(claim) = self.claim.take() {
            self.gate.release(claim).await;
        }
    }
}

impl Drop for EntryPass {
    fn drop(&mut self) {
        if let Some(claim) = self.claim.take() {
            let gate = self.gate.clone();
            // Drop cannot await; outside a runtime the lease lapses instead.
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move { gate.release(claim).await });
            }
        }
    }
}

impl<S> FromRequestParts<S> for EntryPass
where
    Gate: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = GateError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, GateError> {
        let gate = Gate::from_ref(state);
        let user = parts
            .headers
            .get("x-user-id")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| UserId::parse(v).ok())
            .ok_or(GateError::MissingUser)?;
        let token = parts
            .headers
            .get("x-entry-token")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(GateError::MissingToken)?;
        let queue = match parts.headers.get("x-queue").and_then(|v| v.to_str().ok()) {
            Some(raw) => Some(QueueName::parse(raw).map_err(|_| GateError::InvalidToken)?),
            None => None,
        };
        let claim = gate.claim(queue.as_ref(), &user, token).await?;
        Ok(EntryPass {
            gate,
            claim: Some(claim),
            token: token.to_owned(),
        })
    }
}

impl GateError {
    /// The HTTP status and error code of the contract.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::MissingUser => (StatusCode::UNAUTHORIZED, "missing_user_id"),
            Self::MissingToken => (StatusCode::UNAUTHORIZED, "missing_token"),
            Self::InvalidToken => (StatusCode::UNAUTHORIZED, "invalid_token"),
            Self::InUse => (StatusCode::CONFLICT, "token_in_use"),
            Self::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
        }
    }
}

impl IntoResponse for GateError {
    fn into_response(self) -> Response {
        if let Self::Store(e) = &self {
            tracing::warn!(error = %e, "order refused: store unavailable");
        }
        let (status, code) = self.status_and_code();
        let message = match &self {
            Self::Store(_) => "the waiting room is briefly unavailable; please retry".to_owned(),
            other => other.to_string(),
        };
        (
            status,
            axum::Json(serde_json::json!({ "error": code, "message": message })),
        )
            .into_response()
    }
}
