//! The demo order service's stock, reported to the store: what its
//! products have left in a queue becomes the queue's stock (sold out and
//! stock-aware admission follow it).

use crate::queue::{QueueName, StockReport};
use crate::store::{SharedStore, StockState};

use super::OrderStore;

/// Reports the demo products of `queue` to `store`.
pub async fn report_from(
    store: &SharedStore,
    orders: &OrderStore,
    queue: &QueueName,
) -> Result<StockState, String> {
    let (units, per) = orders
        .queue_stock(queue.as_str())
        .await
        .map_err(|e| e.to_string())?;
    let report = StockReport {
        remaining: units.max(0) as u64,
        per_buyer: per.max(1) as u64,
    };
    store
        .set_stock(queue, report)
        .await
        .map_err(|e| e.to_string())
}
