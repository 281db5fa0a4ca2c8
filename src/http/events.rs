//! The event stream: `GET /api/queues/{queue}/events`, one Server-Sent
//! Events stream per buyer showing their place live, then their token.
//!
//! On connect the current state goes out at once (a reconnect heals
//! anything missed, whatever `Last-Event-ID` says), then every change the
//! hub pushes. Over the per-instance cap the stream is shed with a `200`,
//! a long `retry:` and an immediate close, because a non-200 answer would
//! stop a browser's EventSource for good.
//!
//! A stream that is the first request of its connection is served by the
//! lean writer in `lean.rs`; this handler serves the rest through hyper.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use futures::stream;

use super::error::ApiError;
use super::extract::Member;
use crate::AppState;
use crate::push::{StreamSession, shed_frame, view_of};

/// `/api/queues/{queue}/events`.
pub fn router() -> Router<AppState> {
    Router::new().route("/api/queues/{queue}/events", get(events))
}

/// What opening a stream came to.
pub enum Opening {
    /// Over the instance's cap: send this frame and close.
    Shed(Bytes),
    /// Neither waiting nor holding a token: `204`, so EventSource stops.
    NotEntered,
    /// A live stream.
    Stream(StreamSession),
}

/// Opens `member`'s stream: reads their standing (which also marks them as
/// seen) and registers the stream with the hub.
pub async fn open_stream(state: &AppState, member: &Member) -> Result<Opening, ApiError> {
    if state.hub().open_streams() >= state.max_streams() {
        metrics::counter!("waitroom_streams_shed_total").increment(1);
        let retry = Duration::from_millis(rand::random_range(20_000..40_000));
        return Ok(Opening::Shed(shed_frame(retry)));
    }
    let before = state.hub().events_seen(&member.queue);
    let snapshot = state
        .store()
        .status(&member.queue, &member.user, true)
        .await?;
    member.check_entry(&snapshot)?;
    let rate = state.admission_rate(&member.queue);
    let Some(view) = view_of(&snapshot, rate) else {
        return Ok(Opening::NotEntered);
    };
    let sub = state
        .hub()
        .register(state, &member.queue, &member.user, &snapshot, view, before);
    let retry = Duration::from_millis(rand::random_range(2_000..5_000));
    Ok(Opening::Stream(StreamSession::new(
        sub,
        retry,
        Duration::from_secs(state.config().keep_alive_secs),
        state.shutdown().clone(),
        Duration::from_secs(state.config().drain_secs),
    )))
}

/// The headers of every stream answer.
pub const STREAM_HEADERS: [(&str, &str); 3] = [
    ("content-type", "text/event-stream"),
    ("cache-control", "no-cache"),
    ("x-accel-buffering", "no"),
];

async fn events(State(state): State<AppState>, member: Member) -> Result<Response, ApiError> {
    let body = match open_stream(&state, &member).await? {
        Opening::NotEntered => return Ok(StatusCode::NO_CONTENT.into_response()),
        Opening::Shed(frame) => Body::from(frame),
        Opening::Stream(session) => {
            Body::from_stream(stream::unfold(session, |mut s| async move {
                s.next_frame()
                    .await
                    .map(|frame| (Ok::<_, Infallible>(frame), s))
            }))
        }
    };
    let mut response = Response::new(body);
    for (name, value) in STREAM_HEADERS {
        response
            .headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    Ok(response)
}
