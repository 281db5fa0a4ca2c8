//! `sse-gen soak`: a long, steady run against several instances on one
//! Redis, watching for anything that grows.
//!
//! Buyers join at `--join-rate`, spread over the instances; each waits by
//! SSE (some drop their stream once and reopen it on another instance) or
//! by polling, leaves when its patience runs out (exponential, mean
//! `--patience-secs`: the queue settles where leaves plus admission match
//! the joins), and once admitted orders or lets its token expire. Every
//! `--sample-secs` the run records each instance's RSS, open descriptors
//! and open streams, Redis `used_memory` and key count, and the admission
//! rate heard on the queue's pass channel. When the load phase ends the
//! waiting buyers leave and the run waits (at most `--drain-secs`) for the
//! descriptors to come back to their baseline and Redis to its constant
//! keys. The report (`<out>.json`, `.md`, `.svg`) judges the pass criteria.

mod buyer;
mod chart;
mod report;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use tokio::time::{Instant, MissedTickBehavior};

use crate::coord::setup;
use crate::http::{SourceIps, ensure_loopback};
use crate::server::{self, ChannelLog};
use buyer::{Counters, World};

#[derive(clap::Args, Clone, Debug)]
pub struct SoakArgs {
    /// The instances (loopback only), comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub addrs: Vec<String>,
    /// Their operator listeners, same order: streams open (/metrics) and
    /// the restock.
    #[arg(long, value_delimiter = ',')]
    pub admin_addrs: Vec<String>,
    /// Their pids, same order: RSS and open descriptors from /proc.
    #[arg(long, value_delimiter = ',')]
    pub server_pids: Vec<u32>,
    /// The instances' Redis (its own: every key in it counts).
    #[arg(long)]
    pub redis_url: String,
    /// The instances' --key-prefix.
    #[arg(long, default_value = "waitroom")]
    pub key_prefix: String,
    #[arg(long, default_value = "default")]
    pub queue: String,
    /// Sets the queue's first product's stock before the run.
    #[arg(long)]
    pub admin_token: Option<String>,
    #[arg(long, default_value_t = 10_000_000)]
    pub stock: i64,
    /// The load phase.
    #[arg(long, default_value_t = 1800)]
    pub duration_secs: u64,
    /// Most time after the load for buyers to leave, tokens to expire and
    /// descriptors to close.
    #[arg(long, default_value_t = 240)]
    pub drain_secs: u64,
    /// Joins per second, all instances together.
    #[arg(long, default_value_t = 30.0)]
    pub join_rate: f64,
    /// The admission rate the instances are configured for, per second
    /// (batch × 1000 / interval ms).
    #[arg(long)]
    pub configured_rate: f64,
    /// Mean patience of a waiting buyer (exponential), seconds.
    #[arg(long, default_value_t = 120)]
    pub patience_secs: u64,
    /// Share of buyers who poll instead of holding a stream.
    #[arg(long, default_value_t = 0.2)]
    pub poll_share: f64,
    /// Share of streaming buyers whose stream drops once (3-30 s in) and
    /// is reopened on the next instance.
    #[arg(long, default_value_t = 0.3)]
    pub drop_share: f64,
    /// Share of admitted buyers who order; the others let the token expire.
    #[arg(long, default_value_t = 0.6)]
    pub order_share: f64,
    /// Most buyers alive at once (the generator's open files).
    #[arg(long, default_value_t = 15_000)]
    pub max_buyers: usize,
    #[arg(long, default_value_t = 10)]
    pub sample_secs: u64,
    /// RSS and Redis memory must be flat over the load's last this many
    /// seconds (at most its last two thirds).
    #[arg(long, default_value_t = 1200)]
    pub flat_secs: u64,
    /// Samples before this are warm-up for the admission-rate criterion.
    #[arg(long, default_value_t = 60)]
    pub warmup_secs: u64,
    #[arg(long, default_value = "127.0.0.2-127.0.0.11")]
    pub source_ips: String,
    /// Output path without extension: `<out>.json`, `<out>.md`, `<out>.svg`.
    #[arg(long, default_value = "soak")]
    pub out: PathBuf,
    /// Lines added under the table (how it was run).
    #[arg(long)]
    pub note: Vec<String>,
}

