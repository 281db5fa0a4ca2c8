//! A scheduled opening with a lottery (`crate::queue::lottery` has the
//! rules): arrivals before the opening wait in a pre-queue, and one draw
//! places them in line in a random order. The draw is applied in bounded
//! steps ([`draw_in_steps`]) so no single store call holds the store long.

use async_trait::async_trait;

use super::{AddressLimits, Limited, StoreError, StoreResult};
use crate::queue::{QueueName, UserId};

/// A queue's scheduled opening and its lottery, as the store keeps it
/// (`crate::queue::lottery` has the rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LotteryState {
    /// When the draw may run: store clock, ms since the epoch.
    pub opens_at: u64,
    /// The secret seed, hex. Callers reveal it only once `drawn`.
    pub seed: String,
    /// `hex(SHA-256(seed))`, public from the start.
    pub commitment: String,
    /// True once the pre-queue was placed in line (never undone).
    pub drawn: bool,
    /// Entries in the pre-queue, or placed by the draw once drawn.
    pub entries: u64,
    /// Bumped by every change of the pre-queue, so a draw computed from
    /// one reading applies only to that very pre-queue.
    pub version: u64,
    /// While a draw is being staged ([`LotteryStore::draw_begin`]): how long ago
    /// (store clock, ms) it last moved on. `None` when none is.
    pub staging_idle_ms: Option<u64>,
}

/// Why a lottery change was refused; nothing was changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LotteryRefusal {
    /// The draw has run: its opening time and seed are history.
    Drawn,
    /// Clearing a lottery whose pre-queue holds entries would strand them.
    NotEmpty,
}

/// One buyer's lottery entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreEntry {
    /// The entry id the buyer's ticket was signed for at the pre-queue join.
    pub pre_entry: u64,
    /// The random text their fingerprint is computed from.
    pub nonce: String,
    /// Their entry in line once the draw placed them.
    pub entry: Option<u64>,
}

/// What [`LotteryStore::pre_join`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreJoin {
    /// The buyer is in the pre-queue (`created` when by this call).
    Pre { entry: PreEntry, created: bool },
    /// No lottery waits to be drawn, or the buyer already has a place in
    /// line or a token: an ordinary join applies.
    Open,
}

/// What [`LotteryStore::draw`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrawOutcome {
    /// This call placed `placed` entries in line.
    Drawn { placed: u64 },
    /// The draw had already run (another instance): nothing changed.
    AlreadyDrawn,
    /// Nothing changed: no lottery, `opensAt` not reached on the store
    /// clock, or the pre-queue changed since it was read (read again).
    Stale,
    /// Another draw holds the stage and is moving on (another instance is
    /// applying it), or took it over from this one: nothing to do here.
    InProgress,
}

/// What one step of a staged draw did ([`LotteryStore::draw_begin`],
/// [`LotteryStore::draw_stage`], [`LotteryStore::draw_commit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrawStep {
    /// This draw holds the stage; `staged` positions of its order are in it.
    Staged { staged: u64 },
    /// Committed: the frozen pre-queue is in line, `placed` entries of it
    /// (the order less those who left while it was staged).
    Drawn { placed: u64 },
    /// The draw had already run: nothing changed.
    AlreadyDrawn,
    /// Nothing staged: no lottery, `opensAt` not reached, the pre-queue
    /// not at the version or size given, or (a stage call) the order not
    /// the frozen pre-queue's, which drops the stage.
    Stale,
    /// Another draw holds a stage that is moving on: nothing changed.
    Busy,
    /// This draw no longer holds the stage (it was abandoned and taken
    /// over), or the step is not the next one: nothing changed.
    Lost,
}

/// Order positions staged per call: each [`LotteryStore::draw_stage`] is
/// bounded by it (Redis here: 40–62 ms per 1,000 with the shared 2-core
/// machine at load 5–6, up to 167 ms at load 8; `loadtest/lottery-draw.sh`).
pub const DRAW_CHUNK: usize = 1_000;

/// A stage that has not moved on for this long is abandoned (its instance
/// died mid-draw): the next draw takes it over. Well above one step's
/// worst case (the client's 2 s response timeout).
pub const DRAW_ABANDON_MS: u64 = 5_000;

