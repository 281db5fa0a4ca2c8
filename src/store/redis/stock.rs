//! Stock in Redis (`stock.lua`): one hash per queue, read and written
//! by one script so a report and the admission it bounds never interleave.

use async_trait::async_trait;
use redis::{FromRedisValue, ParsingError, Value};

use super::RedisStore;
use super::decode::Reply;
use crate::queue::{QueueName, StockReport};
use crate::store::{StockState, StockStore, StoreError, StoreResult};

impl RedisStore {
    /// `lua/stock.lua`: records `report`, or only reads without one.
    async fn run_stock(
        &self,
        queue: &QueueName,
        report: Option<StockReport>,
    ) -> StoreResult<Option<StockState>> {
        let StockReply(state) = self
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
        Ok(state)
    }
}

/// `stock.lua`'s reply: `{remaining, per, consumed, holders, admissible,
/// sold_out}`, or `{}` when only reading a queue no report linked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StockReply(Option<StockState>);

impl FromRedisValue for StockReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let mut r = Reply::of("stock.lua", value)?;
        if r.is_done() {
            return Ok(Self(None));
        }
        let state = StockState {
            remaining: r.count("remaining")?,
            per_buyer: r.count("per_buyer")?,
            consumed_since_report: r.count("consumed")?,
            holders: r.count("holders")?,
            admissible: r.count("admissible")?,
            sold_out: r.flag("sold_out")?,
        };
        r.end()?;
        Ok(Self(Some(state)))
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

#[cfg(test)]
mod tests {
    use super::super::decode::tests::{decode, reply};
    use super::*;

    #[test]
    fn the_stock_decodes_by_name_and_an_empty_reply_is_none() {
        let StockReply(Some(state)) = decode(reply(&["5", "2", "3", "4", "1", "0"])).unwrap()
        else {
            panic!("a stock");
        };
        assert_eq!(
            state,
            StockState {
                remaining: 5,
                per_buyer: 2,
                consumed_since_report: 3,
                holders: 4,
                admissible: 1,
                sold_out: false,
            }
        );
        assert_eq!(decode::<StockReply>(reply(&[])).unwrap(), StockReply(None));
        let short = decode::<StockReply>(reply(&["5", "2", "3", "4", "1"])).unwrap_err();
        assert!(
            short.contains("stock.lua") && short.contains("no sold_out"),
            "{short}"
        );
        let wrong = decode::<StockReply>(reply(&["5", "2", "-3", "4", "1", "0"])).unwrap_err();
        assert!(wrong.contains("consumed: -3 is below zero"), "{wrong}");
        let text = decode::<StockReply>(reply(&["5", "two", "3", "4", "1", "0"])).unwrap_err();
        assert!(text.contains("per_buyer"), "{text}");
        assert!(decode::<StockReply>(Value::Nil).is_err(), "not an array");
    }
}
