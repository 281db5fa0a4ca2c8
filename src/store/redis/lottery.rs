//! The Redis side of a scheduled opening with a lottery: three keys per
//! queue, hash-tagged like the rest of the queue (`lua/lottery_*.lua`
//! describe them), so the draw touches one cluster slot with the line.
//!
//! A pre-queue entry's record is `preEntry:nonce`, and `:entry` is added
//! by the draw: kept afterwards, so a buyer's pre-queue ticket can be
//! matched to their place in line, and their fingerprint shown again.
//!
//! The draw is staged in five more keys (`lua/lottery_begin.lua`), filled
//! a chunk per call and renamed into place by one short commit, so no call
//! holds Redis for long however large the pre-queue.

use async_trait::async_trait;
use redis::{FromRedisValue, ParsingError, Value};

use super::decode::Reply;
use super::limits::rate_args;
use super::reply::pre_join_reply;
use super::{RedisStore, bounded};
use crate::queue::lottery::{commitment, parse_seed};
use crate::queue::{QueueName, UserId};
use crate::store::{AddressLimits, Limited};
use crate::store::{
    DrawStep, LotteryRefusal, LotteryState, LotteryStore, PreEntry, PreJoin, StoreError,
    StoreResult,
};

/// Entries asked for per `HSCAN` page of the pre-queue.
const SCAN_PAGE: usize = 5_000;

/// `opensAt, seed, commitment, state, version, entries` as the lottery
/// scripts answer them; `lottery_read.lua` adds the idle time of a staged
/// draw (`idle`), `lottery_schedule.lua` does not.
fn lottery_state(r: &mut Reply, idle: bool) -> Result<LotteryState, ParsingError> {
    let opens_at = r.count("opens_at")?;
    let seed = r.field("seed")?;
    let commitment = r.field("commitment")?;
    let state: String = r.field("state")?;
    let version = r.count("version")?;
    let entries = r.count("entries")?;
    let staging_idle_ms = if idle {
        let ms: i64 = r.field("staging_idle_ms")?;
        // A stage moved on "in the future" (clock stepped back) is still
        // moving on.
        (ms >= 0 || state == "drawing").then_some(ms.max(0) as u64)
    } else {
        None
    };
    Ok(LotteryState {
        opens_at,
        seed,
        commitment,
        drawn: state == "drawn",
        version,
        entries,
        staging_idle_ms,
    })
}

/// `lottery_read.lua`: `{}` without a lottery; else its state followed,
/// when the pre-queue was asked for, by `user, record` pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LotteryRead(pub Option<(LotteryState, Vec<(UserId, PreEntry)>)>);

impl FromRedisValue for LotteryRead {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let mut r = Reply::of("lottery_read.lua", value)?;
        if r.is_done() {
            return Ok(Self(None));
        }
        let state = lottery_state(&mut r, true)?;
        let mut pre_queue = Vec::new();
        while !r.is_done() {
            let user: String = r.field("user")?;
            let Ok(record) = r.field::<String>("record") else {
                return Err(r.refuse(&format!("no record for {user}")));
            };
            // A record under a name that is not a user id cannot be one of
            // ours: skipped rather than failing the whole draw.
            if let (Ok(user), Some(record)) = (UserId::parse(&user), pre_entry(&record)) {
                pre_queue.push((user, record));
            }
        }
        Ok(Self(Some((state, pre_queue))))
    }
}

/// `lottery_schedule.lua`'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ScheduleReply {
    /// `{'ok', state…}`: scheduled or moved; the lottery as it now is.
    Scheduled(LotteryState),
    /// `{'cleared', 0|1}`: a clear; true if a lottery was there.
    Cleared(bool),
    /// `{'drawn'}`: drawn or being drawn, nothing changed.
    Drawn,
    /// `{'not_empty'}`: a clear refused, the pre-queue holds entries.
    NotEmpty,
}

impl FromRedisValue for ScheduleReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let mut r = Reply::of("lottery_schedule.lua", value)?;
        let kind: String = r.field("kind")?;
        let reply = match kind.as_str() {
            "ok" => Self::Scheduled(lottery_state(&mut r, false)?),
            "cleared" => Self::Cleared(r.flag("cleared")?),
            "drawn" => Self::Drawn,
            "not_empty" => Self::NotEmpty,
            other => return Err(r.refuse(&format!("unknown reply {other}"))),
        };
        r.end()?;
        Ok(reply)
    }
}

