//! The in-memory store: the embedded default for a single process.
//!
//! Same behaviour as the Redis adapter, with one mutex standing in for Lua's
//! atomicity and a broadcast channel standing in for pub/sub. The line is an
//! order-statistic B-tree, so a rank is O(log n) like Redis's `ZRANK`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;

use super::{
    Abandoned, Admitted, ClaimOutcome, EnterOutcome, JoinLimits, LimitKind, Limited,
    PLACES_RETRY_MS, Pass, QueueEvent, QueueStats, Rate, StockState, Store, StoreEvent,
    StoreResult,
};
use crate::queue::{
    EntryToken, Policy, QueueName, QueueSettings, Snapshot, Standing, StockReport, StoredSettings,
    UserId,
};

mod door;
mod settings;
mod stock;

/// Users dropped as absent in one pass at most, as in the Lua script, so a
/// pass stays short however many left at once.
const SWEEP_LIMIT: usize = 500;

/// The in-memory store.
pub struct MemoryStore {
    queues: Mutex<HashMap<QueueName, QueueData>>,
    /// The buckets of [`Store::spend`]: name -> theoretical arrival time.
    buckets: Mutex<Buckets>,
    events: broadcast::Sender<StoreEvent>,
    /// Spent join challenges and join rates (`door.rs`).
    door: door::Door,
    /// Live queue settings (`settings.rs`).
    settings: settings::Settings,
}

/// Rate buckets (GCRA "theoretical arrival times", ms), forgetting full
/// ones every [`SWEEP_BUCKETS_MS`] so the table does not grow with every
/// buyer and address ever seen (a full bucket and none are the same).
struct Buckets<K = String> {
    tat: HashMap<K, u64>,
    swept_at: u64,
}

impl<K> Default for Buckets<K> {
    fn default() -> Self {
        Self {
            tat: HashMap::new(),
            swept_at: 0,
        }
    }
}

const SWEEP_BUCKETS_MS: u64 = 30_000;

impl<K: std::hash::Hash + Eq> Buckets<K> {
    fn spend(&mut self, key: K, rate: Rate, now: u64) -> Result<(), u64> {
        if now >= self.swept_at + SWEEP_BUCKETS_MS {
            self.tat.retain(|_, tat| *tat > now);
            self.swept_at = now;
        }
        let tat = self.tat.get(&key).copied().unwrap_or(0);
        let next = rate.spend(tat, now)?;
        self.tat.insert(key, next);
        Ok(())
    }
}

#[derive(Default)]
struct QueueData {
    /// The line: arrival sequence → user.
    line: indexset::BTreeMap<u64, UserId>,
    seq_of: HashMap<UserId, u64>,
    /// The last entry id handed out (arrival sequence; fast track included).
    last_seq: u64,
    entered_at: HashMap<UserId, u64>,
    /// Last time each waiting user was seen, and the same ordered by time.
    seen: HashMap<UserId, u64>,
    seen_order: BTreeSet<(u64, UserId)>,
    tokens: HashMap<UserId, TokenRecord>,
    /// Token expiry order, for lazy clean-up; doubles as the active set.
    expiry: BTreeSet<(u64, UserId)>,
    bucket: Option<Bucket>,
    pass: u64,
    paused: bool,
    /// Per-buyer request budgets.
    budgets: Buckets<UserId>,
    /// New places per client address.
    address_joins: Buckets<String>,
    /// Places per client address: user -> the entry the place was.
    address_places: HashMap<String, HashMap<UserId, u64>>,
    /// The order service's stock, once reported (`stock.rs`).
    stock: Option<stock::Stock>,
}

struct TokenRecord {
    token: EntryToken,
    /// The entry the token was issued to.
    entry: u64,
    entered_at: u64,
    expires_at: u64,
    claim: Option<(String, u64)>,
}

/// The admission budget: `level` admissions available as of `at`.
struct Bucket {
    level: f64,
    at: u64,
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
            queues: Mutex::new(HashMap::new()),
            buckets: Mutex::new(Buckets::default()),
            events,
            door: door::Door::default(),
            settings: settings::Settings::default(),
        }
    }

    fn with_queue<T>(&self, queue: &QueueName, f: impl FnOnce(&mut QueueData, u64) -> T) -> T {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        let data = queues.entry(queue.clone()).or_insert_with(QueueData::empty);
        let now = now_ms();
        data.expire_tokens(now);
        f(data, now)
    }

    fn publish(&self, queue: &QueueName, event: QueueEvent) {
        // No subscriber is not an error: nobody is streaming.
        let _ = self.events.send(StoreEvent::Queue {
            queue: queue.clone(),
            event,
        });
    }
}

