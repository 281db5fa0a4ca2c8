//! What one stream shows its buyer, and the SSE event ids.
//!
//! A stream carries only the latest view (its mailbox): a slow
//! client skips intermediate ranks instead of queueing them, so its memory
//! stays bounded however far behind it falls.

use std::fmt;

use tokio::time::Instant;

use crate::queue::WaitRange;

/// Why a stream ends (`event: gone`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoneReason {
    Left,
    Expired,
    Consumed,
    Abandoned,
    Replaced,
    NotEntered,
    /// The queue's stock ran out while the buyer waited.
    SoldOut,
}

impl GoneReason {
    /// The reason's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Left => "left",
            Self::Expired => "expired",
            Self::Consumed => "consumed",
            Self::Abandoned => "abandoned",
            Self::Replaced => "replaced",
            Self::NotEntered => "not_entered",
            Self::SoldOut => "sold_out",
        }
    }
}

/// The state a stream shows.
#[derive(Debug, Clone, PartialEq)]
pub enum View {
    Waiting {
        rank: u64,
        total: u64,
        eta: Option<u64>,
        /// The 80 % range of the wait, once the spread is observed.
        range: Option<WaitRange>,
        /// An operator holds admission (no estimate meanwhile).
        held: bool,
    },
    Ready {
        token: String,
        expires_at: Instant,
        /// How many waited in the queue when the token was shown.
        total: u64,
        /// Store-clock ms of the pass that admitted the user, when known.
        admitted_at: Option<u64>,
    },
    Gone(GoneReason),
    /// In a lottery's pre-queue, before the draw: the HTTP edge's status
    /// JSON as rendered at connect, and the opening time it is to show
    /// (moved by a `Rescheduled` event; the edge writes it in). The stream
    /// stays open and moves to `Waiting` when the draw is heard.
    PreQueue {
        status: std::sync::Arc<str>,
        opens_at: u64,
    },
}

/// An SSE id: `<pass>` or `<pass>.<n>`, so ids only grow. Ordered as the
/// tuple `(pass, n)` (never as a decimal: `7.10` comes after `7.9`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct EventId {
    pub pass: u64,
    pub n: u32,
}

/// How far a client's `Last-Event-ID` may be ahead of the pass counter and
/// still be taken as a floor. Every id a stream sends carries a pass the
/// store had already counted, and the counter is shared by every instance,
/// so an honest id is never ahead of a fresh read, except after a store
/// failover that lost the last few increments. An id further ahead is
/// forged, corrupt or from a wiped store: honouring it would tie this
/// stream's ids to a number no pass will reach, so it is ignored.
pub const FLOOR_MAX_PASSES_AHEAD: u64 = 1_000;
/// Largest `<n>` taken from a `Last-Event-ID`: a stream shows a handful of
/// changes per pass, and the counter must have room to grow.
pub const FLOOR_MAX_N: u32 = 1_000_000;

impl EventId {
    /// Parses `<pass>` or `<pass>.<n>` (ASCII digits only, surrounding
    /// whitespace allowed); `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let (pass, n) = match text.split_once('.') {
            Some((p, n)) => (p, Some(n)),
            None => (text, None),
        };
        let digits =
            |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(pass) || !n.is_none_or(digits) {
            return None;
        }
        Some(Self {
            pass: pass.parse().ok()?,
            n: n.map_or(Some(0), |n| n.parse().ok())?,
        })
    }

    /// The first id of a stream whose state was read at `pass`, for a
    /// client that last saw `floor` (its `Last-Event-ID`): strictly after
    /// the floor, so ids only grow for a buyer across reconnects, restarts
    /// and instances. A floor beyond `FLOOR_MAX_PASSES_AHEAD` or
    /// `FLOOR_MAX_N` is ignored (see there).
    pub fn first(pass: u64, floor: Option<EventId>) -> Self {
        let start = Self { pass, n: 0 };
        match floor {
            Some(f)
                if f >= start && f.pass - pass <= FLOOR_MAX_PASSES_AHEAD && f.n < FLOOR_MAX_N =>
            {
                Self {
                    pass: f.pass,
                    n: f.n + 1,
                }
            }
            _ => start,
        }
    }

    /// The id of the next change: a newer pass resets the counter.
    pub fn next(self, pass: u64) -> Self {
        if pass > self.pass {
            Self { pass, n: 0 }
        } else {
            Self {
                pass: self.pass,
                n: self.n + 1,
            }
        }
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.n == 0 {
            write!(f, "{}", self.pass)
        } else {
            write!(f, "{}.{}", self.pass, self.n)
        }
    }
}