/// One point of the time line.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the load began.
    pub t: f64,
    /// In the load phase (else the drain).
    pub load: bool,
    pub rss_kib: Vec<u64>,
    pub fds: Vec<u64>,
    pub streams: Vec<f64>,
    pub used_memory: u64,
    /// The part of `used_memory` that is client buffers
    /// (`mem_clients_normal`: pub/sub output waiting for a slow reader),
    /// to tell a lagging subscriber from data that grows.
    pub redis_clients: u64,
    pub keys: u64,
    /// Admitted per second between the last pass heard by the previous
    /// sample and the last one heard by this one (Redis clock): windows
    /// aligned with passes, so a pass is never split between two samples
    /// nor its delivery delay counted as a gap.
    pub admit_rate: f64,
    /// Waiting after the last pass.
    pub waiting: u64,
    pub buyers: u64,
    pub joins: u64,
    pub leaves: u64,
    pub drops: u64,
    pub ready: u64,
    pub orders: u64,
    pub expiring: u64,
    pub polls: u64,
    pub errors: u64,
}

fn fd_count(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

/// What the sampler reads Redis with.
struct Probe {
    redis: redis::aio::MultiplexedConnection,
    pids: Vec<u32>,
    admins: Vec<Option<SocketAddr>>,
    log: Arc<Mutex<ChannelLog>>,
    /// Passes already counted.
    seen_passes: usize,
    /// Redis-clock time of the last pass counted: where the next
    /// admission window starts.
    last_pass_at: Option<u64>,
    last: Instant,
}

impl Probe {
    async fn sample(&mut self, t0: Instant, load: bool, c: &Counters) -> anyhow::Result<Sample> {
        // Descriptors and RSS first: the metrics scrape below opens a
        // connection the instance may not have closed yet when read.
        let rss_kib = self
            .pids
            .iter()
            .map(|p| server::rss_kib(*p).unwrap_or(0))
            .collect();
        let fds = self.pids.iter().map(|p| fd_count(*p)).collect();
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut self.redis)
            .await?;
        let field = |name: &str| -> u64 {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        let (used_memory, redis_clients) = (field("used_memory"), field("mem_clients_normal"));
        let keys: u64 = redis::cmd("DBSIZE").query_async(&mut self.redis).await?;
        let mut streams = Vec::new();
        for a in &self.admins {
            streams.push(server::streams_open(*a).await.unwrap_or(f64::NAN));
        }
        let local_secs = self.last.elapsed().as_secs_f64().max(1e-3);
        self.last = Instant::now();
        let (admit_rate, waiting) = {
            let log = self.log.lock().unwrap();
            let new = &log.passes[self.seen_passes.min(log.passes.len())..];
            let admitted: usize = new.iter().map(|p| p.admitted.len()).sum();
            let waiting = log.passes.last().map_or(0, |p| p.waiting);
            self.seen_passes = log.passes.len();
            // The bucket refills continuously and each pass takes all it
            // holds: what passes in (a, b] admitted is what refilled over
            // b - a, give or take one token's fraction.
            let rate = match (self.last_pass_at, new.last()) {
                (Some(from), Some(p)) if p.at > from => {
                    admitted as f64 * 1000.0 / (p.at - from) as f64
                }
                (_, None) => 0.0,
                // No earlier pass to start from: the local clock.
                _ => admitted as f64 / local_secs,
            };
            if let Some(p) = new.last() {
                self.last_pass_at = Some(p.at);
            }
            (rate, waiting)
        };
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Relaxed);
        Ok(Sample {
            t: t0.elapsed().as_secs_f64(),
            load,
            rss_kib,
            fds,
            streams,
            used_memory,
            redis_clients,
            keys,
            admit_rate,
            waiting,
            buyers: get(&c.alive),
            joins: get(&c.joins),
            leaves: get(&c.leaves),
            drops: get(&c.drops),
            ready: get(&c.ready),
            orders: get(&c.orders_ok),
            expiring: get(&c.expiring),
            polls: get(&c.polls),
            errors: get(&c.errors) + get(&c.join_errors),
        })
    }

    async fn key_names(&mut self) -> anyhow::Result<BTreeSet<String>> {
        let mut names = BTreeSet::new();
        let mut cursor = 0u64;
        // Bounded: a few thousand keys at most when this is called.
        for _ in 0..10_000 {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut self.redis)
                .await?;
            names.extend(batch);
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        Ok(names)
    }
}

