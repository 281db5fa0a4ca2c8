//! The operator console: the page at `/admin` (`static/admin/`, embedded)
//! and its live feed, `GET /api/admin/events`, on the operator listener
//! only.
//!
//! The page asks for the admin token once and keeps it in the tab's
//! `sessionStorage`; it never goes into a URL (where it would reach logs
//! and histories). So the feed is read with `fetch()` and an
//! `Authorization` header rather than `EventSource`, which cannot send
//! one. The page itself needs no token: it is only files, the same for
//! everyone, and shows nothing until the API accepts the token.
//!
//! The feed sends one `snapshot` event a second: every queue's counts and
//! settings from the store, the admissions observed on either path (passes
//! and the fast track), what admission does now and why (held, a lottery's
//! pre-queue, stock, `maxActive`), this instance's streams, and the
//! instance's counters of orders, released tokens and errors (read from its
//! own metrics, so the console and `/metrics` never disagree).

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use rust_embed::RustEmbed;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::AdminAuth;
use crate::error::ErrorCode;
use crate::error::{ApiError, ErrorBody};
use crate::queue::StoredSettings;

#[derive(RustEmbed)]
#[folder = "static/admin/"]
struct ConsoleAssets;

/// How often the feed sends a snapshot.
const EVERY: Duration = Duration::from_secs(1);

/// `/api/admin/events` (documented) and the page's files (not).
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(events))
        .route("/admin", axum::routing::get(page))
        .route("/admin/", axum::routing::get(page))
        .route("/admin/{file}", axum::routing::get(page))
}

/// The console's files: `/admin` is its `index.html`.
async fn page(uri: Uri) -> Response {
    let path = uri.path().strip_prefix("/admin").unwrap_or_default();
    let path = path.strip_prefix('/').unwrap_or(path);
    let path = if path.is_empty() { "index.html" } else { path };
    match ConsoleAssets::get(path) {
        Some(file) => {
            let mime = mime_guess::from_path(path).first_or_octet_stream();
            let mut response = file.data.into_response();
            let headers = response.headers_mut();
            if let Ok(value) = HeaderValue::from_str(mime.as_ref()) {
                headers.insert(header::CONTENT_TYPE, value);
            }
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            response
        }
        None => ApiError::not_found(ErrorCode::NotFound, "no such resource").into_response(),
    }
}

/// One snapshot of the feed.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsoleSnapshot {
    /// Wall clock of this instance, ms since the epoch.
    at: u64,
    queues: Vec<QueueLive>,
    /// This instance's name, as in `instances`.
    instance: String,
    /// Streams open on this instance, and its cap.
    streams_open: usize,
    max_streams: usize,
    /// Every live instance's open streams, as they reported them (`null`
    /// while the store is away).
    instances: Option<Vec<InstanceStreams>>,
    /// This instance's counters since it started.
    orders_committed: u64,
    tokens_released: u64,
    errors: u64,
}

/// One instance's open streams.
#[derive(Serialize, utoipa::ToSchema)]
pub struct InstanceStreams {
    instance: String,
    streams: u64,
}

/// One queue, live.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueLive {
    queue: String,
    /// `null` when the store did not answer for this queue.
    waiting: Option<u64>,
    /// Token holders.
    active: Option<u64>,
    paused: Option<bool>,
    /// What admission does now, the first that applies: `storeAway`,
    /// `held` (an operator holds it), `preQueue` (a lottery's draw is
    /// ahead: joins wait in its pre-queue), `soldOut`, `stockBlocked`
    /// (units are left but every one may go to a token holder), `full`
    /// (`maxActive` holders), else `admitting`.
    #[schema(example = "admitting")]
    state: &'static str,
    /// Admissions per second over the last half minute, by passes and on
    /// the fast track (every instance's); 0 when nobody was admitted.
    observed_rate: f64,
    /// Users admitted that this instance heard of since it started, on
    /// either path (every instance's): the page charts per-minute
    /// differences.
    admitted_seen: u64,
    /// `admittedSeen` by path.
    admitted_by_path: AdmittedByPath,
    /// Seconds the last in line can expect to wait at the observed rate
    /// (`null`: nobody waits, nobody can be admitted now (`state` held,
    /// sold out, stock blocked, store away), or nobody was admitted in the
    /// last half minute).
    wait_for_last_secs: Option<u64>,
    /// The stock admission follows (`null`: none reported, or the store
    /// did not answer).
    stock: Option<StockLive>,
    /// The queue's scheduled opening (`null`: none).
    lottery: Option<LotteryLive>,
    /// Orders committed through this queue's tokens on this instance
    /// since it started (the Rust extractor and the token API alike).
    orders_committed: u64,
    /// Tokens returned to READY after a rollback, likewise.
    tokens_released: u64,
    streams_on_this_instance: usize,
    settings: StoredSettings,
}

