//! The line in Redis: joins (one `enter.lua` call, or a group of them
//! through `batch.rs`), standing reads, presence, leaving, the admission
//! pass and the admission turn. Each is one script; replies are decoded
//! in `reply.rs`.

use async_trait::async_trait;

use super::batch::{JoinCall, JoinShared};
use super::limits::rate_args;
use super::reply::{LineReply, line_reply};
use super::{RedisStore, bounded};
use crate::queue::{EntryToken, Policy, QueueName, Snapshot, UserId};
use crate::store::{
    EnterOutcome, JoinLimits, KnownEntry, Limited, LineStore, Pass, QueueEvent, QueueStats, Rate,
    StoreError, StoreResult,
};

impl RedisStore {
    /// One join as `join.lua` takes it: who joins, and what every join of
    /// a group shares (the queue's policy, the limits' numbers), and the
    /// entry time the caller knows.
    fn join_call(
        &self,
        user: &UserId,
        policy: &Policy,
        fast_track_token: &EntryToken,
        limits: &JoinLimits,
        known: Option<KnownEntry>,
    ) -> JoinCall {
        let (budget_period, budget_burst) = rate_args(limits.buyer.map(|b| b.rate));
        let address = limits.address.as_ref();
        let (join_period, join_burst) = rate_args(address.and_then(|a| a.joins));
        JoinCall {
            user: user.clone(),
            token: fast_track_token.clone(),
            address: address.map(|a| a.key.clone()),
            known,
            shared: JoinShared {
                token_ttl_ms: policy.token_ttl_ms,
                batch: policy.batch,
                interval_ms: policy.interval_ms,
                max_active: max_active_arg(policy),
                budget_period,
                budget_burst,
                grace_ms: limits.buyer.map_or(0, |b| b.grace_ms),
                join_period,
                join_burst,
                places: address.and_then(|a| a.places).unwrap_or(0),
            },
        }
    }

    /// One `status.lua` call: `user`'s standing, marked seen with `touch`,
    /// after spending one from `budget`; `known`'s time stands in for its
    /// entry's marks (not read) when `user` waits with that entry.
    async fn run_status(
        &self,
        queue: &QueueName,
        user: &UserId,
        touch: bool,
        budget: Option<Rate>,
        known: Option<KnownEntry>,
    ) -> StoreResult<Result<Snapshot, Limited>> {
        let (period, burst) = rate_args(budget);
        let keys = self.keys(queue);
        let reply: redis::Value = self
            .run_for(
                &self.scripts.status,
                queue,
                &[user],
                vec![keys.budget(user), keys.stock()],
                |inv| {
                    inv.arg(user.as_str())
                        .arg(if touch { "1" } else { "0" })
                        .arg(period)
                        .arg(burst);
                    match known {
                        Some(k) => inv.arg(k.entry).arg(k.entered_at_ms),
                        None => inv.arg("").arg(""),
                    };
                },
            )
            .await?;
        match line_reply("status.lua", reply)? {
            LineReply::Standing { snapshot, .. } => Ok(Ok(snapshot)),
            LineReply::Limited(limited) => Ok(Err(limited)),
            other => Err(StoreError::Protocol(format!("status.lua: {other:?}"))),
        }
    }
}

fn max_active_arg(policy: &Policy) -> i64 {
    policy.max_active.map_or(-1, |m| m as i64)
}

#[async_trait]
impl LineStore for RedisStore {
    async fn enter_known(
        &self,
        queue: &QueueName,
        user: &UserId,
        policy: &Policy,
        fast_track_token: &EntryToken,
        limits: &JoinLimits,
        known: Option<KnownEntry>,
    ) -> StoreResult<Result<EnterOutcome, Limited>> {
        let call = self.join_call(user, policy, fast_track_token, limits, known);
        let reply = match &self.batcher {
            Some(batcher) => batcher.join(queue, call).await?,
            None => {
                let keys = call.enter_keys(&self.keys(queue));
                let reply: redis::Value = self
                    .run_durable(&self.scripts.enter, queue, &[user], keys, |cmd| {
                        call.push_enter_args(cmd)
                    })
                    .await?;
                line_reply("enter.lua", reply)?
            }
        };
        Ok(match reply {
            LineReply::Standing { created, snapshot } => Ok(EnterOutcome {
                created,
                snapshot,
                pre_queue: false,
            }),
            LineReply::Limited(limited) => Err(limited),
            LineReply::PreQueue { total_waiting } => Ok(EnterOutcome::pre_queue(total_waiting)),
        })
    }

    async fn status_limited(
        &self,
        queue: &QueueName,
        user: &UserId,
        touch: bool,
        budget: Option<Rate>,
    ) -> StoreResult<Result<Snapshot, Limited>> {
        self.run_status(queue, user, touch, budget, None).await
    }

    async fn status_known(
        &self,
        queue: &QueueName,
        user: &UserId,
        budget: Option<Rate>,
        known: Option<KnownEntry>,
    ) -> StoreResult<Result<Snapshot, Limited>> {
        self.run_status(queue, user, false, budget, known).await
    }

