//! Stock-aware admission: how many more buyers a queue linked to an order
//! service's stock may admit, and when its line is sold out.
//!
//! The order service reports the units it has left (`remaining`) and the
//! most one buyer may take (`per_buyer`, its `maxPerOrder`). Every token
//! holder may still take `per_buyer`, so the line admits a buyer only while
//! the holders (and the tokens used since the last report, whose orders the
//! report may not count yet) are fewer than the buyers the stock can serve,
//! `ceil(remaining / per_buyer)`: the last admitted may find fewer units
//! than `per_buyer` but finds some, and nobody is admitted for nothing. The
//! order service's own stock check keeps orders from ever overselling.
//!
//! Sold out is `remaining == 0`: nothing is left for anyone. While units
//! are left but every one is held, the line waits instead, since a holder
//! may let their token lapse. The stores (`admit.lua` and its memory twin)
//! apply these rules; this module states them once and tests them.

/// The stock an order service reported for a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StockReport {
    /// Units left to sell.
    pub remaining: u64,
    /// The most one buyer (one entry token) may take, at least 1.
    pub per_buyer: u64,
}

/// The largest `remaining` or `per_buyer` a report may carry: exact in
/// Lua's numbers and in JSON read by any client.
pub const MAX_UNITS: u64 = 1_000_000_000_000;

/// Buyers the stock can still serve beyond `holders` (live tokens) and
/// `consumed` (tokens used since the report): `ceil(remaining / per_buyer)`
/// less both, never below 0. The same arithmetic as `stock_room` in
/// `common.lua`.
pub fn admissible(report: StockReport, holders: u64, consumed: u64) -> u64 {
    report
        .remaining
        .div_ceil(report.per_buyer.max(1))
        .saturating_sub(holders)
        .saturating_sub(consumed)
}

/// Whether a pass may drop absent buyers at `now` (store clock, ms): never
/// while sold out (whoever stays in line keeps their place for a restock,
/// wherever their page is), and not until `abandon_after_ms` after the line
/// reopened, so those who came back for a restock have the usual time to
/// be seen again.
pub fn may_sweep(
    sold_out: bool,
    reopened_at: Option<u64>,
    now: u64,
    abandon_after_ms: u64,
) -> bool {
    !sold_out && reopened_at.is_none_or(|at| now.saturating_sub(at) >= abandon_after_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(remaining: u64, per_buyer: u64) -> StockReport {
        StockReport {
            remaining,
            per_buyer,
        }
    }

    #[test]
    fn one_unit_each_admits_one_buyer_per_unit_left_less_the_holders() {
        assert_eq!(admissible(report(100, 1), 0, 0), 100);
        assert_eq!(admissible(report(100, 1), 40, 0), 60);
        assert_eq!(admissible(report(100, 1), 40, 60), 0);
        assert_eq!(admissible(report(100, 1), 150, 0), 0, "never below zero");
        assert_eq!(admissible(report(0, 1), 0, 0), 0);
    }

    #[test]
    fn a_last_buyer_is_admitted_for_a_partial_share() {
        // 10 units, 4 a buyer: two full shares and one of 2.
        assert_eq!(admissible(report(10, 4), 0, 0), 3);
        assert_eq!(admissible(report(10, 4), 2, 0), 1);
        assert_eq!(admissible(report(2, 4), 0, 0), 1);
        assert_eq!(admissible(report(2, 4), 1, 0), 0);
        // A per-buyer cap of 0 is read as 1, never a division by zero.
        assert_eq!(admissible(report(3, 0), 0, 0), 3);
        assert_eq!(admissible(report(MAX_UNITS, 1), 0, 0), MAX_UNITS);
    }

    #[test]
    fn absent_buyers_are_kept_while_sold_out_and_for_a_while_after() {
        assert!(may_sweep(false, None, 1_000, 500));
        assert!(!may_sweep(true, None, 1_000, 500));
        assert!(!may_sweep(false, Some(900), 1_000, 500));
        assert!(may_sweep(false, Some(500), 1_000, 500));
        assert!(!may_sweep(false, Some(2_000), 1_000, 500), "clock skew");
    }
}
