//! What the generator reads about the server under test: its process
//! (/proc RSS and CPU), its Redis (INFO commandstats, the pass channel) and
//! its /metrics.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::http::Conn;
use crate::now_ms;

/// VmRSS of `pid` in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// utime + stime of `pid` in seconds.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime 15.
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / clk_tck())
}

/// This process's own CPU seconds (user + system).
pub fn self_cpu_secs() -> f64 {
    cpu_secs(std::process::id()).unwrap_or(0.0)
}

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// Raises this process's open-file soft limit to the hard limit.
pub fn raise_nofile() -> u64 {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 0;
        }
        if rl.rlim_cur < rl.rlim_max {
            rl.rlim_cur = rl.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
        }
        rl.rlim_cur
    }
}

/// Calls per command from `INFO commandstats`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CommandStats(pub BTreeMap<String, u64>);

impl CommandStats {
    pub fn parse(info: &str) -> Self {
        let mut m = BTreeMap::new();
        for line in info.lines() {
            let Some(rest) = line.strip_prefix("cmdstat_") else {
                continue;
            };
            let Some((name, fields)) = rest.split_once(':') else {
                continue;
            };
            let calls = fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            m.insert(name.to_string(), calls);
        }
        Self(m)
    }

    /// Per-command deltas `self - before` (commands with no calls dropped).
    pub fn delta(&self, before: &CommandStats) -> CommandStats {
        let mut m = BTreeMap::new();
        for (k, v) in &self.0 {
            let d = v.saturating_sub(*before.0.get(k).unwrap_or(&0));
            if d > 0 {
                m.insert(k.clone(), d);
            }
        }
        CommandStats(m)
    }

    /// Total calls, leaving out the measurer's own `INFO`.
    pub fn total_without_info(&self) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.as_str() != "info")
            .map(|(_, v)| v)
            .sum()
    }

    pub fn get(&self, name: &str) -> u64 {
        *self.0.get(name).unwrap_or(&0)
    }
}

/// A connection for INFO.
pub struct RedisProbe {
    con: redis::aio::MultiplexedConnection,
}

impl RedisProbe {
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        let client = redis::Client::open(url)?;
        let con = client.get_multiplexed_async_connection().await?;
        Ok(Self { con })
    }

    pub async fn commandstats(&mut self) -> anyhow::Result<CommandStats> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.con)
            .await?;
        Ok(CommandStats::parse(&info))
    }
}

/// One admission pass as published on the queue's channel.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PassRec {
    pub pass: u64,
    /// Redis-clock ms of the pass.
    pub at: u64,
    /// Local receive time (ms since epoch).
    pub recv: f64,
    /// Users admitted (user id, token).
    pub admitted: Vec<(String, String)>,
    pub abandoned: usize,
    pub waiting: u64,
    pub busy: bool,
}

/// Everything heard on the channel.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ChannelLog {
    pub passes: Vec<PassRec>,
    pub left: u64,
    pub consumed: u64,
    pub other: u64,
    pub unreadable: u64,
}

#[derive(Deserialize)]
struct RawAdmitted {
    user: String,
    #[serde(default)]
    token: Option<String>,
}

#[derive(Deserialize)]
struct RawPass {
    kind: String,
    #[serde(default)]
    pass: u64,
    #[serde(default)]
    at: u64,
    // Lua's cjson encodes an empty list as `{}`: take any JSON here.
    #[serde(default)]
    admitted: serde_json::Value,
    #[serde(default)]
    abandoned: serde_json::Value,
    #[serde(default)]
    waiting: u64,
    #[serde(default)]
    busy: bool,
}

/// A JSON list of `T` (`{}` or anything else: empty).
fn list<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Vec<T> {
    match v {
        serde_json::Value::Array(items) => items
            .into_iter()
            .filter_map(|i| serde_json::from_value(i).ok())
            .collect(),
        _ => Vec::new(),
    }
}