/// A draw step's answer (`lottery_begin.lua`, `lottery_stage.lua`,
/// `lottery_commit.lua`): its kind, and a count after `staged` and `drawn`.
impl FromRedisValue for DrawStep {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let mut r = Reply::of("lottery draw step", value)?;
        let kind: String = r.field("kind")?;
        let step = match kind.as_str() {
            // Begun: the stage is this draw's, nothing in it yet.
            "ok" => Self::Staged { staged: 0 },
            "staged" => Self::Staged {
                staged: r.count("staged")?,
            },
            "drawn" => Self::Drawn {
                placed: r.count("placed")?,
            },
            "already" => Self::AlreadyDrawn,
            "stale" => Self::Stale,
            "busy" => Self::Busy,
            "lost" => Self::Lost,
            other => return Err(r.refuse(&format!("unknown step {other}"))),
        };
        r.end()?;
        Ok(step)
    }
}

/// A reply `script` may give but not to this call (a clear's answer to a
/// schedule): the scripts and this adapter disagree.
fn unexpected(script: &str, reply: ScheduleReply) -> StoreError {
    StoreError::Protocol(format!("{script} answered {reply:?} out of turn"))
}

/// Parses a pre-queue record, `preEntry:nonce[:entry]`.
fn pre_entry(raw: &str) -> Option<PreEntry> {
    let mut parts = raw.split(':');
    let pre_entry = parts.next()?.parse().ok()?;
    let nonce = parts.next()?.to_string();
    let entry = match parts.next() {
        Some(e) => Some(e.parse().ok()?),
        None => None,
    };
    Some(PreEntry {
        pre_entry,
        nonce,
        entry,
    })
}

impl RedisStore {
    async fn lottery_schedule(
        &self,
        queue: &QueueName,
        opens_at: Option<u64>,
        seed: &str,
    ) -> StoreResult<ScheduleReply> {
        let keys = self.keys(queue);
        let [lot, pre, _] = keys.lottery();
        let committed = parse_seed(seed).map(|s| commitment(&s)).unwrap_or_default();
        let mut inv = self.scripts.lottery_schedule.prepare_invoke();
        inv.key(lot).key(pre);
        inv.arg(opens_at.map(|t| t.to_string()).unwrap_or_default())
            .arg(seed)
            .arg(committed)
            .arg(&keys.channel);
        let mut conn = self.conn.clone();
        bounded(inv.invoke_async(&mut conn)).await
    }

    /// The lottery, and with `entries` the pre-queue read with it.
    async fn lottery_read(
        &self,
        queue: &QueueName,
        entries: bool,
    ) -> StoreResult<Option<(LotteryState, Vec<(UserId, PreEntry)>)>> {
        let [lot, pre, _] = self.keys(queue).lottery();
        let mut inv = self.scripts.lottery_read.prepare_invoke();
        inv.key(lot).key(pre).arg(if entries { "1" } else { "0" });
        let mut conn = self.conn.clone();
        let LotteryRead(read) = bounded(inv.invoke_async(&mut conn)).await?;
        Ok(read)
    }
}

#[async_trait]
impl LotteryStore for RedisStore {
    async fn schedule_lottery(
        &self,
        queue: &QueueName,
        opens_at: u64,
        seed: &str,
    ) -> StoreResult<Result<LotteryState, LotteryRefusal>> {
        match self.lottery_schedule(queue, Some(opens_at), seed).await? {
            ScheduleReply::Scheduled(state) => Ok(Ok(state)),
            ScheduleReply::Drawn => Ok(Err(LotteryRefusal::Drawn)),
            other => Err(unexpected("lottery_schedule.lua", other)),
        }
    }

    async fn clear_lottery(&self, queue: &QueueName) -> StoreResult<Result<bool, LotteryRefusal>> {
        match self.lottery_schedule(queue, None, "").await? {
            ScheduleReply::Cleared(cleared) => Ok(Ok(cleared)),
            ScheduleReply::Drawn => Ok(Err(LotteryRefusal::Drawn)),
            ScheduleReply::NotEmpty => Ok(Err(LotteryRefusal::NotEmpty)),
            other => Err(unexpected("lottery_schedule.lua", other)),
        }
    }

    async fn lottery(&self, queue: &QueueName) -> StoreResult<Option<LotteryState>> {
        Ok(self.lottery_read(queue, false).await?.map(|(l, _)| l))
    }

    async fn pre_join_limited(
        &self,
        queue: &QueueName,
        user: &UserId,
        nonce: &str,
        address: Option<&AddressLimits>,
    ) -> StoreResult<Result<PreJoin, Limited>> {
        let keys = self.keys(queue);
        let [lot, pre, _] = keys.lottery();
        // Placeholder keys, which the script does not touch, for an
        // address without limits.
        let [joins, places] = keys.address(address.map_or("-", |a| a.key.as_str()));
        let (join_period, join_burst) = rate_args(address.and_then(|a| a.joins));
        let max_places = address.and_then(|a| a.places).unwrap_or(0);
        let reply: redis::Value = self
            .run_for(
                &self.scripts.lottery_join,
                queue,
                &[user],
                {
                    let [stage, stage_seen, stage_pre, _, _] = keys.lottery_stage();
                    vec![lot, pre, joins, places, stage, stage_seen, stage_pre]
                },
                |inv| {
                    inv.arg(user.as_str())
                        .arg(nonce)
                        .arg(crate::store::first_entry_id())
                        .arg(join_period)
                        .arg(join_burst)
                        .arg(max_places);
                },
            )
            .await?;
        pre_join_reply(reply)
    }

