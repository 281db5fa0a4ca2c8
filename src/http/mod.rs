//! The HTTP API, one module per resource, each with its own `router()`.

pub mod error;
pub mod extract;

mod admin;
mod auth;
mod entries;
mod events;
mod handoff;
mod headers;
mod health;
mod identity;
pub mod limit;
mod openapi;
mod orders;
mod page;
mod tokens;
pub mod wire;

use axum::Router;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::AppState;
pub use error::ApiError;
pub use events::PATH as EVENTS_PATH;
pub use handoff::LeanStream;
pub use openapi::document as api_document;

/// Every documented route, with its operation in the API document (both
/// listeners' routes: one document describes the whole service).
fn routes() -> OpenApiRouter<AppState> {
    public_routes().merge(operator_only())
}

/// The buyers' routes: the queue, the stream, the demo order service, the
/// probes and the API document.
fn public_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(entries::router())
        .merge(events::router())
        .merge(health::probes())
        .merge(orders::router())
        .routes(routes!(openapi::openapi_json))
}

/// The operators' routes: metrics, the admin API, the token API for order
/// services, and the probes (a health check of the operator port).
fn operator_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(health::probes())
        .merge(operator_only())
}

/// The routes only the operator listener serves.
fn operator_only() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(health::metrics_router())
        .merge(tokens::router())
        .merge(admin::router())
}

/// What the public listener (`--addr`) serves: the buyers' routes and the
/// page. Operator paths are not there: `404 not_found`, like any unknown
/// path, so the public port tells nothing about them.
pub fn router(state: AppState) -> Router {
    let (documented, _) = public_routes().split_for_parts();
    finish(documented.merge(page::router()), state)
}

/// What the operator listener (`--admin-addr`) serves; any other path is
/// `404 not_found`.
pub fn admin_router(state: AppState) -> Router {
    let (documented, _) = operator_routes().split_for_parts();
    finish(documented.fallback(not_found), state)
}

/// The layers both listeners share.
fn finish(routes: Router<AppState>, state: AppState) -> Router {
    routes
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(headers::refuse_repeated_identity))
        .layer(crate::telemetry::trace_layer())
        .with_state(state)
}

/// A path the operator listener does not serve.
async fn not_found() -> ApiError {
    ApiError::not_found("not_found", "no such resource")
}

/// A known path with a method it does not take: the JSON error shape (axum
/// adds the `Allow` header).
async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
