//! The Lua scripts, each prefixed with `common.lua` (Redis scripts cannot
//! include one another), those that keep request rates with `gcra.lua`,
//! and those that put users in line with `join.lua`. `Script` sends
//! `EVALSHA` and falls back to `EVAL` when Redis lost its script cache (a
//! restart), so no load step is needed.
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
}

impl Scripts {
    pub(super) fn load(publishing: Publishing) -> Self {
        let prelude = publishing.prelude();
        let with_common = |body: &str| Script::new(&format!("{prelude}{COMMON}\n{body}"));
        // A script that keeps request rates: `gcra.lua` after `common.lua`.
        let with_rates = |body: &str| Script::new(&format!("{prelude}{COMMON}\n{GCRA}\n{body}"));
        // A script that puts users in line: `join.lua` after the rates.
        let with_join = |body: &str| with_rates(&format!("{JOIN}\n{body}"));
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
            spend: Script::new(&format!("{GCRA}\n{}", include_str!("lua/spend.lua"))),
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
        }
    }
}
