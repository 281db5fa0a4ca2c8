//! The HTTP API, one module per resource, each with its own `router()`.

pub mod error;
pub mod extract;

mod admin;
mod auth;
mod entries;
mod events;
mod handover;
mod headers;
mod health;
mod lean;
pub mod limit;
mod orders;
mod page;
pub mod serve;
mod tokens;

use axum::Router;

use crate::AppState;
pub use error::ApiError;

/// Every route of the service.
pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(entries::router())
        .merge(events::router())
        .merge(health::router())
        .merge(orders::router())
        .merge(tokens::router())
        .merge(admin::router())
        .merge(page::router())
        .layer(axum::middleware::from_fn(headers::refuse_repeated_identity))
        .layer(crate::telemetry::trace_layer())
        .with_state(state)
}
