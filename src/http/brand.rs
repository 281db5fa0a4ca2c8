//! `GET /api/queues/{queue}/page`: the queue's page branding (name, logo,
//! colours, texts per language) from `--page-dir`, read and checked at
//! start-up (`crate::brand`), with what the queue's live settings say of
//! its page: its `texts` (set through `PUT /api/admin/queues/{queue}`) and
//! its shop link (`shopUrl`, else `--shop-url`). The page asks for it once
//! as it loads and applies it: texts over its own messages (the live ones
//! over the branding's), colours as CSS custom properties (no inline
//! styles, which the policy forbids).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::extract::Queue;
use crate::brand::Branding;
use crate::error::ErrorBody;

/// `/api/queues/{queue}/page`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(page))
}

/// A queue's page: its branding and its live texts and shop link.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PageView {
    #[serde(flatten)]
    brand: Branding,
    /// The queue's live texts: a message key of the page (`waiting.heading`)
    /// to the text shown instead, in every language, over the branding's.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    queue_texts: BTreeMap<String, String>,
    /// Where a READY buyer goes to buy (the order service lives
    /// elsewhere): the page fills in `{token}` (the entry token) and
    /// `{queue}`, URL-encoded, and shows it as a link instead of its own
    /// order form.
    #[serde(skip_serializing_if = "Option::is_none")]
    shop_url: Option<String>,
}

/// The queue's page branding, texts and shop link: `{}` when it has none.
#[utoipa::path(
    get,
    path = "/api/queues/{queue}/page",
    tag = "queue",
    operation_id = "page",
    params(
        ("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name."),
    ),
    responses(
        (status = 200, description = "The branding, texts and shop link; every field optional.", body = PageView),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
    )
)]
async fn page(State(state): State<AppState>, Queue(queue): Queue) -> Json<PageView> {
    let brand = state
        .page_dir()
        .and_then(|dir| dir.brand(&queue))
        .cloned()
        .unwrap_or_default();
    // This instance's catalog: at most a second behind the store.
    let live = state.catalog().current();
    let settings = live.get(&queue).map(|s| &s.settings);
    Json(PageView {
        brand,
        queue_texts: settings.map(|s| s.texts.clone()).unwrap_or_default(),
        shop_url: settings
            .and_then(|s| s.shop_url.clone())
            .or_else(|| state.settings().shop_url.clone()),
    })
}
