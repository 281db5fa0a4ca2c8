//! Refuses requests that repeat an identity header.
//!
//! `X-User-Id`, `X-Entry-Token` and `X-Queue-Ticket` say who a request is
//! for. Sent twice, one reader may take the first value and another the
//! last, and behind a gateway that appends its `X-User-Id` instead of
//! replacing the client's, the first one is the client's own: a buyer
//! could act as someone else. So a repeat is `400 duplicate_header` before
//! any handler or extractor runs.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::error::ErrorCode;

/// The headers that must appear at most once: (lower-case name, as shown).
const IDENTITY_HEADERS: [(&str, &str); 3] = [
    ("x-user-id", "X-User-Id"),
    ("x-entry-token", "X-Entry-Token"),
    ("x-queue-ticket", "X-Queue-Ticket"),
];

/// The first identity header that `names` (one per header line, any case)
/// carries more than once, as it is usually written.
pub fn repeated_identity_header<'a>(
    names: impl IntoIterator<Item = &'a str>,
) -> Option<&'static str> {
    let mut seen = [false; IDENTITY_HEADERS.len()];
    for name in names {
        if let Some(i) = IDENTITY_HEADERS
            .iter()
            .position(|(lower, _)| name.eq_ignore_ascii_case(lower))
        {
            if seen[i] {
                return Some(IDENTITY_HEADERS[i].1);
            }
            seen[i] = true;
        }
    }
    None
}

/// Middleware: `400 duplicate_header` for a repeated identity header.
pub async fn refuse_repeated_identity(request: Request, next: Next) -> Response {
    match repeated_identity(&request) {
        Some(refused) => refused,
        None => next.run(request).await,
    }
}

/// The `400 duplicate_header` answer to `request`, when it repeats an
/// identity header.
pub fn repeated_identity(request: &Request) -> Option<Response> {
    let names = request.headers().iter().map(|(name, _)| name.as_str());
    let name = repeated_identity_header(names)?;
    Some(
        ApiError::bad_request(
            ErrorCode::DuplicateHeader,
            format!("the {name} header must be sent at most once"),
        )
        .into_response(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_repeat_in_any_case_and_nothing_else() {
        assert_eq!(
            repeated_identity_header(["x-user-id", "host", "X-User-Id"]),
            Some("X-User-Id")
        );
        assert_eq!(
            repeated_identity_header(["X-Queue-Ticket", "x-queue-ticket"]),
            Some("X-Queue-Ticket")
        );
        assert_eq!(
            repeated_identity_header(["x-entry-token", "x-entry-token"]),
            Some("X-Entry-Token")
        );
        assert_eq!(
            repeated_identity_header([
                "x-user-id",
                "x-entry-token",
                "x-queue-ticket",
                "cookie",
                "cookie"
            ]),
            None
        );
    }
}
