//! The admin API for operators: queue counts and rates, holding and
//! resuming admission (when the order service struggles), and products of
//! the demo order service (listing, restocking, per-order caps).
//! `Authorization: Bearer <admin token>`, checked before anything else.

use axum::Json;
#[cfg(feature = "demo-orders")]
use axum::extract::Path;
use axum::extract::State;
#[cfg(feature = "demo-orders")]
use serde::Deserialize;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::AdminAuth;
#[cfg(feature = "demo-orders")]
use super::extract::JsonBody;
use super::extract::Queue;
#[cfg(feature = "demo-orders")]
use crate::error::ErrorCode;
use crate::error::{ApiError, ErrorBody};
#[cfg(feature = "demo-orders")]
use crate::orders::{Product, ProductUpdate};
#[cfg(feature = "demo-orders")]
use crate::queue::QueueName;

/// `/api/admin/queues`, `/api/admin/queues/{queue}/{pause,resume}`,
/// `/api/admin/products`, `/api/admin/products/{id}`.
pub fn router() -> OpenApiRouter<AppState> {
    let router = OpenApiRouter::new()
        .routes(routes!(queues))
        .routes(routes!(pause))
        .routes(routes!(resume));
    #[cfg(feature = "demo-orders")]
    let router = router
        .routes(routes!(put_product))
        .routes(routes!(list_products));
    router
}

/// Every queue's counts and live policy, the policy new queues start from
/// and this instance's streams.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct Overview {
    queues: Vec<QueueCounts>,
    /// The policy a queue opened through the admin API starts from (the
    /// start-up flags). A queue's own, live one is its `policy`.
    policy: PolicyView,
    /// Streams open on this instance.
    streams_open: usize,
    /// Streams this instance holds before shedding.
    max_streams: usize,
}

/// One queue's counts.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct QueueCounts {
    queue: String,
    waiting: u64,
    /// Token holders.
    active: u64,
    /// The admission pass counter.
    pass: u64,
    /// Admission held by an operator.
    paused: bool,
    /// Admissions per second over the last half minute, by passes and on
    /// the fast track, as observed (every instance's): 0 when nobody was
    /// admitted, never the configured rate standing in for it.
    observed_admissions_per_second: f64,
    streams_on_this_instance: usize,
    /// The queue's admission policy as it is now (its live settings).
    policy: PolicyView,
}

/// An admission policy.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct PolicyView {
    admission_batch: u32,
    admission_interval_ms: u64,
    token_ttl_seconds: u64,
    max_active: Option<u64>,
    abandon_after_seconds: Option<u64>,
}

/// The answer to a hold or a resume.
#[derive(Serialize, utoipa::ToSchema)]
struct HoldState {
    queue: String,
    paused: bool,
    /// False when the queue already was in that state.
    changed: bool,
}