    async fn pre_entry(&self, queue: &QueueName, user: &UserId) -> StoreResult<Option<PreEntry>> {
        let [_, pre, _] = self.keys(queue).lottery();
        let mut conn = self.conn.clone();
        let raw: Option<String> = bounded(
            redis::cmd("HGET")
                .arg(pre)
                .arg(user.as_str())
                .query_async(&mut conn),
        )
        .await?;
        Ok(raw.as_deref().and_then(pre_entry))
    }

    async fn pre_leave(
        &self,
        queue: &QueueName,
        user: &UserId,
        pre_entry: u64,
    ) -> StoreResult<bool> {
        let keys = self.keys(queue);
        let [lot, pre, _] = keys.lottery();
        let [stage, stage_seen, stage_pre, left, _] = keys.lottery_stage();
        let mut inv = self.scripts.lottery_leave.prepare_invoke();
        for key in [lot, pre, stage, stage_seen, stage_pre, left] {
            inv.key(key);
        }
        inv.arg(user.as_str()).arg(pre_entry);
        let mut conn = self.conn.clone();
        let removed: i64 = bounded(inv.invoke_async(&mut conn)).await?;
        Ok(removed == 1)
    }

    /// The pre-queue in pages (`HSCAN`), so no reply is huge however
    /// long it is: the version read before the scan is answered, and any
    /// change during the scan bumps it, so a draw computed from a scan
    /// that raced a change is refused (`Stale`) and recomputed.
    async fn pre_queue(&self, queue: &QueueName) -> StoreResult<(u64, Vec<(UserId, PreEntry)>)> {
        let Some((lottery, _)) = self.lottery_read(queue, false).await? else {
            return Ok((0, Vec::new()));
        };
        let [_, pre, _] = self.keys(queue).lottery();
        let mut conn = self.conn.clone();
        // A scan may return an entry twice: one per user.
        let mut found = std::collections::HashMap::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, page): (u64, Vec<String>) = bounded(
                redis::cmd("HSCAN")
                    .arg(&pre)
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(SCAN_PAGE)
                    .query_async(&mut conn),
            )
            .await?;
            for pair in page.chunks(2) {
                if let [user, rec] = pair
                    && let (Ok(user), Some(rec)) = (UserId::parse(user), pre_entry(rec))
                {
                    found.insert(user, rec);
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok((lottery.version, found.into_iter().collect()))
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
        let keys = self.keys(queue).lottery_draw();
        self.run_for(&self.scripts.lottery_begin, queue, &[], keys, |inv| {
            inv.arg(draw)
                .arg(version)
                .arg(entries)
                .arg(crate::store::first_entry_id())
                .arg(abandon_ms)
                .arg(list);
        })
        .await
    }

    async fn draw_stage(
        &self,
        queue: &QueueName,
        draw: &str,
        offset: u64,
        users: &[UserId],
    ) -> StoreResult<DrawStep> {
        let keys = self.keys(queue).lottery_draw();
        self.run_for(&self.scripts.lottery_stage, queue, &[], keys, |inv| {
            inv.arg(draw).arg(offset);
            for user in users {
                inv.arg(user.as_str());
            }
        })
        .await
    }

    async fn draw_commit(&self, queue: &QueueName, draw: &str) -> StoreResult<DrawStep> {
        let keys = self.keys(queue).lottery_draw();
        self.run_for(&self.scripts.lottery_commit, queue, &[], keys, |inv| {
            inv.arg(draw);
        })
        .await
    }

    async fn lottery_list(&self, queue: &QueueName) -> StoreResult<Option<String>> {
        let [_, _, list] = self.keys(queue).lottery();
        let mut conn = self.conn.clone();
        bounded(redis::cmd("GET").arg(list).query_async(&mut conn)).await
    }
}

#[cfg(test)]
mod tests {
    use super::super::decode::tests::{decode, reply, texts};
    use super::*;

    const STATE: [&str; 6] = ["1000", "5eed", "c0mm", "scheduled", "3", "2"];

