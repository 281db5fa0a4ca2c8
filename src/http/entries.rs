//! The queue resource: join, look up one's place, leave.
//!
//! A join answers with a ticket for the user's current entry (a new join
//! after leaving gets a new entry, so a new ticket); position and leave
//! accept a ticket only while its entry lasts (`401 ticket_ended` after).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::client::Client;
use super::cookies;
use super::extract::{Member, OptionalJson, Queue, request_ticket, ticket_ended};
use super::identity::Joiner;
use super::lottery::PreTicket;
use super::openapi::TicketParams;
use super::wire::QueueStatus;
use crate::clock::now_ms;
use crate::error::{ApiError, ErrorBody};
use crate::queue::{EntryToken, QueueName, Standing, UserId};

/// `/api/queues/{queue}/entries`, `/entries/me` and `/position`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(enter))
        .routes(routes!(leave))
        .routes(routes!(position))
}

/// The answer to a join: the status plus the ticket.
#[derive(Serialize, utoipa::ToSchema)]
struct Entered {
    #[serde(flatten)]
    status: QueueStatus,
    /// The queue ticket for this place (also set as the `waitroom_ticket`
    /// cookie): send it as `X-Queue-Ticket`, `?ticket=` or the cookie.
    ticket: String,
    /// With `--fairness-log`: this arrival's receipt, a compact JWS
    /// (`EdDSA`, key at `/.well-known/waitroom-keys.json`) whose payload is
    /// `{queue, seq, fp, at}`: the entry sequence (arrival order), the
    /// buyer's fingerprint in the public log, the store's time of the
    /// join. Keep it: `tools/verify-queue` checks the log against it.
    #[serde(skip_serializing_if = "Option::is_none")]
    receipt: Option<String>,
}

/// Optional join metadata, a JSON object if sent (garbage is refused
/// rather than ignored). One field is read: `lotteryNonce`.
type JoinBody = serde_json::Map<String, serde_json::Value>;

/// The entry code the buyer's browser chose for a lottery's pre-queue
/// (`lotteryNonce`: 32 lower-case hex digits, 16 random bytes), so the
/// server does not choose the codes that the draw sorts: `None` when not
/// sent (the server draws one), `400 invalid_body` when not one.
fn lottery_nonce(body: Option<&JoinBody>) -> Result<Option<String>, ApiError> {
    let Some(value) = body.and_then(|b| b.get("lotteryNonce")) else {
        return Ok(None);
    };
    match value.as_str() {
        Some(n) if n.len() == 32 && n.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) => {
            Ok(Some(n.to_owned()))
        }
        _ => Err(ApiError::bad_request(
            crate::error::ErrorCode::InvalidBody,
            "`lotteryNonce` must be 32 lower-case hex digits (16 random bytes)",
        )),
    }
}