/// Counts, rates and streams.
#[utoipa::path(
    get,
    path = "/api/admin/queues",
    tag = "admin",
    security(("admin" = [])),
    responses(
        (status = 200, description = "The overview.", body = Overview),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn queues(_: AdminAuth, State(state): State<AppState>) -> Result<Json<Overview>, ApiError> {
    let mut out = Vec::new();
    for queue in &state.queue_names() {
        let stats = state.store().stats(queue).await?;
        out.push(QueueCounts {
            queue: queue.as_str().to_owned(),
            waiting: stats.waiting,
            active: stats.active,
            pass: stats.pass,
            paused: stats.paused,
            observed_admissions_per_second: state.hub().observed_rate(queue),
            streams_on_this_instance: state.hub().registered(queue),
            policy: PolicyView::of(&state.policy(queue)),
        });
    }
    Ok(Json(Overview {
        queues: out,
        policy: PolicyView::of(&state.catalog().defaults().policy()),
        streams_open: state.hub().open_streams(),
        max_streams: state.max_streams(),
    }))
}

impl PolicyView {
    fn of(policy: &crate::queue::Policy) -> Self {
        Self {
            admission_batch: policy.batch,
            admission_interval_ms: policy.interval_ms,
            token_ttl_seconds: policy.token_ttl_ms / 1000,
            max_active: policy.max_active,
            abandon_after_seconds: policy.abandon_after_ms.map(|m| m / 1000),
        }
    }
}

/// Holds admission on every instance (buyers keep places and streams).
#[utoipa::path(
    post,
    path = "/api/admin/queues/{queue}/pause",
    tag = "admin",
    security(("admin" = [])),
    params(("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name.")),
    responses(
        (status = 200, description = "Held.", body = HoldState),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn pause(
    _: AdminAuth,
    state: State<AppState>,
    queue: Queue,
) -> Result<Json<HoldState>, ApiError> {
    set_paused(state, queue, true).await
}

/// Resumes admission on every instance.
#[utoipa::path(
    post,
    path = "/api/admin/queues/{queue}/resume",
    tag = "admin",
    security(("admin" = [])),
    params(("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name.")),
    responses(
        (status = 200, description = "Resumed.", body = HoldState),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn resume(
    _: AdminAuth,
    state: State<AppState>,
    queue: Queue,
) -> Result<Json<HoldState>, ApiError> {
    set_paused(state, queue, false).await
}

/// Holds or resumes admission for every instance at once (the flag lives in
/// the store); buyers keep their places and their streams.
async fn set_paused(
    State(state): State<AppState>,
    Queue(queue): Queue,
    paused: bool,
) -> Result<Json<HoldState>, ApiError> {
    let changed = state.store().set_paused(&queue, paused).await?;
    tracing::info!(%queue, paused, changed, "admission hold changed by an operator");
    Ok(Json(HoldState {
        queue: queue.as_str().to_owned(),
        paused,
        changed,
    }))
}

/// A product to add or update.
#[cfg(feature = "demo-orders")]
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProductBody {
    /// Shown to buyers: 1-200 characters of printable text (no control or
    /// direction-override characters).
    name: String,
    /// A configured queue: its entry tokens buy the product.
    queue: String,
    /// 0-1,000,000,000.
    #[schema(minimum = 0, maximum = 1_000_000_000)]
    price_cents: i64,
    /// 0-1,000,000,000.
    #[schema(minimum = 0, maximum = 1_000_000_000)]
    stock: i64,
    /// The most one order may buy (1-1,000,000,000); absent keeps the
    /// current cap (a new product gets the default).
    max_per_order: Option<i64>,
}

/// The largest `maxPerOrder` accepted (the order API's own quantity cap).
#[cfg(feature = "demo-orders")]
const MAX_PER_ORDER_LIMIT: i64 = 1_000_000_000;

/// The largest stock accepted: far beyond any sale, far below where a sum
/// of stock could overflow.
#[cfg(feature = "demo-orders")]
const MAX_STOCK: i64 = 1_000_000_000;

/// The largest price accepted, in cents (10 million in the currency's
/// units): a typo of a few digits is refused, not sold.
#[cfg(feature = "demo-orders")]
const MAX_PRICE_CENTS: i64 = 1_000_000_000;

/// The longest product id and name, in characters (not bytes).
#[cfg(feature = "demo-orders")]
const MAX_ID_CHARS: usize = 64;
#[cfg(feature = "demo-orders")]
const MAX_NAME_CHARS: usize = 200;

/// Checks a product before anything is written: `400 invalid_product`,
/// naming the field. The id lands in URLs and logs, so it is a plain
/// token (`A-Z a-z 0-9 _ . -`); the name is shown to buyers, so it is
/// printable text: no control characters (NUL, newlines, escapes) and no
/// bidirectional overrides or isolates, which make a page show text other
/// than what is stored.
#[cfg(feature = "demo-orders")]
fn check_product(id: &str, body: &ProductBody) -> Result<(), ApiError> {
    let bad = |message: String| Err(ApiError::bad_request(ErrorCode::InvalidProduct, message));
    let id_chars = id.chars().count();
    if !(1..=MAX_ID_CHARS).contains(&id_chars)
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return bad(format!(
            "id: 1-{MAX_ID_CHARS} of A-Z a-z 0-9 _ . - (no slashes, spaces or control characters)"
        ));
    }
    let name_chars = body.name.chars().count();
    if !(1..=MAX_NAME_CHARS).contains(&name_chars) || body.name.trim().is_empty() {
        return bad(format!("name: 1-{MAX_NAME_CHARS} characters, not blank"));
    }
    if let Some(c) = body.name.chars().find(|&c| !printable(c)) {
        return bad(format!(
            "name: printable text only (U+{:04X} is a control or direction-override character)",
            u32::from(c)
        ));
    }
    if !(0..=MAX_PRICE_CENTS).contains(&body.price_cents) {
        return bad(format!("priceCents: 0-{MAX_PRICE_CENTS}"));
    }
    if !(0..=MAX_STOCK).contains(&body.stock) {
        return bad(format!("stock: 0-{MAX_STOCK}"));
    }
    if body
        .max_per_order
        .is_some_and(|m| !(1..=MAX_PER_ORDER_LIMIT).contains(&m))
    {
        return bad(format!("maxPerOrder: 1-{MAX_PER_ORDER_LIMIT}"));
    }
    Ok(())
}

/// Text a buyer's page can show as it is stored: no control characters
/// (C0, DEL, C1: NUL, newlines, terminal escapes), no bidirectional
/// embeddings, overrides, isolates or marks, no line or paragraph
/// separators, no byte-order mark.
#[cfg(feature = "demo-orders")]
fn printable(c: char) -> bool {
    !c.is_control()
        && !matches!(
            c,
            '\u{200E}' | '\u{200F}' | '\u{061C}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}' | '\u{2029}' | '\u{FEFF}'
        )
}

/// Every demo product with its stock (the console's restock control).
#[cfg(feature = "demo-orders")]
#[utoipa::path(
    get,
    path = "/api/admin/products",
    tag = "admin",
    security(("admin" = [])),
    responses(
        (status = 200, description = "The products.", body = [Product]),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`orders_disabled`.", body = ErrorBody),
        (status = 503, description = "`database_unavailable`.", body = ErrorBody),
    )
)]
async fn list_products(
    _: AdminAuth,
    State(state): State<AppState>,
) -> Result<Json<Vec<Product>>, ApiError> {
    let orders = state.orders().ok_or_else(|| {
        ApiError::not_found(ErrorCode::OrdersDisabled, "the demo order service is off")
    })?;
    orders.products().await.map(Json).map_err(ApiError::from)
}