/// One buyer's whole path on `addr`, errors ignored (the run counts only
/// its own buyers).
async fn warm_up(addr: SocketAddr, queue: &str, product: Option<&str>) {
    let ip = std::net::Ipv4Addr::new(127, 0, 0, 1);
    let user = format!("warm-{}", rand::random_range(0..u32::MAX));
    let Ok(mut c) = crate::http::Conn::connect(ip, addr, 4096).await else {
        return;
    };
    let path = format!("/api/queues/{queue}/entries");
    let Ok(r) = c
        .request("POST", &path, &[("X-User-Id", &user)], None)
        .await
    else {
        return;
    };
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
    let (ticket, token) = (
        v["ticket"].as_str().unwrap_or_default(),
        v["entryToken"].as_str().unwrap_or_default(),
    );
    if let Some(product) = product {
        let body = format!(
            "{{\"productId\":{},\"quantity\":1}}",
            serde_json::Value::from(product)
        );
        let headers = [
            ("X-User-Id", user.as_str()),
            ("X-Entry-Token", token),
            ("Content-Type", "application/json"),
        ];
        let _ = c
            .request("POST", "/api/orders", &headers, Some(body.as_bytes()))
            .await;
    }
    let path = format!("/api/queues/{queue}/events");
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        c.send("GET", &path, &[("X-Queue-Ticket", ticket)], None)
            .await?;
        c.head().await
    })
    .await;
}