/// One change for a stream to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub id: EventId,
    pub view: View,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_only_grow() {
        let a = EventId { pass: 7, n: 0 };
        let b = a.next(7);
        let c = b.next(7);
        let d = c.next(9);
        assert_eq!(
            [a, b, c, d].map(|i| i.to_string()),
            ["7", "7.1", "7.2", "9"]
        );
        assert!(a < b && b < c && c < d);
        assert_eq!(
            d.next(8),
            EventId { pass: 9, n: 1 },
            "a late pass never lowers the id"
        );
    }

    fn id(pass: u64, n: u32) -> EventId {
        EventId { pass, n }
    }

    #[test]
    fn ids_parse_as_sent() {
        for (text, want) in [
            ("7", id(7, 0)),
            ("7.3", id(7, 3)),
            (" 12.10 ", id(12, 10)),
            ("0", id(0, 0)),
            ("18446744073709551615", id(u64::MAX, 0)),
        ] {
            assert_eq!(EventId::parse(text), Some(want), "{text:?}");
            assert_eq!(EventId::parse(&want.to_string()), Some(want));
        }
        for bad in [
            "",
            ".",
            "7.",
            ".3",
            "+7",
            "-1",
            "7.3.1",
            "7,3",
            "1e3",
            "abc",
            "7.-1",
            "18446744073709551616",
            "7.4294967296",
            "0x10",
            "٣",
        ] {
            assert_eq!(EventId::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ids_compare_as_tuples_not_decimals() {
        assert!(id(7, 10) > id(7, 9));
        assert!(id(8, 0) > id(7, 100));
        assert_eq!(
            EventId::parse("7.10")
                .unwrap()
                .cmp(&EventId::parse("7.9").unwrap()),
            std::cmp::Ordering::Greater
        );
    }

    #[test]
    fn the_first_id_is_after_the_clients_last_one() {
        // The restart: A showed pass 3, B reads pass 3 too.
        assert_eq!(EventId::first(3, Some(id(3, 0))), id(3, 1));
        assert_eq!(EventId::first(3, Some(id(3, 4))), id(3, 5));
        // B is past A's last pass: its own pass is already greater.
        assert_eq!(EventId::first(5, Some(id(3, 7))), id(5, 0));
        assert_eq!(EventId::first(5, None), id(5, 0));
        // A store that lost a few passes in a failover: the floor holds.
        assert_eq!(EventId::first(5, Some(id(9, 2))), id(9, 3));
        assert!(EventId::first(5, Some(id(9, 2))).next(6) > id(9, 2));
    }

    #[test]
    fn an_absurd_floor_is_ignored() {
        let far = 5 + FLOOR_MAX_PASSES_AHEAD;
        assert_eq!(
            EventId::first(5, Some(id(far, 0))),
            id(far, 1),
            "at the edge"
        );
        assert_eq!(EventId::first(5, Some(id(far + 1, 0))), id(5, 0));
        assert_eq!(EventId::first(5, Some(id(u64::MAX, u32::MAX))), id(5, 0));
        assert_eq!(
            EventId::first(u64::MAX, Some(id(u64::MAX, 0))),
            id(u64::MAX, 1)
        );
        assert_eq!(EventId::first(5, Some(id(5, FLOOR_MAX_N))), id(5, 0));
        assert_eq!(
            EventId::first(5, Some(id(5, FLOOR_MAX_N - 1))),
            id(5, FLOOR_MAX_N)
        );
    }
}
