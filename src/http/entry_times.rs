//! The entry times this instance has answered with, so a poll need not
//! have the store read one again.
//!
//! An entry's time never changes while the entry lasts (in line, then as
//! the entry its buyer's token was issued to), and reading it is
//! the dearest part of a poll's store step (its span of marks, read whole
//! and searched: about a sixth of the step). A join's or a poll's answer
//! carries the entry id and its time as the store gave them; the next poll
//! of the same entry on this instance hands them back to the store
//! ([`crate::store::LineStore::status_known`]), which uses them only for
//! that entry. So an answer is always the store's time, never the ticket's,
//! and a buyer served by another instance, or forgotten here, costs one
//! read, not a wrong time.
//!
//! Bounded: two generations of at most [`GENERATION`] buyers each; when
//! the young one fills, the old one is dropped. A buyer who polls stays in
//! the young one; one who went quiet is forgotten within two generations.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use crate::queue::{QueueName, Snapshot, Standing, UserId};
use crate::store::KnownEntry;

/// Most buyers one generation holds (two are kept: about 32 bytes a
/// buyer, 16 MB at most).
const GENERATION: usize = 250_000;

/// Entry times by buyer (a keyed hash of queue and user: the entry id
/// stored beside each time tells a stale or colliding record from the
/// current one).
pub struct EntryTimes {
    hasher: RandomState,
    generations: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    young: HashMap<u64, KnownEntry>,
    old: HashMap<u64, KnownEntry>,
}

impl Default for EntryTimes {
    fn default() -> Self {
        Self {
            hasher: RandomState::new(),
            generations: Mutex::new(Generations::default()),
        }
    }
}

impl EntryTimes {
    fn key(&self, queue: &QueueName, user: &UserId) -> u64 {
        self.hasher.hash_one((queue.as_str(), user.as_str()))
    }

    /// The time of `user`'s entry `entry` in `queue`, if this instance
    /// answered with it.
    pub fn get(&self, queue: &QueueName, user: &UserId, entry: u64) -> Option<KnownEntry> {
        let key = self.key(queue, user);
        let g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        g.young
            .get(&key)
            .or_else(|| g.old.get(&key))
            .copied()
            .filter(|known| known.entry == entry)
    }

    /// The last entry of `user`'s in `queue` this instance answered with,
    /// and its time, whichever entry it is: a join again (which names no
    /// entry) hands it to the store, which uses it only if `user` still
    /// waits with that entry.
    pub fn latest(&self, queue: &QueueName, user: &UserId) -> Option<KnownEntry> {
        let key = self.key(queue, user);
        let g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        g.young.get(&key).or_else(|| g.old.get(&key)).copied()
    }

    /// Keeps the entry time `snapshot` answered for `user`, if it shows
    /// them waiting with one, or holding a token issued to one (admitted:
    /// a token keeps its entry's id, and the time is the entry's).
    pub fn remember(&self, queue: &QueueName, user: &UserId, snapshot: &Snapshot) {
        let seq = match snapshot.standing {
            Standing::Waiting { seq, .. } => seq,
            Standing::Ready { .. } => match snapshot.entry {
                Some(seq) => seq,
                None => return,
            },
            _ => return,
        };
        let Some(entered_at_ms) = snapshot.entered_at_ms else {
            return;
        };
        let key = self.key(queue, user);
        let known = KnownEntry {
            entry: seq,
            entered_at_ms,
        };
        let mut g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        if g.young.get(&key) == Some(&known) {
            return;
        }
        if g.young.len() >= GENERATION {
            g.old = std::mem::take(&mut g.young);
        }
        g.young.insert(key, known);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(seq: u64, at: Option<u64>) -> Snapshot {
        Snapshot {
            standing: Standing::Waiting { rank: 3, seq },
            total_waiting: 10,
            entered_at_ms: at,
            pass: 1,
            entry: Some(seq),
            sold_out: false,
            paused: false,
            entries_issued: None,
        }
    }

    #[test]
    fn only_the_entry_answered_is_known() {
        let times = EntryTimes::default();
        let (q, other_q) = (
            QueueName::parse("a").unwrap(),
            QueueName::parse("b").unwrap(),
        );
        let u = UserId::parse("u1").unwrap();
        assert_eq!(times.get(&q, &u, 7), None);
        times.remember(&q, &u, &waiting(7, Some(1_000)));
        let known = times.get(&q, &u, 7).unwrap();
        assert_eq!((known.entry, known.entered_at_ms), (7, 1_000));
        assert_eq!(times.get(&q, &u, 8), None, "another entry of theirs");
        assert_eq!(times.get(&other_q, &u, 7), None, "another queue");
        // A new entry replaces the old; an answer without a time is none.
        times.remember(&q, &u, &waiting(8, Some(2_000)));
        assert_eq!(times.get(&q, &u, 7), None);
        times.remember(&q, &u, &waiting(9, None));
        assert_eq!(times.get(&q, &u, 9), None);
        assert_eq!(times.get(&q, &u, 8).unwrap().entered_at_ms, 2_000);
        // A join again names no entry: the last one answered, any.
        let latest = times.latest(&q, &u).unwrap();
        assert_eq!((latest.entry, latest.entered_at_ms), (8, 2_000));
        assert_eq!(times.latest(&other_q, &u), None);
    }

    /// An admitted buyer's answer names the entry their token was issued
    /// to: its time is kept like a waiting one's; a buyer with no place
    /// leaves nothing.
    #[test]
    fn a_holders_entry_is_known_too() {
        let times = EntryTimes::default();
        let q = QueueName::parse("a").unwrap();
        let u = UserId::parse("u1").unwrap();
        let ready = Snapshot {
            standing: Standing::Ready {
                token: crate::queue::EntryToken::generate(),
                expires_in_ms: 60_000,
            },
            ..waiting(12, Some(3_000))
        };
        times.remember(&q, &u, &ready);
        assert_eq!(times.get(&q, &u, 12).unwrap().entered_at_ms, 3_000);
        let gone = Snapshot {
            standing: Standing::NotEntered,
            entry: Some(13),
            ..waiting(13, Some(4_000))
        };
        times.remember(&q, &u, &gone);
        assert_eq!(times.get(&q, &u, 13), None);
        assert_eq!(times.get(&q, &u, 12).unwrap().entered_at_ms, 3_000);
    }

    #[test]
    fn bounded_to_two_generations() {
        let times = EntryTimes::default();
        let q = QueueName::parse("a").unwrap();
        let first = UserId::parse("first").unwrap();
        times.remember(&q, &first, &waiting(1, Some(5)));
        for i in 0..2 * GENERATION as u64 {
            let u = UserId::parse(&format!("u{i}")).unwrap();
            times.remember(&q, &u, &waiting(i + 10, Some(5)));
        }
        let g = times.generations.lock().unwrap();
        assert!(g.young.len() + g.old.len() <= 2 * GENERATION);
        drop(g);
        assert_eq!(
            times.get(&q, &first, 1),
            None,
            "forgotten after two generations"
        );
    }
}
