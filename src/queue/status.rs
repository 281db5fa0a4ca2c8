//! A user's standing in a queue, and the `QueueStatus` shown to them.
//!
//! The token is checked before the rank: admission removes a user from the
//! line and gives them a token in one step, so a READY user is no longer in
//! line and would otherwise look `NOT_ENTERED`.

use serde::Serialize;
use time::OffsetDateTime;

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
}

/// The three statuses of the public API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    /// In line.
    Waiting,
    /// Holds an entry token.
    Ready,
    /// Neither.
    NotEntered,
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

/// Seconds until `rank` users ahead have been admitted at `rate` per second,
/// rounded up; `None` when nothing is being admitted.
pub fn estimated_wait_secs(rank: u64, rate: f64) -> Option<u64> {
    if rank == 0 {
        return Some(0);
    }
    if rate <= f64::EPSILON || !rate.is_finite() {
        return None;
    }
    Some((rank as f64 / rate).ceil() as u64)
}

/// The public status JSON. Its shape is stable: a field that does not apply
/// is `null`, never missing.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    pub status: Status,
    pub rank: Option<u64>,
    pub position: Option<u64>,
    pub total_waiting: u64,
    pub estimated_wait_seconds: Option<u64>,
    pub polling_interval_seconds: Option<u64>,
    pub entered_at: Option<String>,
    pub entry_token: Option<String>,
    pub token_expires_in_seconds: Option<u64>,
}

impl QueueStatus {
    /// Builds the public status from a store snapshot and the admission rate
    /// (users per second) to estimate the wait with.
    pub fn new(snapshot: &Snapshot, rate: f64) -> Self {
        let entered_at = snapshot.entered_at_ms.and_then(rfc3339_from_ms);
        let mut status = Self {
            status: Status::NotEntered,
            rank: None,
            position: None,
            total_waiting: snapshot.total_waiting,
            estimated_wait_seconds: None,
            polling_interval_seconds: None,
            entered_at,
            entry_token: None,
            token_expires_in_seconds: None,
        };
        match &snapshot.standing {
            Standing::Waiting { rank, .. } => {
                status.status = Status::Waiting;
                status.rank = Some(*rank);
                status.position = Some(rank + 1);
                status.estimated_wait_seconds = estimated_wait_secs(*rank, rate);
                status.polling_interval_seconds = Some(polling_interval_secs(*rank));
            }
            Standing::Ready {
                token,
                expires_in_ms,
            } => {
                status.status = Status::Ready;
                status.entry_token = Some(token.as_str().to_owned());
                status.token_expires_in_seconds = Some(expires_in_ms.div_ceil(1000));
            }
            Standing::NotEntered => status.entered_at = None,
        }
        status
    }
}

fn rfc3339_from_ms(ms: u64) -> Option<String> {
    let t = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).ok()?;
    t.format(&time::format_description::well_known::Rfc3339)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(standing: Standing) -> Snapshot {
        Snapshot {
            standing,
            total_waiting: 500,
            entered_at_ms: Some(1_700_000_000_123),
            pass: 7,
            entry: Some(9),
        }
    }

    #[test]
    fn polling_tiers() {
        assert_eq!(polling_interval_secs(0), 1);
        assert_eq!(polling_interval_secs(99), 1);
        assert_eq!(polling_interval_secs(100), 3);
        assert_eq!(polling_interval_secs(999), 3);
        assert_eq!(polling_interval_secs(1000), 5);
    }

    #[test]
    fn eta_rounds_up_and_is_unknown_without_admissions() {
        assert_eq!(estimated_wait_secs(0, 50.0), Some(0));
        assert_eq!(estimated_wait_secs(1, 50.0), Some(1));
        assert_eq!(estimated_wait_secs(100, 50.0), Some(2));
        assert_eq!(estimated_wait_secs(101, 50.0), Some(3));
        assert_eq!(estimated_wait_secs(10, 0.0), None);
    }

    #[test]
    fn waiting_status() {
        let s = QueueStatus::new(&snap(Standing::Waiting { rank: 120, seq: 9 }), 50.0);
        assert_eq!(s.status, Status::Waiting);
        assert_eq!((s.rank, s.position), (Some(120), Some(121)));
        assert_eq!(s.polling_interval_seconds, Some(3));
        assert_eq!(s.estimated_wait_seconds, Some(3));
        assert_eq!(s.entered_at.as_deref(), Some("2023-11-14T22:13:20.123Z"));
        assert_eq!(s.entry_token, None);
    }

    #[test]
    fn ready_status_and_stable_shape() {
        let token = EntryToken::generate();
        let s = QueueStatus::new(
            &snap(Standing::Ready {
                token: token.clone(),
                expires_in_ms: 299_001,
            }),
            50.0,
        );
        assert_eq!(s.status, Status::Ready);
        assert_eq!(s.entry_token.as_deref(), Some(token.as_str()));
        assert_eq!(s.token_expires_in_seconds, Some(300));
        let json = serde_json::to_value(&s).unwrap();
        for field in [
            "status",
            "rank",
            "position",
            "totalWaiting",
            "estimatedWaitSeconds",
            "pollingIntervalSeconds",
            "enteredAt",
            "entryToken",
            "tokenExpiresInSeconds",
        ] {
            assert!(json.get(field).is_some(), "{field} missing");
        }
        assert_eq!(json["status"], "READY");
        assert!(json["rank"].is_null());
    }

    #[test]
    fn not_entered_has_no_entry_time() {
        let s = QueueStatus::new(&snap(Standing::NotEntered), 50.0);
        assert_eq!(s.status, Status::NotEntered);
        assert_eq!(s.entered_at, None);
        assert_eq!(serde_json::to_value(&s).unwrap()["status"], "NOT_ENTERED");
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

    #[test]
    fn no_estimate_without_a_real_rate() {
        for rate in [0.0, f64::EPSILON, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(estimated_wait_secs(10, rate), None, "{rate}");
        }
        assert_eq!(estimated_wait_secs(0, 0.0), Some(0), "at the front");
        assert_eq!(estimated_wait_secs(3, 0.5), Some(6));
    }
}
