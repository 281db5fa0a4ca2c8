//! The simulated buyers: each enters, then either holds one SSE stream
//! (`sse`) or polls its position at the tier the server asks for (`poll`),
//! records what it sees, and on `ready` optionally orders.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::http::{Conn, SourceIps, SseItem, SseParser};
use crate::now_ms;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Sse,
    Poll,
}

/// Live counters, summed over workers by the coordinator.
#[derive(Debug, Default)]
pub struct Progress {
    /// Enters answered 201/200.
    pub entered: AtomicU64,
    /// SSE streams open now (poll mode: users polling now).
    pub open: AtomicU64,
    /// Users whose latest state is WAITING.
    pub waiting: AtomicU64,
    /// Users who saw READY.
    pub ready: AtomicU64,
    /// Users whose task ended.
    pub done: AtomicU64,
    /// Users who ended on an error before READY.
    pub failed: AtomicU64,
    /// HTTP requests sent.
    pub http: AtomicU64,
    /// SSE events received.
    pub events: AtomicU64,
}

pub const PROGRESS_FIELDS: usize = 8;

impl Progress {
    pub fn values(&self) -> [u64; PROGRESS_FIELDS] {
        [
            self.entered.load(Relaxed),
            self.open.load(Relaxed),
            self.waiting.load(Relaxed),
            self.ready.load(Relaxed),
            self.done.load(Relaxed),
            self.failed.load(Relaxed),
            self.http.load(Relaxed),
            self.events.load(Relaxed),
        ]
    }

    pub fn set(&self, v: [u64; PROGRESS_FIELDS]) {
        self.entered.store(v[0], Relaxed);
        self.open.store(v[1], Relaxed);
        self.waiting.store(v[2], Relaxed);
        self.ready.store(v[3], Relaxed);
        self.done.store(v[4], Relaxed);
        self.failed.store(v[5], Relaxed);
        self.http.store(v[6], Relaxed);
        self.events.store(v[7], Relaxed);
    }
}

/// Sums the workers' counters.
pub fn total(ps: &[Arc<Progress>]) -> [u64; PROGRESS_FIELDS] {
    let mut t = [0; PROGRESS_FIELDS];
    for p in ps {
        for (a, b) in t.iter_mut().zip(p.values()) {
            *a += b;
        }
    }
    t
}

/// What every buyer of one worker shares.
pub struct Ctx {
    pub mode: Mode,
    pub addr: SocketAddr,
    /// Where a broken stream is reopened, after `addr`, in turn.
    pub fallback: Vec<SocketAddr>,
    pub queue: String,
    pub ips: SourceIps,
    pub read_chunk: usize,
    /// Product to order on READY (`None`: no orders).
    pub product: Option<String>,
    pub leave_on_409: bool,
    pub max_reconnects: u32,
    pub deadline: Instant,
    /// Bounds connects + enters (+ the first event) in flight.
    pub connect: Semaphore,
    pub progress: Arc<Progress>,
}

/// One `ready` as received.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReadyRec {
    /// Receive time, ms since epoch.
    pub recv: f64,
    /// The pass's time from the event (SSE only; `null` when the server
    /// did not know it).
    pub admitted_at: Option<u64>,
    pub id: String,
    pub token: String,
}

