//! Bearer-token authentication of the admin API and the token API.

use axum::http::HeaderMap;
use subtle::ConstantTimeEq;

use super::error::ApiError;

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
            "unauthorized",
            "a valid Authorization: Bearer token is required",
        ))
    }
}
