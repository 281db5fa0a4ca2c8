//! `waitroom init`: a commented configuration file with every section and
//! key at its default, and fresh secrets.

use std::fmt::Write;

use clap::CommandFactory;

use super::Config;
use super::keys::{self, KEYS, SECTIONS};
use super::queues::QUEUE_KEYS;

/// The keys `init` fills in with a fresh random value.
const FRESH: &[&str] = &["ticket_secret", "admin_token", "service_token"];

/// A fresh secret: 32 random bytes, hex.
fn fresh_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes[..]);
    hex::encode(bytes)
}

/// `text` as `# ` comment lines of at most 78 columns.
pub(super) fn comment(out: &mut String, text: &str) {
    for paragraph in text.split("\n\n") {
        let mut line = String::from("#");
        for word in paragraph.split_whitespace() {
            if line.len() + 1 + word.len() > 78 && line.len() > 1 {
                let _ = writeln!(out, "{line}");
                line = String::from("#");
            }
            line.push(' ');
            line.push_str(word);
        }
        let _ = writeln!(out, "{line}");
    }
}

/// The file `waitroom init` prints.
pub fn template() -> String {
    let cmd = Config::command();
    let mut out = String::new();
    out.push_str(
        "# waitroom configuration, printed by `waitroom init`.\n\
         #\n\
         # Run from it: `waitroom -c waitroom.toml`; see what it gives, and where\n\
         # each value comes from: `waitroom check -c waitroom.toml`.\n\
         # Precedence: defaults < this file < WAITROOM_* environment < flags.\n\
         # Every key is shown at its default, commented out; the secrets below\n\
         # were generated for this file: keep it private (mode 0600).\n\
         # Reference: docs/configuration.md.\n",
    );
    for section in SECTIONS {
        let _ = writeln!(out, "\n[{}]", section.name);
        comment(&mut out, &format!("{} ({})", section.about, section.owner));
        for key in KEYS
            .iter()
            .filter(|k| keys::section_of(k.file).name == section.name)
        {
            let arg = keys::arg(&cmd, key.arg);
            let name = keys::short_name(key);
            out.push('\n');
            comment(&mut out, &keys::help_text(arg));
            if FRESH.contains(&key.arg) {
                let _ = writeln!(out, "{name} = \"{}\"", fresh_secret());
                continue;
            }
            let default = keys::default_raw(arg);
            if default.is_empty() {
                let _ = writeln!(out, "# {name} =   (unset by default)");
            } else {
                let _ = writeln!(out, "# {name} = {}", keys::toml_literal(arg, &default));
            }
        }
    }
    out.push_str("\n# Per-queue overrides of [admission], one table per queue of\n");
    out.push_str("# admission.queues. Like the flags, they seed a queue only when the store\n");
    out.push_str("# does not know it; from then on the admin API changes it live.\n");
    out.push_str("#\n# [queues.default]\n");
    for (key, about) in QUEUE_KEYS {
        let _ = writeln!(out, "# {key}: {about}");
    }
    out.push_str("# batch = 20\n# [queues.default.adaptive]\n# ceiling = 40.0\n");
    out.push_str(
        "\n# Webhooks: each queue's audit log, POSTed as it happens (docs/webhooks.md).\n",
    );
    out.push_str("# One table per hook, the same on every instance.\n#\n# [[webhooks]]\n");
    for (key, about) in crate::webhook::TABLE_KEYS {
        let _ = writeln!(out, "# {key}: {about}");
    }
    let _ = writeln!(
        out,
        "# name = \"crm\"\n# url = \"https://crm.example/hooks/waitroom\"\n# secret = \"{}\"\n# kinds = [\"admitted\", \"consumed\"]",
        fresh_secret()
    );
    out
}
