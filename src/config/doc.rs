//! `docs/configuration.md`, generated from the flags (their doc comments,
//! environment variables and defaults) and the key table, so the reference
//! cannot drift from the code: a test compares the committed file.
//!
//! Regenerate it with `cargo run -- config-doc > docs/configuration.md`
//! (or `UPDATE_DOCS=1 cargo test --lib config::doc`).

use std::fmt::Write;

use clap::CommandFactory;

use super::Config;
use super::keys::{self, KEYS, SECTIONS};
use super::queues::QUEUE_KEYS;

fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// The whole of `docs/configuration.md`.
pub fn markdown() -> String {
    let cmd = Config::command();
    let mut out = String::new();
    out.push_str(
        "# Configuration\n\n\
         <!-- Generated from src/config/ by `cargo run -- config-doc > docs/configuration.md`; \
         a test fails when this file is stale. Do not edit by hand. -->\n\n\
         Every setting has a flag, an environment variable and a key of the configuration \
         file. Precedence: **defaults < file < environment < flags**: a file key sets what \
         no environment variable and no flag sets. Prose, sizing and recipes: \
         [configuration-reference.md](configuration-reference.md).\n\n\
         | command | does |\n|---|---|\n\
         | `waitroom [-c FILE] [FLAGS]` | serves (`-c`/`--config`/`WAITROOM_CONFIG`: the file) |\n\
         | `waitroom init > waitroom.toml` | prints a commented file: every key at its default, fresh secrets |\n\
         | `waitroom check [-c FILE] [FLAGS]` | validates like a start and prints each effective value and its source (secrets masked) |\n\
         | `waitroom config-doc` | prints this page |\n\n\
         A value that cannot be used stops the process with exit code 2 and one line naming \
         the key and its source (`file:<path>:<line>`, `env WAITROOM_…`, `flag --…` or \
         `default`). An unknown section or key in the file is refused the same way.\n",
    );
    for section in SECTIONS {
        let _ = write!(
            out,
            "\n## `[{}]`\n\n{} Configures `{}`.\n\n| key | flag | env | default | meaning |\n|---|---|---|---|---|\n",
            section.name, section.about, section.owner
        );
        for key in KEYS
            .iter()
            .filter(|k| keys::section_of(k.file).name == section.name)
        {
            let arg = keys::arg(&cmd, key.arg);
            let default = keys::default_raw(arg);
            let default = if default.is_empty() {
                "unset".to_owned()
            } else {
                format!("`{}`", keys::toml_literal(arg, &default))
            };
            let env = arg
                .get_env()
                .map_or_else(String::new, |e| format!("`{}`", e.to_string_lossy()));
            let _ = writeln!(
                out,
                "| `{}` | `--{}` | {env} | {default} | {} |",
                keys::short_name(key),
                arg.get_long().unwrap_or_default(),
                cell(&keys::help_text(arg))
            );
        }
    }
    out.push_str(
        "\n## `[queues.<name>]`\n\nPer-queue overrides of `[admission]`, one table per queue \
         of `admission.queues` (a table for another name is refused). Like the flags, they \
         seed a queue only when the store does not know it (at start-up, or after the store \
         lost its data); from then on the store's settings win and the admin API changes them \
         live. No flag or environment variable.\n\n| key | meaning |\n|---|---|\n",
    );
    for (key, about) in QUEUE_KEYS {
        let _ = writeln!(out, "| `{key}` | {} |", cell(about));
    }
    out.push_str(
        "\n## `[[rooms]]`\n\nThe built-in reverse proxy's rooms, one table per part of a \
         site a queue protects (see [front.md](front.md)); `front.origin` is one room over \
         the whole site. No flag or environment variable.\n\n| key | meaning |\n|---|---|\n",
    );
    for (key, about) in crate::front::ROOM_KEYS {
        let _ = writeln!(out, "| `{key}` | {} |", cell(about));
    }
    out.push_str(
        "\n## `[[webhooks]]`\n\nOne table per hook, the same on every instance (see \
         [webhooks.md](webhooks.md)). No flag or environment variable: a hook's secret stays \
         in the file.\n\n| key | meaning |\n|---|---|\n",
    );
    for (key, about) in crate::webhook::TABLE_KEYS {
        let _ = writeln!(out, "| `{key}` | {} |", cell(about));
    }
    out
}

#[cfg(test)]
mod tests {
    /// The committed reference is what the code generates. It documents
    /// the default build: without a feature some defaults differ
    /// (`--orders` is `off` without `demo-orders`), so only that build
    /// compares.
    #[cfg(all(
        feature = "demo-orders",
        feature = "signed-identity",
        feature = "https-webhooks"
    ))]
    #[test]
    fn docs_configuration_md_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
        let generated = super::markdown();
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(path, &generated).unwrap();
            return;
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        if committed != generated {
            let first = committed
                .lines()
                .zip(generated.lines())
                .position(|(a, b)| a != b)
                .map_or(
                    committed.lines().count().min(generated.lines().count()),
                    |n| n,
                )
                + 1;
            panic!(
                "docs/configuration.md is stale (first difference at line {first}): run \
                 `cargo run -- config-doc > docs/configuration.md` \
                 or `UPDATE_DOCS=1 cargo test --lib config::doc`"
            );
        }
    }
}
