//! sse-gen: the SSE (and polling) load generator and benchmark reporter
//! for waitroom. Loopback targets only; every run is bounded in users and
//! in time. See README.md beside this crate.

mod burst;
mod chart;
mod churn;
mod coord;
mod crowd;
mod http;
mod million;
mod server;
mod soak;
mod stats;
mod table;

use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};

/// Now, in ms since the Unix epoch (µs resolution).
pub fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

#[derive(Parser)]
#[command(
    name = "sse-gen",
    version,
    about = "SSE / polling load generator and benchmark reporter for waitroom (loopback only)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

// Parsed once; the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// N buyers that enter and then hold an SSE stream (or poll), and order on READY.
    Crowd(coord::CrowdArgs),
    /// A burst of enters over a fixed number of keep-alive connections.
    Burst(burst::BurstArgs),
    /// Joins until a million wait, with streams, polls and admission running.
    Million(million::MillionArgs),
    /// Draws the SVG chart of a crowd report.
    Chart(chart::ChartArgs),
    /// Builds the markdown results table from the run's reports.
    Table(table::TableArgs),
    /// A long steady run on several instances: anything that grows.
    Soak(soak::SoakArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Chart(a) => chart::run(a),
        Cmd::Table(a) => table::run(a),
        Cmd::Crowd(a) => runtime()?.block_on(coord::run(a)),
        Cmd::Burst(a) => runtime()?.block_on(burst::run(a)),
        Cmd::Million(a) => runtime()?.block_on(million::run(a)),
        Cmd::Soak(a) => runtime()?.block_on(soak::run(a)),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?)
}
