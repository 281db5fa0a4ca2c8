//! The Redis side of proof of work at the door: spent challenges and the
//! join-rate switch, shared by every instance on one Redis.
//!
//! Both keys of a queue carry its `{hash tag}` like every other queue key,
//! and both are passed to Redis as keys (`SET … NX PX` for a spent
//! challenge, `note_joins.lua` for the rate), ready for Redis Cluster.

use async_trait::async_trait;
use redis::Script;

use super::{RedisStore, bounded};
use crate::queue::QueueName;
use crate::store::{ChallengeStore, StoreResult};

/// The rate script, loaded once per store.
pub(super) fn note_joins_script() -> Script {
    Script::new(include_str!("lua/note_joins.lua"))
}

/// `<prefix>:{<queue>}:<name>`: the queue's key naming scheme.
fn key(prefix: &str, queue: &QueueName, name: &str) -> String {
    format!("{prefix}:{{{queue}}}:{name}")
}

#[async_trait]
impl ChallengeStore for RedisStore {
    async fn spend_once(&self, queue: &QueueName, spent: &str, ttl_ms: u64) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        // SET NX answers OK when set, nil when the key was there.
        let set: Option<String> = bounded(
            redis::cmd("SET")
                .arg(key(&self.prefix, queue, &format!("spent:{spent}")))
                .arg("1")
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms.max(1))
                .query_async(&mut conn),
        )
        .await?;
        Ok(set.is_some())
    }

    async fn note_joins(
        &self,
        queue: &QueueName,
        joins: u64,
        threshold: u64,
        hold_ms: u64,
    ) -> StoreResult<u64> {
        let mut invocation = self.note_joins.prepare_invoke();
        invocation
            .key(key(&self.prefix, queue, "joins"))
            .key(key(&self.prefix, queue, "challenge"))
            .arg(joins)
            .arg(threshold)
            .arg(hold_ms.max(1));
        let mut conn = self.conn.clone();
        let left: i64 = bounded(invocation.invoke_async(&mut conn)).await?;
        Ok(u64::try_from(left).unwrap_or(0))
    }
}
