//! The replies of the line's scripts, decoded by name. A Lua script
//! answers a flat array, so its meaning is its first element: the kind of
//! row (`common.lua`'s `describe()`, `gcra.lua`'s `limited()`, `join.lua`'s
//! `prequeue`, `lottery_join.lua`'s `pre` and `open`). Each reply is read
//! field by field into a named value here, and any other shape is a
//! [`StoreError::Protocol`] naming the script and the field, so no caller
//! picks a tuple apart by position or tells rows apart by their length.

use redis::Value;

use crate::queue::{EntryToken, Snapshot, Standing};
use crate::store::{
    LimitKind, Limited, PLACES_RETRY_MS, PreEntry, PreJoin, StoreError, StoreResult,
};

/// What a join, a status read or a stream refresh answered for one user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum LineReply {
    /// The user's standing after the call (`describe()` and the flags
    /// `with_stock()` appends); `created` when the call made the entry.
    Standing { created: bool, snapshot: Snapshot },
    /// Refused by a limit (`limited()`); nothing changed.
    Limited(Limited),
    /// The user has no place and a lottery waits to be drawn: the join
    /// belongs in the pre-queue. Nothing changed.
    PreQueue { total_waiting: u64 },
}

/// Reads one reply's fields in order, each by name.
struct Fields {
    script: &'static str,
    values: std::vec::IntoIter<Value>,
}

impl Fields {
    fn new(script: &'static str, value: Value) -> StoreResult<Self> {
        match value {
            Value::Array(values) => Ok(Self {
                script,
                values: values.into_iter(),
            }),
            other => Err(bad(script, format!("not a row: {other:?}"))),
        }
    }

    fn next<T: redis::FromRedisValue>(&mut self, field: &str) -> StoreResult<T> {
        let value = self
            .values
            .next()
            .ok_or_else(|| bad(self.script, format!("no {field}")))?;
        redis::from_redis_value(value).map_err(|e| bad(self.script, format!("{field}: {e}")))
    }

    /// The next field if the row has one more (a field only some scripts
    /// append).
    fn optional<T: redis::FromRedisValue>(&mut self, field: &str) -> StoreResult<Option<T>> {
        match self.values.as_slice() {
            [] => Ok(None),
            _ => self.next(field).map(Some),
        }
    }

    /// The row ends here.
    fn end(mut self) -> StoreResult<()> {
        match self.values.next() {
            None => Ok(()),
            Some(extra) => Err(bad(self.script, format!("unexpected {extra:?}"))),
        }
    }
}

fn bad(script: &str, what: String) -> StoreError {
    StoreError::Protocol(format!("{script}: {what}"))
}

/// The flags `row_flags()` (`common.lua`) appends to a standing row: bit 0
/// sold out, bit 1 held by an operator. `enter_many.lua` answers them once
/// for a whole group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Flags {
    pub sold_out: bool,
    pub paused: bool,
}

impl Flags {
    /// The field's name in a reply, for errors.
    pub const FIELD: &'static str = "flags (sold_out, paused)";

    pub fn from_bits(bits: i64) -> Self {
        Self {
            sold_out: bits & 1 == 1,
            paused: bits & 2 == 2,
        }
    }
}

/// `{kind, created, rank, entry, token, ttl_ms, entered_at, total, pass}`
/// as `describe()` lays it out, with -1 / '' where a field does not apply
/// (`limited()` and `prequeue` rows share the layout).
struct Row {
    kind: String,
    created: i64,
    rank: i64,
    /// The entry id: the line's order while waiting, the entry the token
    /// was issued to once admitted.
    entry: i64,
    /// The token, or which limit refused (`limited()`).
    token: String,
    /// The token's time left, or the ms to wait (`limited()`).
    ttl_ms: i64,
    entered_at: i64,
    total: u64,
    pass: u64,
}

impl Row {
    fn read(f: &mut Fields) -> StoreResult<Self> {
        Ok(Self {
            kind: f.next("kind")?,
            created: f.next("created")?,
            rank: f.next("rank")?,
            entry: f.next("entry")?,
            token: f.next("token")?,
            ttl_ms: f.next("ttl_ms")?,
            entered_at: f.next("entered_at")?,
            total: f.next("total")?,
            pass: f.next("pass")?,
        })
    }
}

