//! The adaptive controller: for each queue whose admission follows the
//! order service, once per window, reads what the last complete window saw
//! (claim-to-commit times and rollbacks, counted by the gate and the token
//! API of every instance; with too few orders, the windows since the last
//! decision), applies the AIMD rule of
//! [`crate::queue::adaptive`] and stores the new rate as the queue's batch.
//!
//! Every instance runs it and no leader is elected: the store keeps one
//! decision per window (the first instance to store one wins, the others'
//! writes are refused), so two instances never cut the rate twice for one
//! slow window. While the store is away nothing is decided and the rate
//! stays as it was.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::queue::adaptive::{Decision, Verdict, batch_for, decide, rate_of};
use crate::queue::{AdaptiveSettings, QueueName, Queues};
use crate::store::{AdaptiveRead, AdaptiveState, SharedStore, StoreResult};

/// How often the controller looks for queues due for a decision.
const TICK: Duration = Duration::from_millis(25);

/// How long after a window ends its decision is attempted: lets the last
/// samples of the window (counted in the background) land first.
const SETTLE_MS: u64 = 30;

/// Runs the controller over the live queues until `shutdown`.
pub async fn run(
    store: SharedStore,
    live: watch::Receiver<Arc<Queues>>,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When each queue is next due (tokio clock).
    let mut due: HashMap<QueueName, tokio::time::Instant> = HashMap::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let queues = live.borrow().clone();
        let now = tokio::time::Instant::now();
        for (queue, stored) in queues.iter() {
            let on = stored.settings.adaptive.as_ref().is_some_and(|a| a.enabled);
            if !on {
                due.remove(queue);
                continue;
            }
            if due.get(queue).is_some_and(|at| *at > now) {
                continue;
            }
            let wait = match step(&store, queue).await {
                Ok(wait) => wait,
                Err(e) => {
                    // Nothing decided: the rate stays where it is.
                    tracing::debug!(%queue, error = %e, "adaptive admission: store unavailable");
                    metrics::counter!("waitroom_adaptive_errors_total", "queue" => queue.to_string())
                        .increment(1);
                    Duration::from_millis(500)
                }
            };
            due.insert(queue.clone(), now + wait);
        }
        due.retain(|q, _| queues.contains_key(q));
    }
}

/// Decides `queue`'s last complete window unless that is done; answers
/// how long until the next window is worth a look.
pub async fn step(store: &SharedStore, queue: &QueueName) -> StoreResult<Duration> {
    // Fresh settings, not the catalog's copy: the previous decision bumped
    // the version a moment ago, and the store refuses a stale one.
    let Some(stored) = store.queue_settings(queue).await? else {
        return Ok(Duration::from_secs(1));
    };
    let Some(adaptive) = stored.settings.adaptive.clone().filter(|a| a.enabled) else {
        return Ok(Duration::from_secs(1));
    };
    let window_ms = adaptive.window_ms;
    let read = store.adaptive_read(queue, window_ms).await?;
    let next = Duration::from_millis(
        ((read.window + 2) * window_ms).saturating_sub(read.now_ms) + SETTLE_MS,
    );
    if read.now_ms % window_ms < SETTLE_MS {
        // Samples of the window just ended may still be on their way.
        return Ok(Duration::from_millis(SETTLE_MS));
    }
    let interval = stored.settings.interval_ms;
    let batch = stored.settings.batch;
    let previous = read.state.clone();
    let reach = |window: u64, len: u64| (window + 1) * len.max(1);
    if let Some(state) = previous
        .as_ref()
        .filter(|s| reach(s.window, s.window_ms) >= reach(read.window, window_ms))
    {
        gauges(queue, state);
        return Ok(next);
    }
    let (decision, state) = decide_window(&adaptive, &read, previous.as_ref(), batch, interval);
    let new_batch = batch_for(decision.rate_per_sec, interval);
    let stored_it = store
        .adaptive_apply(
            queue,
            &state,
            (new_batch != batch).then_some(new_batch),
            stored.version,
            window_ms,
        )
        .await?;
    if stored_it {
        report(queue, &decision, &state, batch, new_batch);
        Ok(next)
    } else {
        // Another instance decided, or the settings moved: look again soon.
        Ok(Duration::from_millis(SETTLE_MS))
    }
}

/// The decision on `read`'s window, from the `previous` one's rate and
/// hold (unless an operator set another `batch` since), and the state
/// that records it.
fn decide_window(
    adaptive: &AdaptiveSettings,
    read: &AdaptiveRead,
    previous: Option<&AdaptiveState>,
    batch: u32,
    interval: u64,
) -> (Decision, AdaptiveState) {
    // The stored rate, unless an operator has set another batch since.
    let rate = previous
        .filter(|s| batch_for(s.rate_per_sec, interval) == batch)
        .map_or_else(|| rate_of(batch, interval), |s| s.rate_per_sec);
    let hold_until = previous.map_or(0, |s| s.hold_until);
    let decision = decide(
        adaptive,
        read.window,
        read.evidence_from,
        rate,
        hold_until,
        &read.samples,
    );
    let state = AdaptiveState {
        window: read.window,
        window_ms: adaptive.window_ms,
        rate_per_sec: decision.rate_per_sec,
        hold_until: decision.hold_until,
        verdict: decision.verdict.as_str().to_owned(),
        p95_ms: read.samples.p95_ms(),
        commits: read.samples.commits(),
        failures: read.samples.failures,
        at: read.now_ms,
        evidence_from: decision.evidence_from,
    };
    (decision, state)
}

/// Counts a stored decision, shows it in the gauges, and logs a cut or a
/// new batch.
fn report(
    queue: &QueueName,
    decision: &Decision,
    state: &AdaptiveState,
    batch: u32,
    new_batch: u32,
) {
    let labels = [
        ("queue", queue.to_string()),
        ("verdict", decision.verdict.as_str().to_owned()),
    ];
    metrics::counter!("waitroom_adaptive_decisions_total", &labels).increment(1);
    gauges(queue, state);
    if matches!(
        decision.verdict,
        Verdict::DecreaseSlow | Verdict::DecreaseFailing
    ) || new_batch != batch
    {
        tracing::info!(%queue, rate = decision.rate_per_sec, batch = new_batch, verdict = decision.verdict.as_str(), p95_ms = ?state.p95_ms, commits = state.commits, failures = state.failures, "adaptive admission");
    }
}

/// The queue's adaptive gauges, from the last decision.
fn gauges(queue: &QueueName, state: &AdaptiveState) {
    let labels = [("queue", queue.to_string())];
    metrics::gauge!("waitroom_adaptive_rate", &labels).set(state.rate_per_sec);
    metrics::gauge!("waitroom_adaptive_p95_seconds", &labels)
        .set(state.p95_ms.map_or(0.0, |p| p as f64 / 1000.0));
    metrics::gauge!("waitroom_adaptive_commits", &labels).set(state.commits as f64);
    metrics::gauge!("waitroom_adaptive_failures", &labels).set(state.failures as f64);
}
