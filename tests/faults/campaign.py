#!/usr/bin/env python3
"""A seeded, bounded fault campaign against waitroom (docs/faults.md).

  campaign.py --kind sentinel --seed 7 --minutes 30   # one cluster kind
  campaign.py --smoke                                  # all three, short (scripts/test)
  campaign.py --plant rate-skip --kind sentinel        # against a planted bug
  campaign.py --check /path/history.jsonl              # the checker alone

Python 3.11 standard library only. Starts private redis-server/Sentinel/
Cluster processes and waitroom instances on free loopback ports (never
6379), runs buyers against them while the nemesis injects faults, then
checks the history (checker.py). Exit status 1 on a violation.
"""

import argparse
import datetime
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import checker  # noqa: E402
from history import History  # noqa: E402
from nemesis import Nemesis  # noqa: E402
from procs import (ClusterTopology, Instance, MemoryTopology, SentinelTopology,  # noqa: E402
                   find_faketime, make_workdir, postgres_db, remove_workdir)
from workload import Workload  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
KINDS = ["memory", "sentinel", "cluster"]
# Convergence bound (docs/faults.md): the subscription's health check
# (every 5 s, 3 s timeout) notices a dead link within 8 s, the resubscribe
# backoff is at most 2 s, the resync then re-reads every stream at once;
# plus 5 s for admission passes and the client's own reconnect after a
# stream it was on died with its instance.
CONVERGENCE_BOUND_S = 15.0
# Sentinel: every replica (2), since Sentinel may promote any of them and
# `WAIT 1` of 2 loses what only the other one acknowledged (docs/faults.md,
# "Sentinel: WAIT must cover every replica"); `--wait-replicas 1` shows it.
DEFAULT_WAIT = {"memory": 0, "sentinel": 2, "cluster": 0}


class Cluster:
    def __init__(self, topo, instances):
        self.topo, self.instances = topo, instances


def settings_for(kind, seed, args):
    return {
        "kind": kind, "seed": seed, "prefix": f"faults{seed}",
        "interval_ms": 300, "batch": 2, "token_ttl": 4, "abandon_after": 12, "claim_lease_s": 5,
        "stock": 30, "ticket_secret": "faults-ticket-secret-0123456789",
        "service_token": "faults-service-token-0123456789",
        "admin_token": "faults-admin-token-0123456789ab",
        "wait_replicas": DEFAULT_WAIT[kind] if args.wait_replicas is None else args.wait_replicas,
        "instances": 1 if kind == "memory" else args.instances,
        "bound_s": CONVERGENCE_BOUND_S,
    }


def replay_command(kind, seed, seconds, args):
    cmd = f"python3 tests/faults/campaign.py --kind {kind} --seed {seed} --seconds {int(seconds)}"
    for flag in ("plant", "faults", "wait_replicas", "buyers"):
        if getattr(args, flag, None) is not None:
            cmd += f" --{flag.replace('_', '-')} {getattr(args, flag)}"
    return cmd


def run_one(kind, seed, seconds, binary, out_dir, args, plant=None):
    """One campaign on one cluster kind: returns the checker's result."""
    s = settings_for(kind, seed, args)
    workdir = make_workdir(kind)
    hist_path = os.path.join(out_dir, f"history-{kind}-{seed}.jsonl")
    h = History(hist_path)
    faketime = find_faketime() if kind != "memory" else None
    topo = None
    instances = []
    started = time.monotonic()
    drop_db = None
    if s["instances"] > 1:
        s["orders_db"], drop_db = postgres_db(f"waitroom_faults_{kind}_{seed}")
    s["shared_stock"] = s["instances"] == 1 or s.get("orders_db") is not None
    try:
        if kind == "sentinel":
            topo = SentinelTopology(workdir)
        elif kind == "cluster":
            topo = ClusterTopology(workdir)
        else:
            topo = MemoryTopology()
        for i in range(s["instances"]):
            inst = Instance(i, binary, workdir, topo, s, faketime)
            instances.append(inst)
            inst.start(60)
        cluster = Cluster(topo, instances)
        h.record({"op": "meta", **s, "seconds": seconds, "binary": binary, "plant": plant,
                  "faketime": bool(faketime),
                  "replay": replay_command(kind, seed, seconds, args)})
        setup_s = time.monotonic() - started
        deadline = time.monotonic() + seconds
        buyers = args.buyers or (20 if kind == "memory" else 30)
        w = Workload(cluster, h, seed, s, deadline, buyers)
        storm = (4.0, 10.0) if seconds < 120 else (5.0, 25.0)
        n = Nemesis(cluster, h, seed, deadline, CONVERGENCE_BOUND_S, storm, faketime,
                    w.probe_streams)
        n.restart_after_failover = args.smoke
        n.heal_within = 20 if args.smoke else 90
        if args.faults:
            n.kinds = [k for k in args.faults.split(",") if k in n.kinds] or n.kinds
        w.start()
        # The nemesis runs on this thread, the one that started the
        # processes: PR_SET_PDEATHSIG fires when the *thread* that forked a
        # child ends, so a process restarted from a short-lived thread
        # would die with it.
        n.run()
        while time.monotonic() < deadline:
            time.sleep(0.5)
        w.join_stop(5)
        n.heal_and_probe()
        w.final_sweep()
        h.record({"op": "end", "faults": n.counts, "setup_s": round(setup_s, 1)})
    finally:
        h.close()
        for inst in instances:
            inst.close()
        if topo is not None:
            for p in topo.all_procs():
                p.kill()
        if drop_db:
            drop_db()
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            remove_workdir(workdir)
    result = checker.check(hist_path)
    result["history"] = hist_path
    return result


