//! The store: where queues, tokens and the admission budget live.
//!
//! One trait, two adapters: [`redis::RedisStore`] for production (many
//! instances, one Redis) and [`memory::MemoryStore`] for a single process
//! with nothing else installed. Every state change is atomic in both, and
//! one conformance suite (`tests/store_conformance.rs`) runs against both.

pub mod memory;
pub mod redis;

use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use crate::queue::audit::{AuditEntry, AuditId, AuditPage, AuditQuery};
use crate::queue::{
    EntryToken, Policy, QueueName, QueueSettings, Snapshot, StockReport, StoredSettings, UserId,
};

/// Why a store call failed. Both variants fail closed: callers answer `503`.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or timed out.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something this version does not understand.
    #[error("unexpected store reply: {0}")]
    Protocol(String),
}

/// The result of a store call.
pub type StoreResult<T> = Result<T, StoreError>;

/// What `enter` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnterOutcome {
    /// True when the user was not in line nor holding a token before.
    pub created: bool,
    /// The user's standing after the call (READY at once on the fast track).
    pub snapshot: Snapshot,
    /// Nothing changed: the user has no place and a lottery of the queue
    /// waits to be drawn, so the join belongs in its pre-queue
    /// ([`Store::pre_join_limited`]). Decided in the join's own step.
    pub pre_queue: bool,
}

impl EnterOutcome {
    /// The answer for a join that belongs in the pre-queue.
    pub fn pre_queue(total_waiting: u64) -> Self {
        Self {
            created: false,
            snapshot: Snapshot {
                standing: crate::queue::Standing::NotEntered,
                total_waiting,
                entered_at_ms: None,
                pass: 0,
                entry: None,
                sold_out: false,
                paused: false,
            },
            pre_queue: true,
        }
    }
}

/// One user admitted by a pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admitted {
    pub user: UserId,
    pub seq: u64,
    pub token: String,
    #[serde(rename = "ttlMs")]
    pub ttl_ms: u64,
}

/// One user dropped by a pass for not being seen for `abandonAfter`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Abandoned {
    pub user: UserId,
    pub seq: u64,
}

/// What one admission pass did, as published to every instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pass {
    /// The queue's pass counter after this pass (strictly increasing).
    pub pass: u64,
    /// When the pass ran, store clock, ms since the epoch.
    pub at: u64,
    /// Users admitted, head first.
    #[serde(default, deserialize_with = "lua_list")]
    pub admitted: Vec<Admitted>,
    /// Users dropped as absent.
    #[serde(default, deserialize_with = "lua_list")]
    pub abandoned: Vec<Abandoned>,
    /// How many still wait after the pass.
    pub waiting: u64,
    /// True when someone was waiting at the start of the pass, so the pass
    /// says something about throughput.
    pub busy: bool,
    /// True when an operator held admission: the pass admitted nobody by
    /// design, which says nothing about throughput either (absent from
    /// older instances' events: not held).
    #[serde(default)]
    pub held: bool,
}

/// A change that streams on any instance may need to hear about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum QueueEvent {
    /// An admission pass ran.
    Pass(Pass),
    /// A user left the line or gave up their token (`seq` when they waited).
    Left { user: UserId, seq: Option<u64> },
    /// A join into an empty line took the fast track: READY at once, with
    /// no pass (`at`: store clock, ms). Published so every instance counts
    /// every admission, not only those of passes.
    FastTracked { at: u64 },
    /// A user's token was used for an order.
    Consumed { user: UserId },
    /// The queue's stock ran out: every waiting stream ends `sold_out`
    /// (published once, by the report that found it gone).
    SoldOut,
    /// A lottery's draw placed its pre-queue in line: pre-queue streams
    /// re-read their standing and show their drawn place.
    Drawn,
    /// A lottery was scheduled or its opening moved: pre-queue streams
    /// show the new time.
    Rescheduled {
        #[serde(rename = "opensAt")]
        opens_at: u64,
    },
}

/// What a subscription yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreEvent {
    /// An event in `queue`.
    Queue { queue: QueueName, event: QueueEvent },
    /// The subscription was lost (a reset, or a ping left unanswered):
    /// events are missed until the `Resync` that follows its return.
    Interrupted,
    /// The subscription was interrupted and is back: events may have been
    /// lost, so every listener must re-read state from the store.
    Resync,
}

