//! One soak buyer: joins one instance, waits by SSE (a stream that may
//! drop and reconnect to the other instance) or by polling, may lose
//! patience and leave, and once admitted either orders or lets the token
//! expire.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::http::{BodyState, Conn, SourceIps, SseItem, SseParser};

/// Counters over the whole run, read by the sampler.
#[derive(Default)]
pub struct Counters {
    pub joins: AtomicU64,
    pub join_errors: AtomicU64,
    pub fast_tracked: AtomicU64,
    /// SSE streams open now (the generator's view).
    pub streams: AtomicU64,
    pub polls: AtomicU64,
    /// Streams the buyer dropped on purpose, then reopened elsewhere.
    pub drops: AtomicU64,
    /// Streams the server ended before `ready` (reopened).
    pub server_closed: AtomicU64,
    pub leaves: AtomicU64,
    pub ready: AtomicU64,
    pub orders_ok: AtomicU64,
    pub orders_refused: AtomicU64,
    /// Admitted buyers who never used their token (it expires).
    pub expiring: AtomicU64,
    pub errors: AtomicU64,
    /// Buyers alive now.
    pub alive: AtomicU64,
}

/// What every buyer shares.
pub struct World {
    pub addrs: Vec<SocketAddr>,
    pub queue: String,
    pub ips: SourceIps,
    pub product: Option<String>,
    pub poll_share: f64,
    pub drop_share: f64,
    pub order_share: f64,
    pub patience: Duration,
    pub counters: Counters,
    /// Turns true when the load phase ends: buyers still waiting leave.
    pub end: watch::Receiver<bool>,
}

/// How a wait ended.
enum Waited {
    Ready(String),
    Leave,
}

/// Keeps `alive` and `streams` right however a buyer ends.
struct Gauge<'a>(&'a AtomicU64);

