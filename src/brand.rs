//! Operators' branding of the waiting-room page, without a rebuild:
//! `--page-dir <dir>` holds files that override the embedded page's
//! (`static/`) and, per queue, `queues/<queue>.json`: a name, a logo, colours
//! and texts per language ([`Branding`]).
//!
//! Every branding file is read and checked once at start-up, so a typo
//! stops the process instead of showing a broken page: colours must be
//! `#rgb` or `#rrggbb` (they become CSS custom properties, never markup),
//! the logo a plain image file inside the page directory (no `..`, no
//! absolute path, no symlink out of it), texts short and keyed like the
//! page's own messages. The same object is meant to live in a queue's
//! stored settings later, so it is plain data with its own checks.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::queue::QueueName;

/// Longest brand name, in characters.
pub const MAX_NAME_CHARS: usize = 80;
/// Longest text, in characters.
pub const MAX_TEXT_CHARS: usize = 500;
/// Most texts per language.
pub const MAX_TEXTS: usize = 200;
/// Most languages.
pub const MAX_LANGUAGES: usize = 20;
/// Image types a logo may be.
const LOGO_TYPES: [&str; 6] = ["svg", "png", "webp", "jpg", "jpeg", "gif"];

/// A queue's branding: what its page shows instead of the defaults. Every
/// field is optional; an empty object brands nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Branding {
    /// The name in the page's masthead and title (at most 80 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The logo: a file of the page directory, by its path there
    /// (`logo.svg`, `img/acme.png`), served at that path below the page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logo: Option<String>,
    /// Colours, `#rgb` or `#rrggbb`.
    #[serde(default, skip_serializing_if = "Colors::is_empty")]
    pub colors: Colors,
    /// Texts per language (`en`, `ko`, `pt-BR`), each a map from a message
    /// key of the page (`waiting.heading`) to the text shown instead.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub texts: BTreeMap<String, BTreeMap<String, String>>,
}

/// The colours a brand may set; each becomes a CSS custom property of the
/// page, in light and dark mode alike.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Colors {
    /// Buttons, links, the progress bar (`--accent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$")]
    pub accent: Option<String>,
    /// Text on the accent colour (`--accent-contrast`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$")]
    pub accent_text: Option<String>,
    /// The page's background (`--bg`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$")]
    pub background: Option<String>,
}

impl Colors {
    fn is_empty(&self) -> bool {
        self.accent.is_none() && self.accent_text.is_none() && self.background.is_none()
    }
}

/// Why a branding was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct BrandError(pub String);

fn refuse<T>(message: String) -> Result<T, BrandError> {
    Err(BrandError(message))
}

