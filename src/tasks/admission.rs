//! The admission loop: one pass per queue of the live catalog, each at its
//! own interval.
//!
//! Every instance runs it; the token bucket in the store keeps the total at
//! one global rate however many instances run, so no leader election is
//! needed and any instance can die without stopping admissions. Before a
//! pass an instance takes the queue's turn (held for most of an interval),
//! so N instances make one pass an interval between them rather than N
//! smaller ones: each pass sends every waiting stream a rank update. The store
//! reads a queue's settings inside the pass, so a change made on any
//! instance governs the very next pass; the interval and the number of
//! fresh tokens come from this instance's copy of the catalog (at most a
//! second old), and a pass never uses more tokens than the stored batch.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

// The runtime's clock: the same as the system's, except in a test that
// pauses time to check the schedule to the millisecond.
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::queue::{EntryToken, QueueName, QueueSettings, Queues};
use crate::store::SharedStore;

/// Longest the loop sleeps between looks at the catalog: how soon it sees
/// a new queue or a shortened interval. Otherwise it sleeps until the
/// next pass is due, to the timer's millisecond: a pass polled for on a
/// coarser tick would start late by a varying part of the tick, and the
/// store's bucket (one interval's worth at most) drops what refills in a
/// gap longer than the interval, so the varying lateness alone would
/// admit less than the configured rate.
const MAX_SLEEP: Duration = Duration::from_millis(100);

/// How often each queue's gauges of holders and hold are re-read.
const GAUGES_EVERY: Duration = Duration::from_secs(5);

/// Runs passes over the live queues (`live`: the instance's catalog)
/// until `shutdown`.
pub async fn run(
    store: SharedStore,
    live: watch::Receiver<Arc<Queues>>,
    shutdown: CancellationToken,
) {
    // When each queue's next pass is due.
    let mut due: HashMap<QueueName, Instant> = HashMap::new();
    let mut gauges_at = Instant::now();
    let mut failing = false;
    let mut wake = Instant::now();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep_until(wake) => {}
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
            *next = after_pass(*next, now, interval);
            let labels = [("queue", queue.to_string())];
            // Another instance's turn: it passes for both this interval
            // (the turn lapses before its next tick). A store error goes on
            // to the pass, which fails closed and says so.
            if let Ok(false) = store
                .take_pass_turn(queue, turn_hold_ms(policy.interval_ms))
                .await
            {
                metrics::counter!("waitroom_admission_turns_skipped_total", &labels).increment(1);
                continue;
            }
            let tokens: Vec<EntryToken> =
                (0..policy.batch).map(|_| EntryToken::generate()).collect();
            let started = Instant::now();
            match store.admit(queue, &policy, &tokens).await {
                Ok(pass) => {
                    if failing {
                        tracing::info!(%queue, "admission resumed");
                        failing = false;
                    }
                    metrics::counter!("waitroom_admitted_total", "queue" => queue.to_string(), "path" => "pass")
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
        wake = wake_at(due.values().copied(), gauges_at, Instant::now());
    }
}

/// How long an instance holds a queue's admission turn after taking it:
/// four fifths of the interval, so it has lapsed by the holder's next tick
/// (an instance that stopped hands the turn on within one interval) and
/// another instance's tick in between is refused.
fn turn_hold_ms(interval_ms: u64) -> u64 {
    (interval_ms.max(1) * 4 / 5).max(1)
}

/// When the next pass of a queue is due after the one due at `due` ran at
/// `now`: on schedule rather than as late as this one was (the rate would
/// drift), but never catching up more than one pass (the bucket would
/// not have it anyway).
fn after_pass(due: Instant, now: Instant, interval: Duration) -> Instant {
    (due + interval).max(now)
}

/// When the loop wakes next: the first pass due, to the millisecond, or
/// the gauges, or [`MAX_SLEEP`] from `now`, whichever comes first.
fn wake_at(due: impl Iterator<Item = Instant>, gauges_at: Instant, now: Instant) -> Instant {
    due.fold(gauges_at.min(now + MAX_SLEEP), Instant::min)
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A late pass does not push the ones after it: the next is due an
    /// interval after the one that was due, so the gaps average out to
    /// the interval. Once more than an interval late, the next is due at
    /// once, with no burst of passes to catch up.
    #[test]
    fn a_late_pass_keeps_the_schedule() {
        let t0 = Instant::now();
        let interval = 500 * MS;
        assert_eq!(after_pass(t0, t0, interval), t0 + interval);
        assert_eq!(after_pass(t0, t0 + 30 * MS, interval), t0 + interval);
        assert_eq!(after_pass(t0, t0 + 499 * MS, interval), t0 + interval);
        assert_eq!(after_pass(t0, t0 + 1_700 * MS, interval), t0 + 1_700 * MS);
        // Passes run 30 ms late every other time: still 20 in 10 s.
        let (mut due, mut passes) = (t0, 0);
        while due < t0 + 10_000 * MS {
            let ran = due
                + if passes % 2 == 1 {
                    30 * MS
                } else {
                    Duration::ZERO
                };
            due = after_pass(due, ran, interval);
            passes += 1;
        }
        assert_eq!((passes, due), (20, t0 + 10_000 * MS));
    }

    /// The loop sleeps until the first pass due, whatever its phase: a
    /// loop that looked for due passes on a fixed tick would start each
    /// pass late by a part of the tick that changes from pass to pass,
    /// and the bucket (one interval's worth at most) would not refill for
    /// the longer gaps: with a 50 ms interval and a 20 ms tick, gaps of 60
    /// and 40 ms in turn, a sixth of the rate lost.
    #[test]
    fn the_loop_wakes_when_the_first_pass_is_due() {
        let now = Instant::now();
        let gauges = now + 5_000 * MS;
        let due = [now + 37 * MS, now + 13 * MS, now + 61 * MS];
        assert_eq!(wake_at(due.into_iter(), gauges, now), now + 13 * MS);
        // Nothing due soon: it still looks at the catalog now and then.
        let later = [now + 900 * MS];
        assert_eq!(wake_at(later.into_iter(), gauges, now), now + MAX_SLEEP);
        assert_eq!(wake_at(std::iter::empty(), gauges, now), now + MAX_SLEEP);
        // The gauges are due first.
        assert_eq!(wake_at(later.into_iter(), now + 5 * MS, now), now + 5 * MS);
        // Already due: at once.
        assert_eq!(
            wake_at([now - 3 * MS].into_iter(), gauges, now),
            now - 3 * MS
        );
    }
}
