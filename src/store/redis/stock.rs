//! Stock in Redis (`stock.lua`): one hash per queue, read and written
//! by one script so a report and the admission it bounds never interleave.

use async_trait::async_trait;

use super::RedisStore;
use crate::queue::{QueueName, StockReport};
use crate::store::{StockState, StockStore, StoreError, StoreResult};

impl RedisStore {
    /// `lua/stock.lua`: records `report`, or only reads without one.
    async fn run_stock(
        &self,
        queue: &QueueName,
        report: Option<StockReport>,
    ) -> StoreResult<Option<StockState>> {
        let reply: Vec<u64> = self
            .run_for(
                &self.scripts.stock,
                queue,
                &[],
                vec![self.keys(queue).stock(), self.keys(queue).audit()],
                |inv| match report {
                    Some(r) => {
                        inv.arg(r.remaining).arg(r.per_buyer.max(1));
                    }
                    None => {
                        inv.arg("").arg(0);
                    }
                },
            )
            .await?;
        match reply[..] {
            [] => Ok(None),
            [
                remaining,
                per_buyer,
                consumed,
                holders,
                admissible,
                sold_out,
            ] => Ok(Some(StockState {
                remaining,
                per_buyer,
                consumed_since_report: consumed,
                holders,
                admissible,
                sold_out: sold_out == 1,
            })),
            _ => Err(StoreError::Protocol(format!(
                "stock.lua returned {reply:?}"
            ))),
        }
    }
}

#[async_trait]
impl StockStore for RedisStore {
    async fn set_stock(&self, queue: &QueueName, report: StockReport) -> StoreResult<StockState> {
        self.run_stock(queue, Some(report))
            .await?
            .ok_or_else(|| StoreError::Protocol("stock.lua recorded no stock".into()))
    }

    async fn stock(&self, queue: &QueueName) -> StoreResult<Option<StockState>> {
        self.run_stock(queue, None).await
    }
}