/// Decodes a reply of `join.lua` (through `enter.lua` or a row of
/// `enter_many.lua`), `status.lua` or one row of `statuses.lua`.
pub(super) fn line_reply(script: &'static str, value: Value) -> StoreResult<LineReply> {
    let mut f = Fields::new(script, value)?;
    let row = Row::read(&mut f)?;
    let reply = match row.kind.as_str() {
        "limited" => LineReply::Limited(limited(script, &row.token, row.ttl_ms)?),
        "prequeue" => LineReply::PreQueue {
            total_waiting: row.total,
        },
        "ready" | "waiting" | "none" => {
            let flags = Flags::from_bits(f.next(Flags::FIELD)?);
            // `status.lua` appends the entry counter to a 'none' row.
            let counter: Option<i64> = f.optional("entry counter")?;
            let entries_issued = counter.and_then(|c| u64::try_from(c).ok());
            return f
                .end()
                .and(standing(script, row, flags))
                .map(|reply| with_entries_issued(reply, entries_issued));
        }
        other => return Err(bad(script, format!("unknown row {other}"))),
    };
    f.end()?;
    Ok(reply)
}

fn standing(script: &str, row: Row, flags: Flags) -> StoreResult<LineReply> {
    let standing = match row.kind.as_str() {
        "ready" => Standing::Ready {
            token: EntryToken::from_stored(row.token),
            expires_in_ms: row.ttl_ms.max(0) as u64,
        },
        "waiting" => Standing::Waiting {
            rank: row.rank.max(0) as u64,
            seq: row.entry.max(0) as u64,
        },
        "none" => Standing::NotEntered,
        other => return Err(bad(script, format!("unknown standing {other}"))),
    };
    let entered = standing != Standing::NotEntered;
    Ok(LineReply::Standing {
        created: row.created == 1,
        snapshot: Snapshot {
            standing,
            total_waiting: row.total,
            entered_at_ms: (row.entered_at >= 0 && entered).then_some(row.entered_at as u64),
            pass: row.pass,
            entry: (row.entry >= 0 && entered).then_some(row.entry as u64),
            sold_out: flags.sold_out,
            paused: flags.paused,
            entries_issued: None,
        },
    })
}

/// `reply` with the entry counter its row carried, if any.
fn with_entries_issued(reply: LineReply, entries_issued: Option<u64>) -> LineReply {
    match reply {
        LineReply::Standing {
            created,
            mut snapshot,
        } => {
            snapshot.entries_issued = entries_issued;
            LineReply::Standing { created, snapshot }
        }
        other => other,
    }
}

/// A new place in line as `enter_many.lua` reports it in a run (rank,
/// entry id and entry time): what `describe()` would have said of it.
pub(super) fn new_place(rank: i64, entry: i64, now: i64, pass: u64, flags: Flags) -> LineReply {
    LineReply::Standing {
        created: true,
        snapshot: Snapshot {
            standing: Standing::Waiting {
                rank: rank.max(0) as u64,
                seq: entry.max(0) as u64,
            },
            total_waiting: rank.max(0) as u64 + 1,
            entered_at_ms: (now >= 0).then_some(now as u64),
            pass,
            entry: (entry >= 0).then_some(entry as u64),
            sold_out: flags.sold_out,
            paused: flags.paused,
            entries_issued: None,
        },
    }
}

/// `limited(kind, wait)` of `gcra.lua`.
fn limited(script: &str, kind: &str, wait_ms: i64) -> StoreResult<Limited> {
    let kind = match kind {
        "buyer" => LimitKind::Buyer,
        "address_joins" => LimitKind::AddressJoins,
        "address_places" => LimitKind::AddressPlaces,
        other => return Err(bad(script, format!("unknown limit {other}"))),
    };
    let retry_after_ms = match kind {
        // Places end when their buyers do: the script cannot know when.
        LimitKind::AddressPlaces => PLACES_RETRY_MS,
        _ => wait_ms.max(1) as u64,
    };
    Ok(Limited {
        kind,
        retry_after_ms,
    })
}