/// Joins the queue, or for a buyer already in it, keeps the place and
/// answers a fresh ticket for it. A first join is never refused for the
/// buyer's budget.
#[utoipa::path(
    post,
    path = "/api/queues/{queue}/entries",
    tag = "queue",
    operation_id = "join",
    params(
        ("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name."),
        ("X-User-Id" = String, Header, pattern = r"^[A-Za-z0-9_.:-]{1,64}$",
            description = "The buyer, as the auth gateway sets it."),
        ("X-Altcha" = Option<String>, Header,
            description = "While `--join-challenge` asks for one: the solved challenge of `GET /api/queues/{queue}/challenge`, base64 of the ALTCHA JSON payload. Single use."),
    ),
    request_body(content = Option<Object>, description = "Optional; a JSON object if sent. `lotteryNonce` (32 lower-case hex digits): while a lottery's pre-queue is open, the entry code the buyer's browser chose (its fingerprint is drawn), so the server does not choose it; absent, the server draws one."),
    responses(
        (status = 201, description = "Joined: a new place.", body = Entered),
        (status = 200, description = "Already in line or READY: the same place, a fresh ticket.", body = Entered),
        (status = 400, description = "`missing_user_id`, `invalid_user_id`, `invalid_body`, `duplicate_header`.", body = ErrorBody),
        (status = 403, description = "`challenge_invalid`, `challenge_expired`, `challenge_replayed`: the `X-Altcha` solution does not open the door (`challengeUrl` gives a new challenge).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 408, description = "`request_timeout`: the body did not arrive in time.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 428, description = "`challenge_required`: joins need a solved challenge now; get one at `challengeUrl` and send it as `X-Altcha`.", body = ErrorBody),
        (status = 429, description = "`rate_limited`: a repeat join over the buyer's budget; \
            `address_rate_limited`: too many new places from the client's address; \
            `address_places_limited`: the address holds as many places as it may; \
            `visitor_rate_limited`: too many new visitors from the address (`Retry-After` on each).", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn enter(
    State(state): State<AppState>,
    Queue(queue): Queue,
    joiner: Joiner,
    headers: HeaderMap,
    uri: Uri,
    OptionalJson(body): OptionalJson<JoinBody>,
) -> Result<Response, ApiError> {
    let lottery_nonce = lottery_nonce(body.as_ref())?;
    // Proof of work first: a join that must carry a solved challenge and
    // does not costs nothing more than this check.
    super::challenge::check_join(&state, &queue, &headers).await?;
    let user = joiner.user;
    let address = joiner.client.key();
    // The limits (limit.rs): refused here while a refusal of the store
    // lasts, else checked in the store's own join step. A join that shows
    // this buyer's ticket for this queue is a repeat join, which an
    // address's limits never refuse: it goes to the store (which checks).
    let repeat = holds_ticket(&state, &queue, &user, &headers, &uri);
    state
        .limits()
        .before_join(&queue, &user, (!repeat).then_some(address))?;
    // A scheduled opening whose draw is ahead: the pre-queue instead. The
    // instance's view of the lottery (looked up every 250 ms) saves a call;
    // the join step in the store decides all the same, so a join right
    // after another instance scheduled one lands in the pre-queue too.
    let mut scheduled = false;
    let outcome = loop {
        if let Some(pre) = super::lottery::pre_join(
            &state,
            &queue,
            &user,
            address,
            scheduled,
            lottery_nonce.as_deref(),
        )
        .await?
        {
            // No receipt in a pre-queue: the arrival order is the draw's.
            let answer = Answer {
                entry: pre.entry.pre_entry,
                status: pre.status,
                created: pre.created,
                entered_at: None,
            };
            return Ok(answer.respond(&state, &queue, &user, &joiner.client, joiner.set_cookie));
        }
        // A join again hands the store the entry time this instance last
        // answered the buyer with: it need not read it again if the buyer
        // still waits with that entry (`entry_times.rs`).
        let outcome = match state
            .store()
            .enter_known(
                &queue,
                &user,
                &state.policy(&queue),
                &EntryToken::generate(),
                &state.limits().join_limits(address),
                state.entry_times().latest(&queue, &user),
            )
            .await?
        {
            Ok(outcome) => outcome,
            Err(limited) => {
                return Err(state.limits().refused(&queue, &user, address, limited));
            }
        };
        // Told "pre-queue" once, the pre-join is tried whatever the cache
        // says; told it again after (the draw ran in between, and then the
        // pre-join said "open", which the join step would not repeat), the
        // answer is a store that contradicts itself.
        if !outcome.pre_queue {
            break outcome;
        }
        if scheduled {
            return Err(ApiError::Internal(
                "the store sent a join to a pre-queue that refused it".into(),
            ));
        }
        scheduled = true;
    };
    count_enter(&queue, outcome.created);
    if outcome.created && matches!(outcome.snapshot.standing, Standing::Ready { .. }) {
        // The fast track: admitted by this join, not by a pass, and
        // counted with the passes' admissions all the same.
        metrics::counter!("waitroom_admitted_total", "queue" => queue.to_string(), "path" => "fast_track")
            .increment(1);
    }
    let entry = outcome
        .snapshot
        .entry
        .ok_or_else(|| ApiError::Internal("the store answered a join without an entry".into()))?;
    // The buyer's polls that follow send it back: the store need not
    // read the entry's time again.
    state
        .entry_times()
        .remember(&queue, &user, &outcome.snapshot);
    let answer = Answer {
        entry,
        status: QueueStatus::new(&outcome.snapshot, state.forecast(&queue)),
        created: outcome.created,
        entered_at: outcome.snapshot.entered_at_ms,
    };
    Ok(answer.respond(&state, &queue, &user, &joiner.client, joiner.set_cookie))
}

/// What a join answers, before the ticket is signed.
struct Answer {
    /// The entry the ticket is for.
    entry: u64,
    status: QueueStatus,
    created: bool,
    /// When the store placed the entry (store clock), for the receipt.
    entered_at: Option<u64>,
}

impl Answer {
    /// The response: the status and a ticket for the entry (body and
    /// cookie), plus the visitor cookie a join may have minted.
    fn respond(
        self,
        state: &AppState,
        queue: &QueueName,
        user: &UserId,
        client: &super::client::ClientInfo,
        set_cookie: Option<String>,
    ) -> Response {
        let ttl_secs = state.settings().ticket_ttl_secs;
        let ticket = state
            .signer()
            .sign(queue, user, self.entry, now_ms() + ttl_secs * 1000);
        // Signed here from what the join step answered: no store call.
        let receipt = match (state.fairness(), self.entered_at) {
            (Some(fairness), Some(at)) => {
                Some(fairness.receipt(queue, user.as_str(), self.entry, at))
            }
            _ => None,
        };
        let body = Entered {
            status: self.status,
            ticket: ticket.clone(),
            receipt,
        };
        let code = if self.created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        let mut response = (code, Json(body)).into_response();
        let secure = state.cookie_secure(client);
        let cookie = cookies::ticket(&state.settings().base_path, queue, ticket, ttl_secs, secure);
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().insert("set-cookie", value);
        }
        // A visitor minted by this join keeps the id the place is held under.
        if let Some(value) = set_cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
            response.headers_mut().append("set-cookie", value);
        }
        response
    }
}

