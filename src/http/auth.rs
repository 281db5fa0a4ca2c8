//! Bearer-token authentication of the admin API and the token API.
//!
//! Two scopes, two tokens: the admin token (`--admin-token`, or made up
//! and printed at start) opens the admin API only; the service token
//! (`--service-token`, the same on every instance) opens the token API
//! only. An order service holding its token cannot pause queues or
//! reprice products, and an admin token made up per instance can never be
//! what an order service was given.
//!
//! [`AdminAuth`] and [`ServiceAuth`] are extractors each handler of those
//! APIs takes as its first argument: axum runs extractors in order, so the
//! bearer is checked before the path or the body is looked at, and an
//! unauthenticated caller learns nothing (`401`, never a `404` for an
//! unknown queue or a `400` for a bad body).
//!
//! Extractors only run once routing found a handler, so [`require_scope`]
//! checks the same bearers in front of the operator listener's router:
//! a path under `/api/admin/` or `/api/tokens/` that no handler owns, or a
//! method a path does not take, is `401` without the scope's token, and
//! only `404` or `405` with it. Otherwise the answers would map out which
//! operator paths exist to anyone who can reach the port.

use axum::extract::{FromRequestParts, Request, State};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::AppState;
use crate::error::ApiError;
use crate::error::ErrorCode;

/// Checks `Authorization: Bearer <expected>` in constant time.
pub fn require_bearer(headers: &HeaderMap, expected: &str) -> Result<(), ApiError> {
    let presented = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if bool::from(presented.as_bytes().ct_eq(expected.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::unauthorized(
            ErrorCode::Unauthorized,
            "a valid Authorization: Bearer token is required",
        ))
    }
}

/// The caller presented the admin token (`401` otherwise). First argument
/// of every admin handler.
pub struct AdminAuth;

impl FromRequestParts<AppState> for AdminAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        require_bearer(&parts.headers, state.admin_token()).map(|()| AdminAuth)
    }
}

/// The service token's check: `404 token_api_disabled` without
/// `--service-token`, whatever is presented; else the bearer.
fn require_service(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let expected = state.service_token().ok_or_else(|| {
        ApiError::not_found(
            ErrorCode::TokenApiDisabled,
            "the token API is off: start every instance with the same --service-token",
        )
    })?;
    require_bearer(headers, expected)
}

/// The caller presented the service token (`401` otherwise; the admin
/// token is refused like any other). First argument of every token API
/// handler. Without `--service-token` the token API is off: `404
/// token_api_disabled`, whatever is presented.
pub struct ServiceAuth;

impl FromRequestParts<AppState> for ServiceAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        require_service(state, &parts.headers).map(|()| ServiceAuth)
    }
}

/// Whether `path` is `prefix` or below it (whole segments only:
/// `/api/adminx` is not under `/api/admin`).
fn under(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Middleware of the operator listener: the admin token for every path
/// under `/api/admin`, the service token for every path under
/// `/api/tokens`, checked before routing answers anything.
pub async fn require_scope(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let checked = if under(path, "/api/admin") {
        require_bearer(request.headers(), state.admin_token())
    } else if under(path, "/api/tokens") {
        require_service(&state, request.headers())
    } else {
        Ok(())
    };
    match checked {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::under;

    #[test]
    fn scopes_go_by_whole_segments() {
        for path in ["/api/admin", "/api/admin/", "/api/admin/queues/x"] {
            assert!(under(path, "/api/admin"), "{path}");
        }
        for path in ["/api/adminx", "/api", "/api/tokens/claim", "/admin"] {
            assert!(!under(path, "/api/admin"), "{path}");
        }
    }
}
