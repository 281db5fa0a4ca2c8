//! Adaptive admission's memory (`crate::queue::adaptive` has the rules):
//! order outcomes counted per window by every gate, and the controller's
//! last decision, kept in the store so every instance decides from the
//! same evidence and only one decision per window counts.

use async_trait::async_trait;
use serde::Serialize;

use super::StoreResult;
use crate::queue::QueueName;

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

/// Order outcomes per window and the adaptive controller's decisions.
#[async_trait]
pub trait AdaptiveStore: Send + Sync + 'static {
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
}
