//! Liveness and readiness probes, and the Prometheus metrics endpoint.

use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::error::ApiError;
use crate::AppState;

/// `/healthz`, `/readyz`, `/metrics`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

/// `200` while the process runs.
async fn healthz() -> impl IntoResponse {
    Json(json!({ "status": "ok" }))
}

/// `200` only while the store answers, so a load balancer stops sending
/// buyers to an instance that would refuse them.
async fn readyz(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    state.store().ping().await?;
    Ok(Json(json!({ "status": "ready" })))
}

async fn metrics() -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        crate::telemetry::render(),
    )
}
