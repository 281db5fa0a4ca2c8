//! The draw of scheduled openings: every instance looks for queues whose
//! `opensAt` has come and runs the draw (`crate::queue::lottery` has the
//! rules, the store applies the result all or nothing as buyers see it, in
//! steps of a chunk each: `crate::store::draw_in_steps`).
//!
//! Like admission, no leader is elected: every instance may try, the store
//! lets exactly one draw through, and any instance can die without
//! stopping the opening. The loop also keeps this instance's list of
//! queues with a draw still ahead, so a join can go to the pre-queue
//! without a store read. The list only saves a call: the pre-queue join
//! checks the store, so a stale list never puts anyone in a pre-queue
//! already drawn, and the store's join step sends a join to the pre-queue
//! while a draw is ahead, so a lottery this list has not seen yet gets its
//! joins all the same.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::queue::lottery::{draw_order, fingerprint, parse_seed, published_list};
use crate::queue::{QueueName, Queues, UserId};
use crate::store::{
    DRAW_ABANDON_MS, DRAW_CHUNK, DrawOutcome, SharedStore, StoreError, StoreResult, draw_in_steps,
    new_draw_id,
};

/// How often each queue's lottery is looked at: how late after `opensAt`
/// the draw may run.
const TICK: Duration = Duration::from_millis(250);

/// How many times one draw is recomputed when the pre-queue changed under
/// it (a join or a leave between reading and applying) before the next tick.
const ATTEMPTS: usize = 5;

/// Queues whose lottery has not been drawn yet, as this instance last saw.
#[derive(Default)]
pub struct Pending {
    inner: RwLock<Seen>,
}

#[derive(Default)]
struct Seen {
    /// Queues looked at at least once.
    checked: HashSet<QueueName>,
    /// Of those, the ones whose draw is ahead.
    pending: HashSet<QueueName>,
}

impl Pending {
    /// True while `queue`'s draw may be ahead (or it was never looked at,
    /// as just after start-up): its joins try the pre-queue first.
    pub fn has(&self, queue: &QueueName) -> bool {
        let seen = self.inner.read().unwrap_or_else(|e| e.into_inner());
        seen.pending.contains(queue) || !seen.checked.contains(queue)
    }

    /// Records whether `queue`'s draw is ahead.
    pub fn set(&self, queue: &QueueName, pending: bool) {
        let mut seen = self.inner.write().unwrap_or_else(|e| e.into_inner());
        seen.checked.insert(queue.clone());
        if pending {
            seen.pending.insert(queue.clone());
        } else {
            seen.pending.remove(queue);
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs `queue`'s draw if its `opensAt` has come and nobody ran it yet.
/// `None` when there was nothing to do; else what the store did (`Stale`
/// after [`ATTEMPTS`] changed pre-queues, or while the store's clock is
/// still before `opensAt`; `InProgress` while another instance applies
/// it).
pub async fn draw_if_due(
    store: &SharedStore,
    queue: &QueueName,
) -> StoreResult<Option<DrawOutcome>> {
    draw_if_due_in(store, queue, DRAW_CHUNK).await
}

/// [`draw_if_due`], staging `chunk` entries per store call.
pub async fn draw_if_due_in(
    store: &SharedStore,
    queue: &QueueName,
    chunk: usize,
) -> StoreResult<Option<DrawOutcome>> {
    let Some(lottery) = store.lottery(queue).await? else {
        return Ok(None);
    };
    if lottery.drawn || now_ms() < lottery.opens_at {
        return Ok(None);
    }
    // Another instance is applying the draw: no need to read the
    // pre-queue. Once its stage stops moving on, the next draw replaces it.
    if lottery
        .staging_idle_ms
        .is_some_and(|idle| idle <= DRAW_ABANDON_MS)
    {
        return Ok(Some(DrawOutcome::InProgress));
    }
    let seed = parse_seed(&lottery.seed)
        .ok_or_else(|| StoreError::Protocol(format!("a lottery seed of {queue} is not one")))?;
    let mut outcome = DrawOutcome::Stale;
    for _ in 0..ATTEMPTS {
        let (version, entries) = store.pre_queue(queue).await?;
        let fingerprints: Vec<String> = entries
            .iter()
            .map(|(_, e)| fingerprint(queue.as_str(), &e.nonce))
            .collect();
        let order: Vec<UserId> = draw_order(&seed, &fingerprints)
            .into_iter()
            .map(|i| entries[i].0.clone())
            .collect();
        let list = published_list(fingerprints).join("\n");
        let id = new_draw_id();
        outcome = draw_in_steps(&**store, queue, &id, version, &order, &list, chunk).await?;
        if outcome != DrawOutcome::Stale {
            break;
        }
    }
    Ok(Some(outcome))
}

/// Draws every live queue's lottery when due (`chunk` entries staged per
/// store call), and keeps `pending`, until `shutdown`. A failed draw (the
/// store unreachable) is retried next tick: buyers saw all of it or
/// nothing, and a stage it left is taken over once abandoned.
pub async fn run(
    store: SharedStore,
    live: watch::Receiver<Arc<Queues>>,
    pending: Arc<Pending>,
    chunk: usize,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let queues = live.borrow().clone();
        for queue in queues.keys() {
            match store.lottery(queue).await {
                Ok(lottery) => {
                    let ahead = lottery.as_ref().is_some_and(|l| !l.drawn);
                    pending.set(queue, ahead);
                    if !ahead || lottery.is_some_and(|l| now_ms() < l.opens_at) {
                        continue;
                    }
                }
                Err(_) => continue,
            }
            match draw_if_due_in(&store, queue, chunk).await {
                Ok(Some(DrawOutcome::Drawn { placed })) => {
                    tracing::info!(%queue, placed, "lottery drawn");
                    pending.set(queue, false);
                }
                Ok(Some(DrawOutcome::AlreadyDrawn)) => pending.set(queue, false),
                Ok(_) => {}
                Err(e) => tracing::warn!(%queue, error = %e, "lottery draw failed; retrying"),
            }
        }
    }
}
