"""The nemesis: faults chosen at random from the seed, overlapping within a
storm, then healed all at once; after each heal the topology must settle
and every open stream is probed (a position read) for the convergence
check. Which faults, on what, for how long and in what order come from the
seed; when they land against the workload is the machine's timing."""

import random
import threading
import time

from procs import Proc, redis_cmd

PROCESS_FAULTS = ["inst_kill", "inst_pause"]
REDIS_FAULTS = ["master_kill", "master_kill_lagging", "replica_kill", "redis_pause", "pubsub_kill",
                "proxy_latency", "proxy_loss", "proxy_partition", "clock_skew"]
SENTINEL_FAULTS = ["sentinel_kill"]
# Faults on Redis's own processes: one at a time (two replicas killed at
# once with --redis-wait-replicas 1 is an outage by design, not a test).
NODE_FAULTS = {"master_kill", "master_kill_lagging", "replica_kill", "redis_pause", "sentinel_kill"}
INSTANCE_PROCESS = {"inst_kill", "inst_pause"}
INSTANCE_LINK = {"proxy_latency", "proxy_loss", "proxy_partition", "clock_skew"}


def replicas_of(topo, master_port):
    out = []
    for n in topo.nodes:
        if n.port == master_port or not n.alive() or n.stopped:
            continue
        try:
            if f"master_port:{master_port}" in n.info("replication"):
                out.append(n)
        except Exception:
            pass
    return out


