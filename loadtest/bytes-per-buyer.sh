#!/usr/bin/env bash
# loadtest/bytes-per-buyer.sh: what a waiting buyer costs in Redis.
#
# Starts a redis-server of its own (no persistence, a free port) and a
# release waitroom on it with admission closed (--max-active 0: everyone
# waits), joins WAITING distinct buyers with `sse-gen burst` (closed loop,
# 64 connections, from ten loopback addresses), and reports
#   (used_memory after - used_memory before) / waiting
# plus MEMORY USAGE of each of the queue's keys (every element counted).
# With BASELINE_BIN (another waitroom binary, e.g. a build of an earlier
# commit), the same is measured with it first, in the same run.
# Writes $RESULTS_DIR/bytes-per-buyer.md. Loopback only, bounded by
# WAITING joins and RUN_SECS each; every process started here is stopped
# on exit.
#
# env (defaults): WAITING (200000), RUN_SECS (600), RESULTS_DIR
#   (loadtest/results), BASELINE_BIN (unset), SKIP_BUILD (unset).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
WAITING=${WAITING:-200000}
RUN_SECS=${RUN_SECS:-600}
RESULTS_DIR=${RESULTS_DIR:-loadtest/results}
mkdir -p "$RESULTS_DIR"
RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)
TMP=$(mktemp -d /tmp/waitroom-bytes.XXXXXX)
# shellcheck source=loadtest/lib.sh
source "$ROOT/loadtest/lib.sh"
trap cleanup EXIT
trap 'exit 130' INT TERM
ulimit -n "$(ulimit -Hn)"

if [[ -z "${SKIP_BUILD:-}" ]]; then
  cargo build --release --bin waitroom >&2
  cargo build --release -p sse-gen >&2
fi

REDIS_MAXCLIENTS=10000 start_redis
R() { redis-cli -p "$REDIS_PORT" "$@"; }
used() { R info memory | awk -F: '$1 == "used_memory" { print $2 + 0 }'; }

# measure BIN LABEL: a fresh server of BIN on an empty Redis, WAITING
# joins; appends a table row and the per-key sizes to $ROWS / $KEYS_MD.
measure() {
  local bin=$1 label=$2
  R flushall >/dev/null
  local addr=127.0.0.1:$(free_port)
  "$bin" --addr "$addr" --admin-addr "127.0.0.1:$(free_port)" \
    --redis-url "$REDIS_URL" --key-prefix b --queues hot --max-active 0 \
    --identity header --ticket-secret "bytes-per-buyer-secret" --drain-secs 1 \
    "${ADDRESS_LIMIT_FLAGS[@]}" >"$TMP/server.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "$addr"
  # One join first, so the queue's fixed keys exist before the baseline.
  curl -fsS -X POST -H 'X-User-Id: first' "http://$addr/api/queues/hot/entries" >/dev/null
  local before after n added
  before=$(used)
  "$ROOT/target/release/sse-gen" burst --addr "$addr" --queue hot --users "$WAITING" \
    --concurrency 64 --duration-secs "$RUN_SECS" --out "$TMP/burst.json" >&2
  after=$(used)
  n=$(R zcard 'b:{hot}:waiting')
  added=$((n - 1))
  echo "| $label | $added | $(jq -r '.enters_per_s | floor' "$TMP/burst.json") | $(((after - before) / added)) |" >>"$ROWS"
  for key in waiting seen entered seq bucket pass; do
    local bytes
    bytes=$(R memory usage "b:{hot}:$key" samples 0)
    echo "| $label | \`b:{hot}:$key\` | ${bytes:-0} | $((${bytes:-0} / added)) |" >>"$KEYS_MD"
  done
  stop_pid "$SERVER_PID"
  SERVER_PID=""
}

ROWS=$TMP/rows.md
KEYS_MD=$TMP/keys.md
: >"$ROWS"
: >"$KEYS_MD"
if [[ -n "${BASELINE_BIN:-}" ]]; then
  measure "$BASELINE_BIN" baseline
fi
measure "$ROOT/target/release/waitroom" "this build"
{
  echo "Redis memory per waiting buyer (user ids like \`b1a2b3c-123456\`, 64 connections), $(date -u +%F)."
  echo
  echo "| server | waiting | joins/s | used_memory delta / waiting (bytes) |"
  echo "| --- | --- | --- | --- |"
  cat "$ROWS"
  echo
  echo "| server | key | MEMORY USAGE (bytes) | per buyer |"
  echo "| --- | --- | --- | --- |"
  cat "$KEYS_MD"
} >"$RESULTS_DIR/bytes-per-buyer.md"
cat "$RESULTS_DIR/bytes-per-buyer.md"
