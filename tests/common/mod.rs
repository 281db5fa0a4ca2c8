//! Shared test helpers: the shared Redis, private `redis-server`s for tests
//! that kill or restart Redis, and whole app instances on port 0.
#![allow(dead_code)]

pub mod cluster;
pub mod proxy;
pub mod redis_proc;
pub mod sentinel;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use waitroom::store::SharedStore;
use waitroom::store::memory::MemoryStore;
use waitroom::store::redis::{RedisOptions, RedisStore, Topology};
use waitroom::{App, AppState, Config};

/// Whether `WAITROOM_TEST_NO_REDIS` asks for a run without Redis (`1`,
/// `true` or `yes`): the tests that need a Redis server (the shared one, a
/// private `redis-server`, the cluster, Sentinel) return at once, and the
/// first of them in each test binary writes one "partial" line to stderr.
/// Never the default; CI runs everything (CONTRIBUTING.md).
pub fn no_redis() -> bool {
    static SKIPPING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SKIPPING.get_or_init(|| {
        std::env::var("WAITROOM_TEST_NO_REDIS")
            .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
    })
}

/// With [`no_redis`], says once per test binary that the run is partial,
/// and whether the calling test (`what`) should return without running.
/// Written to the process's stderr directly: the test harness captures
/// `eprintln!` of passing tests, and this line must be seen.
pub fn skip_redis(what: &str) -> bool {
    static SAID: std::sync::Once = std::sync::Once::new();
    if !no_redis() {
        return false;
    }
    SAID.call_once(|| {
        use std::io::Write as _;
        let line = format!(
            "partial: Redis tests skipped (WAITROOM_TEST_NO_REDIS is set): {} and every other \
             test of this binary that needs Redis pass without running; only the memory half \
             ran. CI runs them all.\n",
            what
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    });
    true
}

/// The store kinds a test loops over: `kinds`, or only `"memory"` in a
/// run without Redis ([`no_redis`]).
pub fn backends(kinds: &[&'static str]) -> Vec<&'static str> {
    if kinds.iter().any(|k| *k != "memory") && skip_redis("a test looping over stores") {
        return kinds.iter().copied().filter(|k| *k == "memory").collect();
    }
    kinds.to_vec()
}

/// Returns from the calling test when the run is without Redis
/// ([`no_redis`]).
#[macro_export]
macro_rules! needs_redis {
    () => {
        if $crate::common::skip_redis(module_path!()) {
            return;
        }
    };
}

/// The shared Redis every test may use with its own key prefix.
pub fn redis_url() -> String {
    std::env::var("WAITROOM_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The shared PostgreSQL (trust auth on the loopback; `scripts/test`
/// makes sure it answers and exports this variable).
pub fn postgres_url() -> String {
    std::env::var("WAITROOM_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A PostgreSQL database of the test's own on the shared server, created
/// empty and dropped (`WITH (FORCE)`, whatever still holds it) on drop, so
/// no test sees another's products or orders.
pub struct PgDatabase {
    pub name: String,
    pub url: String,
}

#[cfg(feature = "demo-orders")]
impl PgDatabase {
    pub async fn create(tag: &str) -> Self {
        use sqlx::Connection;
        let name = format!("waitroom_{tag}_{:016x}", rand::random::<u64>());
        let mut admin = sqlx::PgConnection::connect(&postgres_url()).await.expect(
            "the shared PostgreSQL on 127.0.0.1:5432 must answer (scripts/test starts one)",
        );
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut admin)
            .await
            .expect("create the test's database");
        let _ = admin.close().await;
        let base = postgres_url();
        let server = base
            .rsplit_once('/')
            .map_or(base.as_str(), |(server, _)| server);
        let url = format!("{server}/{name}");
        Self { name, url }
    }
}

#[cfg(feature = "demo-orders")]
impl Drop for PgDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs inside the test's runtime: the drop gets a runtime of
        // its own on a thread of its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                use sqlx::Connection;
                let mut admin = sqlx::PgConnection::connect(&postgres_url()).await?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await?;
                admin.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test database {}: {dropped:?}", self.name);
        }
    }
}

/// A key prefix no other test uses.
pub fn unique_prefix(tag: &str) -> String {
    format!("t-{tag}-{:016x}", rand::random::<u64>())
}

/// A store of the kind `kind` ("memory", "redis" or "cluster": the shared
/// 3-master Redis Cluster), empty.
pub async fn store(kind: &str, tag: &str) -> SharedStore {
    match kind {
        "memory" => Arc::new(MemoryStore::new()),
        "cluster" => Arc::new(cluster_store(&unique_prefix(tag)).await),
        _ => Arc::new(
            RedisStore::connect(&redis_url(), &unique_prefix(tag))
                .await
                .expect(
                    "the shared Redis on 127.0.0.1:6379 must answer (the test command starts one)",
                ),
        ),
    }
}

/// A store on the shared cluster with keys under `prefix`.
pub async fn cluster_store(prefix: &str) -> RedisStore {
    // Starting the cluster blocks: not on the runtime's thread.
    let seeds = tokio::task::spawn_blocking(|| cluster::shared_cluster().seeds.clone())
        .await
        .unwrap();
    let options = RedisOptions {
        topology: Topology::from_flags(&seeds, true).unwrap(),
        wait_replicas: 0,
    };
    RedisStore::open(&options, prefix)
        .await
        .expect("the shared cluster answers")
}

/// A `redis-server` of the test's own on a free port, so it can be killed
/// and restarted without touching the shared one. Killed on drop.
pub struct RedisProcess {
    pub port: u16,
    dir: PathBuf,
    aof: bool,
    child: Option<Child>,
}

impl RedisProcess {
    /// Starts one; with `aof`, every write is appended and fsynced.
    pub fn start(aof: bool) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("waitroom-redis-{port}-{:x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut me = Self {
            port,
            dir,
            aof,
            child: None,
        };
        // `free_port` then bind can race with another test: try new ports.
        for _ in 0..5 {
            match me.spawn() {
                Ok(()) => return me,
                Err(why) => {
                    eprintln!("{why}; trying another port");
                    me.port = free_port();
                }
            }
        }
        panic!("could not start a redis-server of the test's own");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("")
            .arg("--dir")
            .arg(&self.dir)
            // A replica that needs a full sync (after a failover) gets it
            // at once, not after Redis' default 5 s wait for more replicas:
            // meanwhile `WAIT` finds no replica and every durable call
            // fails closed, which a failover test would wait out.
            .args(["--repl-diskless-sync-delay", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.aof {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        die_with_the_test(&mut cmd);
        let mut child = cmd.spawn().expect("redis-server must be installed");
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "redis-server on port {} exited at start ({status})",
                    self.port
                ));
            }
            // Only our own server counts (another test's server may have
            // taken the port between `free_port` and the bind), and only
            // once it has loaded its AOF (INFO answers while loading).
            if let Ok(client) = redis::Client::open(self.url())
                && let Ok(mut c) = client.get_connection()
                && let Ok(info) = redis::cmd("INFO").query::<String>(&mut c)
                && info
                    .lines()
                    .any(|l| l.trim() == format!("process_id:{pid}"))
                && info.lines().any(|l| l.trim() == "loading:0")
            {
                self.child = Some(child);
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(format!("redis-server on port {} did not answer", self.port))
    }

    /// SIGKILL: no clean shutdown, no final save.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the server stops answering but keeps every connection
    /// open, as behind a network partition.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`RedisProcess::freeze`].
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill")
            .arg(sig)
            .arg(pid)
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// Starts it again on the same port and directory (AOF is replayed).
    pub fn restart(&mut self) {
        self.kill();
        if let Err(why) = self.spawn() {
            panic!("restart on the same port failed: {why}");
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Makes a child process die when the test process does, even when the
/// test harness is killed hard (no `Drop` runs then): no redis-servers or
/// waitroom binaries are left behind.
pub fn die_with_the_test(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Removes every `WAITROOM_*` and `REDIS_URL` variable from a child's
/// environment, so a developer's shell cannot change what a test runs.
pub fn clean_env(cmd: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let text = name.to_string_lossy();
        if text.starts_with("WAITROOM_") || text == "REDIS_URL" {
            cmd.env_remove(&name);
        }
    }
}

/// A raw TCP connection to `addr` from the loopback address `source`
/// (127.0.0.x): a client address of its own, as the per-address limits
/// count them. It sends nothing until the test writes to it.
pub async fn socket_from(source: &str, addr: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(source.parse().unwrap(), 0))
        .unwrap();
    socket.connect(addr).await.unwrap()
}

/// What a connection received up to the server's close (within 10 s).
pub async fn read_to_close(socket: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut got)).await;
    assert!(
        read.is_ok(),
        "the server did not close: {:?}",
        String::from_utf8_lossy(&got)
    );
    String::from_utf8_lossy(&got).into_owned()
}

/// `GET path` with `headers` on a connection of its own from `source`,
/// closed after the answer: the status and the whole answer (head and
/// body). Nothing stays open behind it, unlike a pooled client.
pub async fn get_from(
    source: &str,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    use tokio::io::AsyncWriteExt;
    let mut socket = socket_from(source, addr).await;
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    // A refused connection may be answered and closed before the head is
    // even written: what it was answered is what counts.
    let _ = socket.write_all(head.as_bytes()).await;
    let answer = read_to_close(&mut socket).await;
    let status = answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no answer from {path}: {answer:?}"));
    (status, answer)
}

/// A buyer's entry token as the Redis store keeps it: their field of the
/// queue's token HASH (`<prefix>:{<queue>}:token:#tokens`, whose value is
/// "token exp enteredAt entry[ claim claimUntil]", `lua/common.lua`), by
/// those names; `None` when they hold none.
pub async fn stored_token(
    conn: &mut impl redis::aio::ConnectionLike,
    prefix: &str,
    queue: &str,
    user: &str,
) -> redis::RedisResult<Option<std::collections::HashMap<&'static str, String>>> {
    let value: Option<String> = redis::cmd("HGET")
        .arg(format!("{prefix}:{{{queue}}}:token:#tokens"))
        .arg(user)
        .query_async(conn)
        .await?;
    Ok(value.map(|v| {
        ["token", "exp", "enteredAt", "entry", "claim", "claimUntil"]
            .into_iter()
            .zip(v.split(' ').map(str::to_owned))
            .collect()
    }))
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Test configuration: the defaults with the demo order database in
/// memory and `header` identity (the tests speak for a gateway that sets
/// `X-User-Id`; tests/api/identity.rs covers the other modes). Set fields
/// on it directly:
/// `Config { admission_batch: 2, ..test_config() }`. The environment is not
/// read: a `WAITROOM_*` variable in the shell that runs the tests must not
/// change it.
pub fn test_config() -> Config {
    Config {
        orders_db: ":memory:".into(),
        identity: waitroom::config::IdentityMode::Header,
        joins_per_address_per_minute: 0,
        places_per_address: 0,
        visitors_per_address_per_minute: 0,
        streams_per_address: 0,
        connections_per_address: Some(0),
        ..Config::default()
    }
}

/// The per-address limits off: every test speaks from 127.0.0.1, so a
/// test of anything else must not run into them (`client_limits.rs` turns
/// them on with flags given after these).
pub const NO_ADDRESS_LIMITS: [&str; 10] = [
    "--joins-per-address-per-minute",
    "0",
    "--places-per-address",
    "0",
    "--visitors-per-address-per-minute",
    "0",
    "--streams-per-address",
    "0",
    "--connections-per-address",
    "0",
];

/// [`test_config`] with `args` as on the command line, for tests that also
/// start the binary with the same flags.
pub fn config(args: &[&str]) -> Config {
    let mut all = vec!["--orders-db", ":memory:", "--identity", "header"];
    all.extend_from_slice(&NO_ADDRESS_LIMITS);
    all.extend_from_slice(args);
    Config::from_args(all).expect("valid test arguments")
}

/// [`config`] with a configuration file of `toml` (written to a temporary
/// file, given with `--config`), loaded as the binary loads it, the
/// environment aside.
pub fn config_with_file(toml: &str, args: &[&str]) -> Config {
    let path =
        std::env::temp_dir().join(format!("waitroom-test-{:016x}.toml", rand::random::<u64>()));
    std::fs::write(&path, toml).unwrap();
    let shown = path.display().to_string();
    let mut all = vec!["--orders-db", ":memory:", "--identity", "header"];
    all.extend_from_slice(&NO_ADDRESS_LIMITS);
    all.extend_from_slice(args);
    all.extend_from_slice(&["--config", &shown]);
    let loaded = waitroom::config::load(all, false);
    let _ = std::fs::remove_file(&path);
    loaded.expect("a valid test configuration").config
}

/// One running instance on 127.0.0.1:0, its operator listener on another
/// port 0.
pub struct TestApp {
    pub addr: SocketAddr,
    /// The operator listener: `/metrics`, `/api/admin/*`, `/api/tokens/*`.
    pub admin_addr: SocketAddr,
    /// The gateway listener (`--gate-addr`): the gateway check alone.
    pub gate_addr: SocketAddr,
    pub state: AppState,
    /// The instance's validated configuration.
    pub config: Config,
    pub client: reqwest::Client,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// The order database of the test's own, when it is PostgreSQL:
    /// dropped after the instance stops.
    pg: Option<PgDatabase>,
}

impl TestApp {
    /// Starts an instance of `config` on `store` (shared between instances
    /// when cloned); `secret` stands in for the secret shared through Redis.
    pub async fn spawn_with(config: Config, store: SharedStore) -> Self {
        waitroom::telemetry::install_metrics();
        let shutdown = CancellationToken::new();
        let built = App::with_store(config, store, None, shutdown.clone())
            .await
            .expect("valid config and order database");
        let state = built.state().clone();
        let config = built.config().clone();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin_addr = admin.local_addr().unwrap();
        let gate = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gate_addr = gate.local_addr().unwrap();
        let tasks = TaskTracker::new();
        let serving = built;
        tasks.spawn(async move {
            let listeners = waitroom::Listeners {
                public: listener,
                admin,
                gate: Some(gate),
            };
            waitroom::serve(serving, listeners).await.expect("serve");
        });
        Self {
            addr,
            admin_addr,
            gate_addr,
            state,
            config,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            shutdown,
            tasks,
            pg: None,
        }
    }

    /// Starts an instance on the shared Redis with a fresh prefix and its
    /// demo orders in a fresh PostgreSQL database of the test's own, flags
    /// as on the command line.
    #[cfg(feature = "demo-orders")]
    pub async fn redis_postgres(tag: &str, args: &[&str]) -> Self {
        let db = PgDatabase::create(tag).await;
        let mut app = Self::redis_with(
            tag,
            Config {
                orders_db: db.url.clone(),
                ..config(args)
            },
        )
        .await;
        app.pg = Some(db);
        app
    }

    /// Starts an instance of `config` on a fresh in-memory store.
    pub async fn memory_with(config: Config) -> Self {
        Self::spawn_with(config, Arc::new(MemoryStore::new())).await
    }

    /// Starts an instance of `config` on the shared Redis with a fresh
    /// prefix (which replaces `config.key_prefix`).
    /// Returns once the instance listens to its queues' events: what is
    /// published before an instance subscribes never reaches it (Redis
    /// pub/sub keeps nothing), so a test that counts events from its very
    /// first join waits for that.
    pub async fn redis_with(tag: &str, config: Config) -> Self {
        let prefix = unique_prefix(tag);
        let store = Arc::new(RedisStore::connect(&redis_url(), &prefix).await.unwrap());
        let queues = config.queues.clone();
        let app = Self::spawn_with(
            Config {
                key_prefix: prefix.clone(),
                ..config
            },
            store,
        )
        .await;
        let client = redis::Client::open(redis_url()).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        for queue in queues {
            let channel = format!("{prefix}:{{{}}}:events", queue.trim());
            eventually(Duration::from_secs(10), "the instance subscribed", || {
                let (mut conn, channel) = (conn.clone(), channel.clone());
                async move {
                    let counts: Vec<(String, u64)> = redis::cmd("PUBSUB")
                        .arg("NUMSUB")
                        .arg(&channel)
                        .query_async(&mut conn)
                        .await
                        .ok()?;
                    counts.iter().any(|(_, n)| *n > 0).then_some(())
                }
            })
            .await;
        }
        app
    }

    /// Starts an instance on a fresh in-memory store, flags as on the
    /// command line.
    pub async fn memory(args: &[&str]) -> Self {
        Self::memory_with(config(args)).await
    }

    /// Starts an instance on the shared Redis with a fresh prefix, flags as
    /// on the command line.
    pub async fn redis(tag: &str, args: &[&str]) -> Self {
        Self::redis_with(tag, config(args)).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// `path` on the operator listener.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin_addr, path)
    }

    /// `POST /api/queues/{queue}/entries` as `user`: (status, body).
    pub async fn enter(&self, queue: &str, user: &str) -> (u16, serde_json::Value) {
        let r = self
            .client
            .post(self.url(&format!("/api/queues/{queue}/entries")))
            .header("x-user-id", user)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// `GET /api/queues/{queue}/position` with `ticket`: (status, body).
    pub async fn position(&self, queue: &str, ticket: &str) -> (u16, serde_json::Value) {
        let r = self
            .client
            .get(self.url(&format!("/api/queues/{queue}/position")))
            .header("x-queue-ticket", ticket)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// The status code of `GET path`.
    pub async fn get_status(&self, path: &str) -> u16 {
        self.client
            .get(self.url(path))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    /// `DELETE /api/queues/{queue}/entries/me` with `ticket`: the status code.
    pub async fn leave(&self, queue: &str, ticket: &str) -> u16 {
        self.client
            .delete(self.url(&format!("/api/queues/{queue}/entries/me")))
            .header("x-queue-ticket", ticket)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    /// Stops the instance and waits for everything it spawned.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.tasks.close();
        tokio::time::timeout(Duration::from_secs(15), self.tasks.wait())
            .await
            .expect("instance stops within 15 s");
        drop(self.state);
        drop(self.pg);
    }
}

/// Arguments that keep admission idle for a whole test (one slot, taken
/// by the first joiner's fast track; the next pass is ten minutes away).
pub const IDLE: &[&str] = &[
    "--admission-interval-ms",
    "600000",
    "--admission-batch",
    "1",
];

/// Joins `user` to `default` on `app` and polls until they are READY;
/// their entry token.
pub async fn ready(app: &TestApp, user: &str) -> String {
    let (_, body) = app.enter("default", user).await;
    let ticket = body["ticket"].as_str().unwrap().to_owned();
    eventually(Duration::from_secs(10), "READY", || {
        let ticket = ticket.clone();
        async move {
            let (_, p) = app.position("default", &ticket).await;
            p["entryToken"].as_str().map(str::to_owned)
        }
    })
    .await
}

/// An SSE event id, `<pass>` or `<pass>.<n>`, as the pair it stands for:
/// ids are ordered as pairs, never as decimals ("7.10" follows "7.9").
pub fn event_id(id: &str) -> (u64, u64) {
    let (pass, n) = id.split_once('.').unwrap_or((id, "0"));
    (
        pass.parse().unwrap_or_else(|_| panic!("event id {id:?}")),
        n.parse().unwrap_or_else(|_| panic!("event id {id:?}")),
    )
}

/// Polls `f` every 50 ms until it returns `Some`, or panics after `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_every(Duration::from_millis(50), limit, what, f).await
}

/// [`eventually`], polling every `every`: for a state that lasts only
/// a moment.
pub async fn eventually_every<T, F, Fut>(
    every: Duration,
    limit: Duration,
    what: &str,
    mut f: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

/// One SSE event as a client saw it.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub event: String,
    pub id: String,
    pub data: serde_json::Value,
    pub retry: Option<Duration>,
}

/// An open event stream.
pub struct SseStream {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    inner: Option<futures::stream::BoxStream<'static, SseEvent>>,
}

impl SseStream {
    /// Opens `/api/queues/{queue}/events` with `ticket` (and `last_id`).
    pub async fn open(app: &TestApp, queue: &str, ticket: &str, last_id: Option<&str>) -> Self {
        use eventsource_stream::Eventsource;
        use futures::StreamExt;
        let client = reqwest::Client::new(); // no overall timeout: streams are long
        let mut req = client
            .get(app.url(&format!("/api/queues/{queue}/events")))
            .header("x-queue-ticket", ticket)
            .header("accept", "text/event-stream");
        if let Some(id) = last_id {
            req = req.header("last-event-id", id);
        }
        let r = req.send().await.expect("events request");
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let inner = (status == 200).then(|| {
            r.bytes_stream()
                .eventsource()
                .filter_map(|e| async move {
                    let e = e.ok()?;
                    if e.event.is_empty() && e.data.is_empty() {
                        return None;
                    }
                    Some(SseEvent {
                        data: serde_json::from_str(&e.data).unwrap_or(serde_json::Value::Null),
                        event: e.event,
                        id: e.id,
                        retry: e.retry,
                    })
                })
                .boxed()
        });
        Self {
            status,
            headers,
            inner,
        }
    }

    /// The next event within `limit`; `None` when the stream ended.
    pub async fn next(&mut self, limit: Duration) -> Option<SseEvent> {
        use futures::StreamExt;
        let inner = self.inner.as_mut()?;
        tokio::time::timeout(limit, inner.next())
            .await
            .unwrap_or_else(|_| panic!("no SSE event within {limit:?}"))
    }

    /// Events until one named `name` (inclusive) arrives within `limit`.
    pub async fn until(&mut self, name: &str, limit: Duration) -> Vec<SseEvent> {
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some(e) => {
                    let done = e.event == name;
                    seen.push(e);
                    if done {
                        return seen;
                    }
                }
                None => panic!("stream ended before `{name}`: {seen:?}"),
            }
        }
    }
}

/// The release-shaped `waitroom` binary as a separate process, for tests
/// that measure the server alone (its memory) or signal it.
///
/// It binds port 0 itself and the test reads the address from its log, so
/// no other process can take the port between choosing and binding it.
pub struct BinApp {
    pub port: u16,
    /// The operator listener's port (`--admin-addr 127.0.0.1:0`, read from
    /// the log like the public one).
    pub admin_port: u16,
    child: Child,
    /// The last lines the server logged (stderr), for failure messages.
    pub log: Arc<std::sync::Mutex<Vec<String>>>,
}

impl BinApp {
    pub async fn spawn(args: &[&str]) -> Self {
        let db =
            std::env::temp_dir().join(format!("waitroom-bin-{:016x}.db", rand::random::<u64>()));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_waitroom"));
        cmd.arg("--addr")
            .arg("127.0.0.1:0")
            .args(["--admin-addr", "127.0.0.1:0"])
            .arg("--orders-db")
            .arg(&db)
            // The tests speak for a gateway; `args` may say otherwise.
            .args(["--identity", "header"])
            .args(NO_ADDRESS_LIMITS)
            .args(args)
            .env("RUST_LOG", "warn,waitroom=info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        clean_env(&mut cmd);
        die_with_the_test(&mut cmd);
        let mut child = cmd.spawn().expect("spawn waitroom");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (found, address) = std::sync::mpsc::channel();
        let keep = log.clone();
        // Drains the log for the process's whole life, so it never blocks.
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let port = || {
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix("addr="))
                        .and_then(|a| a.rsplit_once(':'))
                        .and_then(|(_, p)| p.parse::<u16>().ok())
                };
                if line.contains("waitroom listening")
                    && let Some(port) = port()
                {
                    let _ = found.send((false, port));
                }
                if line.contains("operator listener")
                    && let Some(port) = port()
                {
                    let _ = found.send((true, port));
                }
                let mut kept = keep.lock().unwrap();
                kept.push(line);
                if kept.len() > 200 {
                    kept.remove(0);
                }
            }
        });
        let ports = tokio::task::spawn_blocking(move || {
            let mut ports = (None, None);
            while let (None, _) | (_, None) = ports {
                match address.recv_timeout(Duration::from_secs(20))? {
                    (false, p) => ports.0 = Some(p),
                    (true, p) => ports.1 = Some(p),
                }
            }
            Ok::<_, std::sync::mpsc::RecvTimeoutError>((ports.0.unwrap(), ports.1.unwrap()))
        })
        .await
        .unwrap();
        let (port, admin_port) = ports.unwrap_or_else(|_| {
            panic!(
                "the binary did not log its addresses: {:?}",
                log.lock().unwrap()
            )
        });
        let me = Self {
            port,
            admin_port,
            child,
            log,
        };
        let client = reqwest::Client::new();
        eventually(
            Duration::from_secs(20),
            "the binary answers /healthz",
            || async {
                client
                    .get(me.url("/healthz"))
                    .send()
                    .await
                    .ok()
                    .filter(|r| r.status() == 200)
                    .map(|_| ())
            },
        )
        .await;
        me
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// `path` on the operator listener.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.admin_port, path)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Joins `user` to `default`; their ticket.
    pub async fn enter(&self, client: &reqwest::Client, user: &str) -> String {
        let r = client
            .post(self.url("/api/queues/default/entries"))
            .header("x-user-id", user)
            .send()
            .await
            .unwrap();
        let body: serde_json::Value = r.json().await.unwrap();
        body["ticket"].as_str().unwrap().to_owned()
    }

    /// One unlabelled metric's value from `/metrics` (0 if absent).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = reqwest::get(self.admin_url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// Resident memory of the server process.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap()
    }
}

impl Drop for BinApp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Signalling a spawned binary and watching it exit (shutdown tests).
impl BinApp {
    /// Sends SIGTERM, as a deploy does.
    pub fn terminate(&self) {
        let pid = libc::pid_t::try_from(self.pid()).expect("pid fits");
        // SAFETY: kill(2) on our own child's pid, which `Drop` has not reaped.
        #[allow(unsafe_code)]
        let sent = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(sent, 0, "SIGTERM could not be sent");
    }

    /// The exit status once the process exits, or `None` if it still runs
    /// at `deadline`.
    pub async fn exited_by(&mut self, deadline: Instant) -> Option<std::process::ExitStatus> {
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
