#!/usr/bin/env bash
# loadtest/proxy-burst.sh: a burst of no-JavaScript visitors at the
# built-in proxy (--origin), checked against what the origin itself counts
# (tests/front/origin.mjs --session-cookie waitroom_pass): every visitor got
# in, the origin's arrivals never exceeded the configured rate plus one
# batch in any admission interval, and its peak of concurrent sessions
# never exceeded the room's maxActive. The driver is proxy-burst.mjs
# (PROCS processes, loopback sources 127.0.0.2-251); the server runs with
# the per-address limits off (loopback load test only, as README.md says).
#
# The origin counts a session as concurrent while it made a request within
# the last IDLE seconds, the same window after which waitroom ends an idle
# session and gives its slot to the next in line, so the two counts are
# comparable. Writes docs/benchmarks/proxy-burst-<UTC stamp>.md.
#
# env (defaults): VISITORS (10000), PROCS (4), BATCH (100 a second),
#   MAX_ACTIVE (400), IDLE (3 s), POLL_MS (3000), DEADLINE_S (300),
#   SERVER_BIN (target/release/waitroom, built unless SKIP_BUILD is set).
# Needs node. Loopback only; bounded by DEADLINE_S.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"
TMP="$(mktemp -d)"
# shellcheck source=loadtest/lib.sh
source "$here/lib.sh"
trap cleanup EXIT

VISITORS=${VISITORS:-10000}
PROCS=${PROCS:-4}
BATCH=${BATCH:-100}
MAX_ACTIVE=${MAX_ACTIVE:-400}
IDLE=${IDLE:-3}
POLL_MS=${POLL_MS:-3000}
DEADLINE_S=${DEADLINE_S:-300}
SERVER_BIN=${SERVER_BIN:-$root/target/release/waitroom}
if [ -z "${SKIP_BUILD:-}" ]; then
  timeout 3600 cargo build --release --bin waitroom
fi
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

node tests/front/origin.mjs --port 0 --log "$TMP/origin.jsonl" \
  --session-cookie waitroom_pass --session-window-ms $((IDLE * 1000)) >"$TMP/origin.out" 2>&1 &
EXTRA_PIDS+=($!)
origin_port=""
for _ in $(seq 1 100); do
  origin_port=$(sed -n 's/.*"listening":\([0-9]*\).*/\1/p' "$TMP/origin.out")
  [ -n "$origin_port" ] && break
  sleep 0.1
done
[ -n "$origin_port" ] || { log "the origin did not start"; cat "$TMP/origin.out" >&2; exit 1; }

WR_PORT=$(free_port)
"$SERVER_BIN" --addr "127.0.0.1:$WR_PORT" --admin-addr "127.0.0.1:$(free_port)" \
  --origin "http://127.0.0.1:$origin_port" --orders off \
  --admission-batch "$BATCH" --admission-interval-ms 1000 --max-active "$MAX_ACTIVE" \
  --session-idle-secs "$IDLE" --session-max-secs 3600 \
  "${ADDRESS_LIMIT_FLAGS[@]}" >"$TMP/waitroom.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$WR_PORT/_waitroom/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done

log "$VISITORS visitors, $PROCS processes, batch $BATCH/s, maxActive $MAX_ACTIVE, idle ${IDLE}s"
set +e
timeout $((DEADLINE_S + 60)) node "$here/proxy-burst.mjs" --base "http://127.0.0.1:$WR_PORT" \
  --origin-stats "http://127.0.0.1:$origin_port" --visitors "$VISITORS" --procs "$PROCS" \
  --batch "$BATCH" --interval-ms 1000 --poll-ms "$POLL_MS" --deadline-s "$DEADLINE_S" \
  --max-active "$MAX_ACTIVE" >"$TMP/result.json" 2>"$TMP/driver.err"
rc=$?
set -e
cat "$TMP/result.json"
[ -s "$TMP/result.json" ] || { log "the driver wrote nothing (exit $rc)"; tail -20 "$TMP/driver.err" >&2; exit 1; }
unadmitted=$(grep -c '"cookies":\[\]' "$TMP/origin.jsonl" || true)

stamp=$(date -u +%Y%m%dT%H%MZ)
report="docs/benchmarks/proxy-burst-$stamp.md"
python3 - "$TMP/result.json" "$report" "$(nproc)" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" \
  "$(git rev-parse --short HEAD)" "$VISITORS" "$PROCS" "$BATCH" "$MAX_ACTIVE" "$IDLE" "$POLL_MS" "$unadmitted" <<'PY'
import json, sys
res, report, cores, load0, load1, commit, visitors, procs, batch, max_active, idle, poll, unadmitted = sys.argv[1:]
r = json.load(open(res))
ok = lambda c: "met" if c else "**missed**"
lines = [
    f"# A burst at the built-in proxy: the origin's own count ({report.split('-', 2)[2][:-3]})", "",
    f"Command: `VISITORS={visitors} PROCS={procs} BATCH={batch} MAX_ACTIVE={max_active} IDLE={idle} POLL_MS={poll} loadtest/proxy-burst.sh`",
    f"at {commit}: the release build, in-memory store, `--origin` in front of `tests/front/origin.mjs`",
    f"(sessions by the pass cookie, concurrent while active within the last {idle} s, the same as",
    f"`--session-idle-secs {idle}`), admission {batch} a second, maxActive {max_active}.",
    f"Machine: {cores} cores, load average {load0} before, {load1} after (shared; driver, proxy and origin on the same cores).",
    "", "| figure | value | bound | verdict |", "|---|---:|---:|---|",
    f"| visitors that got in | {r['outcomes'].get('in', 0)} of {r['visitors']} | all | {ok(r['outcomes'].get('in', 0) == r['visitors'])} |",
    f"| origin's passes (distinct sessions) | {r['originPasses']} | {r['visitors']} | {ok(r['originPasses'] == r['visitors'])} |",
    f"| origin's peak concurrent sessions | {r['originPeakSessions']} | maxActive {max_active} | {ok(r['originPeakSessions'] <= int(max_active))} |",
    f"| most arrivals in one 1 s window | {r['mostArrivalsInOneInterval']} | {r['allowed']} (rate + one batch) | {ok(r['mostArrivalsInOneInterval'] <= r['allowed'])} |",
    f"| origin requests without a pass cookie | {unadmitted} | 0 | {ok(unadmitted == '0')} |",
    "",
    f"Outcomes: `{json.dumps(r['outcomes'])}`; arrivals {r['arrivalsPerSecond']}/s against {r['configuredPerSecond']}/s configured;",
    f"origin requests {r['originRequests']}; {r['seconds']:.0f} s in all.",
]
open(report, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
log "wrote $report"
exit "$rc"
