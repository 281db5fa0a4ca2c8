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

use tokio::sync::broadcast;

use super::{QueueEvent, StoreEvent};
use crate::queue::QueueName;

// The data: a queue's line and buyers, and what the store keeps beside
// the queues.
mod buyers;
mod queue;

// One file per capability of the port, each `impl <Capability> for
// MemoryStore` with the data it alone uses.
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

use crate::clock::now_ms;
use limits::Buckets;
use queue::QueueData;

/// Users dropped as absent in one pass at most, as in the Lua script, so a
/// pass stays short however many left at once.
const SWEEP_LIMIT: usize = 500;

/// The in-memory store.
pub struct MemoryStore {
    queues: RwLock<HashMap<QueueName, Arc<Mutex<QueueData>>>>,
    /// The buckets of [`crate::store::LimitStore::spend`]: name -> theoretical arrival time.
    buckets: Mutex<Buckets>,
    events: broadcast::Sender<StoreEvent>,
    /// Spent join challenges and join rates (`challenge.rs`).
    door: challenge::Door,
    /// Live queue settings (`settings.rs`).
    settings: settings::Settings,
    /// Entries kept per queue's audit log (0: none).
    audit_max_len: u64,
    /// Adaptive admission's samples and decisions (`adaptive.rs`).
    adaptive: adaptive::Adaptive,
    /// The public admission logs (`fairness.rs`).
    fairness: fairness::Logs,
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
            door: challenge::Door::default(),
            settings: settings::Settings::default(),
            audit_max_len: crate::queue::audit::DEFAULT_AUDIT_MAX_LEN,
            adaptive: adaptive::Adaptive::default(),
            fairness: fairness::Logs::default(),
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use futures::StreamExt;

    use super::*;
    use crate::queue::{EntryToken, Policy, Standing, UserId};
    use crate::store::{ClaimOutcome, ClaimStore, EventStore, LimitKind, LineStore, Rate};

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
