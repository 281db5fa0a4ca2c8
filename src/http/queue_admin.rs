//! The admin API of a queue's live settings: open a queue, read and change
//! its rate, batch, `maxActive`, TTLs, hold and page texts, delete it.
//!
//! Settings live in the store, so a change made on one instance governs
//! the next admission pass of every instance and reaches every instance's
//! catalog within about a second (see `crate::catalog`). A request is
//! checked whole before anything is written: a bad one changes nothing.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Deserializer, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::AdminAuth;
use super::extract::JsonBody;
use crate::error::ErrorCode;
use crate::error::{ApiError, ErrorBody};
use crate::queue::{AdaptiveSettings, QueueName, QueueSettings, StoredSettings};
use crate::store::AdaptiveState;

/// `/api/admin/queues/{queue}`: `GET`, `PUT`, `DELETE`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_queue, put_queue, delete_queue))
}

/// A queue's settings, its version and its hold.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueView {
    queue: String,
    #[serde(flatten)]
    settings: StoredSettings,
    /// Admission held by an operator.
    paused: bool,
    /// Adaptive admission's last decision (rate, p95, samples, verdict),
    /// while its settings are present and a decision was stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    adaptive_state: Option<AdaptiveState>,
}

/// Changes to a queue's adaptive admission: absent fields keep their value
/// (from the recommended values when it had none).
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdaptiveChange {
    /// On or off (off keeps the batch where it is).
    enabled: Option<bool>,
    /// Lowest rate, admissions per second (at least one per pass).
    floor_per_sec: Option<f64>,
    /// Highest rate, admissions per second (floor-100,000).
    ceiling_per_sec: Option<f64>,
    /// The p95 claim-to-commit time to keep under, ms (1-600,000).
    target_p95_ms: Option<u64>,
    /// Added per healthy window, per second.
    step_per_sec: Option<f64>,
    /// Multiplier after an unhealthy window (between 0 and 1).
    factor: Option<f64>,
    /// One window, ms (100-600,000).
    window_ms: Option<u64>,
    /// Fewest orders in a window to decide on (1-1,000,000).
    min_samples: Option<u64>,
    /// Largest share of rollbacks still healthy (0-1).
    max_failure_ratio: Option<f64>,
    /// Windows without an increase after a cut (0-100).
    hold_windows: Option<u64>,
}

impl AdaptiveChange {
    fn apply(self, base: Option<AdaptiveSettings>) -> AdaptiveSettings {
        let mut a = base.unwrap_or_else(AdaptiveSettings::recommended);
        a.enabled = self.enabled.unwrap_or(a.enabled);
        a.floor_per_sec = self.floor_per_sec.unwrap_or(a.floor_per_sec);
        a.ceiling_per_sec = self.ceiling_per_sec.unwrap_or(a.ceiling_per_sec);
        a.target_p95_ms = self.target_p95_ms.unwrap_or(a.target_p95_ms);
        a.step_per_sec = self.step_per_sec.unwrap_or(a.step_per_sec);
        a.factor = self.factor.unwrap_or(a.factor);
        a.window_ms = self.window_ms.unwrap_or(a.window_ms);
        a.min_samples = self.min_samples.unwrap_or(a.min_samples);
        a.max_failure_ratio = self.max_failure_ratio.unwrap_or(a.max_failure_ratio);
        a.hold_windows = self.hold_windows.unwrap_or(a.hold_windows);
        a
    }
}

