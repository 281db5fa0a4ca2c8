//! The line in the memory store: joins, standing, leaving and admission
//! passes, each one step under the queue's lock (what the Lua scripts'
//! atomicity is for Redis). The data they work on is `queue.rs` and
//! `buyers.rs`.

use async_trait::async_trait;

use super::buyers::State;
use super::{MemoryStore, SWEEP_LIMIT, lottery, stock};
use crate::queue::audit::AuditKind;
use crate::queue::{EntryToken, Policy, QueueName, Snapshot, Standing, UserId};
use crate::store::{
    Abandoned, Admitted, EnterOutcome, JoinLimits, KnownEntry, LimitKind, Limited, LineStore,
    PLACES_RETRY_MS, Pass, QueueEvent, QueueStats, Rate, StoreResult,
};

#[async_trait]
impl LineStore for MemoryStore {
    /// Entry times here cost nothing to read: `known` is not needed.
    async fn enter_known(
        &self,
        queue: &QueueName,
        user: &UserId,
        policy: &Policy,
        fast_track_token: &EntryToken,
        limits: &JoinLimits,
        _known: Option<KnownEntry>,
    ) -> StoreResult<Result<EnterOutcome, Limited>> {
        let outcome = self.with_queue(queue, |q, now| {
            let limited = |kind, retry_after_ms| {
                Err(Limited {
                    kind,
                    retry_after_ms,
                })
            };
            if let Some(id) = q.buyers.find(user.as_str()) {
                if let Some(budget) = limits.buyer {
                    let entered = q.buyers.get(id).map(|b| b.entered_at);
                    let counts = entered.is_none_or(|at| now.saturating_sub(at) >= budget.grace_ms);
                    if counts && let Err(wait) = q.spend_budget(user, budget.rate, now) {
                        return limited(LimitKind::Buyer, wait);
                    }
                }
                q.buyers.touch(id, now);
                return Ok(EnterOutcome {
                    created: false,
                    snapshot: q.snapshot_of(Some(id), now),
                    pre_queue: false,
                });
            }
            // Without a place while a lottery waits to be drawn: the
            // pre-queue (decided under the lock, like the Lua join).
            if q.lottery.as_ref().is_some_and(lottery::Lottery::pending) {
                return Ok(EnterOutcome::pre_queue(q.waiting() as u64));
            }
            if let Some(address) = &limits.address {
                if let Some(max) = address.places
                    && q.places_held(&address.key, max) + lottery::pre_places_held(q, &address.key)
                        >= max as usize
                {
                    return limited(LimitKind::AddressPlaces, PLACES_RETRY_MS);
                }
                if let Some(rate) = address.joins
                    && let Err(wait) = q.address_joins.spend(address.key.clone(), rate, now)
                {
                    return limited(LimitKind::AddressJoins, wait);
                }
            }
            let id = if q.waiting() == 0
                && !q.paused
                && q.room(policy) > 0
                && q.refill(policy, now) >= 1.0
            {
                q.spend(1);
                let id = q.fast_track(user, fast_track_token, policy.token_ttl_ms, now);
                let entry = q.buyers.get(id).map(|b| b.entry);
                let max = self.audit_max_len;
                q.audit.append(
                    max,
                    now,
                    AuditKind::Admitted,
                    Some(user.as_str()),
                    entry,
                    None,
                );
                id
            } else {
                q.join_line(user, now)
            };
            let snapshot = q.snapshot_of(Some(id), now);
            if let Some(address) = &limits.address
                && address.places.is_some()
                && let Some(entry) = snapshot.entry
            {
                q.note_place(&address.key, id, entry);
            }
            Ok(EnterOutcome {
                created: true,
                snapshot,
                pre_queue: false,
            })
        });
        if let Ok(o) = &outcome
            && o.created
            && let Standing::Ready { .. } = o.snapshot.standing
        {
            let at = o.snapshot.entered_at_ms.unwrap_or_default();
            self.publish(queue, QueueEvent::FastTracked { at });
        }
        Ok(outcome)
    }

    async fn status_limited(
        &self,
        queue: &QueueName,
        user: &UserId,
        touch: bool,
        budget: Option<Rate>,
    ) -> StoreResult<Result<Snapshot, Limited>> {
        Ok(self.with_queue(queue, |q, now| {
            if let Some(rate) = budget
                && let Err(wait) = q.spend_budget(user, rate, now)
            {
                return Err(Limited {
                    kind: LimitKind::Buyer,
                    retry_after_ms: wait,
                });
            }
            let id = q.buyers.find(user.as_str());
            if touch && let Some(id) = id {
                q.buyers.touch(id, now);
            }
            Ok(q.snapshot_of(id, now))
        }))
    }

