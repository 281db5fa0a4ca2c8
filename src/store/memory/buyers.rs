//! The buyers of one queue: one record per buyer, found by user id.
//!
//! A queue at a million waiting buyers must neither stall nor bloat:
//! - one record holds everything about a buyer (entry, times, token), so
//!   the user id is stored once, not once per map;
//! - records live in fixed-size chunks, so growing never moves them;
//! - the index is [`SHARDS`] small hash tables of 4-byte record ids: when
//!   one grows it rehashes its own share of the buyers, never all at once
//!   under the queue's lock;
//! - waiting buyers are chained oldest-seen first through their records,
//!   so a touch and the absent sweep are O(1) per buyer with no second
//!   ordered set keyed by the user id.

use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;

use crate::queue::{EntryToken, UserId};

/// A record's number in its queue; stable while the buyer lasts.
pub(super) type Id = u32;

/// No record (the ends of the seen chain).
const NIL: Id = Id::MAX;

/// Records per chunk.
const CHUNK: usize = 4096;

/// Index shards: a resize rehashes at most 1/SHARDS of the buyers.
const SHARDS: usize = 64;

/// One buyer, waiting or holding a token.
pub(super) struct Buyer {
    pub user: UserId,
    /// The entry id (arrival sequence): the place in line, then the token's.
    pub entry: u64,
    /// When the entry was created (ms).
    pub entered_at: u64,
    /// The buyer's request budget (GCRA tat, ms; 0: full), kept here while
    /// they have a record so that budgets do not need a map of their own.
    pub budget: u64,
    pub state: State,
}

/// Where a buyer stands.
pub(super) enum State {
    /// In line; `seen` is the last sign of life, `prev`/`next` the
    /// neighbours in the seen chain.
    Waiting { seen: u64, prev: Id, next: Id },
    /// Admitted (or fast-tracked) with a token.
    Ready(Box<Token>),
}

/// A live entry token.
pub(super) struct Token {
    pub token: EntryToken,
    pub expires_at: u64,
    /// The claim holding it: claim id and lease end (ms).
    pub claim: Option<(String, u64)>,
}

/// The records and their index.
pub(super) struct Buyers {
    chunks: Vec<Vec<Option<Buyer>>>,
    /// Records given back, reused first.
    free: Vec<Id>,
    index: Vec<HashTable<Id>>,
    hasher: RandomState,
    /// The seen chain: least recently seen waiting buyer, and most.
    oldest: Id,
    newest: Id,
}

impl Default for Buyers {
    fn default() -> Self {
        Self {
            chunks: Vec::new(),
            free: Vec::new(),
            index: (0..SHARDS).map(|_| HashTable::new()).collect(),
            hasher: RandomState::new(),
            oldest: NIL,
            newest: NIL,
        }
    }
}

/// The shard of a hash: bits the tables themselves do not use (they take
/// the low bits for the bucket and the top 7 as a tag).
fn shard(hash: u64) -> usize {
    (hash >> 32) as usize % SHARDS
}

fn split(id: Id) -> (usize, usize) {
    (id as usize / CHUNK, id as usize % CHUNK)
}

impl Buyers {
    /// The record of `user`, if they have one.
    pub fn find(&self, user: &str) -> Option<Id> {
        let hash = self.hasher.hash_one(user);
        self.index[shard(hash)]
            .find(hash, |&id| {
                self.get(id).is_some_and(|b| b.user.as_str() == user)
            })
            .copied()
    }

    pub fn get(&self, id: Id) -> Option<&Buyer> {
        let (c, i) = split(id);
        self.chunks.get(c)?.get(i)?.as_ref()
    }

    pub fn get_mut(&mut self, id: Id) -> Option<&mut Buyer> {
        let (c, i) = split(id);
        self.chunks.get_mut(c)?.get_mut(i)?.as_mut()
    }

