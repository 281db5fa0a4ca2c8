//! Admission that follows the order service: an AIMD rule (additive
//! increase, multiplicative decrease) over what orders took from claim to
//! commit, and how many rolled back, window by window.
//!
//! Why here: the rule is pure arithmetic, so it is tested on its own and
//! every store applies the same one. The store only counts samples per
//! window and keeps one decision per window across instances; this module
//! says what the decision is. A healthy window earns `stepPerSec` more; a
//! window whose p95 commit time is over the target, or whose rollbacks are
//! too many, multiplies the rate by `factor`; after a decrease the rate is
//! held for `holdWindows`, so the effect of a cut is seen before the next
//! one (no oscillation from a queue of orders that were admitted earlier).

use serde::{Deserialize, Serialize};

/// Upper bounds (ms) of the commit-time histogram's buckets; the last
/// bucket holds everything slower. A p95 is reported as its bucket's upper
/// bound, which errs on the slow side (the safe side for a target).
pub const BUCKETS_MS: [u64; 20] = [
    5, 10, 20, 35, 50, 75, 100, 150, 200, 300, 500, 750, 1_000, 1_500, 2_000, 3_000, 5_000, 10_000,
    30_000, 60_000,
];

/// Shortest and longest window, ms.
pub const WINDOW_MS: (u64, u64) = (100, 600_000);
/// Highest ceiling, admissions per second.
pub const MAX_RATE_PER_SEC: f64 = 100_000.0;

/// A queue's adaptive admission settings (`adaptive` in its settings).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdaptiveSettings {
    /// Off keeps the rate where it is and records nothing.
    pub enabled: bool,
    /// The lowest rate it cuts to, admissions per second.
    pub floor_per_sec: f64,
    /// The highest rate it climbs to, admissions per second.
    pub ceiling_per_sec: f64,
    /// The p95 claim-to-commit time to stay under, ms.
    pub target_p95_ms: u64,
    /// Added per healthy window, admissions per second.
    #[serde(default = "default_step")]
    pub step_per_sec: f64,
    /// The rate is multiplied by this after an unhealthy window (0-1).
    #[serde(default = "default_factor")]
    pub factor: f64,
    /// Length of one window, ms.
    #[serde(default = "default_window")]
    pub window_ms: u64,
    /// Fewer orders than this in a window: no change.
    #[serde(default = "default_min_samples")]
    pub min_samples: u64,
    /// Rollbacks over this share of a window's orders count as unhealthy.
    #[serde(default = "default_failure_ratio")]
    pub max_failure_ratio: f64,
    /// Windows without an increase after a decrease.
    #[serde(default = "default_hold")]
    pub hold_windows: u64,
}

/// Validated settings hold no NaN, so equality is total: settings compare
/// whole (the catalog notices a change by comparing them).
impl Eq for AdaptiveSettings {}

fn default_step() -> f64 {
    1.0
}
fn default_factor() -> f64 {
    0.7
}
fn default_window() -> u64 {
    5_000
}
fn default_min_samples() -> u64 {
    10
}
fn default_failure_ratio() -> f64 {
    0.2
}
fn default_hold() -> u64 {
    1
}

impl AdaptiveSettings {
    /// On, with the documented defaults: 1-100 per second, p95 under a
    /// second, 5 s windows.
    pub fn recommended() -> Self {
        Self {
            enabled: true,
            floor_per_sec: 1.0,
            ceiling_per_sec: 100.0,
            target_p95_ms: 1_000,
            step_per_sec: default_step(),
            factor: default_factor(),
            window_ms: default_window(),
            min_samples: default_min_samples(),
            max_failure_ratio: default_failure_ratio(),
            hold_windows: default_hold(),
        }
    }

