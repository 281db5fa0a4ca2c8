//! The observed admission rate and its spread: a window over the admission
//! passes of the last seconds, from every instance, and the wait estimate
//! with an 80 % range built on it.
//!
//! The rate is observed rather than taken from the configuration because
//! `--max-active` or a slow order service throttles admissions below the
//! configured rate. Passes are fed in from the queue's event stream (by
//! `push`, which keeps one estimator per queue), so every instance sees all
//! of them, with what each pass admitted and dropped as absent, and the
//! leaves in between.
//!
//! The range ([`Forecast::wait_range`]) models a buyer's wait as the passes
//! it takes to admit those ahead of them, less those who give up first:
//!
//! - departures: every waiting buyer leaves at the observed hazard `h`
//!   (departures per waiting buyer per second), so of `k` ahead only those
//!   still there when their turn comes need a place: `k' = r·T` with
//!   `T = ln(1 + h·k/r)/h` (`k/r` without departures);
//! - pass sizes: passes admit `b̄` on average with variance `σ²`, so
//!   admitting `k'` takes `k'/b̄` passes with variance `k'·σ²/b̄³`, plus the
//!   binomial spread of who gives up and the error of `b̄` itself;
//! - the buyer is admitted by the pass after the whole passes ahead, and
//!   the next pass may come anywhere in the coming interval `Δ`.
//!
//! The range is the normal 80 % band of the pass count, in whole passes,
//! times `Δ`, and one interval more at the top for the pass that admits:
//! with even passes exactly the interval the buyer's pass falls in. Its
//! width falls as the rank does: the relative error of a sum of `n` passes
//! shrinks with `√n`.

use std::collections::VecDeque;

/// The standard normal's 90th percentile: the central 80 % lies within ±this.
const Z80: f64 = 1.281_551_565_5;

/// One observed pass: when it ran, what it admitted, who left since the
/// previous one (dropped as absent or gone on their own), and how many
/// still waited.
#[derive(Debug, Clone, Copy)]
struct Observed {
    at_ms: u64,
    admitted: u64,
    departed: u64,
    waiting: u64,
}

/// A sliding window over the passes of one queue.
#[derive(Debug, Clone)]
pub struct RateEstimator {
    window_ms: u64,
    passes: VecDeque<Observed>,
    /// Leaves heard since the last recorded pass, counted with the next.
    leaves: u64,
    /// When the hold under way began (its first held pass), if one is.
    held_since: Option<u64>,
}

/// Passes needed before the observed rate replaces the configured one.
const MIN_PASSES: usize = 3;

/// A wait range in whole seconds: `low` rounded down, `high` rounded up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitRange {
    pub low: u64,
    pub high: u64,
}

/// What the window says at one moment: enough to estimate any rank's wait.
/// Cheap to copy, taken once per event and applied to every stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Forecast {
    /// Admissions per second.
    rate: f64,
    /// The observed spread; `None` while the rate is the configured one.
    spread: Option<Spread>,
    /// An operator holds admission: nobody is admitted until they resume,
    /// so there is no estimate at all (not even at the front).
    held: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Spread {
    /// Mean admitted per pass.
    batch: f64,
    /// Variance of the admitted count per pass.
    batch_var: f64,
    /// Variance of the mean batch itself (its standard error squared).
    mean_var: f64,
    /// Mean seconds between passes.
    interval_s: f64,
    /// Departures per waiting buyer per second.
    hazard: f64,
}

impl Forecast {
    /// A forecast from a rate alone (the configured one, before any pass
    /// was observed): a point estimate and no range.
    pub fn at_rate(rate: f64) -> Self {
        Self {
            rate,
            spread: None,
            held: false,
        }
    }

    /// This forecast while admission is held (`held`) or not.
    pub fn with_held(self, held: bool) -> Self {
        Self { held, ..self }
    }

    /// Whether an operator holds admission.
    pub fn is_held(&self) -> bool {
        self.held
    }

    /// Admissions per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Seconds to wait with `rank` ahead, rounded up: the time to admit
    /// them less the observed departures; `None` when nothing is admitted.
    pub fn wait_secs(&self, rank: u64) -> Option<u64> {
        if self.held {
            return None;
        }
        if rank == 0 {
            return Some(0);
        }
        let needed = self.needed(rank)?;
        Some((needed / self.rate).ceil() as u64)
    }

