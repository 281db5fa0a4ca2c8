//! The run's report: per-buyer results, the store's channel log and the
//! measured windows folded into one JSON document, and its summary on the
//! terminal.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Value, json};

use super::CrowdArgs;
use super::probe::{Sample, short_window};
use crate::crowd::{Mode, UserResult};
use crate::server::ChannelLog;
use crate::stats::{Summary, summarize};

pub(super) struct ReportCtx<'a> {
    pub(super) a: &'a CrowdArgs,
    pub(super) t0: f64,
    pub(super) prefix: &'a str,
    pub(super) workers: usize,
    pub(super) nofile: u64,
    pub(super) plug: Value,
    pub(super) unplugged: usize,
    pub(super) phases: Value,
    pub(super) steady: Value,
    pub(super) rss: Value,
    pub(super) admission_window: Value,
    pub(super) stock: Value,
    pub(super) timeline: Vec<Sample>,
    pub(super) gen_cpu_s: f64,
    /// The leaves scenario's windows and leave figures (`null`: not run).
    pub(super) churn: Value,
}

pub(super) fn build_report(c: ReportCtx<'_>, results: &[UserResult], log: &ChannelLog) -> Value {
    let a = c.a;
    let crowd_prefix = format!("{}-", c.prefix);
    let plug_prefix = format!("{}-plug-", c.prefix);
    let ours = |u: &str| u.starts_with(&crowd_prefix) && !u.starts_with(&plug_prefix);
    let end_ms = c.t0 + c.phases["done_s"].as_f64().unwrap_or(0.0) * 1000.0;

    // The passes: time, and who each admitted.
    let pass_at: HashMap<u64, u64> = log.passes.iter().map(|p| (p.pass, p.at)).collect();
    let mut admitted_in: HashMap<&str, (u64, u64, &str)> = HashMap::new(); // user -> (pass, at, token)
    let mut plug_admitted = 0;
    let mut abandoned = 0;
    for p in &log.passes {
        abandoned += p.abandoned;
        for (u, tok) in &p.admitted {
            if ours(u) {
                admitted_in.insert(u.as_str(), (p.pass, p.at, tok.as_str()));
            } else if u.starts_with(&plug_prefix) {
                plug_admitted += 1;
            }
        }
    }

    let mut enter = Vec::new();
    let mut enter_status: BTreeMap<String, u64> = BTreeMap::new();
    let mut ttfe = Vec::new();
    let mut lag_event = Vec::new();
    let mut lag_pubsub = Vec::new();
    let mut rank_lag = Vec::new();
    let mut by_pass: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    let mut ready_lag_by_pass: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    let mut rank_unmatched = 0u64;
    let (mut waiting_ev, mut ready_ev, mut keepalives, mut polls, mut streams) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut gone: BTreeMap<String, u64> = BTreeMap::new();
    let (
        mut with_ready,
        mut dup,
        mut fast,
        mut token_mismatch,
        mut unexplained,
        mut no_admitted_at,
    ) = (0, 0, 0, 0, 0, 0);
    let mut lost = Vec::new();
    let (mut shed, mut evicted, mut retries, mut never_streamed) = (0u64, 0u64, 0u64, 0u64);
    let mut late = 0;
    let mut never_admitted_waiting = 0;
    let mut orders: BTreeMap<String, u64> = BTreeMap::new();
    let mut order_ms = Vec::new();
    let mut order_errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut left_after_409 = 0;
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut with_error = 0;
    let seen: HashSet<&str> = results.iter().map(|r| r.user.as_str()).collect();

    for r in results {
        *enter_status.entry(r.enter_status.to_string()).or_default() += 1;
        if let Some(ms) = r.enter_ms {
            enter.push(ms as f64);
        }
        if let Some(ms) = r.first_event_ms {
            ttfe.push(ms as f64);
        }
        waiting_ev += r.waiting_events as u64;
        ready_ev += r.ready_events as u64;
        keepalives += r.keepalives as u64;
        polls += r.polls as u64;
        streams += r.streams as u64;
        shed += r.shed as u64;
        evicted += r.evicted as u64;
        retries += r.retries as u64;
        if r.streams == 0 {
            never_streamed += 1;
        }
        if let Some(g) = &r.gone {
            *gone.entry(g.clone()).or_default() += 1;
        }
        if r.fast_tracked {
            fast += 1;
        }
        if r.ready_events > 0 {
            with_ready += 1;
        }
        if r.ready_events > 1 {
            dup += 1;
        }
        let adm = admitted_in.get(r.user.as_str());
        if let Some(first) = r.ready.first() {
            if let Some(at) = first.admitted_at {
                lag_event.push(first.recv - at as f64);
            } else if a.mode == Mode::Sse && !r.fast_tracked {
                no_admitted_at += 1;
            }
            match adm {
                Some((pass, at, tok)) => {
                    let l = first.recv - *at as f64;
                    lag_pubsub.push(l);
                    ready_lag_by_pass
                        .entry(*pass)
                        .or_default()
                        .push(first.admitted_at.map_or(l, |x| first.recv - x as f64));
                    if !tok.is_empty() && *tok != first.token {
                        token_mismatch += 1;
                    }
                }
                None if !r.fast_tracked => unexplained += 1,
                None => {}
            }
        } else if let Some((_, at, _)) = adm {
            if (*at as f64) < end_ms - 2000.0 {
                if lost.len() < 10_000 {
                    // What the buyer last knew, so a lost `ready` can be
                    // told apart: never streamed, gave up, or still waiting.
                    lost.push(json!({
                        "user": r.user, "enter_status": r.enter_status, "streams": r.streams,
                        "retries": r.retries, "shed": r.shed, "evicted": r.evicted, "last_event": r.last_event,
                        "error": r.error,
                    }));
                }
            } else {
                late += 1;
            }
        } else if r.enter_status == 201 || r.enter_status == 200 {
            never_admitted_waiting += 1;
        }
        for (pass, recv) in &r.rank_updates {
            match pass_at.get(pass) {
                Some(at) => {
                    let l = recv - *at as f64;
                    rank_lag.push(l);
                    by_pass.entry(*pass).or_default().push(l);
                }
                None => rank_unmatched += 1,
            }
        }
        if let Some(s) = r.order_status {
            *orders.entry(s.to_string()).or_default() += 1;
            if let Some(ms) = r.order_ms {
                order_ms.push(ms as f64);
            }
        }
        if let Some(e) = &r.order_error {
            *order_errors.entry(e.clone()).or_default() += 1;
        }
        if r.left_status == Some(204) {
            left_after_409 += 1;
        }
        if let Some(e) = &r.error {
            with_error += 1;
            let key: String = e.chars().take(120).collect();
            *errors.entry(key).or_default() += 1;
        }
    }
    let missing_results = admitted_in.keys().filter(|u| !seen.contains(*u)).count();
    let lost_n = lost.len();

    // Per pass: rank-update fan-out and ready lag.
    let passes_with_updates: Vec<Value> = by_pass
        .iter_mut()
        .map(|(pass, v)| {
            let s = summarize(v);
            json!({ "pass": pass, "n": s.n, "p50": s.p50, "p99": s.p99, "max": s.max })
        })
        .collect();
    // The leaves scenario: every rank update of the passes that ran in the
    // quiet window against those of the leaves window.
    let churn = if c.churn.is_null() {
        json!(null)
    } else {
        let lag_between = |from: &Value, to: &Value| {
            let (from, to) = (from.as_f64().unwrap_or(0.0), to.as_f64().unwrap_or(0.0));
            let mut v: Vec<f64> = by_pass
                .iter()
                .filter(|(p, _)| {
                    pass_at
                        .get(p)
                        .is_some_and(|&at| (at as f64) >= from && (at as f64) < to)
                })
                .flat_map(|(_, v)| v.iter().copied())
                .collect();
            summarize(&mut v)
        };
        let quiet = lag_between(&c.churn["quiet_from_ms"], &c.churn["quiet_to_ms"]);
        let busy = lag_between(&c.churn["churn_from_ms"], &c.churn["churn_to_ms"]);
        let ratio = match (quiet.p99, busy.p99) {
            (Some(q), Some(b)) if q > 0.0 => Some(b / q),
            _ => None,
        };
        let mut out = c.churn.clone();
        out["rank_update_lag_quiet_ms"] = json!(quiet);
        out["rank_update_lag_churn_ms"] = json!(busy);
        out["p99_ratio"] = json!(ratio);
        out["p99_within_2x"] = json!(ratio.map(|r| r <= 2.0));
        out
    };
    let biggest = by_pass.iter().max_by_key(|(_, v)| v.len()).map(|(p, _)| *p);
    let broadcast = biggest.map(|p| {
        let mut v = by_pass[&p].clone();
        json!({ "pass": p, "summary": summarize(&mut v) })
    });
    let first_admitting = log
        .passes
        .iter()
        .find(|p| p.admitted.iter().any(|(u, _)| ours(u)))
        .map(|p| p.pass);
    let first_broadcast = first_admitting
        .and_then(|p| by_pass.get(&p).cloned())
        .map(|mut v| json!({ "pass": first_admitting, "summary": summarize(&mut v) }));
    // The same pass measured on every stream it concerned: for each buyer
    // still waiting after it, the first frame of that pass or a later one
    // (a rank update or a `ready`), less the pass's time. The figure above
    // keeps only the streams that got the pass's own frame, and a stream
    // whose writer ran after the next pass skips to that one's frame, so
    // under load it leaves out exactly the slowest streams.
    let first_every_stream = first_admitting.and_then(|p| {
        let at = *pass_at.get(&p)? as f64;
        let mut lags = Vec::new();
        let mut without = 0u64;
        for r in results.iter().filter(|r| ours(&r.user)) {
            if admitted_in
                .get(r.user.as_str())
                .is_some_and(|(ap, _, _)| *ap <= p)
            {
                continue;
            }
            let rank = r
                .rank_updates
                .iter()
                .filter(|(q, _)| *q >= p)
                .map(|(_, t)| *t);
            let ready = r
                .ready
                .iter()
                .filter(|x| x.id.split('.').next().and_then(|q| q.parse::<u64>().ok()) >= Some(p))
                .map(|x| x.recv);
            match rank.chain(ready).min_by(f64::total_cmp) {
                Some(t) => lags.push(t - at),
                None => without += 1,
            }
        }
        Some(json!({ "pass": p, "summary": summarize(&mut lags), "streams_without_news": without }))
    });
    // Redis calls per waiting user per second in 30 s buckets from every
    // stream open to the release: the refresh schedule fills in over the
    // first couple of minutes.
    let mut redis_trend = Vec::new();
    if let (Some(open), Some(rel)) = (
        c.phases["all_open_s"].as_f64(),
        c.phases["release_s"].as_f64(),
    ) {
        let mut from = open;
        while from + 30.0 <= rel + 0.5 {
            let to = from + 30.0;
            let a_s = c.timeline.iter().find(|s| s.t >= from);
            let b_s = c.timeline.iter().rev().find(|s| s.t <= to);
            if let (Some(x), Some(y)) = (a_s, b_s)
                && let (Some(ca), Some(cb)) = (x.redis_calls, y.redis_calls)
                && y.t > x.t
            {
                let users = ((x.waiting + y.waiting) as f64 / 2.0).max(1.0);
                let per_s = (cb - ca) as f64 / (y.t - x.t);
                redis_trend.push(json!({
                    "from_s": x.t - open, "to_s": y.t - open, "calls_per_s": per_s,
                    "calls_per_user_s": per_s / users,
                }));
            }
            from = to;
        }
    }
    let series: Vec<Value> = log
        .passes
        .iter()
        .map(|p| {
            let mut lags = ready_lag_by_pass.get(&p.pass).cloned().unwrap_or_default();
            let s = summarize(&mut lags);
            let mut rl = by_pass.get(&p.pass).cloned().unwrap_or_default();
            let r = summarize(&mut rl);
            json!({
                "pass": p.pass, "t": (p.at as f64 - c.t0) / 1000.0, "admitted": p.admitted.len(),
                "waiting": p.waiting, "busy": p.busy, "abandoned": p.abandoned,
                "ready_lag_p50": s.p50, "ready_lag_p99": s.p99, "ready_lag_max": s.max, "readies": s.n,
                "rank_lag_p50": r.p50, "rank_lag_p99": r.p99, "rank_updates": r.n,
            })
        })
        .collect();
    let admitting: Vec<&crate::server::PassRec> = log
        .passes
        .iter()
        .filter(|p| !p.admitted.is_empty())
        .collect();
    let admission_rate = match (admitting.first(), admitting.last()) {
        (Some(f), Some(l)) if admitting.len() > 1 => {
            let n: usize = admitting.iter().skip(1).map(|p| p.admitted.len()).sum();
            Some(n as f64 / ((l.at - f.at) as f64 / 1000.0).max(1e-3))
        }
        _ => None,
    };

    let created = *orders.get("201").unwrap_or(&0);
    let stock = {
        let mut s = c.stock.clone();
        let sold = match (s["initial"].as_i64(), s["final"].as_i64()) {
            (Some(i), Some(f)) => Some(i - f),
            _ => None,
        };
        s["sold"] = json!(sold);
        s["orders_201"] = json!(created);
        s["consumed_events"] = json!(gone.get("consumed").copied().unwrap_or(0));
        s["never_negative"] = json!(s["min_seen"].as_i64().map(|m| m >= 0));
        s["sold_equals_201"] = json!(sold.map(|x| x == created as i64));
        s
    };
    let expected_ready = admitted_in.len() + fast;
    json!({
        "kind": "crowd",
        "mode": a.mode,
        "users": a.users,
        "run_id": c.prefix,
        "config": {
            "addr": a.addr, "queue": a.queue, "source_ips": a.source_ips, "connect_concurrency": a.connect_concurrency,
            "read_buf": a.read_buf, "plug": a.plug, "settle_secs": a.settle_secs, "steady_secs": a.steady_secs,
            "duration_secs": a.duration_secs, "orders": !a.no_orders, "leave_on_409": !a.keep_on_409,
            "workers": c.workers, "open_file_limit": c.nofile, "t0_unix_ms": c.t0,
        },
        "phases": c.phases,
        "plug": c.plug,
        "plug_released": c.unplugged,
        "enter": {
            "latency_ms": summarize(&mut enter), "status": enter_status,
        },
        "time_to_first_event_ms": summarize(&mut ttfe),
        "ready_lag_ms": summarize(&mut lag_event),
        "ready_lag_pubsub_ms": summarize(&mut lag_pubsub),
        "rank_update_lag_ms": summarize(&mut rank_lag),
        "rank_update_unmatched": rank_unmatched,
        "rank_update_broadcast": broadcast,
        "rank_update_first_admission": first_broadcast,
        "first_admission_every_stream": first_every_stream,
        "redis_trend_after_open": redis_trend,
        "first_admitting_pass": first_admitting,
        "events": {
            "waiting": waiting_ev, "ready": ready_ev, "gone": gone, "keepalives": keepalives,
            "polls": polls, "streams_opened": streams, "streams_shed": shed, "streams_evicted": evicted, "retries": retries,
            "users_never_streamed": never_streamed,
        },
        "readiness": {
            "expected": expected_ready, "admitted_by_passes": admitted_in.len(), "fast_tracked": fast,
            "users_with_ready": with_ready, "lost": lost_n, "lost_users": lost.iter().take(20).collect::<Vec<_>>(),
            "admitted_late_no_ready": late, "duplicated": dup, "token_mismatch": token_mismatch,
            "ready_without_pass": unexplained, "ready_without_admitted_at": no_admitted_at,
            "never_admitted": never_admitted_waiting, "admitted_without_result": missing_results,
            "abandoned_by_server": abandoned, "plug_admitted": plug_admitted,
        },
        "admission": {
            "passes": log.passes.len(), "admitting_passes": admitting.len(),
            "admitted": admitting.iter().map(|p| p.admitted.len()).sum::<usize>(),
            "admissions_per_s": admission_rate, "window": c.admission_window,
        },
        "orders": {
            "placed": orders.values().sum::<u64>(), "by_status": orders, "errors": order_errors,
            "left_after_409": left_after_409, "latency_ms": summarize(&mut order_ms),
        },
        "stock": stock,
        "steady": c.steady,
        "rss": c.rss,
        "errors": { "users_with_error": with_error, "by_message": errors },
        "channel": { "passes": log.passes.len(), "left": log.left, "consumed": log.consumed, "unreadable": log.unreadable },
        "generator_cpu_s": c.gen_cpu_s,
        "churn": churn,
        "series": { "passes": series, "rank_update_by_pass": passes_with_updates, "timeline": c.timeline },
    })
}

