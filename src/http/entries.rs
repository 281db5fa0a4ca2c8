//! The queue resource: join, look up one's place, leave.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use cookie::{Cookie, SameSite};
use serde::Serialize;

use super::error::ApiError;
use super::extract::{Member, OptionalJson, Queue, TICKET_COOKIE, User};
use crate::AppState;
use crate::queue::{EntryToken, QueueName, QueueStatus};

/// `/api/queues/{queue}/entries`, `/entries/me` and `/position`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/queues/{queue}/entries", post(enter))
        .route("/api/queues/{queue}/entries/me", delete(leave))
        .route("/api/queues/{queue}/position", get(position))
}

/// The answer to a join: the status plus the ticket.
#[derive(Serialize)]
struct Entered {
    #[serde(flatten)]
    status: QueueStatus,
    ticket: String,
}

/// Optional join metadata; none is defined yet, but a body, if sent, must
/// be a JSON object so garbage is refused rather than ignored.
type JoinBody = serde_json::Map<String, serde_json::Value>;

async fn enter(
    State(state): State<AppState>,
    Queue(queue): Queue,
    User(user): User,
    headers: HeaderMap,
    OptionalJson(_body): OptionalJson<JoinBody>,
) -> Result<Response, ApiError> {
    // The per-buyer budget (limit.rs): refused before the store when over,
    // counted after it when this was a repeat join past the grace window.
    state.limits().before_join(&queue, &user)?;
    let outcome = state
        .store()
        .enter(&queue, &user, state.policy(), &EntryToken::generate())
        .await?;
    metrics::counter!("waitroom_enters_total", "queue" => queue.to_string(), "new" => outcome.created.to_string()).increment(1);
    state.limits().after_join(
        &queue,
        &user,
        outcome.created,
        outcome.snapshot.entered_at_ms,
    )?;
    let ticket = state.signer().sign(&queue, &user);
    let body = Entered {
        status: QueueStatus::new(&outcome.snapshot, state.admission_rate(&queue)),
        ticket: ticket.clone(),
    };
    let code = if outcome.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut response = (code, Json(body)).into_response();
    let cookie = ticket_cookie(&queue, ticket, secure_request(&headers));
    if let Ok(value) = HeaderValue::from_str(&cookie.to_string()) {
        response.headers_mut().insert("set-cookie", value);
    }
    Ok(response)
}

async fn position(
    State(state): State<AppState>,
    member: Member,
) -> Result<Json<QueueStatus>, ApiError> {
    state.limits().check(&member.queue, &member.user)?;
    let snapshot = state
        .store()
        .status(&member.queue, &member.user, true)
        .await?;
    Ok(Json(QueueStatus::new(
        &snapshot,
        state.admission_rate(&member.queue),
    )))
}

async fn leave(
    State(state): State<AppState>,
    member: Member,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    state.store().leave(&member.queue, &member.user).await?;
    state.limits().note_left(&member.queue, &member.user);
    let mut expired = ticket_cookie(&member.queue, String::new(), secure_request(&headers));
    expired.make_removal();
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Ok(value) = HeaderValue::from_str(&expired.to_string()) {
        response.headers_mut().insert("set-cookie", value);
    }
    Ok(response)
}

/// The ticket cookie, scoped to its queue so joining a second queue does
/// not overwrite the first.
fn ticket_cookie(queue: &QueueName, ticket: String, secure: bool) -> Cookie<'static> {
    Cookie::build((TICKET_COOKIE, ticket))
        .path(format!("/api/queues/{queue}"))
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(secure)
        .max_age(cookie::time::Duration::days(1))
        .build()
}

/// True when a TLS-terminating proxy says the client used HTTPS.
fn secure_request(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}
