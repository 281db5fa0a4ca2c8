//! Request extractors shared by the resources: the queue named in the path,
//! the queue ticket (checked against the request's identity), and a small
//! JSON body. The buyer of a join is `super::identity::Joiner`.
//!
//! Each turns bad input into an [`ApiError`] before any handler runs, so
//! handlers only ever see valid values.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::AppState;
use crate::clock::now_ms;
use crate::error::ApiError;
use crate::error::ErrorCode;
use crate::queue::{QueueName, Snapshot, Standing, TicketError, UserId};
use crate::store::StoreError;

pub use super::cookies::{TICKET_COOKIE, TICKET_COOKIE_SECURE};

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
    ApiError::not_found(ErrorCode::UnknownQueue, "no such queue")
}

/// The raw ticket of a request: `X-Queue-Ticket`, then `?ticket=` (`query`
/// is `None` unless `--ticket-in-query`), then the cookie. Never logged.
pub fn raw_ticket<'a>(
    header: Option<&'a str>,
    query: Option<&str>,
    cookie_headers: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    if let Some(v) = header {
        return Some(v.trim().to_owned());
    }
    if let Some(query) = query
        && let Some((_, v)) = form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "ticket")
    {
        return Some(v.into_owned());
    }
    // Both names, the Secure one first. Over HTTPS the plain name never
    // gets here (`cookies::only_prefixed_names` drops it).
    let mut plain = None;
    for text in cookie_headers {
        for cookie in cookie::Cookie::split_parse(text).flatten() {
            if cookie.name() == TICKET_COOKIE_SECURE {
                return Some(cookie.value().to_owned());
            }
            if cookie.name() == TICKET_COOKIE && plain.is_none() {
                plain = Some(cookie.value().to_owned());
            }
        }
    }
    plain
}

/// A queue member authenticated by their ticket: the queue in the path, the
/// user the ticket was issued to and the entry it stands for. A forged,
/// foreign or expired ticket, a request identity other than the ticket's
/// user, or (visitor and signed modes) none at all, is `401`. Whether the entry is still the user's current one needs
/// the store: see [`Member::check_entry`].
pub struct Member {
    pub queue: QueueName,
    pub user: UserId,
    /// The entry (arrival sequence) the ticket stands for.
    pub entry: u64,
}

impl Member {
    /// The buyer's standing, after spending one from their request
    /// budget (`limit.rs`) in the same store step: `429` while this
    /// instance holds a refusal of theirs (the store is not asked), or
    /// when the store finds the budget spent. A buyer found in line is
    /// marked seen by the presence loop's next write, with everyone else
    /// present ([`crate::push::Hub::note_seen`]), not by this call: a
    /// poll's store step stays a read and its budget. The entry time this
    /// instance last answered for the ticket's entry goes with the read,
    /// so the store need not read it again (`entry_times.rs`).
    pub async fn read_budgeted(
        &self,
        state: &AppState,
        address: super::client::ClientKey,
    ) -> Result<Snapshot, ApiError> {
        let limits = state.limits();
        limits.before_read(&self.queue, &self.user)?;
        let (store, times) = (state.store(), state.entry_times());
        let known = times.get(&self.queue, &self.user, self.entry);
        let snapshot = store
            .status_known(&self.queue, &self.user, Some(limits.budget()), known)
            .await?
            .map_err(|limited| limits.refused(&self.queue, &self.user, address, limited))?;
        times.remember(&self.queue, &self.user, &snapshot);
        if matches!(snapshot.standing, Standing::Waiting { .. })
            && !state.hub().note_seen(&self.queue, &self.user)
        {
            store
                .touch(&self.queue, std::slice::from_ref(&self.user))
                .await?;
        }
        Ok(snapshot)
    }

