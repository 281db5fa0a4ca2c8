//! The event stream: `GET /api/queues/{queue}/events`, one Server-Sent
//! Events stream per buyer showing their place live, then their token.
//!
//! On connect the current state goes out at once (a reconnect heals
//! anything missed, whatever `Last-Event-ID` says), then every change the
//! hub pushes. Over the per-instance cap the stream is shed with a `200`,
//! a long `retry:` and an immediate close, because a non-200 answer would
//! stop a browser's EventSource for good.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::stream::{self, Stream, StreamExt};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use super::extract::Member;
use crate::AppState;
use crate::push::{Subscription, Update, View, view_of};

/// `/api/queues/{queue}/events`.
pub fn router() -> Router<AppState> {
    Router::new().route("/api/queues/{queue}/events", get(events))
}

async fn events(State(state): State<AppState>, member: Member) -> Result<Response, ApiError> {
    if state.hub().open_streams() >= state.max_streams() {
        metrics::counter!("waitroom_streams_shed_total").increment(1);
        return Ok(with_stream_headers(shed().into_response()));
    }
    let before = state.hub().events_seen(&member.queue);
    let snapshot = state
        .store()
        .status(&member.queue, &member.user, true)
        .await?;
    let rate = state.admission_rate(&member.queue);
    let Some(view) = view_of(&snapshot, rate) else {
        // Neither waiting nor holding a token: 204 tells EventSource to
        // stop reconnecting.
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let sub = state
        .hub()
        .register(&state, &member.queue, &member.user, &snapshot, view, before);
    let retry = Duration::from_millis(rand::random_range(2_000..5_000));
    let drain = Duration::from_secs(state.config().drain_secs);
    let body = updates(sub, retry, state.shutdown().clone(), drain);
    let sse = Sse::new(body)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(state.config().keep_alive_secs)));
    Ok(with_stream_headers(sse.into_response()))
}

fn with_stream_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// A `200` that asks the browser to come back in 20–40 s and closes.
fn shed() -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let retry = Duration::from_millis(rand::random_range(20_000..40_000));
    let event = Event::default()
        .retry(retry)
        .comment("over capacity, retry later");
    Sse::new(stream::iter([Ok(event)]))
}

/// The SSE frame for one update.
fn frame(update: &Update) -> Event {
    let (name, data) = match &update.view {
        View::Waiting { rank, total, eta } => (
            "waiting",
            json!({ "rank": rank, "position": rank + 1, "totalWaiting": total, "estimatedWaitSeconds": eta }),
        ),
        View::Ready {
            token,
            expires_at,
            admitted_at,
        } => {
            let left = expires_at.saturating_duration_since(Instant::now());
            (
                "ready",
                json!({ "entryToken": token, "expiresInSeconds": left.as_millis().div_ceil(1000) as u64, "admittedAt": admitted_at }),
            )
        }
        View::Gone(reason) => ("gone", json!({ "reason": reason.as_str() })),
    };
    Event::default()
        .event(name)
        .id(update.id.to_string())
        .data(data.to_string())
}

struct Pump {
    sub: Subscription,
    first: Option<Event>,
    last_sent: Option<View>,
    shutdown: CancellationToken,
    drain: Duration,
    finished: bool,
}

/// The stream's frames: the current state (with `retry:`), then each new
/// state, until `gone`, the client leaves, or shutdown (after a random
/// share of the drain window, so clients do not reconnect all at once).
fn updates(
    sub: Subscription,
    retry: Duration,
    shutdown: CancellationToken,
    drain: Duration,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let current = sub.updates.borrow().clone();
    let first = frame(&current).retry(retry);
    let pump = Pump {
        finished: matches!(current.view, View::Gone(_)),
        last_sent: Some(current.view),
        sub,
        first: Some(first),
        shutdown,
        drain,
    };
    stream::unfold(pump, |mut p| async move {
        if let Some(first) = p.first.take() {
            return Some((Ok(first), p));
        }
        if p.finished {
            return None;
        }
        loop {
            tokio::select! {
                _ = p.shutdown.cancelled() => {
                    let share = rand::random_range(0.0..1.0);
                    tokio::time::sleep(p.drain.mul_f64(share)).await;
                    return None;
                }
                changed = p.sub.updates.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                    let update = p.sub.updates.borrow_and_update().clone();
                    if p.last_sent.as_ref() == Some(&update.view) {
                        continue;
                    }
                    p.finished = matches!(update.view, View::Gone(_));
                    let event = frame(&update);
                    p.last_sent = Some(update.view);
                    return Some((Ok(event), p));
                }
            }
        }
    })
    .boxed()
}