/// The buyer's current state.
#[utoipa::path(
    get,
    path = "/api/queues/{queue}/position",
    tag = "queue",
    operation_id = "position",
    params(TicketParams),
    responses(
        (status = 200, description = "The buyer's state.", body = QueueStatus),
        (status = 400, description = "`invalid_user_id`, `duplicate_header`.", body = ErrorBody),
        (status = 401, description = "`missing_ticket`, `invalid_ticket`, `foreign_ticket`, `ticket_expired`, `ticket_user_mismatch` (the request's identity is not the ticket's user), `missing_identity` (visitor mode: no valid visitor cookie with the ticket; signed mode: no login token), `invalid_identity`, `identity_expired` (signed mode), or `ticket_ended` once the place is over.", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 429, description = "`rate_limited` (`Retry-After`).", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn position(
    State(state): State<AppState>,
    Client(client): Client,
    member: Member,
) -> Result<Json<QueueStatus>, ApiError> {
    let snapshot = member.read_budgeted(&state, client.key()).await?;
    if member.check_entry(&snapshot).is_err() {
        // A ticket of a lottery's pre-queue: still there, or placed.
        let (queue, user) = (&member.queue, &member.user);
        return match super::lottery::pre_ticket(&state, queue, user, member.entry, &snapshot)
            .await?
        {
            Some(PreTicket::Waiting(status)) => Ok(Json(*status)),
            Some(PreTicket::Placed(placed)) => {
                Ok(Json(QueueStatus::new(&placed, state.forecast(queue))))
            }
            None => Err(member.not_held(&snapshot)),
        };
    }
    Ok(Json(QueueStatus::new(
        &snapshot,
        state.forecast(&member.queue),
    )))
}

/// Gives up the place this ticket stands for (and clears the cookie).
#[utoipa::path(
    delete,
    path = "/api/queues/{queue}/entries/me",
    tag = "queue",
    operation_id = "leave",
    params(TicketParams),
    responses(
        (status = 204, description = "Left."),
        (status = 400, description = "`invalid_user_id`, `duplicate_header`.", body = ErrorBody),
        (status = 401, description = "`missing_ticket`, `invalid_ticket`, `foreign_ticket`, `ticket_expired`, `ticket_user_mismatch` (the request's identity is not the ticket's user), `missing_identity` (visitor mode: no valid visitor cookie with the ticket; signed mode: no login token), `invalid_identity`, `identity_expired` (signed mode), or `ticket_ended` once the place is over.", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn leave(
    State(state): State<AppState>,
    Client(client): Client,
    member: Member,
) -> Result<Response, ApiError> {
    // Conditional on the ticket's entry, in one store step: an old ticket
    // can never remove a newer place.
    let left = state
        .store()
        .leave(&member.queue, &member.user, member.entry)
        .await?
        || super::lottery::leave(&state, &member.queue, &member.user, member.entry).await?;
    if !left {
        return Err(ticket_ended());
    }
    state.limits().note_left(&member.queue, &member.user);
    let mut response = StatusCode::NO_CONTENT.into_response();
    for removal in cookies::ticket_removals(
        &state.settings().base_path,
        &member.queue,
        state.cookie_secure(&client),
    ) {
        if let Ok(value) = HeaderValue::from_str(&removal) {
            response.headers_mut().append("set-cookie", value);
        }
    }
    Ok(response)
}

/// Counts a join in `waitroom_enters_total` (by queue, and whether the
/// place is new). The two counters of a queue are looked up once and kept:
/// a look-up builds the labels' strings and hashes them, on every join of
/// a burst otherwise. Queues are the configured ones, so the map stays
/// small.
fn count_enter(queue: &QueueName, created: bool) {
    static COUNTERS: LazyLock<Mutex<HashMap<QueueName, [metrics::Counter; 2]>>> =
        LazyLock::new(Mutex::default);
    let counter = {
        let mut counters = COUNTERS.lock().unwrap_or_else(|e| e.into_inner());
        let pair = match counters.get(queue) {
            Some(pair) => pair,
            None => counters.entry(queue.clone()).or_insert_with(|| {
                [false, true].map(|new| {
                    metrics::counter!("waitroom_enters_total", "queue" => queue.to_string(), "new" => new.to_string())
                })
            }),
        };
        pair[usize::from(created)].clone()
    };
    counter.increment(1);
}

/// Whether the request carries a valid ticket of `user` for `queue`
/// (header, query or cookie): the sign of a repeat join. Only a signature
/// check, no store call; whether the place still lasts is the store's.
fn holds_ticket(
    state: &AppState,
    queue: &QueueName,
    user: &UserId,
    headers: &HeaderMap,
    uri: &Uri,
) -> bool {
    request_ticket(state, headers, uri)
        .and_then(|raw| state.signer().verify(&raw, queue, now_ms()).ok())
        .is_some_and(|ticket| &ticket.user == user)
}
