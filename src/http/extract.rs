//! Request extractors shared by the resources: the queue named in the path,
//! the buyer's `X-User-Id`, the queue ticket, and a small JSON body.
//!
//! Each turns bad input into an [`ApiError`] before any handler runs, so
//! handlers only ever see valid values.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::AppState;
use crate::queue::{QueueName, TicketError, UserId};

/// The name of the ticket cookie.
pub const TICKET_COOKIE: &str = "waitroom_ticket";

/// A configured queue named by the `{queue}` path segment (`404` otherwise).
pub struct Queue(pub QueueName);

impl FromRequestParts<AppState> for Queue {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| unknown_queue())?;
        let name = QueueName::parse(&raw).map_err(|_| unknown_queue())?;
        if !state.has_queue(&name) {
            return Err(unknown_queue());
        }
        Ok(Queue(name))
    }
}

fn unknown_queue() -> ApiError {
    ApiError::not_found("unknown_queue", "no such queue")
}

/// Reads an optional `X-User-Id`, refusing a malformed one.
pub fn optional_user(headers: &HeaderMap) -> Result<Option<UserId>, ApiError> {
    let Some(raw) = headers.get("x-user-id") else {
        return Ok(None);
    };
    let text = raw
        .to_str()
        .map_err(|_| ApiError::bad_request("invalid_user_id", "X-User-Id must be ASCII"))?;
    UserId::parse(text)
        .map(Some)
        .map_err(|e| ApiError::bad_request("invalid_user_id", e.0))
}

/// The buyer named by a required `X-User-Id` header (`400` if missing or malformed).
pub struct User(pub UserId);

impl<S: Send + Sync> FromRequestParts<S> for User {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        optional_user(&parts.headers)?.map(User).ok_or_else(|| {
            ApiError::bad_request("missing_user_id", "the X-User-Id header is required")
        })
    }
}

/// The raw ticket of a request: `X-Queue-Ticket`, then `?ticket=`, then the
/// cookie. Never logged.
pub fn raw_ticket(parts: &Parts) -> Option<String> {
    if let Some(v) = parts
        .headers
        .get("x-queue-ticket")
        .and_then(|v| v.to_str().ok())
    {
        return Some(v.trim().to_owned());
    }
    if let Some(query) = parts.uri.query()
        && let Some((_, v)) = form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "ticket")
    {
        return Some(v.into_owned());
    }
    for header in parts.headers.get_all("cookie") {
        let Ok(text) = header.to_str() else { continue };
        for cookie in cookie::Cookie::split_parse(text).flatten() {
            if cookie.name() == TICKET_COOKIE {
                return Some(cookie.value().to_owned());
            }
        }
    }
    None
}

/// A queue member authenticated by their ticket: the queue in the path, the
/// user the ticket was issued to. A forged or foreign ticket, or an
/// `X-User-Id` other than the ticket's user, is `401`.
pub struct Member {
    pub queue: QueueName,
    pub user: UserId,
}

impl FromRequestParts<AppState> for Member {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Queue(queue) = Queue::from_request_parts(parts, state).await?;
        let raw = raw_ticket(parts).ok_or_else(|| {
            ApiError::unauthorized(
                "missing_ticket",
                "send the queue ticket (cookie, X-Queue-Ticket or ?ticket=)",
            )
        })?;
        let ticket = state.signer().verify(&raw, &queue).map_err(|e| match e {
            TicketError::Invalid => ApiError::unauthorized("invalid_ticket", e.to_string()),
            TicketError::ForeignQueue => ApiError::unauthorized("foreign_ticket", e.to_string()),
        })?;
        if let Some(claimed) = optional_user(&parts.headers)?
            && claimed != ticket.user
        {
            return Err(ApiError::unauthorized(
                "ticket_user_mismatch",
                "the queue ticket was issued to another user",
            ));
        }
        Ok(Member {
            queue,
            user: ticket.user,
        })
    }
}

/// An optional small JSON body: empty, or JSON that parses as `T`
/// (`400` for garbage, `413` past 16 KiB).
pub struct OptionalJson<T>(pub Option<T>);

const BODY_LIMIT: usize = 16 * 1024;

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = read_limited(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(None));
        }
        serde_json::from_slice(&bytes)
            .map(|v| OptionalJson(Some(v)))
            .map_err(|e| {
                ApiError::bad_request(
                    "invalid_body",
                    format!("the body is not valid JSON for this endpoint: {e}"),
                )
            })
    }
}

/// A required small JSON body (`400` for missing or garbage, `413` past 16 KiB).
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = read_limited(req, state).await?;
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| {
            ApiError::bad_request(
                "invalid_body",
                format!("the body is not valid JSON for this endpoint: {e}"),
            )
        })
    }
}

async fn read_limited<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    let req = req.map(|body| axum::body::Body::new(http_body_util::Limited::new(body, BODY_LIMIT)));
    Bytes::from_request(req, state).await.map_err(|e| {
        if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge
        } else {
            ApiError::bad_request("invalid_body", "the body could not be read")
        }
    })
}
