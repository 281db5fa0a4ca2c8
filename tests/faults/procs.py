"""The processes a campaign runs: private redis-servers (one master with
replicas and three Sentinels, or a Redis Cluster), waitroom instances, and
the per-instance fault proxies between them.

Everything listens on free loopback ports chosen here (never 6379) and dies
with the harness: each child gets PR_SET_PDEATHSIG, so a harness killed by
`timeout` leaves no redis-server or waitroom behind.
"""

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

from proxy import FaultProxy

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL("libc.so.6", use_errno=True)
FAKETIME_LIBS = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
]


def _die_with_parent():
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port(highest=65535):
    """A free loopback port of five digits, which the proxies' port
    rewriting relies on (equal lengths keep RESP lengths intact). A Cluster
    node's bus is its port + 10000, so nodes ask for one ≤ 55535."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if 10000 <= port <= highest and port != 6379:
            return port


def wait_for(what, done, within=30.0, every=0.1):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if done():
                return
        except Exception:
            pass
        time.sleep(every)
    raise RuntimeError(f"{what}: not within {within} s")


def redis_cmd(port, *args, timeout=1.0):
    """One command on a fresh connection (RESP by hand: the standard
    library has no Redis client). Returns the decoded reply or raises."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        out = f"*{len(args)}\r\n".encode()
        for a in args:
            b = str(a).encode()
            out += f"${len(b)}\r\n".encode() + b + b"\r\n"
        s.sendall(out)
        f = s.makefile("rb")
        return _read_reply(f)


def _read_reply(f):
    line = f.readline()
    if not line:
        raise ConnectionError("closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)[:-2]
        return data.decode(errors="replace")
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_reply(f) for _ in range(n)]
    raise RuntimeError(f"unexpected reply {line!r}")


class Proc:
    """A child process that can be killed, stopped, continued and started
    again with the same command line."""

    def __init__(self, name, argv, log_path, env=None):
        self.name, self.argv, self.log_path, self.env = name, argv, log_path, env
        self.popen = None
        self.stopped = False

    def start(self):
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(
            self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
            preexec_fn=_die_with_parent)
        log.close()
        self.stopped = False

    @property
    def pid(self):
        return self.popen.pid if self.popen else None

    def alive(self):
        return self.popen is not None and self.popen.poll() is None

    def kill(self):
        if self.alive():
            if self.stopped:
                os.kill(self.popen.pid, signal.SIGCONT)
            self.popen.kill()
            self.popen.wait()
        self.stopped = False

    def stop(self):
        if self.alive():
            os.kill(self.popen.pid, signal.SIGSTOP)
            self.stopped = True

    def cont(self):
        if self.alive():
            os.kill(self.popen.pid, signal.SIGCONT)
        self.stopped = False


class RedisNode(Proc):
    def __init__(self, workdir, port, extra=()):
        self.port = port
        d = os.path.join(workdir, f"redis-{port}")
        os.makedirs(d, exist_ok=True)
        # AOF on: a master killed and restarted comes back with its data, as
        # a production master with persistence does; no RDB snapshots.
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                "--dir", d, "--save", "", "--appendonly", "yes",
                "--repl-diskless-sync-delay", "0", *extra]
        super().__init__(f"redis:{port}", argv, os.path.join(d, "log"))

    def start(self):
        super().start()
        wait_for(f"redis on {self.port}", lambda: redis_cmd(self.port, "PING") == "PONG", 15)

    def info(self, section):
        return redis_cmd(self.port, "INFO", section)

    def role(self):
        try:
            return "master" if "role:master" in self.info("replication") else "replica"
        except Exception:
            return None


def describe_node(n):
    """A node's replication state in brief (role, its master and link, its
    replicas and their states), or why it could not be read."""
    if not n.alive():
        return "down"
    if n.stopped:
        return "stopped"
    try:
        info = n.info("replication")
    except Exception as e:
        return repr(e)
    keep = ("role", "master_port", "master_link_status", "master_sync_in_progress",
            "connected_slaves")
    d = {}
    for line in info.splitlines():
        k, _, v = line.strip().partition(":")
        if k in keep:
            d[k] = v
        elif k.startswith("slave") and k[5:].isdigit():
            d[k] = v
    return d


