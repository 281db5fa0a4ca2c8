//! The event stream: `GET /api/queues/{queue}/events`, one Server-Sent
//! Events stream per buyer showing their place live, then their token.
//!
//! On connect the current state goes out at once (a reconnect heals
//! anything missed, whatever `Last-Event-ID` says), then every change the
//! hub pushes. `Last-Event-ID` is used only as a floor: the new stream's
//! ids start after it, so ids only grow for a buyer across reconnects,
//! restarts and instances (`EventId::first` says which ids are ignored).
//! Each open counts against the buyer's request budget (`limit.rs`). Over
//! the per-instance cap or the per-address cap the stream is shed with a
//! `200`, a long `retry:` and an immediate close, because a non-200 answer
//! would stop a browser's EventSource for good; at the instance's cap the
//! heaviest address gives up a stream first (`crate::push::Sources`).
//!
//! Whichever transport carries the request (see `crate::server`), it runs
//! through this handler: on the lean path the request carries a
//! [`LeanStream`] and the session is left there for the lean writer instead
//! of becoming a hyper body.

use std::convert::Infallible;
use std::time::Duration;

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::client::{Client, ClientInfo};
use super::extract::Member;
use super::handoff::LeanStream;
use super::lottery::PreTicket;
use super::openapi::{StreamEvent, TicketParams};
use super::wire;
use crate::error::{ApiError, ErrorBody};
use crate::push::{EventId, StreamSession, View, shed_frame, view_of};

/// The route of the event stream (the lean writer matches it too; the
/// handler's annotation names the same path, checked by a test).
pub const PATH: &str = "/api/queues/{queue}/events";

/// `/api/queues/{queue}/events`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(events))
}

/// What opening a stream came to.
pub enum Opening {
    /// Over the instance's cap: send this frame and close.
    Shed(Bytes),
    /// Neither waiting nor holding a token: `204`, so EventSource stops.
    NotEntered,
    /// A live stream (boxed: a session is far larger than a shed frame).
    Stream(Box<StreamSession>),
}

/// Opens `member`'s stream from `client`: takes a stream slot for the
/// client's address (shed over `--streams-per-address`, or at
/// `--max-streams` unless a heavier address gives one up), reads their
/// standing (spending from the buyer's budget and marking them seen) and
/// registers the stream with the hub. `last_event_id` is the raw
/// `Last-Event-ID` header, if any; a malformed one is ignored.
pub async fn open_stream(
    state: &AppState,
    member: &Member,
    client: &ClientInfo,
    last_event_id: Option<&[u8]>,
) -> Result<Opening, ApiError> {
    let per_address = state.settings().streams_per_address;
    let Some(slot) = state.hub().admit_stream(
        client.key().ip(),
        state.max_streams(),
        (per_address > 0).then_some(per_address as usize),
    ) else {
        metrics::counter!("waitroom_streams_shed_total").increment(1);
        let retry = Duration::from_millis(rand::random_range(20_000..40_000));
        return Ok(Opening::Shed(shed_frame(retry)));
    };
    let floor = last_event_id
        .and_then(|raw| std::str::from_utf8(raw).ok())
        .and_then(EventId::parse);
    let before = state.hub().events_seen(&member.queue);
    let mut snapshot = member.read_budgeted(state, client.key()).await?;
    let mut view = None;
    if member.check_entry(&snapshot).is_err() {
        // A ticket of a lottery's pre-queue: still there, or placed.
        let (queue, user) = (&member.queue, &member.user);
        match super::lottery::pre_ticket(state, queue, user, member.entry, &snapshot).await? {
            Some(PreTicket::Waiting(status)) => {
                view = Some(View::PreQueue {
                    opens_at: status.lottery.as_ref().map_or(0, |l| l.opens_at),
                    status: super::lottery::pre_queue_data(&status),
                });
            }
            Some(PreTicket::Placed(placed)) => snapshot = *placed,
            None => return Err(member.not_held(&snapshot)),
        }
    }
    let Some(view) = view.or_else(|| view_of(&snapshot, state.forecast(&member.queue))) else {
        return Ok(Opening::NotEntered);
    };
    let sub = state
        .hub()
        .register(&member.queue, &member.user, &snapshot, view, before, floor);
    let retry = Duration::from_millis(rand::random_range(2_000..5_000));
    let entered_at = wire::entered_at(snapshot.entered_at_ms);
    Ok(Opening::Stream(Box::new(
        StreamSession::new(
            sub,
            Box::new(wire::StreamWire::new(entered_at)),
            retry,
            state.settings().keep_alive,
            state.settings().drain,
        )
        .holding(slot),
    )))
}

/// The headers of every stream answer.
pub const STREAM_HEADERS: [(&str, &str); 3] = [
    ("content-type", "text/event-stream"),
    ("cache-control", "no-cache, no-store"),
    ("x-accel-buffering", "no"),
];

/// The buyer's place live, as Server-Sent Events: the current state at
/// once, then every change, until `gone`. `Last-Event-ID` only sets where
/// the new stream's ids start.
#[utoipa::path(
    get,
    path = "/api/queues/{queue}/events",
    tag = "queue",
    operation_id = "events",
    params(TicketParams),
    responses(
        (status = 200, description = "The stream: `waiting`, `ready` and `gone` events (see `StreamEvent`). \
            An instance at its stream cap answers a `retry:` frame alone and closes. \
            In a lottery's pre-queue: a `prequeue` event (a `PRE_QUEUE` status) at once, keep-alives while it waits, then at the draw the buyer's `waiting` event on the same stream.",
            content_type = "text/event-stream", body = StreamEvent),
        (status = 204, description = "Neither waiting nor holding a token: nothing to stream (EventSource stops)."),
        (status = 400, description = "`invalid_user_id`, `duplicate_header`.", body = ErrorBody),
        (status = 401, description = "`missing_ticket`, `invalid_ticket`, `foreign_ticket`, `ticket_expired`, `ticket_user_mismatch` (the request's identity is not the ticket's user), `missing_identity` (visitor mode: no valid visitor cookie with the ticket; signed mode: no login token), `invalid_identity`, `identity_expired` (signed mode), or `ticket_ended` once the place is over.", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 429, description = "`rate_limited` (`Retry-After`).", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn events(
    State(state): State<AppState>,
    lean: Option<Extension<LeanStream>>,
    Client(client): Client,
    member: Member,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let last_event_id = headers.get("last-event-id").map(HeaderValue::as_bytes);
    let body = match open_stream(&state, &member, &client, last_event_id).await? {
        Opening::NotEntered => return Ok(StatusCode::NO_CONTENT.into_response()),
        Opening::Shed(frame) => Body::from(frame),
        Opening::Stream(session) => match lean {
            Some(Extension(lean)) => {
                lean.hand_over(*session);
                Body::empty()
            }
            None => Body::from_stream(stream::unfold(*session, |mut s| async move {
                s.next_frame()
                    .await
                    .map(|frame| (Ok::<_, Infallible>(frame), s))
            })),
        },
    };
    let mut response = Response::new(body);
    for (name, value) in STREAM_HEADERS {
        response
            .headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    Ok(response)
}
