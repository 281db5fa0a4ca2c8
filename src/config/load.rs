//! Layering: defaults < file < environment < flags.
//!
//! clap stays the parser of flags and environment variables, and tells
//! where each value came from (`ArgMatches::value_source`). A first parse
//! of the command line and the environment finds the file (`--config` or
//! `WAITROOM_CONFIG`) and which flags are still at their default; each key
//! the file sets for one of those is then handed to clap as `--flag=value`
//! in front of the real arguments, and a second parse builds the
//! [`Config`]. So a file value goes through the very parser and checks of
//! its flag, and the environment and the command line keep the last word.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

use super::keys::{self, CONFIG_ARG};
use super::{Config, file};

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Default,
    /// Neither set nor defaulted.
    Unset,
    File {
        path: PathBuf,
        line: usize,
    },
    Env(String),
    Flag(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::Unset => f.write_str("unset"),
            Source::File { path, line } => write!(f, "file:{}:{line}", path.display()),
            Source::Env(name) => write!(f, "env {name}"),
            Source::Flag(long) => write!(f, "flag {long}"),
        }
    }
}

/// A configuration that cannot be loaded: `Usage` is clap's own answer
/// (help, version, an unknown flag); `Invalid` is one line naming the key
/// and its source. Both exit with code 2 (help and version with 0).
#[derive(Debug)]
pub enum LoadError {
    Usage(clap::Error),
    Invalid(String),
}

impl LoadError {
    pub(super) fn invalid(message: String) -> Self {
        LoadError::Invalid(message)
    }

