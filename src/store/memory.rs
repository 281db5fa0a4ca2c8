//! The in-memory store: the embedded default for a single process.
//!
//! Same behaviour as the Redis adapter, with a lock per queue standing in
//! for Lua's atomicity and a broadcast channel standing in for pub/sub.
//! Queues never wait on each other: the map of queues is only locked to
//! find one (or add it), and each queue's data has its own mutex. Inside
//! a queue, each buyer is one record (`buyers.rs`) and the line an
//! order-statistic B-tree of entry ids (`queue.rs`), so a join stays short
//! at a million waiting. Tokens are generated before a lock is taken.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::store::AddressLimits;
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;

use super::{
    Abandoned, AdaptiveRead, AdaptiveState, Admitted, ClaimOutcome, DrawStep, EnterOutcome,
    JoinLimits, LimitKind, Limited, LotteryRefusal, LotteryState, OrderSignal, PLACES_RETRY_MS,
    Pass, PreEntry, PreJoin, QueueEvent, QueueStats, Rate, StockState, Store, StoreEvent,
    StoreResult,
};
use crate::queue::audit::{AuditEntry, AuditId, AuditKind, AuditPage, AuditQuery};
use crate::queue::{
    EntryToken, Policy, QueueName, QueueSettings, Snapshot, Standing, StockReport, StoredSettings,
    UserId,
};

mod adaptive;
mod audit;
mod buckets;
mod buyers;
mod door;
mod lottery;
mod queue;
mod settings;
mod stock;

use buckets::Buckets;
use buyers::State;
use queue::QueueData;

/// Users dropped as absent in one pass at most, as in the Lua script, so a
/// pass stays short however many left at once.
const SWEEP_LIMIT: usize = 500;

