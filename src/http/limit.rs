//! Request limits: the per-buyer budget and the per-address limits, kept in
//! the store so every instance counts against the same ones, and this
//! instance's "refused until" cache in front of them.
//!
//! **The per-buyer budget.** A buyer's position polls, stream opens and
//! repeat joins share ONE budget per buyer and queue, 10 at once and 2 a
//! second after that (a GCRA bucket in the store, spent in the same script
//! that reads the status, so a poll stays one round trip). Over it, a
//! request is answered `429 rate_limited` with `Retry-After`.
//!
//! - A **first join** (the store creates the entry) never counts: it is
//!   the one request every buyer must make.
//! - A **repeat join** counts only once its entry is older than
//!   [`REPEAT_JOIN_GRACE`] (from the entry's creation, store clock).
//!   Duplicates of the very first join (double submits, retries after a
//!   lost answer, tabs restoring together) arrive within it and are
//!   answered as usual, so 50 concurrent first joins of one buyer give one
//!   `201` and 49 × `200`. A page may still repeat its join on reload: ten
//!   reloads at once, then one every half second.
//! - **Flood control**: once the store refused a buyer, this instance
//!   refuses their polls, stream opens and joins *before* the store is
//!   asked until the wait the store named is over, so a flood costs the
//!   store about one call per refusal window, not one per request. A leave
//!   through this instance lifts the pre-check for the next join (it may
//!   be a first one).
//!
//! **Per client address** (the client as `client.rs` finds it; IPv6 by
//! /64), all instances together, each `0` to turn off:
//! - new places per queue and minute (`--joins-per-address-per-minute`,
//!   that many at once, then evenly over the minute), `429
//!   address_rate_limited`;
//! - places held at once per queue (`--places-per-address`, live places
//!   only), `429 address_places_limited`;
//! - new visitor ids per minute in visitor mode
//!   (`--visitors-per-address-per-minute`), `429 visitor_rate_limited`.
//!
//! Repeat joins never count against an address: a crowd behind one NAT
//! address keeps its places whatever its newcomers do. An address refused
//! for its join rate or its places has its next joins refused here,
//! before the store, until the wait is over, except a join that shows the
//! buyer's ticket for the queue (a repeat join: the store decides). Polls
//! and streams of that address are never refused for its limits.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::client::ClientKey;
use crate::error::ApiError;
use crate::error::ErrorCode;
use crate::queue::{QueueName, UserId};
use crate::store::{AddressLimits, BuyerBudget, JoinLimits, LimitKind, Limited, Rate};

/// Sustained requests per second per buyer and queue.
pub const PER_SECOND: u32 = 2;
/// Requests a buyer may send at once (reloads, several tabs, retries).
pub const BURST: u32 = 10;
/// How long after an entry was created repeat joins are taken for
/// duplicates of the first and not counted.
pub const REPEAT_JOIN_GRACE: Duration = Duration::from_secs(2);

/// How often expired refusals are dropped from the cache.
const FORGET_IDLE_EVERY: Duration = Duration::from_secs(30);

/// Independent locks, so requests on different cores rarely wait on each
/// other.
const SHARDS: usize = 16;

/// What a refusal is cached for.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Subject {
    Buyer(QueueName, UserId),
    Address(QueueName, ClientKey),
}

/// The per-address limits, from the configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct AddressPolicy {
    /// New places per address, queue and minute (0: off).
    pub joins_per_minute: u32,
    /// Places held per address and queue (0: off).
    pub places: u32,
    /// New visitors per address and minute (0: off).
    pub visitors_per_minute: u32,
}

/// This instance's side of the request limits.
pub struct RequestLimits {
    shards: Vec<Mutex<HashMap<Subject, Instant>>>,
    hasher: RandomState,
    budget: Rate,
    address: AddressPolicy,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self::new(PER_SECOND, BURST, AddressPolicy::default())
    }
}

