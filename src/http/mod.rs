//! The HTTP API, one module per resource, each with its own `router()`.

pub(crate) mod body;
pub mod client;
pub mod cookies;
pub mod extract;

mod admin;
mod audit;
pub(crate) mod auth;
mod brand;
mod challenge;
mod console;
mod entries;
mod entry_times;
mod events;
mod fairness;
pub mod gate;
mod handoff;
mod headers;
mod health;
mod host;
mod identity;
pub mod limit;
mod lottery;
mod openapi;
#[cfg(feature = "demo-orders")]
mod orders;
pub mod origin;
mod page;
mod pass;
mod queue_admin;
pub mod security;
#[cfg(feature = "demo-orders")]
mod slowdown;
mod state;
pub mod stock;
mod tokens;
pub mod wire;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::Uri;
use axum::response::{IntoResponse, Redirect, Response};
use tower::ServiceExt;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use crate::error::{ApiError, ErrorBody, ErrorCode};
pub use events::PATH as EVENTS_PATH;
pub use gate::EntryPass;
pub use handoff::LeanStream;
pub use openapi::document as api_document;
pub use state::{AppState, HttpSettings, Services};

/// Every documented route, with its operation in the API document (both
/// listeners' routes: one document describes the whole service).
fn routes() -> OpenApiRouter<AppState> {
    public_routes().merge(operator_only())
}

/// The buyers' routes: the queue, the stream, the demo order service, the
/// probes and the API document.
fn public_routes() -> OpenApiRouter<AppState> {
    let router = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(entries::router())
        .merge(lottery::router())
        .merge(fairness::router())
        .merge(challenge::router())
        .merge(brand::router())
        .merge(events::router())
        .merge(pass::router())
        .merge(health::probes());
    #[cfg(feature = "demo-orders")]
    let router = router.merge(orders::router());
    router.routes(routes!(openapi::openapi_json))
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
    let router = OpenApiRouter::new()
        .merge(health::metrics_router())
        .merge(tokens::router())
        .merge(stock::router())
        .merge(lottery::admin_router())
        .merge(admin::router())
        .merge(queue_admin::router())
        .merge(audit::router())
        .merge(pass::admin_router());
    #[cfg(feature = "demo-orders")]
    let router = router.merge(slowdown::router());
    router.merge(console::router())
}

/// What the public listener (`--addr`) serves: the buyers' routes and the
/// page, below `--base-path` when one is set (the proxy forwards the prefix
/// unchanged; `<base>` itself redirects to `<base>/`, where the page's
/// relative URLs resolve; outside the base only the probes answer, anything
/// else is a JSON `404`). Operator paths are not there: `404 not_found`,
/// like any unknown path, so the public port tells nothing about them.
/// The gateway check (`<base>/api/gate/check`), asked before every
/// request to a protected site, is answered ahead of the layers and the
/// request span (`pass::check_lean`: the guards of the layers that concern
/// it are its own).
pub fn router(state: AppState) -> Router {
    let (documented, _) = public_routes().split_for_parts();
    let service: Router = documented
        // The gateway check answers whatever method the gateway forwards
        // (nginx's auth_request keeps the visitor's); GET and HEAD are
        // the documented route.
        .route(
            pass::CHECK_PATH,
            axum::routing::on(
                axum::routing::MethodFilter::POST
                    .or(axum::routing::MethodFilter::PUT)
                    .or(axum::routing::MethodFilter::PATCH)
                    .or(axum::routing::MethodFilter::DELETE)
                    .or(axum::routing::MethodFilter::OPTIONS),
                pass::check,
            ),
        )
        .merge(page::router())
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            public_guards,
        ))
        .with_state(state.clone());
    let base = state.settings().base_path.clone();
    let app = if base.is_empty() {
        service
    } else {
        Router::new()
            .fallback_service(tower::service_fn(move |request: Request| {
                below_base(base.clone(), service.clone(), request)
            }))
            .layer(axum::middleware::from_fn(security::add_headers))
    };
    let app = app.layer(crate::telemetry::trace_layer());
    // The gateway check runs before every request to the protected site:
    // it is answered here, ahead of the layers meant for waitroom's own
    // API (`pass::check_lean` keeps what of them concerns the check).
    let check_path: std::sync::Arc<str> =
        format!("{}{}", state.settings().base_path, pass::CHECK_PATH).into();
    Router::new().fallback_service(tower::service_fn(move |request: Request| {
        if request.uri().path() == &*check_path && pass::is_check_method(request.method()) {
            let answer = pass::check_lean(&state, &request, pass::Reader::Anyone);
            futures::future::Either::Left(std::future::ready(Ok(answer)))
        } else {
            futures::future::Either::Right(app.clone().oneshot(request))
        }
    }))
}

