//! The line: joining, reading one's standing, leaving, and the admission
//! pass that turns the head of the line into entry tokens. What every
//! buyer-facing request and the admission loop use; the other capabilities
//! are for the gate, operators and background tasks.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{JoinLimits, Limited, Rate, StoreError, StoreResult};
use crate::queue::{EntryToken, Policy, QueueName, Snapshot, UserId};

/// What `enter` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnterOutcome {
    /// True when the user was not in line nor holding a token before.
    pub created: bool,
    /// The user's standing after the call (READY at once on the fast track).
    pub snapshot: Snapshot,
    /// Nothing changed: the user has no place and a lottery of the queue
    /// waits to be drawn, so the join belongs in its pre-queue
    /// ([`crate::store::LotteryStore::pre_join_limited`]). Decided in the join's own step.
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
                entries_issued: None,
            },
            pre_queue: true,
        }
    }
}

/// An entry's id and time as a store answered them earlier: an entry's
/// time never changes while the entry lasts, so a caller that holds it may
/// spare the store reading it again ([`LineStore::status_known`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownEntry {
    /// The entry (arrival sequence).
    pub entry: u64,
    /// Its entry time, store clock, ms since the epoch.
    pub entered_at_ms: u64,
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

/// Joining, standing and admission passes of a queue's line.
#[async_trait]
pub trait LineStore: Send + Sync + 'static {
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

    /// [`LineStore::enter`], checked against `limits` in the same atomic step:
    /// - a repeat join (the user has a place) past `buyer.grace_ms` spends
    ///   one from the buyer's budget, and is refused with
    ///   [`crate::store::LimitKind::Buyer`] when it is spent (the place is kept);
    /// - a join that would create a place is refused with
    ///   [`crate::store::LimitKind::AddressPlaces`] when the address already holds
    ///   `places` live places in this queue, else with
    ///   [`crate::store::LimitKind::AddressJoins`] when the address's join rate is spent;
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
    ) -> StoreResult<Result<EnterOutcome, Limited>> {
        self.enter_known(queue, user, policy, fast_track_token, limits, None)
            .await
    }

    /// [`LineStore::enter_limited`] by a caller that holds `known` (an entry
    /// of `user`'s, with its time, as this store answered it): a repeat
    /// join that finds `user` waiting with that entry carries its time
    /// without reading it again; any other join is as without it. A store
    /// whose entry times cost nothing to read ignores it.
    async fn enter_known(
        &self,
        queue: &QueueName,
        user: &UserId,
        policy: &Policy,
        fast_track_token: &EntryToken,
        limits: &JoinLimits,
        known: Option<KnownEntry>,
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

    /// [`LineStore::status`] after spending one from `user`'s request `budget`
    /// in `queue`, in the same atomic step (one round trip per poll):
    /// refused with [`crate::store::LimitKind::Buyer`], reading and touching nothing,
    /// when it is spent.
    async fn status_limited(
        &self,
        queue: &QueueName,
        user: &UserId,
        touch: bool,
        budget: Option<Rate>,
    ) -> StoreResult<Result<Snapshot, Limited>>;

    /// [`LineStore::status_limited`] without `touch`, by a caller that
    /// holds `known` (an entry's id and time this store answered with): an
    /// answer that finds `user` waiting with that entry, or holding a token
    /// issued to it, carries its time without reading it again; any other
    /// answer is as without it. A
    /// store whose entry times cost nothing to read ignores it.
    async fn status_known(
        &self,
        queue: &QueueName,
        user: &UserId,
        budget: Option<Rate>,
        known: Option<KnownEntry>,
    ) -> StoreResult<Result<Snapshot, Limited>> {
        let _ = known;
        self.status_limited(queue, user, false, budget).await
    }

    /// Reads many users' standings in one round trip (stream refreshes).
    /// Cheaper than [`LineStore::status`]: the entry time is not read
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
