#!/usr/bin/env python3
"""loadtest/lua-instructions.py: what a poll, a repeat join and an
admission pass (per buyer admitted, 50 a pass) cost Redis, counted in
instructions (valgrind's callgrind on a private redis-server), next to the
plain one-Lua-call join (loadtest/plain-join) in the same run.

Instructions, unlike microseconds, do not move with the machine's load:
the same scripts and data give the same counts, so two versions of a
script can be told apart by a few per cent where `redis-cost.sh`'s timings
(ratios to the plain join, on a shared machine) vary by twenty. What they
miss is the memory: a count is not a cache miss.

The scripts are measured as Redis receives them (prelude and helpers
assembled): `cargo test --lib -- --ignored write_assembled_scripts` with
WAITROOM_SCRIPTS_OUT=<dir> writes them. The line: LINE buyers (20,000), the
first 1,000 each with an entry-time mark of its own (the dearest to read),
in both layouts of the marks (spans of 16 under '^', of 128 under '~'), so
scripts of either version find theirs.

env: NEW (a directory of assembled scripts; default: written from this
checkout), BASE (another version's, optional: measured beside NEW),
BASE_TOUCH (1: the base's polls mark presence, as its HTTP layer did),
LINE (20000), CALLS (200 a measurement), PORT (6498).
Prints a Markdown table: instructions per call, and the ratio to the plain
join. Needs valgrind and the Python redis client (installed if missing).
"""
import glob
import os
import re
import subprocess
import sys
import tempfile
import time

try:
    import redis
except ImportError:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "redis"])
    import redis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = int(os.environ.get("LINE", "20000"))
CALLS = int(os.environ.get("CALLS", "200"))
PORT = int(os.environ.get("PORT", "6498"))
PASS = 50  # buyers an admission pass admits
P = "lua:{q}:"
KEYS8 = [P + k for k in ["waiting", "seq", "entered", "seen", "active", "bucket", "pass", "paused"]]
BASE_ID = 1000  # the first entry id