    /// The 80 % range of the wait with `rank` ahead; `None` until the
    /// spread has been observed, or when nothing is admitted.
    pub fn wait_range(&self, rank: u64) -> Option<WaitRange> {
        if self.held {
            return None;
        }
        let s = self.spread?;
        let needed = self.needed(rank)?;
        if s.batch <= f64::EPSILON {
            return None;
        }
        let passes = needed / s.batch;
        let kept = if rank == 0 { 1.0 } else { needed / rank as f64 };
        let var = needed * s.batch_var / s.batch.powi(3)
            + rank as f64 * kept * (1.0 - kept) / s.batch.powi(2)
            + passes * passes * s.mean_var / s.batch.powi(2);
        let half = Z80 * var.sqrt();
        // The buyer is admitted in the pass after the whole passes ahead,
        // which comes anywhere within the next interval.
        let low = (passes - half).max(0.0).floor() * s.interval_s;
        let high = ((passes + half).floor() + 1.0) * s.interval_s;
        Some(WaitRange {
            low: low.floor() as u64,
            high: high.ceil() as u64,
        })
    }

    /// Of `rank` ahead, how many are expected to still wait when their
    /// turn comes (`r·T` above); `None` without admissions.
    fn needed(&self, rank: u64) -> Option<f64> {
        if self.rate <= f64::EPSILON || !self.rate.is_finite() {
            return None;
        }
        let k = rank as f64;
        let h = self.spread.map_or(0.0, |s| s.hazard);
        if h <= 1e-12 {
            return Some(k);
        }
        Some(self.rate * (h * k / self.rate).ln_1p() / h)
    }
}

impl RateEstimator {
    /// An estimator averaging over the last `window_ms` milliseconds.
    pub fn new(window_ms: u64) -> Self {
        Self {
            window_ms: window_ms.max(1),
            passes: VecDeque::new(),
            leaves: 0,
            held_since: None,
        }
    }

    /// Notes a pass at `at_ms` that ran while an operator held admission.
    /// It is not recorded: it admitted nobody by design, and a window of
    /// such passes would show a rate decayed towards zero once admission
    /// resumes. The hold's time is cut out instead (see [`Self::record`]).
    pub fn note_held(&mut self, at_ms: u64) {
        self.held_since.get_or_insert(at_ms);
    }

    /// Counts a buyer who left the line on their own, with the next pass.
    pub fn note_leave(&mut self) {
        self.leaves = self.leaves.saturating_add(1);
    }

    /// Records a pass at `at_ms` that admitted `admitted` users and dropped
    /// `abandoned` as absent while someone was waiting, leaving `waiting`.
    /// Passes over an empty queue say nothing about throughput and should
    /// not be recorded.
    pub fn record(&mut self, at_ms: u64, admitted: u64, abandoned: u64, waiting: u64) {
        if let Some(since) = self.held_since.take() {
            // The first pass after a hold: the passes before it move on by
            // the hold's length, as if it had not happened, so the rate
            // right after a release is the one before the hold.
            let shift = at_ms.saturating_sub(since);
            for p in &mut self.passes {
                p.at_ms = p.at_ms.saturating_add(shift).min(at_ms);
            }
        }
        if let Some(last) = self.passes.back()
            && at_ms < last.at_ms
        {
            return; // a late duplicate; pub/sub order is per publisher
        }
        self.passes.push_back(Observed {
            at_ms,
            admitted,
            departed: abandoned.saturating_add(std::mem::take(&mut self.leaves)),
            waiting,
        });
        while let Some(first) = self.passes.front() {
            if at_ms.saturating_sub(first.at_ms) > self.window_ms {
                self.passes.pop_front();
            } else {
                break;
            }
        }
    }

    /// Admissions per second observed, or `fallback` until there is data.
    pub fn rate(&self, fallback: f64) -> f64 {
        self.forecast(fallback).rate()
    }

