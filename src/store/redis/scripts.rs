//! The Lua scripts, each prefixed with `common.lua` (Redis scripts cannot
//! include one another), and those that keep request rates with `gcra.lua`. `Script` sends `EVALSHA` and falls back to `EVAL`
//! when Redis lost its script cache (a restart), so no load step is needed.

use redis::Script;

const COMMON: &str = include_str!("lua/common.lua");
const GCRA: &str = include_str!("lua/gcra.lua");

fn with_common(body: &str) -> Script {
    Script::new(&format!("{COMMON}\n{body}"))
}

/// A script that keeps request rates: `common.lua` and `gcra.lua` first.
fn with_rates(body: &str) -> Script {
    Script::new(&format!("{COMMON}\n{GCRA}\n{body}"))
}

/// Every script the adapter runs.
pub(super) struct Scripts {
    pub enter: Script,
    pub status: Script,
    pub statuses: Script,
    pub touch: Script,
    pub leave: Script,
    pub admit: Script,
    pub claim: Script,
    pub consume: Script,
    pub release: Script,
    pub stats: Script,
    pub pause: Script,
    pub renew_claim: Script,
    pub spend: Script,
}

impl Scripts {
    pub(super) fn load() -> Self {
        Self {
            enter: with_rates(include_str!("lua/enter.lua")),
            status: with_rates(include_str!("lua/status.lua")),
            statuses: with_common(include_str!("lua/statuses.lua")),
            touch: with_common(include_str!("lua/touch.lua")),
            leave: with_common(include_str!("lua/leave.lua")),
            admit: with_common(include_str!("lua/admit.lua")),
            claim: with_common(include_str!("lua/claim.lua")),
            consume: with_common(include_str!("lua/consume.lua")),
            release: with_common(include_str!("lua/release.lua")),
            stats: with_common(include_str!("lua/stats.lua")),
            pause: with_common(include_str!("lua/pause.lua")),
            renew_claim: with_common(include_str!("lua/renew_claim.lua")),
            spend: Script::new(&format!("{GCRA}\n{}", include_str!("lua/spend.lua"))),
        }
    }
}
