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
//!
//! A decision needs `minSamples` orders. A window with fewer does not
//! decide: its orders stay as evidence and the next window's are added,
//! up to [`MAX_EVIDENCE_WINDOWS`] windows; then the rule judges what that
//! stretch saw (a healthy few earn a step, an unhealthy few a cut, none at
//! all change nothing). Without the stretch a cut to the floor could be
//! final: at one admission a second a 5-s window holds at most five
//! orders, so a rule that wanted ten would never decide, nor climb, again.
//! [`AdaptiveSettings::validate`] refuses settings whose floor cannot
//! gather `minSamples` orders within the stretch, so a decision is always
//! within reach while buyers order.

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
/// Most windows one decision's evidence spans: long enough that the floor
/// of any accepted settings gathers `minSamples`, short enough that a
/// decision on few orders still comes within a bounded time.
pub const MAX_EVIDENCE_WINDOWS: u64 = 8;

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
        // What the floor admits over the longest evidence: fewer than
        // minSamples and no decision is ever reached there on samples.
        let at_floor =
            self.floor_per_sec * self.window_ms as f64 / 1000.0 * MAX_EVIDENCE_WINDOWS as f64;
        if (self.min_samples as f64) > at_floor + 1e-9 {
            return Err(format!(
                "adaptive.minSamples: at most {} (floorPerSec {} x windowMs {} x {MAX_EVIDENCE_WINDOWS} windows / 1000): \
                 at the floor fewer orders than that are all a decision can gather",
                at_floor.floor(),
                self.floor_per_sec,
                self.window_ms
            ));
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

/// What one window (or a stretch of windows) saw, summed over every
/// instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowSamples {
    /// Commits per bucket of [`BUCKETS_MS`] (one more for the slowest).
    pub buckets: Vec<u64>,
    /// Orders rolled back (released after a claim).
    pub failures: u64,
}

impl WindowSamples {
    /// Nothing seen, with every bucket present.
    pub fn empty() -> Self {
        Self {
            buckets: vec![0; BUCKETS_MS.len() + 1],
            failures: 0,
        }
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &WindowSamples) {
        if self.buckets.len() < other.buckets.len() {
            self.buckets.resize(other.buckets.len(), 0);
        }
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            *mine += theirs;
        }
        self.failures += other.failures;
    }

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
    /// Too few orders to judge: unchanged (still gathering, or nothing
    /// seen over the longest evidence).
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
    /// The first window whose orders count toward the next decision: the
    /// one after `window` once decided, unchanged while still gathering.
    pub evidence_from: u64,
}

