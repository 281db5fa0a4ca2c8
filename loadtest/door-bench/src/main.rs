//! door-bench: what proof of work at the door costs the server, and what it
//! costs a bot.
//!
//! 1. Starts three waitroom processes on loopback (header identity, demo
//!    orders off, the in-memory store or `--redis-url`): `off`
//!    (`--join-challenge off`), `on` (`always`, at the smallest difficulty,
//!    since verifying costs the same at any difficulty: one SHA-256, one
//!    HMAC and one store write to spend it) and `default` (`always` at the
//!    default difficulty, only to hand out challenges for step 3).
//! 2. Join throughput, closed loop: `--concurrency` keep-alive connections
//!    send `--joins` distinct joins to `off`, then to `on` with a solution
//!    each (solved before the clock starts), then again in the other order,
//!    `--rounds` times. Reports joins/s and latency per mode and the on/off
//!    ratio, all from this one run.
//! 3. What a bot pays: solves `--solves` challenges of the `default` server
//!    on one thread the fast way (the salt's SHA-256 state reused, no
//!    allocation per try): time per solve (median, p90, mean), and the cores
//!    a bot needs per 100 joins a second.
//!
//! Every loop is bounded in count; every address must be loopback.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use base64::Engine as _;
use clap::Parser;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

#[derive(Parser, Debug)]
struct Args {
    /// The waitroom binary (a release build).
    #[arg(long, default_value = "target/release/waitroom")]
    bin: String,
    /// Redis for the servers (loopback); unset: the in-memory store.
    #[arg(long)]
    redis_url: Option<String>,
    /// Joins per mode per round.
    #[arg(long, default_value_t = 3000)]
    joins: usize,
    /// Rounds (each: off then on, or on then off).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Connections, one request in flight each.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Challenges solved at the default difficulty for the bot's cost.
    #[arg(long, default_value_t = 200)]
    solves: usize,
    /// Where to write the JSON summary.
    #[arg(long, default_value = "loadtest/results/door-bench.json")]
    out: String,
}

struct Server {
    addr: SocketAddr,
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn start(args: &Args, name: &str, extra: &[&str]) -> anyhow::Result<Server> {
    let port = free_port()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let prefix = format!("door-bench-{name}-{}", std::process::id());
    let mut cmd = Command::new(&args.bin);
    cmd.args([
        "--addr",
        &addr.to_string(),
        "--identity",
        "header",
        "--orders",
        "off",
    ])
    .args(["--admission-interval-ms", "1000", "--admission-batch", "50"])
    .args(["--key-prefix", &prefix])
    .args(extra)
    .env_remove("WAITROOM_JOIN_CHALLENGE")
    .env("RUST_LOG", "warn")
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .kill_on_drop(true);
    if let Some(url) = &args.redis_url {
        ensure!(
            url.starts_with("redis://127.0.0.1") || url.starts_with("redis://localhost"),
            "--redis-url must be loopback"
        );
        cmd.args(["--redis-url", url]);
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", args.bin))?;
    let server = Server { addr, child };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut c) = Conn::open(addr).await
            && matches!(c.request("GET", "/healthz", &[]).await, Ok((200, _)))
        {
            return Ok(server);
        }
        if Instant::now() > deadline {
            bail!("{name} server did not come up on {addr}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One keep-alive HTTP/1.1 connection (the server always sends
/// `Content-Length` on these endpoints).
struct Conn {
    reader: BufReader<TcpStream>,
    host: String,
}

impl Conn {
    async fn open(addr: SocketAddr) -> anyhow::Result<Self> {
        ensure!(addr.ip().is_loopback(), "loopback only");
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            reader: BufReader::new(stream),
            host: addr.to_string(),
        })
    }

    async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n",
            self.host
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        self.reader.get_mut().write_all(head.as_bytes()).await?;
        let mut line = String::new();
        self.reader.read_line(&mut line).await?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .context("no status line")?
            .parse()?;
        let mut length = 0usize;
        loop {
            line.clear();
            self.reader.read_line(&mut line).await?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse()?;
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).await?;
        Ok((status, body))
    }
}

/// Solves one challenge the fast way; (X-Altcha value, tries).
fn solve(c: &Value) -> anyhow::Result<(String, u64)> {
    let salt = c["salt"].as_str().context("salt")?;
    let target = c["challenge"].as_str().context("challenge")?;
    let max = c["maxnumber"].as_u64().context("maxnumber")?;
    let target: Vec<u8> = (0..target.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&target[i..i + 2], 16))
        .collect::<Result<_, _>>()?;
    let prefix = Sha256::new_with_prefix(salt.as_bytes());
    let mut buf = itoa::Buffer::default();
    for n in 0..=max {
        let hash = prefix.clone().chain_update(buf.format(n)).finalize();
        if hash.as_slice() == target.as_slice() {
            let payload = json!({
                "algorithm": "SHA-256", "challenge": c["challenge"], "number": n,
                "salt": salt, "signature": c["signature"],
            });
            return Ok((
                base64::engine::general_purpose::STANDARD.encode(payload.to_string()),
                n + 1,
            ));
        }
    }
    bail!("no solution up to {max}")
}

