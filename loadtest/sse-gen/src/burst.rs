//! A closed-loop burst of enters: `--concurrency` keep-alive connections
//! each send the next distinct user's `POST /entries` as soon as the last
//! one answered, until `--users` enters were sent (or the time is up).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;
use tokio::time::Instant;

use crate::http::{Conn, SourceIps, ensure_loopback};
use crate::stats::summarize;

#[derive(clap::Args, Clone, Debug)]
pub struct BurstArgs {
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: String,
    #[arg(long, default_value = "default")]
    pub queue: String,
    /// Enters to send (distinct users).
    #[arg(long, default_value_t = 10_000)]
    pub users: usize,
    /// Connections, each with one request in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    #[arg(long, default_value = "127.0.0.2-127.0.0.11")]
    pub source_ips: String,
    #[arg(long)]
    pub run_id: Option<String>,
    /// Hard limit.
    #[arg(long, default_value_t = 60)]
    pub duration_secs: u64,
    #[arg(long, default_value = "sse-gen-burst.json")]
    pub out: PathBuf,
}

pub async fn run(a: BurstArgs) -> anyhow::Result<()> {
    crate::server::raise_nofile();
    let addr: SocketAddr = a.addr.parse().context("--addr")?;
    ensure_loopback(&addr)?;
    let ips = SourceIps::parse(&a.source_ips)?;
    let run_id = a
        .run_id
        .clone()
        .unwrap_or_else(|| format!("{:06x}", rand::random_range(0..0xff_ffffu32)));
    let next = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(a.duration_secs);
    let path = format!("/api/queues/{}/entries", a.queue);
    let start = Instant::now();
    let mut handles = Vec::new();
    for k in 0..a.concurrency.max(1) {
        let (next, path, run_id) = (next.clone(), path.clone(), run_id.clone());
        let ip = ips.pick(k);
        let users = a.users;
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut status: BTreeMap<u16, u64> = BTreeMap::new();
            let mut errors = 0u64;
            let mut ready = 0u64;
            let mut conn: Option<Conn> = None;
            while Instant::now() < deadline {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= users {
                    break;
                }
                let user = format!("b{run_id}-{i}");
                let t = Instant::now();
                let c = match conn.take() {
                    Some(c) => c,
                    None => match Conn::connect(ip, addr, 2048).await {
                        Ok(c) => c,
                        Err(_) => {
                            errors += 1;
                            continue;
                        }
                    },
                };
                let mut c = c;
                let r = tokio::time::timeout_at(
                    deadline,
                    c.request(
                        "POST",
                        &path,
                        &[("X-User-Id", &user), ("Accept", "application/json")],
                        None,
                    ),
                )
                .await;
                match r {
                    Ok(Ok(r)) => {
                        lat.push(t.elapsed().as_secs_f64() * 1000.0);
                        *status.entry(r.status).or_default() += 1;
                        if r.body.windows(15).any(|w| w == b"\"status\":\"READY") {
                            ready += 1;
                        }
                        if !r.close {
                            conn = Some(c);
                        }
                    }
                    _ => errors += 1,
                }
            }
            (lat, status, errors, ready)
        }));
    }
    let mut lat = Vec::new();
    let mut status: BTreeMap<String, u64> = BTreeMap::new();
    let (mut errors, mut ready) = (0, 0);
    for h in handles {
        if let Ok((l, s, e, r)) = h.await {
            lat.extend(l);
            for (k, v) in s {
                *status.entry(k.to_string()).or_default() += v;
            }
            errors += e;
            ready += r;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let ok = *status.get("201").unwrap_or(&0);
    let sent = lat.len();
    let report = json!({
        "kind": "burst",
        "users": a.users,
        "concurrency": a.concurrency,
        "sent": sent,
        "created_201": ok,
        "status": status,
        "errors": errors,
        "fast_tracked": ready,
        "secs": secs,
        "enters_per_s": sent as f64 / secs.max(1e-9),
        "latency_ms": summarize(&mut lat),
    });
    std::fs::write(&a.out, serde_json::to_vec_pretty(&report)?)?;
    println!(
        "burst: {} enters ({} x 201, {} errors) in {:.2} s = {:.0}/s over {} connections; latency {}",
        sent,
        ok,
        errors,
        secs,
        report["enters_per_s"].as_f64().unwrap_or(0.0),
        a.concurrency,
        crate::stats::summarize(&mut lat.clone()).show()
    );
    Ok(())
}
