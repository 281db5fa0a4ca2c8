//! The crate's top-level modules and the arrows between them, checked
//! from the sources: every module named in `src/lib.rs` has a row in
//! [`LAYERS`] listing the modules it may name (`crate::<module>` in code,
//! comments and strings left out), the arrows form no circle, nothing but
//! `lib.rs` names `app` (the composition root), `queue` names nothing
//! else of the crate, and the order gate knows neither the API nor axum.
//! `src/lib.rs`'s map and `ARCHITECTURE.md` state the same table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of `src/lib.rs` and the modules it may use.
/// Read bottom-up: a module uses only modules listed before it in its
/// row, and (the circle check) never one that uses it back.
const LAYERS: &[(&str, &[&str])] = &[
    ("queue", &[]),
    ("clock", &[]),
    ("telemetry", &[]),
    ("tls", &[]),
    ("store", &["queue", "clock"]),
    ("identity", &["queue"]),
    ("brand", &["queue"]),
    ("pass", &["queue"]),
    ("error", &["store"]),
    ("catalog", &["queue", "store"]),
    ("push", &["queue", "store"]),
    ("challenge", &["queue", "store", "clock"]),
    ("lottery", &["queue", "store", "clock"]),
    ("webhook", &["queue", "store", "clock", "tls"]),
    ("fairness", &["queue", "store", "clock", "pass"]),
    ("gate", &["queue", "store", "identity"]),
    ("orders", &["queue", "store", "gate"]),
    (
        "tasks",
        &[
            "queue", "store", "clock", "catalog", "push", "lottery", "webhook", "fairness", "gate",
            "orders", "pass",
        ],
    ),
    (
        "http",
        &[
            "queue",
            "store",
            "clock",
            "telemetry",
            "identity",
            "brand",
            "error",
            "catalog",
            "push",
            "challenge",
            "lottery",
            "fairness",
            "gate",
            "orders",
            "pass",
        ],
    ),
    ("server", &["http", "error", "push"]),
    ("front", &["queue", "clock", "error", "http", "pass", "tls"]),
    (
        "config",
        &[
            "queue",
            "store",
            "identity",
            "challenge",
            "webhook",
            "http",
            "pass",
            "front",
        ],
    ),
    (
        "app",
        &[
            "queue",
            "clock",
            "store",
            "identity",
            "brand",
            "catalog",
            "push",
            "challenge",
            "fairness",
            "gate",
            "orders",
            "tasks",
            "http",
            "server",
            "front",
            "config",
            "pass",
        ],
    ),
];

/// The top-level modules `src/lib.rs` declares (`mod x;`, `pub mod x;`).
fn declared_modules(root: &Path) -> Vec<String> {
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let code = code_of(&lib);
    let mut modules = Vec::new();
    for line in code.lines() {
        let words: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == ';')
            .filter(|w| !w.is_empty())
            .collect();
        let at = words.iter().position(|w| *w == "mod");
        if let Some(at) = at
            && line.trim_end().ends_with(';')
            && words[..at].iter().all(|w| w.starts_with("pub"))
            && let Some(name) = words.get(at + 1)
        {
            modules.push((*name).to_owned());
        }
    }
    modules
}

/// The source files of top-level module `module`.
fn module_sources(root: &Path, module: &str) -> Vec<PathBuf> {
    let file = root.join("src").join(format!("{module}.rs"));
    if file.is_file() {
        return vec![file];
    }
    sources(&root.join("src").join(module))
}

fn sources(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_owned()];
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).unwrap() {
        files.extend(sources(&entry.unwrap().path()));
    }
    files.retain(|f| f.extension().is_some_and(|e| e == "rs"));
    files.sort();
    files
}

/// `text` with comments (line, doc and block) removed and string and char
/// literals emptied, line breaks kept (so line numbers still hold).
fn code_of(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let at = |i: usize, s: &str| {
        s.chars()
            .enumerate()
            .all(|(k, c)| chars.get(i + k) == Some(&c))
    };
    while i < chars.len() {
        let c = chars[i];
        let after_word = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if at(i, "//") {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if at(i, "/*") {
            let mut depth = 0;
            while i < chars.len() {
                if at(i, "/*") {
                    depth += 1;
                    i += 2;
                } else if at(i, "*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == 'r' && !after_word && (at(i + 1, "\"") || at(i + 1, "#")) {
            // A raw string: r"…", r#"…"#, …
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            let close: String = std::iter::once('"')
                .chain("#".repeat(hashes).chars())
                .collect();
            j += 1;
            while j < chars.len() && !at(j, &close) {
                if chars[j] == '\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j + close.len();
        } else if c == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                if chars[j] == '\n' {
                    out.push('\n');
                }
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            out.push_str("' '");
            i += 3;
        } else if c == '\'' && chars.get(i + 1) == Some(&'\\') {
            // '\n', '\u{…}', …
            let mut j = i + 2;
            while j < chars.len() && chars[j] != '\'' {
                j += 1;
            }
            out.push_str("' '");
            i = j + 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The top-level modules named after `crate::` in the code of `text`
/// (imports, groups over several lines, paths in expressions), with
/// their line.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let code = code_of(text);
    let mut found = Vec::new();
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let line = code[..at].matches('\n').count() + 1;
        let rest = code[at + "crate::".len()..].trim_start();
        let Some(group) = rest.strip_prefix('{') else {
            found.push((line, ident(rest)));
            continue;
        };
        // A group: each top-level member's first segment.
        let mut depth = 0;
        let mut member = String::new();
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    found.push((line, ident(&member)));
                    member.clear();
                    continue;
                }
                _ => {}
            }
            member.push(c);
        }
        found.push((line, ident(&member)));
    }
    found.retain(|(_, m)| !m.is_empty() && m != "self");
    found
}

