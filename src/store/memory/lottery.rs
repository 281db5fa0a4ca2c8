//! The lottery of a scheduled opening in the memory store: the pre-queue
//! beside the line, and the draw that moves it into the line, each one
//! step under the queue's lock (what the Lua scripts are for Redis). The
//! draw follows the same steps as Redis's (begin, stage chunks, commit),
//! so each holds the lock for one chunk: the stage builds the line and the
//! records beside the queue's, and the commit swaps them in (O(1) when
//! the queue holds no records, as at an opening).

use std::collections::{HashMap, HashSet};

use super::MemoryStore;
use super::queue::{QueueData, StagedLine};
use crate::queue::lottery::{SEED_BYTES, commitment, parse_seed};
use crate::queue::{QueueName, UserId};
use crate::store::{
    AddressLimits, DrawStep, LimitKind, Limited, LotteryRefusal, LotteryState, PLACES_RETRY_MS,
    PreEntry, PreJoin, QueueEvent,
};

use async_trait::async_trait;

use crate::store::{LotteryStore, StoreResult};

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
    /// The draw being staged, if one is.
    stage: Option<Stage>,
}

/// A draw being staged (see `lua/lottery_begin.lua` for Redis's).
struct Stage {
    /// The draw's id.
    draw: String,
    /// The drawn entries take ids `base + 1 ..= base + n`, in drawn order.
    base: u64,
    /// The frozen pre-queue's size.
    n: u64,
    /// Order positions staged so far.
    staged: u64,
    /// When the stage last moved on (ms).
    at: u64,
    /// The published list, kept for the commit.
    list: String,
    /// The line to be: the drawn, and later arrivals behind them.
    line: StagedLine,
    /// The pre-queue's records to be (each with its place): every user
    /// staged.
    entries: HashMap<UserId, PreEntry>,
    /// Frozen entries that left: the stage skips them.
    left: HashSet<UserId>,
}

impl Lottery {
    /// Scheduled and not drawn yet: joins without a place go to the
    /// pre-queue.
    pub(super) fn pending(&self) -> bool {
        !self.drawn
    }

    fn state(&self, now: u64) -> LotteryState {
        LotteryState {
            opens_at: self.opens_at,
            seed: self.seed.clone(),
            commitment: self.commitment.clone(),
            drawn: self.drawn,
            entries: self.entries.len() as u64,
            version: self.version,
            staging_idle_ms: self.stage.as_ref().map(|s| now.saturating_sub(s.at)),
        }
    }

    /// Drawn, or a draw staged: too late to move or clear.
    fn closed(&self) -> bool {
        self.drawn || self.stage.is_some()
    }
}

