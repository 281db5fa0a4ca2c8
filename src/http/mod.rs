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
pub mod origin;
mod page;
pub mod security;
mod tokens;
pub mod wire;

use axum::Router;
use axum::response::Redirect;
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
        .merge(events::router())
        .merge(health::router())
        .merge(orders::router())
        .merge(tokens::router())
        .merge(admin::router())
        .routes(routes!(openapi::openapi_json))
}

/// Every route of the service, below `--base-path` when one is set (the
/// proxy forwards the prefix unchanged; `<base>` itself redirects to
/// `<base>/`, where the page's relative URLs resolve, and anything outside
/// the base is a JSON `404`).
pub fn router(state: AppState) -> Router {
    let (documented, _) = routes().split_for_parts();
    let service = documented
        .merge(page::router())
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            origin::refuse_cross_origin,
        ))
        .layer(axum::middleware::from_fn(headers::refuse_repeated_identity));
    let base = state.config().base_path.clone();
    let app = if base.is_empty() {
        service
    } else {
        let to = format!("{base}/");
        Router::new()
            .nest(&base, service)
            .route(
                &base,
                axum::routing::get(move || async move { Redirect::permanent(&to) }),
            )
            .fallback(|| async { ApiError::not_found("not_found", "no such resource") })
    };
    app.layer(axum::middleware::from_fn_with_state(
        base,
        security::add_headers,
    ))
    .layer(crate::telemetry::trace_layer())
    .with_state(state)
}

/// A known path with a method it does not take: the JSON error shape (axum
/// adds the `Allow` header).
async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