def assembled(out):
    env = dict(os.environ, WAITROOM_SCRIPTS_OUT=out)
    subprocess.check_call(
        ["cargo", "test", "-q", "--lib", "--", "--ignored", "--exact",
         "store::redis::scripts::written::write_assembled_scripts"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    return out


def fill(r, t0):
    """The line, both layouts of marks, the counters."""
    pipe = r.pipeline(transaction=False)
    for i in range(LINE):
        pipe.zadd(KEYS8[0], {f"u{i}": BASE_ID + i})
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    for span, prefix in [(128, "~"), (16, "^")]:
        spans = {}
        for i in range(LINE):
            b, off = divmod(BASE_ID + i, span)
            marks = spans.setdefault(b, [])
            if i < 1000 or not marks:
                marks.append((off, t0 + i))
        for b, marks in spans.items():
            first = marks[0][1]
            text = f"{marks[0][0]},{first}" + "".join(f" {o},{t - first}" for o, t in marks[1:])
            r.hset(KEYS8[2], f"{prefix}{b}", text)
        r.hset(KEYS8[2], prefix + "lo", str(BASE_ID // span))
    r.set(KEYS8[1], BASE_ID + LINE)
    r.set(KEYS8[6], 42)


def main():
    tmp = tempfile.mkdtemp(prefix="waitroom-li.")
    new = os.environ.get("NEW") or assembled(os.path.join(tmp, "new"))
    base = os.environ.get("BASE")
    base_touch = os.environ.get("BASE_TOUCH", "0")
    vg = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.%p",
         "redis-server", "--port", str(PORT), "--save", "", "--appendonly", "no", "--hz", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=PORT)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.2)
        t0 = int(time.time() * 1000) - 100_000
        fill(r, t0)
        plain = r.script_load(open(os.path.join(ROOT, "loadtest/plain-join/src/join.lua")).read())
        versions = [("new", new, "0")] + ([("base", base, base_touch)] if base else [])
        cases = []  # (name, sha, kind, touch, known)
        for label, d, touch in versions:
            status = r.script_load(open(os.path.join(d, "status.lua")).read())
            enter = r.script_load(open(os.path.join(d, "enter.lua")).read())
            cases.append((f"poll ({label}{', touch' if touch == '1' else ''})", status, "status", touch, False))
            if label == "new":
                cases.append(("poll (new, entry time known)", status, "status", "0", True))
            cases.append((f"repeat join ({label})", enter, "enter", None, False))
            # A version that wrote no admit.lua (before the tool measured
            # admission) is measured without it.
            if os.path.exists(os.path.join(d, "admit.lua")):
                admit = r.script_load(open(os.path.join(d, "admit.lua")).read())
                cases.append((f"admission, per buyer of 50 a pass ({label})", admit, "admit", None,
                              False))

        # Admission last: it takes the head of the line, which the polls
        # and repeat joins (u0..u999) must find waiting.
        cases.sort(key=lambda c: c[2] == "admit")

        def run(case, rd):
            name, sha, kind, touch, known = case
            p = r.pipeline(transaction=False)
            if kind == "admit":
                # CALLS buyers admitted from the head, PASS a pass: the
                # tokens as the instance makes them (43 characters), the
                # absent sweep on (120 s), unlimited holders.
                for k in range(CALLS // PASS):
                    tokens = [f"{rd}{k:03d}{i:03d}".ljust(43, "x") for i in range(PASS)]
                    p.evalsha(sha, 11, *KEYS8, P + "settings", P + "stock", P + "audit",
                              P + "token:", P + "events", 60000, PASS, 1, -1, 120000, *tokens)
                res = p.execute()
                assert not isinstance(res[0], Exception), (name, res[0])
                assert f'"pass"' in res[0].decode(), (name, res[0])
                return
            for i in range(CALLS):
                u = f"u{i % 1000}"
                if kind == "plain":
                    p.evalsha(plain, 2, "pl:{q}:line", "pl:{q}:seq", f"n{rd}_{i}")
                elif kind == "status":
                    extra = [str(BASE_ID + i % 1000), str(t0 + i % 1000)] if known else ["", ""]
                    p.evalsha(sha, 11, *KEYS8, P + "token:" + u, P + "budget:" + u, P + "stock",
                              P + "token:", P + "events", u, touch, 500, 1_000_000, *extra)
                else:
                    p.evalsha(sha, 14, *KEYS8, P + "token:" + u, P + "budget:" + u, P + "stock",
                              P + "audit", P + "lottery", P + "pre", P + "token:", P + "events", u,
                              "tok" + u, f"500 1000000 0 {BASE_ID} 60000 50 1000 -1 0 0 0")
            res = p.execute()
            assert not isinstance(res[0], Exception), (name, res[0])
            assert kind == "plain" or res[0][0] == b"waiting", (name, res[0])
            if kind == "plain":
                r.delete("pl:{q}:line", "pl:{q}:seq")

        def measure(case):
            run(case, 0)  # warm: the same keys exist as in the measured calls
            subprocess.run(["callgrind_control", "-z", str(vg.pid)], capture_output=True)
            run(case, 1)
            before = set(glob.glob(f"{tmp}/cg.*"))
            subprocess.run(["callgrind_control", "-d", str(vg.pid)], capture_output=True)
            time.sleep(0.3)
            dumps = sorted(set(glob.glob(f"{tmp}/cg.*")) - before, key=os.path.getmtime)
            text = open(dumps[-1]).read()
            return int(re.search(r"^summary: (\d+)", text, re.M).group(1)) / CALLS

        plain_case = ("plain join (plain-join/src/join.lua)", plain, "plain", None, False)
        got = [(plain_case[0], measure(plain_case))] + [(c[0], measure(c)) for c in cases]
        print(f"line of {LINE:,}, {CALLS} calls a measurement, Redis under callgrind\n")
        print("| call | instructions per call | ratio to the plain join |")
        print("|---|---:|---:|")
        for name, v in got:
            print(f"| {name} | {v:,.0f} | {v / got[0][1]:.2f}x |")
    finally:
        try:
            redis.Redis(port=PORT).shutdown(nosave=True)
        except Exception:
            pass
        vg.wait(timeout=30)


if __name__ == "__main__":
    main()
