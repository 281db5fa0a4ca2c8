//! The service's one error shape, below both `http` and `gate`. Every
//! error is JSON `{"error": "<snake_case_code>", "message": "<human
//! text>"}`, built here and nowhere else: the endpoints, the order gate's
//! rejections (`GateError` converts, in `crate::http::gate`), the probes, the
//! page's fallback and the transport's own answers (`server_busy`) all
//! render through [`ApiError`]'s `IntoResponse`. 5xx bodies are opaque and
//! the cause is logged instead.
//!
//! The codes are the API contract: one [`ErrorCode`] enum, listed in the
//! OpenAPI document as the `error` field's values.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::store::StoreError;

/// Every error code the API answers: the contract integrators match on
/// (listed in the API document as the values of `ErrorBody.error`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// `address_connections_limited`
    AddressConnectionsLimited,
    /// `address_places_limited`
    AddressPlacesLimited,
    /// `address_rate_limited`
    AddressRateLimited,
    /// `challenge_expired`
    ChallengeExpired,
    /// `challenge_invalid`
    ChallengeInvalid,
    /// `challenge_replayed`
    ChallengeReplayed,
    /// `challenge_required`
    ChallengeRequired,
    /// `claim_not_held`
    ClaimNotHeld,
    /// `configured_queue`
    ConfiguredQueue,
    /// `cross_origin`
    CrossOrigin,
    /// `database_unavailable`
    DatabaseUnavailable,
    /// `duplicate_header`
    DuplicateHeader,
    /// `fairness_log_off`
    FairnessLogOff,
    /// `foreign_ticket`
    ForeignTicket,
    /// `identity_expired`
    IdentityExpired,
    /// `internal_error`
    InternalError,
    /// `invalid_audit_query`
    InvalidAuditQuery,
    /// `invalid_body`
    InvalidBody,
    /// `invalid_check_query`: the gateway check's query names a parameter twice or cannot be read
    InvalidCheckQuery,
    /// `invalid_identity`
    InvalidIdentity,
    /// `invalid_log_query`
    InvalidLogQuery,
    /// `invalid_opens_at`
    InvalidOpensAt,
    /// `invalid_path`: a path with two meanings (encoded separator, climbing above the root)
    InvalidPath,
    /// `invalid_product`
    InvalidProduct,
    /// `invalid_queue_name`
    InvalidQueueName,
    /// `invalid_return`
    InvalidReturn,
    /// `invalid_settings`
    InvalidSettings,
    /// `invalid_slowdown`
    InvalidSlowdown,
    /// `invalid_stock`
    InvalidStock,
    /// `invalid_ticket`
    InvalidTicket,
    /// `invalid_token`
    InvalidToken,
    /// `invalid_user_id`
    InvalidUserId,
    /// `lottery_drawn`
    LotteryDrawn,
    /// `method_not_allowed`
    MethodNotAllowed,
    /// `misdirected_request`
    MisdirectedRequest,
    /// `missing_identity`
    MissingIdentity,
    /// `missing_ticket`
    MissingTicket,
    /// `missing_token`
    MissingToken,
    /// `missing_user_id`
    MissingUserId,
    /// `no_lottery`
    NoLottery,
    /// `no_stock`
    NoStock,
    /// `not_admitted`
    NotAdmitted,
    /// `not_drawn`
    NotDrawn,
    /// `not_found`
    NotFound,
    /// `origin_timeout`: the protected site did not answer in time
    OriginTimeout,
    /// `origin_unreachable`: the protected site could not be reached or broke off
    OriginUnreachable,
    /// `orders_disabled`
    OrdersDisabled,
    /// `out_of_stock`
    OutOfStock,
    /// `pass_required`: the protected site needs a pass; wait in line for one
    PassRequired,
    /// `payload_too_large`
    PayloadTooLarge,
    /// `pre_queue_not_empty`
    PreQueueNotEmpty,
    /// `quantity_over_limit`
    QuantityOverLimit,
    /// `rate_limited`
    RateLimited,
    /// `request_timeout`
    RequestTimeout,
    /// `server_busy`
    ServerBusy,
    /// `store_unavailable`
    StoreUnavailable,
    /// `ticket_ended`
    TicketEnded,
    /// `ticket_expired`
    TicketExpired,
    /// `ticket_user_mismatch`
    TicketUserMismatch,
    /// `token_api_disabled`
    TokenApiDisabled,
    /// `token_in_use`
    TokenInUse,
    /// `unauthorized`
    Unauthorized,
    /// `unknown_order`
    UnknownOrder,
    /// `unknown_product`
    UnknownProduct,
    /// `unknown_queue`
    UnknownQueue,
    /// `unknown_session`
    UnknownSession,
    /// `visitor_rate_limited`
    VisitorRateLimited,
}

