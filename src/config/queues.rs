//! `[queues.<name>]`: per-queue overrides of the `[admission]` settings.
//!
//! A queue is seeded in the store with these settings only when the store
//! does not know it (at start-up, or after the store lost its data), as
//! the flags always have: from then on the store's settings win and are
//! changed live through the admin API. A table must name a queue of
//! `admission.queues`, so a typo in a name is refused rather than ignored.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Config, ConfigError};
use crate::queue::{AdaptiveSettings, QueueName, QueueSettings};

/// One queue's overrides; every key is optional and named as in
/// `[admission]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueOverrides {
    pub batch: Option<u32>,
    pub interval_ms: Option<u64>,
    pub token_ttl_secs: Option<u64>,
    pub max_active: Option<u64>,
    /// 0: never drop.
    pub abandon_after_secs: Option<u64>,
    pub claim_lease_secs: Option<u64>,
    /// The queue's `shopUrl` (see `[orders] shop_url`).
    pub shop_url: Option<String>,
    /// Texts of the queue's page (message key → text).
    pub texts: Option<BTreeMap<String, String>>,
    pub adaptive: Option<AdaptiveOverrides>,
    /// The queue's session idle time (`pass.session_idle_secs`). Not a
    /// stored setting: passes are the configuration's, so it holds from
    /// every start (`sessions.rs`), never seeded into the store.
    pub session_idle_secs: Option<u64>,
    /// The queue's longest session (`pass.session_max_secs`), as above.
    pub session_max_secs: Option<u64>,
}

/// `[queues.<name>.adaptive]`, named as in `[admission.adaptive]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveOverrides {
    /// Unset: on (the table asks for adaptive admission).
    pub enabled: Option<bool>,
    pub floor: Option<f64>,
    pub ceiling: Option<f64>,
    pub target_p95_ms: Option<u64>,
    pub window_ms: Option<u64>,
}

/// The keys a `[queues.<name>]` table takes, with what each does (for the
/// generated documentation and `waitroom init`).
pub const QUEUE_KEYS: &[(&str, &str)] = &[
    ("batch", "users admitted per interval (`admission.batch`)"),
    (
        "interval_ms",
        "ms between admission passes (`admission.interval_ms`)",
    ),
    (
        "token_ttl_secs",
        "entry token life (`admission.token_ttl_secs`)",
    ),
    (
        "max_active",
        "most token holders at once (`admission.max_active`)",
    ),
    (
        "abandon_after_secs",
        "drop waiting users unseen this long, 0: never (`admission.abandon_after_secs`)",
    ),
    (
        "claim_lease_secs",
        "how long an order may hold a token (`admission.claim_lease_secs`)",
    ),
    (
        "shop_url",
        "the queue's `shopUrl` (`orders.shop_url` for every queue)",
    ),
    ("texts", "a table of the page's texts: message key → text"),
    (
        "adaptive",
        "a table: `enabled` (default true), `floor`, `ceiling`, `target_p95_ms`, `window_ms` (`[admission.adaptive]`)",
    ),
    (
        "session_idle_secs",
        "the queue's pass session idle time (`pass.session_idle_secs`); read at every start, not seeded into the store",
    ),
    (
        "session_max_secs",
        "the queue's longest pass session (`pass.session_max_secs`); read at every start, not seeded into the store",
    ),
];

impl QueueOverrides {
    /// `base` with these overrides applied; `config` gives the adaptive
    /// defaults when the base has none. (The session times are not
    /// queue settings: `Config::session_policy` reads them.)
    pub fn apply(&self, mut s: QueueSettings, config: &Config) -> QueueSettings {
        if let Some(v) = self.batch {
            s.batch = v;
        }
        if let Some(v) = self.interval_ms {
            s.interval_ms = v;
        }
        if let Some(v) = self.token_ttl_secs {
            s.token_ttl_ms = v.saturating_mul(1000);
        }
        if let Some(v) = self.max_active {
            s.max_active = Some(v);
        }
        if let Some(v) = self.abandon_after_secs {
            s.abandon_after_ms = (v > 0).then_some(v.saturating_mul(1000));
        }
        if let Some(v) = self.claim_lease_secs {
            s.claim_lease_ms = v.saturating_mul(1000);
        }
        if let Some(v) = &self.shop_url {
            s.shop_url = Some(v.clone());
        }
        if let Some(v) = &self.texts {
            s.texts = v.clone();
        }
        if let Some(a) = &self.adaptive {
            let mut settings = s.adaptive.clone().unwrap_or_else(|| AdaptiveSettings {
                enabled: true,
                floor_per_sec: config.adaptive_floor,
                ceiling_per_sec: config.adaptive_ceiling,
                target_p95_ms: config.adaptive_target_p95_ms,
                window_ms: config.adaptive_window_ms,
                ..AdaptiveSettings::recommended()
            });
            settings.enabled = a.enabled.unwrap_or(true);
            if let Some(v) = a.floor {
                settings.floor_per_sec = v;
            }
            if let Some(v) = a.ceiling {
                settings.ceiling_per_sec = v;
            }
            if let Some(v) = a.target_p95_ms {
                settings.target_p95_ms = v;
            }
            if let Some(v) = a.window_ms {
                settings.window_ms = v;
            }
            s.adaptive = settings.enabled.then_some(settings);
        }
        s
    }
}

impl Config {
    /// The settings every queue without overrides is seeded with: the
    /// admission flags (or their keys in `[admission]`).
    pub fn seed_defaults(&self) -> QueueSettings {
        QueueSettings {
            adaptive: self.adaptive_settings(),
            ..QueueSettings::from_policy(&self.policy(), self.claim_lease_secs * 1000)
        }
    }

    /// Each configured queue with the settings it is seeded with (the
    /// defaults and its `[queues.<name>]` overrides), validated; an
    /// override of a queue that is not configured is refused.
    pub fn seed_settings(&self) -> Result<Vec<(QueueName, QueueSettings)>, ConfigError> {
        let names = self.queue_names()?;
        for (name, _) in &self.queue_overrides {
            if !names.contains(name) {
                return Err(ConfigError(format!(
                    "queues.{name}: not a configured queue (add it to admission.queues / --queues)"
                )));
            }
        }
        let defaults = self.seed_defaults();
        names
            .into_iter()
            .map(|name| {
                let overrides = self.queue_overrides.iter().find(|(n, _)| *n == name);
                let settings = match overrides {
                    Some((_, o)) => {
                        let s = o.apply(defaults.clone(), self);
                        s.validate()
                            .map_err(|m| ConfigError(format!("queues.{name}: {m}")))?;
                        s
                    }
                    None => defaults.clone(),
                };
                Ok((name, settings))
            })
            .collect()
    }
}
