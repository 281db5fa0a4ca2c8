//! Every admission this instance heard of in one queue, by the path it
//! took: an admission pass, or the fast track of a join into an empty line
//! (READY at once, no pass). Both arrive as queue events from every
//! instance, so the totals and the rate are the queue's, not this
//! instance's share.
//!
//! This is what the operator is shown (admitted per minute, the admission
//! rate): a queue whose buyers all took the fast track admitted them all
//! the same. The buyers' wait estimates keep to the pass window of
//! `crate::queue::eta`, since only passes serve the line.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How an admission happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionPath {
    /// By an admission pass.
    Pass,
    /// On the fast track of a join.
    FastTrack,
}

/// Admissions by path since this instance started, and those of the last
/// window for the rate.
#[derive(Debug)]
pub struct AdmissionWindow {
    window: Duration,
    /// When this instance began listening: the rate of a younger instance
    /// is over the time it has listened, not a window it never saw.
    started: Instant,
    /// (when heard, how many), oldest first, within `window`.
    recent: VecDeque<(Instant, u64)>,
    pass: u64,
    fast_track: u64,
}

impl AdmissionWindow {
    /// A window of `window`, listening from `now`.
    pub fn new(window: Duration, now: Instant) -> Self {
        Self {
            window,
            started: now,
            recent: VecDeque::new(),
            pass: 0,
            fast_track: 0,
        }
    }

    /// Counts `n` admissions by `path`, heard at `now`.
    pub fn record(&mut self, now: Instant, path: AdmissionPath, n: u64) {
        if n == 0 {
            return;
        }
        match path {
            AdmissionPath::Pass => self.pass = self.pass.saturating_add(n),
            AdmissionPath::FastTrack => self.fast_track = self.fast_track.saturating_add(n),
        }
        self.recent.push_back((now, n));
        self.trim(now);
    }

    fn trim(&mut self, now: Instant) {
        while let Some((at, _)) = self.recent.front() {
            if now.saturating_duration_since(*at) > self.window {
                self.recent.pop_front();
            } else {
                break;
            }
        }
    }

    /// Admissions per second over the last window (or the time listened,
    /// if shorter, but at least a second): 0 when none were heard, never
    /// a configured rate standing in for an observed one.
    pub fn rate(&self, now: Instant) -> f64 {
        let listened = now.saturating_duration_since(self.started).clamp(
            Duration::from_secs(1),
            self.window.max(Duration::from_secs(1)),
        );
        let heard: u64 = self
            .recent
            .iter()
            .filter(|(at, _)| now.saturating_duration_since(*at) <= self.window)
            .map(|(_, n)| n)
            .sum();
        heard as f64 / listened.as_secs_f64()
    }

    /// Admissions since start: (by passes, on the fast track).
    pub fn totals(&self) -> (u64, u64) {
        (self.pass, self.fast_track)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn both_paths_count_and_the_rate_is_observed_only() {
        let t0 = Instant::now();
        let mut w = AdmissionWindow::new(30 * S, t0);
        assert_eq!(w.rate(t0 + 40 * S), 0.0, "nothing heard: zero");
        w.record(t0 + 40 * S, AdmissionPath::FastTrack, 12);
        w.record(t0 + 41 * S, AdmissionPath::Pass, 3);
        w.record(t0 + 41 * S, AdmissionPath::Pass, 0);
        assert_eq!(w.totals(), (3, 12));
        assert!((w.rate(t0 + 45 * S) - 15.0 / 30.0).abs() < 1e-9);
        // Out of the window: the rate falls back to zero, the totals stay.
        assert_eq!(w.rate(t0 + 80 * S), 0.0);
        assert_eq!(w.totals(), (3, 12));
    }

    #[test]
    fn a_young_instance_rates_over_the_time_it_listened() {
        let t0 = Instant::now();
        let mut w = AdmissionWindow::new(30 * S, t0);
        w.record(t0 + 2 * S, AdmissionPath::Pass, 10);
        assert!((w.rate(t0 + 5 * S) - 2.0).abs() < 1e-9);
        // At least a second: no burst divided by a few milliseconds.
        let mut w = AdmissionWindow::new(30 * S, t0);
        w.record(t0 + Duration::from_millis(10), AdmissionPath::FastTrack, 1);
        assert!((w.rate(t0 + Duration::from_millis(20)) - 1.0).abs() < 1e-9);
    }
}
