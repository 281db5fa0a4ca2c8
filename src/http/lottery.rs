//! A scheduled opening with a lottery anyone can check
//! (`crate::queue::lottery` has the rules, `crate::lottery` runs the draw).
//!
//! Operators schedule it (`PUT /api/admin/queues/{queue}/lottery`); from
//! then on joins land in a pre-queue (`PRE_QUEUE`, with the buyer's
//! fingerprint) until the draw at `opensAt` places them all in line. The
//! public `GET /api/queues/{queue}/lottery` publishes the commitment
//! before the draw and the seed after it, and `.../lottery/entries` the
//! list of fingerprints, so a buyer (or `scripts/lottery-verify`) can
//! recompute the order.

use axum::Json;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::AdminAuth;
use super::extract::{JsonBody, Queue};
use super::wire::{PreQueueBody, QueueStatus};
use crate::clock::now_ms;
use crate::error::ErrorCode;
use crate::error::{ApiError, ErrorBody};
use crate::queue::lottery::{fingerprint, new_nonce, new_seed};
use crate::queue::{QueueName, Snapshot, UserId};
use crate::store::{LotteryRefusal, LotteryState, PreEntry, PreJoin};

/// The latest `opensAt` accepted: 90 days ahead (a typo of a digit is
/// refused rather than holding a queue shut for years).
pub const MAX_AHEAD_MS: u64 = 90 * 86_400_000;

/// `/api/queues/{queue}/lottery` and `.../entries`: the public side.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_lottery))
        .routes(routes!(get_entries))
}

/// `/api/admin/queues/{queue}/lottery`: the operators' side.
pub fn admin_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(put_lottery, delete_lottery))
}

/// A queue's lottery as published.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct LotteryView {
    queue: String,
    /// When the draw places the pre-queue in line, ms since the epoch.
    opens_at: u64,
    /// `scheduled` until the draw, then `drawn`.
    state: &'static str,
    /// `hex(SHA-256(seed))`, the same before and after the draw.
    commitment: String,
    /// The seed (64 hex digits); `null` until drawn.
    seed: Option<String>,
    /// Entries in the pre-queue, or placed by the draw.
    entries: u64,
    /// Where the fingerprint list is; `null` until drawn.
    list_url: Option<String>,
}

impl LotteryView {
    fn new(state: &AppState, queue: &QueueName, l: LotteryState) -> Self {
        let base = &state.settings().base_path;
        Self {
            queue: queue.as_str().to_owned(),
            opens_at: l.opens_at,
            state: if l.drawn { "drawn" } else { "scheduled" },
            commitment: l.commitment,
            seed: l.drawn.then_some(l.seed),
            entries: l.entries,
            list_url: l
                .drawn
                .then(|| format!("{base}/api/queues/{queue}/lottery/entries")),
        }
    }
}

/// A lottery to schedule, or a new opening time for one not drawn yet.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Schedule {
    /// When to draw, ms since the epoch: in the future, at most 90 days on.
    opens_at: u64,
}

/// The answer to clearing a lottery.
#[derive(Serialize, utoipa::ToSchema)]
struct Cleared {
    queue: String,
    cleared: bool,
}

fn no_lottery() -> ApiError {
    ApiError::not_found(ErrorCode::NoLottery, "this queue has no scheduled opening")
}

fn refused(r: LotteryRefusal) -> ApiError {
    match r {
        LotteryRefusal::Drawn => ApiError::conflict(
            ErrorCode::LotteryDrawn,
            "the draw has run; its time and seed can no longer change",
        ),
        LotteryRefusal::NotEmpty => ApiError::conflict(
            ErrorCode::PreQueueNotEmpty,
            "buyers wait in the pre-queue; move opensAt instead",
        ),
    }
}