/// Everything one buyer saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UserResult {
    pub user: String,
    pub enter_status: u16,
    pub enter_ms: Option<f32>,
    /// Enter answered READY at once (the fast track).
    pub fast_tracked: bool,
    /// From sending `GET /events` to the first complete event.
    pub first_event_ms: Option<f32>,
    pub waiting_events: u32,
    pub ready_events: u32,
    pub gone: Option<String>,
    pub keepalives: u32,
    /// The `retry:` the server set on the last stream.
    pub retry_ms: Option<u64>,
    pub polls: u32,
    pub streams: u32,
    pub ready: Vec<ReadyRec>,
    /// `(pass, receive ms since epoch)` of `waiting` events whose id is
    /// exactly a pass number, the first event of each stream left out.
    pub rank_updates: Vec<(u64, f64)>,
    pub order_status: Option<u16>,
    pub order_ms: Option<f32>,
    pub order_error: Option<String>,
    pub left_status: Option<u16>,
    pub error: Option<String>,
    /// The name of the last event received (`waiting`, `ready`, `gone`).
    #[serde(default)]
    pub last_event: Option<String>,
    /// Tries after the first (enters and streams), whatever ended them.
    #[serde(default)]
    pub retries: u32,
    /// Streams the server shed at its cap (a `retry:` frame alone).
    #[serde(default)]
    pub shed: u32,
    /// Streams the server closed with a `retry:` frame after events: at
    /// its cap, evicted for a newcomer from a lighter address.
    #[serde(default)]
    pub evicted: u32,
}

fn ms_since(t: Instant) -> f32 {
    t.elapsed().as_secs_f32() * 1000.0
}

fn json_str(v: &serde_json::Value, k: &str) -> Option<String> {
    v.get(k).and_then(|x| x.as_str()).map(str::to_owned)
}

/// Enters; returns the status JSON.
async fn enter(
    ctx: &Ctx,
    conn: &mut Conn,
    res: &mut UserResult,
) -> anyhow::Result<serde_json::Value> {
    let path = format!("/api/queues/{}/entries", ctx.queue);
    let t = Instant::now();
    ctx.progress.http.fetch_add(1, Relaxed);
    let r = conn
        .request(
            "POST",
            &path,
            &[("X-User-Id", &res.user), ("Accept", "application/json")],
            None,
        )
        .await?;
    res.enter_status = r.status;
    if r.status != 201 && r.status != 200 {
        anyhow::bail!(
            "enter answered {}: {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }
    res.enter_ms = Some(ms_since(t));
    ctx.progress.entered.fetch_add(1, Relaxed);
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    if json_str(&v, "status").as_deref() == Some("READY") {
        res.fast_tracked = true;
    }
    Ok(v)
}

impl Ctx {
    /// The instance for buyer `idx`'s `attempt`-th try: `addr` first, then
    /// `addr` and the fallbacks in turn, starting at a place that depends
    /// on `idx`, so the streams of an instance that died spread evenly over
    /// the others instead of all landing on the first fallback.
    fn addr_for(&self, idx: usize, attempt: u32) -> SocketAddr {
        let n = self.fallback.len() + 1;
        if attempt == 0 {
            return self.addr;
        }
        match (idx + attempt as usize) % n {
            0 => self.addr,
            i => self.fallback[i - 1],
        }
    }

    /// Connects for buyer `idx`'s next try (`attempt` moves on); an
    /// instance that refuses (it died) is skipped, each instance tried at
    /// most once per call.
    async fn reconnect(
        &self,
        ip: std::net::Ipv4Addr,
        idx: usize,
        attempt: &mut u32,
    ) -> std::io::Result<Conn> {
        let mut left = self.fallback.len();
        loop {
            *attempt += 1;
            match Conn::connect(ip, self.addr_for(idx, *attempt), self.read_chunk).await {
                Err(_) if left > 0 => left -= 1,
                other => return other,
            }
        }
    }

    /// How long to wait before try number `failures` (1, 2, …): the
    /// `retry:` the server asked for on the last stream when it set one (as
    /// EventSource does), else a doubling backoff from 0.5 s up to 20 s;
    /// ±50 % jitter either way so a crowd cut off at once does not come
    /// back at once. `None`: give up (past `--max-reconnects` failures in a
    /// row, or the wait would end after the deadline).
    fn backoff(&self, failures: u32, server_retry: Option<u64>) -> Option<Duration> {
        if failures > self.max_reconnects {
            return None;
        }
        let base = server_retry
            .unwrap_or_else(|| (500u64 << failures.saturating_sub(1).min(6)).min(20_000))
            .max(100);
        let wait = Duration::from_millis(rand::random_range(base / 2..=base + base / 2));
        (Instant::now() + wait < self.deadline).then_some(wait)
    }
}

/// Whether a failed HTTP status is worth another try: the server was busy
/// or its store was (5xx), or it rate-limited; any other 4xx is final.
fn retryable(status: u16) -> bool {
    status == 0 || status == 429 || status >= 500
}

/// Splits an SSE id `<pass>` / `<pass>.<n>`: `(pass, exact)`.
pub fn parse_id(id: &str) -> Option<(u64, bool)> {
    match id.split_once('.') {
        Some((p, _)) => p.parse().ok().map(|p| (p, false)),
        None => id.parse().ok().map(|p| (p, true)),
    }
}

/// One buyer, in `ctx.mode`. Fills `res` as it goes, so a deadline that
/// drops this future keeps what was seen.
pub async fn buyer(ctx: &Ctx, idx: usize, res: &mut UserResult) {
    let out = match ctx.mode {
        Mode::Sse => sse_buyer(ctx, idx, res).await,
        Mode::Poll => poll_buyer(ctx, idx, res).await,
    };
    if let Err(e) = out {
        if res.error.is_none() {
            res.error = Some(e.to_string());
        }
        if res.ready.is_empty() {
            ctx.progress.failed.fetch_add(1, Relaxed);
        }
    }
}

/// Marks the state change WAITING → READY (or → gone) in the counters.
struct StateTrack<'a> {
    p: &'a Progress,
    waiting: bool,
}

impl<'a> StateTrack<'a> {
    fn waiting(&mut self) {
        if !self.waiting {
            self.waiting = true;
            self.p.waiting.fetch_add(1, Relaxed);
        }
    }
    fn not_waiting(&mut self) {
        if self.waiting {
            self.waiting = false;
            self.p.waiting.fetch_sub(1, Relaxed);
        }
    }
}

impl Drop for StateTrack<'_> {
    fn drop(&mut self) {
        self.not_waiting();
    }
}

