//! One queue's state in the memory store, behind its own lock.
//!
//! The line is an order-statistic B-tree of entry ids (a rank is O(log n),
//! like Redis's `ZRANK`) pointing at the buyers' records ([`Buyers`]);
//! tokens expire in order through a set of (expiry, record).

use std::collections::{BTreeSet, HashMap};

use super::buyers::{Buyer, Buyers, Id, State, Token};
use super::limits::Buckets;
use crate::queue::{EntryToken, Policy, Snapshot, Standing, UserId};
use crate::store::Rate;

/// The state of one queue.
#[derive(Default)]
pub(super) struct QueueData {
    pub buyers: Buyers,
    /// The line: entry id (arrival sequence) → record.
    line: indexset::BTreeMap<u64, Id>,
    /// The last entry id handed out (arrival sequence; fast track included).
    last_seq: u64,
    /// Where `last_seq` started: none handed out while they are equal.
    first_seq: u64,
    /// Token expiry order, for clean-up; one per buyer with a token.
    expiry: BTreeSet<(u64, Id)>,
    /// Whose each live token is, so the token API can claim by the token
    /// alone; an entry per member of `expiry`, added and dropped with it.
    by_token: HashMap<String, UserId>,
    bucket: Option<Bucket>,
    pub pass: u64,
    pub paused: bool,
    /// Request budgets of users without a record (the others' are in it).
    budgets: Buckets<UserId>,
    /// New places per client address.
    pub address_joins: Buckets<String>,
    /// Places per client address: (record, the entry the place was).
    address_places: HashMap<String, Vec<(Id, u64)>>,
    /// The order service's stock, once reported (`stock.rs`).
    pub stock: Option<super::stock::Stock>,
    /// The audit log, under the queue's lock with what it records.
    pub audit: super::audit::Log,
    /// A scheduled opening and its pre-queue (`lottery.rs`).
    pub lottery: Option<super::lottery::Lottery>,
    /// A protected site's live sessions and ended log (`sessions.rs`):
    /// each live one holds a slot under `maxActive`, as a token does.
    pub sessions: super::sessions::Sessions,
}

/// A line built beside the queue's (a lottery draw's stage), with records
/// of its own that nothing else finds: put in place all at once by
/// [`QueueData::adopt`], swapped whole when the queue holds no records.
#[derive(Default)]
pub(super) struct StagedLine {
    buyers: Buyers,
    line: indexset::BTreeMap<u64, Id>,
}

impl StagedLine {
    /// Stages `user` waiting with `entry` since `now`; false (nothing
    /// changes) if they are staged already. Their request budget starts
    /// full: a budget kept for them before the draw is not carried over.
    pub fn insert(&mut self, user: &UserId, entry: u64, now: u64) -> bool {
        if self.buyers.find(user.as_str()).is_some() {
            return false;
        }
        let id = self.buyers.insert(Buyer {
            user: user.clone(),
            entry,
            entered_at: now,
            budget: 0,
            state: State::Waiting {
                seen: now,
                prev: Id::MAX,
                next: Id::MAX,
            },
        });
        self.line.insert(entry, id);
        true
    }

    /// Takes `user` out, if staged.
    pub fn remove(&mut self, user: &UserId) {
        if let Some(id) = self.buyers.find(user.as_str())
            && let Some(buyer) = self.buyers.remove(id)
        {
            self.line.remove(&buyer.entry);
        }
    }
}

/// The admission budget: `level` admissions available as of `at`.
struct Bucket {
    level: f64,
    at: u64,
}

impl QueueData {
    /// An empty queue whose entry ids start at a random point.
    pub fn empty() -> Self {
        let first_seq = crate::store::first_entry_id();
        Self {
            last_seq: first_seq,
            first_seq,
            ..Self::default()
        }
    }

    /// Buyers in line.
    pub fn waiting(&self) -> usize {
        self.line.len()
    }

    /// Buyers holding an unexpired token or a session's slot.
    pub fn active(&self) -> usize {
        self.expiry.len() + self.sessions.slots()
    }

    pub fn next_entry(&mut self) -> u64 {
        self.last_seq += 1;
        self.last_seq
    }

    /// Ends every token whose expiry has come, and every session past its
    /// deadline (its slot held a while yet); frees the held slots whose
    /// time has come.
    pub fn expire_tokens(&mut self, now: u64) {
        self.sessions.end_idle(now);
        self.sessions.release_held(now);
        while let Some(&(at, id)) = self.expiry.first() {
            if at > now {
                break;
            }
            self.expiry.pop_first();
            if let Some(gone) = self.buyers.remove(id) {
                if let State::Ready(t) = &gone.state {
                    self.by_token.remove(t.token.as_str());
                }
                self.budgets.restore(gone.user, gone.budget);
            }
        }
    }

