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

With FUNCTIONS=1 the same calls are also measured as Redis 7 functions
(FCALL) of one library made from this checkout's scripts: every helper
defined once when the library loads, where a script sent with EVALSHA
defines the helpers it keeps anew on every call. KEYS and ARGV become
the library's upvalues, set per call, and the key table (common.lua's K)
is made per call where the script makes it. What that saves a call is
what moving the scripts to functions would (FUNCTION LOAD, a library per
version, their own reloading after a restart and in a cluster: not
built; this measures whether it is worth building).

env: NEW (a directory of assembled scripts; default: written from this
checkout), BASE (another version's, optional: measured beside NEW),
BASE_TOUCH (1: the base's polls mark presence, as its HTTP layer did),
KEY_COST (1: what a key costs sent in KEYS and named in the script, three
calls of one EXISTS), FUNCTIONS (1: the FCALL variant too), MODE (time: Redis µs per call from
INFO commandstats on a redis-server not under callgrind, the median of
ROUNDS, 5), LINE (20000), CALLS (200 a measurement), PORT (6498).
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
TIMED = os.environ.get("MODE") == "time"
ROUNDS = int(os.environ.get("ROUNDS", "5"))
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


def definitions(lib):
    """A helper file's top-level definitions in order, as scripts.rs's
    `assemble` splits them: (names, text) from a line `local function
    name` or `local a, b =` to the next."""
    defs, start, names, at = [], None, [], 0
    for line in lib.splitlines(keepends=True):
        got = None
        if line.startswith("local function "):
            got = [re.match(r"\w*", line[len("local function "):]).group(0)]
        elif line.startswith("local ") and "=" in line:
            got = [n.strip() for n in line[len("local "):].split("=", 1)[0].split(",") if n.strip()]
        if got is not None:
            if start is not None:
                defs.append((names, lib[start:at]))
            start, names = at, got
        at += len(line)
    if start is not None:
        defs.append((names, lib[start:]))
    return defs


def function_library(prelude):
    """enter, status and admit as functions fx_enter, fx_status and
    fx_admit of one library (see the module's doc)."""
    src = os.path.join(ROOT, "src/store/redis/lua")
    read = lambda f: open(os.path.join(src, f)).read()
    out = ["#!lua name=waitroom_fx\n", prelude, "local KEYS, ARGV, K\n"]
    for names, text in [d for f in ["common.lua", "gcra.lua", "join.lua"] for d in definitions(read(f))]:
        if names == ["K"]:
            out.append("local function make_keys()\n" + text.replace("local K = {", "K = {", 1) + "\nend\n")
        else:
            out.append(text)
    for name in ["enter", "status", "admit"]:
        body = read(f"{name}.lua")
        head, mark, rest = body.partition("--@helpers\n")
        if not mark:
            head, rest = "", body
        out.append(f"\nlocal function {name}_main()\n{head}\nmake_keys()\n{rest}\nend\n")
        out.append(f"redis.register_function('fx_{name}', function(keys, args) "
                   f"KEYS, ARGV = keys, args return {name}_main() end)\n")
    return "".join(out)


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
    under = [] if TIMED else ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.%p"]
    vg = subprocess.Popen(
        under + ["redis-server", "--port", str(PORT), "--save", "", "--appendonly", "no", "--hz", "1"],
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
        cases = []  # (name, sha or function, kind, touch, known)
        if os.environ.get("KEY_COST") == "1":
            get = "return redis.call('EXISTS', KEYS[1])"
            named = ("local b = string.sub(KEYS[1], 1, -8) local s, l, g = b .. 'stock', "
                     "b .. 'lottery', b .. 'budget:' .. ARGV[1] ")
            cases += [("an EXISTS, 1 key sent", r.script_load(get), "keys", 1, False),
                      ("an EXISTS, 14 keys sent", r.script_load(get), "keys", 0, False),
                      ("an EXISTS, 1 key sent, 3 named in the script", r.script_load(named + get),
                       "keys", 3, False)]
        if os.environ.get("FUNCTIONS") == "1":
            prelude = "".join(open(os.path.join(new, "enter.lua")).readlines()[:3])
            r.function_load(function_library(prelude), replace=True)
            versions.append(("new, functions", None, "0"))
        for label, d, touch in versions:
            if d is None:
                status, enter, admit = "fx_status", "fx_enter", "fx_admit"
                cases += [(f"poll ({label})", status, "status", touch, False),
                          (f"repeat join ({label})", enter, "enter", None, False),
                          (f"admission, per buyer of 50 a pass ({label})", admit, "admit", None, False)]
                continue
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
            if sha.startswith("fx_"):
                fn = sha
                p.evalsha = lambda _sha, n, *rest: p.fcall(fn, n, *rest)
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
            if kind == "keys":
                # One EXISTS, with the user's name sent as 1 argument and the
                # queue's keys (the 8 common ones, the user's 2 and the
                # join's 4) sent as KEYS, or named in the script (touch:
                # how many it names).
                for i in range(CALLS):
                    u = f"u{i % 1000}"
                    sent = [KEYS8[0]] if touch else KEYS8 + [
                        P + "token:" + u, P + "budget:" + u, P + "stock", P + "audit",
                        P + "lottery", P + "pre"]
                    p.evalsha(sha, len(sent), *sent, u)
                res = p.execute()
                assert not isinstance(res[0], Exception), (name, res[0])
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

        def measure_time(every):
            """Per case, the median over ROUNDS of Redis µs (INFO
            commandstats) per call, or per buyer admitted; the cases take
            turns, round by round, so none is always measured first."""
            for case in every:
                run(case, 0)
            got = [[] for _ in every]
            for k in range(ROUNDS):
                for i, case in enumerate(every):
                    r.config_resetstat()
                    run(case, 10 + k)
                    stats = r.info("commandstats")
                    got[i].append(sum(stats.get(c, {}).get("usec", 0) for c in
                                      ["cmdstat_evalsha", "cmdstat_fcall"]) / CALLS)
            return [(case[0], sorted(g)[len(g) // 2]) for case, g in zip(every, got)]

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
        if TIMED:
            # Admission takes the head the others ask about: its cases
            # take turns after theirs.
            got = measure_time([plain_case] + [c for c in cases if c[2] != "admit"])
            got += measure_time([c for c in cases if c[2] == "admit"])
        else:
            got = [(plain_case[0], measure(plain_case))] + [(c[0], measure(c)) for c in cases]
        if TIMED:
            print(f"line of {LINE:,}, {CALLS} calls a measurement (pipelined), median of {ROUNDS},"
                  " Redis µs from INFO commandstats\n")
            print("| call | Redis µs per call | ratio to the plain join |")
        else:
            print(f"line of {LINE:,}, {CALLS} calls a measurement, Redis under callgrind\n")
            print("| call | instructions per call | ratio to the plain join |")
        print("|---|---:|---:|")
        for name, v in got:
            shown = f"{v:,.2f}" if TIMED else f"{v:,.0f}"
            print(f"| {name} | {shown} | {v / got[0][1]:.2f}x |")
    finally:
        try:
            redis.Redis(port=PORT).shutdown(nosave=True)
        except Exception:
            pass
        vg.wait(timeout=30)


if __name__ == "__main__":
    main()
