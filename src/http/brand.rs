//! `GET /api/queues/{queue}/page`: the queue's page branding (name, logo,
//! colours, texts per language) from `--page-dir`, read and checked at
//! start-up (`crate::brand`). The page asks for it once as it loads and
//! applies it: texts over its own messages, colours as CSS custom
//! properties (no inline styles, which the policy forbids).

use axum::Json;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::ErrorBody;
use super::extract::Queue;
use crate::app::AppState;
use crate::brand::Branding;

/// `/api/queues/{queue}/page`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(page))
}

/// The queue's page branding: `{}` when it has none.
#[utoipa::path(
    get,
    path = "/api/queues/{queue}/page",
    tag = "queue",
    operation_id = "page",
    params(
        ("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name."),
    ),
    responses(
        (status = 200, description = "The branding; every field optional.", body = Branding),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
    )
)]
async fn page(State(state): State<AppState>, Queue(queue): Queue) -> Json<Branding> {
    Json(
        state
            .page_dir()
            .and_then(|dir| dir.brand(&queue))
            .cloned()
            .unwrap_or_default(),
    )
}
