#!/usr/bin/env bash
# loadtest/adaptive.sh: admission that follows the order service, charted.
#
# One release waitroom on a redis-server of the script's own (no
# persistence, port chosen here) with --adaptive, and buyers from
# `sse-gen soak` (streams, every admitted buyer orders through the demo
# order service) joining a little faster than the ceiling, so the line
# never empties, and leaving after PATIENCE_SECS on average (exponential),
# so it stays short: the host's own load must not be what slows orders.
# Three phases: healthy, then the demo service slowed on purpose
# (PUT /api/admin/orders/slowdown {"delayMs": SLOW_DELAY_MS}, over the
# target), then restored. Every second the queue's admin JSON is sampled:
# the stored rate (batch × 1000 / intervalMs), the last decision's p95
# claim-to-commit time, its orders and verdict.
# The floor is set where a window holds fewer orders than a decision needs
# (FLOOR/s × WINDOW_MS < MIN_SAMPLES), the state a cut can leave it in, so
# the recovery shows decisions gathered over several windows. The last
# line reports the recovery: seconds from the restore until the rate is
# back to half the healthy phase's highest rate (and to all of it).
# Writes $RESULTS_DIR/adaptive.csv (copied to docs/benchmarks/adaptive.csv)
# and docs/benchmarks/adaptive.svg.
#
# Loopback only; bounded (HEALTHY + SLOW + RECOVERED seconds, 130 by
# default), every process started here is stopped on exit.
#
# env (defaults): HEALTHY (30), SLOW (40), RECOVERED (60), SLOW_DELAY_MS
#   (600), TARGET_MS (250), FLOOR (2), CEILING (30), WINDOW_MS (2000),
#   MIN_SAMPLES (5), JOIN_RATE (32), PATIENCE_SECS (15), RESULTS_DIR
#   (loadtest/results), SKIP_BUILD (unset).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
HEALTHY=${HEALTHY:-30}
SLOW=${SLOW:-40}
RECOVERED=${RECOVERED:-60}
SLOW_DELAY_MS=${SLOW_DELAY_MS:-600}
TARGET_MS=${TARGET_MS:-250}
FLOOR=${FLOOR:-2}
CEILING=${CEILING:-30}
WINDOW_MS=${WINDOW_MS:-2000}
MIN_SAMPLES=${MIN_SAMPLES:-5}
JOIN_RATE=${JOIN_RATE:-32}
PATIENCE_SECS=${PATIENCE_SECS:-15}
RESULTS_DIR=${RESULTS_DIR:-loadtest/results}
mkdir -p "$RESULTS_DIR" "$ROOT/docs/benchmarks"
RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)
CSV=$RESULTS_DIR/adaptive.csv
SVG=$ROOT/docs/benchmarks/adaptive.svg
TMP=$(mktemp -d /tmp/waitroom-adaptive.XXXXXX)
RUN=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
ADMIN_TOKEN=adm$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
TICKET_SECRET=sec$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
GEN=$ROOT/target/release/sse-gen
SERVER_BIN=$ROOT/target/release/waitroom
GEN_PID=""

# shellcheck source=loadtest/lib.sh
source "$ROOT/loadtest/lib.sh"
trap 'stop_pid "$GEN_PID"; cleanup' EXIT
trap 'exit 130' INT TERM

if [[ -z "${SKIP_BUILD:-}" ]]; then
  log "building release binaries"
  cargo build --release --bin waitroom >&2
  cargo build --release -p sse-gen >&2
fi

start_redis
# Passes every 500 ms, so a floor of 2/s is one buyer a pass.
start_server adaptive --admission-batch $((CEILING / 2)) --admission-interval-ms 500 --token-ttl-secs 60 \
  --adaptive --adaptive-floor "$FLOOR" --adaptive-ceiling "$CEILING" \
  --adaptive-target-p95-ms "$TARGET_MS" --adaptive-window-ms "$WINDOW_MS"