/// Changes to a queue's settings: absent fields keep their value (a new
/// queue starts from the start-up flags). Unknown fields are refused.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SettingsChange {
    /// Users admitted per interval (1-100,000).
    batch: Option<u32>,
    /// Milliseconds between passes (1-3,600,000).
    interval_ms: Option<u64>,
    /// Entry token lifetime, ms (1,000-86,400,000).
    token_ttl_ms: Option<u64>,
    /// Most token holders (0-100,000,000); `null` is unlimited.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>)]
    max_active: Option<Option<u64>>,
    /// Drop waiting users unseen this long, ms (1,000-86,400,000); `null` never.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>)]
    abandon_after_ms: Option<Option<u64>>,
    /// An order's claim lease, ms (1,000-86,400,000).
    claim_lease_ms: Option<u64>,
    /// Page texts (replaces them all): at most 64 keys of `A-Z a-z 0-9 _ . -`,
    /// each text at most 2,000 characters without control characters.
    texts: Option<BTreeMap<String, String>>,
    /// Where a READY buyer is sent to buy, when the order service lives
    /// elsewhere: an absolute `https://` URL, at most 2,000 characters,
    /// whose `{token}` and `{queue}` the page fills in (URL-encoded);
    /// `null` removes it (`--shop-url` applies again).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, example = "https://shop.example/buy#token={token}")]
    shop_url: Option<Option<String>>,
    /// Hold (`true`) or resume (`false`) admission.
    paused: Option<bool>,
    /// Adaptive admission (the rate follows the order service); `null`
    /// removes it (the batch stays where it is).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<AdaptiveChange>)]
    adaptive: Option<Option<AdaptiveChange>>,
}

/// A field that may be `null`: present-and-null is `Some(None)`, absent is
/// `None` (via `#[serde(default)]`).
fn present<'de, D, T>(de: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(de).map(Some)
}

impl SettingsChange {
    fn apply(self, mut s: QueueSettings) -> QueueSettings {
        s.batch = self.batch.unwrap_or(s.batch);
        s.interval_ms = self.interval_ms.unwrap_or(s.interval_ms);
        s.token_ttl_ms = self.token_ttl_ms.unwrap_or(s.token_ttl_ms);
        s.max_active = self.max_active.unwrap_or(s.max_active);
        s.abandon_after_ms = self.abandon_after_ms.unwrap_or(s.abandon_after_ms);
        s.claim_lease_ms = self.claim_lease_ms.unwrap_or(s.claim_lease_ms);
        if let Some(texts) = self.texts {
            s.texts = texts;
        }
        if let Some(url) = self.shop_url {
            s.shop_url = url;
        }
        match self.adaptive {
            Some(Some(change)) => s.adaptive = Some(change.apply(s.adaptive.take())),
            Some(None) => s.adaptive = None,
            None => {}
        }
        s
    }
}

/// The answer to a delete.
#[derive(Serialize, utoipa::ToSchema)]
struct Deleted {
    queue: String,
    deleted: bool,
}

const QUEUE_PARAM: &str = "The queue's name (1-64 of `a-z 0-9 _ -`).";