    /// Checks every field (and that the floor admits at least one buyer per
    /// pass of `interval_ms`); the message names the first one that is wrong.
    pub fn validate(&self, interval_ms: u64) -> Result<(), String> {
        let finite = |v: f64| v.is_finite();
        if !finite(self.floor_per_sec) || self.floor_per_sec <= 0.0 {
            return Err("adaptive.floorPerSec: more than 0".into());
        }
        let per_pass = self.floor_per_sec * interval_ms as f64 / 1000.0;
        if per_pass < 1.0 - 1e-9 {
            return Err(format!(
                "adaptive.floorPerSec: at least one per pass ({} at intervalMs {interval_ms})",
                1000.0 / interval_ms as f64
            ));
        }
        if !finite(self.ceiling_per_sec)
            || self.ceiling_per_sec < self.floor_per_sec
            || self.ceiling_per_sec > MAX_RATE_PER_SEC
        {
            return Err(format!(
                "adaptive.ceilingPerSec: floorPerSec-{MAX_RATE_PER_SEC}"
            ));
        }
        if !(1..=600_000).contains(&self.target_p95_ms) {
            return Err("adaptive.targetP95Ms: 1-600000".into());
        }
        if !finite(self.step_per_sec) || self.step_per_sec <= 0.0 {
            return Err("adaptive.stepPerSec: more than 0".into());
        }
        if !finite(self.factor) || self.factor <= 0.0 || self.factor >= 1.0 {
            return Err("adaptive.factor: between 0 and 1, exclusive".into());
        }
        if !(WINDOW_MS.0..=WINDOW_MS.1).contains(&self.window_ms) {
            return Err(format!(
                "adaptive.windowMs: {}-{}",
                WINDOW_MS.0, WINDOW_MS.1
            ));
        }
        if !(1..=1_000_000).contains(&self.min_samples) {
            return Err("adaptive.minSamples: 1-1000000".into());
        }
        if !finite(self.max_failure_ratio) || !(0.0..=1.0).contains(&self.max_failure_ratio) {
            return Err("adaptive.maxFailureRatio: 0-1".into());
        }
        if self.hold_windows > 100 {
            return Err("adaptive.holdWindows: 0-100".into());
        }
        Ok(())
    }
}

/// The bucket of a commit that took `ms`.
pub fn bucket_of(ms: u64) -> usize {
    BUCKETS_MS
        .iter()
        .position(|&b| ms <= b)
        .unwrap_or(BUCKETS_MS.len())
}

/// What one window saw, summed over every instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowSamples {
    /// Commits per bucket of [`BUCKETS_MS`] (one more for the slowest).
    pub buckets: Vec<u64>,
    /// Orders rolled back (released after a claim).
    pub failures: u64,
}

impl WindowSamples {
    /// Commits seen.
    pub fn commits(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The p95 commit time (its bucket's upper bound), `None` without commits.
    pub fn p95_ms(&self) -> Option<u64> {
        let n = self.commits();
        if n == 0 {
            return None;
        }
        // The smallest bucket holding at least 95 % of the commits.
        let need = (n * 95).div_ceil(100);
        let mut seen = 0;
        for (i, count) in self.buckets.iter().enumerate() {
            seen += count;
            if seen >= need {
                return Some(BUCKETS_MS.get(i).copied().unwrap_or(2 * BUCKETS_MS[19]));
            }
        }
        None
    }
}

/// Why the rate changed or did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Healthy: one step up (or already at the ceiling).
    Increase,
    /// p95 over the target: cut.
    DecreaseSlow,
    /// Too many rollbacks: cut.
    DecreaseFailing,
    /// Healthy, but held after a recent cut.
    Hold,
    /// Too few orders to judge: unchanged.
    TooFewSamples,
}

impl Verdict {
    /// The label of metrics and the admin JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Increase => "increase",
            Self::DecreaseSlow => "decrease_slow",
            Self::DecreaseFailing => "decrease_failing",
            Self::Hold => "hold",
            Self::TooFewSamples => "too_few_samples",
        }
    }

    /// Parses [`Verdict::as_str`].
    pub fn parse(raw: &str) -> Option<Self> {
        [
            Self::Increase,
            Self::DecreaseSlow,
            Self::DecreaseFailing,
            Self::Hold,
            Self::TooFewSamples,
        ]
        .into_iter()
        .find(|v| v.as_str() == raw)
    }
}

