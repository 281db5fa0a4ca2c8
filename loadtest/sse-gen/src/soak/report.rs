//! The soak report: the pass criteria, the JSON, the markdown table and
//! the chart.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Relaxed;

use serde::Serialize;

use super::buyer::Counters;
use super::{Sample, SoakArgs, chart};

/// Most growth of RSS and Redis memory over the flat window.
const MAX_GROWTH: f64 = 0.05;
/// Most distance of one sample's admission rate from the configured one.
const RATE_TOLERANCE: f64 = 0.10;

/// The keys an idle deployment keeps: what was there before the crowd,
/// and the queue's admission state (bucket, pass number, join sequence,
/// the running instances' admission turn) and the shared ticket secret.
pub fn allowed_keys(baseline: &BTreeSet<String>, prefix: &str, queue: &str) -> BTreeSet<String> {
    let mut allowed = baseline.clone();
    for k in ["bucket", "pass", "seq", "audit", "turn"] {
        allowed.insert(format!("{prefix}:{{{queue}}}:{k}"));
    }
    allowed.insert(format!("{prefix}:ticket-secret"));
    allowed
}

#[derive(Debug, Serialize)]
pub struct Criterion {
    pub what: String,
    pub measured: String,
    pub limit: String,
    pub pass: bool,
}

#[derive(Debug, Serialize)]
pub struct Totals {
    pub joins: u64,
    pub join_errors: u64,
    pub fast_tracked: u64,
    pub leaves: u64,
    pub drops: u64,
    pub server_closed: u64,
    pub polls: u64,
    pub ready: u64,
    pub orders_ok: u64,
    pub orders_refused: u64,
    pub expiring: u64,
    pub errors: u64,
    /// Joins not started because --max-buyers were alive.
    pub skipped: u64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub criteria: Vec<Criterion>,
    pub totals: Totals,
    pub drained_after_secs: f64,
    pub final_keys: Vec<String>,
    pub unexpected_keys: Vec<String>,
    pub samples: Vec<Sample>,
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, sum) = v.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    (n > 0).then(|| sum / n as f64)
}

impl Report {
    pub fn build(
        a: &SoakArgs,
        samples: Vec<Sample>,
        allowed: &BTreeSet<String>,
        final_keys: &BTreeSet<String>,
        drained_after_secs: f64,
        skipped: u64,
        c: &Counters,
    ) -> Self {
        let mut criteria = Vec::new();
        let load_secs = a.duration_secs as f64;
        let flat = (a.flat_secs as f64).min(load_secs * 2.0 / 3.0);
        let edge = (a.sample_secs as f64 * 3.0).max(60.0).min(flat / 2.0);
        let from = load_secs - flat;
        let load: Vec<&Sample> = samples.iter().filter(|s| s.load && s.t > 0.0).collect();
        let growth = |f: &dyn Fn(&Sample) -> f64| -> Option<f64> {
            let head = mean(
                load.iter()
                    .filter(|s| s.t >= from && s.t <= from + edge)
                    .map(|s| f(s)),
            )?;
            let tail = mean(
                load.iter()
                    .filter(|s| s.t >= load_secs - edge)
                    .map(|s| f(s)),
            )?;
            Some(tail / head - 1.0)
        };
        let minutes = (flat / 60.0).round();
        let instances = a.server_pids.len();
        for i in 0..instances {
            let g = growth(&|s: &Sample| s.rss_kib.get(i).copied().unwrap_or(0) as f64);
            criteria.push(Criterion {
                what: format!(
                    "instance {} RSS growth over the load's last {minutes} min",
                    i + 1
                ),
                measured: g.map_or("n/a".into(), |g| format!("{:+.1} %", g * 100.0)),
                limit: format!("≤ {:.0} %", MAX_GROWTH * 100.0),
                pass: g.is_some_and(|g| g <= MAX_GROWTH),
            });
        }
        let g = growth(&|s: &Sample| s.used_memory as f64);
        criteria.push(Criterion {
            what: format!("Redis used_memory growth over the load's last {minutes} min"),
            measured: g.map_or("n/a".into(), |g| format!("{:+.1} %", g * 100.0)),
            limit: format!("≤ {:.0} %", MAX_GROWTH * 100.0),
            pass: g.is_some_and(|g| g <= MAX_GROWTH),
        });
        let (first, last) = (samples.first(), samples.last());
        for i in 0..instances {
            let base = first.and_then(|s| s.fds.get(i).copied()).unwrap_or(0);
            let end = last.and_then(|s| s.fds.get(i).copied()).unwrap_or(u64::MAX);
            let peak = samples
                .iter()
                .filter_map(|s| s.fds.get(i))
                .max()
                .copied()
                .unwrap_or(0);
            criteria.push(Criterion {
                what: format!("instance {} open descriptors after the drain", i + 1),
                measured: format!("{end} (baseline {base}, peak {peak})"),
                // Nothing allowed above it: the baseline is read once every
                // lazily opened descriptor is open (one buyer's whole path
                // per instance), and both counts with no scrape in flight.
                limit: "≤ baseline".to_owned(),
                pass: end <= base,
            });
        }
        let unexpected: Vec<String> = final_keys.difference(allowed).cloned().collect();
        let peak_keys = samples.iter().map(|s| s.keys).max().unwrap_or(0);
        criteria.push(Criterion {
            what: "Redis keys after the drain".into(),
            measured: format!(
                "{} (peak {peak_keys}), {} not constant",
                final_keys.len(),
                unexpected.len()
            ),
            limit: "only bucket, pass, sequence, turn, secret".into(),
            pass: unexpected.is_empty(),
        });
        // Samples whose whole interval lies in the load phase, after warm-up.
        let warmup = (a.warmup_secs as f64).min(load_secs / 3.0);
        let rates: Vec<f64> = load
            .iter()
            .filter(|s| s.t >= warmup && s.t <= load_secs)
            .map(|s| s.admit_rate)
            .collect();
        let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = rates.iter().copied().fold(0.0, f64::max);
        let avg = mean(rates.iter().copied()).unwrap_or(0.0);
        let cr = a.configured_rate;
        criteria.push(Criterion {
            what: format!(
                "admission rate per {} s sample after warm-up (pass to pass, Redis clock)",
                a.sample_secs
            ),
            measured: format!(
                "mean {avg:.2}/s, min {lo:.2}, max {hi:.2} ({} samples)",
                rates.len()
            ),
            limit: format!("{cr}/s ± {:.0} %", RATE_TOLERANCE * 100.0),
            pass: !rates.is_empty()
                && (lo - cr).abs() <= cr * RATE_TOLERANCE
                && (hi - cr).abs() <= cr * RATE_TOLERANCE,
        });
        let get = |x: &std::sync::atomic::AtomicU64| x.load(Relaxed);
        Self {
            criteria,
            totals: Totals {
                joins: get(&c.joins),
                join_errors: get(&c.join_errors),
                fast_tracked: get(&c.fast_tracked),
                leaves: get(&c.leaves),
                drops: get(&c.drops),
                server_closed: get(&c.server_closed),
                polls: get(&c.polls),
                ready: get(&c.ready),
                orders_ok: get(&c.orders_ok),
                orders_refused: get(&c.orders_refused),
                expiring: get(&c.expiring),
                errors: get(&c.errors),
                skipped,
            },
            drained_after_secs,
            final_keys: final_keys.iter().cloned().collect(),
            unexpected_keys: unexpected,
            samples,
        }
    }