/// Each declared module's `crate::` paths into other top-level modules:
/// module → (used module → first place it is named).
fn graph(root: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let modules = declared_modules(root);
    let mut graph = BTreeMap::new();
    for module in &modules {
        let mut uses = BTreeMap::new();
        for file in module_sources(root, module) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (line, used) in crate_paths(&text) {
                if used != *module && modules.contains(&used) {
                    uses.entry(used)
                        .or_insert_with(|| format!("{}:{line}", file.display()));
                }
            }
        }
        graph.insert(module.clone(), uses);
    }
    graph
}

#[test]
fn every_module_has_a_row_and_keeps_to_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let declared = declared_modules(root);
    assert!(declared.len() >= 15, "src/lib.rs declares {declared:?}");
    let rows: BTreeMap<&str, &[&str]> = LAYERS.iter().copied().collect();
    let mut wrong = Vec::new();
    for module in &declared {
        if !rows.contains_key(module.as_str()) {
            wrong.push(format!(
                "{module}: declared in src/lib.rs, no row in LAYERS"
            ));
        }
    }
    for (module, _) in LAYERS {
        if !declared.iter().any(|m| m == module) {
            wrong.push(format!("{module}: a row in LAYERS, not in src/lib.rs"));
        }
    }
    for (module, uses) in graph(root) {
        let allowed = rows.get(module.as_str()).copied().unwrap_or_default();
        for (used, place) in uses {
            if !allowed.contains(&used.as_str()) {
                wrong.push(format!("{place}: {module} uses crate::{used}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "paths against the layering (tests/api/layering.rs LAYERS):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_circle_among_the_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let graph = graph(root);
    // Depth-first search; a module met again on the current path closes a
    // circle.
    fn visit<'a>(
        at: &'a str,
        graph: &'a BTreeMap<String, BTreeMap<String, String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|m| *m == at) {
            let mut circle: Vec<String> = path[start..].iter().map(|m| m.to_string()).collect();
            circle.push(at.to_owned());
            return Some(circle);
        }
        if !done.insert(at) {
            return None;
        }
        path.push(at);
        for used in graph.get(at).into_iter().flat_map(|u| u.keys()) {
            if let Some(circle) = visit(used, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        if let Some(circle) = visit(module, &graph, &mut Vec::new(), &mut done) {
            let places: Vec<String> = circle
                .windows(2)
                .map(|w| format!("{} → {} ({})", w[0], w[1], graph[&w[0]][&w[1]]))
                .collect();
            panic!("a circle among the modules:\n{}", places.join("\n"));
        }
    }
}

#[test]
fn only_lib_names_the_composition_root() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = Vec::new();
    for file in sources(&root.join("src")) {
        if file.ends_with("src/lib.rs") || file.ends_with("src/app.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, module) in crate_paths(&text) {
            if module == "app" {
                wrong.push(format!("{}:{line}: crate::app", file.display()));
            }
        }
        // The binary reaches the library by its name.
        if code_of(&text).contains("waitroom::app") {
            wrong.push(format!("{}: waitroom::app", file.display()));
        }
    }
    assert!(
        wrong.is_empty(),
        "only src/lib.rs uses the composition root:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_rules_use_nothing_else_of_the_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = Vec::new();
    for file in module_sources(root, "queue") {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, module) in crate_paths(&text) {
            if module != "queue" {
                wrong.push(format!("{}:{line}: crate::{module}", file.display()));
            }
        }
    }
    assert!(wrong.is_empty(), "queue is pure:\n{}", wrong.join("\n"));
}

#[test]
fn the_gate_knows_neither_the_api_nor_axum() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = Vec::new();
    for file in module_sources(root, "gate") {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, module) in crate_paths(&text) {
            if module == "http" || module == "server" {
                wrong.push(format!("{}:{line}: crate::{module}", file.display()));
            }
        }
        for (n, line) in code_of(&text).lines().enumerate() {
            if line.contains("axum::") || line.contains("hyper::") {
                wrong.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the gate is used by the API, and by order services on any framework:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn one_module_root_style() {
    // `foo/mod.rs` throughout: no `foo.rs` beside a `foo/` folder.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mixed: Vec<String> = sources(&root.join("src"))
        .into_iter()
        .filter(|f| f.with_extension("").is_dir())
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        mixed.is_empty(),
        "module roots beside their folder: {mixed:?}"
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
    let text = "use crate::AppState;\nlet x = crate::http::f();\n// crate::server\nuse crate::{app::X, queue};\n/// [`crate::tasks`]\nuse crate::{\n    gate::{Gate, Claim},\n    store::SharedStore,\n};\nlet s = \"crate::orders\";\n/* crate::config */ $crate::brand::x();";
    let found: Vec<String> = crate_paths(text).into_iter().map(|(_, m)| m).collect();
    assert_eq!(found, ["AppState", "http", "app", "queue", "gate", "store"]);
}
