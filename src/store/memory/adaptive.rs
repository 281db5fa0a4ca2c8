//! The in-memory side of adaptive admission: per queue, the commit-time
//! histograms and rollback counts of the recent windows and the last
//! decision, behind one mutex, so a decision is stored once per window as
//! in `adaptive_apply.lua`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::settings::Settings;
use crate::queue::QueueName;
use crate::queue::adaptive::{MAX_EVIDENCE_WINDOWS, WindowSamples, bucket_of};
use crate::store::{AdaptiveRead, AdaptiveState, OrderSignal};

use async_trait::async_trait;

use super::{MemoryStore, now_ms};
use crate::store::{AdaptiveStore, StoreResult};

/// Windows kept at most per queue: the recent ones are all a decision
/// reads (at most [`MAX_EVIDENCE_WINDOWS`] and the current one), so a
/// queue nobody decides for cannot grow without bound.
const KEPT_WINDOWS: usize = 2 * MAX_EVIDENCE_WINDOWS as usize;

#[derive(Default)]
struct QueueAdaptive {
    windows: BTreeMap<u64, WindowSamples>,
    state: Option<AdaptiveState>,
}

/// Every queue's samples and last decision.
#[derive(Default)]
pub(super) struct Adaptive {
    inner: Mutex<HashMap<QueueName, QueueAdaptive>>,
}

impl Adaptive {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<QueueName, QueueAdaptive>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets `queue`'s samples and decision (the queue was deleted).
    pub(super) fn remove(&self, queue: &QueueName) {
        self.lock().remove(queue);
    }

    pub(super) fn record(&self, queue: &QueueName, signal: OrderSignal, window_ms: u64, now: u64) {
        let window = now / window_ms.max(1);
        let mut all = self.lock();
        let q = all.entry(queue.clone()).or_default();
        let w = q.windows.entry(window).or_insert_with(WindowSamples::empty);
        match signal {
            OrderSignal::Committed { ms } => w.buckets[bucket_of(ms)] += 1,
            OrderSignal::RolledBack => w.failures += 1,
        }
        while q.windows.len() > KEPT_WINDOWS {
            q.windows.pop_first();
        }
    }

    pub(super) fn read(&self, queue: &QueueName, window_ms: u64, now: u64) -> AdaptiveRead {
        let window = (now / window_ms.max(1)).saturating_sub(1);
        let all = self.lock();
        let q = all.get(queue);
        let state = q.and_then(|q| q.state.as_ref());
        let oldest = (window + 1).saturating_sub(MAX_EVIDENCE_WINDOWS);
        let evidence_from = state
            .filter(|s| s.window_ms == window_ms)
            .map_or(window, |s| s.evidence_from.clamp(oldest, window));
        let mut samples = WindowSamples::empty();
        if let Some(q) = q {
            for (_, w) in q.windows.range(evidence_from..=window) {
                samples.add(w);
            }
        }
        AdaptiveRead {
            now_ms: now,
            window,
            evidence_from,
            samples,
            state: q.and_then(|q| q.state.clone()),
        }
    }

    /// Stores `decision` unless one reaching as far in time is stored, or the settings moved past `version`; the adaptive lock is
    /// held across the settings write, so two callers cannot both pass.
    pub(super) fn apply(
        &self,
        settings: &Settings,
        queue: &QueueName,
        decision: &AdaptiveState,
        batch: Option<u32>,
        version: u64,
        now: u64,
    ) -> bool {
        let reach = |s: &AdaptiveState| (s.window + 1) * s.window_ms.max(1);
        let mut all = self.lock();
        let q = all.entry(queue.clone()).or_default();
        if q.state
            .as_ref()
            .is_some_and(|s| reach(s) >= reach(decision))
        {
            return false;
        }
        if !settings.set_batch_if(queue, version, batch, now) {
            return false;
        }
        q.state = Some(AdaptiveState {
            at: now,
            ..decision.clone()
        });
        q.windows.retain(|w, _| *w >= decision.evidence_from);
        true
    }
}

#[async_trait]
impl AdaptiveStore for MemoryStore {
    async fn record_order(
        &self,
        queue: &QueueName,
        signal: OrderSignal,
        window_ms: u64,
    ) -> StoreResult<()> {
        self.adaptive.record(queue, signal, window_ms, now_ms());
        Ok(())
    }

    async fn adaptive_read(&self, queue: &QueueName, window_ms: u64) -> StoreResult<AdaptiveRead> {
        Ok(self.adaptive.read(queue, window_ms, now_ms()))
    }

    async fn adaptive_apply(
        &self,
        queue: &QueueName,
        decision: &AdaptiveState,
        batch: Option<u32>,
        settings_version: u64,
        _window_ms: u64,
    ) -> StoreResult<bool> {
        Ok(self.adaptive.apply(
            &self.settings,
            queue,
            decision,
            batch,
            settings_version,
            now_ms(),
        ))
    }
}
