//! The HTTP API, one module per resource, each with its own `router()`.

pub mod error;
pub mod extract;

mod admin;
mod auth;
mod challenge;
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

/// Every documented route, with its operation in the API document.
fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(entries::router())
        .merge(challenge::router())
        .merge(events::router())
        .merge(health::router())
        .merge(orders::router())
        .merge(tokens::router())
        .merge(admin::router())
        .routes(routes!(openapi::openapi_json))
}

/// Every route of the service.
pub fn router(state: AppState) -> Router {
    let (documented, _) = routes().split_for_parts();
    documented
        .merge(page::router())
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(headers::refuse_repeated_identity))
        .layer(crate::telemetry::trace_layer())
        .with_state(state)
}

/// A known path with a method it does not take: the JSON error shape (axum
/// adds the `Allow` header).
async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