/// The rule: decides at the end of window `window` from `samples`, what
/// windows `evidence_from..=window` saw together, the rate in force
/// `rate_per_sec` and the hold left by an earlier cut.
pub fn decide(
    s: &AdaptiveSettings,
    window: u64,
    evidence_from: u64,
    rate_per_sec: f64,
    hold_until: u64,
    samples: &WindowSamples,
) -> Decision {
    let clamp = |r: f64| r.clamp(s.floor_per_sec, s.ceiling_per_sec);
    let total = samples.commits() + samples.failures;
    let spanned = window + 1 - evidence_from.min(window);
    let decided = |rate: f64, verdict, hold_until| Decision {
        rate_per_sec: clamp(rate),
        verdict,
        hold_until,
        evidence_from: window + 1,
    };
    if total < s.min_samples {
        if spanned < MAX_EVIDENCE_WINDOWS {
            return Decision {
                evidence_from: evidence_from.min(window),
                ..decided(rate_per_sec, Verdict::TooFewSamples, hold_until)
            };
        }
        if total == 0 {
            return decided(rate_per_sec, Verdict::TooFewSamples, hold_until);
        }
        // The longest evidence holds a few orders: they are all there is
        // to judge by, and judged they are.
    }
    let failing = samples.failures as f64 > s.max_failure_ratio * total as f64;
    let slow = samples.p95_ms().is_some_and(|p| p > s.target_p95_ms);
    if failing || slow {
        let verdict = if slow {
            Verdict::DecreaseSlow
        } else {
            Verdict::DecreaseFailing
        };
        return decided(rate_per_sec * s.factor, verdict, window + s.hold_windows);
    }
    if window <= hold_until {
        return decided(rate_per_sec, Verdict::Hold, hold_until);
    }
    decided(rate_per_sec + s.step_per_sec, Verdict::Increase, hold_until)
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
        let d = decide(&s, 10, 10, 5.0, 0, &commits(50, 20));
        assert_eq!((d.rate_per_sec, d.verdict), (6.0, Verdict::Increase));
        let d = decide(&s, 10, 10, 19.5, 0, &commits(50, 20));
        assert_eq!(d.rate_per_sec, 20.0);
    }

    #[test]
    fn a_slow_window_cuts_by_the_factor_down_to_the_floor_and_holds() {
        let s = settings();
        let d = decide(&s, 10, 10, 10.0, 0, &commits(500, 20));
        assert_eq!((d.rate_per_sec, d.verdict), (5.0, Verdict::DecreaseSlow));
        assert_eq!(d.hold_until, 11);
        let d = decide(&s, 11, 11, 3.0, 11, &commits(500, 20));
        assert_eq!(d.rate_per_sec, 2.0, "never below the floor");
        // Healthy again, but within the hold: unchanged.
        let d = decide(&s, 11, 11, 5.0, 11, &commits(50, 20));
        assert_eq!((d.rate_per_sec, d.verdict), (5.0, Verdict::Hold));
        let d = decide(&s, 12, 12, 5.0, 11, &commits(50, 20));
        assert_eq!((d.rate_per_sec, d.verdict), (6.0, Verdict::Increase));
    }

    #[test]
    fn too_few_samples_change_nothing() {
        let s = settings();
        let d = decide(&s, 10, 10, 7.0, 0, &commits(5_000, 9));
        assert_eq!((d.rate_per_sec, d.verdict), (7.0, Verdict::TooFewSamples));
        let d = decide(&s, 10, 10, 7.0, 0, &WindowSamples::default());
        assert_eq!(d.verdict, Verdict::TooFewSamples);
    }

    #[test]
    fn too_few_orders_stretch_the_evidence_until_a_decision() {
        let s = settings();
        // Window 10 alone holds 6 of the 10 needed: still gathering.
        let d = decide(&s, 10, 10, 7.0, 0, &commits(50, 6));
        assert_eq!((d.verdict, d.evidence_from), (Verdict::TooFewSamples, 10));
        // Windows 10-11 together hold 12: decided on both, evidence moves on.
        let d = decide(&s, 11, 10, 7.0, 0, &commits(50, 12));
        assert_eq!(
            (d.rate_per_sec, d.verdict, d.evidence_from),
            (8.0, Verdict::Increase, 12)
        );
        let d = decide(&s, 11, 10, 7.0, 0, &commits(500, 12));
        assert_eq!(
            (d.rate_per_sec, d.verdict, d.hold_until, d.evidence_from),
            (3.5, Verdict::DecreaseSlow, 12, 12)
        );
    }

    #[test]
    fn the_longest_evidence_is_judged_on_what_it_holds() {
        let s = settings();
        let last = 10 + MAX_EVIDENCE_WINDOWS - 1;
        // One window short of the longest: still gathering.
        let d = decide(&s, last - 1, 10, 2.0, 0, &commits(50, 3));
        assert_eq!((d.verdict, d.evidence_from), (Verdict::TooFewSamples, 10));
        // The longest: a healthy few earn a step, a slow few a cut.
        let d = decide(&s, last, 10, 2.0, 0, &commits(50, 3));
        assert_eq!(
            (d.rate_per_sec, d.verdict, d.evidence_from),
            (3.0, Verdict::Increase, last + 1)
        );
        let d = decide(&s, last, 10, 6.0, 0, &commits(500, 3));
        assert_eq!((d.rate_per_sec, d.verdict), (3.0, Verdict::DecreaseSlow));
        // Nothing at all: unchanged, and gathering starts afresh.
        let d = decide(&s, last, 10, 6.0, 0, &WindowSamples::empty());
        assert_eq!(
            (d.rate_per_sec, d.verdict, d.evidence_from),
            (6.0, Verdict::TooFewSamples, last + 1)
        );
        // Evidence said to start later than the window spans one window.
        let d = decide(&s, 10, 99, 6.0, 0, &commits(50, 3));
        assert_eq!((d.verdict, d.evidence_from), (Verdict::TooFewSamples, 10));
    }

    #[test]
    fn samples_add_bucket_by_bucket() {
        let mut sum = WindowSamples::default();
        sum.add(&commits(50, 3));
        sum.add(&WindowSamples {
            buckets: vec![1],
            failures: 2,
        });
        assert_eq!((sum.commits(), sum.failures), (4, 2));
        assert_eq!(sum.buckets[bucket_of(50)], 3);
    }

    #[test]
    fn rollbacks_over_the_ratio_cut_even_when_commits_are_fast() {
        let s = settings();
        let mut w = commits(20, 10);
        w.failures = 3; // 3 of 13 > 20 %
        let d = decide(&s, 10, 10, 10.0, 0, &w);
        assert_eq!((d.rate_per_sec, d.verdict), (5.0, Verdict::DecreaseFailing));
        w.failures = 2; // 2 of 12 <= 20 %
        assert_eq!(decide(&s, 10, 10, 10.0, 0, &w).verdict, Verdict::Increase);
        // Failures alone count as samples.
        let only = WindowSamples {
            buckets: vec![],
            failures: 10,
        };
        assert_eq!(
            decide(&s, 10, 10, 10.0, 0, &only).verdict,
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
            // 2/s x 1 s x 8 windows = 16 orders at the floor: 17 is out of reach.
            (|s| s.min_samples = 17, "adaptive.minSamples"),
            (
                |s| {
                    s.window_ms = 100;
                    s.min_samples = 2;
                },
                "adaptive.minSamples",
            ),
        ];
        for (change, field) in cases {
            let mut s = settings();
            change(&mut s);
            let message = s.validate(1000).unwrap_err();
            assert!(message.starts_with(field), "{message} should name {field}");
        }
    }

    /// A simulated order service over consecutive windows: every admitted
    /// buyer orders (a share of them, at least a quarter), each order
    /// committing in `ms` or rolling back. Admissions carry over between
    /// windows as a fraction, as a batch per pass does.
    struct Service {
        share: f64,
        ms: u64,
        rolls_back: bool,
        carry: f64,
    }

    impl Service {
        fn window(&mut self, s: &AdaptiveSettings, rate: f64) -> WindowSamples {
            self.carry += rate * s.window_ms as f64 / 1000.0 * self.share + 1e-9;
            let n = self.carry.floor();
            self.carry -= n;
            let mut w = commits(self.ms, 0);
            if self.rolls_back {
                w.failures = n as u64;
            } else {
                w.buckets[bucket_of(self.ms)] = n as u64;
            }
            w
        }
    }

    /// Runs the rule as the controller does, from a state: rate, hold,
    /// and evidence gathered since `evidence_from` (the store sums the
    /// windows' samples). Answers the rate after each window.
    fn run(
        s: &AdaptiveSettings,
        service: &mut Service,
        start: (f64, u64, u64, WindowSamples),
        first: u64,
        windows: u64,
    ) -> Vec<f64> {
        let (mut rate, mut hold, mut from, mut evidence) = start;
        let mut rates = vec![];
        for window in first..first + windows {
            evidence.add(&service.window(s, rate));
            let d = decide(s, window, from, rate, hold, &evidence);
            if d.evidence_from > window {
                evidence = WindowSamples::empty();
            }
            (rate, hold, from) = (d.rate_per_sec, d.hold_until, d.evidence_from);
            rates.push(rate);
        }
        rates
    }

    fn any_settings() -> impl proptest::strategy::Strategy<Value = AdaptiveSettings> {
        use proptest::prelude::*;
        (
            1u32..20,
            1u32..40,
            1u32..10,
            1u64..200,
            prop_oneof![Just(1_000u64), Just(2_000), Just(5_000), Just(500)],
            (1u64..=100, 1u32..=9, 0u64..=4, 0u32..=5),
        )
            .prop_map(
                |(floor, span, step, min, window_ms, (target, factor, hold, ratio))| {
                    let floor = f64::from(floor);
                    let step = f64::from(step);
                    AdaptiveSettings {
                        enabled: true,
                        floor_per_sec: floor,
                        ceiling_per_sec: floor + step * f64::from(span),
                        target_p95_ms: target * 10,
                        step_per_sec: step,
                        factor: f64::from(factor) / 10.0,
                        window_ms,
                        min_samples: min,
                        max_failure_ratio: f64::from(ratio) / 10.0,
                        hold_windows: hold,
                    }
                },
            )
            .prop_filter("accepted settings", |s| s.validate(window_ms_of(s)).is_ok())
    }

    /// A pass interval the settings' floor admits one buyer in.
    fn window_ms_of(s: &AdaptiveSettings) -> u64 {
        (1000.0 / s.floor_per_sec).ceil() as u64
    }

    proptest::proptest! {
        /// From any state the controller can be in (any rate, a hold in
        /// force, any evidence gathered so far, however slow), a healthy
        /// service brings the rate to the ceiling within a bound: one cut
        /// the old evidence may still cause, its hold, then a step per
        /// longest evidence at most.
        #[test]
        fn a_healthy_service_brings_the_rate_back_to_the_ceiling(
            s in any_settings(),
            rate_share in 0.0f64..=1.0,
            held in 0u64..=4,
            gathered in 0u64..MAX_EVIDENCE_WINDOWS,
            old_slow in 0u64..200,
            share in 0.25f64..=1.0,
        ) {
            let rate = s.floor_per_sec + (s.ceiling_per_sec - s.floor_per_sec) * rate_share;
            let window = 1_000;
            let from = window - gathered;
            // Leftover evidence from a slow spell, short of a decision.
            let old = commits(s.target_p95_ms * 10, old_slow.min(s.min_samples - 1));
            let fast = s.target_p95_ms.min(5);
            let mut service = Service { share, ms: fast, rolls_back: false, carry: 0.0 };
            let steps = ((s.ceiling_per_sec - s.floor_per_sec) / s.step_per_sec).ceil() as u64;
            let bound = MAX_EVIDENCE_WINDOWS * (steps + 2) + held + s.hold_windows + 1;
            let rates = run(&s, &mut service, (rate, window + held, from, old), window, bound);
            proptest::prop_assert_eq!(*rates.last().unwrap(), s.ceiling_per_sec, "{:?}", rates);
        }

        /// A service whose orders are all slow, or all rolled back, never
        /// raises the rate, from any rate and hold, whatever it gathered.
        #[test]
        fn a_failing_service_never_raises_the_rate(
            s in any_settings(),
            rate_share in 0.0f64..=1.0,
            held in 0u64..=4,
            gathered in 0u64..MAX_EVIDENCE_WINDOWS,
            share in 0.0f64..=1.0,
            rolls_back in proptest::bool::ANY,
        ) {
            let rate = s.floor_per_sec + (s.ceiling_per_sec - s.floor_per_sec) * rate_share;
            let slow = s.target_p95_ms * 10;
            let mut service = Service { share, ms: slow, rolls_back, carry: 0.0 };
            let failing_so_far = if rolls_back {
                WindowSamples { failures: 1, ..WindowSamples::empty() }
            } else {
                commits(slow, 1)
            };
            let windows = MAX_EVIDENCE_WINDOWS * 6;
            let rates = run(&s, &mut service, (rate, 1_000 + held, 1_000 - gathered, failing_so_far), 1_000, windows);
            let mut before = rate;
            for r in rates {
                proptest::prop_assert!(r <= before, "raised from {} to {}", before, r);
                before = r;
            }
        }
    }
}
