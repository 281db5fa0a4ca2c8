//! The lottery of a scheduled opening in the memory store: the pre-queue
//! beside the line, and the draw that moves it into the line, each one
//! step under the queue's lock (what the Lua scripts are for Redis).

use std::collections::HashMap;

use super::MemoryStore;
use super::queue::QueueData;
use crate::queue::lottery::{SEED_BYTES, commitment, parse_seed};
use crate::queue::{QueueName, UserId};
use crate::store::{
    AddressLimits, DrawOutcome, LimitKind, Limited, LotteryRefusal, LotteryState, PLACES_RETRY_MS,
    PreEntry, PreJoin, QueueEvent,
};

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
    /// The pre-queue entries each limited address created, counted as its
    /// places (the line's own places are in `QueueData`): while in the
    /// pre-queue, and after the draw while the place it gave lasts.
    places: HashMap<String, Vec<UserId>>,
}

impl Lottery {
    /// Scheduled and not drawn yet: joins without a place go to the
    /// pre-queue.
    pub(super) fn pending(&self) -> bool {
        !self.drawn
    }

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
        let scheduled = self.with_queue(queue, |q, _| match &mut q.lottery {
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
                    places: HashMap::new(),
                };
                let state = l.state();
                q.lottery = Some(l);
                Ok(state)
            }
        });
        // Published as the Lua script does, so pre-queue streams show the
        // new time. (Two moves racing may be heard in either order here;
        // both times are close, and a re-read shows the stored one.)
        if scheduled.is_ok() {
            self.publish(queue, QueueEvent::Rescheduled { opens_at });
        }
        scheduled
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
        address: Option<&AddressLimits>,
    ) -> Result<PreJoin, Limited> {
        self.with_queue(queue, |q, now| {
            let open = q.lottery.as_ref().is_none_or(|l| l.drawn);
            if open || q.buyers.find(user.as_str()).is_some() {
                return Ok(PreJoin::Open);
            }
            if let Some(entry) = q.lottery.as_ref().and_then(|l| l.entries.get(user)) {
                return Ok(PreJoin::Pre {
                    entry: entry.clone(),
                    created: false,
                });
            }
            if let Some(address) = address {
                if let Some(max) = address.places
                    && q.places_held(&address.key, max) + pre_places_held(q, &address.key)
                        >= max as usize
                {
                    return Err(Limited {
                        kind: LimitKind::AddressPlaces,
                        retry_after_ms: PLACES_RETRY_MS,
                    });
                }
                if let Some(rate) = address.joins
                    && let Err(wait) = q.address_joins.spend(address.key.clone(), rate, now)
                {
                    return Err(Limited {
                        kind: LimitKind::AddressJoins,
                        retry_after_ms: wait,
                    });
                }
            }
            let pre_entry = q.next_entry();
            let Some(l) = q.lottery.as_mut() else {
                return Ok(PreJoin::Open);
            };
            let entry = PreEntry {
                pre_entry,
                nonce: nonce.to_string(),
                entry: None,
            };
            l.entries.insert(user.clone(), entry.clone());
            l.version += 1;
            if let Some(address) = address
                && address.places.is_some()
            {
                l.places
                    .entry(address.key.clone())
                    .or_default()
                    .push(user.clone());
            }
            Ok(PreJoin::Pre {
                entry,
                created: true,
            })
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

/// Live places `address` holds through the lottery of `q`: entries still in
/// the pre-queue, and drawn ones whose place in line (or token) lasts.
/// Ended ones are forgotten.
pub(super) fn pre_places_held(q: &mut QueueData, address: &str) -> usize {
    let Some(l) = q.lottery.as_mut() else {
        return 0;
    };
    let Some(mut users) = l.places.remove(address) else {
        return 0;
    };
    let buyers = &q.buyers;
    users.retain(|user| match l.entries.get(user) {
        None => false,
        Some(PreEntry { entry: None, .. }) => true,
        Some(PreEntry {
            entry: Some(placed),
            ..
        }) => buyers
            .find(user.as_str())
            .and_then(|id| buyers.get(id))
            .is_some_and(|b| b.entry == *placed),
    });
    let n = users.len();
    if n > 0 {
        l.places.insert(address.to_owned(), users);
    }
    n
}
