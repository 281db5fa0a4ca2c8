//! A user's standing in a queue, and the rules for what is shown to them
//! (polling tiers; wait estimates are in `eta.rs`). How it is written on
//! the wire is the HTTP edge's business (`crate::http::wire`).
//!
//! The token is checked before the rank: admission removes a user from the
//! line and gives them a token in one step, so a READY user is no longer in
//! line and would otherwise look not entered.

use super::EntryToken;

/// How a queue admits: the same for every instance, passed to every store call
/// that may admit, so the store holds no configuration of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Users admitted per interval (the token bucket's refill and capacity).
    pub batch: u32,
    /// The admission interval in milliseconds.
    pub interval_ms: u64,
    /// How long an entry token lives, in milliseconds.
    pub token_ttl_ms: u64,
    /// At most this many users hold a token at once; `None` is unlimited.
    pub max_active: Option<u64>,
    /// Waiting users not seen for this long are dropped; `None` never drops.
    pub abandon_after_ms: Option<u64>,
}

impl Policy {
    /// The configured admission rate in users per second, used for estimates
    /// until real admissions have been observed.
    pub fn configured_rate(&self) -> f64 {
        self.batch as f64 * 1000.0 / self.interval_ms.max(1) as f64
    }
}

/// Where a user stands, as a store reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// In line: `rank` users are ahead; `seq` is the arrival sequence number
    /// (strictly increasing per queue), which orders the line.
    Waiting { rank: u64, seq: u64 },
    /// Holds an entry token.
    Ready {
        token: EntryToken,
        expires_in_ms: u64,
    },
    /// Neither in line nor holding a token.
    NotEntered,
}

/// A store's answer about one user, read atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The user's standing.
    pub standing: Standing,
    /// How many wait in the whole queue.
    pub total_waiting: u64,
    /// When the user entered (store clock, ms since the epoch), if they did.
    pub entered_at_ms: Option<u64>,
    /// The queue's admission pass counter when this was read.
    pub pass: u64,
    /// The entry the standing belongs to: the arrival sequence the store
    /// gave the user when they joined, kept with their token once admitted
    /// (`None` when not entered). A ticket is good only for this entry.
    pub entry: Option<u64>,
    /// True while the queue's stock is sold out (`crate::queue::stock`):
    /// nobody in line will be admitted unless the stock is restocked.
    pub sold_out: bool,
    /// True while an operator holds the queue's admission: nobody is
    /// admitted, so no wait can be estimated.
    pub paused: bool,
    /// The last entry id the answering store had issued in the queue (its
    /// entry counter), read with a status only when the user holds no
    /// place (`None` otherwise, or when it has issued none). See
    /// [`Snapshot::ends_ticket`].
    pub entries_issued: Option<u64>,
}

/// How far above the answering store's entry counter a ticket's entry may
/// be and still count as issued by a store this one lags behind. A lagging
/// node (a restarted old master read before a failover settles, a replica)
/// misses the entries of a few seconds; a counter started anew after a
/// loss of data starts at a random point below 2^40
/// (`crate::store::first_entry_id`), so it lies ~2^39 away from the old
/// tickets, and those are told their place ended as before rather than to
/// retry until they expire.
pub const STALE_ENTRY_LAG_MAX: u64 = 1 << 20;

impl Snapshot {
    /// Whether this answer may tell a ticket for `entry` that its place is
    /// over: the user holds a later entry (they joined again), or holds none
    /// and the store has issued `entry` (its counter is at or above it). A
    /// ticket whose entry is above what the store knows of (within
    /// [`STALE_ENTRY_LAG_MAX`]) comes from a store this node lags behind:
    /// the answer is stale, not an end (`503 store_unavailable`, retried,
    /// not `401 ticket_ended`). That holds for a user who holds an earlier
    /// entry too: entries only grow (one counter per queue, and a join by
    /// someone in line or holding a token keeps what they have), so the
    /// ticket's later entry was issued after the place this node shows,
    /// which the store of record has ended since (the user left and joined
    /// again there).
    pub fn ends_ticket(&self, entry: u64) -> bool {
        match (self.entry, self.entries_issued) {
            (Some(held), _) => entry < held || entry - held > STALE_ENTRY_LAG_MAX,
            (None, Some(issued)) => entry <= issued || entry - issued > STALE_ENTRY_LAG_MAX,
            (None, None) => true,
        }
    }
}

/// The polling interval for a client `rank` places from the front: 1 s under
/// 100 ahead, 3 s under 1,000, else 5 s.
pub fn polling_interval_secs(rank: u64) -> u64 {
    match rank {
        0..=99 => 1,
        100..=999 => 3,
        _ => 5,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_tiers() {
        assert_eq!(polling_interval_secs(0), 1);
        assert_eq!(polling_interval_secs(99), 1);
        assert_eq!(polling_interval_secs(100), 3);
        assert_eq!(polling_interval_secs(999), 3);
        assert_eq!(polling_interval_secs(1000), 5);
    }

    fn policy(batch: u32, interval_ms: u64) -> Policy {
        Policy {
            batch,
            interval_ms,
            token_ttl_ms: 300_000,
            max_active: None,
            abandon_after_ms: None,
        }
    }

    #[test]
    fn the_configured_rate_is_the_batch_per_interval() {
        assert_eq!(policy(50, 1_000).configured_rate(), 50.0);
        assert_eq!(policy(2, 500).configured_rate(), 4.0);
        assert_eq!(policy(3, 2_000).configured_rate(), 1.5);
        // A zero interval is read as 1 ms, never a division by zero.
        assert_eq!(policy(3, 0).configured_rate(), 3_000.0);
    }
}