admin() { # METHOD PATH [BODY]
  curl -fsS -X "$1" "http://$ADMIN_ADDR$2" -H "Authorization: Bearer $ADMIN_TOKEN" \
    -H 'content-type: application/json' ${3:+-d "$3"}
}
admin PUT /api/admin/queues/default \
  "{\"adaptive\": {\"stepPerSec\": 2, \"factor\": 0.7, \"minSamples\": $MIN_SAMPLES, \"holdWindows\": 1}}" >/dev/null

TOTAL=$((HEALTHY + SLOW + RECOVERED))
log "phases: healthy ${HEALTHY} s, slowed (+${SLOW_DELAY_MS} ms) ${SLOW} s, recovered ${RECOVERED} s"
timeout $((TOTAL + 60)) "$GEN" soak --addrs "$SERVER_ADDR" --admin-addrs "$ADMIN_ADDR" \
  --server-pids "$SERVER_PID" --redis-url "$REDIS_URL" --key-prefix "$PREFIX" \
  --admin-token "$ADMIN_TOKEN" --duration-secs $((TOTAL + 5)) --drain-secs 5 \
  --join-rate "$JOIN_RATE" --configured-rate "$CEILING" --patience-secs "$PATIENCE_SECS" \
  --poll-share 0 --drop-share 0 --order-share 1 --max-buyers 8000 --sample-secs 5 \
  --flat-secs 30 --warmup-secs 10 --out "$TMP/soak" >"$TMP/soak.log" 2>&1 &
GEN_PID=$!