    pub fn passed(&self) -> bool {
        self.criteria.iter().all(|c| c.pass)
    }

    pub fn write(&self, a: &SoakArgs) -> anyhow::Result<()> {
        let path = |ext: &str| a.out.with_extension(ext);
        std::fs::write(path("json"), serde_json::to_vec_pretty(self)?)?;
        std::fs::write(path("md"), self.markdown(a))?;
        std::fs::write(path("svg"), chart::render(a, &self.samples))?;
        Ok(())
    }

    pub fn markdown(&self, a: &SoakArgs) -> String {
        let mut m = String::new();
        let verdict = if self.passed() { "PASS" } else { "FAIL" };
        m.push_str(&format!(
            "### Soak: {} instances on one Redis, {} min — {verdict}\n\n",
            a.server_pids.len(),
            a.duration_secs / 60
        ));
        m.push_str("| criterion | measured | limit | |\n|---|---|---|---|\n");
        for c in &self.criteria {
            m.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                c.what,
                c.measured,
                c.limit,
                if c.pass { "pass" } else { "**FAIL**" }
            ));
        }
        let t = &self.totals;
        m.push_str(&format!(
            "\nBuyers: {} joined ({} fast-tracked, {} join errors), {} left while waiting, {} streams dropped and reopened on the other instance ({} closed by a server), {} polls, {} admitted: {} ordered ({} refused), {} let the token expire; {} errors; {} joins skipped at --max-buyers. Drained {:.0} s after the load.\n",
            t.joins,
            t.fast_tracked,
            t.join_errors,
            t.leaves,
            t.drops,
            t.server_closed,
            t.polls,
            t.ready,
            t.orders_ok,
            t.orders_refused,
            t.expiring,
            t.errors,
            t.skipped,
            self.drained_after_secs
        ));
        if !self.unexpected_keys.is_empty() {
            let some: Vec<&str> = self
                .unexpected_keys
                .iter()
                .take(10)
                .map(String::as_str)
                .collect();
            m.push_str(&format!(
                "\nKeys left that should not be: {}\n",
                some.join(", ")
            ));
        }
        m.push_str("\n| t (min) | buyers | waiting | streams | admitted/s | RSS MiB | descriptors | Redis MiB | keys |\n|---|---|---|---|---|---|---|---|---|\n");
        let step = (60.0 / a.sample_secs.max(1) as f64).round().max(1.0) as usize;
        let rows = self.samples.len();
        for (i, s) in self.samples.iter().enumerate() {
            if i % step != 0 && i + 1 != rows {
                continue;
            }
            let mib: Vec<String> = s
                .rss_kib
                .iter()
                .map(|k| format!("{:.0}", *k as f64 / 1024.0))
                .collect();
            let fds: Vec<String> = s.fds.iter().map(u64::to_string).collect();
            let streams: f64 = s.streams.iter().filter(|x| x.is_finite()).sum::<f64>() + 0.0;
            m.push_str(&format!(
                "| {:.1}{} | {} | {} | {:.0} | {:.1} | {} | {} | {:.1} | {} |\n",
                s.t / 60.0,
                if s.load { "" } else { " (drain)" },
                s.buyers,
                s.waiting,
                streams,
                s.admit_rate,
                mib.join(" / "),
                fds.join(" / "),
                s.used_memory as f64 / 1_048_576.0,
                s.keys
            ));
        }
        for n in &a.note {
            m.push_str(&format!("\n{n}\n"));
        }
        m
    }
}
