//! Percentiles over plain sorted vectors.

use serde::{Deserialize, Serialize};

/// n, p50, p90, p99, max and mean of a sample (milliseconds unless named
/// otherwise); all `None` for an empty sample.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
    pub mean: Option<f64>,
}

/// Nearest-rank percentile of a sorted sample.
pub fn pct(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Summarises `v` (sorted in place).
pub fn summarize(v: &mut [f64]) -> Summary {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let mean = if n == 0 {
        None
    } else {
        Some(round3(v.iter().sum::<f64>() / n as f64))
    };
    Summary {
        n,
        p50: pct(v, 50.0).map(round3),
        p90: pct(v, 90.0).map(round3),
        p99: pct(v, 99.0).map(round3),
        max: v.last().copied().map(round3),
        mean,
    }
}

impl Summary {
    /// `p50 / p99 / max` in ms, for the human summary.
    pub fn show(&self) -> String {
        let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1}"));
        format!(
            "p50 {} / p99 {} / max {} ms (n={})",
            f(self.p50),
            f(self.p99),
            f(self.max),
            self.n
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = summarize(&mut v);
        assert_eq!(s.p50, Some(50.0));
        assert_eq!(s.p99, Some(99.0));
        assert_eq!(s.max, Some(100.0));
        assert_eq!(summarize(&mut []).p50, None);
    }
}
