//! The sessions task: once a second, for every live queue, reports the
//! sessions this instance saw active (one batch), ends the idle ones, and
//! reads the queue's ended log into this instance's set of refused passes
//! (`crate::pass::EndedSessions`); each queue's sessions idle out after
//! its own time (`SessionPolicy`). So checking a pass never calls the
//! store, and an ended session is refused by every instance within about
//! a second.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::pass::PassService;
use crate::queue::{QueueName, Queues, SessionId};
use crate::store::{SessionPolicy, SessionStore, StoreError};

/// How often the task runs.
pub const EVERY: Duration = Duration::from_secs(1);

/// Runs until `shutdown`.
pub async fn run(
    store: Arc<dyn SessionStore>,
    passes: Arc<PassService>,
    live: watch::Receiver<Arc<Queues>>,
    sessions: SessionPolicy,
    shutdown: CancellationToken,
) {
    let mut cursors: HashMap<QueueName, String> = HashMap::new();
    let mut failing = false;
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let queues = live.borrow().clone();
        let mut activity = passes.take_activity();
        let mut result = Ok(());
        for queue in queues.keys() {
            let active: Vec<SessionId> = activity
                .remove(queue)
                .map(|ids| ids.into_iter().collect())
                .unwrap_or_default();
            let idle_ms = sessions.for_queue(queue).idle_ms;
            let step = one_queue(&*store, &passes, queue, &active, idle_ms, &mut cursors).await;
            if step.is_err() {
                result = step;
            }
        }
        passes.ended().prune(crate::clock::now_ms() / 1000);
        match result {
            Ok(()) if failing => {
                tracing::info!("sessions: store back");
                failing = false;
            }
            Err(e) if !failing => {
                // Live passes keep working (they are checked locally); the
                // ended log is read again once the store is back.
                tracing::warn!(error = %e, "sessions: store unavailable");
                failing = true;
            }
            _ => {}
        }
    }
}

async fn one_queue(
    store: &dyn SessionStore,
    passes: &PassService,
    queue: &QueueName,
    active: &[SessionId],
    idle_ms: u64,
    cursors: &mut HashMap<QueueName, String>,
) -> Result<(), StoreError> {
    store.touch_sessions(queue, active, idle_ms).await?;
    store.sweep_sessions(queue).await?;
    // Pages until the log is read to its end (bounded: a page per
    // thousand sessions ended since the last tick).
    for _ in 0..100 {
        let cursor = cursors.get(queue).map(String::as_str);
        let page = store.ended_sessions(queue, cursor).await?;
        let full = page.ended.len() == crate::store::ENDED_PAGE;
        for ended in page.ended {
            passes.ended().insert(ended.id, ended.exp_ms.div_ceil(1000));
        }
        cursors.insert(queue.clone(), page.cursor);
        if !full {
            break;
        }
    }
    Ok(())
}
