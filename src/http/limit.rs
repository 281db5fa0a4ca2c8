//! The per-buyer request budget, so one buyer (a misbehaving client, a
//! page stuck in a reload loop, a script) cannot turn its own requests
//! into load on the store or fish for its token over and over.
//!
//! The rule: a buyer's position polls, stream opens and repeat joins share
//! ONE budget per buyer and queue, 10 at once and 2 a second after that
//! (a token bucket, kept as a GCRA "theoretical arrival time"). Over it, a
//! request is answered `429 rate_limited` with `Retry-After`.
//!
//! - A **first join** (the store created the entry) never counts: it is the
//!   one request every buyer must make.
//! - A **repeat join** counts only once its entry is older than
//!   [`REPEAT_JOIN_GRACE`] (from the entry's creation, store clock).
//!   Duplicates of the very first join (double submits, retries after a
//!   lost answer, tabs restoring together) arrive within it and are answered
//!   as usual, so 50 concurrent first joins of one buyer give one `201` and
//!   49 × `200`. A page may still repeat its join on reload: ten reloads at
//!   once, then one every half second.
//! - **Flood control**: a join from a buyer already over budget is refused
//!   *before* the store is asked, so a flood of joins costs the store about
//!   two calls a second, not one per request. Only a buyer with an entry can
//!   spend the budget, so the only first join this could refuse is a rejoin
//!   right after the entry ended; a leave through this instance lifts the
//!   pre-check for the next join, and an entry that ended otherwise (token
//!   consumed or expired, dropped as absent) waits out a `Retry-After` of at
//!   most five seconds.
//! - Polls and stream opens are counted before their store read, so an
//!   over-budget one costs nothing either.
//!
//! Honest clients stay far below: the fastest polling tier is one request a
//! second, and a stream is opened once and kept. Budgets are per instance,
//! like the load a client can put on it; a rate per client address belongs
//! to the gateway in front. Leaves are not counted (they end the entry and
//! are cheap for the push hub), nor is anything of other buyers.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use crate::queue::{QueueName, UserId};

/// Sustained requests per second per buyer and queue.
pub const PER_SECOND: u32 = 2;
/// Requests a buyer may send at once (reloads, several tabs, retries).
pub const BURST: u32 = 10;
/// How long after an entry was created repeat joins are taken for
/// duplicates of the first and not counted.
pub const REPEAT_JOIN_GRACE: Duration = Duration::from_secs(2);

/// How often buyers with a full budget are dropped from the table.
const FORGET_IDLE_EVERY: Duration = Duration::from_secs(30);

/// Independent locks, so buyers on different cores rarely wait on each other.
const SHARDS: usize = 16;

type Key = (QueueName, UserId);

/// One buyer's budget in one queue.
struct Budget {
    /// When the budget would be full again (GCRA): each counted request
    /// pushes it one period further; a request is refused when that would
    /// put it more than `BURST` periods ahead of now.
    full_at: Instant,
    /// The buyer left through this instance since their last counted
    /// request: their next join may create an entry, so it is not refused
    /// before the store answers.
    left: bool,
}

/// The per-buyer budgets of one instance.
pub struct RequestLimits {
    shards: Vec<Mutex<HashMap<Key, Budget>>>,
    hasher: RandomState,
    period: Duration,
    burst: u32,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self::new(PER_SECOND, BURST)
    }
}

