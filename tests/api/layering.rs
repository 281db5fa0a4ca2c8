//! The crate's dependencies run one way: `server → http → {push, gate} →
//! store → queue`, with `app` building the state the handlers share. A module
//! lower down that reached up (push holding the whole `AppState`, say)
//! would tie the layers together again, so the lower modules' sources are
//! checked for paths into the layers above.

use std::path::{Path, PathBuf};

/// `crate::<module>` paths each part may use (other code than comments).
const RULES: &[(&str, &[&str])] = &[
    ("src/queue", &["queue"]),
    ("src/identity", &["queue", "identity"]),
    ("src/store", &["queue", "store"]),
    ("src/push", &["queue", "store", "push"]),
    ("src/catalog.rs", &["queue", "store"]),
    ("src/admission.rs", &["queue", "store"]),
];

fn sources(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_owned()];
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).unwrap() {
        files.extend(sources(&entry.unwrap().path()));
    }
    files.retain(|f| f.extension().is_some_and(|e| e == "rs"));
    files
}

/// The modules named after `crate::` in the code of `text`, with their line.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let name = |s: &str| -> String {
                s.trim_start()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect()
            };
            match rest.strip_prefix('{') {
                // A group on one line: each member's first segment.
                Some(group) => {
                    let group = group.split('}').next().unwrap_or_default();
                    found.extend(group.split(',').map(|m| (n + 1, name(m))));
                }
                None => found.push((n + 1, name(rest))),
            }
        }
    }
    found
}

#[test]
fn lower_modules_do_not_reach_up() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = Vec::new();
    for (part, allowed) in RULES {
        for file in sources(&root.join(part)) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (line, module) in crate_paths(&text) {
                if !allowed.contains(&module.as_str()) {
                    wrong.push(format!("{}:{line}: crate::{module}", file.display()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "paths against the layering:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_api_does_not_reach_into_the_server() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = Vec::new();
    for file in sources(&root.join("src/http")) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, module) in crate_paths(&text) {
            if module == "server" {
                wrong.push(format!("{}:{line}: crate::{module}", file.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the server uses the API, not the other way round:\n{}",
        wrong.join("\n")
    );
}

/// Modules that hold a narrow store handle (one capability of the port),
/// with the capability: naming the whole `Store` there would hand them
/// every other capability again (a webhook deliverer able to admit).
const NARROW: &[(&str, &str)] = &[
    ("src/webhook", "AuditStore"),
    ("src/challenge", "ChallengeStore"),
];

/// Lines of `text` whose code (not comments) names the whole store port:
/// `SharedStore`, or `Store` as a path, an import, a bound or a trait
/// object (a variant such as `Refusal::Store` is something else).
fn whole_store(text: &str) -> Vec<usize> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        let imports = code.trim_start().starts_with("use crate::store::{");
        let mut names_it = false;
        let mut at = 0;
        for word in code.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
            let before = code[..at].trim_end();
            names_it |= word == "SharedStore"
                || (word == "Store"
                    && (imports
                        || ["store::", "dyn", "impl", ":", "+"]
                            .iter()
                            .any(|p| before.ends_with(p))));
            at += word.len() + 1;
        }
        if names_it {
            found.push(n + 1);
        }
    }
    found
}

#[test]
fn narrow_consumers_do_not_name_the_whole_store() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = Vec::new();
    for (part, capability) in NARROW {
        let mut uses_it = false;
        for file in sources(&root.join(part)) {
            let text = std::fs::read_to_string(&file).unwrap();
            uses_it |= text.contains(capability);
            for line in whole_store(&text) {
                wrong.push(format!("{}:{line}: the whole store", file.display()));
            }
        }
        assert!(uses_it, "{part} no longer uses {capability}: update NARROW");
    }
    assert!(
        wrong.is_empty(),
        "these modules take one capability of the store:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_narrow_check_sees_the_whole_store_but_not_a_capability() {
    let text = "use crate::store::{AuditStore, MemoryStore};\nfn f(s: SharedStore) {}\n// Store\nfn g<S: Store>() {}\n    Store(#[from] StoreError),\nlet s: Arc<dyn Store> = x;\nuse crate::store::{Store, X};\nlet s = crate::store::Store::ping;";
    assert_eq!(whole_store(text), [2, 4, 6, 7, 8]);
}

#[test]
fn the_check_sees_imports_and_paths_but_not_comments() {
    let text = "use crate::AppState;\nlet x = crate::http::f();\n// crate::server\nuse crate::{app::X, queue};";
    let found: Vec<String> = crate_paths(text).into_iter().map(|(_, m)| m).collect();
    assert_eq!(found, ["AppState", "http", "app", "queue"]);
}
