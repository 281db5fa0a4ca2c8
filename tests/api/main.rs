//! Integration tests: whole instances on port 0, spoken to over HTTP (and
//! SSE), on the in-memory store and on real Redis servers. Modules that
//! need an optional part of waitroom build only with its cargo feature
//! (`cargo test --no-default-features` builds the rest).

#[path = "../common/mod.rs"]
mod common;

mod adaptive;
mod admin_listener;
mod audit;
mod challenge;
mod client_limits;
#[cfg(feature = "redis-cluster")]
mod cluster;
#[cfg(feature = "redis-cluster")]
mod cluster_failover;
#[cfg(feature = "redis-cluster")]
mod cluster_rebuild;
mod config_file;
mod console;
mod entry_marks;
mod eta_range;
mod failures;
mod fairness;
mod features;
mod front;
mod front_refused;
mod front_sessions;
#[cfg(feature = "https-webhooks")]
mod front_tls;
mod gate_listener;
mod gone;
mod group_commit;
mod held;
#[cfg(feature = "signed-identity")]
mod identity;
mod instances;
mod lagging_node;
mod layering;
mod limits;
mod listen_backlog;
mod lottery;
mod metrics;
mod order_gate;
#[cfg(feature = "demo-orders")]
mod orders;
#[cfg(feature = "demo-orders")]
mod orders_pg;
mod page;
mod pass;
mod presence;
mod queue;
mod queue_settings;
mod reach;
mod redis_commands;
mod sentinel;
#[cfg(feature = "demo-orders")]
mod shutdown;
mod sse;
mod stock;
mod store_bound;
mod store_upgrade;
mod thread_connections;
mod tickets;
mod transport;
mod turn;
mod web;
mod webhooks;
#[cfg(feature = "https-webhooks")]
mod webhooks_tls;
mod wire;