impl RequestLimits {
    /// Budgets of `burst` at once and `per_second` sustained.
    pub fn new(per_second: u32, burst: u32) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            period: Duration::from_secs(1) / per_second.max(1),
            burst: burst.max(1),
        }
    }

    fn shard(&self, key: &Key) -> std::sync::MutexGuard<'_, HashMap<Key, Budget>> {
        let i = (self.hasher.hash_one(key) as usize) % self.shards.len();
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long until one more request fits, `None` if it fits now.
    fn wait(&self, budget: Option<&Budget>, now: Instant) -> Option<Duration> {
        let full_at = budget.map_or(now, |b| b.full_at.max(now));
        let ahead = full_at + self.period - now;
        let allowed = self.period * self.burst;
        (ahead > allowed).then(|| ahead - allowed)
    }

    /// Counts one request of `user` in `queue` at `now`: `Err(wait)` when
    /// over budget (nothing is counted then).
    fn spend_at(&self, key: Key, now: Instant) -> Result<(), Duration> {
        let mut shard = self.shard(&key);
        if let Some(wait) = self.wait(shard.get(&key), now) {
            return Err(wait);
        }
        let budget = shard.entry(key).or_insert(Budget {
            full_at: now,
            left: false,
        });
        budget.full_at = budget.full_at.max(now) + self.period;
        budget.left = false;
        Ok(())
    }

    /// Counts one poll or stream open of `user` in `queue`; `429` with the
    /// wait when over budget.
    pub fn check(&self, queue: &QueueName, user: &UserId) -> Result<(), ApiError> {
        self.spend_at((queue.clone(), user.clone()), Instant::now())
            .map_err(too_many)
    }

    /// Before a join reaches the store: `429` if `user` is already over
    /// budget, unless they left through this instance since (their join
    /// may be a first one). Counts nothing.
    pub fn before_join(&self, queue: &QueueName, user: &UserId) -> Result<(), ApiError> {
        let key = (queue.clone(), user.clone());
        let shard = self.shard(&key);
        let budget = shard.get(&key);
        if budget.is_some_and(|b| b.left) {
            return Ok(());
        }
        match self.wait(budget, Instant::now()) {
            Some(wait) => Err(too_many(wait)),
            None => Ok(()),
        }
    }

    /// After the store answered a join: counts it if it was a repeat join
    /// past the grace window (see the module doc). `entered_at_ms` is the
    /// entry's creation time on the store's clock, if known.
    pub fn after_join(
        &self,
        queue: &QueueName,
        user: &UserId,
        created: bool,
        entered_at_ms: Option<u64>,
    ) -> Result<(), ApiError> {
        let key = (queue.clone(), user.clone());
        if created {
            if let Some(b) = self.shard(&key).get_mut(&key) {
                b.left = false;
            }
            return Ok(());
        }
        if !join_counts(entered_at_ms, unix_ms()) {
            return Ok(());
        }
        self.spend_at(key, Instant::now()).map_err(too_many)
    }

    /// `user` left `queue` through this instance: their next join is not
    /// refused before the store answers.
    pub fn note_left(&self, queue: &QueueName, user: &UserId) {
        let key = (queue.clone(), user.clone());
        if let Some(b) = self.shard(&key).get_mut(&key) {
            b.left = true;
        }
    }

    /// Forgets idle buyers every `FORGET_IDLE_EVERY` until `shutdown`
    /// (a task of its own: the table is this module's business alone).
    pub async fn housekeeping(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(FORGET_IDLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => self.forget_idle(),
            }
        }
    }

    /// Forgets buyers whose budget is full again, so the table does not
    /// grow with every buyer ever seen (a full budget and no entry at all
    /// mean the same).
    pub fn forget_idle(&self) {
        let now = Instant::now();
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            shard.retain(|_, b| b.full_at > now);
            shard.shrink_to_fit();
        }
    }
}

