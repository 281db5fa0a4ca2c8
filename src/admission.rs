//! The admission loop: every interval, one pass per configured queue.
//!
//! Every instance runs it; the token bucket in the store keeps the total at
//! one global rate however many instances run, so no leader election is
//! needed and any instance can die without stopping admissions.

use std::time::{Duration, Instant};

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::queue::{EntryToken, Policy, QueueName};
use crate::store::SharedStore;

/// Runs passes over `queues` under `policy` until `shutdown`.
pub async fn run(
    store: SharedStore,
    policy: Policy,
    queues: Vec<QueueName>,
    shutdown: CancellationToken,
) {
    let interval = Duration::from_millis(policy.interval_ms);
    // Instances started together would otherwise pass in lockstep; a random
    // phase spreads their passes (and their load on the store) over time.
    let phase = Duration::from_millis(rand::random_range(0..policy.interval_ms.max(1)));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + phase, interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        for queue in &queues {
            let tokens: Vec<EntryToken> =
                (0..policy.batch).map(|_| EntryToken::generate()).collect();
            let started = Instant::now();
            match store.admit(queue, &policy, &tokens).await {
                Ok(pass) => {
                    if failing {
                        tracing::info!(%queue, "admission resumed");
                        failing = false;
                    }
                    let labels = [("queue", queue.to_string())];
                    metrics::counter!("waitroom_admitted_total", &labels)
                        .increment(pass.admitted.len() as u64);
                    metrics::counter!("waitroom_abandoned_total", &labels)
                        .increment(pass.abandoned.len() as u64);
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
                    metrics::counter!("waitroom_admission_errors_total", "queue" => queue.to_string()).increment(1);
                }
            }
        }
    }
}