    #[test]
    fn lottery_reads_decode_by_name() {
        assert_eq!(
            decode::<LotteryRead>(texts(&[])).unwrap(),
            LotteryRead(None)
        );
        let mut fields = STATE.to_vec();
        fields.extend(["-1", "alice", "1:ab", "not a user!", "2:cd", "bob", "x"]);
        let LotteryRead(Some((state, pre_queue))) = decode(texts(&fields)).unwrap() else {
            panic!("a lottery");
        };
        assert_eq!(
            state,
            LotteryState {
                opens_at: 1000,
                seed: "5eed".into(),
                commitment: "c0mm".into(),
                drawn: false,
                version: 3,
                entries: 2,
                staging_idle_ms: None,
            }
        );
        // Only the record that is a user's and reads as one is kept.
        assert_eq!(pre_queue.len(), 1);
        assert_eq!(pre_queue[0].0.as_str(), "alice");
        assert_eq!(pre_queue[0].1.nonce, "ab");
        // A staged draw reports how long it has been idle, even "in the
        // future" (a clock stepped back).
        let mut drawing = STATE.to_vec();
        drawing[3] = "drawing";
        drawing.push("-5");
        let LotteryRead(Some((state, _))) = decode(texts(&drawing)).unwrap() else {
            panic!("a lottery");
        };
        assert_eq!(state.staging_idle_ms, Some(0));
        let short = decode::<LotteryRead>(texts(&STATE)).unwrap_err();
        assert!(
            short.contains("lottery_read.lua") && short.contains("staging_idle_ms"),
            "{short}"
        );
        let mut odd = STATE.to_vec();
        odd.extend(["-1", "alice"]);
        let odd = decode::<LotteryRead>(texts(&odd)).unwrap_err();
        assert!(odd.contains("no record for alice"), "{odd}");
        let mut wrong = STATE.to_vec();
        wrong[4] = "three";
        wrong.push("-1");
        let wrong = decode::<LotteryRead>(texts(&wrong)).unwrap_err();
        assert!(wrong.contains("version"), "{wrong}");
    }

    #[test]
    fn schedule_replies_decode_by_kind() {
        let mut ok = vec!["ok"];
        ok.extend(STATE);
        let ScheduleReply::Scheduled(state) = decode(reply(&ok)).unwrap() else {
            panic!("scheduled");
        };
        assert_eq!((state.opens_at, state.entries), (1000, 2));
        assert_eq!(state.staging_idle_ms, None);
        assert_eq!(
            decode::<ScheduleReply>(reply(&["cleared", "1"])).unwrap(),
            ScheduleReply::Cleared(true)
        );
        assert_eq!(
            decode::<ScheduleReply>(reply(&["drawn"])).unwrap(),
            ScheduleReply::Drawn
        );
        assert_eq!(
            decode::<ScheduleReply>(reply(&["not_empty"])).unwrap(),
            ScheduleReply::NotEmpty
        );
        let short = decode::<ScheduleReply>(reply(&["ok", "1000", "5eed"])).unwrap_err();
        assert!(
            short.contains("lottery_schedule.lua") && short.contains("no commitment"),
            "{short}"
        );
        let wrong = decode::<ScheduleReply>(reply(&["cleared", "yes"])).unwrap_err();
        assert!(wrong.contains("cleared"), "{wrong}");
        assert!(decode::<ScheduleReply>(reply(&["later"])).is_err());
        assert!(decode::<ScheduleReply>(reply(&["drawn", "1"])).is_err());
    }

    #[test]
    fn draw_steps_decode_by_kind() {
        for (fields, step) in [
            (&["ok"][..], DrawStep::Staged { staged: 0 }),
            (&["staged", "1000"], DrawStep::Staged { staged: 1000 }),
            (&["drawn", "7"], DrawStep::Drawn { placed: 7 }),
            (&["already"], DrawStep::AlreadyDrawn),
            (&["stale"], DrawStep::Stale),
            (&["busy"], DrawStep::Busy),
            (&["lost"], DrawStep::Lost),
        ] {
            assert_eq!(decode::<DrawStep>(texts(fields)).unwrap(), step);
        }
        let short = decode::<DrawStep>(texts(&["staged"])).unwrap_err();
        assert!(short.contains("no staged"), "{short}");
        let wrong = decode::<DrawStep>(texts(&["drawn", "seven"])).unwrap_err();
        assert!(wrong.contains("placed"), "{wrong}");
        assert!(decode::<DrawStep>(texts(&["ok", "1"])).is_err());
        assert!(decode::<DrawStep>(texts(&["unknown"])).is_err());
        assert!(decode::<DrawStep>(Value::Int(1)).is_err());
    }

    #[test]
    fn records_parse_before_and_after_the_draw() {
        let before = pre_entry("17:abcd").unwrap();
        assert_eq!((before.pre_entry, before.entry), (17, None));
        assert_eq!(before.nonce, "abcd");
        assert_eq!(pre_entry("17:abcd:99").unwrap().entry, Some(99));
        assert!(pre_entry("x:abcd").is_none());
        assert!(pre_entry("17").is_none());
    }
}
