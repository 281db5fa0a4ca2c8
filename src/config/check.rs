//! `waitroom check`: the effective configuration, each value with where it
//! came from; secrets masked.

use std::fmt::Write;

use clap::CommandFactory;

use super::keys::{self, KEYS};
use super::{Config, Loaded};

const MASK: &str = "\"********\"";

impl Loaded {
    /// The report `waitroom check` prints.
    pub fn report(&self) -> String {
        let cmd = Config::command();
        let mut out = String::new();
        match &self.sources.file {
            Some(p) => {
                let _ = writeln!(out, "# the effective configuration, with {}", p.display());
            }
            None => out.push_str("# the effective configuration (no file)\n"),
        }
        for key in KEYS {
            let arg = keys::arg(&cmd, key.arg);
            let (raw, source) = self
                .sources
                .values
                .get(key.arg)
                .cloned()
                .unwrap_or_else(|| (Vec::new(), super::Source::Unset));
            let value = if raw.is_empty() {
                "(unset)".to_owned()
            } else if keys::is_secret(key.arg) {
                MASK.to_owned()
            } else {
                keys::toml_literal(arg, &raw)
            };
            let _ = writeln!(out, "{} = {value}  (source: {source})", key.file);
        }
        let seeds = self.config.seed_settings().unwrap_or_default();
        for (name, s) in seeds {
            let source = match (
                self.sources.queue_lines.get(name.as_str()),
                &self.sources.file,
            ) {
                (Some(line), Some(path)) => format!("file:{}:{line}", path.display()),
                _ => "admission".to_owned(),
            };
            let _ = writeln!(
                out,
                "queues.{name}: batch = {}, interval_ms = {}, token_ttl_secs = {}, max_active = {}, \
                 abandon_after_secs = {}, claim_lease_secs = {}, adaptive = {}, shop_url = {}  \
                 (source: {source}; seeds the queue only if the store does not know it)",
                s.batch,
                s.interval_ms,
                s.token_ttl_ms / 1000,
                s.max_active.map_or("unlimited".into(), |m| m.to_string()),
                s.abandon_after_ms.map_or(0, |m| m / 1000),
                s.claim_lease_ms / 1000,
                s.adaptive.as_ref().map_or("off".into(), |a| format!(
                    "{}-{}/s, p95 {} ms",
                    a.floor_per_sec, a.ceiling_per_sec, a.target_p95_ms
                )),
                s.shop_url.as_deref().unwrap_or("-"),
            );
        }
        for (i, hook) in self.config.webhooks.iter().enumerate() {
            let line = self.sources.webhook_lines.get(i).copied().unwrap_or(0);
            let path = self.sources.file.as_ref().map(|p| p.display().to_string());
            let kinds: Vec<&str> = hook.kinds.iter().map(|k| k.as_str()).collect();
            let queues: Vec<&str> = hook.queues.iter().map(|q| q.as_str()).collect();
            let _ = writeln!(
                out,
                "webhooks[{i}]: name = {:?}, url = {:?}, secret = {MASK}, kinds = {kinds:?}, \
                 queues = {queues:?}, attempts = {}, ca = {}  (source: file:{}:{line})",
                hook.name,
                hook.url,
                hook.attempts,
                hook.ca
                    .as_ref()
                    .map_or("-".into(), |c| c.path.display().to_string()),
                path.unwrap_or_default(),
            );
        }
        out
    }
}
