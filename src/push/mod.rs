//! Push: the instance's one subscription to queue events, fanned out to
//! what listens on this instance.
//!
//! Every admission pass, whichever instance ran it, arrives here once. The
//! hub feeds the observed admission rate that wait estimates use.

use std::collections::HashMap;
use std::sync::Mutex;

use futures::StreamExt;

use crate::AppState;
use crate::queue::{QueueName, RateEstimator};
use crate::store::{QueueEvent, StoreEvent};

/// How far back the observed admission rate looks.
const RATE_WINDOW_MS: u64 = 30_000;

/// Per-instance state fed by queue events.
pub struct Hub {
    rates: HashMap<QueueName, Mutex<RateEstimator>>,
}

impl Hub {
    /// A hub for `queues`.
    pub fn new(queues: &[QueueName]) -> Self {
        Self {
            rates: queues
                .iter()
                .map(|q| (q.clone(), Mutex::new(RateEstimator::new(RATE_WINDOW_MS))))
                .collect(),
        }
    }

    /// The observed admission rate of `queue`, or `fallback` without data.
    pub fn rate(&self, queue: &QueueName, fallback: f64) -> f64 {
        self.rates
            .get(queue)
            .map(|r| r.lock().unwrap_or_else(|e| e.into_inner()).rate(fallback))
            .unwrap_or(fallback)
    }

    fn on_event(&self, event: StoreEvent) {
        if let StoreEvent::Queue {
            queue,
            event: QueueEvent::Pass(pass),
        } = event
            && pass.busy
            && let Some(r) = self.rates.get(&queue)
        {
            r.lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(pass.at, pass.admitted.len() as u64);
        }
    }
}

/// Runs the instance's subscription until shutdown.
pub async fn run(state: AppState) {
    let mut events = state.store().subscribe(state.queue_names());
    let shutdown = state.shutdown().clone();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            event = events.next() => match event {
                Some(event) => state.hub().on_event(event),
                None => break,
            },
        }
    }
}
