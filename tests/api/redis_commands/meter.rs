//! Counting what Redis spends on a measured phase of calls: its own
//! counters (`INFO commandstats` after `CONFIG RESETSTAT`) and, when it
//! runs under valgrind's callgrind, its instructions (zeroed and dumped
//! with the counters): the measuring half of `redis_commands`, apart from
//! the calls it measures.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

/// Rows of `INFO commandstats` that are not a script's own commands: the
/// measurement's, a connection's set-up, a script (re)load.
fn is_script_command(name: &str) -> bool {
    !matches!(
        name,
        "info" | "evalsha" | "eval" | "ping" | "hello" | "select"
    ) && !name.starts_with("config|")
        && !name.starts_with("script|")
        && !name.starts_with("client|")
}

/// What Redis counted since the last reset: script calls, the µs inside
/// them, and the commands the scripts ran, by name.
#[derive(Debug, Clone, Default)]
pub(super) struct Cost {
    pub(super) calls: u64,
    pub(super) usec: u64,
    /// Instructions Redis ran in all (under callgrind), else 0.
    pub(super) instructions: u64,
    pub(super) commands: BTreeMap<String, u64>,
}

impl Cost {
    pub(super) fn parse(info: &str) -> Self {
        let mut cost = Cost::default();
        for line in info.lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let field = |key: &str| -> u64 {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0) as u64
            };
            if name == "evalsha" {
                cost.calls = field("calls");
                cost.usec = field("usec");
            } else if is_script_command(name) {
                cost.commands.insert(name.to_owned(), field("calls"));
            }
        }
        cost
    }

    pub(super) fn add(&mut self, other: &Cost) {
        self.calls += other.calls;
        self.usec += other.usec;
        self.instructions += other.instructions;
        for (name, n) in &other.commands {
            *self.commands.entry(name.clone()).or_default() += n;
        }
    }

    /// Commands per script call, all kinds together.
    pub(super) fn commands_per_call(&self) -> f64 {
        self.commands.values().sum::<u64>() as f64 / self.calls.max(1) as f64
    }

    /// Commands per script call by name, "zscore 1, hget 2.5".
    pub(super) fn breakdown(&self) -> String {
        self.commands
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(name, n)| {
                let per = *n as f64 / self.calls.max(1) as f64;
                if per.fract() == 0.0 {
                    format!("{name} {per}")
                } else {
                    format!("{name} {per:.2}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Reads and resets the counters of one redis-server (never the shared
/// one: `CONFIG RESETSTAT` would clear everyone's counters).
pub(super) struct Meter {
    conn: redis::aio::MultiplexedConnection,
    callgrind: Option<Callgrind>,
}

/// A redis-server run under callgrind (`REDIS_COST_CALLGRIND`:
/// "<pid>:<directory of its dumps>"): its counts zeroed with the
/// counters, and dumped and read with them.
struct Callgrind {
    pid: String,
    dir: std::path::PathBuf,
}

impl Callgrind {
    fn from_env() -> Option<Self> {
        let spec = std::env::var("REDIS_COST_CALLGRIND").ok()?;
        let (pid, dir) = spec
            .split_once(':')
            .expect("REDIS_COST_CALLGRIND: <pid>:<dump directory>");
        Some(Self {
            pid: pid.to_owned(),
            dir: dir.into(),
        })
    }

    fn control(&self, flag: &str) {
        let out = std::process::Command::new("callgrind_control")
            .args([flag, &self.pid])
            .output()
            .expect("callgrind_control (valgrind)");
        assert!(out.status.success(), "callgrind_control {flag}: {out:?}");
    }

    fn dumps(&self) -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("cg."))
            })
            .collect()
    }

    /// Instructions since the last zero: a dump of its own, read and
    /// removed (kept with `REDIS_COST_KEEP_DUMPS`, one a measured phase in
    /// order, for callgrind_annotate).
    fn read(&self) -> u64 {
        let before = self.dumps();
        self.control("-d");
        for _ in 0..200 {
            let new: Vec<_> = self
                .dumps()
                .into_iter()
                .filter(|p| !before.contains(p))
                .collect();
            if let Some(path) = new.first() {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                let total = text.lines().find_map(|l| {
                    l.strip_prefix("summary:")
                        .or_else(|| l.strip_prefix("totals:"))
                        .and_then(|v| v.split_whitespace().next()?.parse().ok())
                });
                if let Some(total) = total {
                    // Kept, for callgrind_annotate, with REDIS_COST_KEEP_DUMPS.
                    if std::env::var_os("REDIS_COST_KEEP_DUMPS").is_none() {
                        let _ = std::fs::remove_file(path);
                    }
                    return total;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("no callgrind dump in {}", self.dir.display());
    }
}

impl Meter {
    pub(super) async fn connect(url: &str) -> Self {
        let client = redis::Client::open(url).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let server: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            !server.lines().any(|l| l.trim() == "tcp_port:6379"),
            "the counters are reset: never on the shared Redis (6379), on a redis-server of one's own"
        );
        Self {
            conn,
            callgrind: Callgrind::from_env(),
        }
    }

    pub(super) async fn reset(&mut self) {
        // Lua's garbage from earlier phases collected first: an incremental
        // collector would otherwise charge it to whichever phase runs next
        // (a pass after a long absence walk paid half again its own cost).
        let _: () = redis::cmd("EVAL")
            .arg("collectgarbage('collect') return 0")
            .arg(0)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut self.conn)
            .await
            .unwrap();
        if let Some(cg) = &self.callgrind {
            cg.control("-z");
        }
    }

    pub(super) async fn read(&mut self) -> Cost {
        let instructions = self.callgrind.as_ref().map_or(0, Callgrind::read);
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.conn)
            .await
            .unwrap();
        Cost {
            instructions,
            ..Cost::parse(&info)
        }
    }

    /// What the script calls of `work` cost.
    pub(super) async fn measure<T>(&mut self, work: impl Future<Output = T>) -> (Cost, T) {
        self.reset().await;
        let out = work.await;
        (self.read().await, out)
    }
}
