//! The Lua scripts, each prefixed with `common.lua` (Redis scripts cannot
//! include one another), those that keep request rates with `gcra.lua`,
//! and those that put users in line with `join.lua`. `Script` sends
//! `EVALSHA` and falls back to `EVAL` when Redis lost its script cache (a
//! restart), so no load step is needed.
//!
//! Each script carries only the helpers it uses (`assemble`): Redis runs a
//! script's whole text on every call, and each `local function` left in
//! it is a closure made and collected per call, whether called or not.
//! A script may open with a lean head that answers its common case and
//! returns, ended by a line `--@helpers`: only the helpers the head uses
//! come before it, the others after it, so the common case never makes
//! the rest's closures.
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

/// The line that ends a script's lean head (see the module's doc).
const HELPERS_MARK: &str = "--@helpers\n";

/// `prelude`, then the top-level definitions of `libs` (in their order)
/// that `body` uses, directly or through another kept one, then `body`.
/// A definition is a line starting `local function name` or `local a, b =`
/// at the start of a line, up to the next one (the helper files hold
/// nothing else at top level); a name counts as used where it appears as a
/// word in code (not in a comment or a string). Over-keeping (a table
/// field of the same name) only costs a closure; a kept definition
/// always comes with all it names, so nothing used is ever left out.
/// A body with a lean head (up to a line `--@helpers`) gets the
/// definitions its head uses before the head, and the others the rest
/// uses between the head and the rest.
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
    let (head, rest) = match body.find(HELPERS_MARK) {
        Some(at) if at == 0 || body[..at].ends_with('\n') => {
            (&body[..at], &body[at + HELPERS_MARK.len()..])
        }
        _ => ("", body),
    };
    let mut kept = vec![false; defs.len()];
    let for_head = keep_used(&defs, &mut kept, words(head).collect());
    let for_rest = keep_used(&defs, &mut kept, words(rest).collect());
    let mut out = String::from(prelude);
    for (i, (_, text)) in defs.iter().enumerate() {
        if for_head[i] {
            out.push_str(text);
        }
    }
    out.push_str(head);
    for (i, (_, text)) in defs.iter().enumerate() {
        if for_rest[i] {
            out.push_str(text);
        }
    }
    out.push('\n');
    out.push_str(rest);
    out
}

/// Marks in `kept` the definitions `used` names, directly or through
/// another kept one, and returns those it newly kept (the ones kept
/// before are already defined, and what they name with them).
fn keep_used(
    defs: &[(Vec<String>, &str)],
    kept: &mut [bool],
    mut used: std::collections::HashSet<String>,
) -> Vec<bool> {
    let mut new = vec![false; defs.len()];
    loop {
        let mut grew = false;
        for (i, (names, text)) in defs.iter().enumerate() {
            if !kept[i] && names.iter().any(|n| used.contains(n)) {
                kept[i] = true;
                new[i] = true;
                used.extend(words(text));
                grew = true;
            }
        }
        if !grew {
            return new;
        }
    }
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

    /// The lean heads answer before `K` (common.lua's table of key names,
    /// made per call) is made: the helpers they use name `KEYS[n]`.
    #[test]
    fn the_lean_heads_answer_before_the_key_table_is_made() {
        for (libs, body, head_end) in [
            (
                &[COMMON, GCRA][..],
                include_str!("lua/status.lua"),
                "redis.call('ZCARD', waiting_key), pass, held + soldout}",
            ),
            (
                &[COMMON, GCRA, JOIN][..],
                include_str!("lua/enter.lua"),
                "v[1] and v[1] + 0 or 0, v[2] and 2 or 0}",
            ),
            (
                &[COMMON, GCRA, JOIN][..],
                include_str!("lua/enter_many.lua"),
                "redis.call('ZADD', waiting_key, unpack(line))",
            ),
        ] {
            let s = assemble("", libs, body);
            let head_ends = s
                .find(head_end)
                .unwrap_or_else(|| panic!("{head_end}:\n{s}"));
            let k = s.find("local K = {").expect("K is made after the head");
            assert!(k > head_ends, "K made before the head ends:\n{s}");
        }
    }

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
    fn a_lean_head_carries_only_its_own_helpers_before_it() {
        let s = assemble(
            "-- p\n",
            &[LIB],
            "local x = helper(1)\n--@helpers\nreturn used(x)",
        );
        let at = |needle: &str| s.find(needle).unwrap_or_else(|| panic!("{needle}:\n{s}"));
        assert!(at("local K =") < at("local function helper"));
        assert!(at("local function helper") < at("local x = helper(1)"));
        assert!(at("local x = helper(1)") < at("local function used"));
        assert!(at("local function used") < at("return used(x)"));
        assert_eq!(s.matches("local function helper").count(), 1, "{s}");
        assert!(!s.contains("--@helpers"), "{s}");
        assert!(!s.contains("local function unused"), "{s}");
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

    #[test]
    fn the_group_join_answers_new_buyers_before_the_join_helpers() {
        let s = assemble(
            "",
            &[COMMON, GCRA, JOIN],
            include_str!("lua/enter_many.lua"),
        );
        let at = |needle: &str| s.find(needle).unwrap_or_else(|| panic!("{needle}:\n{s}"));
        let head_ends = at("redis.call('ZADD', waiting_key, unpack(line))");
        assert!(at("local function mark_entry(") < head_ends);
        for helper in [
            "join",
            "group",
            "new_place",
            "flush",
            "group_known",
            "gcra",
            "join_config",
        ] {
            assert!(
                at(&format!("local function {helper}(")) > head_ends,
                "{helper}"
            );
        }
    }
}

/// Writes the join and poll scripts as Redis receives them (prelude and
/// helpers assembled) into `$WAITROOM_SCRIPTS_OUT`, for
/// `loadtest/lua-instructions.py`, which counts what a call of each costs
/// Redis in instructions.
#[cfg(test)]
mod written {
    #[test]
    #[ignore = "a tool: loadtest/lua-instructions.py runs it"]
    fn write_assembled_scripts() {
        let dir = std::env::var("WAITROOM_SCRIPTS_OUT").expect("WAITROOM_SCRIPTS_OUT: a directory");
        let prelude = super::Publishing {
            sharded: false,
            pass_in_script: true,
            audit_max_len: 100_000,
        }
        .prelude();
        std::fs::create_dir_all(&dir).unwrap();
        for (name, libs, body) in [
            (
                "status",
                &[super::COMMON, super::GCRA][..],
                include_str!("lua/status.lua"),
            ),
            (
                "enter",
                &[super::COMMON, super::GCRA, super::JOIN][..],
                include_str!("lua/enter.lua"),
            ),
            ("admit", &[super::COMMON][..], include_str!("lua/admit.lua")),
        ] {
            let text = super::assemble(&prelude, libs, body);
            std::fs::write(format!("{dir}/{name}.lua"), text).unwrap();
        }
    }
}