    /// Refills the admission budget to `now`; the level.
    pub fn refill(&mut self, policy: &Policy, now: u64) -> f64 {
        let capacity = policy.batch as f64;
        let per_ms = capacity / policy.interval_ms.max(1) as f64;
        let bucket = self.bucket.get_or_insert(Bucket {
            level: capacity,
            at: now,
        });
        let elapsed = now.saturating_sub(bucket.at) as f64;
        bucket.level = (bucket.level + elapsed * per_ms).min(capacity);
        bucket.at = now.max(bucket.at);
        bucket.level
    }

    /// Takes `n` from the admission budget.
    pub fn spend(&mut self, n: usize) {
        if let Some(b) = self.bucket.as_mut() {
            b.level -= n as f64;
        }
    }

    /// Tokens that may still be issued under `max_active`.
    pub fn room(&self, policy: &Policy) -> u64 {
        let holders = self.active() as u64;
        let room = match policy.max_active {
            Some(max) => max.saturating_sub(holders),
            None => u64::MAX,
        };
        room.min(super::stock::room(&self.stock, holders))
    }

    /// A new buyer straight to READY with `token`; the record.
    pub fn fast_track(&mut self, user: &UserId, token: &EntryToken, ttl_ms: u64, now: u64) -> Id {
        let entry = self.next_entry();
        let expires_at = now + ttl_ms;
        let id = self.buyers.insert(Buyer {
            user: user.clone(),
            entry,
            entered_at: now,
            budget: self.budgets.take(user),
            state: State::Ready(Box::new(Token {
                token: token.clone(),
                expires_at,
                claim: None,
            })),
        });
        self.expiry.insert((expires_at, id));
        self.by_token
            .insert(token.as_str().to_owned(), user.clone());
        id
    }

    /// Takes the next `n` entry ids at once; the last id before them.
    pub fn reserve_entries(&mut self, n: u64) -> u64 {
        let base = self.last_seq;
        self.last_seq += n;
        base
    }

    /// A new buyer at the back of the line; the record.
    pub fn join_line(&mut self, user: &UserId, now: u64) -> Id {
        let entry = self.next_entry();
        let id = self.buyers.insert(Buyer {
            user: user.clone(),
            entry,
            entered_at: now,
            budget: self.budgets.take(user),
            state: State::Waiting {
                seen: now,
                prev: Id::MAX,
                next: Id::MAX,
            },
        });
        self.line.insert(entry, id);
        id
    }

    /// Puts `staged` in line. O(1) when the queue holds no records (the
    /// usual opening: the two are swapped); else its buyers are moved in
    /// one by one. Returns what is left to free (the empty records
    /// swapped out), so the caller can drop it outside the queue's lock.
    pub fn adopt(&mut self, mut staged: StagedLine) -> StagedLine {
        if self.buyers.is_empty() && self.line.is_empty() {
            std::mem::swap(&mut self.buyers, &mut staged.buyers);
            std::mem::swap(&mut self.line, &mut staged.line);
            return staged;
        }
        let ids: Vec<Id> = staged.line.iter().map(|(_, id)| *id).collect();
        for id in ids {
            if let Some(buyer) = staged.buyers.remove(id) {
                let entry = buyer.entry;
                let id = self.buyers.insert(buyer);
                self.line.insert(entry, id);
            }
        }
        StagedLine::default()
    }

    /// The buyer at the head of the line.
    pub fn head(&self) -> Option<Id> {
        self.line.first_key_value().map(|(_, &id)| id)
    }

    /// Admits waiting buyer `id` with `token`.
    pub fn admit(&mut self, id: Id, token: &EntryToken, ttl_ms: u64, now: u64) {
        let Some(buyer) = self.buyers.get(id) else {
            return;
        };
        self.line.remove(&buyer.entry);
        self.by_token
            .insert(token.as_str().to_owned(), buyer.user.clone());
        let expires_at = now + ttl_ms;
        self.buyers.make_ready(
            id,
            Token {
                token: token.clone(),
                expires_at,
                claim: None,
            },
        );
        self.expiry.insert((expires_at, id));
    }

    /// One request against `user`'s budget: `Err(ms to wait)` when spent.
    pub fn spend_budget(&mut self, user: &UserId, rate: Rate, now: u64) -> Result<(), u64> {
        let id = self.buyers.find(user.as_str());
        match id.and_then(|id| self.buyers.get_mut(id)) {
            Some(buyer) => {
                buyer.budget = rate.spend(buyer.budget, now)?;
                Ok(())
            }
            None => self.budgets.spend(user.clone(), rate, now),
        }
    }

