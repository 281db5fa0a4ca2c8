//! The live queue catalog of an instance: which queues exist and their
//! settings, as the store holds them, re-read every second.
//!
//! Queues and their settings live in the store so an operator can open a
//! queue or change its rate mid-sale on one instance and every instance
//! follows without a restart. `--queues` and the admission flags (with the
//! configuration file's `[queues.<name>]` overrides) only seed queues the
//! store does not know yet (so a queue named in `--queues`
//! comes back, at the flags' settings, if the store loses its data). Admission passes do not depend on
//! this copy being fresh: the store reads a queue's settings inside the
//! pass itself (see [`crate::store::SettingsStore::put_queue_settings`]); this copy decides which
//! queues exist for requests, the admission loop and the streams, and the
//! policy a join's fast track runs on.
//!
//! While the store is away the last known catalog stays in force (every
//! store call fails closed anyway).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

pub use crate::queue::Queues;
use crate::queue::{Policy, QueueName, QueueSettings, StoredSettings};
use crate::store::{SharedStore, StoreResult};

/// How often every instance re-reads the catalog.
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// An instance's view of the queues; shared as `Arc<Catalog>`.
pub struct Catalog {
    store: SharedStore,
    defaults: QueueSettings,
    /// The start-up queues, each with the settings it is seeded with.
    seeds: Vec<(QueueName, QueueSettings)>,
    /// Bumped by every [`Catalog::apply`]: a reload that started before
    /// one may have read the store before that write, so it is dropped.
    applied: AtomicU64,
    tx: watch::Sender<Arc<Queues>>,
}

impl Catalog {
    /// A catalog of `store` that seeds `seeds` with `defaults` (unless the
    /// store has settings for them) and loads what the store holds. When the
    /// store cannot be reached, it starts with the seeds at their defaults
    /// and seeds them on its first successful reload. The seeds are
    /// permanent: whenever the store lacks one, it is seeded again.
    pub async fn open(store: SharedStore, seeds: Vec<QueueName>, defaults: QueueSettings) -> Self {
        let seeds = seeds.into_iter().map(|q| (q, defaults.clone())).collect();
        Self::open_with(store, seeds, defaults).await
    }

    /// [`Catalog::open`], each seed with settings of its own (the
    /// configuration file's `[queues.<name>]` overrides); `defaults` are
    /// still those of queues opened later through the admin API.
    pub async fn open_with(
        store: SharedStore,
        seeds: Vec<(QueueName, QueueSettings)>,
        defaults: QueueSettings,
    ) -> Self {
        let initial: Queues = seeds
            .iter()
            .map(|(q, settings)| {
                let stored = StoredSettings {
                    settings: settings.clone(),
                    version: 0,
                    updated_at: 0,
                };
                (q.clone(), stored)
            })
            .collect();
        let catalog = Self {
            store,
            defaults,
            seeds,
            applied: AtomicU64::new(0),
            tx: watch::Sender::new(Arc::new(initial)),
        };
        if let Err(e) = catalog.reload().await {
            tracing::warn!(error = %e, "queue catalog not loaded at start: using --queues and the flags until the store answers");
        }
        catalog
    }

    /// The settings a new queue starts from: the start-up flags.
    pub fn defaults(&self) -> &QueueSettings {
        &self.defaults
    }

    /// The queues as last read.
    pub fn current(&self) -> Arc<Queues> {
        self.tx.borrow().clone()
    }

    /// Changes of the catalog, for tasks that follow it.
    pub fn watch(&self) -> watch::Receiver<Arc<Queues>> {
        self.tx.subscribe()
    }

    /// `queue`'s settings, if it exists.
    pub fn get(&self, queue: &QueueName) -> Option<StoredSettings> {
        self.tx.borrow().get(queue).cloned()
    }

    /// Whether `queue` exists.
    pub fn contains(&self, queue: &QueueName) -> bool {
        self.tx.borrow().contains_key(queue)
    }

    /// `queue`'s admission policy (the defaults for an unknown queue).
    pub fn policy(&self, queue: &QueueName) -> Policy {
        self.tx
            .borrow()
            .get(queue)
            .map_or_else(|| self.defaults.policy(), |s| s.settings.policy())
    }

    /// Takes a write this instance just made into account at once, rather
    /// than at the next reload (`None`: the queue was deleted).
    pub fn apply(&self, queue: &QueueName, settings: Option<StoredSettings>) {
        self.applied.fetch_add(1, Ordering::AcqRel);
        self.tx.send_if_modified(|queues| {
            let current = queues.get(queue);
            let newer = match (&settings, current) {
                (Some(new), Some(old)) => new.version > old.version,
                (Some(_), None) => true,
                (None, old) => old.is_some(),
            };
            if newer {
                let mut next = Queues::clone(queues);
                match settings {
                    Some(s) => next.insert(queue.clone(), s),
                    None => next.remove(queue),
                };
                *queues = Arc::new(next);
            }
            newer
        });
    }

    /// Seeds the start-up queues the store does not know (at start, or
    /// after the store lost its data), then re-reads every queue's
    /// settings; followers hear of it only if something changed.
    pub async fn reload(&self) -> StoreResult<()> {
        let applied = self.applied.load(Ordering::Acquire);
        let mut listed = self.store.list_queues().await?;
        for (queue, settings) in &self.seeds {
            if !listed.contains(queue) {
                let (_, written) = self.store.put_queue_settings(queue, settings, true).await?;
                if written {
                    tracing::info!(%queue, "queue seeded from the start-up flags");
                }
                listed.push(queue.clone());
            }
        }
        let mut next = Queues::new();
        for queue in listed {
            if let Some(settings) = self.store.queue_settings(&queue).await? {
                next.insert(queue, settings);
            }
        }
        self.tx.send_if_modified(|queues| {
            let changed = **queues != next && self.applied.load(Ordering::Acquire) == applied;
            if changed {
                *queues = Arc::new(next);
            }
            changed
        });
        Ok(())
    }

    /// Whether `queue` is one of this instance's start-up queues (which it
    /// re-creates whenever the store lacks them).
    pub fn is_seed(&self, queue: &QueueName) -> bool {
        self.seeds.iter().any(|(q, _)| q == queue)
    }
}