    async fn statuses(&self, queue: &QueueName, users: &[UserId]) -> StoreResult<Vec<Snapshot>> {
        Ok(self.with_queue(queue, |q, now| {
            users
                .iter()
                .map(|u| {
                    let mut s = q.snapshot(u, now);
                    if matches!(s.standing, Standing::Waiting { .. }) {
                        s.entered_at_ms = None; // as cheap as the Redis adapter's
                    }
                    s
                })
                .collect()
        }))
    }

    async fn touch(&self, queue: &QueueName, users: &[UserId]) -> StoreResult<()> {
        self.with_queue(queue, |q, now| {
            for u in users {
                if let Some(id) = q.buyers.find(u.as_str()) {
                    q.buyers.touch(id, now);
                }
            }
        });
        Ok(())
    }

    async fn leave(&self, queue: &QueueName, user: &UserId, entry: u64) -> StoreResult<bool> {
        // The entry check and the removal under one lock, as in leave.lua.
        let left = self.with_queue(queue, |q, now| {
            let id = q.buyers.find(user.as_str())?;
            if q.buyers.get(id)?.entry != entry {
                return None;
            }
            let buyer = q.remove(id)?;
            let max = self.audit_max_len;
            q.audit.append(
                max,
                now,
                AuditKind::Left,
                Some(user.as_str()),
                Some(entry),
                None,
            );
            Some(match buyer.state {
                State::Waiting { .. } => Some(buyer.entry),
                State::Ready(_) => None,
            })
        });
        let Some(seq) = left else {
            return Ok(false);
        };
        self.publish(
            queue,
            QueueEvent::Left {
                user: user.clone(),
                seq,
            },
        );
        Ok(true)
    }

    /// One instance holds a memory store, so its turn is always its own.
    async fn take_pass_turn(&self, _queue: &QueueName, _hold_ms: u64) -> StoreResult<bool> {
        Ok(true)
    }

    async fn admit(
        &self,
        queue: &QueueName,
        policy: &Policy,
        tokens: &[EntryToken],
    ) -> StoreResult<Pass> {
        let policy = &self.settings.policy(queue, policy);
        let pass = self.with_queue(queue, |q, now| {
            let busy = q.waiting() > 0;
            let mut abandoned = Vec::new();
            if let Some(after) = policy.abandon_after_ms
                && stock::sweeps(&q.stock, now, after)
            {
                let cutoff = now.saturating_sub(after);
                while abandoned.len() < SWEEP_LIMIT {
                    let Some((id, seen)) = q.buyers.oldest_seen() else {
                        break;
                    };
                    if seen >= cutoff {
                        break;
                    }
                    let Some(gone) = q.remove(id) else {
                        break;
                    };
                    abandoned.push(Abandoned {
                        user: gone.user,
                        seq: gone.entry,
                    });
                }
            }
            let budget = if q.paused {
                0
            } else {
                q.refill(policy, now).floor().max(0.0) as u64
            };
            let n = budget
                .min(q.room(policy))
                .min(tokens.len() as u64)
                .min(policy.batch as u64) as usize;
            let mut admitted = Vec::with_capacity(n);
            while admitted.len() < n {
                let Some(id) = q.head() else {
                    break;
                };
                let token = &tokens[admitted.len()];
                q.admit(id, token, policy.token_ttl_ms, now);
                let Some(buyer) = q.buyers.get(id) else {
                    break;
                };
                admitted.push(Admitted {
                    user: buyer.user.clone(),
                    seq: buyer.entry,
                    token: token.as_str().to_owned(),
                    ttl_ms: policy.token_ttl_ms,
                });
            }
            q.spend(admitted.len());
            q.pass += 1;
            let (max, pass) = (self.audit_max_len, Some(q.pass));
            for a in &abandoned {
                let user = Some(a.user.as_str());
                q.audit
                    .append(max, now, AuditKind::Abandoned, user, Some(a.seq), pass);
            }
            for a in &admitted {
                let user = Some(a.user.as_str());
                q.audit
                    .append(max, now, AuditKind::Admitted, user, Some(a.seq), pass);
            }
            Pass {
                pass: q.pass,
                at: now,
                admitted,
                abandoned,
                waiting: q.waiting() as u64,
                busy,
                held: q.paused,
            }
        });
        if pass.busy || !pass.abandoned.is_empty() {
            self.publish(queue, QueueEvent::Pass(pass.clone()));
        }
        Ok(pass)
    }

    async fn stats(&self, queue: &QueueName) -> StoreResult<QueueStats> {
        Ok(self.with_queue(queue, |q, _| QueueStats {
            waiting: q.waiting() as u64,
            active: q.active() as u64,
            pass: q.pass,
            paused: q.paused,
        }))
    }

    async fn set_paused(&self, queue: &QueueName, paused: bool) -> StoreResult<bool> {
        Ok(self.with_queue(queue, |q, _| {
            std::mem::replace(&mut q.paused, paused) != paused
        }))
    }
}