mod itoa {
    /// Decimal digits without an allocation per number.
    #[derive(Default)]
    pub struct Buffer([u8; 20]);
    impl Buffer {
        pub fn format(&mut self, mut n: u64) -> &[u8] {
            let mut i = 20;
            loop {
                i -= 1;
                self.0[i] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    return &self.0[i..];
                }
            }
        }
    }
}

async fn challenges(addr: SocketAddr, n: usize) -> anyhow::Result<Vec<Value>> {
    let mut conn = Conn::open(addr).await?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (status, body) = conn
            .request("GET", "/api/queues/default/challenge", &[])
            .await?;
        ensure!(status == 200, "challenge: {status}");
        out.push(serde_json::from_slice(&body)?);
    }
    Ok(out)
}

struct Round {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// `joins` joins over `concurrency` connections; each must answer 201.
async fn burst(
    addr: SocketAddr,
    tag: &str,
    joins: usize,
    concurrency: usize,
    solutions: Vec<String>,
) -> anyhow::Result<Round> {
    let solutions = std::sync::Arc::new(std::sync::Mutex::new(solutions));
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (next, solutions, tag) = (next.clone(), solutions.clone(), tag.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await?;
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= joins {
                    return anyhow::Ok(lat);
                }
                let user = format!("{tag}-{i}");
                let altcha = solutions.lock().unwrap().pop();
                let mut headers = vec![("X-User-Id", user.as_str())];
                if let Some(a) = &altcha {
                    headers.push(("X-Altcha", a.as_str()));
                }
                let t = Instant::now();
                let (status, body) = conn
                    .request("POST", "/api/queues/default/entries", &headers)
                    .await?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
                ensure!(
                    status == 201,
                    "join {user}: {status} {}",
                    String::from_utf8_lossy(&body)
                );
            }
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await??);
    }
    let secs = started.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    Ok(Round {
        rate: joins as f64 / secs,
        p50_ms: pct(&lat, 0.50),
        p99_ms: pct(&lat, 0.99),
    })
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    pct(&v, 0.5)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(args.joins > 0 && args.joins <= 100_000, "--joins 1-100000");
    ensure!(args.rounds > 0 && args.rounds <= 10, "--rounds 1-10");
    ensure!(args.solves > 0 && args.solves <= 10_000, "--solves 1-10000");
    let off = start(&args, "off", &["--join-challenge", "off"]).await?;
    let on = start(
        &args,
        "on",
        &[
            "--join-challenge",
            "always",
            "--join-challenge-difficulty",
            "1000",
        ],
    )
    .await?;
    let default = start(&args, "default", &["--join-challenge", "always"]).await?;

    // The solutions for the `on` rounds, solved before any clock starts.
    let mut solutions = Vec::new();
    for c in challenges(on.addr, args.joins * args.rounds).await? {
        solutions.push(solve(&c)?.0);
    }
    // A replayed solution must be refused, and a bare join too, or the
    // comparison means nothing.
    {
        let mut conn = Conn::open(on.addr).await?;
        let s = solve(&challenges(on.addr, 1).await?[0])?.0;
        let join = [("X-User-Id", "replay-1"), ("X-Altcha", s.as_str())];
        let (first, _) = conn
            .request("POST", "/api/queues/default/entries", &join)
            .await?;
        let join = [("X-User-Id", "replay-2"), ("X-Altcha", s.as_str())];
        let (again, _) = conn
            .request("POST", "/api/queues/default/entries", &join)
            .await?;
        ensure!(
            first == 201 && again == 403,
            "replay check: {first} then {again}"
        );
        let (bare, _) = conn
            .request(
                "POST",
                "/api/queues/default/entries",
                &[("X-User-Id", "bare")],
            )
            .await?;
        ensure!(bare == 428, "a join without a solution: {bare}");
    }

    let (mut off_rounds, mut on_rounds) = (Vec::new(), Vec::new());
    for r in 0..args.rounds {
        let batch: Vec<String> = solutions.split_off(solutions.len() - args.joins);
        let off_tag = format!("off{r}");
        let run_off = burst(off.addr, &off_tag, args.joins, args.concurrency, Vec::new());
        if r % 2 == 0 {
            off_rounds.push(run_off.await?);
            on_rounds.push(
                burst(
                    on.addr,
                    &format!("on{r}"),
                    args.joins,
                    args.concurrency,
                    batch,
                )
                .await?,
            );
        } else {
            on_rounds.push(
                burst(
                    on.addr,
                    &format!("on{r}"),
                    args.joins,
                    args.concurrency,
                    batch,
                )
                .await?,
            );
            off_rounds.push(run_off.await?);
        }
    }

    // What a bot pays at the default difficulty, one thread.
    let hard = challenges(default.addr, args.solves).await?;
    let difficulty = hard[0]["maxnumber"].as_u64().unwrap_or(0);
    let mut times = Vec::new();
    let mut tries = 0u64;
    let solving = Instant::now();
    for c in &hard {
        let t = Instant::now();
        tries += solve(c)?.1;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let hash_rate = tries as f64 / solving.elapsed().as_secs_f64();
    let mean_ms = times.iter().sum::<f64>() / times.len() as f64;
    times.sort_by(f64::total_cmp);
    let (solve_p50, solve_p90) = (pct(&times, 0.5), pct(&times, 0.9));

    let off_rate = median(off_rounds.iter().map(|r| r.rate).collect());
    let on_rate = median(on_rounds.iter().map(|r| r.rate).collect());
    let ratios: Vec<f64> = on_rounds
        .iter()
        .zip(&off_rounds)
        .map(|(a, b)| a.rate / b.rate)
        .collect();
    let store = if args.redis_url.is_some() {
        "Redis"
    } else {
        "memory"
    };
    println!("| figure | measured |");
    println!("|---|---|");
    println!(
        "| joins/s, challenge off ({store} store, {} × {} joins, {} connections; median round) | {off_rate:.0} (p50 / p99 {:.2} / {:.2} ms) |",
        args.rounds,
        args.joins,
        args.concurrency,
        median(off_rounds.iter().map(|r| r.p50_ms).collect()),
        median(off_rounds.iter().map(|r| r.p99_ms).collect())
    );
    println!(
        "| joins/s, challenge always (verify + spend each solution) | {on_rate:.0} (p50 / p99 {:.2} / {:.2} ms) |",
        median(on_rounds.iter().map(|r| r.p50_ms).collect()),
        median(on_rounds.iter().map(|r| r.p99_ms).collect())
    );
    println!(
        "| ratio on / off, per round | {} (median {:.2}) |",
        ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
        median(ratios.clone())
    );
    println!(
        "| solve time at the default difficulty ({difficulty}), one thread, {} challenges: median / p90 / mean | {solve_p50:.1} / {solve_p90:.1} / {mean_ms:.1} ms ({:.2} M hashes/s) |",
        args.solves,
        hash_rate / 1e6
    );
    println!(
        "| cores a bot needs per 100 joins/s (100 × mean solve time) | {:.2} |",
        100.0 * mean_ms / 1000.0
    );
    let summary = json!({
        "store": store, "joins": args.joins, "rounds": args.rounds, "concurrency": args.concurrency,
        "offRate": off_rate, "onRate": on_rate, "ratios": ratios,
        "difficulty": difficulty, "solveMs": { "p50": solve_p50, "p90": solve_p90, "mean": mean_ms },
        "hashesPerSecond": hash_rate, "coresPer100JoinsPerSecond": 100.0 * mean_ms / 1000.0,
    });
    if let Some(dir) = std::path::Path::new(&args.out).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&summary)?)?;
    drop((off, on, default));
    Ok(())
}
