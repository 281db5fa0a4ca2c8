//! The `waitroom` binary: load the configuration (defaults < file <
//! environment < flags), set up logging, serve until SIGINT or SIGTERM.
//!
//! `waitroom init` prints a commented configuration file, `waitroom check`
//! validates one and prints each value with its source, and `waitroom
//! config-doc` prints docs/configuration.md. Anything else is served as
//! it always was: `waitroom [-c FILE] [FLAGS]`.

#![forbid(unsafe_code)]

use std::ffi::OsString;

use tokio_util::sync::CancellationToken;
use waitroom::{config, telemetry};

fn main() -> anyhow::Result<()> {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match args.first().and_then(|a| a.to_str()) {
        Some("init") => print!("{}", config::init_template()),
        Some("config-doc") => print!("{}", config::configuration_doc()),
        Some("check") => match config::load(&args[1..], true) {
            Ok(loaded) => print!("{}", loaded.report()),
            Err(e) => e.exit(),
        },
        _ => {
            let loaded = config::load(args, true).unwrap_or_else(|e| e.exit());
            serve(loaded.config)?;
        }
    }
    Ok(())
}

#[tokio::main]
async fn serve(config: waitroom::Config) -> anyhow::Result<()> {
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
