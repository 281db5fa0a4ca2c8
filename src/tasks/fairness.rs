//! The public admission log's task: every second, each live queue's log
//! takes in the audit entries since its cursor (`crate::fairness::log`),
//! and a head is signed and stored when the log grew, or every
//! [`HEAD_EVERY`] all the same, so a reader sees from its time that heads
//! are still being published.
//!
//! Every instance runs it: the append is conditional on the size, so the
//! instances never append twice, and a head of the same size signed by
//! two instances is the same tree.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::fairness::{Fairness, log};
use crate::queue::{QueueName, Queues};
use crate::store::SharedStore;

/// How often the log takes in new audit entries.
pub const TICK: Duration = Duration::from_secs(1);

/// A head is signed at least this often, grown or not.
pub const HEAD_EVERY: Duration = Duration::from_secs(5);

/// Audit pages (of 1,000) one tick takes in per queue at most, so a log
/// catching up (turned on mid-sale) does not hold the task for long.
const PAGES_PER_TICK: usize = 20;

/// Runs until `shutdown`.
pub async fn run(
    store: SharedStore,
    fairness: Arc<Fairness>,
    live: watch::Receiver<Arc<Queues>>,
    shutdown: CancellationToken,
) {
    // Per queue: the size of the last head signed here, and when.
    let mut signed: HashMap<QueueName, (u64, Instant)> = HashMap::new();
    let mut failing = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(TICK) => {}
        }
        let queues = live.borrow().clone();
        signed.retain(|q, _| queues.contains_key(q));
        for (queue, _) in queues.iter() {
            let result = async {
                let size = log::advance(&*store, &fairness, queue, PAGES_PER_TICK).await?;
                let due = signed
                    .get(queue)
                    .is_none_or(|&(last, at)| last != size || at.elapsed() >= HEAD_EVERY);
                if due {
                    log::publish_head(&*store, &fairness, queue, size).await?;
                    signed.insert(queue.clone(), (size, Instant::now()));
                }
                Ok::<_, crate::store::StoreError>(size)
            }
            .await;
            match result {
                Ok(size) => {
                    metrics::gauge!("waitroom_fairness_log_size", "queue" => queue.to_string())
                        .set(size as f64);
                    if failing {
                        tracing::info!(%queue, "fairness log resumed");
                        failing = false;
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(%queue, error = %e, "fairness log paused: store unavailable");
                        failing = true;
                    }
                }
            }
        }
    }
}