/// The outcome of claiming an entry token for one order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The token is now claimed under `claim_id` until the lease ends.
    Claimed { claim_id: String },
    /// No such token for this user (missing, wrong, foreign or expired).
    Invalid,
    /// Another order holds a live claim on it.
    InUse,
}

/// A queue's counts, for operators.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueStats {
    /// Users in line.
    pub waiting: u64,
    /// Users holding an unexpired token (what `maxActive` bounds).
    pub active: u64,
    /// The admission pass counter.
    pub pass: u64,
    /// True while an operator holds admission.
    pub paused: bool,
}

/// A queue's stock as the store keeps it (`crate::queue::stock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StockState {
    /// Units left, as last reported.
    pub remaining: u64,
    /// The most one buyer may take, as last reported.
    pub per_buyer: u64,
    /// Entry tokens used for orders since the last report.
    pub consumed_since_report: u64,
    /// Buyers holding an unexpired token.
    pub holders: u64,
    /// Buyers the stock lets admission admit now.
    pub admissible: u64,
    /// True while nothing is left: waiting buyers are told `sold_out`.
    pub sold_out: bool,
}

/// An order outcome a gate saw, counted toward adaptive admission
/// (`crate::queue::adaptive`) in the current window of the store clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderSignal {
    /// The order committed this long after its token was claimed.
    Committed { ms: u64 },
    /// The order rolled back (its claim was released).
    RolledBack,
}

/// The adaptive controller's last decision for a queue, as stored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdaptiveState {
    /// The window decided (store clock ms / `windowMs`).
    pub window: u64,
    /// The length of that window, ms: a decision covers store time up to
    /// `(window + 1) × windowMs`, which stays comparable when an operator
    /// changes the window's length.
    pub window_ms: u64,
    /// The rate decided, admissions per second.
    pub rate_per_sec: f64,
    /// Increases are held up to this window (after a cut).
    pub hold_until: u64,
    /// Why (`increase`, `decrease_slow`, `decrease_failing`, `hold`,
    /// `too_few_samples`).
    pub verdict: String,
    /// The window's p95 claim-to-commit time, ms (`null` without commits).
    pub p95_ms: Option<u64>,
    /// Commits counted in the window.
    pub commits: u64,
    /// Rollbacks counted in the window.
    pub failures: u64,
    /// When decided, store clock ms.
    pub at: u64,
    /// The first window whose orders count toward the next decision:
    /// `window + 1` once decided, earlier while a decision still gathers
    /// orders over several windows (`commits` and `failures` then count
    /// what has been gathered so far).
    pub evidence_from: u64,
}

/// What the controller reads before deciding.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveRead {
    /// The store clock, ms.
    pub now_ms: u64,
    /// The last complete window (the one to decide).
    pub window: u64,
    /// The first window of the evidence: the last decision's
    /// `evidence_from`, no earlier than
    /// [`crate::queue::adaptive::MAX_EVIDENCE_WINDOWS`] windows back, and
    /// `window` itself when the window's length changed since.
    pub evidence_from: u64,
    /// What windows `evidence_from..=window` saw, from every instance.
    pub samples: crate::queue::adaptive::WindowSamples,
    /// The last decision, `None` before the first.
    pub state: Option<AdaptiveState>,
}

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
    /// While a draw is being staged ([`Store::draw_begin`]): how long ago
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

/// What [`Store::pre_join`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreJoin {
    /// The buyer is in the pre-queue (`created` when by this call).
    Pre { entry: PreEntry, created: bool },
    /// No lottery waits to be drawn, or the buyer already has a place in
    /// line or a token: an ordinary join applies.
    Open,
}

/// What [`Store::draw`] did.
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

/// What one step of a staged draw did ([`Store::draw_begin`],
/// [`Store::draw_stage`], [`Store::draw_commit`]).
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

/// Order positions staged per call: each [`Store::draw_stage`] is
/// bounded by it (Redis here: 40–62 ms per 1,000 with the shared 2-core
/// machine at load 5–6, up to 167 ms at load 8; `loadtest/lottery-draw.sh`).
pub const DRAW_CHUNK: usize = 1_000;