impl ErrorCode {
    /// Every code, in name order.
    pub const ALL: &[ErrorCode] = &[
        Self::AddressConnectionsLimited,
        Self::AddressPlacesLimited,
        Self::AddressRateLimited,
        Self::ChallengeExpired,
        Self::ChallengeInvalid,
        Self::ChallengeReplayed,
        Self::ChallengeRequired,
        Self::ClaimNotHeld,
        Self::ConfiguredQueue,
        Self::CrossOrigin,
        Self::DatabaseUnavailable,
        Self::DuplicateHeader,
        Self::FairnessLogOff,
        Self::ForeignTicket,
        Self::IdentityExpired,
        Self::InternalError,
        Self::InvalidAuditQuery,
        Self::InvalidBody,
        Self::InvalidCheckQuery,
        Self::InvalidIdentity,
        Self::InvalidLogQuery,
        Self::InvalidOpensAt,
        Self::InvalidPath,
        Self::InvalidProduct,
        Self::InvalidQueueName,
        Self::InvalidReturn,
        Self::InvalidSettings,
        Self::InvalidSlowdown,
        Self::InvalidStock,
        Self::InvalidTicket,
        Self::InvalidToken,
        Self::InvalidUserId,
        Self::LotteryDrawn,
        Self::MethodNotAllowed,
        Self::MisdirectedRequest,
        Self::MissingIdentity,
        Self::MissingTicket,
        Self::MissingToken,
        Self::MissingUserId,
        Self::NoLottery,
        Self::NoStock,
        Self::NotAdmitted,
        Self::NotDrawn,
        Self::NotFound,
        Self::OrdersDisabled,
        Self::OriginTimeout,
        Self::OriginUnreachable,
        Self::OutOfStock,
        Self::PassRequired,
        Self::PayloadTooLarge,
        Self::PreQueueNotEmpty,
        Self::QuantityOverLimit,
        Self::RateLimited,
        Self::RequestTimeout,
        Self::ServerBusy,
        Self::StoreUnavailable,
        Self::TicketEnded,
        Self::TicketExpired,
        Self::TicketUserMismatch,
        Self::TokenApiDisabled,
        Self::TokenInUse,
        Self::Unauthorized,
        Self::UnknownOrder,
        Self::UnknownProduct,
        Self::UnknownQueue,
        Self::UnknownSession,
        Self::VisitorRateLimited,
    ];

