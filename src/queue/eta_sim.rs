//! A simulated sale checks the wait range against what it promises: of the
//! buyers admitted, at least about 80 % were admitted within the range they
//! were last shown, and within the last range shown to them far back.
//!
//! Passes run every second with random sizes (some admit nothing, as when
//! `--max-active` holds the door), buyers are dropped as absent at the
//! passes and leave on their own in between, new buyers keep arriving, and
//! buyers see their range either at every pass (a stream) or when they poll
//! at their own phase and polling tier.

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::eta::{RateEstimator, WaitRange};
use super::polling_interval_secs;

struct Buyer {
    streams: bool,
    next_poll_ms: u64,
    /// When the buyer was last shown a range, and the range.
    shown: Option<(u64, WaitRange)>,
    /// The last range shown to the buyer while at least [`FAR`] were ahead.
    far: Option<(u64, WaitRange)>,
}

/// Ranks from which a range counts as shown far back.
const FAR: u64 = 1_000;

/// Admitted buyers who had been shown a range, and those of them admitted
/// within it.
#[derive(Default)]
struct Hits {
    shown: u64,
    within: u64,
}

impl Hits {
    fn count(&mut self, shown: Option<(u64, WaitRange)>, now: u64) {
        if let Some((at, range)) = shown {
            self.shown += 1;
            let waited = (now - at) as f64 / 1000.0;
            if range.low as f64 <= waited && waited <= range.high as f64 {
                self.within += 1;
            }
        }
    }
}

impl Buyer {
    fn show(&mut self, now: u64, rank: usize, forecast: &super::Forecast) {
        let range = forecast.wait_range(rank as u64);
        self.shown = range.map(|r| (now, r));
        if rank as u64 >= FAR {
            self.far = self.shown;
        }
    }
}

/// Runs one sale: the hits of the last ranges shown, and of the last shown
/// far back.
fn sale(seed: u64, batch: (u64, u64), abandon: f64, leave: f64) -> (Hits, Hits) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut estimator = RateEstimator::new(30_000);
    let mut line: VecDeque<Buyer> = VecDeque::new();
    let arrive = |line: &mut VecDeque<Buyer>, rng: &mut StdRng, now: u64| {
        line.push_back(Buyer {
            streams: rng.random_bool(0.5),
            next_poll_ms: now + rng.random_range(0..5_000),
            shown: None,
            far: None,
        });
    };
    for _ in 0..4_000 {
        arrive(&mut line, &mut rng, 0);
    }
    let (mut last, mut far) = (Hits::default(), Hits::default());
    let tick = 250;
    let mut now = 0;
    while !line.is_empty() && now < 3_600_000 {
        now += tick;
        if now < 60_000 && rng.random_bool(0.5) {
            for _ in 0..rng.random_range(0..100) {
                arrive(&mut line, &mut rng, now);
            }
        }
        let before = line.len();
        line.retain(|_| !rng.random_bool(leave));
        for _ in line.len()..before {
            estimator.note_leave();
        }
        if now % 1_000 == 0 {
            let size = if rng.random_bool(0.1) {
                0
            } else {
                rng.random_range(batch.0..=batch.1)
            };
            let mut admitted = 0;
            while admitted < size {
                let Some(buyer) = line.pop_front() else {
                    break;
                };
                admitted += 1;
                last.count(buyer.shown, now);
                far.count(buyer.far, now);
            }
            let before = line.len();
            line.retain(|_| !rng.random_bool(abandon));
            let abandoned = (before - line.len()) as u64;
            estimator.record(now, admitted, abandoned, line.len() as u64);
            let forecast = estimator.forecast(1.0);
            for (rank, buyer) in line.iter_mut().enumerate() {
                if buyer.streams {
                    buyer.show(now, rank, &forecast);
                }
            }
        }
        let forecast = estimator.forecast(1.0);
        for (rank, buyer) in line.iter_mut().enumerate() {
            if !buyer.streams && buyer.next_poll_ms <= now {
                buyer.show(now, rank, &forecast);
                buyer.next_poll_ms = now + polling_interval_secs(rank as u64) * 1_000;
            }
        }
    }
    (last, far)
}

fn check(seed: u64, batch: (u64, u64), abandon: f64, leave: f64) {
    let (last, far) = sale(seed, batch, abandon, leave);
    for (what, hits, least) in [("last", last, 3_000), ("far", far, 1_000)] {
        let share = hits.within as f64 / hits.shown as f64;
        assert!(
            hits.shown > least,
            "{what}: {} admitted after a range",
            hits.shown
        );
        assert!(
            share >= 0.8,
            "seed {seed}, {what}: {} of {} ({share:.3})",
            hits.within,
            hits.shown
        );
    }
}

#[test]
fn most_buyers_are_admitted_within_the_range_they_were_last_shown() {
    for seed in 1..=2 {
        check(seed, (20, 80), 0.002, 0.0002);
    }
}

#[test]
fn the_range_holds_with_even_passes_and_no_departures() {
    check(7, (50, 50), 0.0, 0.0);
}

#[test]
fn the_range_holds_with_heavy_abandonment_and_ragged_passes() {
    check(11, (0, 100), 0.01, 0.001);
}