/// Decodes `lottery_join.lua`'s reply: `{'pre', created, preEntry, nonce,
/// entry}`, `{'open'}`, or a `limited()` row.
pub(super) fn pre_join_reply(value: Value) -> StoreResult<Result<PreJoin, Limited>> {
    const SCRIPT: &str = "lottery_join.lua";
    let mut f = Fields::new(SCRIPT, value)?;
    let kind: String = f.next("kind")?;
    let reply = match kind.as_str() {
        "open" => Ok(PreJoin::Open),
        "pre" => {
            let created: i64 = f.next("created")?;
            let pre_entry: i64 = f.next("pre_entry")?;
            let nonce: String = f.next("nonce")?;
            let entry: i64 = f.next("entry")?;
            Ok(PreJoin::Pre {
                entry: PreEntry {
                    pre_entry: pre_entry.max(0) as u64,
                    nonce,
                    entry: (entry >= 0).then_some(entry as u64),
                },
                created: created == 1,
            })
        }
        "limited" => {
            let _created: i64 = f.next("created")?;
            let _rank: i64 = f.next("rank")?;
            let _entry: i64 = f.next("entry")?;
            let which: String = f.next("limit")?;
            let wait_ms: i64 = f.next("wait_ms")?;
            for field in ["entered_at", "total", "pass"] {
                let _: i64 = f.next(field)?;
            }
            Err(limited(SCRIPT, &which, wait_ms)?)
        }
        other => return Err(bad(SCRIPT, format!("unknown reply {other}"))),
    };
    f.end()?;
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(fields: &[&str]) -> Value {
        Value::Array(
            fields
                .iter()
                .map(|f| match f.parse::<i64>() {
                    Ok(n) => Value::Int(n),
                    Err(_) => Value::BulkString(f.as_bytes().to_vec()),
                })
                .collect(),
        )
    }

    #[test]
    fn rows_decode_by_their_kind() {
        let waiting = row(&["waiting", "1", "3", "17", "", "-1", "1000", "4", "9", "1"]);
        let LineReply::Standing { created, snapshot } = line_reply("t", waiting).unwrap() else {
            panic!("a standing");
        };
        assert!(created && snapshot.sold_out);
        assert!(!snapshot.paused);
        assert_eq!(snapshot.standing, Standing::Waiting { rank: 3, seq: 17 });
        assert_eq!(
            (snapshot.entry, snapshot.entered_at_ms),
            (Some(17), Some(1000))
        );
        // Bit 1: held by an operator; bit 0 clear: not sold out.
        let held = row(&["none", "0", "-1", "-1", "", "-1", "-1", "2", "9", "2"]);
        let LineReply::Standing { snapshot, .. } = line_reply("t", held).unwrap() else {
            panic!("a standing");
        };
        assert!(snapshot.paused && !snapshot.sold_out);
        assert_eq!(snapshot.standing, Standing::NotEntered);
        let refused = row(&["limited", "0", "-1", "-1", "buyer", "250", "-1", "0", "0"]);
        assert_eq!(
            line_reply("t", refused).unwrap(),
            LineReply::Limited(Limited {
                kind: LimitKind::Buyer,
                retry_after_ms: 250
            })
        );
        let pre = row(&["prequeue", "0", "-1", "-1", "", "-1", "-1", "0", "0"]);
        assert_eq!(
            line_reply("t", pre).unwrap(),
            LineReply::PreQueue { total_waiting: 0 }
        );
    }

    #[test]
    fn a_bad_shape_is_a_protocol_error_naming_the_field() {
        // A standing without its flags (sold out, held).
        let short = row(&["none", "0", "-1", "-1", "", "-1", "-1", "0", "0"]);
        let err = line_reply("status.lua", short).unwrap_err().to_string();
        assert!(
            err.contains("status.lua") && err.contains("sold_out"),
            "{err}"
        );
        assert!(err.contains("paused"), "{err}");
        let unknown = row(&["later", "0", "-1", "-1", "", "-1", "-1", "0", "0"]);
        assert!(line_reply("t", unknown).is_err());
        assert!(pre_join_reply(row(&["pre", "1", "5"])).is_err());
    }

    #[test]
    fn pre_joins_decode_by_their_kind() {
        assert_eq!(pre_join_reply(row(&["open"])).unwrap(), Ok(PreJoin::Open));
        let Ok(PreJoin::Pre { entry, created }) =
            pre_join_reply(row(&["pre", "1", "5", "abcd", "-1"])).unwrap()
        else {
            panic!("a pre-queue entry");
        };
        assert!(created);
        assert_eq!(
            (entry.pre_entry, entry.nonce.as_str(), entry.entry),
            (5, "abcd", None)
        );
        let refused = row(&[
            "limited",
            "0",
            "-1",
            "-1",
            "address_places",
            "10000",
            "-1",
            "0",
            "0",
        ]);
        assert_eq!(
            pre_join_reply(refused).unwrap().unwrap_err().kind,
            LimitKind::AddressPlaces
        );
    }
}
