//! A knob that makes the demo order service slow or failing on purpose:
//! every order waits `delayMs` inside its claim (before its transaction)
//! and a share `failRatio` of them rolls back with `503`.
//!
//! Why: adaptive admission follows the order service's health as waitroom
//! sees it; an operator (or a test, or `loadtest/adaptive.sh`) can make the
//! demo service unhealthy and watch the rate fall, then restore it and
//! watch the rate climb back. Per instance, in memory: off after a restart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Longest delay the knob accepts, ms.
pub const MAX_DELAY_MS: u64 = 60_000;

/// The knob's setting, as the admin API reads and writes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SlowdownSetting {
    /// Added to every order inside its claim, ms (0-60,000).
    #[serde(default)]
    pub delay_ms: u64,
    /// Share of orders rolled back with `503` (0-1).
    #[serde(default)]
    pub fail_ratio: f64,
}

impl SlowdownSetting {
    /// Checks both fields; the message names the one that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.delay_ms > MAX_DELAY_MS {
            return Err(format!("delayMs: 0-{MAX_DELAY_MS}"));
        }
        if !self.fail_ratio.is_finite() || !(0.0..=1.0).contains(&self.fail_ratio) {
            return Err("failRatio: 0-1".into());
        }
        Ok(())
    }
}

/// The live knob, shared by every clone of the order store.
#[derive(Debug, Default)]
pub struct Slowdown {
    delay_ms: AtomicU64,
    /// `failRatio` in millionths, so it fits an atomic.
    fail_ppm: AtomicU64,
}

impl Slowdown {
    /// Sets the knob (already validated).
    pub fn set(&self, s: SlowdownSetting) {
        self.delay_ms.store(s.delay_ms, Ordering::Relaxed);
        self.fail_ppm
            .store((s.fail_ratio * 1e6).round() as u64, Ordering::Relaxed);
    }

    /// The knob now.
    pub fn get(&self) -> SlowdownSetting {
        SlowdownSetting {
            delay_ms: self.delay_ms.load(Ordering::Relaxed),
            fail_ratio: self.fail_ppm.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }

    /// Applies the knob to one order: waits the delay, then answers true
    /// when this order is to fail.
    pub async fn apply(&self) -> bool {
        let s = self.get();
        if s.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(s.delay_ms)).await;
        }
        let ppm = self.fail_ppm.load(Ordering::Relaxed);
        ppm > 0 && rand::random_range(0..1_000_000u64) < ppm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_name_their_field() {
        let ok = SlowdownSetting {
            delay_ms: 100,
            fail_ratio: 0.5,
        };
        ok.validate().unwrap();
        let long = SlowdownSetting {
            delay_ms: MAX_DELAY_MS + 1,
            ..ok
        };
        assert!(long.validate().unwrap_err().starts_with("delayMs"));
        for bad in [-0.1, 1.5, f64::NAN] {
            let s = SlowdownSetting {
                fail_ratio: bad,
                ..ok
            };
            assert!(s.validate().unwrap_err().starts_with("failRatio"));
        }
    }

    #[tokio::test]
    async fn all_fail_at_one_none_at_zero() {
        let k = Slowdown::default();
        k.set(SlowdownSetting {
            delay_ms: 0,
            fail_ratio: 1.0,
        });
        assert!(k.apply().await);
        k.set(SlowdownSetting::default());
        assert!(!k.apply().await);
        assert_eq!(k.get(), SlowdownSetting::default());
    }
}