/// Admissions by the path they took.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmittedByPath {
    /// By admission passes.
    pass: u64,
    /// On the fast track of a join into an empty line.
    fast_track: u64,
}

/// A queue's stock, in units and in buyers.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StockLive {
    /// Units left, as last reported.
    remaining: u64,
    /// The most one buyer may take.
    max_per_buyer: u64,
    /// Buyers the units left can serve: `ceil(remaining / maxPerBuyer)`.
    buyers_served: u64,
    /// Buyers holding a token (each may still take `maxPerBuyer`).
    holders: u64,
    /// Tokens used for orders since the last report.
    consumed_since_report: u64,
    /// Buyers admission may still admit: 0 blocks it.
    admissible: u64,
    sold_out: bool,
}

/// A queue's scheduled opening.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LotteryLive {
    /// `scheduled` until the draw, then `drawn`.
    state: &'static str,
    /// When the draw places the pre-queue in line, ms since the epoch.
    opens_at: u64,
    /// Buyers in the pre-queue (once drawn: placed in line by the draw).
    entries: u64,
}

/// The live feed of the console: a `snapshot` event every second.
#[utoipa::path(
    get,
    path = "/api/admin/events",
    tag = "admin",
    security(("admin" = [])),
    responses(
        (status = 200, description = "`text/event-stream` of `snapshot` events.", body = ConsoleSnapshot, content_type = "text/event-stream"),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
    )
)]
async fn events(_: AdminAuth, State(state): State<AppState>) -> Response {
    let shutdown = state.shutdown().clone();
    let frames = futures::stream::unfold((state, true), |(state, first)| async move {
        if !first {
            tokio::time::sleep(EVERY).await;
        }
        let snapshot = snapshot(&state).await;
        let json = serde_json::to_string(&snapshot).unwrap_or_else(|_| "{}".to_owned());
        let frame = Bytes::from(format!("event: snapshot\ndata: {json}\n\n"));
        Some((Ok::<_, Infallible>(frame), (state, false)))
    });
    let frames = futures::StreamExt::take_until(frames, shutdown.cancelled_owned());
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(frames),
    )
        .into_response()
}

