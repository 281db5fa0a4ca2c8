#!/usr/bin/env bash
# loadtest/group-commit.sh: a hot queue past one script call per join.
#
# A burst of BURST joins on ONE queue (`sse-gen burst`: closed loop, each
# connection sends its next distinct user's join as soon as the last one
# answered), against, in the same run and on the same redis-server of the
# script's own (no persistence, port chosen here):
#   plain  the baseline: loadtest/plain-join, the plainest axum server that
#          makes one Lua call per join
#   off    waitroom, one script call per join (--join-batch-max 1)
#   on     waitroom with group commit (its defaults)
#   base   with BASE_BIN set: that waitroom binary (the build before a
#          change) with its defaults, the A/B of a change in the same run
# at each concurrency of CONCURRENCY, REPEATS times each (interleaved, so
# load from elsewhere hits every variant alike; the median is reported),
# then the window sweep at 64 connections (WINDOWS, microseconds) and the
# depth sweep (DEPTHS, groups of one queue in flight) at DEPTH_CONCURRENCY.
# Writes $RESULTS_DIR/group-commit.md (the table: joins/s, ratio to the
# baseline, p50/p99, the CPU each process spent per join: Redis, server
# and the generator, which shares the cores) and
# docs/benchmarks/group-commit.svg (the curve).
#
# Loopback only; every run is bounded (BURST joins, RUN_SECS each) and
# every process started here is stopped on exit.
#
# env (defaults): BURST (10000), CONCURRENCY ("16 64 256"), REPEATS (3),
#   WINDOWS ("0 250 1000 2000"), DEPTHS ("1 2 4"), DEPTH_CONCURRENCY
#   ("16 64"; an empty WINDOWS, DEPTHS or DEPTH_CONCURRENCY skips that
#   sweep), RUN_SECS (60), RESULTS_DIR
#   (loadtest/results), SKIP_BUILD (unset), BASE_BIN (unset),
#   EXTRA_VARIANTS (unset; e.g. "m256": grouping on with --join-batch-max
#   256, "d1": depth 1), REDIS_CPU_PERCENT (unset: Redis runs free),
#   REDIS_OWN_CORE (unset: every process on every core; set: Redis
#   alone on the last core, the servers and generator on the others).
#   REDIS_CPU_PERIOD_MS (100: the cap's accounting period; Redis runs
#   at most N % of each period, so a shorter one stalls it for shorter
#   spells; the quota, N % of it, must be at least 1 ms).
#
# REDIS_CPU_PERCENT=N caps the script's redis-server at N % of one core
# (a cgroup v1 CPU quota; needs root and /sys/fs/cgroup/cpu). On this
# machine the generator, the servers and Redis share two cores, so without
# it the end-to-end rate follows the total CPU per join; with Redis
# capped, Redis is the scarce core as on a deployment where one hot
# queue's Redis core is what runs out, and every variant meets the same
# cap in the same run.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
BURST=${BURST:-10000}
CONCURRENCY=${CONCURRENCY:-16 64 256}
REPEATS=${REPEATS:-3}
WINDOWS=${WINDOWS-0 250 1000 2000}
DEPTHS=${DEPTHS-1 2 4}
DEPTH_CONCURRENCY=${DEPTH_CONCURRENCY-16 64}
RUN_SECS=${RUN_SECS:-60}
RESULTS_DIR=${RESULTS_DIR:-loadtest/results}
REDIS_CPU_PERCENT=${REDIS_CPU_PERCENT:-}
REDIS_OWN_CORE=${REDIS_OWN_CORE:-}
REDIS_CPU_PERIOD_MS=${REDIS_CPU_PERIOD_MS:-100}
SVG=$ROOT/docs/benchmarks/group-commit${REDIS_CPU_PERCENT:+-redis-capped}${REDIS_OWN_CORE:+-own-core}.svg
mkdir -p "$RESULTS_DIR"
RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)
TMP=$(mktemp -d /tmp/waitroom-group.XXXXXX)
GEN=$ROOT/target/release/sse-gen
SERVER_BIN=$ROOT/target/release/waitroom
PLAIN_BIN=$ROOT/target/release/plain-join
# shellcheck source=loadtest/lib.sh
source "$ROOT/loadtest/lib.sh"
BASE_BIN=${BASE_BIN:-}
VARIANTS="plain off on${BASE_BIN:+ base}${EXTRA_VARIANTS:+ $EXTRA_VARIANTS}"
trap cleanup EXIT
trap 'exit 130' INT TERM
ulimit -n "$(ulimit -Hn)"

if [[ -z "${SKIP_BUILD:-}" ]]; then
  log "building release binaries"
  cargo build --release --bin waitroom >&2
  cargo build --release -p sse-gen -p plain-join >&2
fi