impl<'a> Gauge<'a> {
    fn new(g: &'a AtomicU64) -> Self {
        g.fetch_add(1, Relaxed);
        Self(g)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Buyer `i`; every error is counted, never fatal to the run.
pub async fn buyer(w: Arc<World>, i: usize, user: String) {
    let _alive = Gauge::new(&w.counters.alive);
    if run(&w, i, &user).await.is_err() {
        w.counters.errors.fetch_add(1, Relaxed);
    }
}

fn exp_sample(mean: Duration) -> Duration {
    let u: f64 = rand::random_range(1e-9..1.0);
    mean.mul_f64(-u.ln()).min(mean * 8)
}

async fn run(w: &World, i: usize, user: &str) -> anyhow::Result<()> {
    let ip = w.ips.pick(i);
    let mut home = i % w.addrs.len();
    let mut conn = Conn::connect(ip, w.addrs[home], 1024).await?;
    let path = format!("/api/queues/{}/entries", w.queue);
    let r = conn
        .request("POST", &path, &[("X-User-Id", user)], None)
        .await?;
    if r.status != 201 && r.status != 200 {
        w.counters.join_errors.fetch_add(1, Relaxed);
        anyhow::bail!("join answered {}", r.status);
    }
    w.counters.joins.fetch_add(1, Relaxed);
    let status: serde_json::Value = serde_json::from_slice(&r.body)?;
    let ticket = status["ticket"].as_str().unwrap_or_default().to_owned();
    let leave_at = Instant::now() + exp_sample(w.patience);
    let waited = if status["status"] == "READY" {
        w.counters.fast_tracked.fetch_add(1, Relaxed);
        Waited::Ready(status["entryToken"].as_str().unwrap_or_default().to_owned())
    } else if rand::random_bool(w.poll_share) {
        poll(w, &mut conn, ip, home, &ticket, leave_at).await?
    } else {
        let drop_at = rand::random_bool(w.drop_share)
            .then(|| Instant::now() + Duration::from_secs_f64(rand::random_range(3.0..30.0)));
        stream(w, &mut conn, ip, &mut home, &ticket, leave_at, drop_at).await?
    };
    match waited {
        Waited::Leave => {
            let mut c = Conn::connect(ip, w.addrs[home], 1024).await?;
            let path = format!("/api/queues/{}/entries/me", w.queue);
            let r = c
                .request("DELETE", &path, &[("X-Queue-Ticket", &ticket)], None)
                .await?;
            anyhow::ensure!(r.status == 204, "leave answered {}", r.status);
            w.counters.leaves.fetch_add(1, Relaxed);
        }
        Waited::Ready(token) => {
            w.counters.ready.fetch_add(1, Relaxed);
            match &w.product {
                Some(product) if rand::random_bool(w.order_share) => {
                    order(w, ip, home, user, product, &token).await?
                }
                _ => {
                    w.counters.expiring.fetch_add(1, Relaxed);
                }
            }
        }
    }
    Ok(())
}

/// Polls the position at the server's pace until `READY`, patience runs
/// out or the load phase ends.
async fn poll(
    w: &World,
    conn: &mut Conn,
    ip: std::net::Ipv4Addr,
    home: usize,
    ticket: &str,
    leave_at: Instant,
) -> anyhow::Result<Waited> {
    let path = format!("/api/queues/{}/position", w.queue);
    let mut end = w.end.clone();
    let mut every = 5.0;
    loop {
        let wake = Instant::now() + Duration::from_secs_f64(every * rand::random_range(0.8..1.2));
        tokio::select! {
            _ = tokio::time::sleep_until(wake.min(leave_at)) => {}
            _ = end.wait_for(|e| *e) => return Ok(Waited::Leave),
        }
        if Instant::now() >= leave_at {
            return Ok(Waited::Leave);
        }
        w.counters.polls.fetch_add(1, Relaxed);
        let r = match conn
            .request("GET", &path, &[("X-Queue-Ticket", ticket)], None)
            .await
        {
            Ok(r) => r,
            // The server closed the idle keep-alive connection.
            Err(_) => {
                *conn = Conn::connect(ip, w.addrs[home], 1024).await?;
                conn.request("GET", &path, &[("X-Queue-Ticket", ticket)], None)
                    .await?
            }
        };
        anyhow::ensure!(r.status == 200, "position answered {}", r.status);
        if r.close {
            *conn = Conn::connect(ip, w.addrs[home], 1024).await?;
        }
        let v: serde_json::Value = serde_json::from_slice(&r.body)?;
        if v["status"] == "READY" {
            return Ok(Waited::Ready(
                v["entryToken"].as_str().unwrap_or_default().to_owned(),
            ));
        }
        anyhow::ensure!(v["status"] == "WAITING", "status {}", v["status"]);
        every = v["pollingIntervalSeconds"]
            .as_f64()
            .unwrap_or(5.0)
            .clamp(0.5, 60.0);
    }
}

/// Holds a stream until `ready`; at `drop_at` drops it and reopens it on
/// the other instance with `Last-Event-ID`, as a page whose network
/// blinked would.
async fn stream(
    w: &World,
    conn: &mut Conn,
    ip: std::net::Ipv4Addr,
    home: &mut usize,
    ticket: &str,
    leave_at: Instant,
    mut drop_at: Option<Instant>,
) -> anyhow::Result<Waited> {
    let path = format!("/api/queues/{}/events", w.queue);
    let mut end = w.end.clone();
    let mut last_id = String::new();
    let mut reopened = 0;
    loop {
        let mut headers = vec![("X-Queue-Ticket", ticket), ("Accept", "text/event-stream")];
        if !last_id.is_empty() {
            headers.push(("Last-Event-ID", &last_id));
        }
        conn.send("GET", &path, &headers, None).await?;
        let head = conn.head().await?;
        anyhow::ensure!(
            head.status == 200 && head.event_stream,
            "events answered {}",
            head.status
        );
        let _open = Gauge::new(&w.counters.streams);
        let mut parser = SseParser::default();
        let mut body = BodyState::default();
        let mut token: Option<String> = None;
        let mut gone: Option<String> = None;
        let mut id = String::new();
        let read = conn.read_events(&head, &mut body, &mut parser, |item| {
            if let SseItem::Event {
                event,
                id: event_id,
                data,
            } = item
            {
                if !event_id.is_empty() {
                    id = event_id.to_owned();
                }
                if event == "ready" {
                    let v: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
                    token = Some(v["entryToken"].as_str().unwrap_or_default().to_owned());
                    return false;
                }
                if event == "gone" {
                    gone = Some(data.to_owned());
                    return false;
                }
            }
            true
        });
        let until = drop_at.map_or(leave_at, |d| d.min(leave_at));
        let outcome = tokio::select! {
            r = read => Some(r),
            _ = tokio::time::sleep_until(until) => None,
            _ = end.wait_for(|e| *e) => return Ok(Waited::Leave),
        };
        if !id.is_empty() {
            last_id = id;
        }
        if let Some(token) = token {
            return Ok(Waited::Ready(token));
        }
        if let Some(why) = gone {
            anyhow::bail!("gone while waiting: {why}");
        }
        match outcome {
            None if Instant::now() >= leave_at => return Ok(Waited::Leave),
            None => {
                w.counters.drops.fetch_add(1, Relaxed);
                drop_at = None;
                *home = (*home + 1) % w.addrs.len();
            }
            Some(_) => {
                w.counters.server_closed.fetch_add(1, Relaxed);
                reopened += 1;
                anyhow::ensure!(reopened <= 20, "stream closed 20 times");
            }
        }
        *conn = Conn::connect(ip, w.addrs[*home], 1024).await?;
    }
}

async fn order(
    w: &World,
    ip: std::net::Ipv4Addr,
    home: usize,
    user: &str,
    product: &str,
    token: &str,
) -> anyhow::Result<()> {
    let mut c = Conn::connect(ip, w.addrs[home], 1024).await?;
    let body = format!(
        "{{\"productId\":{},\"quantity\":1}}",
        serde_json::Value::String(product.to_owned())
    );
    let r = c
        .request(
            "POST",
            "/api/orders",
            &[
                ("X-User-Id", user),
                ("X-Entry-Token", token),
                ("Content-Type", "application/json"),
            ],
            Some(body.as_bytes()),
        )
        .await?;
    if r.status == 201 {
        w.counters.orders_ok.fetch_add(1, Relaxed);
    } else {
        w.counters.orders_refused.fetch_add(1, Relaxed);
    }
    Ok(())
}