/// One window's decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The rate from now on, admissions per second (within floor-ceiling).
    pub rate_per_sec: f64,
    /// Why.
    pub verdict: Verdict,
    /// The last window in which increases are held (inclusive).
    pub hold_until: u64,
}

/// The rule: decides window `window`'s outcome from its `samples`, the
/// rate in force `rate_per_sec` and the hold left by an earlier cut.
pub fn decide(
    s: &AdaptiveSettings,
    window: u64,
    rate_per_sec: f64,
    hold_until: u64,
    samples: &WindowSamples,
) -> Decision {
    let clamp = |r: f64| r.clamp(s.floor_per_sec, s.ceiling_per_sec);
    let commits = samples.commits();
    let total = commits + samples.failures;
    let keep = |verdict| Decision {
        rate_per_sec: clamp(rate_per_sec),
        verdict,
        hold_until,
    };
    if total < s.min_samples {
        return keep(Verdict::TooFewSamples);
    }
    let failing = samples.failures as f64 > s.max_failure_ratio * total as f64;
    let slow = samples.p95_ms().is_some_and(|p| p > s.target_p95_ms);
    if failing || slow {
        return Decision {
            rate_per_sec: clamp(rate_per_sec * s.factor),
            verdict: if slow {
                Verdict::DecreaseSlow
            } else {
                Verdict::DecreaseFailing
            },
            hold_until: window + s.hold_windows,
        };
    }
    if window <= hold_until {
        return keep(Verdict::Hold);
    }
    Decision {
        rate_per_sec: clamp(rate_per_sec + s.step_per_sec),
        verdict: Verdict::Increase,
        hold_until,
    }
}

/// The batch per pass of `interval_ms` that admits `rate_per_sec` (at least 1).
pub fn batch_for(rate_per_sec: f64, interval_ms: u64) -> u32 {
    let per_pass = (rate_per_sec * interval_ms as f64 / 1000.0).round();
    per_pass.clamp(1.0, f64::from(super::settings::MAX_BATCH)) as u32
}

