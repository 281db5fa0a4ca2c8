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