/// The lottery of a queue: commitment before the draw, seed after.
#[utoipa::path(
    get,
    path = "/api/queues/{queue}/lottery",
    tag = "queue",
    params(("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name.")),
    responses(
        (status = 200, description = "The lottery.", body = LotteryView),
        (status = 404, description = "`unknown_queue`, `no_lottery`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn get_lottery(
    State(state): State<AppState>,
    Queue(queue): Queue,
) -> Result<Json<LotteryView>, ApiError> {
    let lottery = state
        .store()
        .lottery(&queue)
        .await?
        .ok_or_else(no_lottery)?;
    Ok(Json(LotteryView::new(&state, &queue, lottery)))
}

/// The published fingerprints of a drawn lottery: sorted, one a line.
#[utoipa::path(
    get,
    path = "/api/queues/{queue}/lottery/entries",
    tag = "queue",
    params(("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name.")),
    responses(
        (status = 200, description = "One fingerprint (64 hex digits) a line, sorted; the draw's input.", body = String, content_type = "text/plain"),
        (status = 404, description = "`unknown_queue`, `no_lottery`.", body = ErrorBody),
        (status = 409, description = "`not_drawn`: the list is published with the seed.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn get_entries(
    State(state): State<AppState>,
    Queue(queue): Queue,
) -> Result<Response, ApiError> {
    let lottery = state
        .store()
        .lottery(&queue)
        .await?
        .ok_or_else(no_lottery)?;
    if !lottery.drawn {
        return Err(ApiError::conflict(
            ErrorCode::NotDrawn,
            "the list is published with the seed, after the draw",
        ));
    }
    let mut list = state
        .store()
        .lottery_list(&queue)
        .await?
        .unwrap_or_default();
    if !list.is_empty() {
        list.push('\n');
    }
    Ok(([(CONTENT_TYPE, "text/plain; charset=utf-8")], list).into_response())
}

/// Schedules the queue's opening with a lottery, or moves its time (the
/// seed, and so the commitment, never changes once published).
#[utoipa::path(
    put,
    path = "/api/admin/queues/{queue}/lottery",
    tag = "admin",
    security(("admin" = [])),
    params(("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name.")),
    request_body = Schedule,
    responses(
        (status = 200, description = "Scheduled.", body = LotteryView),
        (status = 400, description = "`invalid_opens_at`, `invalid_body`.", body = ErrorBody),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 408, description = "`request_timeout`.", body = ErrorBody),
        (status = 409, description = "`lottery_drawn`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn put_lottery(
    _: AdminAuth,
    State(state): State<AppState>,
    Queue(queue): Queue,
    JsonBody(body): JsonBody<Schedule>,
) -> Result<Json<LotteryView>, ApiError> {
    let now = now_ms();
    if body.opens_at <= now || body.opens_at > now + MAX_AHEAD_MS {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidOpensAt,
            "opensAt: ms since the epoch, in the future and at most 90 days ahead",
        ));
    }
    let lottery = state
        .store()
        .schedule_lottery(&queue, body.opens_at, &new_seed())
        .await?
        .map_err(refused)?;
    state.lotteries().set(&queue, !lottery.drawn);
    tracing::info!(%queue, opens_at = lottery.opens_at, "opening with a lottery scheduled");
    Ok(Json(LotteryView::new(&state, &queue, lottery)))
}

/// Clears a lottery not drawn yet whose pre-queue is empty.
#[utoipa::path(
    delete,
    path = "/api/admin/queues/{queue}/lottery",
    tag = "admin",
    security(("admin" = [])),
    params(("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name.")),
    responses(
        (status = 200, description = "Cleared (`cleared: false`: there was none).", body = Cleared),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 409, description = "`lottery_drawn`, `pre_queue_not_empty`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn delete_lottery(
    _: AdminAuth,
    State(state): State<AppState>,
    Queue(queue): Queue,
) -> Result<Json<Cleared>, ApiError> {
    let cleared = state
        .store()
        .clear_lottery(&queue)
        .await?
        .map_err(refused)?;
    state.lotteries().set(&queue, false);
    Ok(Json(Cleared {
        queue: queue.as_str().to_owned(),
        cleared,
    }))
}

/// A join that landed in the pre-queue.
pub(super) struct PreQueued {
    pub entry: PreEntry,
    pub created: bool,
    pub status: QueueStatus,
}

