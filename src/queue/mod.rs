//! Queue rules: names, identities, a user's standing, polling tiers, wait
//! estimates, live settings, entry tokens and queue tickets.
//!
//! This module knows neither Redis nor HTTP, so every adapter and every
//! endpoint applies the same rules, and they can be tested on their own.

pub mod adaptive;
pub mod audit;
mod eta;
#[cfg(test)]
mod eta_sim;
pub mod fairness;
pub mod lottery;
mod names;
mod session;
mod settings;
mod status;
pub mod stock;
mod ticket;
mod token;

pub use adaptive::AdaptiveSettings;
pub use eta::{Forecast, RateEstimator, WaitRange};
pub use names::{InvalidName, QueueName, UserId};
pub use session::SessionId;
pub use settings::{QueueSettings, Queues, StoredSettings, check_shop_url};
pub use status::{Policy, STALE_ENTRY_LAG_MAX, Snapshot, Standing, polling_interval_secs};
pub use stock::StockReport;
pub use ticket::{Ticket, TicketError, TicketSigner};
pub use token::EntryToken;