    /// The code as it is on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AddressConnectionsLimited => "address_connections_limited",
            Self::AddressPlacesLimited => "address_places_limited",
            Self::AddressRateLimited => "address_rate_limited",
            Self::ChallengeExpired => "challenge_expired",
            Self::ChallengeInvalid => "challenge_invalid",
            Self::ChallengeReplayed => "challenge_replayed",
            Self::ChallengeRequired => "challenge_required",
            Self::ClaimNotHeld => "claim_not_held",
            Self::ConfiguredQueue => "configured_queue",
            Self::CrossOrigin => "cross_origin",
            Self::DatabaseUnavailable => "database_unavailable",
            Self::DuplicateHeader => "duplicate_header",
            Self::FairnessLogOff => "fairness_log_off",
            Self::ForeignTicket => "foreign_ticket",
            Self::IdentityExpired => "identity_expired",
            Self::InternalError => "internal_error",
            Self::InvalidAuditQuery => "invalid_audit_query",
            Self::InvalidBody => "invalid_body",
            Self::InvalidCheckQuery => "invalid_check_query",
            Self::InvalidIdentity => "invalid_identity",
            Self::InvalidLogQuery => "invalid_log_query",
            Self::InvalidOpensAt => "invalid_opens_at",
            Self::InvalidPath => "invalid_path",
            Self::InvalidProduct => "invalid_product",
            Self::InvalidQueueName => "invalid_queue_name",
            Self::InvalidReturn => "invalid_return",
            Self::InvalidSettings => "invalid_settings",
            Self::InvalidSlowdown => "invalid_slowdown",
            Self::InvalidStock => "invalid_stock",
            Self::InvalidTicket => "invalid_ticket",
            Self::InvalidToken => "invalid_token",
            Self::InvalidUserId => "invalid_user_id",
            Self::LotteryDrawn => "lottery_drawn",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::MisdirectedRequest => "misdirected_request",
            Self::MissingIdentity => "missing_identity",
            Self::MissingTicket => "missing_ticket",
            Self::MissingToken => "missing_token",
            Self::MissingUserId => "missing_user_id",
            Self::NoLottery => "no_lottery",
            Self::NoStock => "no_stock",
            Self::NotAdmitted => "not_admitted",
            Self::NotDrawn => "not_drawn",
            Self::NotFound => "not_found",
            Self::OrdersDisabled => "orders_disabled",
            Self::OriginTimeout => "origin_timeout",
            Self::OriginUnreachable => "origin_unreachable",
            Self::PassRequired => "pass_required",
            Self::OutOfStock => "out_of_stock",
            Self::PayloadTooLarge => "payload_too_large",
            Self::PreQueueNotEmpty => "pre_queue_not_empty",
            Self::QuantityOverLimit => "quantity_over_limit",
            Self::RateLimited => "rate_limited",
            Self::RequestTimeout => "request_timeout",
            Self::ServerBusy => "server_busy",
            Self::StoreUnavailable => "store_unavailable",
            Self::TicketEnded => "ticket_ended",
            Self::TicketExpired => "ticket_expired",
            Self::TicketUserMismatch => "ticket_user_mismatch",
            Self::TokenApiDisabled => "token_api_disabled",
            Self::TokenInUse => "token_in_use",
            Self::Unauthorized => "unauthorized",
            Self::UnknownOrder => "unknown_order",
            Self::UnknownProduct => "unknown_product",
            Self::UnknownQueue => "unknown_queue",
            Self::UnknownSession => "unknown_session",
            Self::VisitorRateLimited => "visitor_rate_limited",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error answered to a client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// `400`: the request is malformed; nothing was changed.
    #[error("{message}")]
    BadRequest { code: ErrorCode, message: String },
    /// `401`: a missing, forged or foreign ticket or token.
    #[error("{message}")]
    Unauthorized { code: ErrorCode, message: String },
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
    NotFound { code: ErrorCode, message: String },
    /// `405`: the path exists but not with this method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// `408`: the request body did not arrive within the body timeout.
    #[error("request body timed out")]
    RequestTimeout,
    /// `409`: the request conflicts with the current state.
    #[error("{message}")]
    Conflict { code: ErrorCode, message: String },
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
        code: ErrorCode,
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
        code: ErrorCode,
        message: String,
        challenge_url: String,
    },
    /// `503 pass_required`: a protected site's path asked without a valid
    /// pass (JSON and XHR callers; browsers get the waiting page); retry
    /// after `retry_after_secs`, or open the waiting page.
    #[error("a pass is required")]
    PassRequired { retry_after_secs: u64 },
    /// `502 origin_unreachable`, `504 origin_timeout`: the protected site
    /// behind the built-in proxy failed.
    #[error("{message}")]
    Origin { timeout: bool, message: String },
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
    pub fn bad_request(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::BadRequest {
            code,
            message: message.into(),
        }
    }

    /// A `401` with `code` and `message`.
    pub fn unauthorized(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Unauthorized {
            code,
            message: message.into(),
        }
    }

    /// A `404` with `code` and `message`.
    pub fn not_found(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::NotFound {
            code,
            message: message.into(),
        }
    }

    /// A `409` with `code` and `message`.
    pub fn conflict(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Conflict {
            code,
            message: message.into(),
        }
    }

    fn parts(&self) -> (StatusCode, ErrorCode, String) {
        match self {
            Self::BadRequest { code, message } => (StatusCode::BAD_REQUEST, *code, message.clone()),
            Self::Unauthorized { code, message } => {
                (StatusCode::UNAUTHORIZED, *code, message.clone())
            }
            Self::CrossOrigin => (
                StatusCode::FORBIDDEN,
                ErrorCode::CrossOrigin,
                "requests from another origin may not act for the buyer".into(),
            ),
            Self::MisdirectedHost => (
                StatusCode::MISDIRECTED_REQUEST,
                ErrorCode::MisdirectedRequest,
                "this listener does not answer for this host name (see --admin-hosts)".into(),
            ),
            Self::NotFound { code, message } => (StatusCode::NOT_FOUND, *code, message.clone()),
            Self::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                ErrorCode::MethodNotAllowed,
                "this path does not take this method".into(),
            ),
            Self::RequestTimeout => (
                StatusCode::REQUEST_TIMEOUT,
                ErrorCode::RequestTimeout,
                "the request body did not arrive in time".into(),
            ),
            Self::Conflict { code, message } => (StatusCode::CONFLICT, *code, message.clone()),
            Self::PayloadTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::PayloadTooLarge,
                "the request body is too large".into(),
            ),
            Self::TooManyRequests { message, .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::RateLimited,
                message.clone(),
            ),
            Self::ClientLimited { code, message, .. } => {
                (StatusCode::TOO_MANY_REQUESTS, *code, message.clone())
            }
            Self::ChallengeRequired { .. } => (
                StatusCode::PRECONDITION_REQUIRED,
                ErrorCode::ChallengeRequired,
                "this join needs a solved challenge: get one at challengeUrl, \
                 solve it and send the solution as X-Altcha"
                    .into(),
            ),
            Self::ChallengeRefused { code, message, .. } => {
                (StatusCode::FORBIDDEN, *code, message.clone())
            }
            Self::PassRequired { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::PassRequired,
                "this site admits visitors from its waiting room; wait in line for a pass".into(),
            ),
            Self::Origin {
                timeout: true,
                message,
            } => (
                StatusCode::GATEWAY_TIMEOUT,
                ErrorCode::OriginTimeout,
                message.clone(),
            ),
            Self::Origin {
                timeout: false,
                message,
            } => (
                StatusCode::BAD_GATEWAY,
                ErrorCode::OriginUnreachable,
                message.clone(),
            ),
            Self::ServerBusy => (
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::ServerBusy,
                "too many connections; please retry".into(),
            ),
            Self::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::StoreUnavailable,
                "the waiting room is briefly unavailable; please retry".into(),
            ),
            Self::DatabaseUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::DatabaseUnavailable,
                "the order service is briefly unavailable; please retry".into(),
            ),
            Self::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::InternalError,
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
    pub error: ErrorCode,
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
            metrics::counter!("waitroom_http_errors_total", "error" => code.as_str()).increment(1);
        }
        let retry_after = match &self {
            Self::Unavailable(_) | Self::DatabaseUnavailable(_) => Some(2),
            Self::ServerBusy => Some(1),
            Self::PassRequired { retry_after_secs } => Some(*retry_after_secs),
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
            error: code,
            message,
            challenge_url,
        };
        let mut response = (status, Json(body)).into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from(secs));
        }
        if matches!(self, Self::PayloadTooLarge) {
            // The body was refused unread, so the connection closes after
            // this answer: saying so keeps a client from pooling it and
            // sending its next request on a closing socket.
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each code is on the wire as `as_str` says, snake_case.
    #[test]
    fn codes_serialize_as_their_names() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_value(code).unwrap();
            assert_eq!(json, code.as_str());
            assert!(
                code.as_str()
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_')
            );
        }
    }
}
