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

/// A draw step's reply.
fn step(script: &str, reply: &[String]) -> StoreResult<DrawStep> {
    let count = |n: &str| n.parse().map_err(|_| protocol(script, &reply));
    Ok(
        match reply.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["ok"] => DrawStep::Staged { staged: 0 },
            ["staged", n] => DrawStep::Staged { staged: count(n)? },
            ["drawn", n] => DrawStep::Drawn { placed: count(n)? },
            ["already"] => DrawStep::AlreadyDrawn,
            ["stale"] => DrawStep::Stale,
            ["busy"] => DrawStep::Busy,
            ["lost"] => DrawStep::Lost,
            _ => return Err(protocol(script, &reply)),
        },
    )
}

fn protocol(what: &str, reply: &impl std::fmt::Debug) -> StoreError {
    StoreError::Protocol(format!("{what} returned {reply:?}"))
}

/// Parses a pre-queue record, `preEntry:nonce[:entry]`.
fn record(raw: &str) -> Option<PreEntry> {
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

/// `opensAt, seed, commitment, state, version, entries` as the scripts
/// answer them, and `lottery_read.lua`'s idle time of a staged draw after.
fn state(f: &[String]) -> Option<LotteryState> {
    Some(LotteryState {
        opens_at: f.first()?.parse().ok()?,
        seed: f.get(1)?.clone(),
        commitment: f.get(2)?.clone(),
        drawn: f.get(3)? == "drawn",
        version: f.get(4)?.parse().ok()?,
        entries: f.get(5)?.parse().ok()?,
        staging_idle_ms: f
            .get(6)
            .and_then(|ms| ms.parse::<i64>().ok())
            .and_then(|ms| {
                // A stage moved on "in the future" (clock stepped back) is
                // still moving on.
                (ms >= 0 || f.get(3)? == "drawing").then_some(ms.max(0) as u64)
            }),
    })
}

impl RedisStore {
    pub(super) async fn lottery_schedule(
        &self,
        queue: &QueueName,
        opens_at: Option<u64>,
        seed: &str,
    ) -> StoreResult<Vec<String>> {
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
    pub(super) async fn lottery_read(
        &self,
        queue: &QueueName,
        entries: bool,
    ) -> StoreResult<Option<(LotteryState, Vec<(UserId, PreEntry)>)>> {
        let [lot, pre, _] = self.keys(queue).lottery();
        let mut inv = self.scripts.lottery_read.prepare_invoke();
        inv.key(lot).key(pre).arg(if entries { "1" } else { "0" });
        let mut conn = self.conn.clone();
        let reply: Vec<String> = bounded(inv.invoke_async(&mut conn)).await?;
        if reply.is_empty() {
            return Ok(None);
        }
        let lottery = state(&reply).ok_or_else(|| protocol("lottery_read.lua", &reply))?;
        let mut list = Vec::new();
        for pair in reply[7..].chunks(2) {
            let [user, rec] = pair else {
                return Err(protocol("lottery_read.lua", &pair));
            };
            // A record under a name that is not a user id cannot be one of
            // ours: skipped rather than failing the whole draw.
            if let (Ok(user), Some(rec)) = (UserId::parse(user), record(rec)) {
                list.push((user, rec));
            }
        }
        Ok(Some((lottery, list)))
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
        let reply = self.lottery_schedule(queue, Some(opens_at), seed).await?;
        match reply.first().map(String::as_str) {
            Some("drawn") => Ok(Err(LotteryRefusal::Drawn)),
            Some("ok") => state(&reply[1..])
                .map(Ok)
                .ok_or_else(|| protocol("lottery_schedule.lua", &reply)),
            _ => Err(protocol("lottery_schedule.lua", &reply)),
        }
    }

    async fn clear_lottery(&self, queue: &QueueName) -> StoreResult<Result<bool, LotteryRefusal>> {
        let reply = self.lottery_schedule(queue, None, "").await?;
        match reply.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["drawn"] => Ok(Err(LotteryRefusal::Drawn)),
            ["not_empty"] => Ok(Err(LotteryRefusal::NotEmpty)),
            ["cleared", n] => Ok(Ok(n == "1")),
            _ => Err(protocol("lottery_schedule.lua", &reply)),
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
        Ok(raw.as_deref().and_then(record))
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
                    && let (Ok(user), Some(rec)) = (UserId::parse(user), record(rec))
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
        let reply: Vec<String> = self
            .run_for(&self.scripts.lottery_begin, queue, &[], keys, |inv| {
                inv.arg(draw)
                    .arg(version)
                    .arg(entries)
                    .arg(crate::store::first_entry_id())
                    .arg(abandon_ms)
                    .arg(list);
            })
            .await?;
        step("lottery_begin.lua", &reply)
    }

    async fn draw_stage(
        &self,
        queue: &QueueName,
        draw: &str,
        offset: u64,
        users: &[UserId],
    ) -> StoreResult<DrawStep> {
        let keys = self.keys(queue).lottery_draw();
        let reply: Vec<String> = self
            .run_for(&self.scripts.lottery_stage, queue, &[], keys, |inv| {
                inv.arg(draw).arg(offset);
                for user in users {
                    inv.arg(user.as_str());
                }
            })
            .await?;
        step("lottery_stage.lua", &reply)
    }

    async fn draw_commit(&self, queue: &QueueName, draw: &str) -> StoreResult<DrawStep> {
        let keys = self.keys(queue).lottery_draw();
        let reply: Vec<String> = self
            .run_for(&self.scripts.lottery_commit, queue, &[], keys, |inv| {
                inv.arg(draw);
            })
            .await?;
        step("lottery_commit.lua", &reply)
    }

    async fn lottery_list(&self, queue: &QueueName) -> StoreResult<Option<String>> {
        let [_, _, list] = self.keys(queue).lottery();
        let mut conn = self.conn.clone();
        bounded(redis::cmd("GET").arg(list).query_async(&mut conn)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_before_and_after_the_draw() {
        let before = record("17:abcd").unwrap();
        assert_eq!((before.pre_entry, before.entry), (17, None));
        assert_eq!(before.nonce, "abcd");
        assert_eq!(record("17:abcd:99").unwrap().entry, Some(99));
        assert!(record("x:abcd").is_none());
        assert!(record("17").is_none());
    }
}
