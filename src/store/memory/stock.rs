//! The memory store's stock of a queue (`crate::queue::stock`): what the
//! order service last reported, the tokens used since, and the sold-out
//! mark, kept under the queue's lock like the rest of its state, so a pass
//! reads and spends it in one step as `admit.lua` does.

use async_trait::async_trait;

use super::MemoryStore;
use crate::queue::audit::AuditKind;
use crate::queue::stock::{admissible, may_sweep};
use crate::queue::{QueueName, StockReport};
use crate::store::{QueueEvent, StockState, StockStore, StoreError, StoreResult};

/// A queue's stock once an order service reported one.
#[derive(Debug, Clone)]
pub(super) struct Stock {
    report: StockReport,
    /// Tokens used for orders since the report.
    consumed: u64,
    sold_out: bool,
    /// When a report last reopened a sold-out line (store clock, ms).
    reopened_at: Option<u64>,
}

/// What a report did to the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Change {
    /// Nothing is left now and was before: publish `SoldOut` once.
    SoldOut,
    /// Anything else.
    None,
}

/// Records `report` over `stock` (none before: the queue gets linked).
pub(super) fn report(stock: &mut Option<Stock>, report: StockReport, now: u64) -> Change {
    let was_sold_out = stock.as_ref().is_some_and(|s| s.sold_out);
    let sold_out = report.remaining == 0;
    let reopened_at = match stock.as_ref() {
        Some(_) if was_sold_out && !sold_out => Some(now),
        Some(s) => s.reopened_at,
        None => None,
    };
    *stock = Some(Stock {
        report,
        consumed: 0,
        sold_out,
        reopened_at,
    });
    if sold_out && !was_sold_out {
        Change::SoldOut
    } else {
        Change::None
    }
}

/// Buyers the stock lets in beside `holders` (unlimited when not linked).
pub(super) fn room(stock: &Option<Stock>, holders: u64) -> u64 {
    stock
        .as_ref()
        .map_or(u64::MAX, |s| admissible(s.report, holders, s.consumed))
}

/// Whether `stock` is sold out.
pub(super) fn sold_out(stock: &Option<Stock>) -> bool {
    stock.as_ref().is_some_and(|s| s.sold_out)
}

/// Whether a pass may drop absent buyers now.
pub(super) fn sweeps(stock: &Option<Stock>, now: u64, abandon_after_ms: u64) -> bool {
    stock
        .as_ref()
        .is_none_or(|s| may_sweep(s.sold_out, s.reopened_at, now, abandon_after_ms))
}

/// Counts a token used for an order (its units may not be in the report).
pub(super) fn note_consumed(stock: &mut Option<Stock>) {
    if let Some(s) = stock.as_mut() {
        s.consumed += 1;
    }
}

/// The state as the store answers it.
pub(super) fn state(stock: &Option<Stock>, holders: u64) -> Option<StockState> {
    stock.as_ref().map(|s| StockState {
        remaining: s.report.remaining,
        per_buyer: s.report.per_buyer,
        consumed_since_report: s.consumed,
        holders,
        admissible: admissible(s.report, holders, s.consumed),
        sold_out: s.sold_out,
    })
}

#[async_trait]
impl StockStore for MemoryStore {
    async fn set_stock(&self, queue: &QueueName, report: StockReport) -> StoreResult<StockState> {
        let (change, state) = self.with_queue(queue, |q, now| {
            let change = self::report(&mut q.stock, report, now);
            if change == Change::SoldOut {
                let max = self.audit_max_len;
                q.audit
                    .append(max, now, AuditKind::SoldOut, None, None, None);
            }
            (change, self::state(&q.stock, q.active() as u64))
        });
        if change == Change::SoldOut {
            self.publish(queue, QueueEvent::SoldOut);
        }
        state.ok_or_else(|| StoreError::Protocol("a report left no stock".into()))
    }

    async fn stock(&self, queue: &QueueName) -> StoreResult<Option<StockState>> {
        Ok(self.with_queue(queue, |q, _| self::state(&q.stock, q.active() as u64)))
    }
}
