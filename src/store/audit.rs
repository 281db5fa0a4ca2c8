//! The audit log (`crate::queue::audit`): written by the store in the same
//! atomic step as each action, read page by page by operators, and taken
//! in consumer groups by the webhook deliverers.

use async_trait::async_trait;

use super::StoreResult;
use crate::queue::QueueName;
use crate::queue::audit::{AuditId, AuditPage, AuditQuery, TakenEntry};

/// Reading the audit log, and taking it for delivery in consumer groups.
#[async_trait]
pub trait AuditStore: Send + Sync + 'static {
    /// A page of `queue`'s audit log, oldest first: entries after
    /// `query.after`, of `query.kind` if given. The log is written by the
    /// same atomic step as each action (admit, fast track, consume,
    /// release, leave, abandonment, sold out) and keeps about the
    /// configured number of entries per queue, the oldest dropped first.
    async fn audit_page(&self, queue: &QueueName, query: AuditQuery) -> StoreResult<AuditPage>;

    /// Takes entries of `queue`'s log for delivery through `group` (one
    /// group per webhook, created at `start` on first use, so it sees the
    /// entries after `start`) by `consumer` (an instance): first those
    /// another consumer took and left unacknowledged for more than
    /// `idle_ms` (a dead instance's), then entries no consumer of the group
    /// was given yet, at most about `count` records of each, each entry
    /// with its record's id. Every record goes to one consumer at a time,
    /// all its entries together, and stays pending until acknowledged.
    async fn audit_take(
        &self,
        queue: &QueueName,
        group: &str,
        start: AuditId,
        consumer: &str,
        idle_ms: u64,
        count: usize,
    ) -> StoreResult<Vec<TakenEntry>>;

    /// Keeps the records `ids` ([`TakenEntry::record`]) with `consumer`
    /// and restarts their idle time, so a consumer still retrying them does
    /// not lose them to [`AuditStore::audit_take`]'s claim of idle entries.
    async fn audit_hold(
        &self,
        queue: &QueueName,
        group: &str,
        consumer: &str,
        ids: &[AuditId],
    ) -> StoreResult<()>;

    /// Acknowledges the records `ids` ([`TakenEntry::record`]) in `group`:
    /// every entry in them delivered (or given up), never handed out again.
    async fn audit_ack(&self, queue: &QueueName, group: &str, ids: &[AuditId]) -> StoreResult<()>;
}