echo "t,phase,rate_per_sec,decided_rate_per_sec,p95_ms,commits,failures,verdict" >"$CSV"
start=$(date +%s.%N)
phase=healthy
while :; do
  t=$(echo "$(date +%s.%N) - $start" | bc -l)
  ti=${t%.*}
  if [[ $phase == healthy && $ti -ge $HEALTHY ]]; then
    admin PUT /api/admin/orders/slowdown "{\"delayMs\": $SLOW_DELAY_MS}" >/dev/null
    phase=slowed
    log "slowed"
  elif [[ $phase == slowed && $ti -ge $((HEALTHY + SLOW)) ]]; then
    admin PUT /api/admin/orders/slowdown '{"delayMs": 0}' >/dev/null
    phase=recovered
    log "recovered"
  fi
  [[ $ti -ge $TOTAL ]] && break
  view=$(admin GET /api/admin/queues/default || echo '{}')
  jq -r --arg t "$(printf '%.1f' "$t")" --arg phase "$phase" '
    [$t, $phase,
     (if .batch then (.batch * 1000 / .intervalMs) else "" end),
     (.adaptiveState.ratePerSec // ""), (.adaptiveState.p95Ms // ""),
     (.adaptiveState.commits // ""), (.adaptiveState.failures // ""),
     (.adaptiveState.verdict // "")] | @csv' <<<"$view" | tr -d '"' >>"$CSV"
  sleep 1
done
stop_pid "$GEN_PID"
GEN_PID=""

# --- the chart: stored rate (left axis) and p95 commit ms (right axis) ---
W=760 H=400 L=60 R=70 T=50 B=50
pw=$((W - L - R)) ph=$((H - T - B))
P95_TOP=$(awk -F, -v d="$SLOW_DELAY_MS" 'NR > 1 && $5 != "" && $5 > m { m = $5 } END { m = (m > d ? m : d); print int(m * 1.2) }' "$CSV")
RATE_TOP=$(echo "$CEILING * 1.2 / 1" | bc)
{
  echo "<svg xmlns='http://www.w3.org/2000/svg' width='$W' height='$H' font-family='sans-serif' font-size='12'>"
  echo "<rect width='$W' height='$H' fill='white'/>"
  echo "<text x='$L' y='20' font-size='14'>Adaptive admission: the rate follows the order service (window ${WINDOW_MS} ms, target p95 ${TARGET_MS} ms)</text>"
  echo "<text x='$L' y='36' font-size='11' fill='#555'>demo order service slowed by ${SLOW_DELAY_MS} ms per order from ${HEALTHY} s to $((HEALTHY + SLOW)) s (shaded); floor ${FLOOR}/s, ceiling ${CEILING}/s</text>"
  sx=$((L + HEALTHY * pw / TOTAL)) ex=$((L + (HEALTHY + SLOW) * pw / TOTAL))
  echo "<rect x='$sx' y='$T' width='$((ex - sx))' height='$ph' fill='#fde0dd'/>"
  echo "<line x1='$L' y1='$((T + ph))' x2='$((L + pw))' y2='$((T + ph))' stroke='black'/>"
  echo "<line x1='$L' y1='$T' x2='$L' y2='$((T + ph))' stroke='black'/>"
  echo "<line x1='$((L + pw))' y1='$T' x2='$((L + pw))' y2='$((T + ph))' stroke='black'/>"
  for i in 0 1 2 3 4; do
    yy=$((T + ph - i * ph / 4))
    echo "<line x1='$L' y1='$yy' x2='$((L + pw))' y2='$yy' stroke='#ddd'/>"
    echo "<text x='$((L - 6))' y='$((yy + 4))' text-anchor='end' fill='#1b9e77'>$((RATE_TOP * i / 4))</text>"
    echo "<text x='$((L + pw + 6))' y='$((yy + 4))' fill='#d95f02'>$((P95_TOP * i / 4))</text>"
  done
  for s in $(seq 0 30 "$TOTAL"); do
    echo "<text x='$((L + s * pw / TOTAL))' y='$((T + ph + 16))' text-anchor='middle'>$s</text>"
  done
  echo "<text x='$((L + pw / 2))' y='$((H - 12))' text-anchor='middle'>seconds</text>"
  ty=$((T + ph - TARGET_MS * ph / P95_TOP))
  echo "<line x1='$L' y1='$ty' x2='$((L + pw))' y2='$ty' stroke='#d95f02' stroke-dasharray='4 4'/>"
  echo "<text x='$((L + 4))' y='$((ty - 4))' fill='#d95f02' font-size='10'>target p95</text>"
  awk -F, -v L="$L" -v T="$T" -v pw="$pw" -v ph="$ph" -v total="$TOTAL" -v rtop="$RATE_TOP" -v ptop="$P95_TOP" '
    NR > 1 {
      x = L + $1 * pw / total
      if ($3 != "") rate = rate sprintf("%.1f,%.1f ", x, T + ph - $3 * ph / rtop)
      if ($5 != "") p95 = p95 sprintf("%.1f,%.1f ", x, T + ph - $5 * ph / ptop)
    }
    END {
      print "<polyline points=\x27" p95 "\x27 fill=\x27none\x27 stroke=\x27#d95f02\x27 stroke-width=\x271.5\x27/>"
      print "<polyline points=\x27" rate "\x27 fill=\x27none\x27 stroke=\x27#1b9e77\x27 stroke-width=\x272.5\x27/>"
    }' "$CSV"
  echo "<text x='$((L + 8))' y='$((T + 14))' fill='#1b9e77'>admission rate, per second (left)</text>"
  echo "<text x='$((L + pw - 8))' y='$((T + 14))' text-anchor='end' fill='#d95f02'>p95 claim-to-commit ms of the last window (right)</text>"
  echo "</svg>"
} >"$SVG"
cp "$CSV" "$ROOT/docs/benchmarks/adaptive.csv"
log "wrote $CSV and $SVG"

# --- the recovery: from the restore to half, and all, of the healthy rate ---
awk -F, -v restored="$((HEALTHY + SLOW))" '
  NR > 1 && $2 == "healthy" && $3 > peak { peak = $3 }
  NR > 1 && $2 == "slowed" && (low == "" || $3 < low) { low = $3 }
  NR > 1 && $2 == "recovered" && half == "" && $3 >= peak / 2 { half = $1 - restored }
  NR > 1 && $2 == "recovered" && full == "" && $3 >= peak { full = $1 - restored }
  END {
    printf "recovery: healthy peak %s/s, lowest while slowed %s/s; back to half (%s/s) %s s after the restore, to the peak %s s after\n",
      peak, low, peak / 2, (half == "" ? "never" : half), (full == "" ? "never" : full)
  }' "$CSV"
