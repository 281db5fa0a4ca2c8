#!/usr/bin/env bash
# loadtest/poll-e2e.sh: polls end to end, waitroom against the plainest
# server that answers a poll with one Lua call (loadtest/plain-join's
# GET /api/queues/{queue}/position, poll.lua), in the same run, on one
# redis-server of the script's own.
#
# Each server gets USERS buyers in line (joined through its own HTTP API;
# waitroom's tickets kept), then wrk polls them round robin (each buyer
# about once every USERS / rate seconds: inside waitroom's per-buyer
# budget of 2 a second) at CONNECTIONS connections for SECS seconds, the
# variants alternated REPEATS times so load from elsewhere hits each
# alike; medians reported. Variants: plain, waitroom (this checkout's
# release build), base (BASE_BIN: another waitroom build, the A/B of a
# change). waitroom runs as the load tests run it: header identity, the
# per-address limits off (the load comes from one address), nobody
# admitted (--max-active 0).
#
# Writes docs/benchmarks/poll-e2e-<UTC>.md (REPORT=0: print only): polls/s,
# the ratio to the plain server, p50/p99, answers other than 200, and the
# Redis and server CPU per poll. Loopback only; every run is bounded (SECS each);
# every process started here is stopped on exit.
#
# env (defaults): USERS (20000), CONNECTIONS (64), SECS (10), REPEATS (3),
#   BASE_BIN (unset), SKIP_BUILD (unset), REPORT (1), NOTE (a line for
#   the report).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
USERS=${USERS:-20000}
CONNECTIONS=${CONNECTIONS:-64}
SECS=${SECS:-10}
REPEATS=${REPEATS:-3}
BASE_BIN=${BASE_BIN:-}
REPORT=${REPORT:-1}
NOTE=${NOTE:-}
TMP=$(mktemp -d /tmp/waitroom-poll.XXXXXX)
# shellcheck source=loadtest/lib.sh
source "$ROOT/loadtest/lib.sh"
trap cleanup EXIT
trap 'exit 130' INT TERM
command -v wrk >/dev/null || { log "wrk is needed (apt-get install wrk)"; exit 1; }

if [[ -z "${SKIP_BUILD:-}" ]]; then
  log "building release binaries"
  cargo build --release --bin waitroom >&2
  cargo build --release -p plain-join >&2
fi
start_redis
VARIANTS="plain waitroom${BASE_BIN:+ base}"
declare -A ADDR PID

# One server per variant, each with its own key prefix on the one Redis.
for variant in $VARIANTS; do
  addr=127.0.0.1:$(free_port)
  case $variant in
  plain)
    target/release/plain-join --addr "$addr" --redis-url "$REDIS_URL" --prefix plain \
      >"$TMP/plain.log" 2>&1 &
    ;;
  *)
    bin=target/release/waitroom
    [[ $variant == base ]] && bin=$BASE_BIN
    "$bin" --addr "$addr" --admin-addr "127.0.0.1:$(free_port)" --redis-url "$REDIS_URL" \
      --key-prefix "$variant" --queues hot --max-active 0 --identity header \
      --ticket-secret "poll-e2e-bench-secret-0123" --drain-secs 1 \
      "${ADDRESS_LIMIT_FLAGS[@]}" >"$TMP/$variant.log" 2>&1 &
    ;;
  esac
  EXTRA_PIDS+=($!)
  PID[$variant]=$!
  wait_ready "$addr"
  ADDR[$variant]=$addr
  log "$variant on $addr: joining $USERS buyers"
  # The line, and each buyer's "user ticket" (plain: no ticket).
  python3 - "$addr" "$USERS" >"$TMP/$variant.users" <<'EOF'
import http.client, json, sys
addr, n = sys.argv[1], int(sys.argv[2])
host, port = addr.split(":")
c = http.client.HTTPConnection(host, int(port))
for i in range(n):
    user = f"poller{i:06d}"
    c.request("POST", "/api/queues/hot/entries", body=b"", headers={"X-User-Id": user})
    r = c.getresponse()
    body = r.read()
    assert r.status in (200, 201), (r.status, body)
    print(user, json.loads(body).get("ticket") or "-")
EOF
done

# wrk: each thread walks the buyers from its own offset, one poll each.
cat >"$TMP/poll.lua" <<'EOF'
local users, tickets, n, i = {}, {}, 0, 0
local threads = 0
function setup(thread)
  thread:set("offset", threads)
  threads = threads + 1