    /// Authenticates a request for `queue_raw` (the path segment) carrying
    /// `ticket`, with `headers` for the identity source: the signature and
    /// the expiry, without the store, then the ticket's user against the
    /// request's identity ([`crate::identity::Identity::ticket_holder`]:
    /// required in visitor and signed modes).
    pub fn authenticate(
        state: &AppState,
        queue_raw: &str,
        ticket: Option<String>,
        headers: &HeaderMap,
    ) -> Result<Self, ApiError> {
        let queue = QueueName::parse(queue_raw)
            .ok()
            .filter(|q| state.has_queue(q))
            .ok_or_else(unknown_queue)?;
        let raw = ticket.ok_or_else(|| {
            ApiError::unauthorized(
                ErrorCode::MissingTicket,
                "send the queue ticket (the cookie a join set, or X-Queue-Ticket)",
            )
        })?;
        let ticket = state
            .signer()
            .verify(&raw, &queue, now_ms())
            .map_err(|e| match e {
                TicketError::Invalid => {
                    ApiError::unauthorized(ErrorCode::InvalidTicket, e.to_string())
                }
                TicketError::ForeignQueue => {
                    ApiError::unauthorized(ErrorCode::ForeignTicket, e.to_string())
                }
                TicketError::Expired => {
                    ApiError::unauthorized(ErrorCode::TicketExpired, e.to_string())
                }
            })?;
        // Visitor and signed modes insist on the request's own identity
        // (a leaked ticket alone must not read the token); header mode
        // checks it when the gateway names one.
        if let Some(claimed) = state.identity().ticket_holder(headers)?
            && claimed != ticket.user
        {
            return Err(ApiError::unauthorized(
                ErrorCode::TicketUserMismatch,
                "the queue ticket was issued to another user",
            ));
        }
        Ok(Member {
            queue,
            user: ticket.user,
            entry: ticket.entry,
        })
    }

    /// Checks the ticket's entry against the user's standing read from the
    /// store: a ticket ends with its entry (left, dropped as absent, token
    /// used or expired, or replaced by a new join), and an ended ticket is
    /// `401 ticket_ended`.
    pub fn check_entry(&self, snapshot: &Snapshot) -> Result<(), ApiError> {
        if snapshot.entry == Some(self.entry) {
            Ok(())
        } else {
            Err(ticket_ended())
        }
    }

    /// The answer to a ticket whose entry `snapshot` does not hold (and no
    /// lottery pre-queue holds either): `401 ticket_ended` when the store
    /// may say the place is over, else `503 store_unavailable` (the store
    /// that answered has not issued the ticket's entry: it lags behind the
    /// one that did, as a restarted old master does before a failover
    /// settles; the page retries and is answered by the store of record).
    pub fn not_held(&self, snapshot: &Snapshot) -> ApiError {
        if snapshot.ends_ticket(self.entry) {
            return ticket_ended();
        }
        metrics::counter!("waitroom_stale_ticket_reads_total").increment(1);
        ApiError::Unavailable(StoreError::Unavailable(format!(
            "entry {} is above the answering store's entry counter {:?}",
            self.entry, snapshot.entries_issued
        )))
    }
}

/// `401 ticket_ended`: the ticket's place in line is over.
pub fn ticket_ended() -> ApiError {
    ApiError::unauthorized(
        ErrorCode::TicketEnded,
        "this ticket's place in line has ended; join again",
    )
}

impl FromRequestParts<AppState> for Member {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Path(queue_raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| unknown_queue())?;
        let ticket = request_ticket(state, &parts.headers, &parts.uri);
        Member::authenticate(state, &queue_raw, ticket, &parts.headers)
    }
}

/// The raw ticket a request carries, from the places this instance takes
/// it: `X-Queue-Ticket`, the cookie, and `?ticket=` only with
/// `--ticket-in-query`. One place, so every reader follows that setting.
pub fn request_ticket(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    uri: &axum::http::Uri,
) -> Option<String> {
    raw_ticket(
        headers.get("x-queue-ticket").and_then(|v| v.to_str().ok()),
        uri.query().filter(|_| state.settings().ticket_in_query),
        headers
            .get_all("cookie")
            .iter()
            .filter_map(|v| v.to_str().ok()),
    )
}

/// An optional small JSON body: empty, or JSON that parses as `T`
/// (`400` for garbage, `413` past 16 KiB).
pub struct OptionalJson<T>(pub Option<T>);

const BODY_LIMIT: usize = 16 * 1024;

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, ApiError> {
        let bytes = read_limited(req).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(None));
        }
        serde_json::from_slice(&bytes)
            .map(|v| OptionalJson(Some(v)))
            .map_err(|e| {
                ApiError::bad_request(
                    ErrorCode::InvalidBody,
                    format!("the body is not valid JSON for this endpoint: {e}"),
                )
            })
    }
}

/// A required small JSON body (`400` for missing or garbage, `413` past 16 KiB).
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, ApiError> {
        let bytes = read_limited(req).await?;
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| {
            ApiError::bad_request(
                ErrorCode::InvalidBody,
                format!("the body is not valid JSON for this endpoint: {e}"),
            )
        })
    }
}

/// Reads a whole body of at most [`BODY_LIMIT`] bytes (`413` past it,
/// `408` when it did not arrive in time, `400` when broken off).
async fn read_limited(req: Request) -> Result<Bytes, ApiError> {
    Ok(super::body::read_whole(req.into_body(), BODY_LIMIT).await?)
}
