//! Whether a join needs a solved challenge right now: never (`off`), on
//! every join (`always`), or while the queue is under attack (`auto`).
//!
//! In `auto` mode each instance counts the join requests of each queue in
//! memory (one atomic add per join, no store call) and, once a second per
//! queue, adds its count to the queue's shared rate in the store
//! ([`crate::store::ChallengeStore::note_joins`]). Whichever instance's count tips
//! the busier of the last two store seconds over the threshold turns the
//! switch on for `hold`, in the store; every instance reads it back with
//! its own next count, so all of them agree within about a second. Cost:
//! one store call per queue per instance per second, however many joins;
//! none at all in the other modes. The rate is approximate (each
//! instance's second of joins lands in the store second its call does), which
//! is enough to tell an attack from a sale's normal arrivals.
//!
//! Join requests count whether or not they get in (a flood of joins
//! without solutions keeps the switch on). While the store does not
//! answer, the switch keeps its last state (the joins then fail with `503`
//! anyway).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use tokio_util::sync::CancellationToken;

use crate::queue::QueueName;
use crate::store::ChallengeStore;

/// When joins need a solved challenge (`--join-challenge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Never (the default).
    Off,
    /// On every join.
    Always,
    /// While the queue's joins per second exceed the threshold.
    Auto,
}

/// How often each instance reports its joins and reads the switch back.
pub const REPORT_EVERY: Duration = Duration::from_secs(1);

/// The challenge switch of every queue on this instance.
pub struct Switch {
    mode: Mode,
    threshold: u64,
    hold: Duration,
    started: Instant,
    queues: HashMap<QueueName, QueueSwitch>,
}

#[derive(Default)]
struct QueueSwitch {
    /// Join requests since the last report.
    joins: AtomicU64,
    /// Until when (ms since `started`) joins need a challenge.
    on_until: AtomicU64,
}

impl Switch {
    /// A switch for `queues` in `mode`; `threshold` and `hold` apply to
    /// `auto`.
    pub fn new(mode: Mode, queues: &[QueueName], threshold: u64, hold: Duration) -> Self {
        Self {
            mode,
            threshold,
            hold,
            started: Instant::now(),
            queues: queues
                .iter()
                .map(|q| (q.clone(), QueueSwitch::default()))
                .collect(),
        }
    }

    /// The configured mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Counts one join request of `queue` and answers whether it needs a
    /// solved challenge.
    pub fn on_join(&self, queue: &QueueName) -> bool {
        if self.mode == Mode::Auto
            && let Some(q) = self.queues.get(queue)
        {
            q.joins.fetch_add(1, Ordering::Relaxed);
        }
        self.required(queue)
    }

    /// Whether a join of `queue` needs a solved challenge now.
    pub fn required(&self, queue: &QueueName) -> bool {
        match self.mode {
            Mode::Off => false,
            Mode::Always => true,
            Mode::Auto => self
                .queues
                .get(queue)
                .is_some_and(|q| q.on_until.load(Ordering::Relaxed) > self.now()),
        }
    }

    /// Reports this instance's joins and reads the switch back, every
    /// [`REPORT_EVERY`] until `shutdown` (only in `auto` mode; returns at
    /// once otherwise).
    pub async fn run(
        self: std::sync::Arc<Self>,
        store: std::sync::Arc<dyn ChallengeStore>,
        shutdown: CancellationToken,
    ) {
        if self.mode != Mode::Auto {
            return;
        }
        let mut tick = tokio::time::interval(REPORT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            for (queue, q) in &self.queues {
                let joins = q.joins.swap(0, Ordering::Relaxed);
                let hold_ms = self.hold.as_millis() as u64;
                match store
                    .note_joins(queue, joins, self.threshold, hold_ms)
                    .await
                {
                    Ok(left_ms) => {
                        let was = self.required(queue);
                        q.on_until.store(self.now() + left_ms, Ordering::Relaxed);
                        let is = left_ms > 0;
                        if was != is {
                            tracing::info!(%queue, on = is, "join challenge switched");
                        }
                        metrics::gauge!("waitroom_join_challenge_on", "queue" => queue.to_string())
                            .set(if is { 1.0 } else { 0.0 });
                    }
                    Err(e) => {
                        // Put the joins back for the next report.
                        q.joins.fetch_add(joins, Ordering::Relaxed);
                        tracing::warn!(%queue, error = %e, "cannot report joins; the challenge switch keeps its state");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use std::sync::Arc;

    #[test]
    fn off_and_always_need_no_store() {
        let q = QueueName::parse("default").unwrap();
        let off = Switch::new(
            Mode::Off,
            std::slice::from_ref(&q),
            1,
            Duration::from_secs(1),
        );
        let always = Switch::new(
            Mode::Always,
            std::slice::from_ref(&q),
            1,
            Duration::from_secs(1),
        );
        for _ in 0..10 {
            assert!(!off.on_join(&q));
            assert!(always.on_join(&q));
        }
        assert_eq!(
            off.queues[&q].joins.load(Ordering::Relaxed),
            0,
            "not counted"
        );
    }

    #[tokio::test]
    async fn auto_turns_on_over_the_threshold_and_off_after_the_hold() {
        let q = QueueName::parse("default").unwrap();
        let switch = Arc::new(Switch::new(
            Mode::Auto,
            std::slice::from_ref(&q),
            3,
            Duration::from_millis(1500),
        ));
        let store: Arc<dyn ChallengeStore> = Arc::new(MemoryStore::new());
        let stop = CancellationToken::new();
        let task = tokio::spawn(switch.clone().run(store, stop.clone()));
        for _ in 0..3 {
            assert!(!switch.on_join(&q), "under the threshold");
        }
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(!switch.required(&q), "3 is not over 3");
        for _ in 0..5 {
            switch.on_join(&q);
        }
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(switch.required(&q), "5 a second is over 3");
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert!(!switch.required(&q), "quiet for longer than the hold");
        stop.cancel();
        task.await.unwrap();
    }
}
