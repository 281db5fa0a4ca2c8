//! The HTTP API's one error type. Every error is JSON
//! `{"error": "<snake_case_code>", "message": "<human text>"}`, built here
//! and nowhere else: the endpoints, the order gate's rejections
//! (`GateError` converts, in `crate::gate`), the probes, the page's fallback and the
//! transport's own answers (`server_busy`) all render through
//! [`ApiError`]'s `IntoResponse`. 5xx bodies are opaque and the cause is
//! logged instead.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::store::StoreError;

/// An error answered to a client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// `400`: the request is malformed; nothing was changed.
    #[error("{message}")]
    BadRequest { code: &'static str, message: String },
    /// `401`: a missing, forged or foreign ticket or token.
    #[error("{message}")]
    Unauthorized { code: &'static str, message: String },
    /// `403 cross_origin`: a browser request from another origin (a page on
    /// another site, or a sibling origin of the same site) to an endpoint
    /// that acts on the buyer's cookies; nothing was changed.
    #[error("cross-origin request refused")]
    CrossOrigin,
    /// `421 misdirected_request`: the operator listener does not answer for
    /// the request's `Host` (a DNS-rebinding page names its own).
    #[error("misdirected request")]
    MisdirectedHost,
    /// `404`: no such queue, product or order.
    #[error("{message}")]
    NotFound { code: &'static str, message: String },
    /// `405`: the path exists but not with this method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// `408`: the request body did not arrive within the body timeout.
    #[error("request body timed out")]
    RequestTimeout,
    /// `409`: the request conflicts with the current state.
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// `413`: the body is larger than this endpoint takes.
    #[error("request body too large")]
    PayloadTooLarge,
    /// `429`: too many requests; try again after `retry_after_secs`.
    #[error("{message}")]
    TooManyRequests {
        message: String,
        retry_after_secs: u64,
    },
    /// `429`: a per-client-address limit (`address_rate_limited`,
    /// `address_places_limited`, `visitor_rate_limited`); try again after
    /// `retry_after_secs`.
    #[error("{message}")]
    ClientLimited {
        code: &'static str,
        message: String,
        retry_after_secs: u64,
    },
    /// `428`: this join needs a solved challenge (`challenge_required`);
    /// the answer's `challengeUrl` says where to get one.
    #[error("this join needs a solved challenge")]
    ChallengeRequired { challenge_url: String },
    /// `403`: the challenge solution sent does not open the door:
    /// `challenge_invalid`, `challenge_expired` or `challenge_replayed`;
    /// a new one is at `challengeUrl`.
    #[error("{message}")]
    ChallengeRefused {
        code: &'static str,
        message: String,
        challenge_url: String,
    },
    /// `503`: this instance holds as many connections as it may; retry
    /// (the load balancer can pick another instance).
    #[error("server busy")]
    ServerBusy,
    /// `503`: the store is unreachable; the request was refused (fail-closed).
    #[error("store unavailable")]
    Unavailable(#[from] StoreError),
    /// `503 database_unavailable`: the demo order service's database failed
    /// or cannot be reached; nothing was sold or changed (fail-closed).
    #[error("order database unavailable: {0}")]
    DatabaseUnavailable(String),
    /// `500`: a bug or an unexpected failure; logged, never detailed.
    #[error("internal error: {0}")]
    Internal(String),
}

#[cfg(feature = "demo-orders")]
impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        Self::DatabaseUnavailable(e.to_string())
    }
}

impl ApiError {
    /// A `400` with `code` and `message`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::BadRequest {
            code,
            message: message.into(),
        }
    }

    /// A `401` with `code` and `message`.
    pub fn unauthorized(code: &'static str, message: impl Into<String>) -> Self {
        Self::Unauthorized {
            code,
            message: message.into(),
        }
    }

    /// A `404` with `code` and `message`.
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::NotFound {
            code,
            message: message.into(),
        }
    }

    /// A `409` with `code` and `message`.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::Conflict {
            code,
            message: message.into(),
        }
    }

    fn parts(&self) -> (StatusCode, &'static str, String) {
        match self {
            Self::BadRequest { code, message } => (StatusCode::BAD_REQUEST, code, message.clone()),
            Self::Unauthorized { code, message } => {
                (StatusCode::UNAUTHORIZED, code, message.clone())
            }
            Self::CrossOrigin => (
                StatusCode::FORBIDDEN,
                "cross_origin",
                "requests from another origin may not act for the buyer".into(),
            ),
            Self::MisdirectedHost => (
                StatusCode::MISDIRECTED_REQUEST,
                "misdirected_request",
                "this listener does not answer for this host name (see --admin-hosts)".into(),
            ),
            Self::NotFound { code, message } => (StatusCode::NOT_FOUND, code, message.clone()),
            Self::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this path does not take this method".into(),
            ),
            Self::RequestTimeout => (
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "the request body did not arrive in time".into(),
            ),
            Self::Conflict { code, message } => (StatusCode::CONFLICT, code, message.clone()),
            Self::PayloadTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the request body is too large".into(),
            ),
            Self::TooManyRequests { message, .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                message.clone(),
            ),
            Self::ClientLimited { code, message, .. } => {
                (StatusCode::TOO_MANY_REQUESTS, code, message.clone())
            }
            Self::ChallengeRequired { .. } => (
                StatusCode::PRECONDITION_REQUIRED,
                "challenge_required",
                "this join needs a solved challenge: get one at challengeUrl, \
                 solve it and send the solution as X-Altcha"
                    .into(),
            ),
            Self::ChallengeRefused { code, message, .. } => {
                (StatusCode::FORBIDDEN, code, message.clone())
            }
            Self::ServerBusy => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_busy",
                "too many connections; please retry".into(),
            ),
            Self::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "the waiting room is briefly unavailable; please retry".into(),
            ),
            Self::DatabaseUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "database_unavailable",
                "the order service is briefly unavailable; please retry".into(),
            ),
            Self::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                "something went wrong on our side".into(),
            ),
        }
    }
}

