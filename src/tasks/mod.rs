//! What runs in the background: one file per task, each started by the
//! composition root (`crate::app`) with only its own handles (never the
//! HTTP state). The domain logic they call stays with its module.
//!
//! - [`catalog`]: re-reads the live queues and their settings every second;
//! - [`admission`]: an admission pass per live queue at its interval, on
//!   the queue's turn among instances; [`adaptive`]: the adaptive
//!   controller, one decision per window;
//! - [`lottery`]: draws a scheduled opening when it comes;
//! - [`fairness`]: the public admission log: takes in the audit log,
//!   signs heads;
//! - [`streams`]: reports this instance's open streams for the console;
//! - [`gate`]: keeps the order gate's queues and leases in step with the
//!   catalog;
//! - [`sessions`]: a protected site's sessions: activity reported in
//!   batches, idle ones ended, the ended log read into the local set of
//!   refused passes;
//! - [`webhooks`]: delivers the audit logs to operators' endpoints
//!   (`crate::webhook::run`);
//! - [`orders`]: the demo order service's stock report at start and its
//!   token-delete reconciler (`crate::orders::reconcile::run`).
//!
//! Not here because they are one method of the service they clean up:
//! the push hub's loop (`crate::push::run`), the request limiter's
//! housekeeping and the join challenge's `auto` switch.

pub mod adaptive;
pub mod admission;
pub mod catalog;
pub mod fairness;
pub mod gate;
pub mod lottery;
#[cfg(feature = "demo-orders")]
pub mod orders;
pub mod sessions;
pub mod streams;
pub mod webhooks;