    /// The forecast of the window, or a point estimate at `fallback`
    /// admissions per second until there is data.
    ///
    /// The first pass of the window only marks its start: what it admitted
    /// and who left before it happened before the window's span.
    pub fn forecast(&self, fallback: f64) -> Forecast {
        let fallback = Forecast::at_rate(fallback);
        if self.passes.len() < MIN_PASSES {
            return fallback;
        }
        let first = self.passes.front().map_or(0, |p| p.at_ms);
        let last = self.passes.back().map_or(0, |p| p.at_ms);
        let span_s = last.saturating_sub(first) as f64 / 1000.0;
        if span_s <= 0.0 {
            return fallback;
        }
        let counted = || self.passes.iter().skip(1);
        let n = (self.passes.len() - 1) as f64;
        let admitted: u64 = counted().map(|p| p.admitted).sum();
        let departed: u64 = counted().map(|p| p.departed).sum();
        let batch = admitted as f64 / n;
        let batch_var = counted()
            .map(|p| (p.admitted as f64 - batch).powi(2))
            .sum::<f64>()
            / (n - 1.0).max(1.0);
        let waiting =
            self.passes.iter().map(|p| p.waiting).sum::<u64>() as f64 / self.passes.len() as f64;
        let hazard = if waiting > 0.0 {
            departed as f64 / (waiting * span_s)
        } else {
            0.0
        };
        Forecast {
            held: false,
            rate: admitted as f64 / span_s,
            spread: Some(Spread {
                batch,
                batch_var,
                mean_var: batch_var / n,
                interval_s: span_s / n,
                hazard,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn falls_back_until_there_is_data() {
        let mut e = RateEstimator::new(30_000);
        assert_eq!(e.rate(50.0), 50.0);
        e.record(1_000, 10, 0, 0);
        e.record(2_000, 10, 0, 0);
        assert_eq!(e.rate(50.0), 50.0);
        e.record(3_000, 10, 0, 0);
        assert!((e.rate(50.0) - 10.0).abs() < 1e-9);
    }

    #[test]
    fn throttled_admissions_lower_the_rate() {
        let mut e = RateEstimator::new(10_000);
        for i in 0..10 {
            e.record(i * 1000, 50, 0, 0);
        }
        assert!((e.rate(50.0) - 50.0).abs() < 1e-9);
        for i in 10..25 {
            e.record(i * 1000, 5, 0, 0);
        }
        assert!((e.rate(50.0) - 5.0).abs() < 1e-9, "{}", e.rate(50.0));
    }

    #[test]
    fn zero_admissions_mean_zero_rate() {
        let mut e = RateEstimator::new(10_000);
        for i in 0..5 {
            e.record(i * 1000, 0, 0, 0);
        }
        assert_eq!(e.rate(50.0), 0.0);
    }

    #[test]
    fn old_passes_leave_the_window_and_late_ones_are_ignored() {
        let mut e = RateEstimator::new(5_000);
        for i in 0..100 {
            e.record(i * 1000, i, 0, 0);
        }
        assert!(e.passes.len() <= 6);
        e.record(10, 1_000_000, 0, 0);
        assert!(e.rate(1.0) < 100.0);
    }

    #[test]
    fn passes_in_the_same_millisecond_all_count() {
        // Two instances may run a pass in the same millisecond: both admitted.
        let mut e = RateEstimator::new(30_000);
        e.record(0, 0, 0, 0);
        e.record(1_000, 4, 0, 0);
        e.record(1_000, 6, 0, 0);
        assert!((e.rate(50.0) - 10.0).abs() < 1e-9, "{}", e.rate(50.0));
    }

    #[test]
    fn a_late_pass_changes_nothing() {
        let mut e = RateEstimator::new(30_000);
        for i in 1..=5 {
            e.record(i * 1_000, 8, 0, 0);
        }
        let before = e.rate(50.0);
        e.record(2_500, 1_000, 0, 0);
        assert_eq!(e.rate(50.0), before);
        assert_eq!(e.passes.len(), 5);
    }

    #[test]
    fn a_pass_exactly_one_window_old_is_kept() {
        let mut e = RateEstimator::new(10_000);
        e.record(0, 0, 0, 0);
        e.record(5_000, 10, 0, 0);
        e.record(10_000, 10, 0, 0);
        // All three: 20 admitted over the 10 s span.
        assert!((e.rate(50.0) - 2.0).abs() < 1e-9, "{}", e.rate(50.0));
        e.record(10_001, 10, 0, 0);
        // The first is now older than the window: 20 over 5.001 s.
        assert_eq!(e.passes.len(), 3);
        assert!((e.rate(50.0) - 20_000.0 / 5_001.0).abs() < 1e-9);
    }

    /// A full window of passes every second, alternately `jitter` above and
    /// below `batch` (as many of each), with `departed` leaving per pass out of
    /// `waiting`.
    fn steady(batch: u64, jitter: u64, departed: u64, waiting: u64) -> Forecast {
        let mut e = RateEstimator::new(30_000);
        for i in 0..31u64 {
            let admitted = if i % 2 == 0 {
                batch + jitter
            } else {
                batch - jitter
            };
            e.record(i * 1_000, admitted, departed, waiting);
        }
        e.forecast(1.0)
    }

    #[test]
    fn eta_rounds_up_and_is_unknown_without_admissions() {
        let at = Forecast::at_rate;
        assert_eq!(at(50.0).wait_secs(0), Some(0));
        assert_eq!(at(50.0).wait_secs(1), Some(1));
        assert_eq!(at(50.0).wait_secs(100), Some(2));
        assert_eq!(at(50.0).wait_secs(101), Some(3));
        assert_eq!(at(0.5).wait_secs(3), Some(6));
        for rate in [0.0, f64::EPSILON, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(at(rate).wait_secs(10), None, "{rate}");
        }
        assert_eq!(at(0.0).wait_secs(0), Some(0), "at the front");
    }

    #[test]
    fn no_range_until_passes_are_observed_or_while_nothing_is_admitted() {
        let f = RateEstimator::new(30_000).forecast(50.0);
        assert_eq!(f.wait_secs(100), Some(2));
        assert_eq!(f.wait_range(100), None);
        assert_eq!(steady(0, 0, 0, 100).wait_range(100), None);
        assert_eq!(steady(0, 0, 0, 100).wait_secs(100), None);
    }

    #[test]
    fn the_range_holds_the_point_estimate_and_spans_at_least_the_next_pass() {
        let f = steady(50, 20, 0, 1_000);
        for rank in [0, 1, 49, 50, 120, 1_000, 10_000] {
            let r = f.wait_range(rank).unwrap();
            let point = f.wait_secs(rank).unwrap();
            assert!(r.low <= point && point <= r.high, "{rank}: {r:?} {point}");
            assert!(r.high - r.low >= 1, "{rank}: {r:?}");
        }
        // At the front the next pass admits: within one interval.
        assert_eq!(f.wait_range(0), Some(WaitRange { low: 0, high: 1 }));
    }

    #[test]
    fn the_range_narrows_as_the_line_moves() {
        let f = steady(50, 30, 0, 5_000);
        let width = |rank| {
            let r = f.wait_range(rank).unwrap();
            r.high - r.low
        };
        let widths: Vec<u64> = [20_000, 5_000, 1_000, 200, 10].map(width).to_vec();
        assert!(widths.windows(2).all(|w| w[0] > w[1]), "{widths:?}");
    }

    #[test]
    fn steady_passes_give_a_tight_range_and_uneven_ones_a_wider_one() {
        let even = steady(50, 0, 0, 5_000).wait_range(5_000).unwrap();
        let uneven = steady(50, 40, 0, 5_000).wait_range(5_000).unwrap();
        assert_eq!(
            even,
            WaitRange {
                low: 100,
                high: 101
            }
        );
        assert!(uneven.low < 100 && uneven.high > 101, "{uneven:?}");
    }

    #[test]
    fn departures_ahead_shorten_the_wait() {
        let stay = steady(50, 10, 0, 2_000);
        let leave = steady(50, 10, 20, 2_000);
        assert_eq!(stay.wait_secs(2_000), Some(40));
        let (a, b) = (
            leave.wait_secs(2_000).unwrap(),
            stay.wait_secs(2_000).unwrap(),
        );
        assert!(a < b, "{a} {b}");
        let (a, b) = (
            leave.wait_range(2_000).unwrap(),
            stay.wait_range(2_000).unwrap(),
        );
        assert!(a.high < b.high, "{a:?} {b:?}");
        // The rate is what was admitted, departures aside.
        assert!((leave.rate() - 50.0).abs() < 1e-9);
    }

    #[test]
    fn a_held_forecast_estimates_nothing_not_even_at_the_front() {
        let held = steady(50, 10, 0, 1_000).with_held(true);
        assert!(held.is_held());
        for rank in [0, 1, 500] {
            assert_eq!(held.wait_secs(rank), None, "{rank}");
            assert_eq!(held.wait_range(rank), None, "{rank}");
        }
        let resumed = held.with_held(false);
        assert_eq!(resumed.wait_secs(0), Some(0));
        assert!(resumed.wait_range(100).is_some());
    }

    #[test]
    fn a_hold_does_not_decay_the_rate_after_it() {
        let mut e = RateEstimator::new(30_000);
        for i in 0..10 {
            e.record(i * 1_000, 10, 0, 100);
        }
        assert!((e.rate(1.0) - 10.0).abs() < 1e-9);
        // Held from 10 s to 25 s: passes admit nobody, by design.
        for i in 10..25 {
            e.note_held(i * 1_000);
        }
        e.record(25_000, 10, 0, 100);
        assert!((e.rate(1.0) - 10.0).abs() < 1e-9, "{}", e.rate(1.0));
        let f = e.forecast(1.0);
        assert_eq!(f.wait_secs(100), Some(10));
    }

    #[test]
    fn leaves_count_with_the_next_pass() {
        let mut e = RateEstimator::new(30_000);
        e.record(0, 10, 0, 100);
        e.note_leave();
        e.note_leave();
        e.record(1_000, 10, 1, 100);
        assert_eq!(e.passes.back().unwrap().departed, 3);
        assert_eq!(e.leaves, 0);
    }
}
