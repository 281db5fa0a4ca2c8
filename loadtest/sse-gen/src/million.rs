//! A queue grown to a million: `--concurrency` keep-alive connections join
//! distinct buyers closed-loop until `--waiting` buyers wait (or the time is
//! up), while some of the first joiners hold SSE streams and others poll
//! their position, and the server admits on its own schedule.
//!
//! Reports joins/s and join latency (p50/p99/max), the same per second of
//! the run (so a stall shows where it happened), poll latency, events
//! read, and the server's RSS growth per waiting buyer when `--sample-at`
//! were waiting and at the end (`(VmRSS - VmRSS before) / waiting`).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;
use tokio::time::Instant;

use crate::http::{BodyState, Conn, SourceIps, SseParser, ensure_loopback};
use crate::server::rss_kib;
use crate::stats::summarize;

#[derive(clap::Args, Clone, Debug)]
pub struct MillionArgs {
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: String,
    /// The operator listener (`--admin-addr` of the server): waiting counts.
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub admin_addr: String,
    #[arg(long)]
    pub admin_token: String,
    /// The server's process id, for its RSS.
    #[arg(long)]
    pub pid: u32,
    #[arg(long, default_value = "default")]
    pub queue: String,
    /// Stop joining once this many wait.
    #[arg(long, default_value_t = 1_000_000)]
    pub waiting: u64,
    /// Also report RSS per waiting buyer when this many wait.
    #[arg(long, default_value_t = 200_000)]
    pub sample_at: u64,
    /// Join connections, each with one request in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Buyers (of the first joiners) holding an SSE stream.
    #[arg(long, default_value_t = 300)]
    pub streams: usize,
    /// Position polls per second, over `--pollers` buyers in turn.
    #[arg(long, default_value_t = 100)]
    pub polls_per_sec: u64,
    #[arg(long, default_value_t = 2_000)]
    pub pollers: usize,
    #[arg(long, default_value = "127.0.0.2-127.0.0.11")]
    pub source_ips: String,
    /// Hard limit.
    #[arg(long, default_value_t = 180)]
    pub duration_secs: u64,
    #[arg(long, default_value = "sse-gen-million.json")]
    pub out: PathBuf,
}

/// Shared between the tasks.
struct Ctx {
    addr: SocketAddr,
    queue: String,
    ips: SourceIps,
    deadline: Instant,
    start: Instant,
    /// Set once enough wait (or the time is up): every task winds down.
    done: AtomicBool,
    /// Tickets of the first joiners: streams first, then pollers.
    tickets: Mutex<Vec<String>>,
    want_tickets: usize,
    events: AtomicU64,
    stream_errors: AtomicU64,
}

fn ticket_of(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get("ticket")?.as_str().map(str::to_owned)
}

