//! Liveness and readiness probes, and the Prometheus metrics endpoint.

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use crate::error::{ApiError, ErrorBody};

/// `/healthz`, `/readyz` (on both listeners).
pub fn probes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// `/metrics` (on the operator listener only).
pub fn metrics_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// A probe's answer.
#[derive(Serialize, utoipa::ToSchema)]
struct Probe {
    /// `ok` (liveness) or `ready` (readiness).
    status: &'static str,
}

/// `200` while the process runs.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "The process runs.", body = Probe))
)]
async fn healthz() -> Json<Probe> {
    Json(Probe { status: "ok" })
}

/// `200` only while the store answers, so a load balancer stops sending
/// buyers to an instance that would refuse them.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "The store answers.", body = Probe),
        (status = 503, description = "`store_unavailable` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn readyz(State(state): State<AppState>) -> Result<Json<Probe>, ApiError> {
    state.store().ping().await?;
    Ok(Json(Probe { status: "ready" }))
}

/// Prometheus metrics.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text format.",
        content_type = "text/plain; version=0.0.4", body = String))
)]
async fn metrics() -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        crate::telemetry::render(),
    )
}
