//! Redis Sentinel groups of the tests' own: one master, its replicas and
//! three `redis-server --sentinel` processes on free ports, killed with the
//! test (drop, and `PR_SET_PDEATHSIG` when the test process dies).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_proc::{query, spawn_on, stop, wait_until};
use super::{RedisProcess, free_port};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "waitroom";

/// How long starting a group may take before the test fails.
const START_WITHIN: Duration = Duration::from_secs(40);

/// A master, its replicas and three sentinels.
pub struct SentinelGroup {
    /// The nodes; which one is master changes with a failover.
    pub nodes: Vec<RedisProcess>,
    sentinels: Vec<(u16, Child)>,
    dir: PathBuf,
}

impl SentinelGroup {
    /// Starts a master with `replicas` replicas (in sync before this
    /// returns) and three sentinels (quorum 2) that count a silent master as
    /// down after `down_after_ms`.
    pub fn start(replicas: usize, down_after_ms: u64) -> Self {
        let deadline = Instant::now() + START_WITHIN;
        let nodes: Vec<RedisProcess> = (0..=replicas).map(|_| RedisProcess::start(false)).collect();
        let master = nodes[0].port;
        for replica in &nodes[1..] {
            let _: () = query(
                replica.port,
                redis::cmd("REPLICAOF").arg("127.0.0.1").arg(master),
            )
            .expect("REPLICAOF");
        }
        let dir =
            std::env::temp_dir().join(format!("waitroom-sentinel-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut me = Self {
            nodes,
            sentinels: Vec::new(),
            dir,
        };
        wait_until(deadline, START_WITHIN, "replicas in sync", || {
            me.nodes[1..].iter().all(|r| {
                query::<String>(r.port, redis::cmd("INFO").arg("replication"))
                    .is_some_and(|i| i.contains("master_link_status:up"))
            })
        });
        while me.sentinels.len() < 3 {
            assert!(Instant::now() < deadline, "sentinels did not start");
            let port = free_port();
            if let Some(child) = me.spawn_sentinel(port, master, down_after_ms) {
                me.sentinels.push((port, child));
            }
        }
        // A failover needs a quorum that knows each other and every
        // replica: sentinels find both through the master, within seconds.
        wait_until(
            deadline,
            START_WITHIN,
            "sentinels that know each other",
            || {
                me.sentinels.iter().all(|(port, _)| {
                    query::<String>(*port, redis::cmd("INFO").arg("sentinel")).is_some_and(|i| {
                        i.contains(&format!(
                            "status=ok,address=127.0.0.1:{master},slaves={replicas},sentinels=3"
                        ))
                    })
                })
            },
        );
        me
    }

    fn spawn_sentinel(&self, port: u16, master: u16, down_after_ms: u64) -> Option<Child> {
        let conf = self.dir.join(format!("sentinel-{port}.conf"));
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}\n\
                 sentinel failover-timeout {MASTER_NAME} 10000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = self.dir.display()
            ),
        )
        .unwrap();
        let mut cmd = Command::new("redis-server");
        cmd.arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        spawn_on(cmd, port)
    }

    /// `--redis-url` for the group.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(port, _)| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The port of the node the sentinels name master now (the first that
    /// answers).
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|(port, _)| {
            let addr: Option<(String, String)> = query(
                *port,
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(MASTER_NAME),
            );
            addr.and_then(|(_, p)| p.parse().ok())
        })
    }

    /// The node on `port`.
    pub fn node(&mut self, port: u16) -> &mut RedisProcess {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this group")
    }

    /// Makes every sentinel monitor the node on `port` as the master from
    /// now on (`SENTINEL REMOVE`, then `MONITOR`), touching no node: the
    /// node that was master keeps saying `master`, as an old master back
    /// from a crash does until a sentinel demotes it.
    pub fn monitor_instead(&self, port: u16, down_after_ms: u64) {
        for (sentinel, _) in &self.sentinels {
            let _: Option<()> = query(
                *sentinel,
                redis::cmd("SENTINEL").arg("REMOVE").arg(MASTER_NAME),
            );
            let monitored: Option<()> = query(
                *sentinel,
                redis::cmd("SENTINEL")
                    .arg("MONITOR")
                    .arg(MASTER_NAME)
                    .arg("127.0.0.1")
                    .arg(port)
                    .arg(2),
            );
            assert!(monitored.is_some(), "sentinel {sentinel} monitors {port}");
            let _: Option<()> = query(
                *sentinel,
                redis::cmd("SENTINEL")
                    .arg("SET")
                    .arg(MASTER_NAME)
                    .arg("down-after-milliseconds")
                    .arg(down_after_ms),
            );
        }
    }

    /// Cuts `master`'s links to its replicas (`CLIENT KILL TYPE replica`):
    /// what it writes until they reconnect reaches no replica.
    pub fn cut_replication(&self, master: u16) {
        let killed: Option<i64> = query(
            master,
            redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"),
        );
        assert!(killed.is_some_and(|n| n > 0), "no replica link to cut");
    }
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        for (_, child) in &mut self.sentinels {
            stop(child);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
