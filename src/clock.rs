//! The one wall clock of the crate: tickets, claims, lotteries, webhooks,
//! the memory store and the console all read it through [`now_ms`].

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in ms since the Unix epoch (0 on a clock before it).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
