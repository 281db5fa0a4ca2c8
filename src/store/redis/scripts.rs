//! The Lua scripts, each prefixed with `common.lua` (Redis scripts cannot
//! include one another), those that keep request rates with `gcra.lua`,
//! and those that put users in line with `join.lua`. `Script` sends
//! `EVALSHA` and falls back to `EVAL` when Redis lost its script cache (a
//! restart), so no load step is needed.
//!
//! Each script carries only the helpers it uses (`assemble`): Redis runs a
//! script's whole text on every call, and each `local function` left in
//! it is a closure made and collected per call, whether called or not.
//!
//! A three-line prelude before `common.lua` fixes how events are published,
//! once per store: `PUBLISH` on one Redis, `SPUBLISH` in a cluster, and
//! whether `admit` publishes its pass itself or leaves that to the adapter
//! (which publishes after `WAIT`), and the audit log's length
//! (`--audit-max-len`, 0: no log). Baked in rather than passed as an
//! argument, so every script keeps its `ARGV` layout.

use redis::Script;

const COMMON: &str = include_str!("lua/common.lua");
const GCRA: &str = include_str!("lua/gcra.lua");
const JOIN: &str = include_str!("lua/join.lua");

/// How the scripts publish events.
#[derive(Debug, Clone, Copy)]
pub(super) struct Publishing {
    /// `SPUBLISH` (sharded pub/sub, a cluster) rather than `PUBLISH`.
    pub sharded: bool,
    /// `admit` publishes its pass; false when the adapter does it after
    /// replicas acknowledged the pass.
    pub pass_in_script: bool,
    /// The audit log's `MAXLEN ~` (`--audit-max-len`); 0: no log.
    pub audit_max_len: u64,
}

impl Publishing {
    fn prelude(self) -> String {
        format!(
            "local PUBLISH = '{}'\nlocal PUBLISH_PASS = {}\nlocal AUDIT_MAXLEN = {}\n",
            if self.sharded { "SPUBLISH" } else { "PUBLISH" },
            self.pass_in_script,
            self.audit_max_len
        )
    }
}

/// Every script the adapter runs.
pub(super) struct Scripts {
    pub enter: Script,
    /// A group of joins in one call (group commit, `batch.rs`).
    pub enter_many: Script,
    pub status: Script,
    pub statuses: Script,
    pub touch: Script,
    pub leave: Script,
    pub admit: Script,
    pub claim: Script,
    /// Whose token a presented one is (the token API's claim by token).
    pub token_holder: Script,
    pub consume: Script,
    pub release: Script,
    pub stats: Script,
    pub pause: Script,
    /// The admission turn among instances (`admission.rs`).
    pub turn: Script,
    pub renew_claim: Script,
    pub spend: Script,
    pub stock: Script,
    /// The lottery of a scheduled opening (`lottery.rs`).
    pub lottery_schedule: Script,
    pub lottery_read: Script,
    pub lottery_leave: Script,
    pub lottery_join: Script,
    pub lottery_begin: Script,
    pub lottery_stage: Script,
    pub lottery_commit: Script,
    /// A protected site's sessions (`sessions.rs`).
    pub session_start: Script,
    pub session_touch: Script,
    pub session_end: Script,
}

impl Scripts {
    pub(super) fn load(publishing: Publishing) -> Self {
        let prelude = publishing.prelude();
        let with_common = |body: &str| Script::new(&assemble(&prelude, &[COMMON], body));
        // A script that keeps request rates: `gcra.lua` after `common.lua`.
        let with_rates = |body: &str| Script::new(&assemble(&prelude, &[COMMON, GCRA], body));
        // A script that puts users in line: `join.lua` after the rates.
        let with_join = |body: &str| Script::new(&assemble(&prelude, &[COMMON, GCRA, JOIN], body));
        Self {
            enter: with_join(include_str!("lua/enter.lua")),
            enter_many: with_join(include_str!("lua/enter_many.lua")),
            status: with_rates(include_str!("lua/status.lua")),
            statuses: with_common(include_str!("lua/statuses.lua")),
            touch: with_common(include_str!("lua/touch.lua")),
            leave: with_common(include_str!("lua/leave.lua")),
            admit: with_common(include_str!("lua/admit.lua")),
            claim: with_common(include_str!("lua/claim.lua")),
            token_holder: with_common(include_str!("lua/token_holder.lua")),
            consume: with_common(include_str!("lua/consume.lua")),
            release: with_common(include_str!("lua/release.lua")),
            stats: with_common(include_str!("lua/stats.lua")),
            pause: with_common(include_str!("lua/pause.lua")),
            turn: Script::new(include_str!("lua/turn.lua")),
            renew_claim: with_common(include_str!("lua/renew_claim.lua")),
            spend: Script::new(&assemble("", &[GCRA], include_str!("lua/spend.lua"))),
            stock: with_common(include_str!("lua/stock.lua")),
            lottery_schedule: Script::new(&format!(
                "{prelude}{}",
                include_str!("lua/lottery_schedule.lua")
            )),
            lottery_read: Script::new(include_str!("lua/lottery_read.lua")),
            lottery_leave: Script::new(include_str!("lua/lottery_leave.lua")),
            lottery_join: with_rates(include_str!("lua/lottery_join.lua")),
            lottery_begin: with_common(include_str!("lua/lottery_begin.lua")),
            lottery_stage: with_common(include_str!("lua/lottery_stage.lua")),
            lottery_commit: with_common(include_str!("lua/lottery_commit.lua")),
            session_start: with_common(include_str!("lua/session_start.lua")),
            session_touch: with_common(include_str!("lua/session_touch.lua")),
            session_end: with_common(include_str!("lua/session_end.lua")),
        }
    }
}