async fn snapshot(state: &AppState) -> ConsoleSnapshot {
    let metrics = crate::telemetry::render();
    let mut queues = Vec::new();
    for (queue, settings) in state.catalog().current().iter() {
        let store = state.store();
        let stats = store.stats(queue).await.ok();
        let stock = store.stock(queue).await.ok().flatten();
        let lottery = store.lottery(queue).await.ok().flatten();
        let rate = state.hub().observed_rate(queue);
        let paused = stats.as_ref().map(|s| s.paused);
        let waiting = stats.as_ref().map(|s| s.waiting);
        let admission = admission_state(stats.as_ref(), stock.as_ref(), lottery.as_ref(), settings);
        // At the rate admissions were observed, on either path; none while
        // nobody can be admitted (held, or the stock lets nobody more in)
        // whatever the rate was a moment ago.
        let stopped = matches!(admission, "storeAway" | "held" | "soldOut" | "stockBlocked");
        let forecast = crate::queue::Forecast::at_rate(rate).with_held(stopped);
        let (pass, fast_track) = state.hub().admitted_seen(queue);
        let labelled = |name| sum_of_queue(&metrics, name, queue.as_str());
        queues.push(QueueLive {
            queue: queue.as_str().to_owned(),
            waiting,
            active: stats.as_ref().map(|s| s.active),
            paused,
            state: admission,
            observed_rate: rate,
            admitted_seen: pass + fast_track,
            admitted_by_path: AdmittedByPath { pass, fast_track },
            wait_for_last_secs: waiting
                .filter(|w| *w > 0)
                .and_then(|w| forecast.wait_secs(w - 1)),
            stock: stock.map(|s| StockLive {
                remaining: s.remaining,
                max_per_buyer: s.per_buyer,
                buyers_served: s.remaining.div_ceil(s.per_buyer.max(1)),
                holders: s.holders,
                consumed_since_report: s.consumed_since_report,
                admissible: s.admissible,
                sold_out: s.sold_out,
            }),
            lottery: lottery.map(|l| LotteryLive {
                state: if l.drawn { "drawn" } else { "scheduled" },
                opens_at: l.opens_at,
                entries: l.entries,
            }),
            orders_committed: labelled("waitroom_tokens_consumed_total"),
            tokens_released: labelled("waitroom_tokens_released_total"),
            streams_on_this_instance: state.hub().registered(queue),
            settings: settings.clone(),
        });
    }
    let streams_open = state.hub().open_streams();
    let instances = state
        .store()
        .report_streams(
            state.instance(),
            streams_open as u64,
            crate::push::STREAMS_REPORT_TTL.as_millis() as u64,
        )
        .await
        .ok()
        .map(|all| {
            all.into_iter()
                .map(|(instance, streams)| InstanceStreams { instance, streams })
                .collect()
        });
    ConsoleSnapshot {
        at: crate::clock::now_ms(),
        queues,
        instance: state.instance().to_owned(),
        streams_open,
        instances,
        max_streams: state.max_streams(),
        orders_committed: sum(&metrics, "waitroom_tokens_consumed_total"),
        tokens_released: sum(&metrics, "waitroom_tokens_released_total"),
        errors: sum(&metrics, "waitroom_http_errors_total")
            + sum(&metrics, "waitroom_admission_errors_total"),
    }
}

/// What admission does now, and so why nobody may be let in: see
/// [`QueueLive::state`].
fn admission_state(
    stats: Option<&crate::store::QueueStats>,
    stock: Option<&crate::store::StockState>,
    lottery: Option<&crate::store::LotteryState>,
    settings: &StoredSettings,
) -> &'static str {
    let Some(stats) = stats else {
        return "storeAway";
    };
    if stats.paused {
        "held"
    } else if lottery.is_some_and(|l| !l.drawn) {
        "preQueue"
    } else if stock.is_some_and(|s| s.sold_out) {
        "soldOut"
    } else if stock.is_some_and(|s| s.admissible == 0) {
        "stockBlocked"
    } else if settings
        .settings
        .max_active
        .is_some_and(|max| stats.active >= max)
    {
        "full"
    } else {
        "admitting"
    }
}

/// The sum of the series of the counter `name` labelled `queue="<queue>"`.
fn sum_of_queue(text: &str, name: &str, queue: &str) -> u64 {
    let wanted = format!("queue=\"{queue}\"");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, labels) = series.split_once('{')?;
            let labels = labels.strip_suffix('}')?;
            (metric == name && labels.split(',').any(|kv| kv == wanted))
                .then(|| value.parse::<f64>().ok())?
        })
        .sum::<f64>() as u64
}

/// The sum of every series of the counter `name` in Prometheus' text.
fn sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name).then(|| value.parse::<f64>().ok())?
        })
        .sum::<f64>() as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn counters_are_summed_over_their_series_only() {
        let text = "# TYPE a counter\na{queue=\"x\"} 2\na{queue=\"y\"} 3\nab 100\na 1\n";
        assert_eq!(super::sum(text, "a"), 6);
        assert_eq!(super::sum(text, "ab"), 100);
        assert_eq!(super::sum(text, "none"), 0);
    }

    #[test]
    fn a_queue_s_series_are_summed_by_its_label_only() {
        let text = "a{queue=\"x\"} 2\na{path=\"p\",queue=\"x\"} 3\na{queue=\"xy\"} 100\nb{queue=\"x\"} 7\n";
        assert_eq!(super::sum_of_queue(text, "a", "x"), 5);
        assert_eq!(super::sum_of_queue(text, "a", "xy"), 100);
        assert_eq!(super::sum_of_queue(text, "a", "z"), 0);
    }
}
