//! The `waitroom` binary: load the configuration (defaults < file <
//! environment < flags), set up logging, serve until SIGINT or SIGTERM.
//!
//! `waitroom init` prints a commented configuration file, `waitroom check`
//! validates one and prints each value with its source, and `waitroom
//! config-doc` prints docs/configuration.md. Anything else is served as
//! it always was: `waitroom [-c FILE] [FLAGS]`.

#![forbid(unsafe_code)]

use std::ffi::OsString;

use waitroom::config;

// jemalloc rather than the C library's allocator: a buyer's request
// allocates and frees many small blocks across threads, where glibc's
// spent a sixth of the server's CPU, and an open stream's memory stays
// smaller (docs/benchmarks/server-cpu-20261203T1330Z.md: CPU per poll
// 0.85x, RSS per open stream 0.75x).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
            waitroom::run_until_signal(loaded.config)?;
        }
    }
    Ok(())
}
