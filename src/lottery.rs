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
use std::sync::RwLock;

use crate::clock::now_ms;
use crate::queue::lottery::{draw_order, fingerprint, parse_seed, published_list};
use crate::queue::{QueueName, UserId};
use crate::store::{
    DRAW_ABANDON_MS, DRAW_CHUNK, DrawOutcome, SharedStore, StoreError, StoreResult, draw_in_steps,
    new_draw_id,
};

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

/// Runs `queue`'s draw if its `opensAt` has come and nobody ran it yet.
/// `None` when there was nothing to do; else what the store did (`Stale`
/// after `ATTEMPTS` changed pre-queues, or while the store's clock is
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