class Nemesis:
    def __init__(self, cluster, history, seed, deadline, bound_s, storm_s, faketime,
                 on_probe):
        self.c, self.h, self.deadline = cluster, history, deadline
        self.rng = random.Random(seed ^ 0xfa17)
        self.bound_s, self.storm_s = bound_s, storm_s
        self.on_probe = on_probe
        kinds = list(PROCESS_FAULTS)
        if cluster.topo.kind != "memory":
            kinds += REDIS_FAULTS
            if not faketime:
                kinds.remove("clock_skew")
        if cluster.topo.kind == "sentinel":
            kinds += SENTINEL_FAULTS
        self.kinds = kinds
        self.active = []  # (fault id, kind, target, undo)
        self.exited = {}  # instance index -> when it was first seen exited by itself
        self.next_id = 0
        self.stop = threading.Event()
        self.counts = {}
        self.heal_times = []
        # A Sentinel master restarted before the failover settles can keep
        # instances and serve stale reads until a sentinel demotes it
        # (docs/faults.md); the smoke campaign, a gate that must pass,
        # restarts a killed master only once the sentinels name another
        # one, and pauses a master for less than the down-after time.
        self.restart_after_failover = False
        # How long a heal waits for the topology to be whole again (the
        # smoke campaign, bounded in scripts/test, waits less).
        self.heal_within = 90

    def run(self):
        try:
            while not self.stop.is_set():
                # Room for a storm, a heal and a full convergence window.
                if time.monotonic() + self.storm_s[0] + self.bound_s + 15 > self.deadline:
                    break
                self.storm()
                self.heal_and_probe()
                calm_until = time.monotonic() + self.bound_s + 2
                while time.monotonic() < calm_until and not self.stop.is_set():
                    self.supervise()
                    self.stop.wait(0.5)
        finally:
            self.heal_all()

    def storm(self):
        length = self.rng.uniform(*self.storm_s)
        end = time.monotonic() + length
        self.h.record({"op": "storm", "phase": "start", "length": round(length, 2)})
        while time.monotonic() < end and not self.stop.is_set():
            kind = self.rng.choice(self.kinds)
            duration = self.rng.uniform(1.0, min(10.0, length))
            self.inject(kind, duration)
            self.reap(undo_due=True)
            self.supervise()
            self.stop.wait(self.rng.uniform(0.5, 3.0))
        self.reap(undo_due=True)

    def busy(self, kind, target):
        for _, k, t, _, _ in self.active:
            if k in NODE_FAULTS and kind in NODE_FAULTS:
                return True
            if t == target and ((k in INSTANCE_PROCESS and kind in INSTANCE_PROCESS) or k == kind):
                return True
        if kind in INSTANCE_PROCESS:
            down = {t for _, k, t, _, _ in self.active if k in INSTANCE_PROCESS}
            if len(down | {target}) >= len(self.c.instances) > 1:
                return True  # one instance always serves
        return False

    def inject(self, kind, duration):
        insts = self.c.instances
        topo = self.c.topo
        target = None
        if kind in INSTANCE_PROCESS or kind in INSTANCE_LINK:
            target = f"instance-{self.rng.randrange(len(insts))}"
        # Choose the parameters from the seed before anything can fail.
        delay = self.rng.choice([30, 150, 600])
        loss = self.rng.choice([0.05, 0.2, 0.5])
        pmode = self.rng.choice(["blackhole", "reset"])
        skew = self.rng.choice([-1, 1]) * self.rng.randint(2, 30)
        pick = self.rng.random()
        if kind in ("master_kill", "master_kill_lagging", "redis_pause"):
            port = topo.master_port()
            if port is None:
                return
            target = f"redis:{port}"
        elif kind == "replica_kill":
            replicas = [n.port for n in topo.nodes if n.alive() and n.role() == "replica"]
            if not replicas:
                return
            target = f"redis:{replicas[int(pick * len(replicas))]}"
        elif kind == "sentinel_kill":
            target = f"sentinel:{topo.sentinels[int(pick * 3)].port}"
        elif kind == "pubsub_kill":
            target = "redis:*"
        if self.busy(kind, target):
            return
        undo = None
        params = {}
        inst = insts[int(target.split("-")[1])] if target and target.startswith("instance-") else None
        if kind == "inst_kill":
            inst.kill()
            # Started again without waiting for readiness: the heal waits.
            undo = lambda: Proc.start(inst)  # noqa: E731
            if topo.kind == "memory":
                params["store_wiped"] = True
        elif kind == "inst_pause":
            inst.stop()
            undo = inst.cont
        elif kind in ("master_kill", "replica_kill"):
            node = topo.node(int(target.split(":")[1]))
            node.kill()
            undo = self.restart_master(node) if kind == "master_kill" else node.start
        elif kind == "master_kill_lagging":
            # The master dies with writes its replicas never got: they are
            # frozen and their links cut first, for a lag of 0.3-1 s. What
            # was acknowledged meanwhile survives only if WAIT held it back.
            master = topo.node(int(target.split(":")[1]))
            replicas = replicas_of(topo, master.port)
            lag = 0.3 + pick * 0.7
            for r in replicas:
                r.stop()
            try:
                redis_cmd(master.port, "CLIENT", "KILL", "TYPE", "replica")
            except Exception:
                pass
            time.sleep(lag)
            master.kill()
            for r in replicas:
                r.cont()
            params.update(lag_s=round(lag, 2), replicas=[r.port for r in replicas])
            undo = self.restart_master(master)
        elif kind == "sentinel_kill":
            s = next(s for s in topo.sentinels if s.port == int(target.split(":")[1]))
            s.kill()
            undo = s.start
        elif kind == "redis_pause":
            node = topo.node(int(target.split(":")[1]))
            if self.restart_after_failover and topo.kind == "sentinel":
                # The smoke keeps a Sentinel master's pause under the
                # down-after time (1.5 s): a master paused past it is failed
                # over, resumes as a master and runs what its clients sent
                # meanwhile until a sentinel demotes it (seconds later), the
                # stale-master window the longer runs measure
                # (docs/faults.md), not one the gate can pass by design.
                duration = min(duration, 1.0)
            if pick < 0.5:
                params["how"] = "CLIENT PAUSE"
                ms = int(duration * 1000)
                try:
                    redis_cmd(node.port, "CLIENT", "PAUSE", ms, "ALL")
                except Exception:
                    return
                undo = lambda: None  # noqa: E731 (the pause ends by itself)
            elif self.restart_after_failover and topo.kind == "sentinel":
                # Held here, not until the next reap (which may come 3 s
                # later): the pause must stay under the down-after time.
                params["how"] = "SIGSTOP"
                node.stop()
                time.sleep(duration)
                node.cont()
                undo = lambda: None  # noqa: E731
            else:
                params["how"] = "SIGSTOP"
                node.stop()
                undo = node.cont
        elif kind == "pubsub_kill":
            killed = 0
            for n in topo.nodes:
                if n.alive() and not n.stopped:
                    try:
                        killed += redis_cmd(n.port, "CLIENT", "KILL", "TYPE", "pubsub")
                    except Exception:
                        pass
            params["killed"] = killed
            duration = 0
            undo = lambda: None  # noqa: E731
        elif kind == "proxy_latency":
            for px in inst.proxies.values():
                px.delay_ms = delay
            params["delay_ms"] = delay
            undo = lambda: [px.heal() for px in inst.proxies.values()]  # noqa: E731
        elif kind == "proxy_loss":
            for px in inst.proxies.values():
                px.loss = loss
            params["loss"] = loss
            undo = lambda: [px.heal() for px in inst.proxies.values()]  # noqa: E731
        elif kind == "proxy_partition":
            for px in inst.proxies.values():
                px.set_mode(pmode)
            params["mode"] = pmode
            undo = lambda: [px.heal() for px in inst.proxies.values()]  # noqa: E731
        elif kind == "clock_skew":
            inst.set_skew(skew)
            params["skew_s"] = skew
            undo = lambda: inst.set_skew(0)  # noqa: E731
        self.next_id += 1
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.h.record({"op": "fault", "phase": "start", "id": self.next_id, "fault": kind,
                       "target": target, "duration": round(duration, 2), **params})
        self.active.append((self.next_id, kind, target, undo, time.monotonic() + duration))

    def restart_master(self, node):
        if not (self.restart_after_failover and self.c.topo.kind == "sentinel"):
            return node.start

        def after_failover():
            deadline = time.monotonic() + 15
            while self.c.topo.master_port() in (node.port, None) and time.monotonic() < deadline:
                time.sleep(0.2)
            node.start()
        return after_failover

    def supervise(self):
        """Starts again, 2 s after it exited, an instance that exited by
        itself (one an `inst_kill` holds down is left alone), as systemd's
        `Restart=on-failure` / `RestartSec=2s` does in production
        (deploy/debian/waitroom.service). waitroom exits at start when its
        store does not answer then: an instance restarted at the end of an
        `inst_kill` while a failover is still under way, or while its links
        to Redis are cut, exits at once. Left dead, every later heal would
        wait for it in vain (the "not whole within 90 s" of the 2026-12-02
        run) and the campaign would go on with one instance fewer."""
        held = {t for _, k, t, _, _ in self.active if k == "inst_kill"}
        now = time.monotonic()
        for inst in self.c.instances:
            if f"instance-{inst.idx}" in held or inst.popen is None or inst.alive():
                self.exited.pop(inst.idx, None)
                continue
            since = self.exited.setdefault(inst.idx, now)
            if now - since < 2.0:
                continue
            self.exited.pop(inst.idx, None)
            code = inst.popen.returncode
            Proc.start(inst)
            self.h.record({"op": "supervisor_restart", "inst": inst.idx, "exit_code": code,
                           **({"store_wiped": True} if self.c.topo.kind == "memory" else {})})

    def reap(self, undo_due):
        now = time.monotonic()
        keep = []
        for item in self.active:
            fid, kind, target, undo, until = item
            if undo_due and now >= until:
                self.end(item)
            else:
                keep.append(item)
        self.active = keep

    def end(self, item):
        fid, kind, target, undo, _ = item
        err = None
        try:
            undo()
        except Exception as e:
            err = repr(e)
        self.h.record({"op": "fault", "phase": "end", "id": fid, "fault": kind,
                       "target": target, **({"err": err} if err else {})})

    def heal_all(self):
        for item in self.active:
            self.end(item)
        self.active = []

    def heal_and_probe(self):
        """Ends every fault, waits until the topology is whole again (a
        failover finished, replicas in sync, every instance ready), marks
        that instant as the heal, and probes every open stream."""
        self.heal_all()
        started = time.monotonic()
        while time.monotonic() - started < self.heal_within:
            self.supervise()
            try:
                if self.c.topo.healthy() and all(i.ready() for i in self.c.instances):
                    break
            except Exception:
                pass
            time.sleep(0.2)
        else:
            # Why the group is not whole: each sentinel's master, each node's
            # role and links, each instance's readiness.
            try:
                topo = self.c.topo.describe()
            except Exception as e:
                topo = repr(e)
            ready = {}
            for i in self.c.instances:
                try:
                    ready[i.idx] = i.ready()
                except Exception as e:
                    ready[i.idx] = repr(e)
            self.h.record({"op": "heal_timeout", "waited": round(time.monotonic() - started, 1),
                           "topology": topo, "instances_ready": ready})
        t, w = self.h.now()
        self.heal_times.append(t)
        self.h.record({"op": "healed", "settle_s": round(time.monotonic() - started, 2)})
        time.sleep(0.5)
        self.on_probe(t)