class SentinelTopology:
    """One master, `replicas` replicas, three Sentinels (quorum 2)."""

    kind = "sentinel"
    MASTER = "waitroom"

    def __init__(self, workdir, replicas=2, down_after_ms=1500):
        self.workdir = workdir
        self.nodes = [RedisNode(workdir, free_port()) for _ in range(replicas + 1)]
        for n in self.nodes:
            n.start()
        master = self.nodes[0].port
        for r in self.nodes[1:]:
            redis_cmd(r.port, "REPLICAOF", "127.0.0.1", master)
        wait_for("replicas in sync", lambda: all(
            "master_link_status:up" in r.info("replication") for r in self.nodes[1:]), 30)
        self.sentinels = []
        for _ in range(3):
            port = free_port()
            conf = os.path.join(workdir, f"sentinel-{port}.conf")
            with open(conf, "w") as f:
                f.write(f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
                        f"sentinel monitor {self.MASTER} 127.0.0.1 {master} 2\n"
                        f"sentinel down-after-milliseconds {self.MASTER} {down_after_ms}\n"
                        f"sentinel failover-timeout {self.MASTER} 10000\n"
                        f"sentinel parallel-syncs {self.MASTER} 1\n")
            s = Proc(f"sentinel:{port}", ["redis-server", conf, "--sentinel"],
                     os.path.join(workdir, f"sentinel-{port}.log"))
            s.port = port
            s.start()
            self.sentinels.append(s)
        wait_for("sentinels that know each other", lambda: all(
            f"slaves={replicas},sentinels=3" in redis_cmd(s.port, "INFO", "sentinel")
            for s in self.sentinels), 40)

    def master_port(self):
        for s in self.sentinels:
            if not s.alive() or s.stopped:
                continue
            try:
                return int(redis_cmd(s.port, "SENTINEL", "get-master-addr-by-name", self.MASTER)[1])
            except Exception:
                continue
        return None

    def node(self, port):
        return next(n for n in self.nodes if n.port == port)

    def redis_ports(self):
        return [n.port for n in self.nodes]

    def entry_ports(self):
        """What a client connects to first: the Sentinels."""
        return [s.port for s in self.sentinels]

    def url(self, port_map=None):
        m = port_map or {}
        hosts = ",".join(f"127.0.0.1:{m.get(s.port, s.port)}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.MASTER}"

    def flags(self):
        return []

    def healthy(self):
        m = self.master_port()
        if m is None or not self.node(m).alive():
            return False
        info = self.node(m).info("replication")
        return "role:master" in info and info.count("state=online") == len(self.nodes) - 1 \
            and all(s.alive() and not s.stopped for s in self.sentinels)

    def all_procs(self):
        return self.nodes + self.sentinels

    def describe(self):
        """What each sentinel names master and what each node says it is:
        recorded when a heal waits too long, to show why the group is not
        whole."""
        out = {"sentinels": {}, "nodes": {}}
        for s in self.sentinels:
            if not s.alive() or s.stopped:
                out["sentinels"][s.port] = "down" if not s.alive() else "stopped"
                continue
            try:
                addr = redis_cmd(s.port, "SENTINEL", "get-master-addr-by-name", self.MASTER)
                state = redis_cmd(s.port, "SENTINEL", "master", self.MASTER)
                fields = dict(zip(state[::2], state[1::2])) if isinstance(state, list) else {}
                out["sentinels"][s.port] = {
                    "master": addr and int(addr[1]), "flags": fields.get("flags"),
                    "failover_state": fields.get("failover-state"),
                    "replicas": fields.get("num-slaves"),
                    "epoch": fields.get("config-epoch")}
            except Exception as e:
                out["sentinels"][s.port] = repr(e)
        for n in self.nodes:
            out["nodes"][n.port] = describe_node(n)
        return out


class ClusterTopology:
    """Three masters, one replica each (`redis-cli --cluster create`)."""

    kind = "cluster"

    def __init__(self, workdir, masters=3, replicas=1, node_timeout_ms=2000):
        self.workdir = workdir
        extra = ["--cluster-enabled", "yes", "--cluster-node-timeout", str(node_timeout_ms),
                 "--cluster-require-full-coverage", "no"]
        self.nodes = []
        for _ in range(masters * (replicas + 1)):
            port = free_port(55535)
            self.nodes.append(RedisNode(workdir, port, extra + [
                "--cluster-config-file", f"nodes-{port}.conf"]))
        for n in self.nodes:
            n.start()
        subprocess.run(["redis-cli", "--cluster", "create",
                        *[f"127.0.0.1:{n.port}" for n in self.nodes],
                        "--cluster-replicas", str(replicas), "--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=60)
        self.n_masters = masters
        wait_for("the cluster settled", self.healthy, 60, 0.3)

    def redis_ports(self):
        return [n.port for n in self.nodes]

    def entry_ports(self):
        return self.redis_ports()

    def node(self, port):
        return next(n for n in self.nodes if n.port == port)

    def url(self, port_map=None):
        m = port_map or {}
        return ",".join(f"redis://127.0.0.1:{m.get(p, p)}" for p in self.redis_ports())

    def flags(self):
        return ["--redis-cluster"]

    def masters(self):
        return [n.port for n in self.nodes if n.alive() and not n.stopped and n.role() == "master"]

    def master_port(self):
        ms = self.masters()
        return ms[0] if ms else None

    def healthy(self):
        live = [n for n in self.nodes if n.alive() and not n.stopped]
        if len(live) != len(self.nodes):
            return False
        for n in live:
            info = redis_cmd(n.port, "CLUSTER", "INFO")
            if "cluster_state:ok" not in info:
                return False
        if len(self.masters()) != self.n_masters:
            return False
        return all("master_link_status:up" in n.info("replication")
                   for n in live if n.role() == "replica")

    def all_procs(self):
        return list(self.nodes)

    def describe(self):
        out = {"nodes": {}}
        for n in self.nodes:
            d = describe_node(n)
            if isinstance(d, dict):
                try:
                    info = redis_cmd(n.port, "CLUSTER", "INFO")
                    d["cluster_state"] = next((ln.split(":")[1] for ln in info.splitlines()
                                               if ln.startswith("cluster_state:")), None)
                except Exception as e:
                    d["cluster_state"] = repr(e)
            out["nodes"][n.port] = d
        return out


class MemoryTopology:
    kind = "memory"
    nodes = []
    sentinels = []

    def redis_ports(self):
        return []

    def entry_ports(self):
        return []

    def healthy(self):
        return True

    def all_procs(self):
        return []

    def describe(self):
        return {}


class Instance(Proc):
    """One waitroom process, its listeners, its own fault proxies to every
    Redis port it reaches, and a libfaketime offset file for clock skew."""

    def __init__(self, idx, binary, workdir, topo, settings, faketime):
        self.idx = idx
        self.port, self.admin_port = free_port(), free_port()
        self.proxies = {}
        port_map = {}
        for real in topo.redis_ports() + [p for p in topo.entry_ports()
                                          if p not in topo.redis_ports()]:
            px = FaultProxy(real, free_port())
            self.proxies[real] = px
            port_map[real] = px.port
        # Replies naming a Redis port (Sentinel's master address, CLUSTER
        # SLOTS, MOVED/ASK) are rewritten to this instance's proxy for it,
        # so every connection the instance opens goes through its proxies.
        for px in self.proxies.values():
            px.port_map = port_map
            px.start()
        self.skew_file = os.path.join(workdir, f"instance-{idx}.faketime")
        self.set_skew(0)
        s = settings
        argv = [binary, "--addr", f"127.0.0.1:{self.port}",
                "--admin-addr", f"127.0.0.1:{self.admin_port}",
                "--key-prefix", s["prefix"], "--queues", "default",
                "--admission-interval-ms", str(s["interval_ms"]),
                "--admission-batch", str(s["batch"]),
                "--token-ttl-secs", str(s["token_ttl"]),
                "--abandon-after-secs", str(s["abandon_after"]),
                "--claim-lease-secs", str(s["claim_lease_s"]),
                "--ticket-secret", s["ticket_secret"], "--identity", "header",
                "--service-token", s["service_token"], "--admin-token", s["admin_token"],
                "--orders-db", s.get("orders_db") or os.path.join(workdir, f"orders-{idx}.db"),
                "--places-per-address", "0",
                "--joins-per-address-per-minute", "0",
                "--streams-per-address", "0"]
        if topo.kind != "memory":
            argv += ["--redis-url", topo.url(port_map), "--redis-wait-replicas",
                     str(s["wait_replicas"]), *topo.flags()]
        env = dict(os.environ, RUST_LOG=os.environ.get("FAULTS_RUST_LOG", "waitroom=warn"))
        if faketime:
            env.update(LD_PRELOAD=faketime, FAKETIME_TIMESTAMP_FILE=self.skew_file,
                       FAKETIME_DONT_FAKE_MONOTONIC="1", FAKETIME_CACHE_DURATION="1")
        super().__init__(f"instance-{idx}", argv,
                         os.path.join(workdir, f"instance-{idx}.log"), env)

    def set_skew(self, seconds):
        with open(self.skew_file, "w") as f:
            f.write(f"{seconds:+d}s\n")

    def start(self, within=30):
        super().start()
        wait_for(f"instance {self.idx} ready", self.ready, within, 0.2)

    def ready(self):
        if not self.alive():
            raise RuntimeError(f"instance {self.idx} exited: see {self.log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/readyz", timeout=1) as r:
                return r.status == 200
        except Exception:
            return False

    def close(self):
        self.kill()
        for px in self.proxies.values():
            px.close()


def find_faketime():
    for lib in FAKETIME_LIBS:
        if os.path.exists(lib):
            return lib
    return None


def postgres_db(name):
    """A fresh PostgreSQL database for the demo order service that every
    instance shares (one stock), on the PostgreSQL the tests use
    (WAITROOM_TEST_POSTGRES_URL, else postgres://postgres@127.0.0.1:5432/test);
    None when none answers: then each instance has its own SQLite file."""
    base = os.environ.get("WAITROOM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
    if not shutil.which("psql"):
        return None, None
    r = subprocess.run(["psql", base, "-qtAc", f"DROP DATABASE IF EXISTS {name}; "],
                       capture_output=True, timeout=20)
    r = subprocess.run(["psql", base, "-qtAc", f"CREATE DATABASE {name}"],
                       capture_output=True, timeout=20)
    if r.returncode != 0:
        return None, None
    url = base.rsplit("/", 1)[0] + "/" + name

    def drop():
        subprocess.run(["psql", base, "-qtAc", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"],
                       capture_output=True, timeout=20)
    return url, drop


def make_workdir(tag):
    return tempfile.mkdtemp(prefix=f"waitroom-faults-{tag}-")


def remove_workdir(d):
    shutil.rmtree(d, ignore_errors=True)
