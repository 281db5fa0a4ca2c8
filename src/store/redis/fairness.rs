//! The Redis side of the public admission log: per queue a hash (size,
//! cursor, latest head), a list of leaves and one list of node hashes per
//! tree level, all under the queue's hash tag. Appends are
//! `fair_append.lua` (conditional on the size), node reads
//! `fair_nodes.lua`, heads `fair_head.lua`; leaves are read with `LRANGE`.
//!
//! What a leaf costs: its JSON (about 130 bytes) in the leaves list, and
//! two 32-byte hashes on average in the node lists (the leaf's own and its
//! share of the levels above), about 210 bytes in Redis's list encoding;
//! `loadtest/fairness-cost.sh` measures it.

use std::sync::LazyLock;

use async_trait::async_trait;
use redis::Script;

use super::{RedisStore, bounded};
use crate::queue::QueueName;
use crate::queue::audit::AuditId;
use crate::queue::fairness::{Hash, Node};
use crate::store::{FairnessLogStore, LogAppend, LogState, StoreError, StoreResult};

static APPEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/fair_append.lua")));
static NODES: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/fair_nodes.lua")));
static HEAD: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/fair_head.lua")));

impl RedisStore {
    /// The log's hash, its leaves, and the prefix of its level lists.
    fn log_keys(&self, queue: &QueueName) -> [String; 3] {
        let base = format!("{}:{{{queue}}}:fair", self.prefix);
        [base.clone(), format!("{base}:leaves"), format!("{base}:n:")]
    }
}

#[async_trait]
impl FairnessLogStore for RedisStore {
    async fn log_state(&self, queue: &QueueName) -> StoreResult<LogState> {
        let [meta, _, _] = self.log_keys(queue);
        let mut conn = self.conn.clone();
        let (size, cursor): (Option<u64>, Option<String>) = bounded(
            redis::cmd("HMGET")
                .arg(&meta)
                .arg("size")
                .arg("cursor")
                .query_async(&mut conn),
        )
        .await?;
        let cursor = match cursor {
            Some(c) => Some(c.parse::<AuditId>().map_err(|_| {
                StoreError::Protocol(format!("log cursor of {queue} is not an audit id"))
            })?),
            None => None,
        };
        Ok(LogState {
            size: size.unwrap_or(0),
            cursor,
        })
    }

    async fn log_append(&self, queue: &QueueName, append: &LogAppend) -> StoreResult<bool> {
        let [meta, leaves, level_prefix] = self.log_keys(queue);
        let mut inv = APPEND.prepare_invoke();
        inv.key(&meta).key(&leaves);
        for level in 0..append.nodes.len() {
            inv.key(format!("{level_prefix}{level}"));
        }
        inv.arg(append.from_size)
            .arg(append.cursor.to_string())
            .arg(append.leaves.len());
        for leaf in &append.leaves {
            inv.arg(leaf.as_str());
        }
        for nodes in &append.nodes {
            inv.arg(nodes.len());
            for hash in nodes {
                inv.arg(&hash[..]);
            }
        }
        let mut conn = self.conn.clone();
        let appended: i64 = bounded(inv.invoke_async(&mut conn)).await?;
        Ok(appended == 1)
    }

    async fn log_leaves(
        &self,
        queue: &QueueName,
        start: u64,
        count: u64,
    ) -> StoreResult<Vec<String>> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let [_, leaves, _] = self.log_keys(queue);
        let (Ok(from), Ok(to)) = (
            isize::try_from(start),
            isize::try_from(start.saturating_add(count - 1)),
        ) else {
            return Ok(Vec::new());
        };
        let mut conn = self.conn.clone();
        bounded(
            redis::cmd("LRANGE")
                .arg(&leaves)
                .arg(from)
                .arg(to)
                .query_async(&mut conn),
        )
        .await
    }

    async fn log_nodes(&self, queue: &QueueName, nodes: &[Node]) -> StoreResult<Vec<Hash>> {
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        let [_, _, level_prefix] = self.log_keys(queue);
        let mut inv = NODES.prepare_invoke();
        for node in nodes {
            inv.key(format!("{level_prefix}{}", node.level));
            inv.arg(node.index);
        }
        let mut conn = self.conn.clone();
        let raw: Vec<Option<Vec<u8>>> = bounded(inv.invoke_async(&mut conn)).await?;
        raw.into_iter()
            .zip(nodes)
            .map(|(hash, n)| {
                hash.and_then(|h| Hash::try_from(h.as_slice()).ok())
                    .ok_or_else(|| {
                        StoreError::Protocol(format!(
                            "log node {}/{} of {queue} is not stored",
                            n.level, n.index
                        ))
                    })
            })
            .collect()
    }

    async fn log_put_head(&self, queue: &QueueName, size: u64, head: &str) -> StoreResult<bool> {
        let [meta, _, _] = self.log_keys(queue);
        let mut inv = HEAD.prepare_invoke();
        inv.key(&meta).arg(size).arg(head);
        let mut conn = self.conn.clone();
        let stored: i64 = bounded(inv.invoke_async(&mut conn)).await?;
        Ok(stored == 1)
    }

    async fn log_head(&self, queue: &QueueName) -> StoreResult<Option<String>> {
        let [meta, _, _] = self.log_keys(queue);
        let mut conn = self.conn.clone();
        bounded(
            redis::cmd("HGET")
                .arg(&meta)
                .arg("head")
                .query_async(&mut conn),
        )
        .await
    }
}
