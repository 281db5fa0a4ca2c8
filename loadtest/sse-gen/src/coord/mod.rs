//! The crowd run: sets up (stock, plug), starts the buyers (in this process
//! or in forked worker processes), measures the server in phases, and
//! writes the report.
//!
//! Phases: (1) the plug takes every admission slot; (2) the crowd enters
//! and opens its streams (or starts polling) while admission is stalled;
//! (3) after `--settle-secs`, a steady window of `--steady-secs` measures
//! Redis commands, HTTP requests and server CPU per waiting user per
//! second, and server RSS per open stream; (4) the plug leaves, admission
//! runs, buyers get `ready` and order; (5) the report.
//!
//! With `--churn-rate`, the leaves scenario runs between (3) and (4): a
//! pool of extra buyers joins behind the crowd right after the streams
//! open; after the steady window, a quiet window of `--quiet-secs`, then
//! the pool leaves at `--churn-rate` per second for `--churn-secs`. The
//! report compares the crowd's rank-update lag over the passes of the two
//! windows (run it without a plug, so admission moves every rank each
//! pass).
//!
//! The parts: `setup` (stock through the admin API), `probe` (what is
//! measured and how a window is computed), `report` (the JSON report and
//! its summary); this module holds the arguments and the run itself.

mod probe;
mod report;
pub(crate) mod setup;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;
use tokio::io::AsyncBufReadExt;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::crowd::{self, Ctx, Mode, PROGRESS_FIELDS, Progress, UserResult};
use crate::http::{SourceIps, ensure_loopback};
use crate::now_ms;
use crate::server::{self, ChannelLog, RedisProbe};
use probe::{Probe, Sample, short_window, window};
use report::{ReportCtx, build_report, print_summary};
use setup::{products, set_stock, stock_of};

/// Most users one process holds (its open-file limit is 20,000).
pub const USERS_PER_PROCESS: usize = 17_000;

#[derive(clap::Args, Clone, Debug)]
pub struct CrowdArgs {
    /// `sse`: hold one event stream per buyer; `poll`: poll the position at
    /// the server's pollingIntervalSeconds tiers (with ±20 % jitter).
    #[arg(long, value_enum, default_value = "sse")]
    pub mode: Mode,
    /// The server (loopback only).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: String,
    #[arg(long, default_value = "default")]
    pub queue: String,
    /// Buyers in the crowd.
    #[arg(long, default_value_t = 100)]
    pub users: usize,
    /// Hard limit on the whole run; the generator exits by itself.
    #[arg(long, default_value_t = 300)]
    pub duration_secs: u64,
    /// Source addresses to spread connections over (loopback only).
    #[arg(long, default_value = "127.0.0.2-127.0.0.11")]
    pub source_ips: String,
    /// Connects + enters (+ first event) in flight at once, all workers together.
    #[arg(long, default_value_t = 200)]
    pub connect_concurrency: usize,
    /// Read buffer per connection, bytes.
    #[arg(long, default_value_t = 512)]
    pub read_buf: usize,
    /// Tag in user ids (`u<run-id>-<i>`); random by default.
    #[arg(long)]
    pub run_id: Option<String>,
    /// The server's Redis: INFO commandstats and the pass channel.
    #[arg(long)]
    pub redis_url: Option<String>,
    /// The server's --key-prefix (for the pass channel's name).
    #[arg(long, default_value = "waitroom")]
    pub key_prefix: String,
    /// The server runs on a Redis Cluster: the pass channel is sharded
    /// (`SSUBSCRIBE`), and --redis-url must be the master of the queue's
    /// slot (its INFO is then that node's).
    #[arg(long)]
    pub sharded: bool,
    /// Other instances of the same deployment (loopback only): a stream
    /// that breaks is reopened on the next of --addr and these in turn.
    #[arg(long, value_delimiter = ',')]
    pub fallback_addrs: Vec<String>,
    /// The server's pid: RSS and CPU from /proc.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Users who take every admission slot before the crowd enters (set it
    /// to the server's --max-active) and leave after the steady window.
    #[arg(long, default_value_t = 0)]
    pub plug: usize,
    /// Wait after every stream is open before the steady window.
    #[arg(long, default_value_t = 5)]
    pub settle_secs: u64,
    /// The steady window.
    #[arg(long, default_value_t = 30)]
    pub steady_secs: u64,
    /// Most time for the crowd to enter and open its streams.
    #[arg(long, default_value_t = 120)]
    pub open_timeout_secs: u64,
    /// Do not order on READY (a buyer is then done at READY).
    #[arg(long)]
    pub no_orders: bool,
    /// Product to order (default: the first product of --queue).
    #[arg(long)]
    pub product: Option<String>,
    /// Set the product's stock before the run (needs --admin-token and
    /// --admin-addr).
    #[arg(long)]
    pub stock: Option<i64>,
    /// The server's operator listener (its --admin-addr): the admin API
    /// (--stock) and /metrics. Unset: no restock, no metrics figures.
    #[arg(long)]
    pub admin_addr: Option<String>,
    #[arg(long)]
    pub admin_token: Option<String>,
    /// On 409 out_of_stock keep the token (default: leave the queue, which
    /// gives the token and its admission slot back).
    #[arg(long)]
    pub keep_on_409: bool,
    /// Reconnects of a stream that broke before READY.
    #[arg(long, default_value_t = 3)]
    pub max_reconnects: u32,
    /// Leaves scenario: extra buyers join behind the crowd and then leave
    /// at this many per second (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub churn_rate: f64,
    /// How long the leaves go on.
    #[arg(long, default_value_t = 20)]
    pub churn_secs: u64,
    /// The window before the leaves whose rank-update lag is the quiet figure.
    #[arg(long, default_value_t = 20)]
    pub quiet_secs: u64,
    /// Worker processes (0: one per 17,000 users).
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// The JSON report.
    #[arg(long, default_value = "sse-gen-report.json")]
    pub out: PathBuf,
    /// Internal: run as worker `i/n` (buyers i, i+n, …) and write raw
    /// results to --worker-out.
    #[arg(long, hide = true)]
    pub shard: Option<String>,
    #[arg(long, hide = true)]
    pub worker_out: Option<PathBuf>,
    #[arg(long, hide = true)]
    pub deadline_unix_ms: Option<f64>,
}