/// A stage that has not moved on for this long is abandoned (its instance
/// died mid-draw): the next draw takes it over. Well above one step's
/// worst case (the client's 2 s response timeout).
pub const DRAW_ABANDON_MS: u64 = 5_000;

/// A request rate kept as a GCRA ("generic cell rate") bucket: `burst`
/// requests at once, then one every `period_ms`. A refused request costs
/// nothing and changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Milliseconds one request takes to earn back (at least 1).
    pub period_ms: u64,
    /// Requests allowed at once (at least 1).
    pub burst: u32,
}

impl Rate {
    /// `n` per minute, all at once if need be; `None` for 0 (off).
    pub fn per_minute(n: u32) -> Option<Self> {
        (n > 0).then(|| Self {
            period_ms: (60_000 / u64::from(n)).max(1),
            burst: n,
        })
    }

    /// How far ahead of now a full bucket may run.
    pub fn window_ms(&self) -> u64 {
        self.period_ms.max(1) * u64::from(self.burst.max(1))
    }

    /// One request at `now_ms` against a bucket whose "theoretical arrival
    /// time" is `tat` (ms, 0 for a new bucket): `Ok(new tat)` to store,
    /// or `Err(ms to wait)`. The same arithmetic as `gcra.lua`.
    pub fn spend(&self, tat: u64, now_ms: u64) -> Result<u64, u64> {
        let next = tat.max(now_ms) + self.period_ms.max(1);
        let ahead = next - now_ms;
        let window = self.window_ms();
        if ahead > window {
            Err(ahead - window)
        } else {
            Ok(next)
        }
    }
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// The buyer's request budget (polls, stream opens, repeat joins).
    Buyer,
    /// New places per client address per minute.
    AddressJoins,
    /// Places one client address holds at once.
    AddressPlaces,
    /// A bucket of [`Store::spend`] (new visitors per address).
    Bucket,
}

/// A request refused by a limit kept in the store; nothing was changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    /// The limit.
    pub kind: LimitKind,
    /// How long until the request would be allowed (a guess for
    /// [`LimitKind::AddressPlaces`]: places end when their buyers do).
    pub retry_after_ms: u64,
}

/// How long a refusal for places held tells the client to wait.
pub const PLACES_RETRY_MS: u64 = 10_000;

/// The per-buyer request budget as the store applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuyerBudget {
    /// The budget.
    pub rate: Rate,
    /// A repeat join within this long of its entry's creation (store
    /// clock) is a duplicate of the first and not counted.
    pub grace_ms: u64,
}

/// The limits of one client address a new place counts against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressLimits {
    /// The address's bucket name (an IPv4 address or an IPv6 /64), at most
    /// 64 characters of `[0-9a-fA-F.:/]`.
    pub key: String,
    /// New places per minute, if limited.
    pub joins: Option<Rate>,
    /// Places held at once (waiting or with a live token), if limited.
    pub places: Option<u32>,
}

/// The limits a join is checked against, in the same atomic step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinLimits {
    /// The buyer's budget, spent by a repeat join past its grace.
    pub buyer: Option<BuyerBudget>,
    /// The client address's limits, counted by a join that creates a place.
    pub address: Option<AddressLimits>,
}