    /// Adds a buyer `find` does not know; a waiting one is seen newest.
    pub fn insert(&mut self, buyer: Buyer) -> Id {
        let hash = self.hasher.hash_one(buyer.user.as_str());
        let waiting = matches!(buyer.state, State::Waiting { .. });
        let id = match self.free.pop() {
            Some(id) => {
                let (c, i) = split(id);
                self.chunks[c][i] = Some(buyer);
                id
            }
            None => {
                if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
                    self.chunks.push(Vec::with_capacity(CHUNK));
                }
                let c = self.chunks.len() - 1;
                let chunk = &mut self.chunks[c];
                chunk.push(Some(buyer));
                // 2^32 records (hundreds of GB) is past any single box.
                Id::try_from(c * CHUNK + chunk.len() - 1).unwrap_or(NIL)
            }
        };
        let (chunks, hasher) = (&self.chunks, &self.hasher);
        self.index[shard(hash)].insert_unique(hash, id, |&other| {
            let (c, i) = split(other);
            chunks[c][i]
                .as_ref()
                .map_or(0, |b| hasher.hash_one(b.user.as_str()))
        });
        if waiting {
            self.link_newest(id);
        }
        id
    }

    /// Takes `id`'s record out (and out of the seen chain).
    pub fn remove(&mut self, id: Id) -> Option<Buyer> {
        self.unlink(id);
        let (c, i) = split(id);
        let buyer = self.chunks.get_mut(c)?.get_mut(i)?.take()?;
        let hash = self.hasher.hash_one(buyer.user.as_str());
        if let Ok(entry) = self.index[shard(hash)].find_entry(hash, |&other| other == id) {
            entry.remove();
        }
        self.free.push(id);
        Some(buyer)
    }

    /// No records at all.
    pub fn is_empty(&self) -> bool {
        self.index.iter().all(HashTable::is_empty)
    }

    /// Marks waiting buyer `id` as seen at `now` (newest in the chain).
    pub fn touch(&mut self, id: Id, now: u64) {
        if let Some(Buyer {
            state: State::Waiting { seen, .. },
            ..
        }) = self.get_mut(id)
        {
            *seen = now;
            self.unlink(id);
            self.link_newest(id);
        }
    }

    /// Gives waiting buyer `id` a token: out of the seen chain.
    pub fn make_ready(&mut self, id: Id, token: Token) {
        self.unlink(id);
        if let Some(b) = self.get_mut(id) {
            b.state = State::Ready(Box::new(token));
        }
    }

    /// The least recently seen waiting buyer and when they were seen.
    pub fn oldest_seen(&self) -> Option<(Id, u64)> {
        match self.get(self.oldest)?.state {
            State::Waiting { seen, .. } => Some((self.oldest, seen)),
            State::Ready(_) => None,
        }
    }

    fn links(&mut self, id: Id) -> Option<(&mut Id, &mut Id)> {
        match &mut self.get_mut(id)?.state {
            State::Waiting { prev, next, .. } => Some((prev, next)),
            State::Ready(_) => None,
        }
    }

    fn link_newest(&mut self, id: Id) {
        let newest = self.newest;
        let Some((prev, next)) = self.links(id) else {
            return;
        };
        (*prev, *next) = (newest, NIL);
        match self.links(newest) {
            Some((_, next)) => *next = id,
            None => self.oldest = id,
        }
        self.newest = id;
    }

    /// Takes waiting buyer `id` out of the seen chain (a no-op otherwise).
    fn unlink(&mut self, id: Id) {
        let Some((prev, next)) = self.links(id) else {
            return;
        };
        let (p, n) = (*prev, *next);
        (*prev, *next) = (NIL, NIL);
        match self.links(p) {
            Some((_, next)) => *next = n,
            None => self.oldest = n,
        }
        match self.links(n) {
            Some((prev, _)) => *prev = p,
            None => self.newest = p,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(name: &str, entry: u64, now: u64) -> Buyer {
        Buyer {
            user: UserId::parse(name).unwrap(),
            entry,
            entered_at: now,
            budget: 0,
            state: State::Waiting {
                seen: now,
                prev: NIL,
                next: NIL,
            },
        }
    }

    /// The seen chain, oldest first.
    fn chain(b: &Buyers) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = b.oldest;
        while let Some(buyer) = b.get(at) {
            out.push(buyer.user.as_str().to_owned());
            let State::Waiting { next, .. } = buyer.state else {
                panic!("a ready buyer in the chain");
            };
            at = next;
        }
        out
    }

    /// The record is what every waiting buyer pays for; the million-buyer
    /// report (docs/benchmarks/) counts it as 72 bytes (a free slot costs
    /// nothing more).
    #[test]
    fn a_record_is_72_bytes() {
        assert_eq!(std::mem::size_of::<Option<Buyer>>(), 72);
    }

    /// Across chunk boundaries and index growth, with records freed and
    /// reused: every buyer is found under their own id, and only they.
    #[test]
    fn every_buyer_is_found_through_growth_and_reuse() {
        let mut b = Buyers::default();
        let n = CHUNK * 3 + 17;
        let ids: Vec<Id> = (0..n)
            .map(|i| b.insert(waiting(&format!("u{i}"), i as u64, 0)))
            .collect();
        for i in (0..n).step_by(3) {
            let gone = b.remove(ids[i]).unwrap();
            assert_eq!(gone.user.as_str(), format!("u{i}"));
        }
        for i in 0..n / 3 {
            b.insert(waiting(&format!("v{i}"), (n + i) as u64, 0));
        }
        assert_eq!(b.chunks.len(), 4, "freed records are reused first");
        for i in 0..n {
            let found = b.find(&format!("u{i}"));
            assert_eq!(found.is_some(), i % 3 != 0, "u{i}");
            if let Some(id) = found {
                assert_eq!(b.get(id).unwrap().entry, i as u64);
            }
        }
        for i in 0..n / 3 {
            let id = b.find(&format!("v{i}")).unwrap();
            assert_eq!(b.get(id).unwrap().user.as_str(), format!("v{i}"));
        }
        let held: usize = b.index.iter().map(HashTable::len).sum();
        assert_eq!(held, n - n.div_ceil(3) + n / 3);
        assert_eq!(chain(&b).len(), held);
        assert!(b.find("nobody").is_none());
    }

    /// A touch moves a buyer to the newest end; a removal or a token
    /// takes them out; the oldest is always at the front.
    #[test]
    fn the_seen_chain_keeps_the_order_of_last_sight() {
        let mut b = Buyers::default();
        let ids: Vec<Id> = ["a", "b", "c", "d"]
            .iter()
            .enumerate()
            .map(|(i, u)| b.insert(waiting(u, i as u64, 10)))
            .collect();
        assert_eq!(chain(&b), ["a", "b", "c", "d"]);
        b.touch(ids[0], 20);
        b.touch(ids[2], 30);
        assert_eq!(chain(&b), ["b", "d", "a", "c"]);
        assert_eq!(b.oldest_seen(), Some((ids[1], 10)));
        b.remove(ids[1]);
        b.make_ready(
            ids[3],
            Token {
                token: EntryToken::generate(),
                expires_at: 99,
                claim: None,
            },
        );
        assert_eq!(chain(&b), ["a", "c"]);
        assert_eq!(b.oldest_seen(), Some((ids[0], 20)));
        b.touch(ids[3], 40); // ready: not in the chain, not put back
        b.remove(ids[2]);
        b.remove(ids[0]);
        assert_eq!(chain(&b), Vec::<String>::new());
        assert_eq!(b.oldest_seen(), None);
        assert_eq!(b.index.iter().map(HashTable::len).sum::<usize>(), 1);
    }
}