    async fn statuses(&self, queue: &QueueName, users: &[UserId]) -> StoreResult<Vec<Snapshot>> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<redis::Value> = self
            .run_for(
                &self.scripts.statuses,
                queue,
                &users.iter().collect::<Vec<_>>(),
                vec![self.keys(queue).stock()],
                |inv| {
                    for u in users {
                        inv.arg(u.as_str());
                    }
                },
            )
            .await?;
        rows.into_iter()
            .map(|row| match line_reply("statuses.lua", row)? {
                LineReply::Standing { snapshot, .. } => Ok(snapshot),
                other => Err(StoreError::Protocol(format!("statuses.lua: {other:?}"))),
            })
            .collect()
    }

    async fn touch(&self, queue: &QueueName, users: &[UserId]) -> StoreResult<()> {
        if users.is_empty() {
            return Ok(());
        }
        let _: i64 = self
            .run(&self.scripts.touch, queue, |inv| {
                for u in users {
                    inv.arg(u.as_str());
                }
            })
            .await?;
        Ok(())
    }

    async fn leave(&self, queue: &QueueName, user: &UserId, entry: u64) -> StoreResult<bool> {
        let n: i64 = self
            .run_for(
                &self.scripts.leave,
                queue,
                &[user],
                vec![self.keys(queue).audit()],
                |inv| {
                    inv.arg(user.as_str()).arg(entry);
                },
            )
            .await?;
        Ok(n == 1)
    }

    async fn admit(
        &self,
        queue: &QueueName,
        policy: &Policy,
        tokens: &[EntryToken],
    ) -> StoreResult<Pass> {
        let keys = self.keys(queue);
        let json: String = self
            .run_durable(
                &self.scripts.admit,
                queue,
                &[],
                vec![keys.settings(), keys.stock(), keys.audit()],
                |inv| {
                    inv.arg(policy.token_ttl_ms)
                        .arg(policy.batch)
                        .arg(policy.interval_ms)
                        .arg(max_active_arg(policy))
                        .arg(policy.abandon_after_ms.unwrap_or(0));
                    for t in tokens {
                        inv.arg(t.as_str());
                    }
                },
            )
            .await?;
        let pass = match serde_json::from_str(&json) {
            Ok(QueueEvent::Pass(pass)) => pass,
            Ok(other) => return Err(StoreError::Protocol(format!("admit returned {other:?}"))),
            Err(e) => {
                return Err(StoreError::Protocol(format!(
                    "admit returned bad JSON: {e}"
                )));
            }
        };
        if self.wait_replicas > 0 {
            // The script left publishing to us: the tokens are announced
            // only now that replicas hold them.
            if pass.busy || !pass.abandoned.is_empty() {
                let mut conn = self.conn.clone();
                bounded(conn.publish(self.keys(queue).channel(), &json)).await?;
            }
        }
        Ok(pass)
    }

    async fn stats(&self, queue: &QueueName) -> StoreResult<QueueStats> {
        self.run(&self.scripts.stats, queue, |_| {}).await
    }

    async fn take_pass_turn(&self, queue: &QueueName, hold_ms: u64) -> StoreResult<bool> {
        let mut inv = self.scripts.turn.prepare_invoke();
        inv.key(self.keys(queue).turn())
            .arg(self.turn_holder.as_str())
            .arg(hold_ms.max(1));
        let mut conn = self.conn.clone();
        let taken: i64 = bounded(inv.invoke_async(&mut conn)).await?;
        Ok(taken == 1)
    }

    async fn set_paused(&self, queue: &QueueName, paused: bool) -> StoreResult<bool> {
        let changed: i64 = self
            .run(&self.scripts.pause, queue, |inv| {
                inv.arg(if paused { "1" } else { "0" });
            })
            .await?;
        Ok(changed == 1)
    }
}

/// `stats.lua`'s reply, `{waiting, active, pass, paused (1/0)}`, read by
/// name (see `decode.rs`).
impl redis::FromRedisValue for QueueStats {
    fn from_redis_value(value: redis::Value) -> Result<Self, redis::ParsingError> {
        let mut r = super::decode::Reply::of("stats.lua", value)?;
        let stats = Self {
            waiting: r.count("waiting")?,
            active: r.count("active")?,
            pass: r.count("pass")?,
            paused: r.flag("paused")?,
        };
        r.end()?;
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::super::decode::tests::{decode, reply};
    use super::*;

    #[test]
    fn stats_decode_by_name() {
        let stats: QueueStats = decode(reply(&["7", "2", "41", "1"])).unwrap();
        assert_eq!(
            stats,
            QueueStats {
                waiting: 7,
                active: 2,
                pass: 41,
                paused: true
            }
        );
        let short = decode::<QueueStats>(reply(&["7", "2", "41"])).unwrap_err();
        assert!(
            short.contains("stats.lua") && short.contains("no paused"),
            "{short}"
        );
        let long = decode::<QueueStats>(reply(&["7", "2", "41", "0", "9"])).unwrap_err();
        assert!(long.contains("unexpected"), "{long}");
        let wrong = decode::<QueueStats>(reply(&["7", "many", "41", "0"])).unwrap_err();
        assert!(wrong.contains("active"), "{wrong}");
        let flag = decode::<QueueStats>(reply(&["7", "2", "41", "2"])).unwrap_err();
        assert!(flag.contains("paused"), "{flag}");
        assert!(
            decode::<QueueStats>(redis::Value::Int(7)).is_err(),
            "not an array"
        );
    }
}