/// Joins until done; (latency ms, ms since start) per join, status counts,
/// errors.
async fn joiner(ctx: Arc<Ctx>, k: usize, next: Arc<AtomicUsize>, run_id: String) -> JoinerOut {
    let path = format!("/api/queues/{}/entries", ctx.queue);
    let ip = ctx.ips.pick(k);
    let mut out = JoinerOut::default();
    let mut conn: Option<Conn> = None;
    while !ctx.done.load(Relaxed) && Instant::now() < ctx.deadline {
        let i = next.fetch_add(1, Relaxed);
        let user = format!("m{run_id}-{i}");
        let t = Instant::now();
        let mut c = match conn.take() {
            Some(c) => c,
            None => match Conn::connect(ip, ctx.addr, 2048).await {
                Ok(c) => c,
                Err(_) => {
                    out.errors += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let headers = [("X-User-Id", user.as_str()), ("Accept", "application/json")];
        let r = tokio::time::timeout_at(ctx.deadline, c.request("POST", &path, &headers, None));
        match r.await {
            Ok(Ok(r)) => {
                out.lat.push(t.elapsed().as_secs_f64() * 1000.0);
                out.at.push((t - ctx.start).as_millis() as u32);
                *out.status.entry(r.status).or_default() += 1;
                if r.status == 201
                    && i < ctx.want_tickets
                    && let Some(ticket) = ticket_of(&r.body)
                {
                    ctx.tickets
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(ticket);
                }
                if !r.close {
                    conn = Some(c);
                }
            }
            _ => out.errors += 1,
        }
    }
    out
}

#[derive(Default)]
struct JoinerOut {
    lat: Vec<f64>,
    at: Vec<u32>,
    status: std::collections::BTreeMap<u16, u64>,
    errors: u64,
}

/// One SSE stream read (and dropped) until done.
async fn stream(ctx: Arc<Ctx>, k: usize, ticket: String) {
    let path = format!("/api/queues/{}/events", ctx.queue);
    let Ok(mut c) = Conn::connect(ctx.ips.pick(k), ctx.addr, 512).await else {
        ctx.stream_errors.fetch_add(1, Relaxed);
        return;
    };
    let headers = [
        ("X-Queue-Ticket", ticket.as_str()),
        ("Accept", "text/event-stream"),
    ];
    if c.send("GET", &path, &headers, None).await.is_err() {
        ctx.stream_errors.fetch_add(1, Relaxed);
        return;
    }
    let Ok(head) = c.head().await else {
        ctx.stream_errors.fetch_add(1, Relaxed);
        return;
    };
    if head.status != 200 {
        ctx.stream_errors.fetch_add(1, Relaxed);
        return;
    }
    let (mut body, mut parser) = (BodyState::default(), SseParser::default());
    let read = c.read_events(&head, &mut body, &mut parser, |item| {
        if matches!(item, crate::http::SseItem::Event { .. }) {
            ctx.events.fetch_add(1, Relaxed);
        }
        !ctx.done.load(Relaxed)
    });
    let _ = tokio::time::timeout_at(ctx.deadline, read).await;
}

/// Polls positions at a fixed rate over the poller tickets; latencies, statuses.
async fn poller(
    ctx: Arc<Ctx>,
    per_sec: u64,
    first: usize,
) -> (Vec<f64>, std::collections::BTreeMap<u16, u64>) {
    let path = format!("/api/queues/{}/position", ctx.queue);
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_sec.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut lat, mut status) = (Vec::new(), std::collections::BTreeMap::new());
    let mut conn: Option<Conn> = None;
    let mut n = 0usize;
    while !ctx.done.load(Relaxed) && Instant::now() < ctx.deadline {
        tick.tick().await;
        let ticket = {
            let tickets = ctx.tickets.lock().unwrap_or_else(|e| e.into_inner());
            if tickets.len() <= first {
                continue;
            }
            tickets[first + n % (tickets.len() - first)].clone()
        };
        n += 1;
        let mut c = match conn.take() {
            Some(c) => c,
            None => match Conn::connect(Ipv4Addr::new(127, 0, 0, 1), ctx.addr, 2048).await {
                Ok(c) => c,
                Err(_) => continue,
            },
        };
        let t = Instant::now();
        let headers = [("X-Queue-Ticket", ticket.as_str())];
        let r = c.request("GET", &path, &headers, None);
        if let Ok(Ok(r)) = tokio::time::timeout_at(ctx.deadline, r).await {
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
            *status.entry(r.status).or_default() += 1;
            if !r.close {
                conn = Some(c);
            }
        }
    }
    (lat, status)
}

/// The queue's waiting count from the operator API.
async fn waiting(admin: SocketAddr, token: &str, queue: &str) -> Option<u64> {
    let mut c = Conn::connect(Ipv4Addr::new(127, 0, 0, 1), admin, 4096)
        .await
        .ok()?;
    let auth = format!("Bearer {token}");
    let r = c
        .request(
            "GET",
            "/api/admin/queues",
            &[("Authorization", &auth), ("Connection", "close")],
            None,
        )
        .await
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
    v["queues"]
        .as_array()?
        .iter()
        .find(|q| q["queue"] == queue)?["waiting"]
        .as_u64()
}

pub async fn run(a: MillionArgs) -> anyhow::Result<()> {
    crate::server::raise_nofile();
    let addr: SocketAddr = a.addr.parse().context("--addr")?;
    let admin: SocketAddr = a.admin_addr.parse().context("--admin-addr")?;
    ensure_loopback(&addr)?;
    ensure_loopback(&admin)?;
    let rss0 = rss_kib(a.pid).context("no such server process")?;
    let start = Instant::now();
    let ctx = Arc::new(Ctx {
        addr,
        queue: a.queue.clone(),
        ips: SourceIps::parse(&a.source_ips)?,
        deadline: start + Duration::from_secs(a.duration_secs),
        start,
        done: AtomicBool::new(false),
        tickets: Mutex::new(Vec::new()),
        want_tickets: a.streams + a.pollers,
        events: AtomicU64::new(0),
        stream_errors: AtomicU64::new(0),
    });
    let run_id = format!("{:06x}", rand::random_range(0..0xff_ffffu32));
    let next = Arc::new(AtomicUsize::new(0));
    let joiners: Vec<_> = (0..a.concurrency.max(1))
        .map(|k| tokio::spawn(joiner(ctx.clone(), k, next.clone(), run_id.clone())))
        .collect();
    let polls = tokio::spawn(poller(ctx.clone(), a.polls_per_sec, a.streams));
    // Streams open as their tickets come in; RSS is sampled as the line grows.
    let mut streams = Vec::new();
    let mut samples = Vec::new();
    let mut at_sample = None;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let tickets: Vec<String> = {
            let t = ctx.tickets.lock().unwrap_or_else(|e| e.into_inner());
            t.iter()
                .take(a.streams)
                .skip(streams.len())
                .cloned()
                .collect()
        };
        for ticket in tickets {
            streams.push(tokio::spawn(stream(ctx.clone(), streams.len(), ticket)));
        }
        let w = waiting(admin, &a.admin_token, &a.queue).await;
        let rss = rss_kib(a.pid).unwrap_or(0);
        let secs = start.elapsed().as_secs_f64();
        if let Some(w) = w {
            let per = (rss.saturating_sub(rss0) * 1024) as f64 / w.max(1) as f64;
            samples.push(
                json!({"secs": secs, "waiting": w, "rss_kib": rss, "bytes_per_waiting": per}),
            );
            if at_sample.is_none() && w >= a.sample_at {
                at_sample = Some(json!({"waiting": w, "bytes_per_waiting": per, "secs": secs}));
            }
            if w >= a.waiting {
                break;
            }
        }
        if Instant::now() >= ctx.deadline {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let final_waiting = waiting(admin, &a.admin_token, &a.queue).await.unwrap_or(0);
    let final_rss = rss_kib(a.pid).unwrap_or(0);
    ctx.done.store(true, Relaxed);
    let (mut lat, mut at) = (Vec::new(), Vec::new());
    let mut status: std::collections::BTreeMap<String, u64> = Default::default();
    let mut errors = 0;
    for j in joiners {
        if let Ok(o) = j.await {
            lat.extend(o.lat);
            at.extend(o.at);
            for (k, v) in o.status {
                *status.entry(k.to_string()).or_default() += v;
            }
            errors += o.errors;
        }
    }
    let (mut poll_lat, poll_status) = polls.await.unwrap_or_default();
    for s in streams {
        s.abort();
    }
    // Per second of the run: joins and the slowest one.
    let mut per_sec: Vec<(u64, f64)> = vec![(0, 0.0); (secs.ceil() as usize).max(1) + 1];
    for (&ms, &l) in at.iter().zip(&lat) {
        let s = &mut per_sec[(ms as usize / 1000).min(secs.ceil() as usize)];
        s.0 += 1;
        s.1 = s.1.max(l);
    }
    let joins = lat.len();
    let join_summary = summarize(&mut lat);
    let poll_summary = summarize(&mut poll_lat);
    let per_waiting = (final_rss.saturating_sub(rss0) * 1024) as f64 / final_waiting.max(1) as f64;
    let report = json!({
        "kind": "million",
        "concurrency": a.concurrency,
        "target_waiting": a.waiting,
        "joins": joins,
        "status": status,
        "errors": errors,
        "secs": secs,
        "joins_per_s": joins as f64 / secs.max(1e-9),
        "join_latency_ms": join_summary,
        "poll_latency_ms": poll_summary,
        "poll_status": poll_status.iter().map(|(k, v)| (k.to_string(), *v)).collect::<std::collections::BTreeMap<_, _>>(),
        "streams": a.streams,
        "stream_errors": ctx.stream_errors.load(Relaxed),
        "events": ctx.events.load(Relaxed),
        "rss0_kib": rss0,
        "at_sample": at_sample,
        "final": {"waiting": final_waiting, "rss_kib": final_rss, "bytes_per_waiting": per_waiting},
        "per_second": per_sec.iter().map(|(n, max)| json!({"joins": n, "max_ms": max})).collect::<Vec<_>>(),
        "samples": samples,
    });
    std::fs::write(&a.out, serde_json::to_vec_pretty(&report)?)?;
    println!(
        "million: {joins} joins in {secs:.1} s = {:.0}/s, {final_waiting} waiting; joins {}; polls {}; {} events on {} streams ({} failed); RSS/waiting {} B at {} waiting, {per_waiting:.0} B at the end",
        report["joins_per_s"].as_f64().unwrap_or(0.0),
        join_summary.show(),
        poll_summary.show(),
        report["events"],
        a.streams,
        report["stream_errors"],
        report["at_sample"]["bytes_per_waiting"],
        report["at_sample"]["waiting"],
    );
    Ok(())
}