impl QueueData {
    /// An empty queue whose entry ids start at a random point.
    fn empty() -> Self {
        Self {
            last_seq: super::first_entry_id(),
            ..Self::default()
        }
    }

    fn next_entry(&mut self) -> u64 {
        self.last_seq += 1;
        self.last_seq
    }

    fn expire_tokens(&mut self, now: u64) {
        while let Some((at, user)) = self.expiry.first().cloned() {
            if at > now {
                break;
            }
            self.expiry.pop_first();
            self.tokens.remove(&user);
        }
    }

    fn refill(&mut self, policy: &Policy, now: u64) -> f64 {
        let capacity = policy.batch as f64;
        let per_ms = capacity / policy.interval_ms.max(1) as f64;
        let bucket = self.bucket.get_or_insert(Bucket {
            level: capacity,
            at: now,
        });
        let elapsed = now.saturating_sub(bucket.at) as f64;
        bucket.level = (bucket.level + elapsed * per_ms).min(capacity);
        bucket.at = now.max(bucket.at);
        bucket.level
    }

    fn spend(&mut self, n: usize) {
        if let Some(b) = self.bucket.as_mut() {
            b.level -= n as f64;
        }
    }

    fn room(&self, policy: &Policy) -> u64 {
        let holders = self.tokens.len() as u64;
        let room = match policy.max_active {
            Some(max) => max.saturating_sub(holders),
            None => u64::MAX,
        };
        room.min(stock::room(&self.stock, holders))
    }

    fn issue(
        &mut self,
        user: &UserId,
        token: &EntryToken,
        entry: u64,
        entered_at: u64,
        ttl_ms: u64,
        now: u64,
    ) {
        let expires_at = now + ttl_ms;
        self.tokens.insert(
            user.clone(),
            TokenRecord {
                token: token.clone(),
                entry,
                entered_at,
                expires_at,
                claim: None,
            },
        );
        self.expiry.insert((expires_at, user.clone()));
    }

    fn drop_token(&mut self, user: &UserId) -> Option<TokenRecord> {
        let record = self.tokens.remove(user)?;
        self.expiry.remove(&(record.expires_at, user.clone()));
        Some(record)
    }

    /// Removes `user` from the line and its indexes; their sequence number.
    fn unline(&mut self, user: &UserId) -> Option<(u64, u64)> {
        let seq = self.seq_of.remove(user)?;
        self.line.remove(&seq);
        let entered = self.entered_at.remove(user).unwrap_or(0);
        if let Some(seen) = self.seen.remove(user) {
            self.seen_order.remove(&(seen, user.clone()));
        }
        Some((seq, entered))
    }

    /// Whether `user`'s place `entry` lasts (waiting, or its token).
    fn holds(&self, user: &UserId, entry: u64) -> bool {
        self.seq_of.get(user) == Some(&entry)
            || self.tokens.get(user).is_some_and(|t| t.entry == entry)
    }

    /// Live places held by `address`, forgetting ended ones when the count
    /// reaches `max` (as `enter.lua` prunes).
    fn places_held(&mut self, address: &str, max: u32) -> usize {
        let Some(held) = self.address_places.get(address) else {
            return 0;
        };
        if held.len() < max as usize {
            return held.len();
        }
        let live: HashMap<UserId, u64> = held
            .iter()
            .filter(|(u, e)| self.holds(u, **e))
            .map(|(u, e)| (u.clone(), *e))
            .collect();
        let n = live.len();
        if live.is_empty() {
            self.address_places.remove(address);
        } else {
            self.address_places.insert(address.to_owned(), live);
        }
        n
    }

    fn mark_seen(&mut self, user: &UserId, now: u64) {
        if let Some(seen) = self.seen.get_mut(user) {
            self.seen_order.remove(&(*seen, user.clone()));
            *seen = now;
            self.seen_order.insert((now, user.clone()));
        }
    }