/// The rate a batch per pass of `interval_ms` admits, per second.
pub fn rate_of(batch: u32, interval_ms: u64) -> f64 {
    f64::from(batch) * 1000.0 / interval_ms.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> AdaptiveSettings {
        AdaptiveSettings {
            enabled: true,
            floor_per_sec: 2.0,
            ceiling_per_sec: 20.0,
            target_p95_ms: 200,
            step_per_sec: 1.0,
            factor: 0.5,
            window_ms: 1000,
            min_samples: 10,
            max_failure_ratio: 0.2,
            hold_windows: 1,
        }
    }

    fn commits(ms: u64, n: u64) -> WindowSamples {
        let mut buckets = vec![0; BUCKETS_MS.len() + 1];
        buckets[bucket_of(ms)] = n;
        WindowSamples {
            buckets,
            failures: 0,
        }
    }

    #[test]
    fn a_healthy_window_adds_a_step_up_to_the_ceiling() {
        let s = settings();
        let d = decide(&s, 10, 5.0, 0, &commits(50, 20));
        assert_eq!((d.rate_per_sec, d.verdict), (6.0, Verdict::Increase));
        let d = decide(&s, 10, 19.5, 0, &commits(50, 20));
        assert_eq!(d.rate_per_sec, 20.0);
    }

    #[test]
    fn a_slow_window_cuts_by_the_factor_down_to_the_floor_and_holds() {
        let s = settings();
        let d = decide(&s, 10, 10.0, 0, &commits(500, 20));
        assert_eq!((d.rate_per_sec, d.verdict), (5.0, Verdict::DecreaseSlow));
        assert_eq!(d.hold_until, 11);
        let d = decide(&s, 11, 3.0, 11, &commits(500, 20));
        assert_eq!(d.rate_per_sec, 2.0, "never below the floor");
        // Healthy again, but within the hold: unchanged.
        let d = decide(&s, 11, 5.0, 11, &commits(50, 20));
        assert_eq!((d.rate_per_sec, d.verdict), (5.0, Verdict::Hold));
        let d = decide(&s, 12, 5.0, 11, &commits(50, 20));
        assert_eq!((d.rate_per_sec, d.verdict), (6.0, Verdict::Increase));
    }

    #[test]
    fn too_few_samples_change_nothing() {
        let s = settings();
        let d = decide(&s, 10, 7.0, 0, &commits(5_000, 9));
        assert_eq!((d.rate_per_sec, d.verdict), (7.0, Verdict::TooFewSamples));
        let d = decide(&s, 10, 7.0, 0, &WindowSamples::default());
        assert_eq!(d.verdict, Verdict::TooFewSamples);
    }

    #[test]
    fn rollbacks_over_the_ratio_cut_even_when_commits_are_fast() {
        let s = settings();
        let mut w = commits(20, 10);
        w.failures = 3; // 3 of 13 > 20 %
        let d = decide(&s, 10, 10.0, 0, &w);
        assert_eq!((d.rate_per_sec, d.verdict), (5.0, Verdict::DecreaseFailing));
        w.failures = 2; // 2 of 12 <= 20 %
        assert_eq!(decide(&s, 10, 10.0, 0, &w).verdict, Verdict::Increase);
        // Failures alone count as samples.
        let only = WindowSamples {
            buckets: vec![],
            failures: 10,
        };
        assert_eq!(
            decide(&s, 10, 10.0, 0, &only).verdict,
            Verdict::DecreaseFailing
        );
    }

    #[test]
    fn p95_is_the_bucket_holding_the_95th_percentile() {
        let mut w = commits(10, 95);
        w.buckets[bucket_of(900)] = 5;
        assert_eq!(w.p95_ms(), Some(10));
        w.buckets[bucket_of(900)] = 6;
        assert_eq!(w.p95_ms(), Some(1_000));
        assert_eq!(WindowSamples::default().p95_ms(), None);
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(5), 0);
        assert_eq!(bucket_of(6), 1);
        assert_eq!(bucket_of(u64::MAX), BUCKETS_MS.len());
        assert_eq!(commits(u64::MAX, 1).p95_ms(), Some(120_000));
    }

    #[test]
    fn rate_and_batch_convert_per_interval() {
        assert_eq!(batch_for(10.0, 500), 5);
        assert_eq!(batch_for(0.1, 100), 1);
        assert_eq!(batch_for(1e12, 1000), super::super::settings::MAX_BATCH);
        assert_eq!(rate_of(5, 500), 10.0);
    }

    #[test]
    fn bad_settings_name_their_field() {
        settings().validate(1000).unwrap();
        type Change = fn(&mut AdaptiveSettings);
        let cases: Vec<(Change, &str)> = vec![
            (|s| s.floor_per_sec = 0.0, "adaptive.floorPerSec"),
            (|s| s.floor_per_sec = f64::NAN, "adaptive.floorPerSec"),
            (|s| s.floor_per_sec = 0.5, "adaptive.floorPerSec"),
            (|s| s.ceiling_per_sec = 1.0, "adaptive.ceilingPerSec"),
            (
                |s| s.ceiling_per_sec = f64::INFINITY,
                "adaptive.ceilingPerSec",
            ),
            (|s| s.target_p95_ms = 0, "adaptive.targetP95Ms"),
            (|s| s.step_per_sec = -1.0, "adaptive.stepPerSec"),
            (|s| s.factor = 1.0, "adaptive.factor"),
            (|s| s.factor = 0.0, "adaptive.factor"),
            (|s| s.window_ms = 10, "adaptive.windowMs"),
            (|s| s.min_samples = 0, "adaptive.minSamples"),
            (|s| s.max_failure_ratio = 1.5, "adaptive.maxFailureRatio"),
            (|s| s.hold_windows = 1_000, "adaptive.holdWindows"),
        ];
        for (change, field) in cases {
            let mut s = settings();
            change(&mut s);
            let message = s.validate(1000).unwrap_err();
            assert!(message.starts_with(field), "{message} should name {field}");
        }
    }
}
