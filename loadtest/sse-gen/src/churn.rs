//! The churn of the leaves scenario: a pool of extra buyers joins behind
//! the crowd, then leaves at a fixed rate while the crowd's streams are
//! open, so the run can compare the crowd's rank-update lag with and
//! without a flood of leaves (each leave is one event every instance's
//! push hub must apply).
//!
//! Both run over a fixed set of keep-alive connections (no connect per
//! request), each sending its share of the requests on its own schedule.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::{Instant, MissedTickBehavior};

use crate::crowd::Ctx;
use crate::http::Conn;

/// Connections the pool joins and leaves over.
const CONNS: usize = 64;

/// How the leaves went.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LeaveStats {
    /// Leaves sent / answered 204 / answered otherwise or failed.
    pub sent: u64,
    pub ok: u64,
    pub failed: u64,
    /// Wall time from the first leave sent to the last answer.
    pub secs: f64,
    /// `ok / secs`.
    pub achieved_per_s: f64,
}

/// `n` pool buyers (`<prefix>-churn-<i>`) join; their tickets, in order.
pub async fn join_pool(ctx: Arc<Ctx>, prefix: &str, n: usize) -> Vec<String> {
    let conns = CONNS.min(n.max(1));
    let mut handles = Vec::new();
    for k in 0..conns {
        let ctx = ctx.clone();
        let prefix = prefix.to_owned();
        handles.push(tokio::spawn(async move {
            let path = format!("/api/queues/{}/entries", ctx.queue);
            let mut conn: Option<Conn> = None;
            let mut tickets = Vec::new();
            for i in (k..n).step_by(conns) {
                if Instant::now() >= ctx.deadline {
                    break;
                }
                let user = format!("{prefix}-churn-{i}");
                if conn.is_none() {
                    conn = Conn::connect(ctx.ips.pick(i), ctx.addr, 4096).await.ok();
                }
                let Some(c) = conn.as_mut() else { continue };
                match c
                    .request("POST", &path, &[("X-User-Id", &user)], None)
                    .await
                {
                    Ok(r) if r.status == 201 || r.status == 200 => {
                        let v: serde_json::Value =
                            serde_json::from_slice(&r.body).unwrap_or_default();
                        if let Some(t) = v["ticket"].as_str() {
                            tickets.push((i, t.to_owned()));
                        }
                    }
                    Ok(_) => {}
                    Err(_) => conn = None,
                }
            }
            tickets
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        if let Ok(mut t) = h.await {
            all.append(&mut t);
        }
    }
    all.sort_unstable_by_key(|(i, _)| *i);
    all.into_iter().map(|(_, t)| t).collect()
}

/// The pool leaves at `rate` per second for at most `secs` (or until every
/// ticket is used): each connection sends every `CONNS / rate` seconds,
/// the connections' phases spread evenly.
pub async fn leave_at_rate(
    ctx: Arc<Ctx>,
    tickets: Vec<String>,
    rate: f64,
    secs: u64,
) -> LeaveStats {
    let tickets = Arc::new(tickets);
    let conns = CONNS.min(tickets.len().max(1));
    let period = Duration::from_secs_f64(conns as f64 / rate.max(1e-3));
    let start = Instant::now();
    let until = (start + Duration::from_secs(secs)).min(ctx.deadline);
    let mut handles = Vec::new();
    for k in 0..conns {
        let (ctx, tickets) = (ctx.clone(), tickets.clone());
        handles.push(tokio::spawn(async move {
            let path = format!("/api/queues/{}/entries/me", ctx.queue);
            let phase = period.mul_f64(k as f64 / conns as f64);
            let mut tick = tokio::time::interval_at(start + phase, period);
            // Behind schedule (a slow server) the rate drops; the achieved
            // rate is reported rather than caught up in bursts.
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut conn: Option<Conn> = None;
            let (mut sent, mut ok, mut failed) = (0u64, 0u64, 0u64);
            for i in (k..tickets.len()).step_by(conns) {
                tick.tick().await;
                if Instant::now() >= until {
                    break;
                }
                if conn.is_none() {
                    conn = Conn::connect(ctx.ips.pick(i), ctx.addr, 1024).await.ok();
                }
                let Some(c) = conn.as_mut() else {
                    failed += 1;
                    continue;
                };
                sent += 1;
                match c
                    .request("DELETE", &path, &[("X-Queue-Ticket", &tickets[i])], None)
                    .await
                {
                    Ok(r) if r.status == 204 => ok += 1,
                    Ok(_) => failed += 1,
                    Err(_) => {
                        failed += 1;
                        conn = None;
                    }
                }
            }
            (sent, ok, failed)
        }));
    }
    let mut stats = LeaveStats::default();
    for h in handles {
        if let Ok((s, o, f)) = h.await {
            stats.sent += s;
            stats.ok += o;
            stats.failed += f;
        }
    }
    stats.secs = start.elapsed().as_secs_f64();
    stats.achieved_per_s = stats.ok as f64 / stats.secs.max(1e-9);
    stats
}