REDIS_MAXCLIENTS=10000 start_redis
if [[ -n "$REDIS_OWN_CORE" ]]; then
  # Redis on the last core, everything started after this (servers,
  # generator) on the others: as deployed, where Redis has a core of its
  # own and no buyer-facing process competes with it for that core's time
  # and caches.
  last=$(($(nproc) - 1))
  ((last >= 1)) || { log "REDIS_OWN_CORE needs at least two cores"; exit 1; }
  taskset -a -pc "$last" "$REDIS_PID" >/dev/null
  taskset -pc "0-$((last - 1))" $$ >/dev/null
  log "redis-server alone on core $last; servers and generator on 0-$((last - 1))"
fi
if [[ -n "$REDIS_CPU_PERCENT" ]]; then
  CGROUP=/sys/fs/cgroup/cpu/waitroom-group-commit-$$
  mkdir "$CGROUP"
  echo $((REDIS_CPU_PERIOD_MS * 1000)) >"$CGROUP/cpu.cfs_period_us"
  echo $((REDIS_CPU_PERCENT * REDIS_CPU_PERIOD_MS * 10)) >"$CGROUP/cpu.cfs_quota_us"
  echo "$REDIS_PID" >"$CGROUP/cgroup.procs"
  trap 'cleanup; rmdir "$CGROUP" 2>/dev/null || true' EXIT
  log "redis-server capped at $REDIS_CPU_PERCENT % of one core ($CGROUP)"
fi

# start VARIANT: a fresh server on an empty Redis; sets SERVER_ADDR.
start() {
  local variant=$1
  stop_pid "$SERVER_PID"
  redis-cli -p "$REDIS_PORT" flushall >/dev/null
  SERVER_ADDR=127.0.0.1:$(free_port)
  case $variant in
  plain)
    "$PLAIN_BIN" --addr "$SERVER_ADDR" --redis-url "$REDIS_URL" >"$TMP/server.log" 2>&1 &
    ;;
  *)
    local flags=() bin=$SERVER_BIN
    [[ $variant == base ]] && bin=$BASE_BIN
    case $variant in
    off) flags=(--join-batch-max 1) ;;
    on) flags=() ;;
    w*) flags=(--join-batch-window-us "${variant#w}") ;;
    d*) flags=(--join-batch-depth "${variant#d}") ;;
    m*) flags=(--join-batch-max "${variant#m}") ;;
    esac
    # Everyone waits (no admission, no fast track) as on the baseline;
    # the per-address limits are off: the burst comes from ten addresses.
    "$bin" --addr "$SERVER_ADDR" --admin-addr "127.0.0.1:$(free_port)" \
      --redis-url "$REDIS_URL" --key-prefix gc --queues hot,warm --max-active 0 \
      --identity header --ticket-secret "group-commit-bench-secret" --drain-secs 1 \
      "${ADDRESS_LIMIT_FLAGS[@]}" "${flags[@]}" >"$TMP/server.log" 2>&1 &
    ;;
  esac
  SERVER_PID=$!
  wait_ready "$SERVER_ADDR"
}

# CPU seconds the server process has used (Redis: `redis_cpu`, lib.sh).
server_cpu() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$SERVER_PID/stat"; }

# burst VARIANT CONCURRENCY OUT: one measured burst on queue `hot` after a
# short warm-up on queue `warm` (connections, script cache, allocator);
# OUT.cpu gets the CPU µs per join Redis, the server and the generator
# spent on it.
burst() {
  local variant=$1 conc=$2 out=$3
  start "$variant"
  "$GEN" burst --addr "$SERVER_ADDR" --queue warm --users 1000 --concurrency "$conc" \
    --duration-secs "$RUN_SECS" --out "$TMP/warm.json" >/dev/null
  local r0 s0
  r0=$(redis_cpu) s0=$(server_cpu)
  /usr/bin/time -f '%U %S' -o "$out.gen" "$GEN" burst --addr "$SERVER_ADDR" --queue hot --users "$BURST" \
    --concurrency "$conc" --duration-secs "$RUN_SECS" --out "$out" >&2
  echo "$(echo "($(redis_cpu) - $r0) * 1000000 / $BURST" | bc -l) $(echo "($(server_cpu) - $s0) * 1000000 / $BURST" | bc -l)" \
    "$(awk -v n="$BURST" '{ print ($1 + $2) * 1000000 / n }' "$out.gen")" >"$out.cpu"
  local created
  created=$(jq '.created_201' "$out")
  [[ "$created" == "$BURST" ]] || log "WARNING: $variant c=$conc placed $created of $BURST"
}

