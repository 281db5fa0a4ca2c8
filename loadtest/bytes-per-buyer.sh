#!/usr/bin/env bash
# loadtest/bytes-per-buyer.sh: what a waiting buyer costs in Redis.
#
# Starts a redis-server of its own (no persistence, a free port) and a
# release waitroom on it with admission closed (--max-active 0: everyone
# waits), joins WAITING distinct buyers with `sse-gen burst` (closed loop,
# 64 connections, from ten loopback addresses), and reports
#   (used_memory after - used_memory before) / waiting
# plus MEMORY USAGE of each of the queue's keys (every element counted).
# Writes $RESULTS_DIR/bytes-per-buyer.md. Loopback only, bounded by
# WAITING joins and RUN_SECS; every process started here is stopped on exit.
#
# env (defaults): WAITING (200000), RUN_SECS (600), RESULTS_DIR
#   (loadtest/results), SKIP_BUILD (unset).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
WAITING=${WAITING:-200000}
RUN_SECS=${RUN_SECS:-600}
RESULTS_DIR=${RESULTS_DIR:-loadtest/results}
mkdir -p "$RESULTS_DIR"
RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)
TMP=$(mktemp -d /tmp/waitroom-bytes.XXXXXX)
REDIS_PID=""
SERVER_PID=""

log() { printf '[bytes-per-buyer.sh %s] %s\n' "$(date +%T)" "$*" >&2; }
stop_pid() {
  local pid=$1
  [[ -n "$pid" ]] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL "$pid" 2>/dev/null || true
}
cleanup() {
  stop_pid "$SERVER_PID"
  stop_pid "$REDIS_PID"
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ulimit -n "$(ulimit -Hn)"

if [[ -z "${SKIP_BUILD:-}" ]]; then
  cargo build --release --bin waitroom -p sse-gen >&2
fi
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 12000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

PORT=$(free_port)
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$TMP" \
  --logfile "$TMP/redis.log" &
REDIS_PID=$!
R() { redis-cli -p "$PORT" "$@"; }
for _ in $(seq 1 50); do R ping >/dev/null 2>&1 && break; sleep 0.1; done
ADDR=127.0.0.1:$(free_port)
"$ROOT/target/release/waitroom" --addr "$ADDR" --admin-addr "127.0.0.1:$(free_port)" \
  --redis-url "redis://127.0.0.1:$PORT" --key-prefix b --queues hot --max-active 0 \
  --identity header --ticket-secret "bytes-per-buyer-secret" --drain-secs 1 \
  --joins-per-address-per-minute 0 --places-per-address 0 \
  --visitors-per-address-per-minute 0 --streams-per-address 0 >"$TMP/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 100); do curl -fsS "http://$ADDR/readyz" >/dev/null 2>&1 && break; sleep 0.1; done

used() { R info memory | awk -F: '$1 == "used_memory" { print $2 + 0 }'; }
# One join first, so the queue's fixed keys exist before the baseline.
curl -fsS -X POST -H 'X-User-Id: first' "http://$ADDR/api/queues/hot/entries" >/dev/null
BEFORE=$(used)
"$ROOT/target/release/sse-gen" burst --addr "$ADDR" --queue hot --users "$WAITING" \
  --concurrency 64 --duration-secs "$RUN_SECS" --out "$TMP/burst.json" >&2
AFTER=$(used)
N=$(R zcard 'b:{hot}:waiting')
ADDED=$((N - 1))
{
  echo "Redis memory per waiting buyer: $ADDED buyers joined (user ids like \`b1a2b3c-123456\`, $(jq -r '.enters_per_s | floor' "$TMP/burst.json") joins/s), $(date -u +%F)."
  echo
  echo "| measure | bytes |"
  echo "| --- | --- |"
  echo "| used_memory delta / waiting | $(((AFTER - BEFORE) / ADDED)) |"
  for key in waiting seen since seq bucket pass; do
    bytes=$(R memory usage "b:{hot}:$key" samples 0)
    echo "| MEMORY USAGE b:{hot}:$key | ${bytes:-0} ($(( ${bytes:-0} / ADDED )) per buyer) |"
  done
  echo "| keys in the database | $(R dbsize) |"
} >"$RESULTS_DIR/bytes-per-buyer.md"
cat "$RESULTS_DIR/bytes-per-buyer.md"
