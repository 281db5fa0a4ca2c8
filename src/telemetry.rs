//! Logs and metrics: `tracing` to stderr (filtered by `RUST_LOG`) and one
//! process-wide Prometheus recorder rendered at `/metrics`.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

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

/// Logs to stderr at `RUST_LOG` (default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .with_target(false)
        .try_init();
}
