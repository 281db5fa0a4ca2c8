//! The queue resource: join, look up one's place, leave.
//!
//! A join answers with a ticket for the user's current entry (a new join
//! after leaving gets a new entry, so a new ticket); position and leave
//! accept a ticket only while its entry lasts (`401 ticket_ended` after).

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use cookie::{Cookie, SameSite};
use serde::Serialize;

use super::error::ApiError;
use super::extract::{Member, OptionalJson, Queue, TICKET_COOKIE, now_ms, ticket_ended};
use super::identity::Joiner;
use crate::app::AppState;
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
    joiner: Joiner,
    headers: HeaderMap,
    OptionalJson(_body): OptionalJson<JoinBody>,
) -> Result<Response, ApiError> {
    let user = joiner.user;
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
    let entry = outcome
        .snapshot
        .entry
        .ok_or_else(|| ApiError::Internal("the store answered a join without an entry".into()))?;
    let ttl_secs = state.config().ticket_ttl_secs;
    let ticket = state
        .signer()
        .sign(&queue, &user, entry, now_ms() + ttl_secs * 1000);
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
    let cookie = ticket_cookie(&queue, ticket, ttl_secs, secure_request(&headers));
    if let Ok(value) = HeaderValue::from_str(&cookie.to_string()) {
        response.headers_mut().insert("set-cookie", value);
    }
    // A visitor minted by this join keeps the id the place is held under.
    if let Some(value) = joiner
        .set_cookie
        .and_then(|c| HeaderValue::from_str(&c).ok())
    {
        response.headers_mut().append("set-cookie", value);
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
    member.check_entry(&snapshot)?;
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
    // Conditional on the ticket's entry, in one store step: an old ticket
    // can never remove a newer place.
    if !state
        .store()
        .leave(&member.queue, &member.user, member.entry)
        .await?
    {
        return Err(ticket_ended());
    }
    state.limits().note_left(&member.queue, &member.user);
    let mut expired = ticket_cookie(&member.queue, String::new(), 0, secure_request(&headers));
    expired.make_removal();
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Ok(value) = HeaderValue::from_str(&expired.to_string()) {
        response.headers_mut().insert("set-cookie", value);
    }
    Ok(response)
}

/// The ticket cookie, scoped to its queue so joining a second queue does
/// not overwrite the first, kept as long as the ticket is accepted.
fn ticket_cookie(
    queue: &QueueName,
    ticket: String,
    max_age_secs: u64,
    secure: bool,
) -> Cookie<'static> {
    Cookie::build((TICKET_COOKIE, ticket))
        .path(format!("/api/queues/{queue}"))
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(secure)
        .max_age(cookie::time::Duration::seconds(max_age_secs as i64))
        .build()
}

/// True when a TLS-terminating proxy says the client used HTTPS.
fn secure_request(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}
