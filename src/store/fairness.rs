//! The public admission log (`crate::queue::fairness`): its leaves in one
//! order per queue, the stored nodes of its Merkle tree, and its latest
//! signed head.
//!
//! The log is not written by the action scripts: a task of every instance
//! (`crate::fairness::log`) reads the audit log, which those scripts write
//! in the same step as each action, and appends the new entries here with
//! an append conditional on the size it read. Two instances appending the
//! same entries race, one wins, the other finds the size moved and reads
//! again: one order per queue however many instances run, and a join or a
//! pass costs the store nothing more.

use async_trait::async_trait;

use super::StoreResult;
use crate::queue::QueueName;
use crate::queue::audit::AuditId;
use crate::queue::fairness::{Hash, Node};

/// How far a queue's log has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogState {
    /// Leaves in the log.
    pub size: u64,
    /// The last audit entry read into it (`None` before the first).
    pub cursor: Option<AuditId>,
}

/// One append: what the appender read ([`LogState`]) and what it adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogAppend {
    /// The size the appender read: the append applies only at this size.
    pub from_size: u64,
    /// The cursor after this append (it moves on past audit entries that
    /// make no leaf, too).
    pub cursor: AuditId,
    /// The new leaves, encoded ([`crate::queue::fairness::Leaf::encode`]).
    pub leaves: Vec<String>,
    /// The nodes the leaves complete, per level, level 0 (the leaves'
    /// hashes) first ([`crate::queue::fairness::append_nodes`]).
    pub nodes: Vec<Vec<Hash>>,
}

/// The public admission log of each queue.
#[async_trait]
pub trait FairnessLogStore: Send + Sync + 'static {
    /// The log's size and cursor (zero and `None` before any append).
    async fn log_state(&self, queue: &QueueName) -> StoreResult<LogState>;

    /// Appends `append` if the log still has `append.from_size` leaves:
    /// the leaves, their nodes and the cursor in one step. False, changing
    /// nothing, when another appender got there first.
    async fn log_append(&self, queue: &QueueName, append: &LogAppend) -> StoreResult<bool>;

    /// Leaves `[start, start + count)`, fewer at the end of the log.
    async fn log_leaves(
        &self,
        queue: &QueueName,
        start: u64,
        count: u64,
    ) -> StoreResult<Vec<String>>;

    /// The hashes of `nodes`, in order; an error if one is not stored (a
    /// caller asks only for nodes of a size the log has reached).
    async fn log_nodes(&self, queue: &QueueName, nodes: &[Node]) -> StoreResult<Vec<Hash>>;

    /// Stores `head` (a signed head of `size` leaves) as the latest, unless
    /// the stored one is of a larger size: heads never go back. True if
    /// stored.
    async fn log_put_head(&self, queue: &QueueName, size: u64, head: &str) -> StoreResult<bool>;

    /// The latest signed head, `None` before the first.
    async fn log_head(&self, queue: &QueueName) -> StoreResult<Option<String>>;
}