/// Decrements `open` when the stream (or poll loop) ends.
struct OpenGuard<'a>(&'a Progress);

impl<'a> OpenGuard<'a> {
    fn new(p: &'a Progress) -> Self {
        p.open.fetch_add(1, Relaxed);
        Self(p)
    }
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
    }
}

enum Stop {
    None,
    Ready(String),
    Gone,
}

/// Enters (on `addr`, or on the next instance after a failure), retrying
/// what the server may answer differently later; returns the connection
/// and the ticket. Entering again is safe: the same user keeps their place.
async fn enter_with_retries(
    ctx: &Ctx,
    idx: usize,
    res: &mut UserResult,
    attempt: &mut u32,
) -> anyhow::Result<(Conn, String)> {
    let ip = ctx.ips.pick(idx);
    let mut failures = 0;
    loop {
        res.enter_status = 0;
        let tried = async {
            let mut conn = Conn::connect(ip, ctx.addr_for(idx, *attempt), ctx.read_chunk).await?;
            let status = enter(ctx, &mut conn, res).await?;
            let ticket = json_str(&status, "ticket")
                .ok_or_else(|| anyhow::anyhow!("no ticket in enter answer"))?;
            Ok::<_, anyhow::Error>((conn, ticket))
        }
        .await;
        match tried {
            Ok(x) => return Ok(x),
            Err(e) if retryable(res.enter_status) => {
                failures += 1;
                let Some(wait) = ctx.backoff(failures, None) else {
                    return Err(e);
                };
                res.error = Some(format!("enter failed ({e}); retried"));
                res.retries += 1;
                *attempt += 1;
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// How one stream ended, when it did not end the buyer.
enum Retry {
    /// It failed before or after opening: counts against the bound.
    Failed(String),
    /// The server shed it at its cap and said when to come back.
    Shed(u64),
    /// The server ended it with a `retry:` after events (an eviction at its
    /// cap) and said when to come back.
    Evicted(u64),
}

async fn sse_buyer(ctx: &Ctx, idx: usize, res: &mut UserResult) -> anyhow::Result<()> {
    let ip = ctx.ips.pick(idx);
    let mut permit = Some(ctx.connect.acquire().await?);
    let mut attempt = 0u32;
    let (mut conn, ticket) = enter_with_retries(ctx, idx, res, &mut attempt).await?;
    let path = format!("/api/queues/{}/events", ctx.queue);
    let mut track = StateTrack {
        p: &ctx.progress,
        waiting: false,
    };
    let mut ordered = false;
    let mut order_deadline: Option<Instant> = None;
    // Failed tries in a row with no event received in between.
    let mut failures = 0u32;
    'streams: loop {
        let retry = 'stream: {
            let sent = Instant::now();
            ctx.progress.http.fetch_add(1, Relaxed);
            let head = match conn
                .send(
                    "GET",
                    &path,
                    &[("X-Queue-Ticket", &ticket), ("Accept", "text/event-stream")],
                    None,
                )
                .await
            {
                Ok(()) => conn.head().await,
                Err(e) => Err(e),
            };
            let head = match head {
                Ok(h) => h,
                Err(e) => break 'stream Retry::Failed(format!("opening the stream: {e}")),
            };
            if head.status == 204 {
                res.gone = Some("no_content_204".into());
                return Ok(());
            }
            if head.status != 200 || !head.event_stream {
                let r = conn.response_body_after(&head).await.unwrap_or_default();
                let msg = format!(
                    "events answered {}: {}",
                    head.status,
                    String::from_utf8_lossy(&r)
                );
                if retryable(head.status) {
                    break 'stream Retry::Failed(msg);
                }
                anyhow::bail!(msg);
            }
            res.streams += 1;
            res.retry_ms = None;
            let _open = OpenGuard::new(&ctx.progress);
            let mut parser = SseParser::default();
            let mut first_in_stream = true;
            // A `retry:` after the stream's first event: it is closing us.
            let mut late_retry = false;
            let mut body = crate::http::BodyState::default();
            loop {
                let mut stop = Stop::None;
                let read = {
                    let progress = &ctx.progress;
                    let res = &mut *res;
                    let track = &mut track;
                    let permit = &mut permit;
                    let first_in_stream = &mut first_in_stream;
                    let late_retry = &mut late_retry;
                    let stop = &mut stop;
                    let want_order = ctx.product.is_some() && !ordered;
                    let fut = conn.read_events(&head, &mut body, &mut parser, |item| match item {
                        SseItem::Comment => {
                            res.keepalives += 1;
                            true
                        }
                        SseItem::Retry(ms) => {
                            res.retry_ms = Some(ms);
                            *late_retry = !*first_in_stream;
                            true
                        }
                        SseItem::Event { event, id, data } => {
                            let now = now_ms();
                            progress.events.fetch_add(1, Relaxed);
                            if res.first_event_ms.is_none() {
                                res.first_event_ms = Some(ms_since(sent));
                            }
                            permit.take();
                            let first = std::mem::replace(first_in_stream, false);
                            if res.last_event.as_deref() != Some(event) {
                                res.last_event = Some(event.to_owned());
                            }
                            match event {
                                "waiting" => {
                                    res.waiting_events += 1;
                                    track.waiting();
                                    if !first && let Some((pass, true)) = parse_id(id) {
                                        res.rank_updates.push((pass, now));
                                    }
                                    true
                                }
                                "ready" => {
                                    res.ready_events += 1;
                                    track.not_waiting();
                                    let v: serde_json::Value =
                                        serde_json::from_str(data).unwrap_or_default();
                                    let token = json_str(&v, "entryToken").unwrap_or_default();
                                    if res.ready.is_empty() {
                                        progress.ready.fetch_add(1, Relaxed);
                                    }
                                    res.ready.push(ReadyRec {
                                        recv: now,
                                        admitted_at: v.get("admittedAt").and_then(|x| x.as_u64()),
                                        id: id.to_owned(),
                                        token: token.clone(),
                                    });
                                    if want_order {
                                        *stop = Stop::Ready(token);
                                        false
                                    } else if ctx.product.is_none() {
                                        // Without orders a buyer is done at `ready`.
                                        *stop = Stop::Gone;
                                        false
                                    } else {
                                        // A `ready` after the order: counted (a duplicate).
                                        true
                                    }
                                }
                                "gone" => {
                                    track.not_waiting();
                                    let v: serde_json::Value =
                                        serde_json::from_str(data).unwrap_or_default();
                                    res.gone =
                                        Some(json_str(&v, "reason").unwrap_or_else(|| "?".into()));
                                    *stop = Stop::Gone;
                                    false
                                }
                                _ => true,
                            }
                        }
                    });
                    match order_deadline {
                        Some(d) => match tokio::time::timeout_at(d, fut).await {
                            Ok(r) => r,
                            Err(_) => {
                                res.error = Some("no gone event within 20 s of the order".into());
                                return Ok(());
                            }
                        },
                        None => fut.await,
                    }
                };
                if !first_in_stream {
                    // The stream delivered: the failures so far are over.
                    failures = 0;
                }
                match read {
                    Ok(_) => {}
                    Err(e) if res.ready.is_empty() => {
                        break 'stream Retry::Failed(format!("stream broke ({e})"));
                    }
                    Err(e) => return Err(e.into()),
                }
                match stop {
                    Stop::Gone => return Ok(()),
                    Stop::Ready(token) => {
                        ordered = true;
                        conn.shrink();
                        parser.shrink();
                        place_order(ctx, None, ip, res, &token, &ticket).await;
                        order_deadline = Some(Instant::now() + Duration::from_secs(20));
                        // keep reading the stream until `gone`
                    }
                    Stop::None if !res.ready.is_empty() => return Ok(()),
                    Stop::None => match (first_in_stream, res.retry_ms) {
                        // A `retry:` frame alone: shed at the instance's cap.
                        (true, Some(ms)) => break 'stream Retry::Shed(ms),
                        (false, Some(ms)) if late_retry => break 'stream Retry::Evicted(ms),
                        _ => break 'stream Retry::Failed("stream ended without gone".into()),
                    },
                }
            }
        };
        // Every way here is a stream that ended before `ready` or `gone`:
        // come back as EventSource would, on the next instance when one
        // refuses, until the bound or the deadline.
        drop(permit.take());
        let wait = match retry {
            Retry::Shed(ms) => {
                // A shed answer never was a stream: counted apart.
                res.streams -= 1;
                res.shed += 1;
                let wait = Duration::from_millis(ms);
                if Instant::now() + wait >= ctx.deadline {
                    anyhow::bail!("shed at the stream cap with no time left");
                }
                wait
            }
            Retry::Evicted(ms) => {
                res.evicted += 1;
                let wait = Duration::from_millis(ms);
                if Instant::now() + wait >= ctx.deadline {
                    anyhow::bail!("evicted at the stream cap with no time left");
                }
                wait
            }
            Retry::Failed(msg) => {
                failures += 1;
                let Some(wait) = ctx.backoff(failures, res.retry_ms) else {
                    anyhow::bail!("{msg}; gave up after {} tries in a row", failures);
                };
                res.error = Some(format!("{msg}; reconnected"));
                wait
            }
        };
        res.retries += 1;
        tokio::time::sleep(wait).await;
        loop {
            match ctx.reconnect(ip, idx, &mut attempt).await {
                Ok(c) => {
                    conn = c;
                    continue 'streams;
                }
                Err(e) => {
                    failures += 1;
                    let Some(wait) = ctx.backoff(failures, None) else {
                        anyhow::bail!("reconnect: {e}; gave up after {} tries in a row", failures);
                    };
                    res.retries += 1;
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

/// Orders with `token` (on `conn`, or a new connection); leaves the queue
/// (gives the token up) on 409 out_of_stock when asked to.
async fn place_order(
    ctx: &Ctx,
    conn: Option<&mut Conn>,
    ip: std::net::Ipv4Addr,
    res: &mut UserResult,
    token: &str,
    ticket: &str,
) {
    let Some(product) = &ctx.product else { return };
    let mut fresh;
    let conn = match conn {
        Some(c) => c,
        None => match Conn::connect(ip, ctx.addr, 1024).await {
            Ok(c) => {
                fresh = c;
                &mut fresh
            }
            Err(e) => {
                res.order_error = Some(format!("connect: {e}"));
                return;
            }
        },
    };
    let body = format!(
        "{{\"productId\":{},\"quantity\":1}}",
        serde_json::Value::String(product.clone())
    );
    let t = Instant::now();
    ctx.progress.http.fetch_add(1, Relaxed);
    let r = conn
        .request(
            "POST",
            "/api/orders",
            &[
                ("X-User-Id", &res.user),
                ("X-Entry-Token", token),
                ("Content-Type", "application/json"),
            ],
            Some(body.as_bytes()),
        )
        .await;
    match r {
        Ok(r) => {
            res.order_status = Some(r.status);
            res.order_ms = Some(ms_since(t));
            if r.status != 201 {
                let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
                let code = json_str(&v, "error").unwrap_or_else(|| "?".into());
                res.order_error = Some(code.clone());
                if r.status == 409 && code == "out_of_stock" && ctx.leave_on_409 {
                    let path = format!("/api/queues/{}/entries/me", ctx.queue);
                    ctx.progress.http.fetch_add(1, Relaxed);
                    match conn
                        .request("DELETE", &path, &[("X-Queue-Ticket", ticket)], None)
                        .await
                    {
                        Ok(r) => res.left_status = Some(r.status),
                        Err(e) => {
                            res.order_error = Some(format!("out_of_stock; leave failed: {e}"))
                        }
                    }
                }
            }
        }
        Err(e) => res.order_error = Some(format!("order request: {e}")),
    }
}

async fn poll_buyer(ctx: &Ctx, idx: usize, res: &mut UserResult) -> anyhow::Result<()> {
    let ip = ctx.ips.pick(idx);
    let permit = ctx.connect.acquire().await?;
    let mut conn = Conn::connect(ip, ctx.addr, ctx.read_chunk).await?;
    let mut status = enter(ctx, &mut conn, res).await?;
    drop(permit);
    let ticket =
        json_str(&status, "ticket").ok_or_else(|| anyhow::anyhow!("no ticket in enter answer"))?;
    let path = format!("/api/queues/{}/position", ctx.queue);
    let mut track = StateTrack {
        p: &ctx.progress,
        waiting: false,
    };
    let _open = OpenGuard::new(&ctx.progress);
    let mut reconnects = 0;
    let token = loop {
        match json_str(&status, "status").as_deref() {
            Some("READY") => {
                track.not_waiting();
                let token = json_str(&status, "entryToken").unwrap_or_default();
                res.ready_events += 1;
                ctx.progress.ready.fetch_add(1, Relaxed);
                res.ready.push(ReadyRec {
                    recv: now_ms(),
                    admitted_at: None,
                    id: String::new(),
                    token: token.clone(),
                });
                break token;
            }
            Some("WAITING") => {
                track.waiting();
                res.waiting_events += 1;
            }
            other => {
                res.gone = Some(format!("status {}", other.unwrap_or("?")));
                return Ok(());
            }
        }
        let secs = status
            .get("pollingIntervalSeconds")
            .and_then(|v| v.as_f64())
            .unwrap_or(5.0)
            .clamp(0.2, 60.0);
        let sleep = secs * rand::random_range(0.8..1.2);
        tokio::time::sleep(Duration::from_secs_f64(sleep)).await;
        ctx.progress.http.fetch_add(1, Relaxed);
        res.polls += 1;
        let r = match conn
            .request("GET", &path, &[("X-Queue-Ticket", &ticket)], None)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                // The server may close idle keep-alive connections.
                if reconnects >= 20 {
                    return Err(e.into());
                }
                reconnects += 1;
                conn = Conn::connect(ip, ctx.addr, ctx.read_chunk).await?;
                ctx.progress.http.fetch_add(1, Relaxed);
                res.polls += 1;
                conn.request("GET", &path, &[("X-Queue-Ticket", &ticket)], None)
                    .await?
            }
        };
        if r.status != 200 {
            anyhow::bail!(
                "position answered {}: {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            );
        }
        if r.close {
            conn = Conn::connect(ip, ctx.addr, ctx.read_chunk).await?;
        }
        status = serde_json::from_slice(&r.body)?;
    };
    drop(track);
    place_order(ctx, Some(&mut conn), ip, res, &token, &ticket).await;
    Ok(())
}

/// Runs the buyers `indices` until each is done or the deadline passes.
pub async fn run_buyers(ctx: Arc<Ctx>, prefix: String, indices: Vec<usize>) -> Vec<UserResult> {
    let mut handles = Vec::with_capacity(indices.len());
    for idx in indices {
        let ctx = ctx.clone();
        let user = format!("{prefix}-{idx}");
        handles.push(tokio::spawn(async move {
            let mut res = UserResult {
                user,
                ..Default::default()
            };
            let deadline = ctx.deadline;
            let timed_out = tokio::time::timeout_at(deadline, buyer(&ctx, idx, &mut res))
                .await
                .is_err();
            if timed_out && res.error.is_none() && res.ready.is_empty() {
                res.error = Some("deadline before ready".into());
            }
            ctx.progress.done.fetch_add(1, Relaxed);
            res
        }));
    }
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        if let Ok(r) = h.await {
            out.push(r);
        }
    }
    out
}

/// The "plug": users who take every admission slot (`--max-active`) before
/// the crowd arrives, so the crowd waits with admission stalled; releasing
/// them (leaving, which gives their tokens up) lets admission run.
pub struct Plug {
    pub tickets: Vec<String>,
    pub ready: usize,
}

pub async fn plug(ctx: Arc<Ctx>, prefix: &str, n: usize) -> anyhow::Result<Plug> {
    let mut handles = Vec::new();
    for i in 0..n {
        let ctx = ctx.clone();
        let user = format!("{prefix}-plug-{i}");
        handles.push(tokio::spawn(async move {
            let _p = ctx.connect.acquire().await.ok()?;
            let ip = ctx.ips.pick(i);
            let mut conn = Conn::connect(ip, ctx.addr, 2048).await.ok()?;
            let mut res = UserResult {
                user,
                ..Default::default()
            };
            let mut v = enter(&ctx, &mut conn, &mut res).await.ok()?;
            let ticket = json_str(&v, "ticket")?;
            let path = format!("/api/queues/{}/position", ctx.queue);
            let until = Instant::now() + Duration::from_secs(30);
            while json_str(&v, "status").as_deref() != Some("READY") && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let r = conn
                    .request("GET", &path, &[("X-Queue-Ticket", &ticket)], None)
                    .await
                    .ok()?;
                v = serde_json::from_slice(&r.body).ok()?;
            }
            let ready = json_str(&v, "status").as_deref() == Some("READY");
            Some((ticket, ready))
        }));
    }
    let mut plug = Plug {
        tickets: Vec::new(),
        ready: 0,
    };
    for h in handles {
        if let Ok(Some((t, r))) = h.await {
            plug.tickets.push(t);
            plug.ready += r as usize;
        }
    }
    Ok(plug)
}

/// Every plug user leaves (their tokens free their slots).
pub async fn unplug(ctx: Arc<Ctx>, tickets: Vec<String>) -> usize {
    let mut handles = Vec::new();
    for (i, t) in tickets.into_iter().enumerate() {
        let ctx = ctx.clone();
        handles.push(tokio::spawn(async move {
            let _p = ctx.connect.acquire().await.ok()?;
            let mut conn = Conn::connect(ctx.ips.pick(i), ctx.addr, 1024).await.ok()?;
            let path = format!("/api/queues/{}/entries/me", ctx.queue);
            let r = conn
                .request("DELETE", &path, &[("X-Queue-Ticket", &t)], None)
                .await
                .ok()?;
            (r.status == 204).then_some(())
        }));
    }
    let mut ok = 0;
    for h in handles {
        if let Ok(Some(())) = h.await {
            ok += 1;
        }
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(fallbacks: usize, max_reconnects: u32, deadline_in: Duration) -> Ctx {
        let addr = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        Ctx {
            mode: Mode::Sse,
            addr: addr(1000),
            fallback: (1..=fallbacks as u16).map(|i| addr(1000 + i)).collect(),
            queue: "q".into(),
            ips: SourceIps::parse("127.0.0.1").unwrap(),
            read_chunk: 512,
            product: None,
            leave_on_409: false,
            max_reconnects,
            deadline: Instant::now() + deadline_in,
            connect: Semaphore::new(1),
            progress: Arc::default(),
        }
    }

    #[test]
    fn first_try_is_the_home_instance_and_retries_spread_over_all() {
        let c = ctx(2, 3, Duration::from_secs(60));
        for idx in 0..30 {
            assert_eq!(c.addr_for(idx, 0).port(), 1000);
        }
        // The first reconnection of a crowd whose instance died lands on
        // every other instance about equally, not all on the first one.
        let mut hits = [0usize; 3];
        for idx in 0..300 {
            hits[(c.addr_for(idx, 1).port() - 1000) as usize] += 1;
        }
        assert_eq!(hits, [100, 100, 100]);
        // Three tries in a row from one buyer visit all three instances.
        let mut seen: Vec<u16> = (1..=3).map(|a| c.addr_for(7, a).port()).collect();
        seen.sort();
        assert_eq!(seen, [1000, 1001, 1002]);
    }

    #[test]
    fn without_fallbacks_every_try_is_the_home_instance() {
        let c = ctx(0, 3, Duration::from_secs(60));
        assert!((0..10).all(|a| c.addr_for(5, a).port() == 1000));
    }

    #[test]
    fn backoff_doubles_honours_the_server_and_stops_at_the_bound_or_deadline() {
        let c = ctx(2, 4, Duration::from_secs(3600));
        for f in 1..=4u32 {
            let base = 500u64 << (f - 1);
            let w = c.backoff(f, None).unwrap().as_millis() as u64;
            assert!((base / 2..=base + base / 2).contains(&w), "try {f}: {w} ms");
        }
        let w = c.backoff(1, Some(30_000)).unwrap().as_millis() as u64;
        assert!((15_000..=45_000).contains(&w), "{w} ms");
        assert!(c.backoff(5, None).is_none(), "past --max-reconnects");
        let soon = ctx(2, 4, Duration::from_millis(100));
        assert!(soon.backoff(1, Some(10_000)).is_none(), "past the deadline");
    }

    #[test]
    fn only_busy_unavailable_and_rate_limited_answers_are_retried() {
        for s in [0, 429, 500, 502, 503] {
            assert!(retryable(s), "{s}");
        }
        for s in [400, 401, 403, 404, 409] {
            assert!(!retryable(s), "{s}");
        }
    }
}