/// The body of every error answer (also the schema the API document
/// gives for every error).
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// A stable `snake_case` code, e.g. `ticket_ended`.
    #[schema(pattern = "^[a-z_]+$")]
    pub error: String,
    /// A human-readable explanation; not meant to be parsed.
    pub message: String,
    /// Only on `challenge_*` errors: where to get a (new) join challenge.
    #[serde(
        rename = "challengeUrl",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub challenge_url: Option<String>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            Self::Unavailable(e) => tracing::warn!(error = %e, "store unavailable"),
            Self::DatabaseUnavailable(e) => {
                tracing::warn!(error = %e, "order database unavailable")
            }
            Self::Internal(e) => tracing::error!(error = %e, "internal error"),
            _ => {}
        }
        let (status, code, message) = self.parts();
        if status.is_server_error() {
            metrics::counter!("waitroom_http_errors_total", "error" => code).increment(1);
        }
        let retry_after = match &self {
            Self::Unavailable(_) | Self::DatabaseUnavailable(_) => Some(2),
            Self::ServerBusy => Some(1),
            Self::TooManyRequests {
                retry_after_secs, ..
            }
            | Self::ClientLimited {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            _ => None,
        };
        let challenge_url = match &self {
            Self::ChallengeRequired { challenge_url }
            | Self::ChallengeRefused { challenge_url, .. } => Some(challenge_url.clone()),
            _ => None,
        };
        let body = ErrorBody {
            error: code.to_owned(),
            message,
            challenge_url,
        };
        let mut response = (status, Json(body)).into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::GateError;

    /// Every gate rejection renders with the status and code the gate
    /// documents for integrators.
    #[tokio::test]
    async fn gate_errors_keep_their_status_and_code() {
        for e in [
            GateError::MissingUser,
            GateError::MissingToken,
            GateError::InvalidToken,
            GateError::DuplicateHeader("X-User-Id"),
            GateError::BodyTooLarge,
            GateError::BodyTimeout,
            GateError::BodyUnreadable,
            GateError::InUse,
            GateError::Store(StoreError::Unavailable("down".into())),
        ] {
            let (status, code) = e.status_and_code();
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
