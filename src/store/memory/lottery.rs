//! The lottery of a scheduled opening in the memory store: the pre-queue
//! beside the line, and the draw that moves it into the line, each one
//! step under the queue's lock (what the Lua scripts are for Redis).

use std::collections::HashMap;

use super::MemoryStore;
use crate::queue::lottery::{SEED_BYTES, commitment, parse_seed};
use crate::queue::{QueueName, UserId};
use crate::store::{DrawOutcome, LotteryRefusal, LotteryState, PreEntry, PreJoin};

/// One queue's lottery.
pub(super) struct Lottery {
    opens_at: u64,
    seed: String,
    commitment: String,
    drawn: bool,
    version: u64,
    /// Pre-queue entries, kept after the draw with their entries in line.
    entries: HashMap<UserId, PreEntry>,
    list: Option<String>,
}

impl Lottery {
    fn state(&self) -> LotteryState {
        LotteryState {
            opens_at: self.opens_at,
            seed: self.seed.clone(),
            commitment: self.commitment.clone(),
            drawn: self.drawn,
            entries: self.entries.len() as u64,
            version: self.version,
        }
    }
}

impl MemoryStore {
    pub(super) fn lottery_schedule(
        &self,
        queue: &QueueName,
        opens_at: u64,
        seed: &str,
    ) -> Result<LotteryState, LotteryRefusal> {
        let bytes: [u8; SEED_BYTES] = parse_seed(seed).unwrap_or([0; SEED_BYTES]);
        self.with_queue(queue, |q, _| match &mut q.lottery {
            Some(l) if l.drawn => Err(LotteryRefusal::Drawn),
            Some(l) => {
                l.opens_at = opens_at;
                Ok(l.state())
            }
            None => {
                let l = Lottery {
                    opens_at,
                    seed: seed.to_string(),
                    commitment: commitment(&bytes),
                    drawn: false,
                    version: 0,
                    entries: HashMap::new(),
                    list: None,
                };
                let state = l.state();
                q.lottery = Some(l);
                Ok(state)
            }
        })
    }

    pub(super) fn lottery_clear(&self, queue: &QueueName) -> Result<bool, LotteryRefusal> {
        self.with_queue(queue, |q, _| match &q.lottery {
            None => Ok(false),
            Some(l) if l.drawn => Err(LotteryRefusal::Drawn),
            Some(l) if !l.entries.is_empty() => Err(LotteryRefusal::NotEmpty),
            Some(_) => {
                q.lottery = None;
                Ok(true)
            }
        })
    }

    pub(super) fn lottery_state(&self, queue: &QueueName) -> Option<LotteryState> {
        self.with_queue(queue, |q, _| q.lottery.as_ref().map(Lottery::state))
    }

    pub(super) fn lottery_pre_join(
        &self,
        queue: &QueueName,
        user: &UserId,
        nonce: &str,
    ) -> PreJoin {
        self.with_queue(queue, |q, _| {
            let open = q.lottery.as_ref().is_none_or(|l| l.drawn);
            if open || q.buyers.find(user.as_str()).is_some() {
                return PreJoin::Open;
            }
            if let Some(entry) = q.lottery.as_ref().and_then(|l| l.entries.get(user)) {
                return PreJoin::Pre {
                    entry: entry.clone(),
                    created: false,
                };
            }
            let pre_entry = q.next_entry();
            let Some(l) = q.lottery.as_mut() else {
                return PreJoin::Open;
            };
            let entry = PreEntry {
                pre_entry,
                nonce: nonce.to_string(),
                entry: None,
            };
            l.entries.insert(user.clone(), entry.clone());
            l.version += 1;
            PreJoin::Pre {
                entry,
                created: true,
            }
        })
    }

    pub(super) fn lottery_pre_entry(&self, queue: &QueueName, user: &UserId) -> Option<PreEntry> {
        self.with_queue(queue, |q, _| {
            q.lottery
                .as_ref()
                .and_then(|l| l.entries.get(user).cloned())
        })
    }

    pub(super) fn lottery_pre_leave(
        &self,
        queue: &QueueName,
        user: &UserId,
        pre_entry: u64,
    ) -> bool {
        self.with_queue(queue, |q, _| {
            let Some(l) = q.lottery.as_mut().filter(|l| !l.drawn) else {
                return false;
            };
            if l.entries.get(user).is_none_or(|e| e.pre_entry != pre_entry) {
                return false;
            }
            l.entries.remove(user);
            l.version += 1;
            true
        })
    }

    pub(super) fn lottery_pre_queue(&self, queue: &QueueName) -> (u64, Vec<(UserId, PreEntry)>) {
        self.with_queue(queue, |q, _| match &q.lottery {
            None => (0, Vec::new()),
            Some(l) => (
                l.version,
                l.entries
                    .iter()
                    .map(|(u, e)| (u.clone(), e.clone()))
                    .collect(),
            ),
        })
    }

    pub(super) fn lottery_draw(
        &self,
        queue: &QueueName,
        version: u64,
        order: &[UserId],
        list: &str,
    ) -> DrawOutcome {
        self.with_queue(queue, |q, now| {
            let Some(l) = q.lottery.as_mut() else {
                return DrawOutcome::Stale;
            };
            if l.drawn {
                return DrawOutcome::AlreadyDrawn;
            }
            // Every pre-queue user exactly once: as many, all known, distinct.
            let distinct: std::collections::HashSet<&UserId> = order.iter().collect();
            let complete = order.len() == l.entries.len()
                && distinct.len() == order.len()
                && order.iter().all(|u| l.entries.contains_key(u));
            if now < l.opens_at || l.version != version || !complete {
                return DrawOutcome::Stale;
            }
            l.drawn = true;
            l.list = Some(list.to_string());
            let mut entries = std::mem::take(&mut l.entries);
            for user in order {
                let id = q.join_line(user, now);
                let entry = q.buyers.get(id).map(|b| b.entry);
                if let Some(e) = entries.get_mut(user) {
                    e.entry = entry;
                }
            }
            if let Some(l) = q.lottery.as_mut() {
                l.entries = entries;
            }
            DrawOutcome::Drawn {
                placed: order.len() as u64,
            }
        })
    }

    pub(super) fn lottery_published(&self, queue: &QueueName) -> Option<String> {
        self.with_queue(queue, |q, _| {
            q.lottery.as_ref().and_then(|l| l.list.clone())
        })
    }
}