/// Adds, restocks or caps a demo product.
#[cfg(feature = "demo-orders")]
#[utoipa::path(
    put,
    path = "/api/admin/products/{id}",
    tag = "admin",
    security(("admin" = [])),
    params(("id" = String, Path, pattern = r"^[A-Za-z0-9_.-]{1,64}$", description = "The product's id (1-64 of `A-Z a-z 0-9 _ . -`).")),
    request_body = ProductBody,
    responses(
        (status = 200, description = "The product as stored.", body = Product),
        (status = 400, description = "`invalid_product`, `unknown_queue`, `invalid_body`.", body = ErrorBody),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`orders_disabled`.", body = ErrorBody),
        (status = 408, description = "`request_timeout`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 503, description = "`database_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn put_product(
    _: AdminAuth,
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ProductBody>,
) -> Result<Json<Product>, ApiError> {
    let orders = state.orders().ok_or_else(|| {
        ApiError::not_found(ErrorCode::OrdersDisabled, "the demo order service is off")
    })?;
    let queue_ok = QueueName::parse(&body.queue).is_ok_and(|q| state.has_queue(&q));
    if !queue_ok {
        return Err(ApiError::bad_request(
            ErrorCode::UnknownQueue,
            "the product's queue is not configured",
        ));
    }
    check_product(&id, &body)?;
    let update = ProductUpdate {
        id,
        name: body.name,
        queue: body.queue,
        price_cents: body.price_cents,
        stock: body.stock,
        max_per_order: body.max_per_order,
    };
    let product = orders.upsert_product(&update).await?;
    super::stock::report_demo_stock(&state, &product.queue).await;
    Ok(Json(product))
}

#[cfg(all(test, feature = "demo-orders"))]
mod tests {
    use super::*;

    fn body(name: &str, price_cents: i64, stock: i64, max: Option<i64>) -> ProductBody {
        ProductBody {
            name: name.to_owned(),
            queue: "default".to_owned(),
            price_cents,
            stock,
            max_per_order: max,
        }
    }

    /// The message names the field that is wrong.
    fn refused(id: &str, b: &ProductBody) -> String {
        match check_product(id, b) {
            Err(ApiError::BadRequest { code, message }) => {
                assert_eq!(code, ErrorCode::InvalidProduct);
                message
            }
            other => panic!("{id:?} accepted or other error: {other:?}"),
        }
    }

    #[test]
    fn products_are_plain_ids_printable_names_and_sane_numbers() {
        let ok = body("Limited sneaker — édition 限定", 12_900, 1000, Some(10));
        check_product("demo-sneaker_2.v1", &ok).unwrap();
        check_product(&"x".repeat(64), &ok).unwrap();
        check_product("p", &body(&"é".repeat(200), 0, 0, None)).unwrap();
        for id in [
            "",
            "a/b",
            "a\nb",
            "a b",
            "a\0b",
            "ünï",
            &"x".repeat(65),
            "..%2F",
        ] {
            assert!(refused(id, &ok).starts_with("id:"), "{id:?}");
        }
        for name in [
            "",
            "   ",
            "nul\0byte",
            "new\nline",
            "esc\u{1b}[31m",
            "del\u{7f}",
            "c1\u{85}",
            "rtl \u{202E}gnp.exe",
            "isolate \u{2066}x\u{2069}",
            "mark \u{200F}",
            "bom\u{FEFF}",
            &"n".repeat(201),
            &"é".repeat(201),
        ] {
            assert!(
                refused("p", &body(name, 1, 1, None)).starts_with("name:"),
                "{name:?}"
            );
        }
        assert!(refused("p", &body("n", -1, 1, None)).starts_with("priceCents:"));
        assert!(refused("p", &body("n", i64::MAX, 1, None)).starts_with("priceCents:"));
        assert!(refused("p", &body("n", 1, -1, None)).starts_with("stock:"));
        assert!(refused("p", &body("n", 1, i64::MAX, None)).starts_with("stock:"));
        assert!(refused("p", &body("n", 1, 1, Some(0))).starts_with("maxPerOrder:"));
        assert!(refused("p", &body("n", 1, 1, Some(i64::MAX))).starts_with("maxPerOrder:"));
        check_product(
            "p",
            &body("n", MAX_PRICE_CENTS, MAX_STOCK, Some(MAX_PER_ORDER_LIMIT)),
        )
        .unwrap();
    }
}
