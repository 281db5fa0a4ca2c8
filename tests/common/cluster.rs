//! Redis Clusters of the tests' own: `redis-server --cluster-enabled yes` on
//! free ports in a temp dir, joined by `redis-cli --cluster create`, killed
//! with the test (drop, and `PR_SET_PDEATHSIG` when the test process dies).
//!
//! One 3-master cluster is shared by every test of a test binary (started
//! once, on first use); failover tests start their own, with replicas.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::free_port;
use super::redis_proc::{query, spawn_on, stop, wait_until};

/// How long starting a cluster may take before the test fails.
const START_WITHIN: Duration = Duration::from_secs(30);

/// One node process.
struct Node {
    port: u16,
    child: Option<Child>,
}

/// A running cluster; every node killed on drop.
pub struct ClusterProcess {
    nodes: Vec<Node>,
    dir: PathBuf,
    node_timeout_ms: u64,
}

impl ClusterProcess {
    /// No node yet; their files go in a temp dir of its own.
    fn empty(node_timeout_ms: u64) -> Self {
        let dir =
            std::env::temp_dir().join(format!("waitroom-cluster-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            nodes: Vec::new(),
            dir,
            node_timeout_ms,
        }
    }

    /// Starts `masters` masters with `replicas` replicas each.
    /// `node_timeout_ms` is `cluster-node-timeout`: how long a silent master
    /// takes to be failed over (small in failover tests).
    pub fn start(masters: usize, replicas: usize, node_timeout_ms: u64) -> Self {
        let mut me = Self::empty(node_timeout_ms);
        let deadline = Instant::now() + START_WITHIN;
        for _ in 0..masters * (1 + replicas) {
            me.add_node(deadline);
        }
        let addrs: Vec<String> = me
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli must be installed");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        me.wait_until_settled(masters, replicas, deadline);
        me
    }

    /// One master that holds every slot, no replica (`redis-cli --cluster
    /// create` wants three masters: the slots are assigned by hand).
    pub fn start_single() -> Self {
        let mut me = Self::empty(2000);
        let deadline = Instant::now() + START_WITHIN;
        let port = me.add_node(deadline);
        let added: Option<String> = query(
            port,
            redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(0).arg(16383),
        );
        assert_eq!(added.as_deref(), Some("OK"), "CLUSTER ADDSLOTSRANGE");
        me.wait_until_settled(1, 0, deadline);
        me
    }

    /// Starts one more node on a free port (its bus port free too); its
    /// port.
    fn add_node(&mut self, deadline: Instant) -> u16 {
        loop {
            assert!(Instant::now() < deadline, "cluster nodes did not start");
            let port = free_port();
            // The cluster bus listens on port + 10000: it must be free too.
            if port > 55_000 || std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_err() {
                continue;
            }
            if let Some(child) = self.spawn_node(port) {
                self.nodes.push(Node {
                    port,
                    child: Some(child),
                });
                return port;
            }
        }
    }

    /// Makes the node on `port` name itself `announced` in `CLUSTER SLOTS`
    /// and redirections (`cluster-announce-port`), so clients that found it
    /// through a seed connect to `announced` (a proxy in front of it), and
    /// waits until it does.
    pub fn announce_port(&self, port: u16, announced: u16) {
        let set: Option<String> = query(
            port,
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("cluster-announce-port")
                .arg(announced),
        );
        assert_eq!(
            set.as_deref(),
            Some("OK"),
            "CONFIG SET cluster-announce-port"
        );
        let deadline = Instant::now() + START_WITHIN;
        wait_until(
            deadline,
            START_WITHIN,
            "the node announced its new port",
            || {
                query::<Vec<(i64, i64, Vec<redis::Value>)>>(port, redis::cmd("CLUSTER").arg("SLOTS"))
                .is_some_and(|slots| {
                    !slots.is_empty()
                        && slots.iter().all(|(.., master)| {
                            matches!(master.get(1), Some(redis::Value::Int(p)) if *p == i64::from(announced))
                        })
                })
            },
        );
    }

    /// Ports of the nodes that run.
    pub fn ports(&self) -> Vec<u16> {
        self.live_ports()
    }

    /// Starts a node on `port` with its config file in the cluster's
    /// directory (so a restarted node comes back as the node it was); None
    /// if the port was taken meanwhile.
    fn spawn_node(&self, port: u16) -> Option<Child> {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
            .args(["--cluster-node-timeout", &self.node_timeout_ms.to_string()])
            // Queues on healthy masters keep working while one master's
            // slots are being failed over.
            .args(["--cluster-require-full-coverage", "no"])
            .args(["--save", "", "--appendonly", "no"])
            // A replica that never finished its first sync is never
            // promoted: start that sync at once, not after the default 5 s.
            .args(["--repl-diskless-sync-delay", "0"])
            .args(["--dbfilename", &format!("dump-{port}.rdb")])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        spawn_on(cmd, port)
    }

    /// Waits until every live node says `cluster_state:ok`, knows every
    /// node, every master has its replicas, and every replica is in sync
    /// (only a synced replica can be promoted).
    fn wait_until_settled(&self, masters: usize, replicas: usize, deadline: Instant) {
        wait_until(deadline, START_WITHIN, "the cluster settled", || {
            self.live_ports().iter().all(|&p| {
                cluster_info(p).is_some_and(|i| {
                    i.contains("cluster_state:ok")
                        && i.contains(&format!("cluster_known_nodes:{}", self.nodes.len()))
                        && i.contains("cluster_slots_assigned:16384")
                })
            }) && self.masters().len() == masters
                && self
                    .masters()
                    .iter()
                    .all(|&m| replicas == 0 || self.replicas_of(m).len() == replicas)
                && self
                    .masters()
                    .iter()
                    .flat_map(|&m| self.replicas_of(m))
                    .all(|r| {
                        query::<String>(r, redis::cmd("INFO").arg("replication"))
                            .is_some_and(|i| i.contains("master_link_status:up"))
                    })
        });
    }

    /// The seed list for `--redis-url` with `--redis-cluster`.
    pub fn seeds(&self) -> String {
        self.seed_list().join(",")
    }

    pub fn seed_list(&self) -> Vec<String> {
        self.live_ports()
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// `CLUSTER NODES` as a live node sees it: (port, flags, master id, id).
    fn nodes_view(&self) -> Vec<(u16, String, String, String)> {
        for port in self.live_ports() {
            if let Some(text) = query::<String>(port, redis::cmd("CLUSTER").arg("NODES")) {
                return text
                    .lines()
                    .filter_map(|l| {
                        let f: Vec<&str> = l.split_whitespace().collect();
                        let port = f.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?;
                        Some((port, f[2].to_owned(), f[3].to_owned(), f[0].to_owned()))
                    })
                    .collect();
            }
        }
        Vec::new()
    }

    /// Ports of the masters that are not failed.
    pub fn masters(&self) -> Vec<u16> {
        self.nodes_view()
            .into_iter()
            .filter(|(_, flags, _, _)| flags.contains("master") && !flags.contains("fail"))
            .map(|(p, ..)| p)
            .collect()
    }

    /// Ports of `master`'s replicas.
    pub fn replicas_of(&self, master: u16) -> Vec<u16> {
        let view = self.nodes_view();
        let Some((.., id)) = view.iter().find(|(p, ..)| *p == master) else {
            return Vec::new();
        };
        view.iter()
            .filter(|(_, flags, of, _)| flags.contains("slave") && of == id)
            .map(|(p, ..)| *p)
            .collect()
    }

    /// The port of the master serving `key`'s slot now.
    pub fn master_of(&self, key: &str) -> u16 {
        let port = self.live_ports()[0];
        let slot: i64 = query(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).unwrap();
        let slots: Vec<(i64, i64, Vec<redis::Value>)> =
            query(port, redis::cmd("CLUSTER").arg("SLOTS")).unwrap();
        for (from, to, master) in slots {
            if (from..=to).contains(&slot)
                && let Some(redis::Value::Int(p)) = master.get(1)
            {
                return *p as u16;
            }
        }
        panic!("no master serves slot {slot}")
    }

    /// Queue names whose `{name}` hash tags land on `n` different masters
    /// (checked with `CLUSTER KEYSLOT`, not assumed: short tags can bunch).
    pub fn queues_on_distinct_masters(&self, n: usize) -> Vec<String> {
        let mut by_master: HashMap<u16, String> = HashMap::new();
        for i in 0..1000 {
            let name = format!("q{i}");
            by_master
                .entry(self.master_of(&format!("{{{name}}}")))
                .or_insert(name);
            if by_master.len() == n {
                break;
            }
        }
        assert_eq!(by_master.len(), n, "not enough masters for {n} queues");
        let mut names: Vec<String> = by_master.into_values().collect();
        names.sort();
        names
    }

    /// SIGKILL the node on `port`: no shutdown, no final write.
    pub fn kill(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this cluster");
        if let Some(mut child) = node.child.take() {
            stop(&mut child);
        }
    }
}

impl ClusterProcess {
    /// Starts a killed node again on its port, as an orchestrator would: it
    /// rejoins the cluster, as a replica if its slots were failed over.
    pub fn restart(&mut self, port: u16) {
        let child = self.spawn_node(port).expect("restart on the same port");
        let node = self.nodes.iter_mut().find(|n| n.port == port).unwrap();
        node.child = Some(child);
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

    /// SIGSTOP the node on `port`: it holds its connections but reads
    /// nothing, replication included.
    pub fn freeze(&self, port: u16) {
        self.signal(port, libc::SIGSTOP);
    }

    /// SIGCONT after [`ClusterProcess::freeze`].
    pub fn thaw(&self, port: u16) {
        self.signal(port, libc::SIGCONT);
    }

    fn signal(&self, port: u16, sig: i32) {
        let node = self.nodes.iter().find(|n| n.port == port).unwrap();
        let pid = node.child.as_ref().expect("running").id() as i32;
        // SAFETY: kill(2) on a child process of ours.
        #[allow(unsafe_code)]
        let sent = unsafe { libc::kill(pid, sig) };
        assert_eq!(sent, 0);
    }

    /// Whether `port` is a replica now (a restarted old master rejoins as
    /// one).
    pub fn is_replica(&self, port: u16) -> bool {
        self.nodes_view()
            .iter()
            .any(|(p, flags, ..)| *p == port && flags.contains("slave"))
    }
}

impl Drop for ClusterProcess {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                stop(&mut child);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn cluster_info(port: u16) -> Option<String> {
    query(port, redis::cmd("CLUSTER").arg("INFO"))
}

/// The 3-master cluster shared by the tests of this binary.
pub struct SharedCluster {
    /// `--redis-url` with `--redis-cluster`.
    pub seeds: String,
    /// Three queue names, one on each master.
    pub queues: Vec<String>,
}

/// The shared cluster, started on first use. It is started on a thread of
/// its own that lives as long as the test process: `PR_SET_PDEATHSIG`
/// fires when the *thread* that spawned a child ends, and test threads end
/// with their test.
pub fn shared_cluster() -> &'static SharedCluster {
    static SHARED: OnceLock<SharedCluster> = OnceLock::new();
    SHARED.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let cluster = ClusterProcess::start(3, 0, 2000);
            tx.send(SharedCluster {
                seeds: cluster.seeds(),
                queues: cluster.queues_on_distinct_masters(3),
            })
            .unwrap();
            // Hold it (and this thread) until the test process exits.
            loop {
                std::thread::park();
            }
        });
        rx.recv_timeout(START_WITHIN + Duration::from_secs(5))
            .expect("the shared cluster started")
    })
}
