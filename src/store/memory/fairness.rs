//! The memory store's public admission log: per queue, the leaves, the
//! stored nodes of each level and the latest head, under one lock (the
//! logs are appended by one task a second, never on a buyer's request).

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;

use super::MemoryStore;
use crate::queue::QueueName;
use crate::queue::fairness::{Hash, Node};
use crate::store::{FairnessLogStore, LogAppend, LogState, StoreError, StoreResult};

/// Every queue's log.
#[derive(Default)]
pub(super) struct Logs {
    inner: Mutex<HashMap<QueueName, Log>>,
}

/// One queue's log.
#[derive(Default)]
struct Log {
    state: LogState,
    leaves: Vec<String>,
    levels: Vec<Vec<Hash>>,
    head: Option<(u64, String)>,
}

impl MemoryStore {
    fn with_log<T>(&self, queue: &QueueName, f: impl FnOnce(&mut Log) -> T) -> T {
        let mut logs = self
            .fairness
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        f(logs.entry(queue.clone()).or_default())
    }
}

#[async_trait]
impl FairnessLogStore for MemoryStore {
    async fn log_state(&self, queue: &QueueName) -> StoreResult<LogState> {
        Ok(self.with_log(queue, |log| log.state))
    }

    async fn log_append(&self, queue: &QueueName, append: &LogAppend) -> StoreResult<bool> {
        Ok(self.with_log(queue, |log| {
            if log.state.size != append.from_size {
                return false;
            }
            log.leaves.extend(append.leaves.iter().cloned());
            for (level, nodes) in append.nodes.iter().enumerate() {
                if log.levels.len() <= level {
                    log.levels.resize(level + 1, Vec::new());
                }
                log.levels[level].extend_from_slice(nodes);
            }
            log.state = LogState {
                size: log.leaves.len() as u64,
                cursor: Some(append.cursor),
            };
            true
        }))
    }

    async fn log_leaves(
        &self,
        queue: &QueueName,
        start: u64,
        count: u64,
    ) -> StoreResult<Vec<String>> {
        Ok(self.with_log(queue, |log| {
            let len = log.leaves.len() as u64;
            let (from, to) = (start.min(len), start.saturating_add(count).min(len));
            log.leaves[from as usize..to as usize].to_vec()
        }))
    }

    async fn log_nodes(&self, queue: &QueueName, nodes: &[Node]) -> StoreResult<Vec<Hash>> {
        self.with_log(queue, |log| {
            nodes
                .iter()
                .map(|n| {
                    log.levels
                        .get(usize::from(n.level))
                        .and_then(|level| level.get(usize::try_from(n.index).ok()?))
                        .copied()
                        .ok_or_else(|| {
                            StoreError::Protocol(format!(
                                "log node {}/{} is not stored",
                                n.level, n.index
                            ))
                        })
                })
                .collect()
        })
    }

    async fn log_put_head(&self, queue: &QueueName, size: u64, head: &str) -> StoreResult<bool> {
        Ok(self.with_log(queue, |log| {
            if log.head.as_ref().is_some_and(|(stored, _)| *stored > size) {
                return false;
            }
            log.head = Some((size, head.to_owned()));
            true
        }))
    }

    async fn log_head(&self, queue: &QueueName) -> StoreResult<Option<String>> {
        Ok(self.with_log(queue, |log| log.head.as_ref().map(|(_, h)| h.clone())))
    }
}