/// The lottery of a scheduled opening: its schedule, pre-queue and draw.
#[async_trait]
pub trait LotteryStore: Send + Sync + 'static {
    /// Schedules `queue` to open at `opens_at` (store clock, ms), keeping
    /// arrivals in a pre-queue until the draw. The first call stores `seed`
    /// (hex); a later one before the draw only moves `opens_at`, never the
    /// seed, so the published commitment stays. Refused once drawn.
    async fn schedule_lottery(
        &self,
        queue: &QueueName,
        opens_at: u64,
        seed: &str,
    ) -> StoreResult<Result<LotteryState, LotteryRefusal>>;

    /// Removes a lottery not drawn yet whose pre-queue is empty. `Ok(true)`
    /// if there was one.
    async fn clear_lottery(&self, queue: &QueueName) -> StoreResult<Result<bool, LotteryRefusal>>;

    /// The lottery of `queue`, if one was scheduled.
    async fn lottery(&self, queue: &QueueName) -> StoreResult<Option<LotteryState>>;

    /// Puts `user` in the pre-queue with `nonce` (a new entry id taken from
    /// the queue's entry counter), or answers the entry they have there.
    /// One atomic step with the lottery's state: once drawn, or for a user
    /// with a place in line or a token, answers [`PreJoin::Open`].
    async fn pre_join(
        &self,
        queue: &QueueName,
        user: &UserId,
        nonce: &str,
    ) -> StoreResult<PreJoin> {
        self.pre_join_limited(queue, user, nonce, None)
            .await?
            .map_err(|l| StoreError::Protocol(format!("a join without limits was limited: {l:?}")))
    }

    /// [`LotteryStore::pre_join`], checked against the client `address`'s limits
    /// in the same atomic step, exactly as [`crate::store::LineStore::enter_limited`] checks a
    /// new place: a new pre-queue entry is refused with
    /// [`crate::store::LimitKind::AddressPlaces`] when the address holds `places` live
    /// places (pre-queue entries count, and keep counting through the draw
    /// as the places it gives), else with [`crate::store::LimitKind::AddressJoins`] when
    /// its join rate is spent; a created entry counts against both. A
    /// repeat pre-queue join never counts. A refusal changes nothing.
    async fn pre_join_limited(
        &self,
        queue: &QueueName,
        user: &UserId,
        nonce: &str,
        address: Option<&AddressLimits>,
    ) -> StoreResult<Result<PreJoin, Limited>>;

    /// `user`'s lottery entry (kept after the draw, with their entry in line).
    async fn pre_entry(&self, queue: &QueueName, user: &UserId) -> StoreResult<Option<PreEntry>>;

    /// Takes `user` out of the pre-queue if `pre_entry` is their entry there
    /// and the draw has not run. True if removed.
    async fn pre_leave(
        &self,
        queue: &QueueName,
        user: &UserId,
        pre_entry: u64,
    ) -> StoreResult<bool>;

    /// The pre-queue as of one moment: its version and every entry.
    async fn pre_queue(&self, queue: &QueueName) -> StoreResult<(u64, Vec<(UserId, PreEntry)>)>;

    /// The draw: places `order` (every pre-queue user, first in line
    /// first) at the back of the line with fresh entry ids, and keeps
    /// `list` (the published fingerprints) — only if the lottery is not
    /// drawn, `opensAt` has come on the store clock, and the pre-queue is
    /// still at `version` with exactly these users. All or nothing as
    /// buyers see it, so of many instances drawing at once exactly one
    /// places anyone; applied in steps of [`DRAW_CHUNK`] (see
    /// [`draw_in_steps`]), none of which holds the store for long.
    async fn draw(
        &self,
        queue: &QueueName,
        version: u64,
        order: &[UserId],
        list: &str,
    ) -> StoreResult<DrawOutcome> {
        let id = new_draw_id();
        draw_in_steps(self, queue, &id, version, order, list, DRAW_CHUNK).await
    }

    /// The first step of a staged draw `draw` (an id fresh per draw):
    /// freezes the pre-queue (only if it is not drawn, `opensAt` has come
    /// on the store clock, and the pre-queue is at `version` with
    /// `entries` entries), reserves the drawn block of entry ids and keeps
    /// `list` aside for the commit. [`DrawStep::Busy`] while another
    /// draw's stage moved on within `abandon_ms`; an older one is dropped
    /// and this draw takes its place. From here until the commit, a
    /// pre-queue join is staged behind the drawn block and a pre-queue
    /// leave leaves the stage too; nothing a buyer sees changes.
    async fn draw_begin(
        &self,
        queue: &QueueName,
        draw: &str,
        version: u64,
        entries: u64,
        list: &str,
        abandon_ms: u64,
    ) -> StoreResult<DrawStep>;

    /// Stages `users`, the order's positions `offset..` (`offset` = the
    /// positions staged so far): each gets entry id `base + position`. A
    /// user who left since the freeze is skipped; one not frozen, or named
    /// twice, drops the stage ([`DrawStep::Stale`]). A chunk already
    /// staged (a retry) changes nothing.
    async fn draw_stage(
        &self,
        queue: &QueueName,
        draw: &str,
        offset: u64,
        users: &[UserId],
    ) -> StoreResult<DrawStep>;

    /// Puts the whole stage in line at once (the drawn in drawn order,
    /// later arrivals behind), publishes `drawn`, and marks the lottery
    /// drawn; only once every position was staged ([`DrawStep::Lost`]
    /// before), and only if every pre-queue user is staged (else the order
    /// missed one: the stage is dropped, [`DrawStep::Stale`]).
    async fn draw_commit(&self, queue: &QueueName, draw: &str) -> StoreResult<DrawStep>;

    /// The published fingerprint list, once drawn.
    async fn lottery_list(&self, queue: &QueueName) -> StoreResult<Option<String>>;
}