/// A queue's settings, as the store holds them.
#[utoipa::path(
    get,
    path = "/api/admin/queues/{queue}",
    tag = "admin",
    security(("admin" = [])),
    params(("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", description = QUEUE_PARAM)),
    responses(
        (status = 200, description = "The settings.", body = QueueView),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`.", body = ErrorBody),
    )
)]
async fn get_queue(
    _: AdminAuth,
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Json<QueueView>, ApiError> {
    let queue = QueueName::parse(&raw).map_err(|_| unknown_queue())?;
    let settings = state
        .store()
        .queue_settings(&queue)
        .await?
        .ok_or_else(unknown_queue)?;
    let paused = state.store().stats(&queue).await?.paused;
    let adaptive_state = adaptive_state(&state, &queue, &settings).await?;
    Ok(Json(QueueView {
        queue: queue.as_str().to_owned(),
        settings,
        paused,
        adaptive_state,
    }))
}

/// Opens a queue or changes its settings; every instance follows.
#[utoipa::path(
    put,
    path = "/api/admin/queues/{queue}",
    tag = "admin",
    security(("admin" = [])),
    params(("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", description = QUEUE_PARAM)),
    request_body = SettingsChange,
    responses(
        (status = 200, description = "Changed.", body = QueueView),
        (status = 201, description = "Opened.", body = QueueView),
        (status = 400, description = "`invalid_queue_name`, `invalid_settings`, `invalid_body`.", body = ErrorBody),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 408, description = "`request_timeout`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`.", body = ErrorBody),
    )
)]
async fn put_queue(
    _: AdminAuth,
    State(state): State<AppState>,
    Path(raw): Path<String>,
    JsonBody(change): JsonBody<SettingsChange>,
) -> Result<(StatusCode, Json<QueueView>), ApiError> {
    let queue = QueueName::parse(&raw)
        .map_err(|e| ApiError::bad_request(ErrorCode::InvalidQueueName, e.0))?;
    let existing = state.store().queue_settings(&queue).await?;
    let created = existing.is_none();
    let base = existing.map_or_else(|| state.catalog().defaults().clone(), |s| s.settings);
    let paused = change.paused;
    let settings = change.apply(base);
    settings
        .validate()
        .map_err(|m| ApiError::bad_request(ErrorCode::InvalidSettings, m))?;
    // The hold first: a queue opened held admits nobody, not even once.
    if let Some(paused) = paused {
        state.store().set_paused(&queue, paused).await?;
    }
    let (stored, _) = state
        .store()
        .put_queue_settings(&queue, &settings, false)
        .await?;
    state.catalog().apply(&queue, Some(stored.clone()));
    let paused = state.store().stats(&queue).await?.paused;
    tracing::info!(%queue, version = stored.version, created, "queue settings changed by an operator");
    metrics::counter!("waitroom_settings_changes_total", "queue" => queue.to_string()).increment(1);
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(QueueView {
            queue: queue.as_str().to_owned(),
            adaptive_state: adaptive_state(&state, &queue, &stored).await?,
            settings: stored,
            paused,
        }),
    ))
}

/// Deletes a queue opened through this API (not one named in `--queues`,
/// which instances re-create): its line, budget, hold and settings
/// (tokens already issued live out their TTL). Every instance stops serving it
/// within about a second: `404 unknown_queue`, and open streams end with
/// `gone: notEntered`.
#[utoipa::path(
    delete,
    path = "/api/admin/queues/{queue}",
    tag = "admin",
    security(("admin" = [])),
    params(("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", description = QUEUE_PARAM)),
    responses(
        (status = 200, description = "Deleted.", body = Deleted),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 409, description = "`configured_queue`: named in `--queues`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`.", body = ErrorBody),
    )
)]
async fn delete_queue(
    _: AdminAuth,
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Json<Deleted>, ApiError> {
    let queue = QueueName::parse(&raw).map_err(|_| unknown_queue())?;
    if state.catalog().is_seed(&queue) {
        return Err(ApiError::conflict(
            ErrorCode::ConfiguredQueue,
            "the queue is named in --queues, which re-creates it: take it out of the flags first",
        ));
    }
    // Asked of the store, not of this instance's catalog: a queue opened
    // on another instance a moment ago can be deleted here at once.
    let deleted = state.store().delete_queue(&queue).await?;
    state.catalog().apply(&queue, None);
    if !deleted {
        return Err(unknown_queue());
    }
    tracing::info!(%queue, deleted, "queue deleted by an operator");
    Ok(Json(Deleted {
        queue: queue.as_str().to_owned(),
        deleted,
    }))
}

/// The last adaptive decision of `queue`, if it has adaptive settings.
async fn adaptive_state(
    state: &AppState,
    queue: &QueueName,
    settings: &StoredSettings,
) -> Result<Option<AdaptiveState>, ApiError> {
    let Some(adaptive) = &settings.settings.adaptive else {
        return Ok(None);
    };
    let read = state
        .store()
        .adaptive_read(queue, adaptive.window_ms)
        .await?;
    Ok(read.state)
}

fn unknown_queue() -> ApiError {
    ApiError::not_found(ErrorCode::UnknownQueue, "no such queue")
}
