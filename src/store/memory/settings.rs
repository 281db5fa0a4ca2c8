//! The in-memory side of live queue settings: one map of queue → settings
//! for a single process, behind its own mutex (and the streams report of
//! the operator console, trivially this one instance's).
//!
//! `admit` reads a queue's stored policy here at the start of each pass,
//! so a change applies from the very next pass, as in the Redis adapter.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::queue::{Policy, QueueName, QueueSettings, StoredSettings};

use async_trait::async_trait;

use super::{MemoryStore, now_ms};
use crate::store::{SettingsStore, StoreResult};

/// Every queue's settings, in name order, and every instance's stream
/// report (id → streams, until ms).
#[derive(Default)]
pub(super) struct Settings {
    inner: Mutex<BTreeMap<QueueName, StoredSettings>>,
    streams: Mutex<BTreeMap<String, (u64, u64)>>,
}

impl Settings {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<QueueName, StoredSettings>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn list(&self) -> Vec<QueueName> {
        self.lock().keys().cloned().collect()
    }

    pub(super) fn get(&self, queue: &QueueName) -> Option<StoredSettings> {
        self.lock().get(queue).cloned()
    }

    /// The policy a pass of `queue` runs on: the stored one, else `asked`.
    pub(super) fn policy(&self, queue: &QueueName, asked: &Policy) -> Policy {
        self.lock()
            .get(queue)
            .map_or_else(|| asked.clone(), |s| s.settings.policy())
    }

    pub(super) fn put(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
        only_if_new: bool,
        now: u64,
    ) -> (StoredSettings, bool) {
        let mut all = self.lock();
        if only_if_new && let Some(existing) = all.get(queue) {
            return (existing.clone(), false);
        }
        let version = all.get(queue).map_or(0, |s| s.version) + 1;
        let stored = StoredSettings {
            settings: settings.clone(),
            version,
            updated_at: now,
        };
        all.insert(queue.clone(), stored.clone());
        (stored, true)
    }

    /// Sets `queue`'s batch (if given and different, bumping the version)
    /// when its settings are still at `version`; false, changing nothing,
    /// when they are not (or are gone).
    pub(super) fn set_batch_if(
        &self,
        queue: &QueueName,
        version: u64,
        batch: Option<u32>,
        now: u64,
    ) -> bool {
        let mut all = self.lock();
        let Some(stored) = all.get_mut(queue) else {
            return false;
        };
        if stored.version != version {
            return false;
        }
        if let Some(batch) = batch.filter(|b| *b != stored.settings.batch) {
            stored.settings.batch = batch;
            stored.version += 1;
            stored.updated_at = now;
        }
        true
    }

    pub(super) fn report_streams(
        &self,
        instance: &str,
        streams: u64,
        until: u64,
        now: u64,
    ) -> Vec<(String, u64)> {
        let mut all = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        all.insert(instance.to_owned(), (streams, until));
        all.retain(|_, (_, until)| *until > now);
        all.iter().map(|(id, (n, _))| (id.clone(), *n)).collect()
    }

    pub(super) fn remove(&self, queue: &QueueName) -> bool {
        self.lock().remove(queue).is_some()
    }
}

#[async_trait]
impl SettingsStore for MemoryStore {
    async fn list_queues(&self) -> StoreResult<Vec<QueueName>> {
        Ok(self.settings.list())
    }

    async fn queue_settings(&self, queue: &QueueName) -> StoreResult<Option<StoredSettings>> {
        Ok(self.settings.get(queue))
    }

    async fn put_queue_settings(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
        only_if_new: bool,
    ) -> StoreResult<(StoredSettings, bool)> {
        Ok(self.settings.put(queue, settings, only_if_new, now_ms()))
    }

    async fn delete_queue(&self, queue: &QueueName) -> StoreResult<bool> {
        let had = self.settings.remove(queue);
        self.adaptive.remove(queue);
        self.with_queue(queue, |q, _| q.clear_line());
        Ok(had)
    }
}
