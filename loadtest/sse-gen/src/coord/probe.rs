//! Measuring the server while a run goes on: snapshots of its Redis
//! commands, CPU and memory with the crowd's counters, and the figures of a
//! window between two snapshots.

use std::sync::Arc;

use serde::Serialize;
use serde_json::{Value, json};

use crate::crowd::{self, PROGRESS_FIELDS, Progress};
use crate::now_ms;
use crate::server::{self, CommandStats, RedisProbe};

/// One row of the timeline (every second).
#[derive(Debug, Clone, Serialize)]
pub(super) struct Sample {
    pub(super) t: f64,
    pub(super) entered: u64,
    pub(super) open: u64,
    pub(super) waiting: u64,
    pub(super) ready: u64,
    pub(super) done: u64,
    pub(super) failed: u64,
    pub(super) http: u64,
    pub(super) events: u64,
    pub(super) rss_kib: Option<u64>,
    pub(super) server_cpu_s: Option<f64>,
    pub(super) redis_calls: Option<u64>,
    pub(super) evalsha: Option<u64>,
    pub(super) gen_cpu_s: f64,
}

/// The server's figures at one moment.
#[derive(Debug, Clone)]
pub(super) struct Snap {
    pub(super) t: f64,
    pub(super) progress: [u64; PROGRESS_FIELDS],
    pub(super) cmd: Option<CommandStats>,
    pub(super) cpu: Option<f64>,
    pub(super) rss: Option<u64>,
}

pub(super) struct Probe {
    pub(super) redis: Option<tokio::sync::Mutex<RedisProbe>>,
    pub(super) pid: Option<u32>,
}

impl Probe {
    pub(super) async fn snap(&self, t0: f64, progress: &[Arc<Progress>]) -> Snap {
        let cmd = match &self.redis {
            Some(r) => r.lock().await.commandstats().await.ok(),
            None => None,
        };
        Snap {
            t: (now_ms() - t0) / 1000.0,
            progress: crowd::total(progress),
            cmd,
            cpu: self.pid.and_then(server::cpu_secs),
            rss: self.pid.and_then(server::rss_kib),
        }
    }
}

/// Figures over the window `a..b` with `users` waiting.
pub(super) fn window(a: &Snap, b: &Snap, users: f64) -> Value {
    let secs = (b.t - a.t).max(1e-9);
    let per = |x: f64| {
        if users > 0.0 {
            Some(x / users / secs)
        } else {
            None
        }
    };
    let http = (b.progress[6] - a.progress[6]) as f64;
    let (calls, evalsha, by_cmd) = match (&a.cmd, &b.cmd) {
        (Some(x), Some(y)) => {
            let d = y.delta(x);
            (
                Some(d.total_without_info() as f64),
                Some(d.get("evalsha") as f64),
                Some(d.0),
            )
        }
        _ => (None, None, None),
    };
    let cpu = match (a.cpu, b.cpu) {
        (Some(x), Some(y)) => Some(y - x),
        _ => None,
    };
    json!({
        "from_s": a.t, "to_s": b.t, "secs": secs, "waiting_users": users,
        "redis_calls": calls, "redis_calls_per_s": calls.map(|c| c / secs),
        "redis_calls_per_user_s": calls.and_then(per),
        "evalsha_calls": evalsha, "evalsha_per_user_s": evalsha.and_then(per),
        "redis_calls_by_command": by_cmd,
        "http_requests": http, "http_per_user_s": per(http),
        "server_cpu_s": cpu, "server_cpu_pct": cpu.map(|c| 100.0 * c / secs),
        "rss_kib_start": a.rss, "rss_kib_end": b.rss,
    })
}

pub(super) fn short_window(w: &Value) -> String {
    let f = |k: &str| w[k].as_f64().map_or("-".into(), |v| format!("{v:.4}"));
    format!(
        "redis calls/user/s {} (evalsha {}), http req/user/s {}, server CPU {} s",
        f("redis_calls_per_user_s"),
        f("evalsha_per_user_s"),
        f("http_per_user_s"),
        f("server_cpu_s")
    )
}