/// The in-memory store.
pub struct MemoryStore {
    queues: RwLock<HashMap<QueueName, Arc<Mutex<QueueData>>>>,
    /// The buckets of [`Store::spend`]: name -> theoretical arrival time.
    buckets: Mutex<Buckets>,
    events: broadcast::Sender<StoreEvent>,
    /// Spent join challenges and join rates (`door.rs`).
    door: door::Door,
    /// Live queue settings (`settings.rs`).
    settings: settings::Settings,
    /// Entries kept per queue's audit log (0: none).
    audit_max_len: u64,
    /// Adaptive admission's samples and decisions (`adaptive.rs`).
    adaptive: adaptive::Adaptive,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(4096);
        Self {
            queues: RwLock::new(HashMap::new()),
            buckets: Mutex::new(Buckets::default()),
            events,
            door: door::Door::default(),
            settings: settings::Settings::default(),
            audit_max_len: crate::queue::audit::DEFAULT_AUDIT_MAX_LEN,
            adaptive: adaptive::Adaptive::default(),
        }
    }

    /// Keeps at most `max_len` entries of each queue's audit log, or none
    /// with 0 (see [`crate::queue::audit`]).
    pub fn with_audit_max_len(mut self, max_len: u64) -> Self {
        self.audit_max_len = max_len;
        self
    }

    /// `queue`'s data, created empty on first use.
    fn queue(&self, queue: &QueueName) -> Arc<Mutex<QueueData>> {
        let found = self
            .queues
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(queue)
            .cloned();
        found.unwrap_or_else(|| {
            let mut queues = self.queues.write().unwrap_or_else(|e| e.into_inner());
            queues
                .entry(queue.clone())
                .or_insert_with(|| Arc::new(Mutex::new(QueueData::empty())))
                .clone()
        })
    }

    fn with_queue<T>(&self, queue: &QueueName, f: impl FnOnce(&mut QueueData, u64) -> T) -> T {
        let data = self.queue(queue);
        let mut data = data.lock().unwrap_or_else(|e| e.into_inner());
        let now = now_ms();
        data.expire_tokens(now);
        f(&mut data, now)
    }

    fn publish(&self, queue: &QueueName, event: QueueEvent) {
        // No subscriber is not an error: nobody is streaming.
        let _ = self.events.send(StoreEvent::Queue {
            queue: queue.clone(),
            event,
        });
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn enter_limited(
        &self,
        queue: &QueueName,
        user: &UserId,
        policy: &Policy,
        fast_track_token: &EntryToken,
        limits: &JoinLimits,
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

    async fn spend(&self, bucket: &str, rate: Rate) -> StoreResult<Result<(), Limited>> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        Ok(buckets
            .spend(bucket.to_owned(), rate, now_ms())
            .map_err(|wait| Limited {
                kind: LimitKind::Bucket,
                retry_after_ms: wait,
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

    async fn claim(
        &self,
        queue: &QueueName,
        user: &UserId,
        presented: &str,
        lease_ms: u64,
    ) -> StoreResult<ClaimOutcome> {
        // Made before the lock: most claims are granted.
        let claim_id = EntryToken::generate().as_str().to_owned();
        Ok(self.with_queue(queue, |q, now| {
            let Some((id, token)) = q.token_mut(user) else {
                return ClaimOutcome::Invalid;
            };
            if !token.token.matches(presented) {
                return ClaimOutcome::Invalid;
            }
            if matches!(token.claim, Some((_, until)) if until > now) {
                return ClaimOutcome::InUse;
            }
            let until = now + lease_ms;
            token.claim = Some((claim_id.clone(), until));
            q.extend(id, until);
            ClaimOutcome::Claimed { claim_id }
        }))
    }

    async fn token_holder(
        &self,
        queue: &QueueName,
        presented: &str,
    ) -> StoreResult<Option<UserId>> {
        Ok(self.with_queue(queue, |q, _| q.token_holder(presented)))
    }

    async fn consume(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool> {
        let consumed = self.with_queue(queue, |q, now| {
            let Some((id, token)) = q.token_mut(user) else {
                return false;
            };
            let holds = matches!(&token.claim, Some((held, _)) if held == claim_id);
            if holds {
                let entry = q.remove(id).map(|b| b.entry);
                stock::note_consumed(&mut q.stock);
                let max = self.audit_max_len;
                q.audit.append(
                    max,
                    now,
                    AuditKind::Consumed,
                    Some(user.as_str()),
                    entry,
                    None,
                );
            }
            holds
        });
        if consumed {
            self.publish(queue, QueueEvent::Consumed { user: user.clone() });
        }
        Ok(consumed)
    }

    async fn release(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool> {
        Ok(self.with_queue(queue, |q, now| match q.token_mut(user) {
            Some((id, token)) if matches!(&token.claim, Some((c, _)) if c == claim_id) => {
                token.claim = None;
                let entry = q.buyers.get(id).map(|b| b.entry);
                let max = self.audit_max_len;
                q.audit.append(
                    max,
                    now,
                    AuditKind::Released,
                    Some(user.as_str()),
                    entry,
                    None,
                );
                true
            }
            _ => false,
        }))
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

    async fn set_stock(&self, queue: &QueueName, report: StockReport) -> StoreResult<StockState> {
        let (change, state) = self.with_queue(queue, |q, now| {
            let change = stock::report(&mut q.stock, report, now);
            if change == stock::Change::SoldOut {
                let max = self.audit_max_len;
                q.audit
                    .append(max, now, AuditKind::SoldOut, None, None, None);
            }
            (change, stock::state(&q.stock, q.active() as u64))
        });
        if change == stock::Change::SoldOut {
            self.publish(queue, QueueEvent::SoldOut);
        }
        state.ok_or_else(|| crate::store::StoreError::Protocol("a report left no stock".into()))
    }

    async fn stock(&self, queue: &QueueName) -> StoreResult<Option<StockState>> {
        Ok(self.with_queue(queue, |q, _| stock::state(&q.stock, q.active() as u64)))
    }

    async fn ping(&self) -> StoreResult<()> {
        Ok(())
    }

    fn subscribe(&self, queues: &[QueueName]) -> BoxStream<'static, StoreEvent> {
        let wanted: Vec<QueueName> = queues.to_vec();
        BroadcastStream::new(self.events.subscribe())
            .filter_map(move |item| {
                let out = match item {
                    Ok(StoreEvent::Queue { queue, event }) if wanted.contains(&queue) => {
                        Some(StoreEvent::Queue { queue, event })
                    }
                    Ok(StoreEvent::Queue { .. }) => None,
                    Ok(StoreEvent::Resync) => Some(StoreEvent::Resync),
                    Ok(StoreEvent::Interrupted) => Some(StoreEvent::Interrupted),
                    // A slow listener missed events: it must re-read state.
                    Err(_) => Some(StoreEvent::Resync),
                };
                futures::future::ready(out)
            })
            .boxed()
    }

    async fn renew_claim(
        &self,
        queue: &QueueName,
        user: &UserId,
        claim_id: &str,
        lease_ms: u64,
    ) -> StoreResult<bool> {
        Ok(self.with_queue(queue, |q, now| {
            // Expired tokens are already gone (`with_queue`).
            let Some((id, token)) = q.token_mut(user) else {
                return false;
            };
            if !matches!(&token.claim, Some((held, _)) if held == claim_id) {
                return false;
            }
            let until = now + lease_ms;
            token.claim = Some((claim_id.to_owned(), until));
            q.extend(id, until);
            true
        }))
    }

    async fn spend_once(&self, queue: &QueueName, key: &str, ttl_ms: u64) -> StoreResult<bool> {
        Ok(self.door.spend_once(queue, key, ttl_ms, now_ms()))
    }

    async fn note_joins(
        &self,
        queue: &QueueName,
        joins: u64,
        threshold: u64,
        hold_ms: u64,
    ) -> StoreResult<u64> {
        Ok(self
            .door
            .note_joins(queue, joins, threshold, hold_ms, now_ms()))
    }

    async fn list_queues(&self) -> StoreResult<Vec<QueueName>> {
        Ok(self.settings.list())
    }

    async fn queue_settings(&self, queue: &QueueName) -> StoreResult<Option<StoredSettings>> {
        Ok(self.settings.get(queue))
    }

    async fn put_queue_settings(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
        only_if_new: bool,
    ) -> StoreResult<(StoredSettings, bool)> {
        Ok(self.settings.put(queue, settings, only_if_new, now_ms()))
    }

    async fn report_streams(
        &self,
        instance: &str,
        streams: u64,
        ttl_ms: u64,
    ) -> StoreResult<Vec<(String, u64)>> {
        let now = now_ms();
        Ok(self
            .settings
            .report_streams(instance, streams, now + ttl_ms, now))
    }

    async fn delete_queue(&self, queue: &QueueName) -> StoreResult<bool> {
        let had = self.settings.remove(queue);
        self.adaptive.remove(queue);
        self.with_queue(queue, |q, _| q.clear_line());
        Ok(had)
    }

    async fn audit_page(&self, queue: &QueueName, query: AuditQuery) -> StoreResult<AuditPage> {
        Ok(self.with_queue(queue, |q, _| q.audit.page(query)))
    }

    async fn audit_take(
        &self,
        queue: &QueueName,
        group: &str,
        start: AuditId,
        consumer: &str,
        idle_ms: u64,
        count: usize,
    ) -> StoreResult<Vec<AuditEntry>> {
        Ok(self.with_queue(queue, |q, now| {
            q.audit.take(group, start, consumer, idle_ms, count, now)
        }))
    }

    async fn audit_hold(
        &self,
        queue: &QueueName,
        group: &str,
        consumer: &str,
        ids: &[AuditId],
    ) -> StoreResult<()> {
        self.with_queue(queue, |q, now| q.audit.hold(group, consumer, ids, now));
        Ok(())
    }

    async fn audit_ack(&self, queue: &QueueName, group: &str, ids: &[AuditId]) -> StoreResult<()> {
        self.with_queue(queue, |q, _| q.audit.ack(group, ids));
        Ok(())
    }

    async fn record_order(
        &self,
        queue: &QueueName,
        signal: OrderSignal,
        window_ms: u64,
    ) -> StoreResult<()> {
        self.adaptive.record(queue, signal, window_ms, now_ms());
        Ok(())
    }

    async fn adaptive_read(&self, queue: &QueueName, window_ms: u64) -> StoreResult<AdaptiveRead> {
        Ok(self.adaptive.read(queue, window_ms, now_ms()))
    }

    async fn adaptive_apply(
        &self,
        queue: &QueueName,
        decision: &AdaptiveState,
        batch: Option<u32>,
        settings_version: u64,
        _window_ms: u64,
    ) -> StoreResult<bool> {
        Ok(self.adaptive.apply(
            &self.settings,
            queue,
            decision,
            batch,
            settings_version,
            now_ms(),
        ))
    }

    async fn schedule_lottery(
        &self,
        queue: &QueueName,
        opens_at: u64,
        seed: &str,
    ) -> StoreResult<Result<LotteryState, LotteryRefusal>> {
        Ok(self.lottery_schedule(queue, opens_at, seed))
    }

    async fn clear_lottery(&self, queue: &QueueName) -> StoreResult<Result<bool, LotteryRefusal>> {
        Ok(self.lottery_clear(queue))
    }

    async fn lottery(&self, queue: &QueueName) -> StoreResult<Option<LotteryState>> {
        Ok(self.lottery_state(queue))
    }

    async fn pre_join_limited(
        &self,
        queue: &QueueName,
        user: &UserId,
        nonce: &str,
        address: Option<&AddressLimits>,
    ) -> StoreResult<Result<PreJoin, Limited>> {
        Ok(self.lottery_pre_join(queue, user, nonce, address))
    }

    async fn pre_entry(&self, queue: &QueueName, user: &UserId) -> StoreResult<Option<PreEntry>> {
        Ok(self.lottery_pre_entry(queue, user))
    }

    async fn pre_leave(
        &self,
        queue: &QueueName,
        user: &UserId,
        pre_entry: u64,
    ) -> StoreResult<bool> {
        Ok(self.lottery_pre_leave(queue, user, pre_entry))
    }

    async fn pre_queue(&self, queue: &QueueName) -> StoreResult<(u64, Vec<(UserId, PreEntry)>)> {
        Ok(self.lottery_pre_queue(queue))
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
        Ok(self.lottery_begin(queue, draw, version, entries, list, abandon_ms))
    }

    async fn draw_stage(
        &self,
        queue: &QueueName,
        draw: &str,
        offset: u64,
        users: &[UserId],
    ) -> StoreResult<DrawStep> {
        Ok(self.lottery_stage(queue, draw, offset, users))
    }

    async fn draw_commit(&self, queue: &QueueName, draw: &str) -> StoreResult<DrawStep> {
        let step = self.lottery_commit(queue, draw);
        if matches!(step, DrawStep::Drawn { .. }) {
            self.publish(queue, QueueEvent::Drawn);
        }
        Ok(step)
    }

    async fn lottery_list(&self, queue: &QueueName) -> StoreResult<Option<String>> {
        Ok(self.lottery_published(queue))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn q() -> QueueName {
        QueueName::parse("default").unwrap()
    }

    /// A budget that never refills: every join waits in line.
    fn closed() -> Policy {
        Policy {
            batch: 0,
            interval_ms: 1_000,
            token_ttl_ms: 60_000,
            max_active: Some(1),
            abandon_after_ms: None,
        }
    }

    /// A restarted store must not hand out the entry ids of the last one:
    /// a ticket signed for an old entry would match the new place.
    #[tokio::test]
    async fn each_store_starts_its_entry_ids_at_a_random_point() {
        let alice = UserId::parse("alice").unwrap();
        let mut entries = HashSet::new();
        for _ in 0..3 {
            let store = MemoryStore::new();
            let out = store
                .enter(&q(), &alice, &closed(), &EntryToken::generate())
                .await
                .unwrap();
            entries.insert(out.snapshot.entry.unwrap());
        }
        assert_eq!(entries.len(), 3, "{entries:?}");
    }

    /// A token is over from its expiry on (the same instant a Redis key
    /// with that expiry goes), and frees its slot.
    #[test]
    fn a_token_ends_at_its_expiry() {
        let policy = closed();
        let mut data = QueueData::empty();
        let alice = UserId::parse("alice").unwrap();
        data.fast_track(&alice, &EntryToken::generate(), policy.token_ttl_ms, 1_000);
        let expires_at = 1_000 + policy.token_ttl_ms;
        data.expire_tokens(expires_at - 1);
        assert!(data.buyers.find("alice").is_some());
        assert_eq!(data.room(&policy), 0);
        data.expire_tokens(expires_at);
        assert!(data.buyers.find("alice").is_none() && data.active() == 0);
        assert_eq!(data.room(&policy), 1);
    }

    fn open(batch: u32) -> Policy {
        Policy {
            batch,
            interval_ms: 3_600_000,
            token_ttl_ms: 60_000,
            max_active: None,
            abandon_after_ms: None,
        }
    }

    /// Every pass gets the next number: SSE ids and the streams' "already
    /// counted" checks rest on it.
    #[tokio::test]
    async fn pass_numbers_grow_by_one() {
        let store = MemoryStore::new();
        let mut last = store.stats(&q()).await.unwrap().pass;
        for _ in 0..3 {
            let pass = store.admit(&q(), &open(1), &[]).await.unwrap();
            assert_eq!(pass.pass, last + 1);
            last = pass.pass;
        }
        assert_eq!(store.stats(&q()).await.unwrap().pass, last);
    }

    /// Subscribers hear of their own queues only, and not of a pass over
    /// an empty line that dropped nobody.
    #[tokio::test]
    async fn only_news_of_the_queues_subscribed_is_published() {
        let store = MemoryStore::new();
        let other = QueueName::parse("other").unwrap();
        let mut events = store.subscribe(&[q()]);
        let alice = UserId::parse("alice").unwrap();
        for queue in [&other, &q()] {
            store.admit(queue, &open(1), &[]).await.unwrap();
            let out = store
                .enter(queue, &alice, &closed(), &EntryToken::generate())
                .await
                .unwrap();
            let entry = out.snapshot.entry.unwrap();
            assert!(store.leave(queue, &alice, entry).await.unwrap());
        }
        let first = tokio::time::timeout(std::time::Duration::from_secs(5), events.next())
            .await
            .unwrap();
        match first {
            Some(StoreEvent::Queue {
                queue,
                event: QueueEvent::Left { user, .. },
            }) => assert_eq!((queue, user.as_str()), (q(), "alice")),
            other => panic!("{other:?}"),
        }
    }

    /// A renewed claim holds for the lease asked, not for ever.
    #[tokio::test]
    async fn a_renewed_claim_lasts_its_lease() {
        let store = MemoryStore::new();
        let alice = UserId::parse("alice").unwrap();
        let token = EntryToken::generate();
        store.enter(&q(), &alice, &open(1), &token).await.unwrap();
        let ClaimOutcome::Claimed { claim_id } = store
            .claim(&q(), &alice, token.as_str(), 1_000)
            .await
            .unwrap()
        else {
            panic!("no claim");
        };
        let before = now_ms();
        assert!(
            store
                .renew_claim(&q(), &alice, &claim_id, 90_000)
                .await
                .unwrap()
        );
        let after = now_ms();
        let (until, expires_at) = store.with_queue(&q(), |data, _| {
            let (_, token) = data.token_mut(&alice).unwrap();
            (token.claim.as_ref().unwrap().1, token.expires_at)
        });
        assert!(
            (before + 90_000..=after + 90_000).contains(&until),
            "{until}"
        );
        assert_eq!(expires_at, until, "the token lives as long");
    }

    /// Many tasks joining, leaving, touching and admitting on several
    /// queues at once: afterwards each queue's ranks are 0..n-1 in arrival
    /// order, nobody stands twice, every token is older than every place
    /// in line (first come, first served) and the counts match.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_joins_leaves_and_passes_keep_every_queue_consistent() {
        let store = std::sync::Arc::new(MemoryStore::new());
        let queues: Vec<QueueName> = (0..3)
            .map(|i| QueueName::parse(&format!("q{i}")).unwrap())
            .collect();
        let policy = Policy {
            batch: 5,
            interval_ms: 1,
            token_ttl_ms: 600_000,
            max_active: None,
            abandon_after_ms: None,
        };
        let user = |t: usize, i: usize| UserId::parse(&format!("t{t}-u{i}")).unwrap();
        let (tasks, per_task) = (8, 400);
        let mut handles = Vec::new();
        for t in 0..tasks {
            let (store, queues, policy) = (store.clone(), queues.clone(), policy.clone());
            handles.push(tokio::spawn(async move {
                for i in 0..per_task {
                    let q = &queues[(t + i) % queues.len()];
                    let u = user(t, i);
                    let out = store
                        .enter(q, &u, &policy, &EntryToken::generate())
                        .await
                        .unwrap();
                    assert!(out.created, "{u:?} is new");
                    let token = EntryToken::generate();
                    let again = store.enter(q, &u, &policy, &token).await.unwrap();
                    assert!(!again.created, "{u:?} twice");
                    if i % 5 == 0 {
                        let entry = out.snapshot.entry.unwrap();
                        assert!(store.leave(q, &u, entry).await.unwrap());
                    }
                    if i % 7 == 0 {
                        store.touch(q, &[u.clone(), user(t, 0)]).await.unwrap();
                    }
                    if i % 40 == 0 {
                        let tokens: Vec<EntryToken> =
                            (0..5).map(|_| EntryToken::generate()).collect();
                        store.admit(q, &policy, &tokens).await.unwrap();
                    }
                }
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        for (k, q) in queues.iter().enumerate() {
            let mine: Vec<(usize, UserId)> = (0..tasks)
                .flat_map(|t| (0..per_task).map(move |i| (t, i)))
                .filter(|(t, i)| (t + i) % queues.len() == k)
                .map(|(t, i)| (i, user(t, i)))
                .collect();
            let users: Vec<UserId> = mine.iter().map(|(_, u)| u.clone()).collect();
            let snaps = store.statuses(q, &users).await.unwrap();
            let (mut waiting, mut ready) = (Vec::new(), Vec::new());
            for ((i, u), s) in mine.iter().zip(&snaps) {
                match &s.standing {
                    Standing::Waiting { rank, seq } => waiting.push((*seq, *rank)),
                    Standing::Ready { .. } => ready.push(s.entry.unwrap()),
                    Standing::NotEntered => assert_eq!(i % 5, 0, "{u:?} lost"),
                }
                if i % 5 == 0 {
                    assert_eq!(s.standing, Standing::NotEntered, "{u:?} left");
                }
            }
            waiting.sort_unstable();
            let ranks: Vec<u64> = waiting.iter().map(|(_, r)| *r).collect();
            assert_eq!(ranks, (0..waiting.len() as u64).collect::<Vec<_>>());
            let stats = store.stats(q).await.unwrap();
            assert_eq!(stats.waiting, waiting.len() as u64);
            assert_eq!(stats.active, ready.len() as u64);
            let left = mine.iter().filter(|(i, _)| i % 5 == 0).count();
            assert_eq!(mine.len(), waiting.len() + ready.len() + left, "counts");
            if let (Some(newest_token), Some((oldest_place, _))) =
                (ready.iter().max(), waiting.first())
            {
                assert!(newest_token < oldest_place, "served out of order");
            }
        }
    }

    /// A budget lives in the buyer's record while they have one, and
    /// outlives it: leaving and joining again does not refill it.
    #[tokio::test]
    async fn a_spent_budget_is_not_refilled_by_leaving_and_joining_again() {
        let store = MemoryStore::new();
        let alice = UserId::parse("alice").unwrap();
        let once = Rate {
            period_ms: 3_600_000,
            burst: 1,
        };
        let queue = q();
        let poll = || store.status_limited(&queue, &alice, true, Some(once));
        assert!(poll().await.unwrap().is_ok(), "spent before joining");
        let token = EntryToken::generate();
        let out = store.enter(&q(), &alice, &closed(), &token).await.unwrap();
        let refused = poll().await.unwrap().unwrap_err();
        assert_eq!(refused.kind, LimitKind::Buyer);
        let entry = out.snapshot.entry.unwrap();
        assert!(store.leave(&q(), &alice, entry).await.unwrap());
        assert!(poll().await.unwrap().is_err(), "refilled by leaving");
        store.enter(&q(), &alice, &closed(), &token).await.unwrap();
        assert!(poll().await.unwrap().is_err(), "refilled by joining");
        let bob = UserId::parse("bob").unwrap();
        let bobs = store.status_limited(&q(), &bob, true, Some(once)).await;
        assert!(bobs.unwrap().is_ok(), "budgets are per buyer");
    }
}
