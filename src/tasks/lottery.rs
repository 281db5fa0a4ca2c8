//! The lottery draw task: every instance looks at each live queue every
//! 250 ms, keeps its list of queues with a draw ahead, and runs the draw
//! ([`crate::lottery::draw_if_due_in`]) once `opensAt` has come.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::lottery::{Pending, draw_if_due_in};
use crate::queue::Queues;
use crate::store::{DrawOutcome, SharedStore};

/// How often each queue's lottery is looked at: how late after `opensAt`
/// the draw may run.
const TICK: Duration = Duration::from_millis(250);

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
