//! Rate buckets (GCRA "theoretical arrival times", ms) of the memory store.

use std::collections::HashMap;
use std::hash::Hash;

use crate::store::Rate;

use async_trait::async_trait;

use super::{MemoryStore, now_ms};
use crate::store::{LimitKind, LimitStore, Limited, StoreResult};

/// How often full buckets are forgotten.
const SWEEP_BUCKETS_MS: u64 = 30_000;

/// Buckets by name, forgetting full ones every [`SWEEP_BUCKETS_MS`] so the
/// table does not grow with every buyer and address ever seen (a full
/// bucket and none are the same).
pub(super) struct Buckets<K = String> {
    tat: HashMap<K, u64>,
    swept_at: u64,
}

impl<K> Default for Buckets<K> {
    fn default() -> Self {
        Self {
            tat: HashMap::new(),
            swept_at: 0,
        }
    }
}

impl<K: Hash + Eq> Buckets<K> {
    /// One request against `key`'s bucket: `Err(ms to wait)` when refused.
    pub fn spend(&mut self, key: K, rate: Rate, now: u64) -> Result<(), u64> {
        if now >= self.swept_at + SWEEP_BUCKETS_MS {
            self.tat.retain(|_, tat| *tat > now);
            self.swept_at = now;
        }
        let tat = self.tat.get(&key).copied().unwrap_or(0);
        let next = rate.spend(tat, now)?;
        self.tat.insert(key, next);
        Ok(())
    }

    /// Takes `key`'s bucket out (its tat; 0 for none).
    pub fn take(&mut self, key: &K) -> u64 {
        self.tat.remove(key).unwrap_or(0)
    }

    /// Puts back a bucket [`Buckets::take`] took.
    pub fn restore(&mut self, key: K, tat: u64) {
        if tat > 0 {
            self.tat.insert(key, tat);
        }
    }
}

#[async_trait]
impl LimitStore for MemoryStore {
    async fn spend(&self, bucket: &str, rate: Rate) -> StoreResult<Result<(), Limited>> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        Ok(buckets
            .spend(bucket.to_owned(), rate, now_ms())
            .map_err(|wait| Limited {
                kind: LimitKind::Bucket,
                retry_after_ms: wait,
            }))
    }
}