    fn snapshot(&self, user: &UserId, now: u64) -> Snapshot {
        let total_waiting = self.line.len() as u64;
        if let Some(t) = self.tokens.get(user) {
            return Snapshot {
                standing: Standing::Ready {
                    token: t.token.clone(),
                    expires_in_ms: t.expires_at.saturating_sub(now),
                },
                total_waiting,
                entered_at_ms: Some(t.entered_at),
                pass: self.pass,
                entry: Some(t.entry),
                sold_out: stock::sold_out(&self.stock),
            };
        }
        if let Some(&seq) = self.seq_of.get(user) {
            return Snapshot {
                standing: Standing::Waiting {
                    rank: self.line.rank(&seq) as u64,
                    seq,
                },
                total_waiting,
                entered_at_ms: self.entered_at.get(user).copied(),
                pass: self.pass,
                entry: Some(seq),
                sold_out: stock::sold_out(&self.stock),
            };
        }
        Snapshot {
            standing: Standing::NotEntered,
            total_waiting,
            entered_at_ms: None,
            pass: self.pass,
            entry: None,
            sold_out: stock::sold_out(&self.stock),
        }
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
        Ok(self.with_queue(queue, |q, now| {
            let limited = |kind, retry_after_ms| {
                Err(Limited {
                    kind,
                    retry_after_ms,
                })
            };
            if q.tokens.contains_key(user) || q.seq_of.contains_key(user) {
                if let Some(budget) = limits.buyer {
                    let entered = q.snapshot(user, now).entered_at_ms;
                    let counts = entered.is_none_or(|at| now.saturating_sub(at) >= budget.grace_ms);
                    if counts && let Err(wait) = q.budgets.spend(user.clone(), budget.rate, now) {
                        return limited(LimitKind::Buyer, wait);
                    }
                }
                q.mark_seen(user, now);
                return Ok(EnterOutcome {
                    created: false,
                    snapshot: q.snapshot(user, now),
                });
            }
            if let Some(address) = &limits.address {
                if let Some(max) = address.places
                    && q.places_held(&address.key, max) >= max as usize
                {
                    return limited(LimitKind::AddressPlaces, PLACES_RETRY_MS);
                }
                if let Some(rate) = address.joins
                    && let Err(wait) = q.address_joins.spend(address.key.clone(), rate, now)
                {
                    return limited(LimitKind::AddressJoins, wait);
                }
            }
            if q.line.is_empty() && !q.paused && q.room(policy) > 0 && q.refill(policy, now) >= 1.0
            {
                q.spend(1);
                let entry = q.next_entry();
                q.issue(user, fast_track_token, entry, now, policy.token_ttl_ms, now);
            } else {
                let seq = q.next_entry();
                q.line.insert(seq, user.clone());
                q.seq_of.insert(user.clone(), seq);
                q.entered_at.insert(user.clone(), now);
                q.seen.insert(user.clone(), now);
                q.seen_order.insert((now, user.clone()));
            }
            let snapshot = q.snapshot(user, now);
            if let Some(address) = &limits.address
                && address.places.is_some()
                && let Some(entry) = snapshot.entry
            {
                q.address_places
                    .entry(address.key.clone())
                    .or_default()
                    .insert(user.clone(), entry);
            }
            Ok(EnterOutcome {
                created: true,
                snapshot,
            })
        }))
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
                && let Err(wait) = q.budgets.spend(user.clone(), rate, now)
            {
                return Err(Limited {
                    kind: LimitKind::Buyer,
                    retry_after_ms: wait,
                });
            }
            if touch {
                q.mark_seen(user, now);
            }
            Ok(q.snapshot(user, now))
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
                q.mark_seen(u, now);
            }
        });
        Ok(())
    }

    async fn leave(&self, queue: &QueueName, user: &UserId, entry: u64) -> StoreResult<bool> {
        // The entry check and the removal under one lock, as in leave.lua.
        let (left, seq) = self.with_queue(queue, |q, _| {
            if q.tokens.get(user).is_some_and(|t| t.entry == entry) {
                q.drop_token(user);
                (true, None)
            } else if q.seq_of.get(user) == Some(&entry) {
                (true, q.unline(user).map(|(seq, _)| seq))
            } else {
                (false, None)
            }
        });
        if left {
            self.publish(
                queue,
                QueueEvent::Left {
                    user: user.clone(),
                    seq,
                },
            );
        }
        Ok(left)
    }

    async fn admit(
        &self,
        queue: &QueueName,
        policy: &Policy,
        tokens: &[EntryToken],
    ) -> StoreResult<Pass> {
        let policy = &self.settings.policy(queue, policy);
        let pass = self.with_queue(queue, |q, now| {
            let busy = !q.line.is_empty();
            let mut abandoned = Vec::new();
            if let Some(after) = policy.abandon_after_ms
                && stock::sweeps(&q.stock, now, after)
            {
                let cutoff = now.saturating_sub(after);
                let stale: Vec<UserId> = q
                    .seen_order
                    .iter()
                    .take_while(|(seen, _)| *seen < cutoff)
                    .take(SWEEP_LIMIT)
                    .map(|(_, u)| u.clone())
                    .collect();
                for user in stale {
                    if let Some((seq, _)) = q.unline(&user) {
                        abandoned.push(Abandoned { user, seq });
                    }
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
                let Some((&seq, user)) = q.line.first_key_value() else {
                    break;
                };
                let user = user.clone();
                let (_, entered) = q.unline(&user).unwrap_or((seq, now));
                let token = &tokens[admitted.len()];
                q.issue(&user, token, seq, entered, policy.token_ttl_ms, now);
                admitted.push(Admitted {
                    user,
                    seq,
                    token: token.as_str().to_owned(),
                    ttl_ms: policy.token_ttl_ms,
                });
            }
            q.spend(admitted.len());
            q.pass += 1;
            Pass {
                pass: q.pass,
                at: now,
                admitted,
                abandoned,
                waiting: q.line.len() as u64,
                busy,
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
        Ok(self.with_queue(queue, |q, now| {
            let Some(record) = q.tokens.get_mut(user) else {
                return ClaimOutcome::Invalid;
            };
            if !record.token.matches(presented) {
                return ClaimOutcome::Invalid;
            }
            if matches!(record.claim, Some((_, until)) if until > now) {
                return ClaimOutcome::InUse;
            }
            let claim_id = EntryToken::generate().as_str().to_owned();
            let until = now + lease_ms;
            record.claim = Some((claim_id.clone(), until));
            if record.expires_at < until {
                let old = record.expires_at;
                record.expires_at = until;
                q.expiry.remove(&(old, user.clone()));
                q.expiry.insert((until, user.clone()));
            }
            ClaimOutcome::Claimed { claim_id }
        }))
    }

    async fn consume(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool> {
        let consumed = self.with_queue(queue, |q, _| {
            let holds = matches!(q.tokens.get(user),
                Some(TokenRecord { claim: Some((id, _)), .. }) if id == claim_id);
            if holds {
                q.drop_token(user);
                stock::note_consumed(&mut q.stock);
            }
            holds
        });
        if consumed {
            self.publish(queue, QueueEvent::Consumed { user: user.clone() });
        }
        Ok(consumed)
    }

    async fn release(&self, queue: &QueueName, user: &UserId, claim_id: &str) -> StoreResult<bool> {
        Ok(self.with_queue(queue, |q, _| match q.tokens.get_mut(user) {
            Some(record) if matches!(&record.claim, Some((id, _)) if id == claim_id) => {
                record.claim = None;
                true
            }
            _ => false,
        }))
    }

    async fn stats(&self, queue: &QueueName) -> StoreResult<QueueStats> {
        Ok(self.with_queue(queue, |q, _| QueueStats {
            waiting: q.line.len() as u64,
            active: q.tokens.len() as u64,
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
            (change, stock::state(&q.stock, q.tokens.len() as u64))
        });
        if change == stock::Change::SoldOut {
            self.publish(queue, QueueEvent::SoldOut);
        }
        state.ok_or_else(|| crate::store::StoreError::Protocol("a report left no stock".into()))
    }

    async fn stock(&self, queue: &QueueName) -> StoreResult<Option<StockState>> {
        Ok(self.with_queue(queue, |q, _| stock::state(&q.stock, q.tokens.len() as u64)))
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
            let Some(record) = q.tokens.get_mut(user) else {
                return false;
            };
            if !matches!(&record.claim, Some((id, _)) if id == claim_id) {
                return false;
            }
            let until = now + lease_ms;
            record.claim = Some((claim_id.to_owned(), until));
            if record.expires_at < until {
                let old = record.expires_at;
                record.expires_at = until;
                q.expiry.remove(&(old, user.clone()));
                q.expiry.insert((until, user.clone()));
            }
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
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = queues.remove(queue) {
            // The entry counter and the pass counter carry on (no old entry
            // id or event id comes back); tokens already issued live out
            // their TTL.
            let fresh = QueueData {
                last_seq: old.last_seq,
                pass: old.pass,
                tokens: old.tokens,
                expiry: old.expiry,
                ..QueueData::default()
            };
            queues.insert(queue.clone(), fresh);
        }
        Ok(had)
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
        let token = EntryToken::generate();
        data.issue(
            &UserId::parse("alice").unwrap(),
            &token,
            7,
            1_000,
            policy.token_ttl_ms,
            1_000,
        );
        let expires_at = 1_000 + policy.token_ttl_ms;
        data.expire_tokens(expires_at - 1);
        assert!(data.tokens.contains_key("alice"));
        assert_eq!(data.room(&policy), 0);
        data.expire_tokens(expires_at);
        assert!(!data.tokens.contains_key("alice") && data.expiry.is_empty());
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
        let queues = store.queues.lock().unwrap();
        let record = &queues[&q()].tokens["alice"];
        let until = record.claim.as_ref().unwrap().1;
        assert!(
            (before + 90_000..=after + 90_000).contains(&until),
            "{until}"
        );
        assert_eq!(record.expires_at, until, "the token lives as long");
    }
}