fn parse_shard(s: &str) -> anyhow::Result<(usize, usize)> {
    let (i, n) = s.split_once('/').context("--shard is i/n")?;
    let (i, n): (usize, usize) = (i.parse()?, n.parse()?);
    anyhow::ensure!(n > 0 && i < n, "--shard i/n needs 0 <= i < n");
    Ok((i, n))
}

pub async fn run(a: CrowdArgs) -> anyhow::Result<()> {
    let nofile = server::raise_nofile();
    let addr: SocketAddr = a.addr.parse().context("--addr")?;
    let admin_addr: Option<SocketAddr> = a
        .admin_addr
        .as_deref()
        .map(str::parse)
        .transpose()
        .context("--admin-addr")?;
    ensure_loopback(&addr)?;
    let ips = SourceIps::parse(&a.source_ips)?;
    anyhow::ensure!(a.users > 0, "--users must be positive");
    anyhow::ensure!(a.duration_secs > 0, "--duration-secs must be positive");
    let start = Instant::now();
    let t0 = now_ms();
    let deadline = match a.deadline_unix_ms {
        Some(d) => start + Duration::from_millis((d - t0).max(0.0) as u64),
        None => start + Duration::from_secs(a.duration_secs),
    };
    // Buyers stop a little before the hard limit so the report gets written.
    let reserve = Duration::from_secs((a.duration_secs / 10).clamp(1, 10));
    let users_deadline = deadline.checked_sub(reserve).unwrap_or(deadline).max(start);
    let run_id = a
        .run_id
        .clone()
        .unwrap_or_else(|| format!("{:06x}", rand::random_range(0..0xff_ffffu32)));
    let prefix = format!("u{run_id}");

    if let Some(shard) = &a.shard {
        return run_shard(&a, shard, addr, ips, users_deadline, prefix).await;
    }

    let workers = if a.workers == 0 {
        a.users.div_ceil(USERS_PER_PROCESS)
    } else {
        a.workers
    };
    let per_worker = a.users.div_ceil(workers);
    if per_worker as u64 + 500 > nofile {
        eprintln!(
            "warning: {per_worker} users per process against an open-file limit of {nofile}; use --workers"
        );
    }

    // The server's product and stock.
    let mut product_id = None;
    let mut initial_stock = None;
    if !a.no_orders {
        let list = products(addr).await.context("reading products")?;
        let p = match &a.product {
            Some(id) => list.iter().find(|p| p["id"] == id.as_str()),
            None => list.iter().find(|p| p["queue"] == a.queue.as_str()),
        }
        .cloned()
        .context("no product to order (use --product or --no-orders)")?;
        if let Some(s) = a.stock {
            let admin = a
                .admin_token
                .as_deref()
                .context("--stock needs --admin-token")?;
            let admin_addr = admin_addr.context("--stock needs --admin-addr")?;
            set_stock(admin_addr, &p, s, admin).await?;
        }
        let id = p["id"].as_str().unwrap_or_default().to_string();
        initial_stock = stock_of(addr, &id).await;
        product_id = Some(id);
    }

    let fallback: Vec<SocketAddr> = a
        .fallback_addrs
        .iter()
        .map(|s| s.parse().context("--fallback-addrs"))
        .collect::<anyhow::Result<_>>()?;
    for f in &fallback {
        ensure_loopback(f)?;
    }
    let ctx_for = |progress: Arc<Progress>, concurrency: usize| Ctx {
        mode: a.mode,
        addr,
        fallback: fallback.clone(),
        queue: a.queue.clone(),
        ips: ips.clone(),
        read_chunk: a.read_buf,
        product: product_id.clone(),
        leave_on_409: !a.keep_on_409,
        max_reconnects: a.max_reconnects,
        deadline: users_deadline,
        connect: Semaphore::new(concurrency.max(1)),
        progress,
    };
    let admin_ctx = Arc::new(ctx_for(Arc::new(Progress::default()), 64));

    // Redis: INFO and the pass channel.
    let log = Arc::new(Mutex::new(ChannelLog::default()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut listener = None;
    let mut redis = None;
    if let Some(url) = &a.redis_url {
        redis = Some(tokio::sync::Mutex::new(
            RedisProbe::connect(url)
                .await
                .context("connecting to Redis")?,
        ));
        let channel = format!("{}:{{{}}}:events", a.key_prefix, a.queue);
        listener =
            Some(server::listen_passes(url, channel, log.clone(), stop_rx, a.sharded).await?);
    }
    let probe = Arc::new(Probe {
        redis,
        pid: a.server_pid,
    });

    // (1) the plug
    let mut plug_info = json!(null);
    let mut plug_tickets = Vec::new();
    if a.plug > 0 {
        let p = crowd::plug(admin_ctx.clone(), &prefix, a.plug).await?;
        println!(
            "plug: {} users entered, {} hold a token",
            p.tickets.len(),
            p.ready
        );
        plug_info = json!({ "users": a.plug, "entered": p.tickets.len(), "ready": p.ready });
        plug_tickets = p.tickets;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let progress: Vec<Arc<Progress>> = (0..workers)
        .map(|_| Arc::new(Progress::default()))
        .collect();
    let before = probe.snap(t0, &progress).await;
    // The gauge is absent until the first stream opens.
    let streams_before = server::streams_open(admin_addr).await.or(Some(0.0));

    // The timeline.
    let timeline = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let sampler = {
        let (timeline, probe, progress) = (timeline.clone(), probe.clone(), progress.clone());
        let mut stop = stop_tx.subscribe();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = stop.changed() => break,
                    _ = tick.tick() => {
                        let s = probe.snap(t0, &progress).await;
                        let p = s.progress;
                        timeline.lock().unwrap().push(Sample {
                            t: s.t, entered: p[0], open: p[1], waiting: p[2], ready: p[3], done: p[4],
                            failed: p[5], http: p[6], events: p[7], rss_kib: s.rss, server_cpu_s: s.cpu,
                            redis_calls: s.cmd.as_ref().map(|c| c.total_without_info()),
                            evalsha: s.cmd.as_ref().map(|c| c.get("evalsha")),
                            gen_cpu_s: server::self_cpu_secs(),
                        });
                    }
                }
            }
        })
    };

    // (2) the crowd
    let crowd_started = (now_ms() - t0) / 1000.0;
    println!(
        "crowd: {} {} buyers in {} process(es) from {} source addresses",
        a.users,
        if a.mode == Mode::Sse {
            "SSE"
        } else {
            "polling"
        },
        workers,
        ips.0.len()
    );
    let tmp = std::env::temp_dir().join(format!("sse-gen-{run_id}-{}", std::process::id()));
    let mut in_proc = None;
    let mut children = Vec::new();
    if workers == 1 {
        let ctx = Arc::new(ctx_for(progress[0].clone(), a.connect_concurrency));
        in_proc = Some(tokio::spawn(crowd::run_buyers(
            ctx,
            prefix.clone(),
            (0..a.users).collect(),
        )));
    } else {
        std::fs::create_dir_all(&tmp)?;
        let exe = std::env::current_exe()?;
        let deadline_unix = t0 + (users_deadline - start).as_secs_f64() * 1000.0;
        for (k, prog) in progress.iter().enumerate() {
            let out = tmp.join(format!("worker-{k}.json"));
            let mut cmd = tokio::process::Command::new(&exe);
            cmd.arg("crowd")
                .args(["--mode", if a.mode == Mode::Sse { "sse" } else { "poll" }])
                .args(["--addr", &a.addr, "--queue", &a.queue])
                .args(["--users", &a.users.to_string()])
                .args(["--duration-secs", &a.duration_secs.to_string()])
                .args(["--source-ips", &a.source_ips])
                .args([
                    "--connect-concurrency",
                    &(a.connect_concurrency / workers).max(1).to_string(),
                ])
                .args(["--read-buf", &a.read_buf.to_string()])
                .args(["--run-id", &run_id])
                .args(["--max-reconnects", &a.max_reconnects.to_string()])
                .args(["--shard", &format!("{k}/{workers}")])
                .arg("--worker-out")
                .arg(&out)
                .args(["--deadline-unix-ms", &format!("{deadline_unix:.0}")])
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true);
            if !a.fallback_addrs.is_empty() {
                cmd.args(["--fallback-addrs", &a.fallback_addrs.join(",")]);
            }
            match &product_id {
                Some(p) => {
                    cmd.args(["--product", p]);
                }
                None => {
                    cmd.arg("--no-orders");
                }
            }
            if a.keep_on_409 {
                cmd.arg("--keep-on-409");
            }
            let mut child = cmd.spawn().context("starting a worker")?;
            let stdout = child.stdout.take().context("worker stdout")?;
            let prog = prog.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(rest) = line.strip_prefix("P ") {
                        let v: Vec<u64> = rest.split(' ').filter_map(|x| x.parse().ok()).collect();
                        if let Ok(arr) = <[u64; PROGRESS_FIELDS]>::try_from(v) {
                            prog.set(arr);
                        }
                    } else {
                        println!("{line}");
                    }
                }
            });
            children.push((child, out));
        }
    }

    // Wait for every stream to open (or its buyer to end).
    let open_until =
        (Instant::now() + Duration::from_secs(a.open_timeout_secs)).min(users_deadline);
    let mut last_print = Instant::now();
    loop {
        let p = crowd::total(&progress);
        if p[1] + p[4] >= a.users as u64 || Instant::now() >= open_until {
            break;
        }
        if last_print.elapsed() >= Duration::from_secs(2) {
            println!(
                "  entered {} open {} waiting {} failed {}",
                p[0], p[1], p[2], p[5]
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_open = (now_ms() - t0) / 1000.0;
    let p = crowd::total(&progress);
    println!(
        "  {} of {} open after {:.1} s ({} failed)",
        p[1],
        a.users,
        all_open - crowd_started,
        p[5]
    );

    // The leaves scenario's pool joins now, behind the whole crowd.
    let mut churn_tickets = Vec::new();
    if a.churn_rate > 0.0 {
        let n = (a.churn_rate * a.churn_secs as f64).ceil() as usize;
        let t = Instant::now();
        churn_tickets = crate::churn::join_pool(admin_ctx.clone(), &prefix, n).await;
        println!(
            "churn pool: {} of {n} joined in {:.1} s",
            churn_tickets.len(),
            t.elapsed().as_secs_f64()
        );
    }

    // (3) the steady window
    let mut steady = json!(null);
    let mut rss = json!(null);
    let settle_until = (Instant::now() + Duration::from_secs(a.settle_secs)).min(users_deadline);
    tokio::time::sleep_until(settle_until).await;
    if Instant::now() + Duration::from_secs(a.steady_secs) < users_deadline {
        let s_a = probe.snap(t0, &progress).await;
        let metrics_open = server::streams_open(admin_addr).await;
        tokio::time::sleep(Duration::from_secs(a.steady_secs)).await;
        let s_b = probe.snap(t0, &progress).await;
        let waiting = (s_a.progress[2] + s_b.progress[2]) as f64 / 2.0;
        steady = window(&s_a, &s_b, waiting);
        let open = s_b.progress[1];
        let per = |r: Option<u64>| match (r, before.rss) {
            (Some(x), Some(b)) if open > 0 => Some((x as f64 - b as f64) / open as f64),
            _ => None,
        };
        rss = json!({
            "before_kib": before.rss, "with_streams_kib": s_b.rss, "with_streams_kib_at_window_start": s_a.rss,
            "open": open, "per_stream_kib": per(s_b.rss), "per_stream_kib_at_window_start": per(s_a.rss),
            "metrics_streams_open_before": streams_before, "metrics_streams_open": metrics_open,
            // This process only (worker processes not included).
            "generator_rss_kib": server::rss_kib(std::process::id()),
        });
        println!(
            "steady window {:.0} s with {:.0} waiting: {}",
            a.steady_secs,
            waiting,
            short_window(&steady)
        );
        if let Some(k) = rss["per_stream_kib"].as_f64() {
            let what = if a.mode == Mode::Sse {
                "open stream"
            } else {
                "polling user"
            };
            println!("server RSS per {what}: {k:.2} KiB ({open} open)");
        }
    } else {
        println!("no time left for the steady window");
    }

    // The leaves scenario: a quiet window, then the leaves.
    let mut churn = json!(null);
    if a.churn_rate > 0.0 {
        let quiet_from = now_ms();
        tokio::time::sleep_until(
            (Instant::now() + Duration::from_secs(a.quiet_secs)).min(users_deadline),
        )
        .await;
        let churn_from = now_ms();
        println!(
            "leaves: {} at {}/s for {} s",
            churn_tickets.len(),
            a.churn_rate,
            a.churn_secs
        );
        let stats = crate::churn::leave_at_rate(
            admin_ctx.clone(),
            std::mem::take(&mut churn_tickets),
            a.churn_rate,
            a.churn_secs,
        )
        .await;
        let churn_to = now_ms();
        println!(
            "  {} left ({} failed) in {:.1} s: {:.0}/s",
            stats.ok, stats.failed, stats.secs, stats.achieved_per_s
        );
        churn = json!({
            "rate": a.churn_rate, "secs": a.churn_secs, "quiet_secs": a.quiet_secs,
            "quiet_from_ms": quiet_from, "quiet_to_ms": churn_from,
            "churn_from_ms": churn_from, "churn_to_ms": churn_to,
            "leaves": stats,
            "streams_open_at_churn_end": server::streams_open(admin_addr).await,
        });
    }

    // (4) admission runs
    let release_at = (now_ms() - t0) / 1000.0;
    let release_snap = probe.snap(t0, &progress).await;
    let mut unplugged = 0;
    if !plug_tickets.is_empty() {
        unplugged = crowd::unplug(admin_ctx.clone(), std::mem::take(&mut plug_tickets)).await;
        println!("plug released ({unplugged} left): admission runs");
    }
    let mut min_stock = initial_stock;
    let mut last_stock = Instant::now();
    let mut last_print = Instant::now();
    loop {
        let p = crowd::total(&progress);
        if p[4] >= a.users as u64 || Instant::now() >= users_deadline + Duration::from_millis(500) {
            break;
        }
        if let Some(id) = &product_id
            && last_stock.elapsed() >= Duration::from_secs(2)
        {
            if let Some(s) = stock_of(addr, id).await {
                min_stock = Some(min_stock.map_or(s, |m| m.min(s)));
            }
            last_stock = Instant::now();
        }
        if last_print.elapsed() >= Duration::from_secs(5) {
            println!(
                "  ready {} done {} waiting {} open {}",
                p[3], p[4], p[2], p[1]
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done_at = (now_ms() - t0) / 1000.0;
    let end_snap = probe.snap(t0, &progress).await;

    // Collect.
    let mut results: Vec<UserResult> = Vec::new();
    if let Some(h) = in_proc {
        match tokio::time::timeout_at(deadline, h).await {
            Ok(Ok(r)) => results = r,
            _ => eprintln!("warning: buyers did not finish by the hard limit"),
        }
    }
    for (mut child, out) in children {
        let _ = tokio::time::timeout_at(deadline, child.wait()).await;
        let _ = child.start_kill();
        match std::fs::read(&out) {
            Ok(bytes) => match serde_json::from_slice::<Vec<UserResult>>(&bytes) {
                Ok(mut r) => results.append(&mut r),
                Err(e) => eprintln!("warning: worker output {}: {e}", out.display()),
            },
            Err(e) => eprintln!("warning: worker output {}: {e}", out.display()),
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let _ = stop_tx.send(true);
    let _ = sampler.await;
    if let Some(l) = listener {
        let _ = tokio::time::timeout(Duration::from_secs(2), l).await;
    }
    let final_stock = match &product_id {
        Some(id) => stock_of(addr, id).await,
        None => None,
    };
    if let (Some(f), Some(m)) = (final_stock, min_stock) {
        min_stock = Some(m.min(f));
    }

    let log = std::mem::take(&mut *log.lock().unwrap());
    let timeline = std::mem::take(&mut *timeline.lock().unwrap());
    let admission_users = (release_snap.progress[2] as f64).max(1.0);
    let ctx = ReportCtx {
        a: &a,
        t0,
        prefix: &prefix,
        workers,
        nofile,
        plug: plug_info,
        unplugged,
        phases: json!({
            "crowd_started_s": crowd_started, "all_open_s": all_open, "release_s": release_at,
            "done_s": done_at,
        }),
        steady,
        rss,
        admission_window: window(&release_snap, &end_snap, admission_users),
        stock: json!({
            "product": product_id, "initial": initial_stock, "final": final_stock, "min_seen": min_stock,
        }),
        timeline,
        gen_cpu_s: server::self_cpu_secs(),
        churn,
    };
    let report = build_report(ctx, &results, &log);
    std::fs::write(&a.out, serde_json::to_vec_pretty(&report)?)?;
    print_summary(&report);
    println!("report: {}", a.out.display());
    Ok(())
}

/// A worker process: runs its share of the buyers, prints its counters
/// every 250 ms (`P <8 numbers>`), writes its raw results, exits.
async fn run_shard(
    a: &CrowdArgs,
    shard: &str,
    addr: SocketAddr,
    ips: SourceIps,
    users_deadline: Instant,
    prefix: String,
) -> anyhow::Result<()> {
    let (i, n) = parse_shard(shard)?;
    let out = a.worker_out.clone().context("--shard needs --worker-out")?;
    let progress = Arc::new(Progress::default());
    let fallback: Vec<SocketAddr> = a
        .fallback_addrs
        .iter()
        .map(|s| s.parse().context("--fallback-addrs"))
        .collect::<anyhow::Result<_>>()?;
    let ctx = Arc::new(Ctx {
        mode: a.mode,
        addr,
        fallback,
        queue: a.queue.clone(),
        ips,
        read_chunk: a.read_buf,
        product: if a.no_orders { None } else { a.product.clone() },
        leave_on_409: !a.keep_on_409,
        max_reconnects: a.max_reconnects,
        deadline: users_deadline,
        connect: Semaphore::new(a.connect_concurrency.max(1)),
        progress: progress.clone(),
    });
    let indices: Vec<usize> = (i..a.users).step_by(n).collect();
    let printer = {
        let progress = progress.clone();
        tokio::spawn(async move {
            loop {
                let v = progress.values();
                let line: Vec<String> = v.iter().map(u64::to_string).collect();
                println!("P {}", line.join(" "));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let results = crowd::run_buyers(ctx, prefix, indices).await;
    std::fs::write(&out, serde_json::to_vec(&results)?)?;
    let v: Vec<String> = progress.values().iter().map(u64::to_string).collect();
    println!("P {}", v.join(" "));
    printer.abort();
    Ok(())
}