# median FILE...: "rate p50 p99 redis-µs server-µs gen-µs", each the median of
# its own column over the runs.
median() {
  for f in "$@"; do
    echo "$(jq -r '"\(.enters_per_s) \(.latency_ms.p50) \(.latency_ms.p99)"' "$f") $(cat "$f.cpu")"
  done | awk '{ for (i = 1; i <= NF; i++) v[i, NR] = $i; nf = NF }
    END {
      for (i = 1; i <= nf; i++) {
        for (j = 1; j <= NR; j++) c[j] = v[i, j]
        # insertion sort of column i
        for (j = 2; j <= NR; j++) { x = c[j]; k = j - 1; while (k >= 1 && c[k] > x) { c[k + 1] = c[k]; k-- } c[k + 1] = x }
        printf "%s%s", c[int((NR + 1) / 2)], (i < nf ? " " : "\n")
      }
    }'
}

declare -A RESULT
for conc in $CONCURRENCY; do
  for r in $(seq 1 "$REPEATS"); do
    for variant in $VARIANTS; do
      log "c=$conc run $r: $variant"
      burst "$variant" "$conc" "$TMP/$variant-$conc-$r.json"
    done
  done
  for variant in $VARIANTS; do
    RESULT[$variant-$conc]=$(median "$TMP/$variant-$conc-"*.json)
  done
done
for w in $WINDOWS; do
  for r in $(seq 1 "$REPEATS"); do
    log "c=64 window ${w} us run $r"
    burst "w$w" 64 "$TMP/w$w-$r.json"
  done
  RESULT[w$w]=$(median "$TMP/w$w-"*.json)
done
for conc in $DEPTH_CONCURRENCY; do
  for d in $DEPTHS; do
    for r in $(seq 1 "$REPEATS"); do
      log "c=$conc depth $d run $r"
      burst "d$d" "$conc" "$TMP/d$d-$conc-$r.json"
    done
    RESULT[d$d-$conc]=$(median "$TMP/d$d-$conc-"*.json)
  done
done
stop_pid "$SERVER_PID"
SERVER_PID=""

# --- the table ------------------------------------------------------------
MD=$RESULTS_DIR/group-commit${REDIS_CPU_PERCENT:+-redis-capped}${REDIS_OWN_CORE:+-own-core}.md
{
  echo "Group commit: a burst of $BURST joins on one queue, closed loop; median of $REPEATS runs; $(nproc --all) cores, generator, server and Redis on one machine; load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; $(date -u +%F)${REDIS_CPU_PERCENT:+; Redis capped at $REDIS_CPU_PERCENT % of one core (period $REDIS_CPU_PERIOD_MS ms)}${REDIS_OWN_CORE:+; Redis alone on the last core, the rest on the others}."
  echo
  echo "Redis CPU per join bounds what one queue (one Redis core) can take: 10^6 / that µs is its ceiling, and the ratio of the baseline's to a variant's is that ceiling against the baseline's."
  echo
  echo "| connections | variant | joins/s | × baseline | p50 ms | p99 ms | Redis CPU µs/join | Redis ceiling × baseline | server CPU µs/join | generator CPU µs/join | total CPU µs/join |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  for conc in $CONCURRENCY; do
    read -r base _ _ rbase _ <<<"${RESULT[plain-$conc]}"
    for variant in $VARIANTS; do
      read -r rate p50 p99 rus sus gus <<<"${RESULT[$variant-$conc]}"
      printf '| %s | %s | %.0f | %.2f | %.1f | %.1f | %.1f | %.2f | %.0f | %.0f | %.0f |\n' "$conc" "$variant" "$rate" \
        "$(echo "$rate / $base" | bc -l)" "$p50" "$p99" "$rus" "$(echo "$rbase / $rus" | bc -l)" "$sus" "$gus" \
        "$(echo "$rus + $sus + $gus" | bc -l)"
    done
  done
  if [[ -n "$WINDOWS" ]]; then
    echo
    echo "Window sweep at 64 connections (--join-batch-window-us; baseline as above):"
    echo
    echo "| window µs | joins/s | × baseline | p50 ms | p99 ms | Redis CPU µs/join | Redis ceiling × baseline | server CPU µs/join | generator CPU µs/join |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    read -r base _ _ rbase _ <<<"${RESULT[plain-64]:-1 0 0 1 0 0}"
    for w in $WINDOWS; do
      read -r rate p50 p99 rus sus gus <<<"${RESULT[w$w]}"
      printf '| %s | %.0f | %.2f | %.1f | %.1f | %.1f | %.2f | %.0f | %.0f |\n' "$w" "$rate" "$(echo "$rate / $base" | bc -l)" \
        "$p50" "$p99" "$rus" "$(echo "$rbase / $rus" | bc -l)" "$sus" "$gus"
    done
  fi
  if [[ -n "$DEPTHS" ]]; then
    echo
    echo "Depth sweep (--join-batch-depth: groups of one queue in flight; baseline and grouping off as above):"
    echo
    echo "| connections | depth | joins/s | × baseline | × grouping off | p50 ms | p99 ms | Redis CPU µs/join | Redis ceiling × baseline | server CPU µs/join |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    for conc in $DEPTH_CONCURRENCY; do
      read -r base _ _ rbase _ <<<"${RESULT[plain-$conc]:-1 0 0 1 0 0}"
      read -r off _ <<<"${RESULT[off-$conc]:-1 0 0 1 0 0}"
      for d in $DEPTHS; do
        read -r rate p50 p99 rus sus gus <<<"${RESULT[d$d-$conc]}"
        printf '| %s | %s | %.0f | %.2f | %.2f | %.1f | %.1f | %.1f | %.2f | %.0f |\n' "$conc" "$d" "$rate" \
          "$(echo "$rate / $base" | bc -l)" "$(echo "$rate / $off" | bc -l)" "$p50" "$p99" "$rus" \
          "$(echo "$rbase / $rus" | bc -l)" "$sus"
      done
    done
  fi
} >"$MD"
cat "$MD"