/// Puts `user` in `queue`'s pre-queue if its draw is still ahead; `None`
/// when an ordinary join applies (no lottery, drawn, or already in line).
/// A new entry counts against `address`'s limits in the store, as a new
/// place in line does (`429` with the same body when over them). Tried only
/// when this instance knows of a lottery, or `scheduled` (the store's join
/// step said so).
pub(super) async fn pre_join(
    state: &AppState,
    queue: &QueueName,
    user: &UserId,
    address: super::client::ClientKey,
    scheduled: bool,
    browser_nonce: Option<&str>,
) -> Result<Option<PreQueued>, ApiError> {
    if !scheduled && !state.lotteries().has(queue) {
        return Ok(None);
    }
    let limits = state.limits().join_limits(address);
    // The browser's code when it sent one: the server then has no say in
    // the fingerprint the draw sorts (a repeat join keeps the first code).
    let nonce = browser_nonce.map_or_else(new_nonce, str::to_owned);
    let joined = state
        .store()
        .pre_join_limited(queue, user, &nonce, limits.address.as_ref())
        .await?;
    let PreJoin::Pre { entry, created } = (match joined {
        Ok(joined) => joined,
        Err(limited) => return Err(state.limits().refused(queue, user, address, limited)),
    }) else {
        return Ok(None);
    };
    let Some(lottery) = state.store().lottery(queue).await? else {
        return Ok(None);
    };
    let status = QueueStatus::pre_queue(0, body(queue, &entry, &lottery));
    Ok(Some(PreQueued {
        entry,
        created,
        status,
    }))
}

fn body(queue: &QueueName, entry: &PreEntry, lottery: &LotteryState) -> PreQueueBody {
    PreQueueBody {
        opens_at: lottery.opens_at,
        seconds_to_open: lottery.opens_at.saturating_sub(now_ms()).div_ceil(1000),
        commitment: lottery.commitment.clone(),
        nonce: entry.nonce.clone(),
        fingerprint: fingerprint(queue.as_str(), &entry.nonce),
    }
}

/// What a ticket signed for a pre-queue entry stands for now.
pub(super) enum PreTicket {
    /// Still in the pre-queue: the status to answer (boxed: it is large).
    Waiting(Box<QueueStatus>),
    /// Placed by the draw, and still holding that place: the standing to
    /// answer (boxed: it is large), read after the draw.
    Placed(Box<Snapshot>),
}

/// Looks up `user`'s lottery entry for a ticket of `ticket_entry` that is
/// not `snapshot`'s entry; `None` when it is not a pre-queue ticket of
/// this user, or the place the draw gave it is over (the ticket has ended).
///
/// `snapshot` was read before this look-up, so a draw that committed in
/// between finds the entry placed while `snapshot` still shows the user
/// out of line: the line is then read again rather than the ticket
/// declared ended (the fault campaign's `drop2` race, docs/faults.md).
pub(super) async fn pre_ticket(
    state: &AppState,
    queue: &QueueName,
    user: &UserId,
    ticket_entry: u64,
    snapshot: &Snapshot,
) -> Result<Option<PreTicket>, ApiError> {
    let Some(entry) = state.store().pre_entry(queue, user).await? else {
        return Ok(None);
    };
    if entry.pre_entry != ticket_entry {
        return Ok(None);
    }
    match entry.entry {
        Some(placed) if snapshot.entry == Some(placed) => {
            Ok(Some(PreTicket::Placed(Box::new(snapshot.clone()))))
        }
        Some(placed) => {
            let fresh = state.store().status(queue, user, true).await?;
            Ok((fresh.entry == Some(placed)).then(|| PreTicket::Placed(Box::new(fresh))))
        }
        None => {
            let Some(lottery) = state.store().lottery(queue).await? else {
                return Ok(None);
            };
            Ok(Some(PreTicket::Waiting(Box::new(QueueStatus::pre_queue(
                snapshot.total_waiting,
                body(queue, &entry, &lottery),
            )))))
        }
    }
}

/// Gives up the lottery entry a pre-queue ticket of `ticket_entry` stands
/// for: out of the pre-queue before the draw, out of line after it. True
/// if something was given up.
pub(super) async fn leave(
    state: &AppState,
    queue: &QueueName,
    user: &UserId,
    ticket_entry: u64,
) -> Result<bool, ApiError> {
    let Some(entry) = state.store().pre_entry(queue, user).await? else {
        return Ok(false);
    };
    if entry.pre_entry != ticket_entry {
        return Ok(false);
    }
    Ok(match entry.entry {
        None => state.store().pre_leave(queue, user, ticket_entry).await?,
        Some(placed) => state.store().leave(queue, user, placed).await?,
    })
}

/// The data of a `prequeue` stream event: the `PRE_QUEUE` status, as a
/// poll answers it (rendered once: the page counts down by itself).
pub(super) fn pre_queue_data(status: &QueueStatus) -> std::sync::Arc<str> {
    serde_json::to_string(status)
        .unwrap_or_else(|_| "{}".into())
        .into()
}
