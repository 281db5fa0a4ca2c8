//! The store's part in join challenges (`crate::challenge`): a solved
//! challenge is spent once across every instance, and the instances' join
//! counts decide together when challenges switch on.

use async_trait::async_trait;

use super::StoreResult;
use crate::queue::QueueName;

/// Spent challenges and the shared join counter behind the challenge switch.
#[async_trait]
pub trait ChallengeStore: Send + Sync + 'static {
    /// Remembers `key` in `queue` for `ttl_ms` and answers true the first
    /// time; false, changing nothing, while it is remembered. One atomic
    /// step shared by every instance: of many concurrent calls with one key,
    /// exactly one gets true (a solved join challenge is spent once).
    async fn spend_once(&self, queue: &QueueName, key: &str, ttl_ms: u64) -> StoreResult<bool>;

    /// Adds `joins` (join requests one instance saw since its last call,
    /// about a second's worth) to `queue`'s join counter of the current
    /// store second. When the busier of this second and the last one holds
    /// more than `threshold` joins, the queue's challenge switch is (re)set
    /// on for `hold_ms`. Answers how many ms the switch stays on (0: off),
    /// so every instance that calls it agrees on the switch.
    async fn note_joins(
        &self,
        queue: &QueueName,
        joins: u64,
        threshold: u64,
        hold_ms: u64,
    ) -> StoreResult<u64>;
}
