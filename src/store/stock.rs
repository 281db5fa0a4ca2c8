//! Stock: what an order service reports it has left, which bounds how many
//! buyers admission lets in (`crate::queue::stock` has the rules).

use async_trait::async_trait;
use serde::Serialize;

use super::StoreResult;
use crate::queue::{QueueName, StockReport};

/// A queue's stock as the store keeps it (`crate::queue::stock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StockState {
    /// Units left, as last reported.
    pub remaining: u64,
    /// The most one buyer may take, as last reported.
    pub per_buyer: u64,
    /// Entry tokens used for orders since the last report.
    pub consumed_since_report: u64,
    /// Buyers holding an unexpired token.
    pub holders: u64,
    /// Buyers the stock lets admission admit now.
    pub admissible: u64,
    /// True while nothing is left: waiting buyers are told `sold_out`.
    pub sold_out: bool,
}

/// A queue's stock, as reported by its order service.
#[async_trait]
pub trait StockStore: Send + Sync + 'static {
    /// Links `queue` to an order service's stock, or updates it: records
    /// `report` (forgetting the tokens used since the last one) and answers
    /// the state after it. From then on passes and the fast track admit no
    /// more buyers than [`crate::queue::stock::admissible`] allows. A report
    /// of nothing left marks the queue sold out and publishes
    /// [`crate::store::QueueEvent::SoldOut`] once; a later report of units left reopens
    /// the line for everyone still in it, in their order.
    async fn set_stock(&self, queue: &QueueName, report: StockReport) -> StoreResult<StockState>;

    /// The stock of `queue`, `None` while no order service reported one.
    async fn stock(&self, queue: &QueueName) -> StoreResult<Option<StockState>>;
}
