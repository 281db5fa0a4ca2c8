//! The names of a queue's keys, and the `KEYS` layouts that more than one
//! call site sends: a script reads its keys by position, so a layout is
//! part of the script's contract (each `lua/*.lua` header lists it), and
//! one built twice can drift. Every key of a queue carries the `{queue}`
//! hash tag, so a script touches one cluster slot.

use crate::queue::{QueueName, UserId};

/// The names of one queue's keys.
pub(crate) struct QueueKeys {
    pub(super) base: String,
    pub(super) token_prefix: String,
    pub(super) channel: String,
}

impl QueueKeys {
    pub(crate) fn new(prefix: &str, queue: &QueueName) -> Self {
        let base = format!("{prefix}:{{{queue}}}:");
        Self {
            token_prefix: format!("{base}token:"),
            channel: format!("{base}events"),
            base,
        }
    }

    /// The names after the queue's base of its eight keys every script
    /// gets first (`KEYS[1..8]`, `lua/common.lua`).
    pub(super) const SCRIPT_KEYS: [&'static str; 8] = [
        "waiting", "seq", "entered", "seen", "active", "bucket", "pass", "paused",
    ];

    pub(super) fn script_keys(&self) -> [String; 8] {
        Self::SCRIPT_KEYS.map(|k| format!("{}{k}", self.base))
    }

    /// The last entry-time mark, beside the entry counter (`lua/common.lua`,
    /// `last_mark_key`, which names it from the counter's key).
    pub(super) fn last_mark(&self) -> String {
        format!("{}seq:mark", self.base)
    }

    /// The queue's admission turn (`lua/turn.lua`).
    pub(super) fn turn(&self) -> String {
        format!("{}turn", self.base)
    }

    /// The queue's settings hash (`lua/put_settings.lua`).
    pub(super) fn settings(&self) -> String {
        format!("{}settings", self.base)
    }

    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// The queue's audit log (a STREAM, `lua/common.lua`'s `audit`).
    pub(crate) fn audit(&self) -> String {
        format!("{}audit", self.base)
    }

    /// The queue's sessions: live ones by deadline, their records, each
    /// user's live one, and the ended log (`lua/session_*.lua`).
    pub(super) fn sessions(&self) -> [String; 4] {
        [
            "sessions",
            "sessions:info",
            "sessions:users",
            "sessions:ended",
        ]
        .map(|k| format!("{}{k}", self.base))
    }

    /// The queue's stock (`lua/stock.lua`).
    pub(super) fn stock(&self) -> String {
        format!("{}stock", self.base)
    }

    /// `user`'s request budget in this queue.
    pub(super) fn budget(&self, user: &UserId) -> String {
        format!("{}{user}", self.budget_prefix())
    }

    /// What [`QueueKeys::budget`] puts before the user id.
    pub(super) fn budget_prefix(&self) -> String {
        format!("{}budget:", self.base)
    }

    /// A client address's join rate and places in this queue.
    pub(super) fn address(&self, address: &str) -> [String; 2] {
        let prefix = self.address_prefix();
        [
            format!("{prefix}{address}:joins"),
            format!("{prefix}{address}:places"),
        ]
    }

    /// What [`QueueKeys::address`] puts before the address.
    pub(super) fn address_prefix(&self) -> String {
        format!("{}addr:", self.base)
    }

    /// The lottery hash, the pre-queue hash and the published list.
    pub(super) fn lottery(&self) -> [String; 3] {
        ["lottery", "lottery:pre", "lottery:list"].map(|k| format!("{}{k}", self.base))
    }

    /// A staged draw's line, presence, records, frozen entries that left,
    /// and list (`lua/lottery_begin.lua`).
    pub(super) fn lottery_stage(&self) -> [String; 5] {
        [
            "lottery:stage",
            "lottery:stage:seen",
            "lottery:stage:pre",
            "lottery:stage:left",
            "lottery:stage:list",
        ]
        .map(|k| format!("{}{k}", self.base))
    }

    /// Every key of the draw's steps, in their scripts' order.
    pub(super) fn lottery_draw(&self) -> Vec<String> {
        let mut keys = self.lottery().to_vec();
        keys.extend(self.lottery_stage());
        keys
    }

    /// The queue-wide keys a join reads after its user's (`join.lua`):
    /// the stock, the audit log, the lottery and its pre-queue (a join
    /// answers `prequeue` before a draw). `enter.lua` and
    /// `enter_many.lua` both end their `KEYS` with these.
    pub(super) fn join_tail(&self) -> [String; 4] {
        let [lot, pre, _] = self.lottery();
        [self.stock(), self.audit(), lot, pre]
    }

    /// `enter.lua`'s keys after the common ones and the user's token: the
    /// user's budget, [`QueueKeys::join_tail`], then, only for a join whose
    /// address has limits (`address`), the address's join rate and places.
    pub(super) fn enter(&self, user: &UserId, address: Option<&str>) -> Vec<String> {
        let mut keys = vec![self.budget(user)];
        keys.extend(self.join_tail());
        if let Some(address) = address {
            keys.extend(self.address(address));
        }
        keys
    }
}