/// Adds one message of the pass channel to `log`.
fn record(log: &Mutex<ChannelLog>, payload: &[u8], recv: f64) {
    let parsed: Result<RawPass, _> = serde_json::from_slice(payload);
    let mut log = log.lock().unwrap();
    match parsed {
        Ok(p) if p.kind == "pass" => log.passes.push(PassRec {
            pass: p.pass,
            at: p.at,
            recv,
            admitted: list::<RawAdmitted>(p.admitted)
                .into_iter()
                .map(|a| (a.user, a.token.unwrap_or_default()))
                .collect(),
            abandoned: p.abandoned.as_array().map_or(0, Vec::len),
            waiting: p.waiting,
            busy: p.busy,
        }),
        Ok(p) if p.kind == "left" => log.left += 1,
        Ok(p) if p.kind == "consumed" => log.consumed += 1,
        Ok(_) => log.other += 1,
        Err(_) => log.unreadable += 1,
    }
}

/// Subscribes to the pass channel; the log grows until `stop` fires. The
/// returned future resolves once subscribed. `sharded`: the servers run on
/// a Redis Cluster and publish with `SPUBLISH`; `url` must then be the
/// master of the queue's slot.
pub async fn listen_passes(
    url: &str,
    channel: String,
    log: Arc<Mutex<ChannelLog>>,
    stop: tokio::sync::watch::Receiver<bool>,
    sharded: bool,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let client = redis::Client::open(url)?;
    if sharded {
        return listen_sharded(client, channel, log, stop);
    }
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(&channel).await?;
    Ok(tokio::spawn(async move {
        let mut stop = stop;
        let mut messages = pubsub.into_on_message();
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                msg = messages.next() => {
                    let Some(msg) = msg else { break };
                    record(&log, msg.get_payload_bytes(), now_ms());
                }
            }
        }
    }))
}

/// `SSUBSCRIBE` over a plain RESP2 connection on a thread of its own
/// (redis-rs's async pub/sub has no sharded subscribe outside its cluster
/// client): `smessage` arrays until `stop` fires. The thread blocks on
/// the socket without a read timeout (a timed-out read makes redis-rs skip
/// the next reply) and is left behind when the run ends.
fn listen_sharded(
    client: redis::Client,
    channel: String,
    log: Arc<Mutex<ChannelLog>>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut con = client.get_connection_with_timeout(Duration::from_secs(5))?;
    con.send_packed_command(&redis::cmd("SSUBSCRIBE").arg(&channel).get_packed_command())?;
    // The confirmation.
    con.recv_response()?;
    let watching = stop.clone();
    std::thread::spawn(move || {
        while !*watching.borrow() {
            match con.recv_response() {
                // The parser may turn the `smessage` array into a push.
                Ok(redis::Value::Push {
                    kind: redis::PushKind::SMessage,
                    data,
                }) => {
                    if let Some(redis::Value::BulkString(payload)) = data.get(1) {
                        record(&log, payload, now_ms());
                    }
                }
                Ok(redis::Value::Array(items)) => {
                    if let [
                        redis::Value::BulkString(kind),
                        _,
                        redis::Value::BulkString(payload),
                    ] = &items[..]
                        && kind == b"smessage"
                    {
                        record(&log, payload, now_ms());
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    let mut stop = stop;
    Ok(tokio::spawn(async move {
        let _ = stop.wait_for(|s| *s).await;
    }))
}

/// `waitroom_streams_open` from /metrics on the server's operator
/// listener (`None` without one).
pub async fn streams_open(admin_addr: Option<SocketAddr>) -> Option<f64> {
    let addr = admin_addr?;
    let mut c = Conn::connect(std::net::Ipv4Addr::new(127, 0, 0, 1), addr, 4096)
        .await
        .ok()?;
    let r = c
        .request("GET", "/metrics", &[("Connection", "close")], None)
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&r.body);
    text.lines()
        .find(|l| l.starts_with("waitroom_streams_open"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats() {
        let a = CommandStats::parse(
            "# Commandstats\r\ncmdstat_zadd:calls=10,usec=5,usec_per_call=0.5,rejected_calls=0,failed_calls=0\r\ncmdstat_info:calls=3,usec=1\r\n",
        );
        let b = CommandStats::parse(
            "cmdstat_zadd:calls=25,usec=5\r\ncmdstat_info:calls=5,usec=1\r\ncmdstat_evalsha:calls=2,usec=1\r\n",
        );
        let d = b.delta(&a);
        assert_eq!(d.get("zadd"), 15);
        assert_eq!(d.get("evalsha"), 2);
        assert_eq!(d.total_without_info(), 17);
    }

    #[test]
    fn own_process() {
        assert!(rss_kib(std::process::id()).unwrap() > 0);
        assert!(cpu_secs(std::process::id()).is_some());
    }
}
