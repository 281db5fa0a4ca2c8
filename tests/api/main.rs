//! Integration tests: whole instances on port 0, spoken to over HTTP (and
//! SSE), on the in-memory store and on real Redis servers.

#[path = "../common/mod.rs"]
mod common;

mod adaptive;
mod admin_listener;
mod audit;
mod challenge;
mod client_limits;
mod cluster;
mod cluster_failover;
mod config_file;
mod console;
mod eta_range;
mod failures;
mod gone;
mod group_commit;
mod held;
mod identity;
mod instances;
mod layering;
mod limits;
mod listen_backlog;
mod lottery;
mod metrics;
mod order_gate;
mod orders;
mod orders_pg;
mod page;
mod queue;
mod queue_settings;
mod reach;
mod redis_commands;
mod sentinel;
mod shutdown;
mod sse;
mod stock;
mod store_bound;
mod tickets;
mod transport;
mod turn;
mod web;
mod webhooks;
mod webhooks_tls;
mod wire;