/// `#rgb` or `#rrggbb`.
pub fn is_color(text: &str) -> bool {
    let Some(hex) = text.strip_prefix('#') else {
        return false;
    };
    matches!(hex.len(), 3 | 6) && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A language tag as the page names its dictionaries: `en`, `ko`, `pt-BR`.
fn is_language(tag: &str) -> bool {
    let mut parts = tag.split('-');
    let first = parts.next().unwrap_or_default();
    (2..=3).contains(&first.len())
        && first.bytes().all(|b| b.is_ascii_lowercase())
        && parts.all(|p| (2..=8).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// A message key: `waiting.heading`, `eta.range`.
fn is_key(key: &str) -> bool {
    (1..=64).contains(&key.len())
        && key.starts_with(|c: char| c.is_ascii_lowercase())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A relative path of plain names only (no `..`, no root, no `\`), as the
/// page directory's files are asked for.
pub fn plain_relative(path: &str) -> Option<PathBuf> {
    if path.is_empty() || path.contains('\\') || path.len() > 255 {
        return None;
    }
    let p = Path::new(path);
    p.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then(|| p.to_path_buf())
}

impl Branding {
    /// Checks every field (see the module doc); `dir` is the page directory
    /// the logo must be a file of.
    pub fn validate(&self, dir: &Path) -> Result<(), BrandError> {
        if let Some(name) = &self.name
            && (name.trim().is_empty() || name.chars().count() > MAX_NAME_CHARS)
        {
            return refuse(format!("name: 1 to {MAX_NAME_CHARS} characters"));
        }
        if let Some(logo) = &self.logo {
            check_logo(dir, logo)?;
        }
        for (field, value) in [
            ("accent", &self.colors.accent),
            ("accentText", &self.colors.accent_text),
            ("background", &self.colors.background),
        ] {
            if let Some(v) = value
                && !is_color(v)
            {
                return refuse(format!("colors.{field}: {v:?} is not #rgb or #rrggbb"));
            }
        }
        if self.texts.len() > MAX_LANGUAGES {
            return refuse(format!("texts: at most {MAX_LANGUAGES} languages"));
        }
        for (lang, texts) in &self.texts {
            if !is_language(lang) {
                return refuse(format!("texts: {lang:?} is not a language tag"));
            }
            if texts.len() > MAX_TEXTS {
                return refuse(format!("texts.{lang}: at most {MAX_TEXTS} texts"));
            }
            for (key, text) in texts {
                if !is_key(key) {
                    return refuse(format!("texts.{lang}: {key:?} is not a message key"));
                }
                if text.chars().count() > MAX_TEXT_CHARS {
                    return refuse(format!(
                        "texts.{lang}.{key}: at most {MAX_TEXT_CHARS} characters"
                    ));
                }
            }
        }
        Ok(())
    }
}

fn check_logo(dir: &Path, logo: &str) -> Result<(), BrandError> {
    let Some(relative) = plain_relative(logo) else {
        return refuse(format!(
            "logo: {logo:?} is not a plain path inside the page directory"
        ));
    };
    let ext = relative
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    if !LOGO_TYPES.contains(&ext.as_str()) {
        return refuse(format!("logo: {logo:?} is not one of {LOGO_TYPES:?}"));
    }
    if resolve(dir, &relative).is_none() {
        return refuse(format!(
            "logo: {logo:?} is not a file inside the page directory"
        ));
    }
    Ok(())
}

/// `relative` below `dir` when it is a file there, symlinks resolved and
/// still inside `dir`.
pub fn resolve(dir: &Path, relative: &Path) -> Option<PathBuf> {
    let root = dir.canonicalize().ok()?;
    let file = root.join(relative).canonicalize().ok()?;
    (file.starts_with(&root) && file.is_file()).then_some(file)
}

/// The page directory: its root (canonical) and every queue's branding,
/// read and checked at start-up.
#[derive(Debug, Clone)]
pub struct PageDir {
    root: PathBuf,
    brands: HashMap<QueueName, Branding>,
}

impl PageDir {
    /// Reads `dir` and its `queues/*.json`; each must be a configured
    /// queue's and a valid [`Branding`].
    pub fn open(dir: &Path, queues: &[QueueName]) -> Result<Self, BrandError> {
        let root = dir
            .canonicalize()
            .ok()
            .filter(|r| r.is_dir())
            .ok_or_else(|| BrandError(format!("{}: not a directory", dir.display())))?;
        let mut brands = HashMap::new();
        let queues_dir = root.join("queues");
        if queues_dir.is_dir() {
            let entries = std::fs::read_dir(&queues_dir)
                .map_err(|e| BrandError(format!("{}: {e}", queues_dir.display())))?;
            for entry in entries {
                let path = entry
                    .map_err(|e| BrandError(format!("{}: {e}", queues_dir.display())))?
                    .path();
                if path.extension().and_then(|e| e.to_str()) != Some("json") {
                    continue;
                }
                let (queue, brand) = read_brand(&root, &path, queues)?;
                brands.insert(queue, brand);
            }
        }
        Ok(Self { root, brands })
    }

    /// The queue's branding; the default (nothing) when it has none.
    pub fn brand(&self, queue: &QueueName) -> Option<&Branding> {
        self.brands.get(queue)
    }

    /// A file of the page directory, by its request path, when one is
    /// there (never outside it, never a branding file).
    pub fn file(&self, path: &str) -> Option<PathBuf> {
        let relative = plain_relative(path)?;
        if relative.starts_with("queues") {
            return None;
        }
        resolve(&self.root, &relative)
    }
}

fn read_brand(
    root: &Path,
    path: &Path,
    queues: &[QueueName],
) -> Result<(QueueName, Branding), BrandError> {
    let at = |m: String| BrandError(format!("{}: {m}", path.display()));
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    let queue = QueueName::parse(stem).map_err(|_| at("not a queue name".into()))?;
    if !queues.contains(&queue) {
        return Err(at(format!("no queue {queue} is configured")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| at(e.to_string()))?;
    let brand: Branding = serde_json::from_str(&text).map_err(|e| at(e.to_string()))?;
    brand.validate(root).map_err(|e| at(e.0))?;
    Ok((queue, brand))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile_dir::Dir {
        tempfile_dir::Dir::new()
    }

    /// A throwaway directory, removed on drop.
    mod tempfile_dir {
        use std::path::{Path, PathBuf};

        pub struct Dir(PathBuf);

        impl Dir {
            pub fn new() -> Self {
                let path = std::env::temp_dir()
                    .join(format!("waitroom-brand-{:016x}", rand::random::<u64>()));
                std::fs::create_dir_all(path.join("queues")).unwrap();
                Self(path)
            }
            pub fn path(&self) -> &Path {
                &self.0
            }
            pub fn write(&self, name: &str, text: &str) {
                let path = self.0.join(name);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, text).unwrap();
            }
        }

        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn queues() -> Vec<QueueName> {
        ["default", "drop"]
            .map(|q| QueueName::parse(q).unwrap())
            .to_vec()
    }

    #[test]
    fn colours_are_short_or_long_hex_only() {
        for good in ["#fff", "#A0b1C2", "#000000"] {
            assert!(is_color(good), "{good}");
        }
        for bad in [
            "fff",
            "#ffff",
            "#ggg",
            "#12345",
            "red",
            "#fff;x",
            "",
            "#",
            "#ffffff00",
        ] {
            assert!(!is_color(bad), "{bad}");
        }
    }

    #[test]
    fn a_full_branding_loads_and_is_served_for_its_queue() {
        let d = dir();
        d.write("img/logo.svg", "<svg xmlns='http://www.w3.org/2000/svg'/>");
        d.write(
            "queues/drop.json",
            r##"{"name":"Acme","logo":"img/logo.svg","colors":{"accent":"#e4002b","background":"#fff"},
                "texts":{"en":{"waiting.heading":"Hold tight"},"ko":{"waiting.heading":"잠시만요"}}}"##,
        );
        let page = PageDir::open(d.path(), &queues()).unwrap();
        let brand = page.brand(&QueueName::parse("drop").unwrap()).unwrap();
        assert_eq!(brand.name.as_deref(), Some("Acme"));
        assert_eq!(brand.texts["ko"]["waiting.heading"], "잠시만요");
        assert!(page.brand(&QueueName::parse("default").unwrap()).is_none());
        assert!(page.file("img/logo.svg").is_some());
        assert!(
            page.file("queues/drop.json").is_none(),
            "branding is not a file"
        );
        for bad in [
            "../etc/passwd",
            "/etc/passwd",
            "img/../../x",
            "img\\logo.svg",
            "",
        ] {
            assert!(page.file(bad).is_none(), "{bad}");
        }
    }

    fn refused(json: &str) -> String {
        let d = dir();
        d.write("logo.png", "png");
        d.write("queues/default.json", json);
        PageDir::open(d.path(), &queues()).unwrap_err().0
    }

    #[test]
    fn bad_brandings_stop_the_start_with_the_reason() {
        for (json, why) in [
            (r##"{"colors":{"accent":"red"}}"##, "colors.accent"),
            (r##"{"colors":{"background":"#12"}}"##, "colors.background"),
            (r##"{"colors":{"accent":"#fff;}"}}"##, "colors.accent"),
            (r##"{"logo":"../logo.png"}"##, "not a plain path"),
            (r##"{"logo":"/etc/passwd"}"##, "not a plain path"),
            (r##"{"logo":"missing.png"}"##, "not a file inside"),
            (r##"{"logo":"queues/default.json"}"##, "is not one of"),
            (r##"{"name":""}"##, "name"),
            (r##"{"texts":{"EN":{"a":"b"}}}"##, "language tag"),
            (r##"{"texts":{"en":{"A b":"c"}}}"##, "message key"),
            (r##"{"colour":"#fff"}"##, "unknown field"),
        ] {
            let message = refused(json);
            assert!(message.contains(why), "{json}: {message}");
        }
        let long = "x".repeat(MAX_TEXT_CHARS + 1);
        assert!(refused(&format!(r#"{{"texts":{{"en":{{"a":"{long}"}}}}}}"#)).contains("at most"));
    }

    #[test]
    fn a_branding_for_an_unknown_queue_or_a_missing_dir_is_refused() {
        let d = dir();
        d.write("queues/nope.json", "{}");
        assert!(
            PageDir::open(d.path(), &queues())
                .unwrap_err()
                .0
                .contains("no queue")
        );
        let gone = d.path().join("absent");
        assert!(
            PageDir::open(&gone, &queues())
                .unwrap_err()
                .0
                .contains("not a directory")
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_out_of_the_page_dir_is_not_followed() {
        let outside = dir();
        outside.write("secret.svg", "<svg/>");
        let d = dir();
        std::os::unix::fs::symlink(outside.path().join("secret.svg"), d.path().join("logo.svg"))
            .unwrap();
        let page = PageDir::open(d.path(), &queues()).unwrap();
        assert!(page.file("logo.svg").is_none());
        d.write("queues/default.json", r##"{"logo":"logo.svg"}"##);
        assert!(PageDir::open(d.path(), &queues()).is_err());
    }
}
