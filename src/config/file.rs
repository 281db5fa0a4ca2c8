//! Reading a configuration file: every key of a section becomes the flag
//! it stands for (`keys.rs`), ready to be parsed by clap like any flag;
//! `[queues.<name>]`, `[[webhooks]]` and `[[rooms]]` are read with serde. An unknown
//! section or key, or a value of the wrong shape, is refused with the
//! key, the file and the line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::ArgAction;
use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::QueueOverrides;
use super::keys::{self, Key};
use super::load::LoadError;
use crate::front::{RoomSpec, RoomTable};
use crate::queue::QueueName;
use crate::webhook::{WebhookSpec, WebhookTable};

/// A file read and checked for shape (values are checked by clap and by
/// [`Config::validate`](super::Config::validate) once layered).
pub struct ConfigFile {
    pub path: PathBuf,
    /// Each flag key the file sets.
    pub values: Vec<FileValue>,
    pub queues: Vec<(QueueName, QueueOverrides, usize)>,
    pub webhooks: Vec<(WebhookSpec, usize)>,
    pub rooms: Vec<(RoomSpec, usize)>,
}

/// One key the file sets, as arguments for clap.
pub struct FileValue {
    pub key: &'static Key,
    pub line: usize,
    /// `--flag=value` (none for a switch set to false).
    pub args: Vec<String>,
}

/// The 1-based line of byte `offset` of `text`.
pub fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

#[derive(Deserialize)]
struct Structured {
    #[serde(default)]
    queues: BTreeMap<Spanned<String>, Spanned<QueueOverrides>>,
    #[serde(default)]
    webhooks: Vec<Spanned<WebhookTable>>,
    #[serde(default)]
    rooms: Vec<Spanned<RoomTable>>,
}

/// Reads `path` against the flags of `cmd`.
pub fn read(path: &Path, cmd: &clap::Command) -> Result<ConfigFile, LoadError> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| LoadError::invalid(format!("--config {shown}: cannot read it: {e}")))?;
    parse(path, &text, cmd)
}

/// Parses `text`, the contents of `path`.
pub fn parse(path: &Path, text: &str, cmd: &clap::Command) -> Result<ConfigFile, LoadError> {
    let shown = path.display();
    let toml_error = |e: toml::de::Error| {
        let at = e
            .span()
            .map(|s| format!(":{}", line_of(text, s.start)))
            .unwrap_or_default();
        LoadError::invalid(format!("file:{shown}{at}: {}", e.message().trim()))
    };
    let document = DeTable::parse(text).map_err(toml_error)?;
    let mut values = Vec::new();
    walk("", document.get_ref(), text, path, cmd, &mut values)?;
    let structured: Structured = toml::from_str(text).map_err(toml_error)?;
    let mut queues = Vec::new();
    for (name, overrides) in structured.queues {
        let line = line_of(text, name.span().start);
        let parsed = QueueName::parse(name.get_ref()).map_err(|e| {
            LoadError::invalid(format!(
                "queues.{}: {e} (source: file:{shown}:{line})",
                name.get_ref()
            ))
        })?;
        queues.push((parsed, overrides.into_inner(), line));
    }
    let mut webhooks = Vec::new();
    for (i, table) in structured.webhooks.into_iter().enumerate() {
        let line = line_of(text, table.span().start);
        let spec = table.into_inner().into_spec().map_err(|e| {
            LoadError::invalid(format!("webhooks[{i}]: {e} (source: file:{shown}:{line})"))
        })?;
        webhooks.push((spec, line));
    }
    let mut rooms = Vec::new();
    for (i, table) in structured.rooms.into_iter().enumerate() {
        let line = line_of(text, table.span().start);
        let spec = table.into_inner().into_spec().map_err(|e| {
            LoadError::invalid(format!("rooms[{i}].{e} (source: file:{shown}:{line})"))
        })?;
        rooms.push((spec, line));
    }
    Ok(ConfigFile {
        path: path.to_owned(),
        values,
        queues,
        webhooks,
        rooms,
    })
}

fn walk(
    prefix: &str,
    table: &DeTable<'_>,
    text: &str,
    path: &Path,
    cmd: &clap::Command,
    out: &mut Vec<FileValue>,
) -> Result<(), LoadError> {
    for (key, value) in table.iter() {
        let name: &str = key.get_ref();
        if prefix.is_empty() && (name == "queues" || name == "webhooks" || name == "rooms") {
            continue;
        }
        let full = if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}.{name}")
        };
        let line = line_of(text, key.span().start);
        let at = || format!("file:{}:{line}", path.display());
        match value.get_ref() {
            DeValue::Table(inner) if keys::is_section(&full) => {
                walk(&full, inner, text, path, cmd, out)?
            }
            _ if keys::is_section(&full) => {
                return Err(LoadError::invalid(format!(
                    "{full}: a section, not a value (source: {})",
                    at()
                )));
            }
            v => {
                let Some(key) = keys::by_file(&full) else {
                    let what = if prefix.is_empty() {
                        "section or key"
                    } else {
                        "key"
                    };
                    return Err(LoadError::invalid(format!(
                        "{full}: unknown {what} (source: {}); `waitroom init` prints every key",
                        at()
                    )));
                };
                let args = arguments(key, v, cmd)
                    .map_err(|m| LoadError::invalid(format!("{full}: {m} (source: {})", at())))?;
                out.push(FileValue { key, line, args });
            }
        }
    }
    Ok(())
}

/// The clap arguments standing for `value` at `key`.
fn arguments(key: &Key, value: &DeValue<'_>, cmd: &clap::Command) -> Result<Vec<String>, String> {
    let arg = cmd
        .get_arguments()
        .find(|a| a.get_id() == key.arg)
        .expect("every key names a flag");
    let long = arg.get_long().expect("every flag is long");
    let switch = matches!(arg.get_action(), ArgAction::SetTrue);
    if switch {
        return match value {
            DeValue::Boolean(true) => Ok(vec![format!("--{long}")]),
            DeValue::Boolean(false) => Ok(Vec::new()),
            other => Err(format!("must be true or false, not a {}", other.type_str())),
        };
    }
    let list = arg.get_value_delimiter().is_some();
    let one = match value {
        DeValue::Array(items) if list => {
            if items.is_empty() {
                return Ok(Vec::new());
            }
            let items = items
                .iter()
                .map(|v| scalar(v.get_ref()))
                .collect::<Result<Vec<_>, _>>()?;
            items.join(",")
        }
        DeValue::Array(_) => return Err("takes one value, not a list".into()),
        other => scalar(other)?,
    };
    Ok(vec![format!("--{long}={one}")])
}

fn scalar(value: &DeValue<'_>) -> Result<String, String> {
    match value {
        DeValue::String(s) => Ok(s.to_string()),
        DeValue::Integer(i) => {
            let digits = i.as_str().replace('_', "");
            i64::from_str_radix(&digits, i.radix())
                .map(|n| n.to_string())
                .map_err(|e| format!("{digits}: {e}"))
        }
        DeValue::Float(f) => Ok(f.as_str().replace('_', "")),
        DeValue::Boolean(b) => Ok(b.to_string()),
        other => Err(format!("must be a value, not a {}", other.type_str())),
    }
}