#[async_trait]
impl LotteryStore for MemoryStore {
    async fn schedule_lottery(
        &self,
        queue: &QueueName,
        opens_at: u64,
        seed: &str,
    ) -> StoreResult<Result<LotteryState, LotteryRefusal>> {
        let bytes: [u8; SEED_BYTES] = parse_seed(seed).unwrap_or([0; SEED_BYTES]);
        let scheduled = self.with_queue(queue, |q, now| match &mut q.lottery {
            Some(l) if l.closed() => Err(LotteryRefusal::Drawn),
            Some(l) => {
                l.opens_at = opens_at;
                Ok(l.state(now))
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
                    stage: None,
                };
                let state = l.state(now);
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
        Ok(scheduled)
    }

    async fn clear_lottery(&self, queue: &QueueName) -> StoreResult<Result<bool, LotteryRefusal>> {
        Ok(self.with_queue(queue, |q, _| match &q.lottery {
            None => Ok(false),
            Some(l) if l.closed() => Err(LotteryRefusal::Drawn),
            Some(l) if !l.entries.is_empty() => Err(LotteryRefusal::NotEmpty),
            Some(_) => {
                q.lottery = None;
                Ok(true)
            }
        }))
    }

    async fn lottery(&self, queue: &QueueName) -> StoreResult<Option<LotteryState>> {
        Ok(self.with_queue(queue, |q, now| q.lottery.as_ref().map(|l| l.state(now))))
    }

    async fn pre_join_limited(
        &self,
        queue: &QueueName,
        user: &UserId,
        nonce: &str,
        address: Option<&AddressLimits>,
    ) -> StoreResult<Result<PreJoin, Limited>> {
        Ok(self.with_queue(queue, |q, now| {
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
            // Not in the draw being staged: behind it, by its own id
            // (after the drawn block).
            if let Some(stage) = l.stage.as_mut() {
                stage.line.insert(user, pre_entry, now);
                let placed = PreEntry {
                    entry: Some(pre_entry),
                    ..entry.clone()
                };
                stage.entries.insert(user.clone(), placed);
            }
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
        }))
    }

    async fn pre_entry(&self, queue: &QueueName, user: &UserId) -> StoreResult<Option<PreEntry>> {
        Ok(self.with_queue(queue, |q, _| {
            q.lottery
                .as_ref()
                .and_then(|l| l.entries.get(user).cloned())
        }))
    }

    async fn pre_leave(
        &self,
        queue: &QueueName,
        user: &UserId,
        pre_entry: u64,
    ) -> StoreResult<bool> {
        Ok(self.with_queue(queue, |q, _| {
            let Some(l) = q.lottery.as_mut().filter(|l| !l.drawn) else {
                return false;
            };
            if l.entries.get(user).is_none_or(|e| e.pre_entry != pre_entry) {
                return false;
            }
            l.entries.remove(user);
            l.version += 1;
            // Out of the draw being staged too: no ghost in line.
            if let Some(stage) = l.stage.as_mut() {
                stage.line.remove(user);
                stage.entries.remove(user);
                if pre_entry <= stage.base {
                    stage.left.insert(user.clone());
                }
            }
            true
        }))
    }

    async fn pre_queue(&self, queue: &QueueName) -> StoreResult<(u64, Vec<(UserId, PreEntry)>)> {
        Ok(self.with_queue(queue, |q, _| match &q.lottery {
            None => (0, Vec::new()),
            Some(l) => (
                l.version,
                l.entries
                    .iter()
                    .map(|(u, e)| (u.clone(), e.clone()))
                    .collect(),
            ),
        }))
    }

    async fn draw_begin(
        &self,
        queue: &QueueName,
        draw: &str,
        version: u64,
        entries: u64,
        list: &str,
        abandon_ms: u64,
    ) -> StoreResult<DrawStep> {
        Ok(self.with_queue(queue, |q, now| {
            let Some(l) = q.lottery.as_mut() else {
                return DrawStep::Stale;
            };
            if l.drawn {
                return DrawStep::AlreadyDrawn;
            }
            if let Some(stage) = &l.stage {
                if now.saturating_sub(stage.at) <= abandon_ms {
                    return DrawStep::Busy;
                }
                // Abandoned: the pre-queue, kept current, is drawn again.
                l.stage = None;
            }
            if now < l.opens_at || l.version != version || l.entries.len() as u64 != entries {
                return DrawStep::Stale;
            }
            let base = q.reserve_entries(entries);
            if let Some(l) = q.lottery.as_mut() {
                l.stage = Some(Stage {
                    draw: draw.to_owned(),
                    base,
                    n: entries,
                    staged: 0,
                    at: now,
                    list: list.to_owned(),
                    line: StagedLine::default(),
                    entries: HashMap::new(),
                    left: HashSet::new(),
                });
            }
            DrawStep::Staged { staged: 0 }
        }))
    }

    async fn draw_stage(
        &self,
        queue: &QueueName,
        draw: &str,
        offset: u64,
        users: &[UserId],
    ) -> StoreResult<DrawStep> {
        Ok(self.with_queue(queue, |q, now| {
            let Some(l) = q.lottery.as_mut() else {
                return DrawStep::Lost;
            };
            if l.drawn {
                return DrawStep::AlreadyDrawn;
            }
            let Some(stage) = l.stage.as_mut().filter(|s| s.draw == draw) else {
                return DrawStep::Lost;
            };
            let k = users.len() as u64;
            if offset < stage.staged && offset + k <= stage.staged {
                return DrawStep::Staged {
                    staged: stage.staged,
                };
            }
            if offset != stage.staged {
                return DrawStep::Lost;
            }
            let fits = stage.staged + k <= stage.n;
            let frozen = fits
                && users.iter().enumerate().all(|(i, user)| {
                    match l.entries.get(user) {
                        Some(e) if e.pre_entry <= stage.base => {
                            let id = stage.base + offset + i as u64 + 1;
                            let placed = PreEntry {
                                entry: Some(id),
                                ..e.clone()
                            };
                            stage.entries.insert(user.clone(), placed);
                            // Named twice: the first stays, the order is wrong.
                            stage.line.insert(user, id, now)
                        }
                        _ => stage.left.contains(user),
                    }
                });
            if !frozen {
                l.stage = None;
                return DrawStep::Stale;
            }
            stage.staged += k;
            stage.at = now;
            DrawStep::Staged {
                staged: stage.staged,
            }
        }))
    }

    async fn draw_commit(&self, queue: &QueueName, draw: &str) -> StoreResult<DrawStep> {
        let (step, replaced) = self.with_queue(queue, |q, _| {
            let Some(l) = q.lottery.as_mut() else {
                return (DrawStep::Lost, None);
            };
            if l.drawn {
                return (DrawStep::AlreadyDrawn, None);
            }
            if l.stage
                .as_ref()
                .is_none_or(|s| s.draw != draw || s.staged != s.n)
            {
                return (DrawStep::Lost, None);
            }
            let Some(stage) = l.stage.take() else {
                return (DrawStep::Lost, None);
            };
            // Every pre-queue user staged, or the order missed someone.
            if stage.entries.len() != l.entries.len() {
                return (DrawStep::Stale, None);
            }
            l.drawn = true;
            l.list = Some(stage.list);
            let before = std::mem::replace(&mut l.entries, stage.entries);
            let placed = stage.n - stage.left.len() as u64;
            let rest = q.adopt(stage.line);
            (DrawStep::Drawn { placed }, Some((before, rest)))
        });
        // What was replaced is freed here, after the lock.
        drop(replaced);
        if matches!(step, DrawStep::Drawn { .. }) {
            self.publish(queue, QueueEvent::Drawn);
        }
        Ok(step)
    }

    async fn lottery_list(&self, queue: &QueueName) -> StoreResult<Option<String>> {
        Ok(self.with_queue(queue, |q, _| {
            q.lottery.as_ref().and_then(|l| l.list.clone())
        }))
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
