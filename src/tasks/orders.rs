//! The demo order service's background work: the stock report at start
//! (`--stock-from-orders`) and the reconciler of recorded token deletes.

use crate::orders::OrderStore;
use crate::queue::QueueName;
use crate::store::SharedStore;

pub use crate::orders::reconcile::run as reconcile;

/// Links each queue to its products' stock once at start; every order and
/// restock reports again (`crate::http::stock`).
pub async fn report_stock(store: SharedStore, orders: OrderStore, queues: Vec<QueueName>) {
    for queue in &queues {
        if let Err(e) = crate::orders::stock::report_from(&store, &orders, queue).await {
            tracing::warn!(%queue, error = %e, "cannot report the demo stock");
        }
    }
}
