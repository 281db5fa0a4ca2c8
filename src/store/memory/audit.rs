//! The memory store's audit log: one bounded log per queue, kept in the
//! queue's data so an action and its entry are written under one lock (as
//! the Redis scripts write both in one step), with the consumer groups
//! webhooks read it through.
//!
//! Ids are `<ms>-<seq>` as Redis Stream ids are (store clock, then a
//! counter within the millisecond; never smaller than the last, even if
//! the clock steps back), so paging and groups behave as on Redis.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::queue::audit::{
    AUDIT_SCAN_FACTOR, AuditEntry, AuditId, AuditKind, AuditPage, AuditQuery, TakenEntry,
};

use async_trait::async_trait;

use super::MemoryStore;
use crate::queue::QueueName;
use crate::store::{AuditStore, StoreResult};

/// One queue's log and its groups.
#[derive(Default)]
pub(in crate::store::memory) struct Log {
    entries: VecDeque<AuditEntry>,
    last: AuditId,
    groups: HashMap<String, Group>,
}

/// One webhook's view of a log, as a Redis consumer group.
struct Group {
    /// The last id handed out (or the group's start).
    delivered: AuditId,
    /// Handed out, not acknowledged: id → (consumer, when taken or held).
    pending: BTreeMap<AuditId, (String, u64)>,
}

impl Log {
    /// Appends an entry at `now`, then drops the oldest beyond `max_len`
    /// (0: no log, nothing appended).
    pub fn append(
        &mut self,
        max_len: u64,
        now: u64,
        kind: AuditKind,
        user: Option<&str>,
        entry: Option<u64>,
        pass: Option<u64>,
    ) {
        if max_len == 0 {
            return;
        }
        let id = if now > self.last.ms {
            AuditId { ms: now, seq: 0 }
        } else {
            self.last.next()
        };
        self.last = id;
        self.entries.push_back(AuditEntry {
            id,
            kind,
            user: user.map(str::to_owned),
            entry,
            at: now,
            pass,
        });
        while self.entries.len() as u64 > max_len {
            self.entries.pop_front();
        }
    }

    /// Where the entries after `after` start.
    fn start(&self, after: Option<AuditId>) -> usize {
        after.map_or(0, |a| self.entries.partition_point(|e| e.id <= a))
    }

    /// A page, read as the Redis adapter reads one.
    pub fn page(&self, query: AuditQuery) -> AuditPage {
        let limit = query.limit.max(1);
        let mut entries = Vec::new();
        let mut scanned = 0;
        for e in self.entries.range(self.start(query.after)..) {
            scanned += 1;
            if query.kind.is_none_or(|k| e.kind == k) {
                entries.push(e.clone());
            }
            if entries.len() >= limit || scanned >= limit * AUDIT_SCAN_FACTOR {
                return AuditPage {
                    entries,
                    next: Some(e.id),
                };
            }
        }
        AuditPage {
            entries,
            next: None,
        }
    }

    fn get(&self, id: AuditId) -> Option<&AuditEntry> {
        let i = self.entries.partition_point(|e| e.id < id);
        self.entries.get(i).filter(|e| e.id == id)
    }

    /// `XAUTOCLAIM` then `XREADGROUP >`, as the Redis adapter does.
    pub fn take(
        &mut self,
        group: &str,
        start: AuditId,
        consumer: &str,
        idle_ms: u64,
        count: usize,
        now: u64,
    ) -> Vec<AuditEntry> {
        let mut g = self.groups.remove(group).unwrap_or_else(|| Group {
            delivered: start,
            pending: BTreeMap::new(),
        });
        let mut out = Vec::new();
        let idle: Vec<AuditId> = g
            .pending
            .iter()
            .filter(|(_, (_, since))| now.saturating_sub(*since) >= idle_ms)
            .map(|(id, _)| *id)
            .take(count)
            .collect();
        for id in idle {
            match self.get(id) {
                Some(e) => {
                    out.push(e.clone());
                    g.pending.insert(id, (consumer.to_owned(), now));
                }
                // Trimmed meanwhile: nothing left to deliver.
                None => {
                    g.pending.remove(&id);
                }
            }
        }
        let from = self.start(Some(g.delivered));
        for e in self.entries.range(from..).take(count) {
            g.pending.insert(e.id, (consumer.to_owned(), now));
            g.delivered = e.id;
            out.push(e.clone());
        }
        self.groups.insert(group.to_owned(), g);
        out
    }

    /// `XCLAIM … 0 … JUSTID`: `consumer` keeps `ids`, idle from `now`.
    pub fn hold(&mut self, group: &str, consumer: &str, ids: &[AuditId], now: u64) {
        if let Some(g) = self.groups.get_mut(group) {
            for id in ids {
                if let Some(p) = g.pending.get_mut(id) {
                    *p = (consumer.to_owned(), now);
                }
            }
        }
    }

    /// `XACK`.
    pub fn ack(&mut self, group: &str, ids: &[AuditId]) {
        if let Some(g) = self.groups.get_mut(group) {
            for id in ids {
                g.pending.remove(id);
            }
        }
    }
}

#[async_trait]
impl AuditStore for MemoryStore {
    async fn audit_page(&self, queue: &QueueName, query: AuditQuery) -> StoreResult<AuditPage> {
        Ok(self.with_queue(queue, |q, _| q.audit.page(query)))
    }

    async fn audit_take(
        &self,
        queue: &QueueName,
        group: &str,
        start: AuditId,
        consumer: &str,
        idle_ms: u64,
        count: usize,
    ) -> StoreResult<Vec<TakenEntry>> {
        // An entry is a record of its own here.
        Ok(self.with_queue(queue, |q, now| {
            q.audit
                .take(group, start, consumer, idle_ms, count, now)
                .into_iter()
                .map(|entry| TakenEntry {
                    record: entry.id,
                    entry,
                })
                .collect()
        }))
    }

    async fn audit_hold(
        &self,
        queue: &QueueName,
        group: &str,
        consumer: &str,
        ids: &[AuditId],
    ) -> StoreResult<()> {
        self.with_queue(queue, |q, now| q.audit.hold(group, consumer, ids, now));
        Ok(())
    }

    async fn audit_ack(&self, queue: &QueueName, group: &str, ids: &[AuditId]) -> StoreResult<()> {
        self.with_queue(queue, |q, _| q.audit.ack(group, ids));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_grow_even_when_the_clock_steps_back_and_the_log_is_bounded() {
        let mut log = Log::default();
        for now in [10, 10, 9, 11] {
            log.append(3, now, AuditKind::Left, Some("u"), Some(1), None);
        }
        let ids: Vec<String> = log.entries.iter().map(|e| e.id.to_string()).collect();
        assert_eq!(ids, ["10-1", "10-2", "11-0"]);
        log.append(0, 12, AuditKind::Left, None, None, None);
        assert_eq!(log.entries.len(), 3);
    }
}
