//! The store conformance suite: every behaviour of the store port, written
//! once and run against every store: memory, Redis on 127.0.0.1:6379, and
//! a 3-master Redis Cluster the suite starts (one for the whole suite),
//! each with a fresh key prefix per test.
//!
//! One file per capability of the port (`line.rs` for `LineStore`, ...).
//! A case is an `async fn(store: SharedStore)` followed by
//! `conformance!(its_name);`, which makes its three tests
//! (`<capability>::<case>::{memory, redis, cluster}`). A case without the
//! line is never called, which `dead_code` reports (and clippy's
//! `-D warnings` refuses), so no case can be left out of a backend. The
//! cluster's tests build with the `redis-cluster` cargo feature (a
//! default one).

#[path = "../common/mod.rs"]
mod common;

use futures::StreamExt;
use futures::stream::BoxStream;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use waitroom::queue::{
    EntryToken, Policy, QueueName, QueueSettings, STALE_ENTRY_LAG_MAX, Snapshot, Standing, UserId,
};
use waitroom::store::{
    AddressLimits, BuyerBudget, ClaimOutcome, JoinLimits, KnownEntry, LimitKind, QueueEvent, Rate,
    SharedStore, StoreEvent,
};

/// Declares the case `$case` (an `async fn(SharedStore)` of the module it
/// is written in) on every store: a module of the case's name with one
/// `#[tokio::test]` per store, each with a fresh store named after the case.
macro_rules! conformance {
    ($case:ident) => {
        mod $case {
            #[tokio::test]
            async fn memory() {
                super::$case(crate::common::store("memory", stringify!($case)).await).await
            }

            #[tokio::test]
            async fn redis() {
                $crate::needs_redis!();
                super::$case(crate::common::store("redis", stringify!($case)).await).await
            }

            #[cfg(feature = "redis-cluster")]
            #[tokio::test]
            async fn cluster() {
                $crate::needs_redis!();
                super::$case(crate::common::store("cluster", stringify!($case)).await).await
            }
        }
    };
}

fn q() -> QueueName {
    QueueName::parse("default").unwrap()
}

fn u(name: &str) -> UserId {
    UserId::parse(name).unwrap()
}

/// A policy whose budget never refills during a test: admissions come
/// only from the initial `batch`.
fn slow(batch: u32) -> Policy {
    Policy {
        batch,
        interval_ms: 3_600_000,
        token_ttl_ms: 300_000,
        max_active: None,
        abandon_after_ms: None,
    }
}

fn tokens(n: usize) -> Vec<EntryToken> {
    (0..n).map(|_| EntryToken::generate()).collect()
}

fn rank(s: &Snapshot) -> Option<u64> {
    match s.standing {
        Standing::Waiting { rank, .. } => Some(rank),
        _ => None,
    }
}

fn token_of(s: &Snapshot) -> Option<String> {
    match &s.standing {
        Standing::Ready { token, .. } => Some(token.as_str().to_owned()),
        _ => None,
    }
}

/// The user's current entry id (they must have one).
async fn entry_of(store: &SharedStore, user: &UserId) -> u64 {
    let s = store.status(&q(), user, false).await.unwrap();
    s.entry
        .unwrap_or_else(|| panic!("{user} has no entry: {s:?}"))
}

/// Leaves with the user's current entry, as a fresh ticket would.
async fn leave_current(store: &SharedStore, user: &UserId) -> bool {
    let entry = entry_of(store, user).await;
    store.leave(&q(), user, entry).await.unwrap()
}

/// Puts `n` users `prefix0..` in line behind a first user who takes the
/// fast track (so the rest wait), with a budget of `batch`.
async fn fill(store: &SharedStore, policy: &Policy, prefix: &str, n: usize) -> Vec<UserId> {
    let mut users = Vec::new();
    for i in 0..n {
        let user = u(&format!("{prefix}{i:04}"));
        store
            .enter(&q(), &user, policy, &EntryToken::generate())
            .await
            .unwrap();
        users.push(user);
    }
    users
}

