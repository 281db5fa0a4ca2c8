//! The reconciler: finishes the token deletes that orders recorded but
//! could not confirm, so a used token never returns to READY because the
//! token store was away when its order committed, or the process stopped
//! before the delete landed.
//!
//! It runs with the app's background tasks: one round at start-up (the
//! previous process may have left deletes behind), another as soon as an
//! order's delete fails, and a sweep every [`SWEEP`] as a safety net. A
//! round reads at most [`BATCH`] records; while the store is away it backs
//! off, doubling from [`FIRST_BACKOFF`] to [`MAX_BACKOFF`] (well under the
//! default claim lease, so a blip is usually over before a claim lapses).
//!
//! Deletes are idempotent (see [`Gate::consume_pending`]): a record whose
//! token is already gone or was claimed anew counts as done, and a round
//! that races an order's own delete, or another instance's round on the
//! same database, does no harm. Stopping mid-round is safe too: what was
//! not confirmed is retried by the next process.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::OrderStore;
use crate::gate::Gate;

/// Most records one round reads.
pub const BATCH: u32 = 100;
/// How often the reconciler looks for unconfirmed deletes nobody told it
/// about.
pub const SWEEP: Duration = Duration::from_secs(10);
/// The first wait after a round the store or database refused.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// The longest wait between failed rounds.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// How a round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Every unconfirmed delete is confirmed now.
    Clear,
    /// A full batch was confirmed; more may wait.
    More,
    /// The store (or the database) failed; the rest waits for a retry.
    Failed,
}

/// Runs rounds until `shutdown`.
pub async fn run(orders: OrderStore, gate: Gate, shutdown: CancellationToken) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        // A round stuck on a silent store must not hold up the exit; what
        // it did not confirm is retried after the restart.
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => return,
            outcome = round(&orders, &gate) => outcome,
        };
        let wait = match outcome {
            Round::More => Duration::ZERO,
            Round::Clear => SWEEP,
            Round::Failed => backoff,
        };
        backoff = match outcome {
            Round::Failed => (backoff * 2).min(MAX_BACKOFF),
            Round::Clear | Round::More => FIRST_BACKOFF,
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            // After a failure the backoff stands: the store is still away.
            _ = orders.rung(), if outcome == Round::Clear => {}
        }
    }
}

