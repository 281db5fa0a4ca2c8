//! Webhook delivery: one task reading each live queue's audit log through
//! its consumer group and posting it to the operators' endpoints. The
//! loop lives with its signing and TLS client in `crate::webhook`.

pub use crate::webhook::{DeliveryOptions, run};
