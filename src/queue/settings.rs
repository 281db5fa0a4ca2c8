//! A queue's live settings: how it admits (batch, interval, `maxActive`,
//! token TTL, abandonment), how long an order's claim lasts, and the texts
//! its page shows.
//!
//! They live in the store so an operator can change them mid-sale without
//! restarting anything; start-up flags only seed them for queues that have
//! none yet. The rules of what is a valid setting live here, next to
//! [`Policy`], so the admin API and the store agree on them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Policy;
use super::adaptive::AdaptiveSettings;

/// Most users admitted per pass (a typo of a few digits is refused).
pub const MAX_BATCH: u32 = 100_000;
/// Shortest and longest admission interval, in milliseconds.
pub const INTERVAL_MS: (u64, u64) = (1, 3_600_000);
/// Longest token TTL, abandonment and claim lease, in milliseconds (a day).
pub const MAX_DURATION_MS: u64 = 86_400_000;
/// Most token holders `maxActive` may allow (0 admits nobody).
pub const MAX_ACTIVE: u64 = 100_000_000;
/// Most page texts, and the longest key and value (characters).
pub const MAX_TEXTS: usize = 64;
pub const MAX_TEXT_KEY_CHARS: usize = 64;
pub const MAX_TEXT_CHARS: usize = 2_000;
/// The longest shop link (characters).
pub const MAX_SHOP_URL_CHARS: usize = 2_000;

/// Checks a shop link: an absolute `https://` (or `http://`) URL of
/// printable ASCII without spaces, quotes or angle brackets, whose only
/// braces are the placeholders the page fills in, URL-encoded: `{token}`
/// (the buyer's entry token) and `{queue}`. The page puts nothing else in
/// it, so a link can carry the token only where the operator put
/// `{token}`: best in the fragment (`#token={token}`), which the browser
/// never sends to a server nor in a `Referer`.
pub fn check_shop_url(url: &str) -> Result<(), String> {
    let bad = |m: &str| Err(format!("shopUrl: {m}"));
    if url.len() > MAX_SHOP_URL_CHARS {
        return bad(&format!("at most {MAX_SHOP_URL_CHARS} characters"));
    }
    let Some(rest) = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
    else {
        return bad("an absolute https:// or http:// URL");
    };
    let host_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if rest[..host_end].is_empty() || rest[..host_end].contains(['{', '}', '@']) {
        return bad("a host is needed (no placeholder or user info in it)");
    }
    if !url
        .bytes()
        .all(|b| b.is_ascii_graphic() && !b"\"'<>\\`".contains(&b))
    {
        return bad("printable ASCII without spaces, quotes or angle brackets");
    }
    let stripped = url.replace("{token}", "").replace("{queue}", "");
    if stripped.contains(['{', '}']) {
        return bad("the only placeholders are {token} and {queue}");
    }
    Ok(())
}

/// One queue's settings, as stored and as the admin API shows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueSettings {
    /// Users admitted per interval, across all instances together.
    pub batch: u32,
    /// Milliseconds between admission passes.
    pub interval_ms: u64,
    /// How long an entry token lives, in milliseconds.
    pub token_ttl_ms: u64,
    /// Most users holding a token at once; `null` is unlimited.
    pub max_active: Option<u64>,
    /// Waiting users not seen for this long are dropped; `null` never.
    pub abandon_after_ms: Option<u64>,
    /// How long an order's claim on a token lasts without a renewal.
    pub claim_lease_ms: u64,
    /// Texts of the queue's page (a message key of the page → the text
    /// shown instead, in every language), served with its branding.
    pub texts: BTreeMap<String, String>,
    /// Where a READY buyer is sent to buy when the order service lives
    /// elsewhere: an absolute `https://` URL whose `{token}` and `{queue}`
    /// the page fills in; absent: `--shop-url`, if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shop_url: Option<String>,
    /// Admission that follows the order service (`batch` is then set by
    /// the controller); absent: the batch stays as the operator set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveSettings>,
}

/// Every queue with its settings, in name order: an instance's view of
/// the live queues (`crate::catalog` keeps it).
pub type Queues = BTreeMap<super::QueueName, StoredSettings>;

/// Settings as read back from the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoredSettings {
    #[serde(flatten)]
    pub settings: QueueSettings,
    /// Bumped by every write (starts at 1).
    pub version: u64,
    /// When last written, store clock, ms since the epoch.
    pub updated_at: u64,
}

impl QueueSettings {
    /// Settings admitting under `policy`, with `claim_lease_ms` and no texts.
    pub fn from_policy(policy: &Policy, claim_lease_ms: u64) -> Self {
        Self {
            batch: policy.batch,
            interval_ms: policy.interval_ms,
            token_ttl_ms: policy.token_ttl_ms,
            max_active: policy.max_active,
            abandon_after_ms: policy.abandon_after_ms,
            claim_lease_ms,
            texts: BTreeMap::new(),
            shop_url: None,
            adaptive: None,
        }
    }