/// A subscription to `q()` that is known to be live: Redis subscribes in
/// the background, so probe events on another queue are sent until one
/// arrives (a fixed pause would only guess).
async fn subscribed(store: &SharedStore) -> futures::stream::BoxStream<'static, StoreEvent> {
    let probe = QueueName::parse("probe").unwrap();
    let mut events = store.subscribe(&[q(), probe.clone()]);
    let nobody_admitted = Policy {
        max_active: Some(0),
        ..slow(1)
    };
    for i in 0..100 {
        let user = u(&format!("probe{i}"));
        let entered = store
            .enter(&probe, &user, &nobody_admitted, &EntryToken::generate())
            .await
            .unwrap();
        let entry = entered.snapshot.entry.expect("a waiting user has an entry");
        store.leave(&probe, &user, entry).await.unwrap();
        if let Ok(Some(StoreEvent::Queue { queue, .. })) =
            tokio::time::timeout(Duration::from_millis(100), events.next()).await
        {
            assert_eq!(queue, probe, "nothing else happened yet");
            // Later probes' events may still be in flight: drop them.
            while let Ok(Some(ev)) =
                tokio::time::timeout(Duration::from_millis(50), events.next()).await
            {
                assert!(matches!(ev, StoreEvent::Queue { queue, .. } if queue == probe));
            }
            return events;
        }
    }
    panic!("the subscription never delivered an event");
}

/// Drains the initial budget so later enters wait instead of taking the
/// fast track.
async fn drain_budget(store: &SharedStore, policy: &Policy) {
    for i in 0..policy.batch {
        store
            .enter(
                &q(),
                &u(&format!("early{i}")),
                policy,
                &EntryToken::generate(),
            )
            .await
            .unwrap();
    }
}

/// Users of `pass` dropped as absent, sorted (the stores may drop one
/// pass's absent in different orders).
fn dropped(pass: &waitroom::store::Pass) -> Vec<String> {
    let mut users: Vec<String> = pass.abandoned.iter().map(|a| a.user.to_string()).collect();
    users.sort();
    users
}

/// A rate that does not refill within a test: `burst` and no more.
fn only(burst: u32) -> Rate {
    Rate {
        period_ms: 3_600_000,
        burst,
    }
}

fn from(address: &str, joins: Option<Rate>, places: Option<u32>) -> JoinLimits {
    JoinLimits {
        buyer: None,
        address: Some(AddressLimits {
            key: address.into(),
            joins,
            places,
        }),
    }
}

/// Waits until `events` hears this store's changes (Redis subscribes in the
/// background): a probe user joins and leaves until one leave is heard.
async fn until_subscribed(store: &SharedStore, events: &mut BoxStream<'static, StoreEvent>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let probe = u("probe");
    // No room for token holders: the probe waits, leaving the budget alone.
    let waits = Policy {
        max_active: Some(0),
        ..slow(1)
    };
    loop {
        let entered = store
            .enter(&q(), &probe, &waits, &EntryToken::generate())
            .await
            .unwrap();
        let entry = entered.snapshot.entry.unwrap();
        assert!(store.leave(&q(), &probe, entry).await.unwrap());
        if let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(100), events.next()).await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the subscription never heard a leave"
        );
    }
}

fn settings(batch: u32) -> QueueSettings {
    QueueSettings {
        batch,
        interval_ms: 3_600_000,
        token_ttl_ms: 300_000,
        max_active: None,
        abandon_after_ms: None,
        claim_lease_ms: 30_000,
        texts: Default::default(),
        shop_url: None,
        adaptive: None,
    }
}

mod adaptive;
mod audit;
mod challenge;
mod claims;
mod events;
mod fairness;
mod limits;
mod line;
mod lottery;
mod sessions;
mod settings;
mod stock;
