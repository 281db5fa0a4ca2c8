//! The observed admission rate: a moving average over the admission passes
//! of the last window, from every instance.
//!
//! The rate is observed rather than taken from the configuration because
//! `--max-active` or a slow order service throttles admissions below the
//! configured rate. Passes are fed in from the queue's event stream (by
//! `push`, which keeps one estimator per queue), so every instance sees all
//! of them. The wait estimate built on this rate,
//! [`estimated_wait_secs`](super::estimated_wait_secs), lives in `status.rs`
//! with the rest of what a buyer is shown.

use std::collections::VecDeque;

/// A sliding-window rate of admissions per second.
#[derive(Debug, Clone)]
pub struct RateEstimator {
    window_ms: u64,
    /// (pass time in ms on the store clock, users admitted in that pass)
    passes: VecDeque<(u64, u64)>,
}

/// Passes needed before the observed rate replaces the configured one.
const MIN_PASSES: usize = 3;

impl RateEstimator {
    /// An estimator averaging over the last `window_ms` milliseconds.
    pub fn new(window_ms: u64) -> Self {
        Self {
            window_ms: window_ms.max(1),
            passes: VecDeque::new(),
        }
    }

    /// Records a pass at `at_ms` that admitted `admitted` users while someone
    /// was waiting. Passes over an empty queue say nothing about throughput
    /// and should not be recorded.
    pub fn record(&mut self, at_ms: u64, admitted: u64) {
        if let Some(&(last, _)) = self.passes.back()
            && at_ms < last
        {
            return; // a late duplicate; pub/sub order is per publisher
        }
        self.passes.push_back((at_ms, admitted));
        while let Some(&(first, _)) = self.passes.front() {
            if at_ms.saturating_sub(first) > self.window_ms {
                self.passes.pop_front();
            } else {
                break;
            }
        }
    }

    /// Admissions per second observed, or `fallback` until there is data.
    ///
    /// The first pass of the window only marks its start: what it admitted
    /// happened before the window's span.
    pub fn rate(&self, fallback: f64) -> f64 {
        if self.passes.len() < MIN_PASSES {
            return fallback;
        }
        let first = self.passes.front().map_or(0, |p| p.0);
        let last = self.passes.back().map_or(0, |p| p.0);
        let span_ms = last.saturating_sub(first);
        if span_ms == 0 {
            return fallback;
        }
        let admitted: u64 = self.passes.iter().skip(1).map(|p| p.1).sum();
        admitted as f64 * 1000.0 / span_ms as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn falls_back_until_there_is_data() {
        let mut e = RateEstimator::new(30_000);
        assert_eq!(e.rate(50.0), 50.0);
        e.record(1_000, 10);
        e.record(2_000, 10);
        assert_eq!(e.rate(50.0), 50.0);
        e.record(3_000, 10);
        assert!((e.rate(50.0) - 10.0).abs() < 1e-9);
    }

    #[test]
    fn throttled_admissions_lower_the_rate() {
        let mut e = RateEstimator::new(10_000);
        for i in 0..10 {
            e.record(i * 1000, 50);
        }
        assert!((e.rate(50.0) - 50.0).abs() < 1e-9);
        for i in 10..25 {
            e.record(i * 1000, 5);
        }
        assert!((e.rate(50.0) - 5.0).abs() < 1e-9, "{}", e.rate(50.0));
    }

    #[test]
    fn zero_admissions_mean_zero_rate() {
        let mut e = RateEstimator::new(10_000);
        for i in 0..5 {
            e.record(i * 1000, 0);
        }
        assert_eq!(e.rate(50.0), 0.0);
    }

    #[test]
    fn old_passes_leave_the_window_and_late_ones_are_ignored() {
        let mut e = RateEstimator::new(5_000);
        for i in 0..100 {
            e.record(i * 1000, i);
        }
        assert!(e.passes.len() <= 6);
        e.record(10, 1_000_000);
        assert!(e.rate(1.0) < 100.0);
    }

    #[test]
    fn passes_in_the_same_millisecond_all_count() {
        // Two instances may run a pass in the same millisecond: both admitted.
        let mut e = RateEstimator::new(30_000);
        e.record(0, 0);
        e.record(1_000, 4);
        e.record(1_000, 6);
        assert!((e.rate(50.0) - 10.0).abs() < 1e-9, "{}", e.rate(50.0));
    }

    #[test]
    fn a_late_pass_changes_nothing() {
        let mut e = RateEstimator::new(30_000);
        for i in 1..=5 {
            e.record(i * 1_000, 8);
        }
        let before = e.rate(50.0);
        e.record(2_500, 1_000);
        assert_eq!(e.rate(50.0), before);
        assert_eq!(e.passes.len(), 5);
    }

    #[test]
    fn a_pass_exactly_one_window_old_is_kept() {
        let mut e = RateEstimator::new(10_000);
        e.record(0, 0);
        e.record(5_000, 10);
        e.record(10_000, 10);
        // All three: 20 admitted over the 10 s span.
        assert!((e.rate(50.0) - 2.0).abs() < 1e-9, "{}", e.rate(50.0));
        e.record(10_001, 10);
        // The first is now older than the window: 20 over 5.001 s.
        assert_eq!(e.passes.len(), 3);
        assert!((e.rate(50.0) - 20_000.0 / 5_001.0).abs() < 1e-9);
    }
}