impl RequestLimits {
    /// Budgets of `burst` at once and `per_second` sustained; `address`
    /// the per-address limits.
    pub fn new(per_second: u32, burst: u32, address: AddressPolicy) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            budget: Rate {
                period_ms: (1000 / u64::from(per_second.max(1))).max(1),
                burst: burst.max(1),
            },
            address,
        }
    }

    fn shard(&self, key: &Subject) -> std::sync::MutexGuard<'_, HashMap<Subject, Instant>> {
        let i = (self.hasher.hash_one(key) as usize) % self.shards.len();
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Err(wait)` while `subject` is refused here.
    fn cached(&self, subject: &Subject) -> Result<(), Duration> {
        let now = Instant::now();
        match self.shard(subject).get(subject) {
            Some(until) if *until > now => Err(*until - now),
            _ => Ok(()),
        }
    }

    fn remember(&self, subject: Subject, wait: Duration) {
        self.shard(&subject).insert(subject, Instant::now() + wait);
    }

    /// The per-buyer budget the store spends.
    pub fn budget(&self) -> Rate {
        self.budget
    }

    /// The per-address policy.
    pub fn address_policy(&self) -> AddressPolicy {
        self.address
    }

    /// Before a poll or stream open reaches the store: `429` while the
    /// buyer is refused here.
    pub fn before_read(&self, queue: &QueueName, user: &UserId) -> Result<(), ApiError> {
        self.cached(&Subject::Buyer(queue.clone(), user.clone()))
            .map_err(buyer_refused)
    }

    /// Before a join reaches the store: `429` while the buyer, or the
    /// client `address` if given, is refused here. (A join known to be a
    /// repeat one gives no address: an address's limits never refuse it.)
    pub fn before_join(
        &self,
        queue: &QueueName,
        user: &UserId,
        address: Option<ClientKey>,
    ) -> Result<(), ApiError> {
        self.cached(&Subject::Buyer(queue.clone(), user.clone()))
            .map_err(buyer_refused)?;
        if let Some(address) = address
            && let Err(wait) = self.cached(&Subject::Address(queue.clone(), address))
        {
            return Err(address_refused(LimitKind::AddressJoins, wait));
        }
        Ok(())
    }

    /// What a join from `address` is checked against in the store.
    pub fn join_limits(&self, address: ClientKey) -> JoinLimits {
        let joins = Rate::per_minute(self.address.joins_per_minute);
        let places = (self.address.places > 0).then_some(self.address.places);
        JoinLimits {
            buyer: Some(BuyerBudget {
                rate: self.budget,
                grace_ms: REPEAT_JOIN_GRACE.as_millis() as u64,
            }),
            address: (joins.is_some() || places.is_some()).then(|| AddressLimits {
                key: address.to_string(),
                joins,
                places,
            }),
        }
    }

    /// The store refused a request of `user` from `address` in `queue`:
    /// remembers it (flood control) and answers the `429`.
    pub fn refused(
        &self,
        queue: &QueueName,
        user: &UserId,
        address: ClientKey,
        limited: Limited,
    ) -> ApiError {
        let wait = Duration::from_millis(limited.retry_after_ms.max(1));
        match limited.kind {
            LimitKind::Buyer => {
                self.remember(Subject::Buyer(queue.clone(), user.clone()), wait);
                buyer_refused(wait)
            }
            kind @ (LimitKind::AddressJoins | LimitKind::AddressPlaces) => {
                self.remember(Subject::Address(queue.clone(), address), wait);
                address_refused(kind, wait)
            }
            kind @ LimitKind::Bucket => address_refused(kind, wait),
        }
    }

    /// `user` left `queue` through this instance: their next join may be a
    /// first one, so it is not refused before the store answers.
    pub fn note_left(&self, queue: &QueueName, user: &UserId) {
        let subject = Subject::Buyer(queue.clone(), user.clone());
        self.shard(&subject).remove(&subject);
    }

    /// Forgets expired refusals every `FORGET_IDLE_EVERY` until `shutdown`
    /// (a task of its own: the cache is this module's business alone).
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

    /// Forgets refusals that are over, so the cache does not grow with
    /// every buyer ever refused.
    pub fn forget_idle(&self) {
        let now = Instant::now();
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            shard.retain(|_, until| *until > now);
            shard.shrink_to_fit();
        }
    }
}

fn secs(wait: Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

fn buyer_refused(wait: Duration) -> ApiError {
    metrics::counter!("waitroom_rate_limited_total", "limit" => "buyer").increment(1);
    ApiError::TooManyRequests {
        message: "too many requests from this buyer; polls, stream opens and repeat joins \
                  share a budget of 10 at once and 2 a second"
            .into(),
        retry_after_secs: secs(wait),
    }
}

/// The `429` of a per-address limit.
pub fn address_refused(kind: LimitKind, wait: Duration) -> ApiError {
    let (code, label, message) = match kind {
        LimitKind::AddressPlaces => (
            ErrorCode::AddressPlacesLimited,
            "address_places",
            "this network address holds as many places in this queue as it may",
        ),
        LimitKind::Bucket => (
            ErrorCode::VisitorRateLimited,
            "address_visitors",
            "too many new visitors from this network address; retry later",
        ),
        _ => (
            ErrorCode::AddressRateLimited,
            "address_joins",
            "too many new places from this network address; retry later",
        ),
    };
    metrics::counter!("waitroom_rate_limited_total", "limit" => label).increment(1);
    ApiError::ClientLimited {
        code,
        message: message.into(),
        retry_after_secs: secs(wait),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(user: &str) -> (QueueName, UserId) {
        (
            QueueName::parse("default").unwrap(),
            UserId::parse(user).unwrap(),
        )
    }

    fn addr(s: &str) -> ClientKey {
        ClientKey::of(s.parse().unwrap())
    }

    fn limited(kind: LimitKind, ms: u64) -> Limited {
        Limited {
            kind,
            retry_after_ms: ms,
        }
    }

    #[test]
    fn a_refused_buyer_is_refused_here_until_the_wait_is_over() {
        let limits = RequestLimits::default();
        let (q, u) = key("a");
        let (_, other) = key("b");
        let a = addr("192.0.2.1");
        assert!(limits.before_read(&q, &u).is_ok());
        let e = limits.refused(&q, &u, a, limited(LimitKind::Buyer, 1_500));
        assert!(
            matches!(
                e,
                ApiError::TooManyRequests {
                    retry_after_secs: 2,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(limits.before_read(&q, &u).is_err());
        assert!(limits.before_join(&q, &u, Some(a)).is_err());
        assert!(limits.before_read(&q, &other).is_ok(), "per buyer");
        assert!(
            limits.before_join(&q, &other, Some(a)).is_ok(),
            "the address is not refused"
        );
        limits.note_left(&q, &u);
        assert!(
            limits.before_join(&q, &u, Some(a)).is_ok(),
            "may be a first join"
        );
    }

    #[test]
    fn a_refused_address_refuses_joins_not_reads() {
        let limits = RequestLimits::default();
        let (q, u) = key("a");
        let a = addr("2001:db8::1");
        let e = limits.refused(&q, &u, a, limited(LimitKind::AddressPlaces, 10_000));
        assert!(matches!(
            e,
            ApiError::ClientLimited {
                code: ErrorCode::AddressPlacesLimited,
                ..
            }
        ));
        assert!(
            limits
                .before_join(&q, &u, Some(addr("2001:db8::ffff")))
                .is_err(),
            "same /64"
        );
        assert!(
            limits
                .before_join(&q, &u, Some(addr("2001:db8:0:1::1")))
                .is_ok(),
            "another /64"
        );
        assert!(limits.before_read(&q, &u).is_ok());
        assert!(
            limits.before_join(&q, &u, None).is_ok(),
            "a repeat join goes to the store"
        );
        let other_queue = QueueName::parse("other").unwrap();
        assert!(
            limits.before_join(&other_queue, &u, Some(a)).is_ok(),
            "per queue"
        );
    }

    #[test]
    fn join_limits_follow_the_policy() {
        let off = RequestLimits::default();
        let l = off.join_limits(addr("192.0.2.1"));
        assert!(l.address.is_none() && l.buyer.is_some());
        let on = RequestLimits::new(
            2,
            10,
            AddressPolicy {
                joins_per_minute: 60,
                places: 5,
                visitors_per_minute: 0,
            },
        );
        let l = on.join_limits(addr("192.0.2.1"));
        let a = l.address.unwrap();
        assert_eq!(a.key, "192.0.2.1");
        assert_eq!(a.places, Some(5));
        assert_eq!(a.joins.unwrap().period_ms, 1000);
        assert_eq!(l.buyer.unwrap().rate.window_ms(), 5_000);
    }

    #[test]
    fn expired_refusals_are_forgotten() {
        let limits = RequestLimits::default();
        let (q, u) = key("a");
        limits.refused(&q, &u, addr("192.0.2.1"), limited(LimitKind::Buyer, 1));
        std::thread::sleep(Duration::from_millis(5));
        assert!(limits.before_read(&q, &u).is_ok());
        limits.forget_idle();
        assert!(limits.shards.iter().all(|s| s.lock().unwrap().is_empty()));
    }

    #[tokio::test]
    async fn the_clean_up_task_stops_on_shutdown() {
        let limits = Arc::new(RequestLimits::default());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(limits.clone().housekeeping(shutdown.clone()));
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stops on shutdown")
            .unwrap();
    }
}