    /// Ends buyer `id`'s entry, waiting or ready; their record. A budget
    /// still running goes back to the map: leaving does not refill it.
    pub fn remove(&mut self, id: Id) -> Option<Buyer> {
        let buyer = self.buyers.remove(id)?;
        if buyer.budget > 0 {
            self.budgets.restore(buyer.user.clone(), buyer.budget);
        }
        match &buyer.state {
            State::Waiting { .. } => {
                self.line.remove(&buyer.entry);
            }
            State::Ready(t) => {
                self.expiry.remove(&(t.expires_at, id));
                self.by_token.remove(t.token.as_str());
            }
        }
        Some(buyer)
    }

    /// Empties the line of a deleted queue: every waiting buyer, the
    /// admission budget, the hold, the per-address counts and the stock
    /// go; the entry and pass counters carry on (no old entry id or event
    /// id comes back) and tokens already issued live out their TTL.
    pub fn clear_line(&mut self) {
        let waiting: Vec<Id> = self.line.iter().map(|(_, id)| *id).collect();
        for id in waiting {
            self.remove(id);
        }
        self.bucket = None;
        self.paused = false;
        self.budgets = Buckets::default();
        self.address_joins = Buckets::default();
        self.address_places.clear();
        self.stock = None;
        self.lottery = None;
    }

    /// Makes `id`'s token live at least until `until`.
    pub fn extend(&mut self, id: Id, until: u64) {
        if let Some(Buyer {
            state: State::Ready(t),
            ..
        }) = self.buyers.get_mut(id)
            && t.expires_at < until
        {
            let old = std::mem::replace(&mut t.expires_at, until);
            self.expiry.remove(&(old, id));
            self.expiry.insert((until, id));
        }
    }

    /// The token of `user`, if they hold one.
    pub fn token_mut(&mut self, user: &UserId) -> Option<(Id, &mut Token)> {
        let id = self.buyers.find(user.as_str())?;
        match &mut self.buyers.get_mut(id)?.state {
            State::Ready(t) => Some((id, t)),
            State::Waiting { .. } => None,
        }
    }

    /// The user whose live token `presented` is (tokens past their expiry
    /// are gone already: the caller expired them).
    pub fn token_holder(&mut self, presented: &str) -> Option<UserId> {
        let user = self.by_token.get(presented)?.clone();
        let (_, held) = self.token_mut(&user)?;
        held.token.matches(presented).then_some(user)
    }

    /// Whether record `id` still holds the place `entry`.
    fn holds(&self, id: Id, entry: u64) -> bool {
        self.buyers.get(id).is_some_and(|b| b.entry == entry)
    }

    /// Live places held by `address`, forgetting ended ones when the count
    /// reaches `max` (as `enter.lua` prunes).
    pub fn places_held(&mut self, address: &str, max: u32) -> usize {
        let Some(held) = self.address_places.get(address) else {
            return 0;
        };
        if held.len() < max as usize {
            return held.len();
        }
        let live: Vec<(Id, u64)> = held
            .iter()
            .filter(|(id, entry)| self.holds(*id, *entry))
            .copied()
            .collect();
        let n = live.len();
        if live.is_empty() {
            self.address_places.remove(address);
        } else {
            self.address_places.insert(address.to_owned(), live);
        }
        n
    }

    /// Counts place `entry` of record `id` against `address`.
    pub fn note_place(&mut self, address: &str, id: Id, entry: u64) {
        match self.address_places.get_mut(address) {
            Some(held) => held.push((id, entry)),
            None => {
                self.address_places
                    .insert(address.to_owned(), vec![(id, entry)]);
            }
        }
    }

    /// `user`'s standing, token first.
    pub fn snapshot(&self, user: &UserId, now: u64) -> Snapshot {
        self.snapshot_of(self.buyers.find(user.as_str()), now)
    }

    /// The standing of record `id` (none: not entered).
    pub fn snapshot_of(&self, id: Option<Id>, now: u64) -> Snapshot {
        let total_waiting = self.line.len() as u64;
        let Some(buyer) = id.and_then(|id| self.buyers.get(id)) else {
            return Snapshot {
                standing: Standing::NotEntered,
                total_waiting,
                entered_at_ms: None,
                pass: self.pass,
                entry: None,
                sold_out: super::stock::sold_out(&self.stock),
                paused: self.paused,
                // As the Redis store's status reads its counter.
                entries_issued: (self.last_seq != self.first_seq).then_some(self.last_seq),
            };
        };
        let standing = match &buyer.state {
            State::Ready(t) => Standing::Ready {
                token: t.token.clone(),
                expires_in_ms: t.expires_at.saturating_sub(now),
            },
            State::Waiting { .. } => Standing::Waiting {
                rank: self.line.rank(&buyer.entry) as u64,
                seq: buyer.entry,
            },
        };
        Snapshot {
            standing,
            total_waiting,
            entered_at_ms: Some(buyer.entered_at),
            pass: self.pass,
            entry: Some(buyer.entry),
            sold_out: super::stock::sold_out(&self.stock),
            paused: self.paused,
            entries_issued: None,
        }
    }
}
