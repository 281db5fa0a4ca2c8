//! Sessions on a protected site: what an admission pass stands for.
//!
//! An admitted buyer's entry token is exchanged for a session in one step
//! ([`SessionStore::start_session`]): the slot they hold under the queue's
//! `maxActive` passes from the token to the session, so admission never
//! sees it free in between and lets in no more than the free slots. A
//! session lives while it is used: activity (reported in batches, never
//! per request) moves its deadline to `idle` from now, up to the pass's
//! expiry; past its deadline it is *ended*. An operator may end one at
//! once. Every ended session goes into the queue's ended log, which every
//! instance reads in the background into its local set
//! ([`crate::pass::EndedSessions`]), so a pass whose session ended is
//! refused everywhere, with no store call on a checked request. Its slot
//! frees for the next in line only [`ENDED_SLOT_HOLD_MS`] after the end
//! is logged, once every instance refuses the pass.

use async_trait::async_trait;

use super::StoreResult;
use crate::queue::{QueueName, SessionId, UserId};

/// How long sessions last, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// A session with no activity for this long ends.
    pub idle_ms: u64,
    /// No session lasts longer than this from its start (the pass's
    /// expiry), however active.
    pub max_ms: u64,
}

/// How long sessions last in each queue: the global limits, and the
/// queues (their rooms, their `[queues.<name>]` tables) that set their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPolicy {
    pub default: SessionLimits,
    pub by_queue: std::collections::HashMap<QueueName, SessionLimits>,
}

/// The configuration's defaults (`--session-idle-secs 300`,
/// `--session-max-secs 3600`), for state built without one.
impl Default for SessionPolicy {
    fn default() -> Self {
        Self::uniform(SessionLimits {
            idle_ms: 300_000,
            max_ms: 3_600_000,
        })
    }
}

impl SessionPolicy {
    /// The same limits in every queue.
    pub fn uniform(limits: SessionLimits) -> Self {
        Self {
            default: limits,
            by_queue: Default::default(),
        }
    }

    /// `queue`'s limits.
    pub fn for_queue(&self, queue: &QueueName) -> SessionLimits {
        self.by_queue.get(queue).copied().unwrap_or(self.default)
    }

    /// The longest any session may last, ms (how long a retired pass key
    /// must still be accepted).
    pub fn longest_ms(&self) -> u64 {
        self.by_queue
            .values()
            .map(|l| l.max_ms)
            .fold(self.default.max_ms, u64::max)
    }
}

/// What [`SessionStore::start_session`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionStart {
    /// A new session: the buyer's entry token is spent.
    Started { id: SessionId, exp_ms: u64 },
    /// The buyer's session already runs: the same one again (a second
    /// tab, a lost cookie), with its own expiry.
    Live { id: SessionId, exp_ms: u64 },
    /// The buyer holds no live entry token of this entry (not admitted
    /// yet, the token expired or was used, another entry).
    NotAdmitted,
}

/// A session in a queue's ended log: refused until its pass expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndedSession {
    pub id: SessionId,
    /// When its pass expires, ms since the epoch.
    pub exp_ms: u64,
}

/// A page of a queue's ended log and where the next read starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndedPage {
    pub ended: Vec<EndedSession>,
    /// Pass it to the next read (opaque: a stream id in Redis).
    pub cursor: String,
}

/// Ended sessions read at most per call.
pub const ENDED_PAGE: usize = 1000;

/// How long a session's slot stays taken after its end is logged, ms.
/// Every instance reads the ended log once a second
/// (`crate::tasks::sessions`) and refuses the pass from then on; freeing
/// the slot at once would let admission hand it to the next buyer while
/// instances that have not read the end yet still let the old pass
/// through, two visitors in one slot. Two reads' worth covers a late
/// tick. A session's slot is also held this long past its idle deadline,
/// so admission never frees it before the end is logged.
pub const ENDED_SLOT_HOLD_MS: u64 = 2_000;

/// Sessions: start, activity, idle end, an operator's end, the count of
/// live ones and the ended log.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Starts a session `id` for `user`, admitted to `queue` with entry
    /// `entry` (their ticket's), spending their entry token; or returns
    /// their live session.
    async fn start_session(
        &self,
        queue: &QueueName,
        user: &UserId,
        entry: u64,
        id: &SessionId,
        limits: SessionLimits,
    ) -> StoreResult<SessionStart>;

    /// Reports activity of `ids` now: each live one's deadline moves to
    /// `idle_ms` from now (never past its expiry). The number extended.
    async fn touch_sessions(
        &self,
        queue: &QueueName,
        ids: &[SessionId],
        idle_ms: u64,
    ) -> StoreResult<usize>;

    /// Ends the sessions past their deadline (a bounded number per call),
    /// logging them; their slots free [`ENDED_SLOT_HOLD_MS`] later. The
    /// number ended.
    async fn sweep_sessions(&self, queue: &QueueName) -> StoreResult<usize>;

    /// Ends session `id` now (an operator), its slot free
    /// [`ENDED_SLOT_HOLD_MS`] later; false if it was not live.
    async fn end_session(&self, queue: &QueueName, id: &SessionId) -> StoreResult<bool>;

    /// Sessions live in `queue` (deadline not past).
    async fn live_sessions(&self, queue: &QueueName) -> StoreResult<u64>;

    /// The ended log after `cursor` (`None`: from its start), at most
    /// [`ENDED_PAGE`] entries. Entries are kept at least as long as the
    /// longest session.
    async fn ended_sessions(
        &self,
        queue: &QueueName,
        cursor: Option<&str>,
    ) -> StoreResult<EndedPage>;
}
