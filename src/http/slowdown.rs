//! `GET/PUT /api/admin/orders/slowdown`: the operator's knob that makes
//! the demo order service slow or failing on purpose (see
//! `crate::orders::slowdown`), to watch adaptive admission react.
//! This instance only, on the operator listener, with the admin token.

use axum::Json;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::AdminAuth;
use super::extract::JsonBody;
use crate::error::ErrorCode;
use crate::error::{ApiError, ErrorBody};
use crate::orders::slowdown::SlowdownSetting;

/// `/api/admin/orders/slowdown`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_slowdown, put_slowdown))
}

fn knob(state: &AppState) -> Result<&crate::orders::slowdown::Slowdown, ApiError> {
    state.orders().map(|o| o.slowdown()).ok_or_else(|| {
        ApiError::not_found(ErrorCode::OrdersDisabled, "the demo order service is off")
    })
}

/// The demo order service's slowdown on this instance.
#[utoipa::path(
    get,
    path = "/api/admin/orders/slowdown",
    tag = "admin",
    security(("admin" = [])),
    responses(
        (status = 200, description = "The knob.", body = SlowdownSetting),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`orders_disabled`.", body = ErrorBody),
    )
)]
async fn get_slowdown(
    _: AdminAuth,
    State(state): State<AppState>,
) -> Result<Json<SlowdownSetting>, ApiError> {
    Ok(Json(knob(&state)?.get()))
}

/// Slows the demo order service on this instance on purpose: every order
/// waits `delayMs` inside its claim, and a share `failRatio` rolls back
/// with `503 database_unavailable`. `{}` (or zeros) restores it.
#[utoipa::path(
    put,
    path = "/api/admin/orders/slowdown",
    tag = "admin",
    security(("admin" = [])),
    request_body = SlowdownSetting,
    responses(
        (status = 200, description = "The knob as set.", body = SlowdownSetting),
        (status = 400, description = "`invalid_slowdown` (names the field), `invalid_body`.", body = ErrorBody),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`orders_disabled`.", body = ErrorBody),
        (status = 408, description = "`request_timeout`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
    )
)]
async fn put_slowdown(
    _: AdminAuth,
    State(state): State<AppState>,
    JsonBody(setting): JsonBody<SlowdownSetting>,
) -> Result<Json<SlowdownSetting>, ApiError> {
    let knob = knob(&state)?;
    setting
        .validate()
        .map_err(|m| ApiError::bad_request(ErrorCode::InvalidSlowdown, m))?;
    knob.set(setting);
    tracing::info!(
        delay_ms = setting.delay_ms,
        fail_ratio = setting.fail_ratio,
        "demo order service slowdown set by an operator"
    );
    Ok(Json(knob.get()))
}