def build_planted(plant, out_dir):
    """Applies tests/faults/plants/<plant>.patch to a temporary git worktree
    of HEAD and builds it with a copy of the warm target dir; returns the
    binary. Nothing planted touches this checkout's src/."""
    patch = os.path.join(HERE, "plants", f"{plant}.patch")
    if not os.path.exists(patch):
        sys.exit(f"no plant {patch}")
    wt = os.path.join(out_dir, f"plant-{plant}")
    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", wt, "HEAD"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["git", "-C", wt, "apply", patch], check=True)
    # One target dir for every planted build (inside target/, ignored by
    # git), seeded once from the warm debug build: only waitroom itself
    # is compiled again.
    target = os.environ.get("FAULTS_PLANT_TARGET", os.path.join(REPO, "target", "faults-plants"))
    warm = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    if not os.path.exists(target) and os.path.isdir(os.path.join(warm, "debug")):
        os.makedirs(target)
        subprocess.run(["cp", "-a", os.path.join(warm, "debug"), target], check=True)
    t0 = time.monotonic()
    subprocess.run(["cargo", "build", "--bin", "waitroom"], cwd=wt, check=True,
                   env=dict(os.environ, CARGO_TARGET_DIR=target))
    print(f"planted build {plant}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return os.path.join(target, "debug", "waitroom"), wt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=KINDS + ["all"], default="all")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--minutes", type=float)
    ap.add_argument("--smoke", action="store_true",
                    help="all three kinds at once, about a minute each (scripts/test)")
    ap.add_argument("--bin", default=os.environ.get("WAITROOM_BIN", os.path.join(
        os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target")), "debug", "waitroom")))
    ap.add_argument("--plant", help="a patch in tests/faults/plants/ (without .patch)")
    ap.add_argument("--out", help="where histories and summaries go")
    ap.add_argument("--buyers", type=int)
    ap.add_argument("--instances", type=int, default=3)
    ap.add_argument("--wait-replicas", type=int)
    ap.add_argument("--faults", help="only these fault kinds (comma-separated)")
    ap.add_argument("--keep", action="store_true", help="keep the work dirs (logs)")
    ap.add_argument("--check", help="only check this history file")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    if args.check:
        result = checker.check(args.check)
        result["history"] = args.check
        checker.print_result(result)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({result["kind"]: result}, f, indent=1, default=str)
        sys.exit(1 if result["violations"] else 0)

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1 << 31)
    seconds = args.seconds or (args.minutes * 60 if args.minutes else 60)
    if args.smoke and not args.seconds and not args.minutes:
        seconds = 55
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = args.out or os.path.join("/tmp", f"waitroom-faults-{stamp}-{seed}")
    os.makedirs(out_dir, exist_ok=True)
    kinds = KINDS if args.kind == "all" else [args.kind]
    binary = os.path.abspath(args.bin)
    plant_wt = None
    if args.plant:
        binary, plant_wt = build_planted(args.plant, out_dir)
    if not os.path.exists(binary):
        sys.exit(f"no waitroom binary at {binary}: cargo build, or --bin / WAITROOM_BIN")
    print(f"seed {seed}, {seconds:.0f} s per kind, {', '.join(kinds)}; histories in {out_dir}",
          file=sys.stderr)
    results = {}
    try:
        if len(kinds) > 1:
            # The kinds run side by side (each its own processes and ports):
            # the smoke campaign stays within its minutes.
            threads = []
            for k in kinds:
                th = threading.Thread(target=lambda k=k: results.__setitem__(
                    k, run_one(k, seed, seconds, binary, out_dir, args, args.plant)))
                th.start()
                threads.append(th)
            for th in threads:
                th.join()
        else:
            results[kinds[0]] = run_one(kinds[0], seed, seconds, binary, out_dir, args, args.plant)
    finally:
        if plant_wt:
            subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", plant_wt],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bad = False
    for k in kinds:
        r = results.get(k)
        if r is None:
            print(f"== {k}: the campaign did not finish", file=sys.stderr)
            bad = True
            continue
        print(f"== {k}")
        checker.print_result(r)
        bad |= bool(r["violations"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    shutil.rmtree(out_dir, ignore_errors=True) if not bad and args.smoke and not args.keep else None
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