# --- the curve: joins/s over connections, one line per variant ----------
mkdir -p "$(dirname "$SVG")"
{
  concs=($CONCURRENCY)
  max=1
  for conc in "${concs[@]}"; do
    for variant in $VARIANTS; do
      read -r rate _ <<<"${RESULT[$variant-$conc]}"
      max=$(echo "if ($rate > $max) $rate else $max" | bc -l)
    done
  done
  top=$(echo "($max * 1.15) / 1" | bc)
  W=640 H=380 L=70 R=150 T=40 B=50
  pw=$((W - L - R)) ph=$((H - T - B)) n=${#concs[@]}
  x() { echo $((L + (n > 1 ? $1 * pw / (n - 1) : pw / 2))); }
  y() { echo "$T + $ph - $1 * $ph / $top" | bc -l | xargs printf '%.0f'; }
  echo "<svg xmlns='http://www.w3.org/2000/svg' width='$W' height='$H' font-family='sans-serif' font-size='12'>"
  echo "<rect width='$W' height='$H' fill='white'/>"
  echo "<text x='$L' y='22' font-size='14'>Joins/s on one queue, burst of $BURST (median of $REPEATS); p99 ms at each point</text>"
  echo "<line x1='$L' y1='$((T + ph))' x2='$((L + pw))' y2='$((T + ph))' stroke='black'/>"
  echo "<line x1='$L' y1='$T' x2='$L' y2='$((T + ph))' stroke='black'/>"
  for i in 0 1 2 3 4; do
    v=$((top * i / 4))
    yy=$(y "$v")
    echo "<line x1='$L' y1='$yy' x2='$((L + pw))' y2='$yy' stroke='#ddd'/><text x='$((L - 6))' y='$((yy + 4))' text-anchor='end'>$v</text>"
  done
  for i in "${!concs[@]}"; do
    echo "<text x='$(x "$i")' y='$((T + ph + 18))' text-anchor='middle'>${concs[$i]}</text>"
  done
  echo "<text x='$((L + pw / 2))' y='$((H - 10))' text-anchor='middle'>connections (closed loop)</text>"
  declare -A COLOR=([plain]='#888888' [off]='#d95f02' [on]='#1b9e77' [base]='#7570b3')
  declare -A NAME=([plain]='baseline: one Lua call per join' [off]='waitroom, grouping off' [on]='waitroom, grouping on' [base]='the build before, grouping on')
  k=0
  for variant in $VARIANTS; do
    pts=""
    for i in "${!concs[@]}"; do
      read -r rate _ p99 _ <<<"${RESULT[$variant-${concs[$i]}]}"
      pts+="$(x "$i"),$(y "$rate") "
    done
    echo "<polyline points='$pts' fill='none' stroke='${COLOR[$variant]:-#e7298a}' stroke-width='2'/>"
    for i in "${!concs[@]}"; do
      read -r rate _ p99 _ <<<"${RESULT[$variant-${concs[$i]}]}"
      xx=$(x "$i") yy=$(y "$rate")
      echo "<circle cx='$xx' cy='$yy' r='3' fill='${COLOR[$variant]:-#e7298a}'/><text x='$((xx + 5))' y='$((yy - 5))' fill='${COLOR[$variant]:-#e7298a}' font-size='10'>$(printf '%.0f' "$p99")</text>"
    done
    ly=$((T + 10 + k * 34))
    echo "<line x1='$((L + pw + 10))' y1='$ly' x2='$((L + pw + 30))' y2='$ly' stroke='${COLOR[$variant]:-#e7298a}' stroke-width='2'/>"
    echo "<text x='$((L + pw + 34))' y='$((ly + 4))' font-size='10'>${NAME[$variant]:-waitroom $variant}</text>"
    k=$((k + 1))
  done
  echo "</svg>"
} >"$SVG"
log "wrote $MD and $SVG"
