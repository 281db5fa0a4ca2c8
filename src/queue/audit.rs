//! The audit log's vocabulary: what happened to whom in a queue, and the
//! ids that order and page it.
//!
//! Operators answer "did this buyer get in, and what became of the token?"
//! long after the fact, and order services follow admissions through
//! webhooks; both need one record per action, written by the same atomic
//! step as the action, so the log can never claim something that did not
//! happen nor miss something that did. The stores write it (a Redis Stream
//! per queue, or its in-memory equivalent); this module only says what an
//! entry is, so both stores and the HTTP API agree on it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Entries kept per queue unless `--audit-max-len` says otherwise.
pub const DEFAULT_AUDIT_MAX_LEN: u64 = 100_000;

/// The most entries one page of the admin API answers.
pub const MAX_AUDIT_PAGE: usize = 1_000;

/// An entry's id: `<ms>-<seq>`, the store-clock millisecond it was written
/// and a counter within it, as Redis Stream ids are. Ids only grow within
/// a queue's log, so `after` an id is a stable paging cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct AuditId {
    /// Store clock, ms since the epoch.
    pub ms: u64,
    /// Order within the millisecond.
    pub seq: u64,
}

impl AuditId {
    /// The smallest id after `self`.
    pub fn next(self) -> Self {
        match self.seq.checked_add(1) {
            Some(seq) => Self { ms: self.ms, seq },
            None => Self {
                ms: self.ms.saturating_add(1),
                seq: 0,
            },
        }
    }
}

impl fmt::Display for AuditId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// An id that is not `<digits>-<digits>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an audit id is <ms>-<seq>, two unsigned integers")]
pub struct InvalidAuditId;

impl FromStr for AuditId {
    type Err = InvalidAuditId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (ms, seq) = s.split_once('-').ok_or(InvalidAuditId)?;
        let number = |part: &str| {
            // `u64::from_str` takes a leading `+`; an id never has one.
            if part.is_empty() || part.len() > 20 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(InvalidAuditId);
            }
            part.parse::<u64>().map_err(|_| InvalidAuditId)
        };
        Ok(Self {
            ms: number(ms)?,
            seq: number(seq)?,
        })
    }
}

impl Serialize for AuditId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AuditId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum AuditKind {
    /// A buyer got an entry token: by an admission pass (`pass` set) or on
    /// the fast track of a join into an empty line (`pass` null).
    Admitted,
    /// A token was used for an order (the order service's consume).
    Consumed,
    /// An order rolled back and gave its claimed token back.
    Released,
    /// A pass dropped a waiting buyer unseen for `abandonAfter`.
    Abandoned,
    /// A buyer left the line or gave up their token.
    Left,
    /// A stock report found nothing left (once per change to sold out).
    SoldOut,
}

impl AuditKind {
    /// Every kind, in the order of the documentation.
    pub const ALL: [AuditKind; 6] = [
        Self::Admitted,
        Self::Consumed,
        Self::Released,
        Self::Abandoned,
        Self::Left,
        Self::SoldOut,
    ];

    /// The name on the wire, in the store and in `kind=` filters.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::Consumed => "consumed",
            Self::Released => "released",
            Self::Abandoned => "abandoned",
            Self::Left => "left",
            Self::SoldOut => "soldOut",
        }
    }
}

/// A kind name that is none of [`AuditKind::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown audit kind (admitted, consumed, released, abandoned, left, soldOut)")]
pub struct InvalidAuditKind;

impl FromStr for AuditKind {
    type Err = InvalidAuditKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or(InvalidAuditKind)
    }
}

/// One entry of a queue's audit log.
///
/// `user` is the buyer's id as the identity mode gave it (the gateway's
/// user id, the visitor id, the JWT subject): support answers questions
/// about a named buyer, so a fingerprint would not do. `entry` is the id of
/// the buyer's entry, which is also the id of the token issued to it (never
/// the token itself: that is a bearer secret). Fields that do not apply are
/// `null`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// The entry's id in the queue's log: `<ms>-<seq>`.
    #[schema(value_type = String, pattern = r"^[0-9]{1,20}-[0-9]{1,20}$")]
    pub id: AuditId,
    /// What happened.
    pub kind: AuditKind,
    /// The buyer (`null` for `soldOut`).
    pub user: Option<String>,
    /// The buyer's entry id, and so their token's (`null` for `soldOut`).
    pub entry: Option<u64>,
    /// When, store clock, ms since the epoch.
    pub at: u64,
    /// The admission pass that admitted or dropped the buyer.
    pub pass: Option<u64>,
}

/// An entry handed to one consumer of a group (webhook delivery), with
/// the id of the store's record that holds it. A store may keep several
/// entries in one record (the Redis store writes an admission pass's
/// buyers as one stream entry): a record is held and acknowledged as a
/// whole, so a consumer acknowledges it once every entry in it is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenEntry {
    /// The entry.
    pub entry: AuditEntry,
    /// Its record's id, which [`crate::store::AuditStore::audit_hold`] and
    /// [`crate::store::AuditStore::audit_ack`] take.
    pub record: AuditId,
}

/// One page of a queue's log, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditPage {
    /// The entries, oldest first.
    pub entries: Vec<AuditEntry>,
    /// Where the next page starts (pass it as `after`), `null` once the
    /// end of the log was reached. A filtered page may hold fewer than
    /// `limit` entries and still have a `next`.
    #[schema(value_type = Option<String>, pattern = r"^[0-9]{1,20}-[0-9]{1,20}$")]
    pub next: Option<AuditId>,
}

/// What to read of a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditQuery {
    /// Entries strictly after this id (`None`: from the oldest kept).
    pub after: Option<AuditId>,
    /// At most this many entries (1..=[`MAX_AUDIT_PAGE`]).
    pub limit: usize,
    /// Only entries of this kind.
    pub kind: Option<AuditKind>,
}

/// Entries a filtered read scans at most for one page, as a multiple of
/// its limit: a page of a rare kind answers within bounded work and says
/// where to go on.
pub const AUDIT_SCAN_FACTOR: usize = 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_only_two_unsigned_integers() {
        let id: AuditId = "1700000000000-3".parse().unwrap();
        assert_eq!(
            id,
            AuditId {
                ms: 1_700_000_000_000,
                seq: 3
            }
        );
        assert_eq!(id.to_string(), "1700000000000-3");
        for bad in [
            "",
            "-",
            "1",
            "1-",
            "-1",
            "+1-2",
            "1-+2",
            "1-2-3",
            "a-1",
            "1 -2",
            "1-2 ",
            "99999999999999999999-0",
        ] {
            assert_eq!(bad.parse::<AuditId>(), Err(InvalidAuditId), "{bad:?}");
        }
        assert!(id.next() > id);
        let last = AuditId {
            ms: 5,
            seq: u64::MAX,
        };
        assert_eq!(last.next(), AuditId { ms: 6, seq: 0 });
    }

    #[test]
    fn kinds_round_trip_by_name() {
        for k in AuditKind::ALL {
            assert_eq!(k.as_str().parse::<AuditKind>(), Ok(k));
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
        }
        assert!("sold_out".parse::<AuditKind>().is_err());
        assert!("Admitted".parse::<AuditKind>().is_err());
    }
}
