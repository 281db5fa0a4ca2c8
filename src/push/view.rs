//! What one stream shows its buyer, and the SSE event ids.
//!
//! A stream carries only the latest view (a `watch` channel): a slow
//! client skips intermediate ranks instead of queueing them, so its memory
//! stays bounded however far behind it falls.

use std::fmt;

use tokio::time::Instant;

/// Why a stream ends (`event: gone`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoneReason {
    Left,
    Expired,
    Consumed,
    Abandoned,
    Replaced,
    NotEntered,
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
    },
    Ready {
        token: String,
        expires_at: Instant,
        /// Store-clock ms of the pass that admitted the user, when known.
        admitted_at: Option<u64>,
    },
    Gone(GoneReason),
}

/// An SSE id: `<pass>` or `<pass>.<n>`, so ids only grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct EventId {
    pub pass: u64,
    pub n: u32,
}

impl EventId {
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
}
