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
use axum::extract::Request;
use axum::http::Uri;
use axum::response::{IntoResponse, Redirect, Response};
use tower::ServiceExt;
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
/// `<base>/`, where the page's relative URLs resolve; outside the base only
/// the probes and metrics answer, anything else is a JSON `404`).
pub fn router(state: AppState) -> Router {
    let (documented, _) = routes().split_for_parts();
    let service: Router = documented
        .merge(page::router())
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            origin::refuse_cross_origin,
        ))
        .layer(axum::middleware::from_fn(headers::refuse_repeated_identity))
        .layer(axum::middleware::from_fn(security::add_headers))
        .with_state(state.clone());
    let base = state.config().base_path.clone();
    let app = if base.is_empty() {
        service
    } else {
        Router::new()
            .fallback_service(tower::service_fn(move |request: Request| {
                below_base(base.clone(), service.clone(), request)
            }))
            .layer(axum::middleware::from_fn(security::add_headers))
    };
    app.layer(crate::telemetry::trace_layer())
}

/// Serves `request` through `service` with `base` taken off its path:
/// `<base>` redirects to `<base>/`, a path outside `base` is `404`.
/// (Rewriting the path before routing, rather than nesting, lets the
/// page's fallback answer `<base>/` as it answers `/`.)
async fn below_base(
    base: String,
    service: Router,
    mut request: Request,
) -> Result<Response, std::convert::Infallible> {
    let path = request.uri().path();
    let query = request
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    // Probes and metrics are asked of each instance directly, not through
    // the proxy's prefix: they answer at the root too.
    if matches!(path, "/healthz" | "/readyz" | "/metrics") {
        return service.oneshot(request).await;
    }
    if path == base {
        return Ok(Redirect::permanent(&format!("{base}/{query}")).into_response());
    }
    let inner = path
        .strip_prefix(base.as_str())
        .filter(|rest| rest.starts_with('/'))
        .and_then(|rest| format!("{rest}{query}").parse::<Uri>().ok());
    let Some(inner) = inner else {
        return Ok(ApiError::not_found("not_found", "no such resource").into_response());
    };
    *request.uri_mut() = inner;
    service.oneshot(request).await
}

/// A known path with a method it does not take: the JSON error shape (axum
/// adds the `Allow` header).
async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
