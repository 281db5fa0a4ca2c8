//! The one results table (markdown) of a benchmark run, from the reports
//! the run wrote, with ratios against the baselines measured in the same run.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::Value;

#[derive(clap::Args, Clone, Debug)]
pub struct TableArgs {
    /// redis-benchmark -t zadd -P 1 ops/s.
    #[arg(long)]
    pub zadd_p1: Option<f64>,
    /// redis-benchmark -t zadd -P 16 ops/s.
    #[arg(long)]
    pub zadd_p16: Option<f64>,
    /// k6 enter-burst.js summary JSON.
    #[arg(long)]
    pub k6: Option<PathBuf>,
    /// `sse-gen burst` report.
    #[arg(long)]
    pub burst: Option<PathBuf>,
    /// `sse-gen crowd --mode sse` report.
    #[arg(long)]
    pub sse: Option<PathBuf>,
    /// `sse-gen crowd --mode poll` report.
    #[arg(long)]
    pub poll: Option<PathBuf>,
    /// `sse-gen crowd --churn-rate …` report (the leaves scenario).
    #[arg(long)]
    pub leaves: Option<PathBuf>,
    /// Lines put under the table (machine, commands).
    #[arg(long)]
    pub note: Vec<String>,
    #[arg(long, default_value = "latest.md")]
    pub out: PathBuf,
}

fn load(p: &Option<PathBuf>) -> Value {
    p.as_ref()
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null)
}

fn n(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn num(v: Option<f64>, digits: usize) -> String {
    match v {
        None => "–".into(),
        Some(x) if x.abs() >= 1000.0 && digits == 0 => {
            let s = format!("{:.0}", x);
            let mut out = String::new();
            for (i, ch) in s.chars().enumerate() {
                if i > 0 && (s.len() - i) % 3 == 0 && ch != '-' {
                    out.push(',');
                }
                out.push(ch);
            }
            out
        }
        Some(x) => format!("{x:.digits$}"),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => Some(a / b),
        _ => None,
    }
}

/// `met` / `MISSED` / `–`.
fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "–",
    }
}

fn lat(s: &Value) -> String {
    format!(
        "{} / {} / {} ms",
        num(n(&s["p50"]), 1),
        num(n(&s["p99"]), 1),
        num(n(&s["max"]), 1)
    )
}

pub fn run(a: TableArgs) -> anyhow::Result<()> {
    let md = render(&a);
    std::fs::write(&a.out, &md)?;
    print!("{md}");
    Ok(())
}