pub async fn run(a: SoakArgs) -> anyhow::Result<()> {
    server::raise_nofile();
    let addrs: Vec<SocketAddr> = a
        .addrs
        .iter()
        .map(|s| s.parse().context("--addrs"))
        .collect::<anyhow::Result<_>>()?;
    for addr in &addrs {
        ensure_loopback(addr)?;
    }
    let admins: Vec<Option<SocketAddr>> = (0..addrs.len())
        .map(|i| a.admin_addrs.get(i).and_then(|s| s.parse().ok()))
        .collect();
    anyhow::ensure!(
        a.join_rate > 0.0 && a.join_rate <= 2000.0,
        "--join-rate 0-2000"
    );
    anyhow::ensure!(
        a.duration_secs > 0 && a.duration_secs <= 3600,
        "--duration-secs 1-3600"
    );
    anyhow::ensure!(a.drain_secs <= 1800, "--drain-secs at most 1800");
    let client = redis::Client::open(a.redis_url.as_str())?;
    let redis = client.get_multiplexed_async_connection().await?;

    let product = setup::products(addrs[0])
        .await?
        .into_iter()
        .find(|p| p["queue"] == a.queue.as_str());
    // Each instance may have its own order database: stock every one.
    if let (Some(p), Some(token)) = (&product, &a.admin_token) {
        for admin in admins.iter().flatten() {
            setup::set_stock(*admin, p, a.stock, token).await?;
        }
    }
    let product = product.and_then(|p| p["id"].as_str().map(str::to_owned));

    let log = Arc::new(Mutex::new(ChannelLog::default()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let channel = format!("{}:{{{}}}:events", a.key_prefix, a.queue);
    let listener =
        server::listen_passes(&a.redis_url, channel, log.clone(), stop_rx, false).await?;

    let (end_tx, end_rx) = tokio::sync::watch::channel(false);
    let world = Arc::new(World {
        addrs: addrs.clone(),
        queue: a.queue.clone(),
        ips: SourceIps::parse(&a.source_ips)?,
        product,
        poll_share: a.poll_share.clamp(0.0, 1.0),
        drop_share: a.drop_share.clamp(0.0, 1.0),
        order_share: a.order_share.clamp(0.0, 1.0),
        patience: Duration::from_secs(a.patience_secs.max(1)),
        counters: Counters::default(),
        end: end_rx,
    });
    let mut probe = Probe {
        redis,
        pids: a.server_pids.clone(),
        admins,
        log: log.clone(),
        seen_passes: 0,
        last_pass_at: None,
        last: Instant::now(),
    };
    // Every lazily opened descriptor (the order database's journal, pooled
    // connections) is opened before the baseline: one buyer per instance
    // joins (fast-tracked: nobody waits yet), orders and watches its stream.
    for addr in &addrs {
        warm_up(*addr, &a.queue, world.product.as_deref()).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t0 = Instant::now();
    let baseline = probe.sample(t0, true, &world.counters).await?;
    let baseline_keys = probe.key_names().await?;
    let samples = Arc::new(Mutex::new(vec![baseline.clone()]));
    let load_end = t0 + Duration::from_secs(a.duration_secs);
    let hard_end = load_end + Duration::from_secs(a.drain_secs);
    eprintln!(
        "soak: {} instances, {} joins/s for {} s, configured admission {}/s",
        addrs.len(),
        a.join_rate,
        a.duration_secs,
        a.configured_rate
    );

    // The sampler runs until the drain is over.
    let sampler = {
        let (samples, world) = (samples.clone(), world.clone());
        let every = Duration::from_secs(a.sample_secs.max(1));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(t0 + every, every);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let load = Instant::now() < load_end;
                match probe.sample(t0, load, &world.counters).await {
                    Ok(s) => {
                        eprintln!(
                            "soak t={:>5.0}s buyers {:>5} waiting {:>5} admit {:>5.1}/s rss {:?} KiB fds {:?} redis {} KiB (clients {} KiB) {} keys errors {}",
                            s.t,
                            s.buyers,
                            s.waiting,
                            s.admit_rate,
                            s.rss_kib,
                            s.fds,
                            s.used_memory / 1024,
                            s.redis_clients / 1024,
                            s.keys,
                            s.errors
                        );
                        samples.lock().unwrap().push(s);
                    }
                    Err(e) => eprintln!("soak: sample failed: {e}"),
                }
                if Instant::now() >= hard_end {
                    return;
                }
            }
        })
    };

    // Joins at a steady rate until the load phase ends.
    let run_id = format!("{:06x}", rand::random_range(0..0xff_ffffu32));
    let mut buyers = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / a.join_rate));
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut skipped = 0u64;
    for i in 0.. {
        tick.tick().await;
        if Instant::now() >= load_end {
            break;
        }
        while buyers.try_join_next().is_some() {}
        if buyers.len() >= a.max_buyers {
            skipped += 1;
            continue;
        }
        buyers.spawn(buyer::buyer(world.clone(), i, format!("k{run_id}-{i}")));
    }
    let _ = end_tx.send(true);
    eprintln!("soak: load over; waiting buyers leave");
    let _ = tokio::time::timeout_at(hard_end, async {
        while buyers.join_next().await.is_some() {}
    })
    .await;
    buyers.abort_all();

    // The drain: descriptors back to baseline, Redis back to its constant
    // keys (tokens expire by their TTL), or the drain time is up.
    let allowed = report::allowed_keys(&baseline_keys, &a.key_prefix, &a.queue);
    let mut final_keys;
    let mut check = Probe {
        redis: client.get_multiplexed_async_connection().await?,
        pids: a.server_pids.clone(),
        admins: Vec::new(),
        log: Arc::new(Mutex::new(ChannelLog::default())),
        seen_passes: 0,
        last_pass_at: None,
        last: Instant::now(),
    };
    loop {
        final_keys = check.key_names().await?;
        let fds_back = a
            .server_pids
            .iter()
            .zip(&baseline.fds)
            .all(|(p, b)| fd_count(*p) <= *b);
        if (final_keys.is_subset(&allowed) && fds_back) || Instant::now() >= hard_end {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let drained_after = (Instant::now() - load_end.min(Instant::now())).as_secs_f64();
    sampler.abort();
    let _ = sampler.await;
    // The last count is judged against the baseline with nothing else
    // allowed: let a scrape the sampler had in flight close first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut last = check.sample(t0, false, &world.counters).await?;
    last.streams = Vec::new();
    samples.lock().unwrap().push(last);
    let _ = stop_tx.send(true);
    let _ = listener.await;

    let samples = samples.lock().unwrap().clone();
    let r = report::Report::build(
        &a,
        samples,
        &allowed,
        &final_keys,
        drained_after,
        skipped,
        &world.counters,
    );
    r.write(&a)?;
    println!("{}", r.markdown(&a));
    anyhow::ensure!(r.passed(), "soak: a pass criterion failed (see the report)");
    Ok(())
}