/// Whether a repeat join of an entry created at `entered_at_ms` counts at
/// `now_ms` (both ms since the epoch; the store's clock and ours). An
/// unknown creation time counts, and a creation time ahead of our clock
/// (skew) is taken as "just now".
pub fn join_counts(entered_at_ms: Option<u64>, now_ms: u64) -> bool {
    match entered_at_ms {
        None => true,
        Some(at) => now_ms.saturating_sub(at) >= REPEAT_JOIN_GRACE.as_millis() as u64,
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn too_many(wait: Duration) -> ApiError {
    metrics::counter!("waitroom_rate_limited_total").increment(1);
    ApiError::TooManyRequests {
        message: "too many requests from this buyer; polls, stream opens and repeat joins \
                  share a budget of 10 at once and 2 a second"
            .into(),
        retry_after_secs: wait.as_secs_f64().ceil().max(1.0) as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(user: &str) -> Key {
        (
            QueueName::parse("default").unwrap(),
            UserId::parse(user).unwrap(),
        )
    }

    #[test]
    fn a_burst_then_the_sustained_rate() {
        let limits = RequestLimits::new(2, 10);
        let t = Instant::now();
        for i in 0..10 {
            assert!(
                limits.spend_at(key("a"), t).is_ok(),
                "request {i} of the burst"
            );
        }
        let wait = limits.spend_at(key("a"), t).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert!(
            limits.spend_at(key("b"), t).is_ok(),
            "budgets are per buyer"
        );
        let later = t + Duration::from_millis(500);
        assert!(limits.spend_at(key("a"), later).is_ok());
        assert!(limits.spend_at(key("a"), later).is_err());
        // Five seconds idle fill the whole burst again.
        let idle = later + Duration::from_secs(5);
        for _ in 0..10 {
            assert!(limits.spend_at(key("a"), idle).is_ok());
        }
        assert!(limits.spend_at(key("a"), idle).is_err());
    }

    #[test]
    fn a_refused_request_costs_nothing() {
        let limits = RequestLimits::new(2, 1);
        let t = Instant::now();
        assert!(limits.spend_at(key("a"), t).is_ok());
        for _ in 0..100 {
            assert!(limits.spend_at(key("a"), t).is_err());
        }
        assert!(
            limits
                .spend_at(key("a"), t + Duration::from_millis(500))
                .is_ok(),
            "refusals do not push the budget further away"
        );
    }

    #[test]
    fn repeat_joins_count_only_past_the_grace_window() {
        let created = 1_700_000_000_000;
        assert!(!join_counts(Some(created), created));
        assert!(!join_counts(Some(created), created + 1_999));
        assert!(join_counts(Some(created), created + 2_000));
        assert!(
            !join_counts(Some(created + 5_000), created),
            "a store clock ahead of ours means just created"
        );
        assert!(join_counts(None, created), "unknown age counts");
    }

    #[test]
    fn a_leave_lifts_the_join_precheck_until_the_next_counted_request() {
        let limits = RequestLimits::new(2, 1);
        let (q, u) = key("a");
        limits.check(&q, &u).unwrap();
        assert!(limits.before_join(&q, &u).is_err(), "over budget");
        limits.note_left(&q, &u);
        assert!(limits.before_join(&q, &u).is_ok(), "may be a first join");
        limits.after_join(&q, &u, true, Some(unix_ms())).unwrap();
        assert!(limits.before_join(&q, &u).is_err(), "in line again");
    }

    #[tokio::test]
    async fn the_clean_up_task_forgets_idle_buyers_and_stops_on_shutdown() {
        let limits = Arc::new(RequestLimits::new(1000, 1));
        let (q, u) = key("a");
        limits.check(&q, &u).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(limits.clone().housekeeping(shutdown.clone()));
        let empty = || limits.shards.iter().all(|s| s.lock().unwrap().is_empty());
        let deadline = Instant::now() + Duration::from_secs(5);
        while !empty() {
            assert!(Instant::now() < deadline, "the first round runs at once");
            tokio::task::yield_now().await;
        }
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stops on shutdown")
            .unwrap();
    }

    #[test]
    fn idle_buyers_are_forgotten() {
        let limits = RequestLimits::new(1000, 1);
        let (q, u) = key("a");
        limits.check(&q, &u).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        limits.forget_idle();
        assert!(limits.shards.iter().all(|s| s.lock().unwrap().is_empty()));
    }
}