end
function init(args)
  for line in io.lines(args[1]) do
    local u, t = line:match("^(%S+) (%S+)$")
    n = n + 1
    users[n], tickets[n] = u, t
  end
  i = (offset or 0) * math.floor(n / 2)
end
function request()
  i = i % n + 1
  local headers = {["X-User-Id"] = users[i]}
  if tickets[i] ~= "-" then
    headers["X-Queue-Ticket"] = tickets[i]
  end
  return wrk.format("GET", "/api/queues/hot/position", headers)
end
EOF

# CPU seconds a process has used (user + system).
cpu_of() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }

# run VARIANT OUT: one measured run; OUT.res gets "rate p50 p99 non200
# redis-µs server-µs", OUT.wrk what wrk said.
run() {
  local variant=$1 out=$2
  local r0 r1 s0 s1 requests
  r0=$(redis_cpu) s0=$(cpu_of "${PID[$variant]}")
  wrk -t2 -c"$CONNECTIONS" -d"${SECS}s" --latency -s "$TMP/poll.lua" "http://${ADDR[$variant]}" \
    -- "$TMP/$variant.users" >"$out.wrk" 2>&1
  r1=$(redis_cpu) s1=$(cpu_of "${PID[$variant]}")
  requests=$(awk '/requests in/ { print $1 }' "$out.wrk")
  awk -v r0="$r0" -v r1="$r1" -v s0="$s0" -v s1="$s1" -v n="$requests" '
    function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
    /Requests\/sec/ { rate = $2 }
    /^ +50%/ { p50 = ms($2) }
    /^ +99%/ { p99 = ms($2) }
    /Non-2xx/ { bad = $NF }
    END { printf "%s %s %s %d %.2f %.2f\n", rate, p50, p99, bad, (r1 - r0) * 1e6 / n, (s1 - s0) * 1e6 / n }' "$out.wrk" >"$out.res"
}

median() {
  awk '{ for (i = 1; i <= NF; i++) v[i, NR] = $i; nf = NF }
    END {
      for (i = 1; i <= nf; i++) {
        for (j = 1; j <= NR; j++) c[j] = v[i, j]
        for (j = 2; j <= NR; j++) { x = c[j]; k = j - 1; while (k >= 1 && c[k] > x) { c[k + 1] = c[k]; k-- } c[k + 1] = x }
        printf "%s%s", c[int((NR + 1) / 2)], (i < nf ? " " : "\n")
      }
    }' "$@"
}

for r in $(seq 1 "$REPEATS"); do
  for variant in $VARIANTS; do
    log "run $r: $variant"
    run "$variant" "$TMP/$variant-$r"
  done
done

STAMP=$(date -u +%Y%m%dT%H%MZ)
read -r plain_rate _ <<<"$(median "$TMP"/plain-*.res)"
{
  echo "# Polls end to end, $STAMP"
  echo
  [[ -n "$NOTE" ]] && { echo "$NOTE"; echo; }
  echo "- Command: \`USERS=$USERS CONNECTIONS=$CONNECTIONS SECS=$SECS REPEATS=$REPEATS${BASE_BIN:+ BASE_BIN=…} loadtest/poll-e2e.sh\`"
  echo "- Commit: $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (with uncommitted changes)')"
  echo "- Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; wrk, the servers and Redis share the cores"
  echo "- Redis: $(redis-server --version | awk '{print $3}' | cut -d= -f2), private, no persistence"
  echo "- How: $USERS buyers in line per server, polled round robin by wrk (2 threads, $CONNECTIONS connections, $SECS s a run), the variants alternated $REPEATS times; medians. The baseline: loadtest/plain-join (one Lua call a poll: ZRANK, ZCARD; the JSON of waitroom's shape; no ticket, budget, presence or entry time)."
  echo
  echo "| variant | polls/s | × plain | p50 ms | p99 ms | answers not 200 | Redis CPU µs/poll | server CPU µs/poll |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  for variant in $VARIANTS; do
    read -r rate p50 p99 bad rus sus <<<"$(median "$TMP/$variant"-*.res)"
    printf '| %s | %.0f | %.2f | %.2f | %.2f | %d | %.1f | %.1f |\n' "$variant" "$rate" \
      "$(echo "$rate / $plain_rate" | bc -l)" "$p50" "$p99" "$bad" "$rus" "$sus"
  done
} >"$TMP/report.md"
cat "$TMP/report.md"
if [[ "$REPORT" == 1 ]]; then
  cp "$TMP/report.md" "docs/benchmarks/poll-e2e-$STAMP.md"
  log "wrote docs/benchmarks/poll-e2e-$STAMP.md"
fi