/// The public router's guards, in this order, and its security headers on
/// every answer, the guards' refusals included: a repeated identity header
/// is `400` (`headers.rs`), a guarded path asked from another origin `403`
/// (`origin.rs`), and plain-named cookies are taken out where cookies are
/// `Secure` (`cookies.rs`) before any extractor reads the request. One
/// layer rather than one per rule: each layer clones the router's service
/// and boxes a future for every request.
async fn public_guards(
    State(state): State<AppState>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let api = request.uri().path().starts_with("/api/");
    let refused = headers::repeated_identity(&request)
        .or_else(|| origin::refuse_cross_origin(&state, &request));
    let mut response = match refused {
        Some(refused) => refused,
        None => {
            next.run(cookies::only_prefixed_names(&state, request))
                .await
        }
    };
    security::apply(response.headers_mut(), api);
    response
}

/// What the gateway listener (`--gate-addr`) answers, request by request
/// and without a router (`crate::server::gate` calls it for each): the
/// gateway check at `/api/gate/check` (`pass::CHECK_PATH`), as the public listener answers
/// it (`pass::check_lean`) but for the page's security headers on a `200`,
/// which no gateway passes on; no base path (gateways reach the instance
/// directly, as operators do); any other path is `404 not_found`. The request's body is never read: a gateway's
/// subrequest has none.
pub fn gate_answer<B>(state: &AppState, request: &axum::http::Request<B>) -> Response {
    let mut response = if request.uri().path() != pass::CHECK_PATH {
        ApiError::not_found(ErrorCode::NotFound, "no such resource").into_response()
    } else if pass::is_check_method(request.method()) {
        return pass::check_lean(state, request, pass::Reader::Gateway);
    } else {
        // `TRACE`, `CONNECT`: refused as the public router refuses them.
        let mut refused = ApiError::MethodNotAllowed.into_response();
        const ALLOW: axum::http::HeaderValue =
            axum::http::HeaderValue::from_static("GET,HEAD,POST,PUT,PATCH,DELETE,OPTIONS");
        refused
            .headers_mut()
            .insert(axum::http::header::ALLOW, ALLOW);
        refused
    };
    security::apply(response.headers_mut(), true);
    response
}

/// What the operator listener (`--admin-addr`) serves; any other path is
/// `404 not_found`, and under `/api/admin` or `/api/tokens` only once the
/// scope's token is given (`401` before); any request not naming the
/// listener in `Host` is `421` first (`host.rs`). No base path: operators
/// reach each instance directly.
pub fn admin_router(state: AppState) -> Router {
    let (documented, _) = operator_routes().split_for_parts();
    // Validated at start-up (`Config::validate`).
    let hosts = host::OperatorHosts::new(state.settings().admin_hosts.clone());
    documented
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(headers::refuse_repeated_identity))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_scope,
        ))
        .layer(axum::middleware::from_fn_with_state(
            hosts,
            host::refuse_foreign_hosts,
        ))
        .layer(axum::middleware::from_fn(security::add_headers))
        .layer(crate::telemetry::trace_layer())
        .with_state(state)
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
    // Probes are asked of each instance directly, not through the proxy's
    // prefix: they answer at the root too.
    if matches!(path, "/healthz" | "/readyz") {
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
        return Ok(ApiError::not_found(ErrorCode::NotFound, "no such resource").into_response());
    };
    *request.uri_mut() = inner;
    service.oneshot(request).await
}

/// A path the operator listener does not serve.
async fn not_found() -> ApiError {
    ApiError::not_found(ErrorCode::NotFound, "no such resource")
}

/// A known path with a method it does not take: the JSON error shape (axum
/// adds the `Allow` header).
async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// The page's `index.html` (the page directory's, else the embedded one):
/// what the built-in proxy dresses as the waiting page (`crate::front`).
pub async fn page_index(state: &AppState) -> Option<std::borrow::Cow<'static, [u8]>> {
    page::file(state, "index.html").await
}
