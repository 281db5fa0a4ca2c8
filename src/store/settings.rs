//! Live queue settings: what the admin API writes and every instance's
//! catalog reads, versioned so concurrent writers and readers agree.

use async_trait::async_trait;

use super::StoreResult;
use crate::queue::{QueueName, QueueSettings, StoredSettings};

/// Queue settings, the list of queues, and deleting a queue.
#[async_trait]
pub trait SettingsStore: Send + Sync + 'static {
    /// Every queue that has settings, in name order.
    async fn list_queues(&self) -> StoreResult<Vec<QueueName>>;

    /// `queue`'s settings, `None` when it has none (no such queue).
    async fn queue_settings(&self, queue: &QueueName) -> StoreResult<Option<StoredSettings>>;

    /// Writes `queue`'s settings and lists the queue, bumping the version
    /// and stamping the store clock in one atomic step. With `only_if_new`,
    /// writes nothing when the queue has settings already (instances that
    /// start together seed a queue once). Answers the settings now stored
    /// and whether they were written. From the next pass on, [`crate::store::LineStore::admit`]
    /// runs on the stored batch, interval, `maxActive`, token TTL and
    /// abandonment, whatever policy its caller passes.
    async fn put_queue_settings(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
        only_if_new: bool,
    ) -> StoreResult<(StoredSettings, bool)>;

    /// Unlists `queue` and deletes its settings, line, presence, budget and
    /// hold. The entry and pass counters stay (a re-opened queue never
    /// hands out an old entry id or event id again), and tokens already
    /// issued live out their TTL. True if it had settings.
    async fn delete_queue(&self, queue: &QueueName) -> StoreResult<bool>;
}