    /// Prints the error and ends the process: code 2 (0 for `--help` and
    /// `--version`), no backtrace.
    pub fn exit(self) -> ! {
        match self {
            LoadError::Usage(e) => e.exit(),
            LoadError::Invalid(m) => {
                eprintln!("error: {m}");
                std::process::exit(2)
            }
        }
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Usage(e) => write!(f, "{}", e.render()),
            LoadError::Invalid(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for LoadError {}

/// Each flag's effective raw value(s) and source, by clap argument id.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    pub file: Option<PathBuf>,
    pub values: BTreeMap<String, (Vec<String>, Source)>,
    /// `[queues.<name>]` and `[[webhooks]]`: name → line in the file.
    pub queue_lines: BTreeMap<String, usize>,
    pub webhook_lines: Vec<usize>,
    /// `[[rooms]]`: the line of each table, in order.
    pub room_lines: Vec<usize>,
}

impl Sources {
    /// The source of the flag `arg`.
    pub fn source(&self, arg: &str) -> Source {
        self.values
            .get(arg)
            .map_or(Source::Unset, |(_, s)| s.clone())
    }

    /// `admission.batch (source: file:waitroom.toml:3)` for each flag
    /// named in `message`.
    fn explain(&self, message: &str, cmd: &clap::Command) -> String {
        let mut named = Vec::new();
        for (i, _) in message.match_indices("--") {
            let long: String = message[i + 2..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            let Some(arg) = cmd.get_arguments().find(|a| a.get_long() == Some(&long)) else {
                continue;
            };
            let id = arg.get_id().as_str();
            let key = keys::by_arg(id).map_or(id, |k| k.file);
            let described = format!("{key} (source: {})", self.source(id));
            if !named.contains(&described) {
                named.push(described);
            }
        }
        let queue_at = message
            .match_indices("queues.")
            .find(|(i, _)| *i == 0 || message[..*i].ends_with(' '))
            .map(|(i, _)| i);
        if let Some(rest) = queue_at.map(|i| &message[i + "queues.".len()..]) {
            let name: String = rest
                .chars()
                .take_while(|c| *c != ':' && *c != ' ')
                .collect();
            if let (Some(line), Some(path)) = (self.queue_lines.get(&name), &self.file) {
                named.push(format!(
                    "queues.{name} (source: file:{}:{line})",
                    path.display()
                ));
            }
        }
        // `rooms[i]`: the table's line in the file.
        if let Some(at) = message.find("rooms[") {
            let index: String = message[at + "rooms[".len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if let (Some(line), Some(path)) = (
                index
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| self.room_lines.get(i)),
                &self.file,
            ) {
                named.push(format!(
                    "rooms[{index}] (source: file:{}:{line})",
                    path.display()
                ));
            }
        }
        if named.is_empty() {
            message.to_owned()
        } else {
            format!("{message} [{}]", named.join("; "))
        }
    }
}

/// A loaded configuration: validated, with where each value came from.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub sources: Sources,
}

/// Loads the configuration from `args` (without the program name), the
/// process environment when `read_env`, and the file `--config` names;
/// then validates it. Every error names the key and its source.
pub fn load<I, T>(args: I, read_env: bool) -> Result<Loaded, LoadError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut cmd = Config::command();
    if !read_env {
        cmd = cmd.mut_args(|a| a.env(None::<&str>));
    }
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let program = OsString::from("waitroom");
    let argv = |front: &[String]| {
        std::iter::once(program.clone())
            .chain(front.iter().map(OsString::from))
            .chain(args.iter().cloned())
            .collect::<Vec<_>>()
    };
    let first = cmd
        .clone()
        .try_get_matches_from(argv(&[]))
        .map_err(|e| clap_error(&cmd, e, &args, &BTreeMap::new()))?;
    let file = match first.get_one::<PathBuf>(CONFIG_ARG) {
        Some(path) => Some(file::read(path, &cmd)?),
        None => None,
    };
    let (front, from_file) = file_front(file.as_ref(), &first);
    let matches = cmd
        .clone()
        .try_get_matches_from(argv(&front))
        .map_err(|e| clap_error(&cmd, e, &args, &from_file))?;
    let mut config = Config::from_arg_matches(&matches).map_err(LoadError::Usage)?;
    let mut sources = sources_of(&cmd, &matches, &from_file);
    sources.file = file.as_ref().map(|f| f.path.clone());
    if let Some(f) = file {
        for (name, overrides, line) in f.queues {
            sources.queue_lines.insert(name.to_string(), line);
            config.queue_overrides.push((name, overrides));
        }
        for (spec, line) in f.webhooks {
            sources.webhook_lines.push(line);
            config.webhooks.push(spec);
        }
        for (spec, line) in f.rooms {
            sources.room_lines.push(line);
            config.rooms.push(spec);
        }
    }
    config
        .validate()
        .map_err(|e| LoadError::invalid(sources.explain(&e.to_string(), &cmd)))?;
    Ok(Loaded { config, sources })
}

/// The file's values for the flags `first` (the command line and the
/// environment alone) left at their default, as arguments to put in
/// front of the command line's; and those keys, with the file and line
/// that set them.
fn file_front(
    file: Option<&file::ConfigFile>,
    first: &clap::ArgMatches,
) -> (Vec<String>, BTreeMap<String, (PathBuf, usize)>) {
    let mut from_file = BTreeMap::new();
    let mut front = Vec::new();
    if let Some(f) = file {
        for v in &f.values {
            if matches!(
                first.value_source(v.key.arg),
                None | Some(ValueSource::DefaultValue)
            ) {
                front.extend(v.args.iter().cloned());
                from_file.insert(v.key.arg.to_owned(), (f.path.clone(), v.line));
            }
        }
    }
    (front, from_file)
}

/// Every flag's raw value and where it came from: the file (`from_file`),
/// the command line, the environment or the default.
fn sources_of(
    cmd: &clap::Command,
    matches: &clap::ArgMatches,
    from_file: &BTreeMap<String, (PathBuf, usize)>,
) -> Sources {
    let mut sources = Sources::default();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if matches!(id, "help" | "version") {
            continue;
        }
        let raw: Vec<String> = matches
            .get_raw(id)
            .map(|v| v.map(|s| s.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let source = if let Some((path, line)) = from_file.get(id) {
            Source::File {
                path: path.clone(),
                line: *line,
            }
        } else {
            match matches.value_source(id) {
                Some(ValueSource::CommandLine) => {
                    Source::Flag(format!("--{}", arg.get_long().unwrap_or(id)))
                }
                Some(ValueSource::EnvVariable) => Source::Env(
                    arg.get_env()
                        .map_or_else(String::new, |e| e.to_string_lossy().into_owned()),
                ),
                Some(ValueSource::DefaultValue) => Source::Default,
                _ => Source::Unset,
            }
        };
        sources.values.insert(id.to_owned(), (raw, source));
    }
    sources
}

/// clap's refusal of a value, as one line naming the key and its source
/// (clap's own message for help, version and usage mistakes).
fn clap_error(
    cmd: &clap::Command,
    e: clap::Error,
    user_args: &[OsString],
    from_file: &BTreeMap<String, (PathBuf, usize)>,
) -> LoadError {
    if !matches!(
        e.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return LoadError::Usage(e);
    }
    let Some(ContextValue::String(shown)) = e.get(ContextKind::InvalidArg) else {
        return LoadError::Usage(e);
    };
    let long = shown
        .split([' ', '='])
        .next()
        .unwrap_or_default()
        .trim_start_matches('-');
    let Some(arg) = cmd.get_arguments().find(|a| a.get_long() == Some(long)) else {
        return LoadError::Usage(e);
    };
    let id = arg.get_id().as_str();
    let on_line = user_args.iter().any(|a| {
        a.to_str()
            .is_some_and(|a| a == format!("--{long}") || a.starts_with(&format!("--{long}=")))
    });
    let source = if let Some((path, line)) = from_file.get(id) {
        Source::File {
            path: path.clone(),
            line: *line,
        }
    } else if !on_line && let Some(env) = arg.get_env() {
        Source::Env(env.to_string_lossy().into_owned())
    } else {
        Source::Flag(format!("--{long}"))
    };
    let rendered = e.render().to_string();
    let first = rendered
        .lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ");
    let key = keys::by_arg(id).map_or(id, |k| k.file);
    LoadError::Invalid(format!("{first} [{key} (source: {source})]"))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use clap::CommandFactory;

    use super::super::keys::{self, KEYS, SECTIONS};
    use super::*;

    fn file(name: &str, text: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "waitroom-{name}-{}-{:x}.toml",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::write(&path, text).unwrap();
        path
    }

    fn load_file(text: &str, flags: &[&str]) -> Result<Loaded, String> {
        let path = file("load", text);
        let mut args = vec!["--config".to_owned(), path.display().to_string()];
        args.extend(flags.iter().map(|f| f.to_string()));
        let loaded = load(args, false).map_err(|e| e.to_string());
        let _ = std::fs::remove_file(path);
        loaded
    }

    #[test]
    fn every_flag_has_exactly_one_file_key() {
        let cmd = Config::command();
        let ids: Vec<&str> = cmd
            .get_arguments()
            .map(|a| a.get_id().as_str())
            .filter(|id| !matches!(*id, "help" | "version" | keys::CONFIG_ARG))
            .collect();
        for id in &ids {
            assert_eq!(
                KEYS.iter().filter(|k| k.arg == *id).count(),
                1,
                "--{id} needs one key in keys.rs"
            );
        }
        for key in KEYS {
            assert!(ids.contains(&key.arg), "{} names no flag", key.file);
            assert_eq!(
                keys::by_file(key.file).unwrap().arg,
                key.arg,
                "{}",
                key.file
            );
            assert!(
                SECTIONS
                    .iter()
                    .any(|s| s.name == keys::section_of(key.file).name)
            );
        }
    }

    #[test]
    fn the_file_stands_in_for_defaults_and_flags_win() {
        let loaded = load_file(
            "[admission]\nbatch = 7\ninterval_ms = 2_000\n\n[store.group_commit]\nmax = 8\n\n[proxy]\ntrusted = [\"10.0.0.0/8\", \"192.0.2.1\"]\n\n[tickets]\nin_query = true\n",
            &["--admission-interval-ms", "3000"],
        )
        .unwrap();
        let c = &loaded.config;
        assert_eq!(c.admission_batch, 7, "file over default");
        assert_eq!(c.admission_interval_ms, 3000, "flag over file");
        assert_eq!(c.join_batch_max, 8, "a nested section");
        assert_eq!(c.trusted_proxies, ["10.0.0.0/8", "192.0.2.1"], "a list");
        assert!(c.ticket_in_query, "a switch");
        assert_eq!(c.token_ttl_secs, 300, "default");
        let s = &loaded.sources;
        assert!(matches!(
            s.source("admission_batch"),
            Source::File { line: 2, .. }
        ));
        assert_eq!(
            s.source("admission_interval_ms"),
            Source::Flag("--admission-interval-ms".into())
        );
        assert_eq!(s.source("token_ttl_secs"), Source::Default);
        assert_eq!(s.source("max_active"), Source::Unset);
    }

    #[test]
    fn bad_values_name_the_key_and_the_source() {
        let e = load_file("# x\n[admission]\nbatch = 0\n", &[]).unwrap_err();
        assert!(e.contains("admission.batch") && e.contains(":3)"), "{e}");
        let e = load_file("[admission]\nbatch = \"many\"\n", &[]).unwrap_err();
        assert!(e.contains("admission.batch (source: file:"), "{e}");
        let e = load_file("", &["--admission-batch", "0"]).unwrap_err();
        assert!(e.contains("source: flag --admission-batch"), "{e}");
        let e = load_file("[admission]\nbatchh = 1\n", &[]).unwrap_err();
        assert!(
            e.contains("admission.batchh: unknown key") && e.contains(":2)"),
            "{e}"
        );
        let e = load_file("[nope]\n", &[]).unwrap_err();
        assert!(e.contains("nope: unknown section"), "{e}");
        let e = load_file("[server]\naddr = [\"a\"]\n", &[]).unwrap_err();
        assert!(e.contains("server.addr: takes one value"), "{e}");
        let e = load_file("[tickets]\nin_query = 1\n", &[]).unwrap_err();
        assert!(e.contains("tickets.in_query: must be true or false"), "{e}");
        let e = load_file("[queues.default]\nbatchy = 1\n", &[]).unwrap_err();
        assert!(
            e.contains("unknown field `batchy`") && e.contains(":2"),
            "{e}"
        );
        let e = load_file("[queues.other]\nbatch = 1\n", &[]).unwrap_err();
        assert!(e.contains("queues.other: not a configured queue"), "{e}");
        let e = load_file("[queues.default]\nbatch = 0\n", &[]).unwrap_err();
        assert!(
            e.contains("queues.default: batch") && e.contains(":1)"),
            "{e}"
        );
        let e = load_file(
            "[[webhooks]]\nname = \"a\"\nurl = \"http://127.0.0.1/\"\nsecret = \"0123456789abcdef\"\n\n[[webhooks]]\nname = \"a\"\nurl = \"http://127.0.0.1/\"\nsecret = \"0123456789abcdef\"\n",
            &[],
        )
        .unwrap_err();
        assert!(e.contains("names must be distinct"), "{e}");
        assert!(
            !e.contains("0123456789abcdef"),
            "no secret in messages: {e}"
        );
    }

    #[test]
    fn queue_tables_override_the_admission_defaults_of_their_queue() {
        let loaded = load_file(
            "[admission]\nqueues = [\"a\", \"shoes\"]\nbatch = 7\n\n[queues.shoes]\nbatch = 3\nabandon_after_secs = 0\n\n[queues.shoes.adaptive]\nceiling = 40.0\n",
            &[],
        )
        .unwrap();
        let seeds = loaded.config.seed_settings().unwrap();
        let (a, shoes) = (&seeds[0].1, &seeds[1].1);
        assert_eq!(
            (a.batch, a.abandon_after_ms, a.adaptive.is_some()),
            (7, Some(120_000), false)
        );
        assert_eq!((shoes.batch, shoes.abandon_after_ms), (3, None));
        let adaptive = shoes.adaptive.as_ref().unwrap();
        assert_eq!(
            (adaptive.floor_per_sec, adaptive.ceiling_per_sec),
            (1.0, 40.0)
        );
        assert_eq!(
            loaded.config.seed_defaults().batch,
            7,
            "new queues: [admission]"
        );
    }

    #[test]
    fn the_init_template_loads_and_check_masks_its_secrets() {
        let template = super::super::init_template();
        assert_ne!(
            template,
            super::super::init_template(),
            "fresh secrets each time"
        );
        let loaded = load_file(&template, &[]).unwrap();
        let token = loaded.config.admin_token.clone().unwrap();
        assert_eq!(token.len(), 64);
        assert!(loaded.config.service_token.is_some() && loaded.config.ticket_secret.is_some());
        let report = loaded.report();
        assert!(!report.contains(&token), "secrets masked");
        assert!(
            report.contains("auth.admin_token = \"********\"  (source: file:"),
            "{report}"
        );
        assert!(
            report.contains("admission.batch = 50  (source: default)"),
            "{report}"
        );
        // Every commented default, uncommented, is a file that loads.
        let sections = template.split("\n# Per-queue overrides").next().unwrap();
        let uncommented: String = sections
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(kv) if kv.contains(" = ") && !kv.contains("(unset") => kv,
                _ => l,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let loaded = load_file(&uncommented, &[]).unwrap();
        assert!(matches!(loaded.sources.source("addr"), Source::File { .. }));
        assert!(matches!(
            loaded.sources.source("queues"),
            Source::File { .. }
        ));
    }

    #[test]
    fn without_a_file_loading_is_parsing_the_flags() {
        let loaded = load(["--admission-batch", "2"], false).unwrap();
        assert_eq!(loaded.config.admission_batch, 2);
        assert!(loaded.sources.file.is_none());
        assert!(matches!(
            load(["--no-such-flag"], false),
            Err(LoadError::Usage(_))
        ));
    }
}
