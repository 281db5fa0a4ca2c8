//! The gate follows the catalog: its queues, their claim leases and which
//! of them count orders for adaptive admission.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::catalog::Queues;
use crate::gate::Gate;
use crate::queue::QueueName;

/// The gate's queues and claim leases from the catalog.
pub fn gate_queues(queues: &Queues) -> Vec<(QueueName, Duration)> {
    queues
        .iter()
        .map(|(q, s)| (q.clone(), Duration::from_millis(s.settings.claim_lease_ms)))
        .collect()
}

/// The queues whose orders' outcomes the gate counts: adaptive admission
/// on, each with its window.
pub fn gate_adaptive(queues: &Queues) -> std::collections::HashMap<QueueName, u64> {
    queues
        .iter()
        .filter_map(|(q, s)| {
            let a = s.settings.adaptive.as_ref().filter(|a| a.enabled)?;
            Some((q.clone(), a.window_ms))
        })
        .collect()
}

/// Keeps the gate's queues and leases in step with the catalog.
pub async fn run(
    gate: Gate,
    mut queues: tokio::sync::watch::Receiver<Arc<Queues>>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = queues.changed() => {
                if changed.is_err() {
                    break;
                }
                let current = queues.borrow_and_update().clone();
                gate.set_queues(gate_queues(&current));
                gate.set_adaptive(gate_adaptive(&current));
            }
        }
    }
}
