//! Logs and metrics: `tracing` to stderr (filtered by `RUST_LOG`) and one
//! process-wide Prometheus recorder rendered at `/metrics`.
//!
//! Tickets and entry tokens are never logged, at any level: they travel in
//! query strings (`?ticket=`), headers and bodies, so request spans record
//! the method and the path only.

use std::sync::OnceLock;

use axum::http::Request;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tower_http::trace::{HttpMakeClassifier, MakeSpan, TraceLayer};
use tracing::Span;

static PROMETHEUS: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder once per process (tests build many apps
/// in one process; the first install wins and the rest share it).
pub fn install_metrics() {
    PROMETHEUS.get_or_init(|| PrometheusBuilder::new().install_recorder().ok());
}

/// The metrics in Prometheus' text format.
pub fn render() -> String {
    PROMETHEUS
        .get()
        .and_then(|h| h.as_ref())
        .map(|h| h.render())
        .unwrap_or_default()
}

/// Logs to stderr at `RUST_LOG` (default `info`): a level, or
/// `target=level` pairs separated by commas (`waitroom=debug,redis=warn`).
/// That list is all `RUST_LOG` takes here: span and field filters would
/// need tracing-subscriber's `EnvFilter`, whose regular-expression engine
/// was the largest part of a minimal build that nothing else needed.
/// A value that does not parse is ignored (`info`), as before.
pub fn init_tracing() {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{Layer, fmt};

    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::INFO));
    let log = fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_filter(filter);
    let _ = tracing_subscriber::registry().with(log).try_init();
}

/// The HTTP trace layer: tower-http's, with a span that records the method
/// and the path but never the query string (where a ticket may be) nor any
/// header (where tickets and tokens are).
pub fn trace_layer() -> TraceLayer<HttpMakeClassifier, RequestSpan> {
    TraceLayer::new_for_http().make_span_with(RequestSpan)
}

/// Makes the `request` span of [`trace_layer`] (at `DEBUG`, like
/// tower-http's default): method, path and HTTP version only.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestSpan;

impl<B> MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, request: &Request<B>) -> Span {
        tracing::debug_span!(
            "request",
            method = %request.method(),
            path = %request.uri().path(),
            version = ?request.version(),
        )
    }
}