    /// The admission policy these settings give.
    pub fn policy(&self) -> Policy {
        Policy {
            batch: self.batch,
            interval_ms: self.interval_ms,
            token_ttl_ms: self.token_ttl_ms,
            max_active: self.max_active,
            abandon_after_ms: self.abandon_after_ms,
        }
    }

    /// Checks every field; the message names the first one that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(url) = &self.shop_url {
            check_shop_url(url)?;
        }
        if !(1..=MAX_BATCH).contains(&self.batch) {
            return Err(format!("batch: 1-{MAX_BATCH}"));
        }
        if !(INTERVAL_MS.0..=INTERVAL_MS.1).contains(&self.interval_ms) {
            return Err(format!("intervalMs: {}-{}", INTERVAL_MS.0, INTERVAL_MS.1));
        }
        let durations = [
            ("tokenTtlMs", Some(self.token_ttl_ms)),
            ("abandonAfterMs", self.abandon_after_ms),
            ("claimLeaseMs", Some(self.claim_lease_ms)),
        ];
        for (name, value) in durations {
            if value.is_some_and(|v| !(1_000..=MAX_DURATION_MS).contains(&v)) {
                return Err(format!("{name}: 1000-{MAX_DURATION_MS}"));
            }
        }
        if self.max_active.is_some_and(|m| m > MAX_ACTIVE) {
            return Err(format!("maxActive: 0-{MAX_ACTIVE} or null"));
        }
        if self.texts.len() > MAX_TEXTS {
            return Err(format!("texts: at most {MAX_TEXTS} entries"));
        }
        for (key, text) in &self.texts {
            let key_ok = (1..=MAX_TEXT_KEY_CHARS).contains(&key.len())
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
            if !key_ok {
                return Err(format!(
                    "texts: keys are 1-{MAX_TEXT_KEY_CHARS} of A-Z a-z 0-9 _ . -"
                ));
            }
            if text.chars().count() > MAX_TEXT_CHARS || text.chars().any(|c| c.is_control()) {
                return Err(format!(
                    "texts.{key}: at most {MAX_TEXT_CHARS} characters, no control characters"
                ));
            }
        }
        if let Some(adaptive) = &self.adaptive {
            adaptive.validate(self.interval_ms)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> QueueSettings {
        QueueSettings {
            batch: 10,
            interval_ms: 1000,
            token_ttl_ms: 60_000,
            max_active: Some(5),
            abandon_after_ms: None,
            claim_lease_ms: 30_000,
            texts: BTreeMap::new(),
            shop_url: None,
            adaptive: None,
        }
    }

    #[test]
    fn shop_links_are_absolute_with_known_placeholders_only() {
        for ok in [
            "https://shop.example/buy#token={token}&queue={queue}",
            "http://127.0.0.1:9000/checkout?q={queue}",
            "https://shop.example",
        ] {
            check_shop_url(ok).unwrap();
        }
        for bad in [
            "",
            "shop.example/buy",
            "javascript:alert(1)",
            "https://",
            "https://{token}.example/",
            "https://user@evil.example/",
            "https://shop.example/a b",
            "https://shop.example/\"x",
            "https://shop.example/<x>",
            "https://shop.example/#{user}",
            "https://shop.example/é",
        ] {
            assert!(check_shop_url(bad).is_err(), "{bad:?}");
        }
        assert!(check_shop_url(&format!("https://a.example/{}", "x".repeat(2_000))).is_err());
    }

    #[test]
    fn settings_refuse_out_of_range_values_naming_the_field() {
        base().validate().unwrap();
        type Change = fn(&mut QueueSettings);
        let cases: Vec<(Change, &str)> = vec![
            (|s| s.batch = 0, "batch"),
            (|s| s.batch = MAX_BATCH + 1, "batch"),
            (|s| s.interval_ms = 0, "intervalMs"),
            (|s| s.interval_ms = u64::MAX, "intervalMs"),
            (|s| s.token_ttl_ms = 999, "tokenTtlMs"),
            (|s| s.abandon_after_ms = Some(0), "abandonAfterMs"),
            (|s| s.claim_lease_ms = MAX_DURATION_MS + 1, "claimLeaseMs"),
            (|s| s.max_active = Some(MAX_ACTIVE + 1), "maxActive"),
            (|s| s.shop_url = Some("ftp://x".into()), "shopUrl"),
            (
                |s| {
                    s.texts.insert("bad key".into(), "x".into());
                },
                "texts",
            ),
            (
                |s| {
                    s.texts.insert("title".into(), "a\nb".into());
                },
                "texts.title",
            ),
        ];
        for (change, field) in cases {
            let mut s = base();
            change(&mut s);
            let message = s.validate().unwrap_err();
            assert!(message.starts_with(field), "{message} should name {field}");
        }
    }

    #[test]
    fn settings_round_trip_through_a_policy() {
        let s = base();
        let p = s.policy();
        assert_eq!(QueueSettings::from_policy(&p, 30_000), s);
    }
}
