//! The `waitroom` binary: parse the configuration, set up logging, serve
//! until SIGINT or SIGTERM.

#![forbid(unsafe_code)]

use clap::{CommandFactory, Parser};

use tokio_util::sync::CancellationToken;
use waitroom::{Config, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    if let Err(message) = waitroom::features::check(&config) {
        // A usage error like clap's own: the message, exit code 2.
        Config::command()
            .error(clap::error::ErrorKind::ArgumentConflict, message)
            .exit();
    }
    telemetry::init_tracing();
    raise_open_file_limit();
    let listeners = waitroom::Listeners::bind(&config).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    waitroom::run(config, listeners, shutdown).await?;
    Ok(())
}

/// Each open event stream is a socket: use the whole hard limit.
fn raise_open_file_limit() {
    if let Ok(limit) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::debug!(limit, "open-file limit");
    }
}

async fn stop_on_signal(shutdown: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
    shutdown.cancel();
}
