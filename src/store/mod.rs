//! The store: where queues, tokens and the admission budget live.
//!
//! One port, two adapters: [`redis::RedisStore`] for production (many
//! instances, one Redis) and [`memory::MemoryStore`] for a single process
//! with nothing else installed. Every state change is atomic in both, and
//! one conformance suite (`tests/store_conformance/`) runs against both.
//!
//! The port is cut by capability, each trait in its own module beside the
//! types it speaks in: [`LineStore`] (joins, standing, admission passes),
//! [`ClaimStore`] (orders taking tokens), [`LimitStore`], [`ChallengeStore`],
//! [`SettingsStore`], [`StockStore`], [`AdaptiveStore`], [`AuditStore`],
//! [`LotteryStore`], [`EventStore`], [`SessionStore`] (a protected site's
//! sessions) and [`FairnessLogStore`] (the public admission log). Each
//! consumer names the one or two
//! it uses (the webhook deliverer holds an `Arc<dyn AuditStore>` and so
//! cannot admit anyone), and each adapter implements each capability in a
//! file of the same name. [`Store`] is their sum, for the composition root
//! and the tests; an `Arc<dyn Store>` converts to any narrower handle
//! (trait upcasting).

pub mod adaptive;
pub mod audit;
pub mod challenge;
pub mod claims;
pub mod events;
pub mod fairness;
pub mod limits;
pub mod line;
pub mod lottery;
pub mod memory;
pub mod redis;
pub mod sessions;
pub mod settings;
pub mod stock;

use std::sync::Arc;

pub use adaptive::{AdaptiveRead, AdaptiveState, AdaptiveStore, OrderSignal};
pub use audit::AuditStore;
pub use challenge::ChallengeStore;
pub use claims::{ClaimOutcome, ClaimStore};
pub use events::{EventStore, QueueEvent, StoreEvent};
pub use fairness::{FairnessLogStore, LogAppend, LogState};
pub use limits::{
    AddressLimits, BuyerBudget, JoinLimits, LimitKind, LimitStore, Limited, PLACES_RETRY_MS, Rate,
};
pub use line::{Abandoned, Admitted, EnterOutcome, KnownEntry, LineStore, Pass, QueueStats};
pub use lottery::{
    DRAW_ABANDON_MS, DRAW_CHUNK, DrawOutcome, DrawStep, LotteryRefusal, LotteryState, LotteryStore,
    PreEntry, PreJoin, draw_in_steps, new_draw_id,
};
pub use sessions::{
    ENDED_PAGE, ENDED_SLOT_HOLD_MS, EndedPage, EndedSession, SessionLimits, SessionPolicy,
    SessionStart, SessionStore,
};
pub use settings::SettingsStore;
pub use stock::{StockState, StockStore};

/// Why a store call failed. Both variants fail closed: callers answer `503`.
/// `Clone`, so one failed call can fail each of the joins grouped in it.
#[derive(Debug, Clone, thiserror::Error)]
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

/// The whole store port: every capability. Implemented for every type
/// that implements them all, so an adapter only implements the parts.
pub trait Store:
    LineStore
    + ClaimStore
    + LimitStore
    + ChallengeStore
    + SettingsStore
    + StockStore
    + AdaptiveStore
    + AuditStore
    + LotteryStore
    + EventStore
    + FairnessLogStore
    + GateStore
    + SessionStore
{
}

impl<T> Store for T where
    T: LineStore
        + ClaimStore
        + LimitStore
        + ChallengeStore
        + SettingsStore
        + StockStore
        + AdaptiveStore
        + AuditStore
        + LotteryStore
        + EventStore
        + SessionStore
        + FairnessLogStore
        + ?Sized
{
}

/// What the order gate uses: claims, and adaptive admission's counting of
/// their outcomes. A trait of its own because a trait object names one
/// trait (`dyn ClaimStore + AdaptiveStore` is not a type); a supertrait
/// of [`Store`], so an `Arc<dyn Store>` converts to an `Arc<dyn GateStore>`.
pub trait GateStore: ClaimStore + AdaptiveStore {}

impl<T: ClaimStore + AdaptiveStore + ?Sized> GateStore for T {}

/// A shared store handle, every capability.
pub type SharedStore = Arc<dyn Store>;

/// Where a new entry counter starts: at a random point, so entry ids are not
/// handed out again after a restart or a loss of data (a ticket signed for
/// an old entry must never match a new one); below 2^40 so ids stay exact
/// in JSON encoded by Lua's cjson (14 significant digits).
pub(crate) fn first_entry_id() -> u64 {
    rand::random_range(1..1u64 << 40)
}