/// `prelude`, then the top-level definitions of `libs` (in their order)
/// that `body` uses, directly or through another kept one, then `body`.
/// A definition is a line starting `local function name` or `local a, b =`
/// at the start of a line, up to the next one (the helper files hold
/// nothing else at top level); a name counts as used where it appears as a
/// word in code (not in a comment or a string). Over-keeping (a table
/// field of the same name) only costs a closure; a kept definition
/// always comes with all it names, so nothing used is ever left out.
fn assemble(prelude: &str, libs: &[&str], body: &str) -> String {
    let mut defs: Vec<(Vec<String>, &str)> = Vec::new();
    for lib in libs {
        let mut start: Option<usize> = None;
        let mut names = Vec::new();
        let mut at = 0;
        for line in lib.split_inclusive('\n') {
            if let Some(defined) = defined_names(line) {
                if let Some(s) = start {
                    defs.push((std::mem::take(&mut names), &lib[s..at]));
                }
                start = Some(at);
                names = defined;
            }
            at += line.len();
        }
        if let Some(s) = start {
            defs.push((names, &lib[s..]));
        }
    }
    let mut used: std::collections::HashSet<String> = words(body).collect();
    let mut kept = vec![false; defs.len()];
    loop {
        let mut grew = false;
        for (i, (names, text)) in defs.iter().enumerate() {
            if !kept[i] && names.iter().any(|n| used.contains(n)) {
                kept[i] = true;
                used.extend(words(text));
                grew = true;
            }
        }
        if !grew {
            break;
        }
    }
    let mut out = String::from(prelude);
    for (i, (_, text)) in defs.iter().enumerate() {
        if kept[i] {
            out.push_str(text);
        }
    }
    out.push('\n');
    out.push_str(body);
    out
}

/// The names a top-level definition line defines, or None for any other
/// line.
fn defined_names(line: &str) -> Option<Vec<String>> {
    if let Some(rest) = line.strip_prefix("local function ") {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        return Some(vec![name]);
    }
    let rest = line.strip_prefix("local ")?;
    let (names, _) = rest.split_once('=')?;
    Some(
        names
            .split(',')
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect(),
    )
}

/// The words (identifiers) of Lua code, outside comments and strings.
fn words(code: &str) -> impl Iterator<Item = String> + '_ {
    let mut out = Vec::new();
    for line in code.lines() {
        let mut word = String::new();
        let mut quote: Option<char> = None;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if let Some(q) = quote {
                if c == '\\' {
                    chars.next();
                } else if c == q {
                    quote = None;
                }
                continue;
            }
            if c.is_ascii_alphanumeric() || c == '_' {
                word.push(c);
                continue;
            }
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            match c {
                '\'' | '"' => quote = Some(c),
                '-' if chars.peek() == Some(&'-') => break,
                _ => {}
            }
        }
        if !word.is_empty() {
            out.push(word);
        }
    }
    out.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: &str = "-- a helper file\nlocal K = {a = KEYS[1]}\n\nlocal function used(x)\n  return helper(x) -- not: unused\nend\n\n-- helper: kept, as used names it\nlocal function helper(x)\n  return K.a .. x\nend\n\nlocal function unused()\n  return 'used'\nend\nlocal A, B = 1, 2\n";

    #[test]
    fn a_script_carries_the_helpers_it_uses_and_theirs() {
        let s = assemble("-- p\n", &[LIB], "return used(B)");
        assert!(s.starts_with("-- p\n"));
        for kept in [
            "local K =",
            "local function used",
            "local function helper",
            "local A, B",
        ] {
            assert!(s.contains(kept), "{kept} kept:\n{s}");
        }
        assert!(!s.contains("local function unused"), "{s}");
        assert!(s.ends_with("\nreturn used(B)"));
    }

    #[test]
    fn names_in_comments_and_strings_keep_nothing() {
        let s = assemble("", &[LIB], "-- unused()\nreturn 'helper'");
        assert!(!s.contains("local function"), "{s}");
        assert!(!s.contains("local K"), "{s}");
    }

    #[test]
    fn every_script_keeps_its_helpers_in_order() {
        let s = assemble("", &[COMMON, GCRA, JOIN], include_str!("lua/enter.lua"));
        for name in [
            "now_ms",
            "group",
            "join",
            "flush",
            "waiting_row",
            "gcra",
            "mark_entry",
        ] {
            assert!(s.contains(&format!("local function {name}(")), "{name}");
        }
        assert!(s.find("local function gcra(") < s.find("local function join("));
    }
}