pub(super) fn sm(v: &Value) -> Summary {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

pub fn print_summary(r: &Value) {
    let f = |v: &Value| v.as_f64().map_or("-".into(), |x| format!("{x:.4}"));
    println!();
    println!(
        "== sse-gen {} crowd: {} users ==",
        r["mode"].as_str().unwrap_or("?"),
        r["users"]
    );
    println!(
        "enter:                 {}  status {}",
        sm(&r["enter"]["latency_ms"]).show(),
        r["enter"]["status"]
    );
    if r["mode"] == "sse" {
        println!(
            "time to first event:   {}",
            sm(&r["time_to_first_event_ms"]).show()
        );
        println!(
            "admission->ready:      {}  (admittedAt in the event)",
            sm(&r["ready_lag_ms"]).show()
        );
        println!(
            "rank update lag:       {}",
            sm(&r["rank_update_lag_ms"]).show()
        );
        if let Some(b) = r["rank_update_broadcast"].as_object() {
            println!(
                "  largest fan-out:     pass {} {}",
                b["pass"],
                sm(&b["summary"]).show()
            );
        }
    }
    println!(
        "admission->seen ready: {}  (pass time from pub/sub)",
        sm(&r["ready_lag_pubsub_ms"]).show()
    );
    let rd = &r["readiness"];
    println!(
        "ready: expected {} got {} lost {} duplicated {} token mismatch {} (late {}, never admitted {})",
        rd["expected"],
        rd["users_with_ready"],
        rd["lost"],
        rd["duplicated"],
        rd["token_mismatch"],
        rd["admitted_late_no_ready"],
        rd["never_admitted"]
    );
    println!("events: {}", r["events"]);
    let o = &r["orders"];
    println!(
        "orders: placed {} by status {} left after 409 {}",
        o["placed"], o["by_status"], o["left_after_409"]
    );
    println!("stock:  {}", r["stock"]);
    let s = &r["steady"];
    if !s.is_null() {
        println!(
            "steady {:.0} s, {} waiting: redis calls/user/s {} (evalsha {}), http/user/s {}, server CPU {} s",
            s["secs"].as_f64().unwrap_or(0.0),
            s["waiting_users"],
            f(&s["redis_calls_per_user_s"]),
            f(&s["evalsha_per_user_s"]),
            f(&s["http_per_user_s"]),
            f(&s["server_cpu_s"])
        );
    }
    if !r["rss"].is_null() {
        println!(
            "server RSS: before {} KiB, with {} {} {} KiB: {} KiB per {}",
            r["rss"]["before_kib"],
            r["rss"]["open"],
            if r["mode"] == "sse" {
                "streams"
            } else {
                "polling users"
            },
            r["rss"]["with_streams_kib"],
            f(&r["rss"]["per_stream_kib"]),
            if r["mode"] == "sse" {
                "stream"
            } else {
                "polling user"
            }
        );
    }
    let ad = &r["admission"];
    println!(
        "admission: {} admitted in {} passes, {} /s; window {}",
        ad["admitted"],
        ad["admitting_passes"],
        f(&ad["admissions_per_s"]),
        short_window(&ad["window"])
    );
    let ch = &r["churn"];
    if !ch.is_null() {
        println!(
            "leaves: {} at {:.0}/s achieved ({} streams open at the end)",
            ch["leaves"]["ok"],
            ch["leaves"]["achieved_per_s"].as_f64().unwrap_or(0.0),
            ch["streams_open_at_churn_end"]
        );
        println!(
            "  rank update lag, quiet:  {}",
            sm(&ch["rank_update_lag_quiet_ms"]).show()
        );
        println!(
            "  rank update lag, leaves: {}",
            sm(&ch["rank_update_lag_churn_ms"]).show()
        );
        println!(
            "  p99 leaves / quiet: {} (target <= 2)",
            f(&ch["p99_ratio"])
        );
    }
    println!("errors: {}", r["errors"]);
}