/// The store port. Implementations are cheap to share (`Arc<dyn Store>`).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Puts `user` in line, or keeps their place (or token) if they have
    /// one. When nobody waits and the budget and `max_active` allow, the
    /// user goes straight to READY with `fast_track_token`. Every new entry,
    /// in line or on the fast track, takes the next entry id (the arrival
    /// sequence), reported as [`Snapshot::entry`] for as long as the entry
    /// lasts, through admission until its token is used or expires.
    async fn enter(
        &self,
        queue: &QueueName,
        user: &UserId,
        policy: &Policy,
        fast_track_token: &EntryToken,
    ) -> StoreResult<EnterOutcome> {
        self.enter_limited(
            queue,
            user,
            policy,
            fast_track_token,
            &JoinLimits::default(),
        )
        .await?
        .map_err(|l| StoreError::Protocol(format!("a join without limits was limited: {l:?}")))
    }

    /// [`Store::enter`], checked against `limits` in the same atomic step:
    /// - a repeat join (the user has a place) past `buyer.grace_ms` spends
    ///   one from the buyer's budget, and is refused with
    ///   [`LimitKind::Buyer`] when it is spent (the place is kept);
    /// - a join that would create a place is refused with
    ///   [`LimitKind::AddressPlaces`] when the address already holds
    ///   `places` live places in this queue, else with
    ///   [`LimitKind::AddressJoins`] when the address's join rate is spent;
    ///   a created place counts against both. A repeat join never counts
    ///   against the address.
    ///
    /// A refusal changes nothing.
    async fn enter_limited(
        &self,
        queue: &QueueName,
        user: &UserId,
        policy: &Policy,
        fast_track_token: &EntryToken,
        limits: &JoinLimits,
    ) -> StoreResult<Result<EnterOutcome, Limited>>;

    /// Reads `user`'s standing, token first. With `touch`, also marks them
    /// as seen (a poll keeps an absent user from being dropped).
    async fn status(&self, queue: &QueueName, user: &UserId, touch: bool) -> StoreResult<Snapshot> {
        self.status_limited(queue, user, touch, None)
            .await?
            .map_err(|l| {
                StoreError::Protocol(format!("a read without a budget was limited: {l:?}"))
            })
    }

    /// [`Store::status`] after spending one from `user`'s request `budget`
    /// in `queue`, in the same atomic step (one round trip per poll):
    /// refused with [`LimitKind::Buyer`], reading and touching nothing,
    /// when it is spent.
    async fn status_limited(
        &self,
        queue: &QueueName,
        user: &UserId,
        touch: bool,
        budget: Option<Rate>,
    ) -> StoreResult<Result<Snapshot, Limited>>;

    /// Spends one from the shared bucket `bucket` (a name of
    /// `[A-Za-z0-9:./_-]`, at most 100 characters) at `rate`: `Ok` if it
    /// had room, else refused with [`LimitKind::Bucket`]. Every instance
    /// sharing the store shares the bucket.
    async fn spend(&self, bucket: &str, rate: Rate) -> StoreResult<Result<(), Limited>>;

    /// Reads many users' standings in one round trip (stream refreshes).
    /// Cheaper than [`Store::status`]: the entry time is not read
    /// (`entered_at_ms` is `None` for waiting users).
    async fn statuses(&self, queue: &QueueName, users: &[UserId]) -> StoreResult<Vec<Snapshot>>;

    /// Marks waiting users as seen (open streams), in one write.
    async fn touch(&self, queue: &QueueName, users: &[UserId]) -> StoreResult<()>;

    /// Gives up `user`'s `entry`: takes them out of line, or drops the
    /// token it was admitted with. True if `entry` was their current entry;
    /// false, changing nothing, if they have no entry or a different one (a
    /// ticket for an old entry cannot remove a newer place).
    async fn leave(&self, queue: &QueueName, user: &UserId, entry: u64) -> StoreResult<bool>;

    /// One admission pass: refills the shared budget, drops absent users,
    /// admits the head of the line with `tokens` (one per admitted user, at
    /// most `policy.batch` are used), and publishes the pass.
    async fn admit(
        &self,
        queue: &QueueName,
        policy: &Policy,
        tokens: &[EntryToken],
    ) -> StoreResult<Pass>;

    /// Claims `user`'s token for one order if `presented` matches it and no
    /// live claim holds it; the claim is a lease of `lease_ms`, and the
    /// token lives at least until the lease ends.
    async fn claim(
        &self,
        queue: &QueueName,
        user: &UserId,
        presented: &str,
        lease_ms: u64,
    ) -> StoreResult<ClaimOutcome>;

    /// The user whose live (unexpired, unused) token `presented` is, if
    /// any, so the token API can claim with the token alone. Only a
    /// look-up: [`Store::claim`] checks the token again, atomically, when
    /// it claims.
    async fn token_holder(&self, queue: &QueueName, presented: &str)
    -> StoreResult<Option<UserId>>;

    /// Deletes the token claimed under `claim_id` (the order committed) and
    /// frees the user's active slot. Idempotent, so it can be retried at
    /// any time, also long after the order (a recorded consume finished
    /// after a restart):
    /// - `true`: deleted now. The claim's lease need not be live: a lapsed
    ///   claim still deletes its token while no newer claim holds it.
    /// - `false`: nothing for this claim to delete: the token is gone
    ///   (consumed already, expired, left) or a newer claim holds it (that
    ///   order settles it). Either way the caller is done.
    /// - `Err`: the store did not answer; whether it deleted is unknown,
    ///   and retrying is safe.
    async fn consume(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool>;

    /// Returns a claimed token to READY (the order rolled back). True if the
    /// claim was still held.
    async fn release(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool>;

    /// The queue's counts.
    async fn stats(&self, queue: &QueueName) -> StoreResult<QueueStats>;

    /// Takes `queue`'s admission turn for `hold_ms`: true when this store
    /// holds it now (it was free, had lapsed, or was this store's own, now
    /// held again), false while another instance's hold lasts. The
    /// admission loop passes only on its turn, so instances sharing a store
    /// make one pass an interval between them, not one each: every pass
    /// sends each waiting stream a rank update. A store of one instance
    /// always has the turn.
    async fn take_pass_turn(&self, queue: &QueueName, hold_ms: u64) -> StoreResult<bool>;

    /// Holds (`true`) or resumes admission of `queue`, for every instance:
    /// while held, passes admit nobody and enters take no fast track; the
    /// line, presence and tokens already issued carry on. True if changed.
    async fn set_paused(&self, queue: &QueueName, paused: bool) -> StoreResult<bool>;

    /// Links `queue` to an order service's stock, or updates it: records
    /// `report` (forgetting the tokens used since the last one) and answers
    /// the state after it. From then on passes and the fast track admit no
    /// more buyers than [`crate::queue::stock::admissible`] allows. A report
    /// of nothing left marks the queue sold out and publishes
    /// [`QueueEvent::SoldOut`] once; a later report of units left reopens
    /// the line for everyone still in it, in their order.
    async fn set_stock(&self, queue: &QueueName, report: StockReport) -> StoreResult<StockState>;

    /// The stock of `queue`, `None` while no order service reported one.
    async fn stock(&self, queue: &QueueName) -> StoreResult<Option<StockState>>;

    /// Answers when the store is reachable.
    async fn ping(&self) -> StoreResult<()>;

    /// Every queue event of `queues`, from every instance, plus `Resync`
    /// after an interruption. The stream ends only when the store is dropped.
    fn subscribe(&self, queues: &[QueueName]) -> BoxStream<'static, StoreEvent>;

    /// Extends a live order's claim: if `claim_id` still holds `user`'s
    /// token (not consumed, released, expired or taken over by a newer
    /// claim), the lease runs `lease_ms` from now and the token lives at
    /// least as long. True if it held. A working order keeps its claim by
    /// calling this well within the lease; a dead one's claim lapses.
    async fn renew_claim(
        &self,
        queue: &QueueName,
        user: &UserId,
        claim_id: &str,
        lease_ms: u64,
    ) -> StoreResult<bool>;

    // --- Proof of work at the door (join challenges, `crate::challenge`) ---

    /// Remembers `key` in `queue` for `ttl_ms` and answers true the first
    /// time; false, changing nothing, while it is remembered. One atomic
    /// step shared by every instance: of many concurrent calls with one key,
    /// exactly one gets true (a solved join challenge is spent once).
    async fn spend_once(&self, queue: &QueueName, key: &str, ttl_ms: u64) -> StoreResult<bool>;

    /// Adds `joins` (join requests one instance saw since its last call,
    /// about a second's worth) to `queue`'s join counter of the current
    /// store second. When the busier of this second and the last one holds
    /// more than `threshold` joins, the queue's challenge switch is (re)set
    /// on for `hold_ms`. Answers how many ms the switch stays on (0: off),
    /// so every instance that calls it agrees on the switch.
    async fn note_joins(
        &self,
        queue: &QueueName,
        joins: u64,
        threshold: u64,
        hold_ms: u64,
    ) -> StoreResult<u64>;

    // --- Live queue settings (the admin API, every instance's catalog) ---

    /// Every queue that has settings, in name order.
    async fn list_queues(&self) -> StoreResult<Vec<QueueName>>;

    /// `queue`'s settings, `None` when it has none (no such queue).
    async fn queue_settings(&self, queue: &QueueName) -> StoreResult<Option<StoredSettings>>;

    /// Writes `queue`'s settings and lists the queue, bumping the version
    /// and stamping the store clock in one atomic step. With `only_if_new`,
    /// writes nothing when the queue has settings already (instances that
    /// start together seed a queue once). Answers the settings now stored
    /// and whether they were written. From the next pass on, [`Store::admit`]
    /// runs on the stored batch, interval, `maxActive`, token TTL and
    /// abandonment, whatever policy its caller passes.
    async fn put_queue_settings(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
        only_if_new: bool,
    ) -> StoreResult<(StoredSettings, bool)>;

    /// Records that `instance` (an id of 1-100 printable ASCII characters)
    /// holds `streams` open streams, for `ttl_ms`, and answers every
    /// instance's last live report (its own included), by id: what the
    /// operator console shows as streams per instance. An instance that
    /// stopped reporting drops out once its report is older than its TTL.
    async fn report_streams(
        &self,
        instance: &str,
        streams: u64,
        ttl_ms: u64,
    ) -> StoreResult<Vec<(String, u64)>>;

    // --- Adaptive admission (`crate::queue::adaptive`) ---

    /// Counts `signal` in `queue`'s current window of `window_ms` (store
    /// clock); windows are kept a few minutes at most.
    async fn record_order(
        &self,
        queue: &QueueName,
        signal: OrderSignal,
        window_ms: u64,
    ) -> StoreResult<()>;

    /// The last complete window of `window_ms`, the samples of the
    /// evidence that ends with it (see [`AdaptiveRead::evidence_from`])
    /// and the last decision, in one atomic read.
    async fn adaptive_read(&self, queue: &QueueName, window_ms: u64) -> StoreResult<AdaptiveRead>;

    /// Records `decision` (for `decision.window`) and, with `batch`, sets
    /// the queue's stored batch (bumping its version), in one atomic step
    /// that does nothing and answers false when a decision covering as far
    /// (see [`AdaptiveState::window_ms`]) is stored already (another
    /// instance decided this window), or the
    /// settings' version is no longer `settings_version` (an operator wrote
    /// them meanwhile). Forgets the samples of windows before
    /// `decision.evidence_from`;
    /// `window_ms` says how long the decision is worth keeping.
    async fn adaptive_apply(
        &self,
        queue: &QueueName,
        decision: &AdaptiveState,
        batch: Option<u32>,
        settings_version: u64,
        window_ms: u64,
    ) -> StoreResult<bool>;

    /// Unlists `queue` and deletes its settings, line, presence, budget and
    /// hold. The entry and pass counters stay (a re-opened queue never
    /// hands out an old entry id or event id again), and tokens already
    /// issued live out their TTL. True if it had settings.
    async fn delete_queue(&self, queue: &QueueName) -> StoreResult<bool>;

    // --- The audit log (`crate::queue::audit`) and its webhook groups ---

    /// A page of `queue`'s audit log, oldest first: entries after
    /// `query.after`, of `query.kind` if given. The log is written by the
    /// same atomic step as each action (admit, fast track, consume,
    /// release, leave, abandonment, sold out) and keeps about the
    /// configured number of entries per queue, the oldest dropped first.
    async fn audit_page(&self, queue: &QueueName, query: AuditQuery) -> StoreResult<AuditPage>;

    /// Takes entries of `queue`'s log for delivery through `group` (one
    /// group per webhook, created at `start` on first use, so it sees the
    /// entries after `start`) by `consumer` (an instance): first those
    /// another consumer took and left unacknowledged for more than
    /// `idle_ms` (a dead instance's), then entries no consumer of the group
    /// was given yet, at most about `count` of each. Every entry goes to
    /// one consumer at a time and stays pending until acknowledged.
    async fn audit_take(
        &self,
        queue: &QueueName,
        group: &str,
        start: AuditId,
        consumer: &str,
        idle_ms: u64,
        count: usize,
    ) -> StoreResult<Vec<AuditEntry>>;

    /// Keeps `ids` with `consumer` and restarts their idle time, so a
    /// consumer still retrying them does not lose them to
    /// [`Store::audit_take`]'s claim of idle entries.
    async fn audit_hold(
        &self,
        queue: &QueueName,
        group: &str,
        consumer: &str,
        ids: &[AuditId],
    ) -> StoreResult<()>;

    /// Acknowledges `ids` in `group`: delivered (or given up), never handed
    /// out again.
    async fn audit_ack(&self, queue: &QueueName, group: &str, ids: &[AuditId]) -> StoreResult<()>;
    // --- Scheduled opening with a lottery (`crate::queue::lottery`) ---

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

    /// [`Store::pre_join`], checked against the client `address`'s limits
    /// in the same atomic step, exactly as [`Store::enter_limited`] checks a
    /// new place: a new pre-queue entry is refused with
    /// [`LimitKind::AddressPlaces`] when the address holds `places` live
    /// places (pre-queue entries count, and keep counting through the draw
    /// as the places it gives), else with [`LimitKind::AddressJoins`] when
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

/// A shared store handle.
pub type SharedStore = Arc<dyn Store>;

/// A fresh draw id: this process's id (which instance holds a stage shows
/// in the store) and a random part.
pub fn new_draw_id() -> String {
    format!("{}-{:016x}", std::process::id(), rand::random::<u64>())
}

/// Applies a computed draw as draw `id` in steps of `chunk` positions:
/// [`Store::draw_begin`], [`Store::draw_stage`] per chunk, then
/// [`Store::draw_commit`]. Whatever step ends it early leaves nothing a
/// buyer sees: a stage left behind (this process died, or the store
/// failed) is taken over by the next draw after [`DRAW_ABANDON_MS`].
pub async fn draw_in_steps<S: Store + ?Sized>(
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

/// Where a new entry counter starts: at a random point, so entry ids are not
/// handed out again after a restart or a loss of data (a ticket signed for
/// an old entry must never match a new one); below 2^40 so ids stay exact
/// in JSON encoded by Lua's cjson (14 significant digits).
pub(crate) fn first_entry_id() -> u64 {
    rand::random_range(1..1u64 << 40)
}

/// Lua's cjson encodes an empty table as `{}`; accept that as an empty list.
fn lua_list<'de, D, T>(de: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrEmpty<T> {
        List(Vec<T>),
        Empty(serde_json::Map<String, serde_json::Value>),
    }
    match ListOrEmpty::<T>::deserialize(de)? {
        ListOrEmpty::List(v) => Ok(v),
        ListOrEmpty::Empty(m) if m.is_empty() => Ok(Vec::new()),
        ListOrEmpty::Empty(_) => Err(serde::de::Error::custom("expected a list")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_allows_its_burst_then_one_a_period() {
        let r = Rate::per_minute(3).unwrap();
        assert_eq!((r.period_ms, r.burst, r.window_ms()), (20_000, 3, 60_000));
        let now = 1_000_000;
        let mut tat = 0;
        for _ in 0..3 {
            tat = r.spend(tat, now).unwrap();
        }
        assert_eq!(r.spend(tat, now), Err(20_000));
        assert_eq!(r.spend(tat, now + 19_999), Err(1));
        assert!(r.spend(tat, now + 20_000).is_ok());
        assert!(Rate::per_minute(0).is_none());
        assert_eq!(Rate::per_minute(120_000).unwrap().period_ms, 1);
    }

    #[test]
    fn pass_from_lua_json_with_empty_tables() {
        let raw = r#"{"kind":"pass","pass":3,"at":17,"admitted":{},"abandoned":{},"waiting":0,"busy":false}"#;
        let ev: QueueEvent = serde_json::from_str(raw).unwrap();
        match ev {
            QueueEvent::Pass(p) => {
                assert_eq!(p.pass, 3);
                assert!(p.admitted.is_empty());
            }
            other => panic!("{other:?}"),
        }
        let raw = r#"{"kind":"left","user":"a","seq":null}"#;
        let ev: QueueEvent = serde_json::from_str(raw).unwrap();
        assert_eq!(
            ev,
            QueueEvent::Left {
                user: UserId::parse("a").unwrap(),
                seq: None
            }
        );
        // A user id that is not one makes the event unreadable rather than
        // reaching a stream as text.
        let raw = r#"{"kind":"consumed","user":"no such user!"}"#;
        assert!(serde_json::from_str::<QueueEvent>(raw).is_err());
    }
}
