//! The admission loop: one pass per queue of the live catalog, each at its
//! own interval.
//!
//! Every instance runs it; the token bucket in the store keeps the total at
//! one global rate however many instances run, so no leader election is
//! needed and any instance can die without stopping admissions. The store
//! reads a queue's settings inside the pass, so a change made on any
//! instance governs the very next pass; the interval and the number of
//! fresh tokens come from this instance's copy of the catalog (at most a
//! second old), and a pass never uses more tokens than the stored batch.

pub mod adaptive;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::queue::{EntryToken, QueueName, QueueSettings, Queues};
use crate::store::SharedStore;

/// How often the loop looks for queues due for a pass: the finest
/// interval it honours.
const TICK: Duration = Duration::from_millis(20);

/// How often each queue's gauges of holders and hold are re-read.
const GAUGES_EVERY: Duration = Duration::from_secs(5);

/// Runs passes over the live queues (`live`: the instance's catalog)
/// until `shutdown`.
pub async fn run(
    store: SharedStore,
    live: watch::Receiver<Arc<Queues>>,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When each queue's next pass is due.
    let mut due: HashMap<QueueName, Instant> = HashMap::new();
    let mut gauges_at = Instant::now();
    let mut failing = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let queues = live.borrow().clone();
        due.retain(|q, _| queues.contains_key(q));
        let now = Instant::now();
        if now >= gauges_at {
            gauges_at = now + GAUGES_EVERY;
            for (queue, stored) in queues.iter() {
                queue_gauges(&store, queue, &stored.settings).await;
            }
        }
        for (queue, stored) in queues.iter() {
            let policy = stored.settings.policy();
            let interval = Duration::from_millis(policy.interval_ms.max(1));
            // Instances started together would otherwise pass in lockstep;
            // a random first phase spreads their passes (and their load on
            // the store) over time.
            let next = due.entry(queue.clone()).or_insert_with(|| {
                now + Duration::from_millis(rand::random_range(0..policy.interval_ms.max(1)))
            });
            // A shortened interval takes effect at once, a lengthened one
            // after the pass that was due.
            *next = (*next).min(now + interval);
            if *next > now {
                continue;
            }
            // On schedule rather than a tick late each time (the rate
            // would drift), but never catching up more than one pass.
            *next = (*next + interval).max(now);
            let tokens: Vec<EntryToken> =
                (0..policy.batch).map(|_| EntryToken::generate()).collect();
            let started = Instant::now();
            let labels = [("queue", queue.to_string())];
            match store.admit(queue, &policy, &tokens).await {
                Ok(pass) => {
                    if failing {
                        tracing::info!(%queue, "admission resumed");
                        failing = false;
                    }
                    metrics::counter!("waitroom_admitted_total", &labels)
                        .increment(pass.admitted.len() as u64);
                    metrics::counter!("waitroom_abandoned_total", &labels)
                        .increment(pass.abandoned.len() as u64);
                    metrics::counter!("waitroom_admission_passes_total", &labels).increment(1);
                    metrics::gauge!("waitroom_waiting", &labels).set(pass.waiting as f64);
                    metrics::histogram!("waitroom_admission_pass_seconds", &labels)
                        .record(started.elapsed().as_secs_f64());
                    if !pass.admitted.is_empty() {
                        tracing::debug!(%queue, admitted = pass.admitted.len(), waiting = pass.waiting, "admission pass");
                    }
                }
                Err(e) => {
                    // Fail closed: no admission while the store is away.
                    if !failing {
                        tracing::warn!(%queue, error = %e, "admission paused: store unavailable");
                        failing = true;
                    }
                    metrics::counter!("waitroom_admission_errors_total", &labels).increment(1);
                }
            }
        }
    }
}

/// Sets `queue`'s gauges: its settings, and its holders and hold as the
/// store has them (left as they were while the store is away).
async fn queue_gauges(store: &SharedStore, queue: &QueueName, settings: &QueueSettings) {
    let labels = [("queue", queue.to_string())];
    metrics::gauge!("waitroom_settings_batch", &labels).set(f64::from(settings.batch));
    metrics::gauge!("waitroom_settings_interval_seconds", &labels)
        .set(settings.interval_ms as f64 / 1000.0);
    // Unlimited shows as -1, so a dashboard can tell it from 0.
    metrics::gauge!("waitroom_settings_max_active", &labels)
        .set(settings.max_active.map_or(-1.0, |m| m as f64));
    if let Ok(stats) = store.stats(queue).await {
        metrics::gauge!("waitroom_active", &labels).set(stats.active as f64);
        metrics::gauge!("waitroom_paused", &labels).set(if stats.paused { 1.0 } else { 0.0 });
        metrics::gauge!("waitroom_waiting", &labels).set(stats.waiting as f64);
    }
}
