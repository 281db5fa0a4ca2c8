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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::crowd::{self, Ctx, Mode, PROGRESS_FIELDS, Progress, UserResult};
use crate::http::{Conn, SourceIps, ensure_loopback};
use crate::now_ms;
use crate::server::{self, ChannelLog, CommandStats, RedisProbe};
use crate::stats::{Summary, summarize};

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
    /// Set the product's stock before the run (needs --admin-token).
    #[arg(long)]
    pub stock: Option<i64>,
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

async fn products(addr: SocketAddr) -> anyhow::Result<Vec<Value>> {
    let mut c = Conn::connect(std::net::Ipv4Addr::new(127, 0, 0, 1), addr, 4096).await?;
    let r = c.request("GET", "/api/products", &[], None).await?;
    anyhow::ensure!(r.status == 200, "GET /api/products answered {}", r.status);
    Ok(serde_json::from_slice(&r.body)?)
}

async fn stock_of(addr: SocketAddr, id: &str) -> Option<i64> {
    products(addr)
        .await
        .ok()?
        .into_iter()
        .find(|p| p["id"] == id)
        .and_then(|p| p["stock"].as_i64())
}

async fn set_stock(
    addr: SocketAddr,
    product: &Value,
    stock: i64,
    admin: &str,
) -> anyhow::Result<()> {
    let body = json!({
        "name": product["name"], "queue": product["queue"],
        "priceCents": product["priceCents"], "stock": stock,
    })
    .to_string();
    let id = product["id"].as_str().unwrap_or_default();
    let mut c = Conn::connect(std::net::Ipv4Addr::new(127, 0, 0, 1), addr, 4096).await?;
    let auth = format!("Bearer {admin}");
    let r = c
        .request(
            "PUT",
            &format!("/api/admin/products/{id}"),
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            Some(body.as_bytes()),
        )
        .await?;
    anyhow::ensure!(
        r.status == 200,
        "restock answered {}: {}",
        r.status,
        String::from_utf8_lossy(&r.body)
    );
    Ok(())
}

/// One row of the timeline (every second).
#[derive(Debug, Clone, Serialize)]
struct Sample {
    t: f64,
    entered: u64,
    open: u64,
    waiting: u64,
    ready: u64,
    done: u64,
    failed: u64,
    http: u64,
    events: u64,
    rss_kib: Option<u64>,
    server_cpu_s: Option<f64>,
    redis_calls: Option<u64>,
    evalsha: Option<u64>,
    gen_cpu_s: f64,
}

/// The server's figures at one moment.
#[derive(Debug, Clone)]
struct Snap {
    t: f64,
    progress: [u64; PROGRESS_FIELDS],
    cmd: Option<CommandStats>,
    cpu: Option<f64>,
    rss: Option<u64>,
}

struct Probe {
    redis: Option<tokio::sync::Mutex<RedisProbe>>,
    pid: Option<u32>,
}

impl Probe {
    async fn snap(&self, t0: f64, progress: &[Arc<Progress>]) -> Snap {
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
fn window(a: &Snap, b: &Snap, users: f64) -> Value {
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

pub async fn run(a: CrowdArgs) -> anyhow::Result<()> {
    let nofile = server::raise_nofile();
    let addr: SocketAddr = a.addr.parse().context("--addr")?;
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
            set_stock(addr, &p, s, admin).await?;
        }
        let id = p["id"].as_str().unwrap_or_default().to_string();
        initial_stock = stock_of(addr, &id).await;
        product_id = Some(id);
    }

    let ctx_for = |progress: Arc<Progress>, concurrency: usize| Ctx {
        mode: a.mode,
        addr,
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
        listener = Some(server::listen_passes(url, channel, log.clone(), stop_rx).await?);
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
    let streams_before = server::streams_open(addr).await.or(Some(0.0));

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
        let metrics_open = server::streams_open(addr).await;
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
            "streams_open_at_churn_end": server::streams_open(addr).await,
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

fn short_window(w: &Value) -> String {
    let f = |k: &str| w[k].as_f64().map_or("-".into(), |v| format!("{v:.4}"));
    format!(
        "redis calls/user/s {} (evalsha {}), http req/user/s {}, server CPU {} s",
        f("redis_calls_per_user_s"),
        f("evalsha_per_user_s"),
        f("http_per_user_s"),
        f("server_cpu_s")
    )
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
    let ctx = Arc::new(Ctx {
        mode: a.mode,
        addr,
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

struct ReportCtx<'a> {
    a: &'a CrowdArgs,
    t0: f64,
    prefix: &'a str,
    workers: usize,
    nofile: u64,
    plug: Value,
    unplugged: usize,
    phases: Value,
    steady: Value,
    rss: Value,
    admission_window: Value,
    stock: Value,
    timeline: Vec<Sample>,
    gen_cpu_s: f64,
    /// The leaves scenario's windows and leave figures (`null`: not run).
    churn: Value,
}

fn build_report(c: ReportCtx<'_>, results: &[UserResult], log: &ChannelLog) -> Value {
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
                    lost.push(r.user.clone());
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
        "redis_trend_after_open": redis_trend,
        "first_admitting_pass": first_admitting,
        "events": {
            "waiting": waiting_ev, "ready": ready_ev, "gone": gone, "keepalives": keepalives,
            "polls": polls, "streams_opened": streams,
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

fn sm(v: &Value) -> Summary {
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