/// A fresh draw id: this process's id (which instance holds a stage shows
/// in the store) and a random part.
pub fn new_draw_id() -> String {
    format!("{}-{:016x}", std::process::id(), rand::random::<u64>())
}

/// Applies a computed draw as draw `id` in steps of `chunk` positions:
/// [`LotteryStore::draw_begin`], [`LotteryStore::draw_stage`] per chunk, then
/// [`LotteryStore::draw_commit`]. Whatever step ends it early leaves nothing a
/// buyer sees: a stage left behind (this process died, or the store
/// failed) is taken over by the next draw after [`DRAW_ABANDON_MS`].
pub async fn draw_in_steps<S: LotteryStore + ?Sized>(
    store: &S,
    queue: &QueueName,
    id: &str,
    version: u64,
    order: &[UserId],
    list: &str,
    chunk: usize,
) -> StoreResult<DrawOutcome> {
    let n = order.len() as u64;
    let early = |step: DrawStep| match step {
        DrawStep::AlreadyDrawn => DrawOutcome::AlreadyDrawn,
        DrawStep::Stale => DrawOutcome::Stale,
        _ => DrawOutcome::InProgress,
    };
    let started = std::time::Instant::now();
    // The longest step as this caller saw it (round trip included): an
    // upper bound of how long one step held the store.
    let mut longest = std::time::Duration::ZERO;
    let mut timed = std::time::Instant::now();
    let mut lap = || {
        longest = longest.max(timed.elapsed());
        timed = std::time::Instant::now();
    };
    match store
        .draw_begin(queue, id, version, n, list, DRAW_ABANDON_MS)
        .await?
    {
        DrawStep::Staged { .. } => lap(),
        step => return Ok(early(step)),
    }
    let mut offset = 0;
    for users in order.chunks(chunk.max(1)) {
        match store.draw_stage(queue, id, offset, users).await? {
            DrawStep::Staged { staged } => offset = staged,
            step => return Ok(early(step)),
        }
        lap();
    }
    Ok(match store.draw_commit(queue, id).await? {
        DrawStep::Drawn { placed } => {
            lap();
            tracing::info!(
                %queue,
                placed,
                steps = n.div_ceil(chunk.max(1) as u64) + 2,
                longest_step_ms = longest.as_secs_f64() * 1e3,
                apply_ms = started.elapsed().as_secs_f64() * 1e3,
                "lottery draw applied"
            );
            DrawOutcome::Drawn { placed }
        }
        step => early(step),
    })
}
