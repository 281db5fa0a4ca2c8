//! The in-memory side of proof of work at the door: spent challenges and
//! the join-rate switch, for a single process.
//!
//! Kept apart from the queue data (its own mutex), so checking a challenge
//! never waits on a queue's lock. Spent keys are pruned as they expire, a
//! bounded amount per call, so the map holds only what is still remembered.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use crate::queue::QueueName;

use async_trait::async_trait;

use super::{MemoryStore, now_ms};
use crate::store::{ChallengeStore, StoreResult};

/// Spent keys pruned per call at most, so one call stays short however
/// many expired at once (the rest go on the next calls).
const PRUNE_LIMIT: usize = 256;

/// Spent challenges and join counts of every queue.
#[derive(Default)]
pub(super) struct Door {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// (queue, key) → until (ms).
    spent: HashMap<(QueueName, String), u64>,
    /// The same by expiry, for pruning.
    spent_order: BTreeSet<(u64, QueueName, String)>,
    rates: HashMap<QueueName, Rate>,
}

/// One queue's join counts: this store second's and the last one's, and
/// until when the challenge switch is on.
#[derive(Default)]
struct Rate {
    second: u64,
    current: u64,
    previous: u64,
    on_until: u64,
}

impl Door {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// See [`crate::store::Store::spend_once`].
    pub(super) fn spend_once(&self, queue: &QueueName, key: &str, ttl_ms: u64, now: u64) -> bool {
        let mut inner = self.lock();
        inner.prune(now);
        let id = (queue.clone(), key.to_owned());
        if inner.spent.get(&id).is_some_and(|&until| until > now) {
            return false;
        }
        let until = now + ttl_ms.max(1);
        if let Some(old) = inner.spent.insert(id, until) {
            inner
                .spent_order
                .remove(&(old, queue.clone(), key.to_owned()));
        }
        inner
            .spent_order
            .insert((until, queue.clone(), key.to_owned()));
        true
    }

    /// See [`crate::store::Store::note_joins`].
    pub(super) fn note_joins(
        &self,
        queue: &QueueName,
        joins: u64,
        threshold: u64,
        hold_ms: u64,
        now: u64,
    ) -> u64 {
        let mut inner = self.lock();
        let rate = inner.rates.entry(queue.clone()).or_default();
        let second = now / 1000;
        if rate.second == second {
            rate.current += joins;
        } else {
            rate.previous = if rate.second + 1 == second {
                rate.current
            } else {
                0
            };
            rate.current = joins;
            rate.second = second;
        }
        if rate.current.max(rate.previous) > threshold {
            rate.on_until = now + hold_ms;
        }
        rate.on_until.saturating_sub(now)
    }
}

impl Inner {
    fn prune(&mut self, now: u64) {
        for _ in 0..PRUNE_LIMIT {
            let Some(first) = self.spent_order.first() else {
                return;
            };
            if first.0 > now {
                return;
            }
            let (_, queue, key) = self.spent_order.pop_first().expect("checked above");
            self.spent.remove(&(queue, key));
        }
    }
}

#[async_trait]
impl ChallengeStore for MemoryStore {
    async fn spend_once(&self, queue: &QueueName, key: &str, ttl_ms: u64) -> StoreResult<bool> {
        Ok(self.door.spend_once(queue, key, ttl_ms, now_ms()))
    }

    async fn note_joins(
        &self,
        queue: &QueueName,
        joins: u64,
        threshold: u64,
        hold_ms: u64,
    ) -> StoreResult<u64> {
        Ok(self
            .door
            .note_joins(queue, joins, threshold, hold_ms, now_ms()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> QueueName {
        QueueName::parse("default").unwrap()
    }

    #[test]
    fn spent_keys_are_pruned_once_expired() {
        let door = Door::default();
        for i in 0..10 {
            assert!(door.spend_once(&q(), &format!("k{i}"), 100, 1_000));
        }
        assert!(!door.spend_once(&q(), "k3", 100, 1_099));
        assert!(door.spend_once(&q(), "k3", 100, 1_100), "expired");
        // Everything but the re-spent k3 is gone from both maps.
        let inner = door.lock();
        assert_eq!(inner.spent.len(), 1);
        assert_eq!(inner.spent_order.len(), 1);
    }

    #[test]
    fn the_switch_follows_the_busier_of_two_seconds() {
        let door = Door::default();
        assert_eq!(
            door.note_joins(&q(), 5, 5, 1_000, 10_000),
            0,
            "at, not over"
        );
        assert_eq!(
            door.note_joins(&q(), 1, 5, 1_000, 10_500),
            1_000,
            "6 in one second"
        );
        assert_eq!(
            door.note_joins(&q(), 0, 5, 1_000, 11_000),
            1_000,
            "last second was 6"
        );
        assert_eq!(
            door.note_joins(&q(), 0, 5, 1_000, 11_800),
            1_000,
            "still: last second was 6"
        );
        assert_eq!(
            door.note_joins(&q(), 0, 5, 1_000, 12_500),
            300,
            "held, not renewed"
        );
        assert_eq!(
            door.note_joins(&q(), 0, 5, 1_000, 13_000),
            0,
            "off after the hold"
        );
    }
}