pub fn render(a: &TableArgs) -> String {
    let k6 = load(&a.k6);
    let burst = load(&a.burst);
    let sse = load(&a.sse);
    let poll = load(&a.poll);
    let leaves = load(&a.leaves);
    let mut rows: Vec<[String; 5]> = Vec::new();
    let mut row = |fig: &str, measured: String, target: &str, vs: String, ok: Option<bool>| {
        rows.push([fig.into(), measured, target.into(), vs, verdict(ok).into()]);
    };

    // a. enter path
    row(
        "a. `redis-benchmark -t zadd -n 100000 -c 50 -P 1` (baseline)",
        format!("{} ops/s", num(a.zadd_p1, 0)),
        "",
        "1.00×".into(),
        None,
    );
    row(
        "a. `redis-benchmark -t zadd -n 100000 -c 50 -P 16` (baseline)",
        format!("{} ops/s", num(a.zadd_p16, 0)),
        "",
        format!("{}× P1", num(ratio(a.zadd_p16, a.zadd_p1), 1)),
        None,
    );
    if !k6.is_null() {
        let fg = &k6["figures"];
        let p99 = n(&fg["enter_p99_ms"]);
        row(
            &format!(
                "a. burst of {} enters, k6 `enter-burst.js` (open loop, ramp to {}/s): mean enters/s; p50 / p99 / max",
                num(n(&fg["enters"]), 0),
                num(n(&fg["target_rate_per_s"]), 0)
            ),
            format!(
                "{} /s; {} / {} / {} ms; failed {}",
                num(n(&fg["mean_enters_per_s"]), 0),
                num(n(&fg["enter_p50_ms"]), 1),
                num(p99, 1),
                num(n(&fg["enter_max_ms"]), 1),
                num(n(&fg["http_req_failed_rate"]), 3)
            ),
            "p99 ≤ 50 ms",
            format!(
                "{}× zadd P1 (rate capped by the script)",
                num(ratio(n(&fg["mean_enters_per_s"]), a.zadd_p1), 2)
            ),
            p99.map(|p| p <= 50.0),
        );
    }
    if !burst.is_null() {
        let p99 = n(&burst["latency_ms"]["p99"]);
        let rate = n(&burst["enters_per_s"]);
        row(
            &format!(
                "a. burst of {} enters, `sse-gen burst` (closed loop, {} connections): enters/s; p50 / p99 / max",
                num(n(&burst["sent"]), 0),
                burst["concurrency"]
            ),
            format!(
                "{} /s; {}; non-201 {}",
                num(rate, 0),
                lat(&burst["latency_ms"]),
                {
                    let st = &burst["status"];
                    let ok = n(&st["201"]).unwrap_or(0.0);
                    num(
                        Some(
                            n(&burst["sent"]).unwrap_or(0.0) - ok
                                + n(&burst["errors"]).unwrap_or(0.0),
                        ),
                        0,
                    )
                }
            ),
            "p99 ≤ 50 ms",
            format!(
                "{}× zadd P1, {}× zadd P16",
                num(ratio(rate, a.zadd_p1), 2),
                num(ratio(rate, a.zadd_p16), 3)
            ),
            p99.map(|p| p <= 50.0),
        );
    }

    // b. SSE crowd
    if !sse.is_null() {
        let users = n(&sse["users"]);
        let rss = n(&sse["rss"]["per_stream_kib"]);
        row(
            &format!(
                "b. server RSS per open stream ({} streams)",
                num(n(&sse["rss"]["open"]), 0)
            ),
            format!(
                "{} KiB ({} → {} KiB)",
                num(rss, 2),
                num(n(&sse["rss"]["before_kib"]), 0),
                num(n(&sse["rss"]["with_streams_kib"]), 0)
            ),
            "≤ 10 KiB",
            format!("{}× target", num(ratio(rss, Some(10.0)), 2)),
            rss.map(|x| x <= 10.0),
        );
        row(
            "b. time to first event (GET /events sent → first event): p50 / p99 / max",
            lat(&sse["time_to_first_event_ms"]),
            "",
            String::new(),
            None,
        );
        let st = &sse["steady"];
        let cmds = n(&st["redis_calls_per_user_s"]);
        row(
            &format!(
                "b. Redis commands per waiting user per second, SSE ({} waiting, {:.0} s window; all cmdstat calls incl. inside scripts, INFO excluded)",
                num(n(&st["waiting_users"]), 0),
                n(&st["secs"]).unwrap_or(0.0)
            ),
            format!(
                "{} (evalsha {}; {} cmds/s)",
                num(cmds, 4),
                num(n(&st["evalsha_per_user_s"]), 4),
                num(n(&st["redis_calls_per_s"]), 0)
            ),
            "≤ 0.05",
            {
                let trend = sse["redis_trend_after_open"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let first = trend.first().and_then(|t| n(&t["calls_per_user_s"]));
                format!(
                    "{}× target; first 30 s after every stream opened: {} (the refresh schedule fills in)",
                    num(ratio(cmds, Some(0.05)), 2),
                    num(first, 4)
                )
            },
            cmds.map(|c| c <= 0.05),
        );
        row(
            "b. HTTP requests per waiting user per second, SSE",
            num(n(&st["http_per_user_s"]), 4),
            "",
            String::new(),
            None,
        );
        let rl = &sse["rank_update_lag_ms"];
        let p99 = n(&rl["p99"]);
        let bc = if sse["rank_update_first_admission"].is_object() {
            &sse["rank_update_first_admission"]
        } else {
            &sse["rank_update_broadcast"]
        };
        row(
            &format!(
                "b. rank-update lag (pass time → `waiting` event with that pass id received), all {} updates: p50 / p99 / max",
                num(n(&rl["n"]), 0)
            ),
            lat(rl),
            "p99 < 700 ms",
            format!(
                "first admission pass (pass {}, {} streams): {}",
                bc["pass"],
                num(n(&bc["summary"]["n"]), 0),
                lat(&bc["summary"])
            ),
            p99.map(|p| p < 700.0),
        );
        let rl = &sse["ready_lag_ms"];
        let p99 = n(&rl["p99"]);
        row(
            &format!(
                "b. admission-to-`ready` lag (receive − admittedAt), {} readies: p50 / p99 / max",
                num(n(&rl["n"]), 0)
            ),
            lat(rl),
            "p99 ≤ 100 ms",
            format!("{}× target", num(ratio(p99, Some(100.0)), 2)),
            p99.map(|p| p <= 100.0),
        );
        let rd = &sse["readiness"];
        let lost = n(&rd["lost"]);
        let dup = n(&rd["duplicated"]);
        row(
            "b. `ready` events: expected / received / lost / duplicated (token mismatches)",
            format!(
                "{} / {} / {} / {} ({})",
                num(n(&rd["expected"]), 0),
                num(n(&rd["users_with_ready"]), 0),
                num(lost, 0),
                num(dup, 0),
                num(n(&rd["token_mismatch"]), 0)
            ),
            "0 lost, 0 duplicated",
            format!("of {} buyers", num(users, 0)),
            match (lost, dup) {
                (Some(l), Some(d)) => {
                    Some(l == 0.0 && d == 0.0 && n(&rd["users_with_ready"]) == users)
                }
                _ => None,
            },
        );
        let ad = &sse["admission"];
        row(
            "b. admissions per second while the crowd drains",
            format!(
                "{} /s ({} admitted in {} passes)",
                num(n(&ad["admissions_per_s"]), 0),
                num(n(&ad["admitted"]), 0),
                num(n(&ad["admitting_passes"]), 0)
            ),
            "",
            String::new(),
            None,
        );
        let o = &sse["orders"];
        let s = &sse["stock"];
        let ok201 = n(&o["by_status"]["201"]);
        let consumed = n(&sse["events"]["gone"]["consumed"]);
        let stock_ok = match (
            s["never_negative"].as_bool(),
            s["sold_equals_201"].as_bool(),
        ) {
            (Some(a), Some(b)) => Some(a && b && consumed == ok201),
            _ => None,
        };
        row(
            "b. orders placed / 201 / 409 out_of_stock; stock initial → final (min seen); sold = 201 = `gone: consumed`",
            format!(
                "{} / {} / {}; {} → {} (min {}); sold {}, consumed {}",
                num(n(&o["placed"]), 0),
                num(ok201, 0),
                num(n(&o["by_status"]["409"]), 0),
                num(n(&s["initial"]), 0),
                num(n(&s["final"]), 0),
                num(n(&s["min_seen"]), 0),
                num(n(&s["sold"]), 0),
                num(consumed, 0)
            ),
            "no oversell",
            String::new(),
            stock_ok,
        );
        row(
            "b. buyers with an error",
            num(n(&sse["errors"]["users_with_error"]), 0),
            "0",
            String::new(),
            n(&sse["errors"]["users_with_error"]).map(|e| e == 0.0),
        );
    }

    // b2. the leaves scenario
    let ch = &leaves["churn"];
    if ch.is_object() {
        let (q, c) = (
            &ch["rank_update_lag_quiet_ms"],
            &ch["rank_update_lag_churn_ms"],
        );
        let ratio = n(&ch["p99_ratio"]);
        row(
            &format!(
                "b2. rank-update lag while {} leaves/s (achieved {}) with {} streams open, vs the quiet window before: p50 / p99 / max",
                num(n(&ch["rate"]), 0),
                num(n(&ch["leaves"]["achieved_per_s"]), 0),
                num(n(&ch["streams_open_at_churn_end"]), 0)
            ),
            format!("leaves {}; quiet {}", lat(c), lat(q)),
            "p99 ≤ 2× quiet",
            format!("{}× quiet p99", num(ratio, 2)),
            ratio.map(|r| r <= 2.0),
        );
    }

    // c. polling comparison
    if !poll.is_null() {
        let ps = &poll["steady"];
        let ss = &sse["steady"];
        let pc = n(&ps["redis_calls_per_user_s"]);
        let sc = n(&ss["redis_calls_per_user_s"]);
        let r = ratio(pc, sc);
        row(
            &format!(
                "c. Redis commands per waiting user per second, polling ({} waiting, {:.0} s window)",
                num(n(&ps["waiting_users"]), 0),
                n(&ps["secs"]).unwrap_or(0.0)
            ),
            format!(
                "{} (evalsha {}; {} cmds/s)",
                num(pc, 4),
                num(n(&ps["evalsha_per_user_s"]), 4),
                num(n(&ps["redis_calls_per_s"]), 0)
            ),
            "SSE ≥ 10× fewer",
            format!("polling / SSE = {}×", num(r, 1)),
            r.map(|x| x >= 10.0),
        );
        let ph = n(&ps["http_per_user_s"]);
        let sh = n(&ss["http_per_user_s"]);
        row(
            "c. HTTP requests per waiting user per second, polling",
            num(ph, 4),
            "",
            match ratio(ph, sh) {
                Some(x) if x.is_finite() => format!("polling / SSE = {}×", num(Some(x), 0)),
                _ => format!("SSE: {}", num(sh, 4)),
            },
            None,
        );
        let per_user =
            |w: &Value| match (n(&w["server_cpu_s"]), n(&w["waiting_users"]), n(&w["secs"])) {
                (Some(c), Some(u), Some(s)) if u > 0.0 && s > 0.0 => {
                    Some(c / u / s * 1000.0 * 1000.0)
                }
                _ => None,
            };
        let (pcpu, scpu) = (per_user(ps), per_user(ss));
        row(
            "c. server CPU in the steady window: CPU-s (CPU-ms per 1,000 waiting users per second)",
            format!(
                "polling {} s ({}), SSE {} s ({})",
                num(n(&ps["server_cpu_s"]), 2),
                num(pcpu, 2),
                num(n(&ss["server_cpu_s"]), 2),
                num(scpu, 2)
            ),
            "",
            format!("polling / SSE = {}× per user", num(ratio(pcpu, scpu), 1)),
            None,
        );
        row(
            "c. polling: admission → READY seen (pass time from pub/sub): p50 / p99 / max",
            lat(&poll["ready_lag_pubsub_ms"]),
            "",
            format!("SSE: {}", lat(&sse["ready_lag_pubsub_ms"])),
            None,
        );
    }

    let mut md = String::new();
    md.push_str(
        "| figure | measured | target | vs baseline / ratio | verdict |\n|---|---|---|---|---|\n",
    );
    for r in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            r[0], r[1], r[2], r[3], r[4]
        );
    }
    if !a.note.is_empty() {
        md.push('\n');
        for l in &a.note {
            let _ = writeln!(md, "{l}");
        }
    }
    md
}