/// One round: reads up to [`BATCH`] unconfirmed deletes, oldest first, and
/// confirms each one the store answers for; stops at the first failure.
pub async fn round(orders: &OrderStore, gate: &Gate) -> Round {
    let due = match orders.unconfirmed(BATCH).await {
        Ok(due) => due,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read unconfirmed token deletes; retrying");
            return Round::Failed;
        }
    };
    let full = due.len() == BATCH as usize;
    for record in due {
        match &record.consume {
            None => {
                // Nothing this version can delete; retrying would not help.
                tracing::error!(order = %record.order_id, "unreadable token delete record; giving it up");
            }
            Some(pending) => match gate.consume_pending(pending, None).await {
                Ok(deleted) => {
                    tracing::info!(order = %record.order_id, queue = %pending.queue, user = %pending.user, deleted, "recorded token delete done");
                }
                Err(e) => {
                    tracing::warn!(order = %record.order_id, error = %e, "token delete still failing; retrying later");
                    metrics::counter!("waitroom_consume_retries_total").increment(1);
                    return Round::Failed;
                }
            },
        }
        if let Err(e) = orders.confirm_consume(&record.order_id).await {
            // Deleted but not confirmed: the next round deletes nothing and
            // confirms it.
            tracing::warn!(order = %record.order_id, error = %e, "cannot confirm a token delete; retrying");
            return Round::Failed;
        }
    }
    if let Ok(left) = orders.unconfirmed_count().await {
        metrics::gauge!("waitroom_consumes_unconfirmed").set(left as f64);
    }
    if full { Round::More } else { Round::Clear }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::gate::PendingConsume;
    use crate::orders::DEMO_PRODUCT;
    use crate::queue::{EntryToken, Policy, QueueName, Standing, UserId};
    use crate::store::memory::MemoryStore;
    use crate::store::{ClaimOutcome, SharedStore};

    fn q() -> QueueName {
        QueueName::parse("default").unwrap()
    }

    /// Room for every user of a test on the fast track.
    fn policy() -> Policy {
        Policy {
            batch: 1_000,
            interval_ms: 1_000,
            token_ttl_ms: 600_000,
            max_active: None,
            abandon_after_ms: None,
        }
    }

    /// A READY user with a claimed token, as an order holds it.
    async fn claimed(store: &SharedStore, user: &str) -> PendingConsume {
        let user = UserId::parse(user).unwrap();
        let entered = store
            .enter(&q(), &user, &policy(), &EntryToken::generate())
            .await
            .unwrap();
        let Standing::Ready { token, .. } = entered.snapshot.standing else {
            panic!("fast track expected: {:?}", entered.snapshot);
        };
        let ClaimOutcome::Claimed { claim_id } = store
            .claim(&q(), &user, token.as_str(), 30_000)
            .await
            .unwrap()
        else {
            panic!("claim expected");
        };
        PendingConsume {
            queue: q(),
            user,
            claim_id,
        }
    }

    async fn setup() -> (SharedStore, Gate, OrderStore) {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let gate = Gate::new(
            store.clone(),
            vec![q()],
            Duration::from_secs(30),
            Duration::from_secs(60),
            CancellationToken::new(),
        );
        let orders = OrderStore::open(":memory:", "default").await.unwrap();
        (store, gate, orders)
    }

    #[tokio::test]
    async fn a_round_deletes_recorded_tokens_and_confirms_them() {
        let (store, gate, orders) = setup().await;
        let a = claimed(&store, "a").await;
        let b = claimed(&store, "b").await;
        orders.place(DEMO_PRODUCT, 1, "ka", &a).await.unwrap();
        orders.place(DEMO_PRODUCT, 1, "kb", &b).await.unwrap();
        // b's own delete went through; a's did not.
        assert!(gate.consume_pending(&b, None).await.unwrap());

        assert_eq!(round(&orders, &gate).await, Round::Clear);
        for user in [&a.user, &b.user] {
            let s = store.status(&q(), user, false).await.unwrap();
            assert_eq!(s.standing, Standing::NotEntered, "{user}'s token is gone");
        }
        assert!(orders.unconfirmed(10).await.unwrap().is_empty());
        assert_eq!(round(&orders, &gate).await, Round::Clear, "nothing left");
    }

    #[tokio::test]
    async fn a_token_claimed_anew_is_left_to_its_new_order() {
        let (store, gate, orders) = setup().await;
        let old = claimed(&store, "a").await;
        orders.place(DEMO_PRODUCT, 1, "ka", &old).await.unwrap();
        // The old claim lapsed (released here) and a new order claimed the
        // token: the record cannot delete it, and is done.
        assert!(store.release(&q(), &old.user, &old.claim_id).await.unwrap());
        let s = store.status(&q(), &old.user, false).await.unwrap();
        let Standing::Ready { token, .. } = s.standing else {
            panic!("READY expected");
        };
        assert!(matches!(
            store
                .claim(&q(), &old.user, token.as_str(), 30_000)
                .await
                .unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
        assert_eq!(round(&orders, &gate).await, Round::Clear);
        assert!(orders.unconfirmed(10).await.unwrap().is_empty());
        let s = store.status(&q(), &old.user, false).await.unwrap();
        assert!(
            matches!(s.standing, Standing::Ready { .. }),
            "the new claim's token is untouched"
        );
    }

    #[tokio::test]
    async fn full_batches_ask_for_another_round() {
        let (store, gate, orders) = setup().await;
        for i in 0..=BATCH {
            let p = claimed(&store, &format!("u{i}")).await;
            orders
                .place(DEMO_PRODUCT, 1, &format!("k{i}"), &p)
                .await
                .unwrap_or_else(|e| panic!("order {i}: {e}"));
        }
        assert_eq!(round(&orders, &gate).await, Round::More);
        assert_eq!(orders.unconfirmed_count().await.unwrap(), 1);
        assert_eq!(round(&orders, &gate).await, Round::Clear);
        assert_eq!(orders.unconfirmed_count().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn the_loop_runs_at_start_and_when_rung_and_stops_on_shutdown() {
        let (store, gate, orders) = setup().await;
        let a = claimed(&store, "a").await;
        orders.place(DEMO_PRODUCT, 1, "ka", &a).await.unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(orders.clone(), gate.clone(), shutdown.clone()));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while orders.unconfirmed_count().await.unwrap() > 0 {
            assert!(tokio::time::Instant::now() < deadline, "start-up round");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Rung, it runs again long before the sweep.
        let b = claimed(&store, "b").await;
        orders.place(DEMO_PRODUCT, 1, "kb", &b).await.unwrap();
        orders.ring_reconciler();
        let deadline = tokio::time::Instant::now() + SWEEP / 2;
        while orders.unconfirmed_count().await.unwrap() > 0 {
            assert!(tokio::time::Instant::now() < deadline, "rung round");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stops on shutdown")
            .unwrap();
    }
}
