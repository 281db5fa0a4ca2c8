#!/usr/bin/env bash
# loadtest/soak.sh: waitroom's soak test (not part of CI).
#
# Two waitroom instances on ONE redis-server of its own (free port, no
# persistence; the shared one on 6379 is never touched), and `sse-gen soak`
# driving them for DURATION: steady joins, leaves, streams that drop and
# reopen on the other instance, polls, orders and token expiry. Then the
# waiting crowd leaves and the run waits for descriptors and Redis keys to
# come back. Every SAMPLE_SECS it records RSS and open descriptors per
# instance, Redis used_memory and key count, streams, and the admission
# rate; it writes $RESULTS_DIR/soak-<time>.{json,md,svg} and exits non-zero
# when a pass criterion fails:
#   - RSS and Redis used_memory flat: <= 5 % growth over the last 20 min of
#     the load (its last two thirds when shorter);
#   - descriptors back to baseline (+2) after the crowd left;
#   - Redis back to its constant keys (bucket, pass, sequence, secret);
#   - admission = the configured rate (+-10 % per sample) throughout.
#
# Loopback only; bounded: at most DURATION + DRAIN + 2 min; every process
# started here is stopped on exit.
#
# env (defaults): DURATION (30m; s/m suffix), JOIN_RATE (30 per s),
#   BATCH (10) and INTERVAL_MS (500): 20 admissions per s,
#   TOKEN_TTL_SECS (60), PATIENCE_SECS (120, mean; ~(JOIN_RATE - rate) *
#   PATIENCE waiting at steady state, reached after ~3 x PATIENCE: keep
#   that inside the first third of DURATION), POLL_SHARE (0.2), DROP_SHARE (0.3),
#   ORDER_SHARE (0.6), DRAIN_SECS (240), SAMPLE_SECS (10),
#   RESULTS_DIR (loadtest/results), SKIP_BUILD (unset).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD

DURATION=${DURATION:-30m}
case "$DURATION" in
  *m) DURATION_SECS=$((${DURATION%m} * 60)) ;;
  *s) DURATION_SECS=${DURATION%s} ;;
  *) DURATION_SECS=$DURATION ;;
esac
((DURATION_SECS >= 60 && DURATION_SECS <= 1800)) || { echo "DURATION must be 1-30 min" >&2; exit 2; }
JOIN_RATE=${JOIN_RATE:-30}
BATCH=${BATCH:-10}
INTERVAL_MS=${INTERVAL_MS:-500}
TOKEN_TTL_SECS=${TOKEN_TTL_SECS:-60}
PATIENCE_SECS=${PATIENCE_SECS:-120}
POLL_SHARE=${POLL_SHARE:-0.2}
DROP_SHARE=${DROP_SHARE:-0.3}
ORDER_SHARE=${ORDER_SHARE:-0.6}
DRAIN_SECS=${DRAIN_SECS:-240}
SAMPLE_SECS=${SAMPLE_SECS:-10}
RESULTS_DIR=${RESULTS_DIR:-loadtest/results}
RATE=$(awk -v b="$BATCH" -v i="$INTERVAL_MS" 'BEGIN { printf "%g", b * 1000 / i }')

mkdir -p "$RESULTS_DIR"
RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)
TMP=$(mktemp -d /tmp/waitroom-soak.XXXXXX)
RUN=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
ADMIN_TOKEN=adm$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
TICKET_SECRET=sec$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
GEN=$ROOT/target/release/sse-gen
SERVER_BIN=$ROOT/target/release/waitroom
STAMP=$(date -u +%Y%m%dT%H%MZ)
OUT=$RESULTS_DIR/soak-$STAMP

PIDS=()
log() { printf '[soak.sh %s] %s\n' "$(date +%T)" "$*" >&2; }

stop_pid() {
  local pid=$1
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL "$pid" 2>/dev/null || true
}
cleanup() {
  for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ulimit -n "$(ulimit -Hn)"

if [[ -z "${SKIP_BUILD:-}" ]]; then
  log "building release binaries"
  cargo build --release --bin waitroom >&2
  cargo build --release -p sse-gen >&2
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

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$TMP" --logfile "$TMP/redis.log" &
PIDS+=($!)
for _ in $(seq 1 50); do
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -p "$REDIS_PORT" ping >/dev/null
REDIS_URL=redis://127.0.0.1:$REDIS_PORT
PREFIX=soak-$RUN
log "redis-server on port $REDIS_PORT"

ADDRS=() ADMINS=() SERVER_PIDS=()
for i in 1 2; do
  addr=127.0.0.1:$(free_port)
  admin=127.0.0.1:$(free_port)
  "$SERVER_BIN" --addr "$addr" --admin-addr "$admin" --redis-url "$REDIS_URL" --key-prefix "$PREFIX" \
    --orders-db "$TMP/orders-$i.db" --admin-token "$ADMIN_TOKEN" --ticket-secret "$TICKET_SECRET" \
    --identity header --drain-secs 1 \
    --admission-batch "$BATCH" --admission-interval-ms "$INTERVAL_MS" --token-ttl-secs "$TOKEN_TTL_SECS" \
    --joins-per-address-per-minute 0 --places-per-address 0 \
    --visitors-per-address-per-minute 0 --streams-per-address 0 \
    >"$TMP/server-$i.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 100); do
    curl -fsS "http://$addr/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -fsS "http://$addr/readyz" >/dev/null
  log "instance $i pid $pid on $addr (operators $admin)"
  ADDRS+=("$addr") ADMINS+=("$admin") SERVER_PIDS+=("$pid")
done
join() { local IFS=,; echo "$*"; }

log "soak: $DURATION_SECS s at $JOIN_RATE joins/s, admission $RATE/s, token TTL $TOKEN_TTL_SECS s"
set +e
timeout $((DURATION_SECS + DRAIN_SECS + 120)) "$GEN" soak \
  --addrs "$(join "${ADDRS[@]}")" --admin-addrs "$(join "${ADMINS[@]}")" \
  --server-pids "$(join "${SERVER_PIDS[@]}")" --redis-url "$REDIS_URL" --key-prefix "$PREFIX" \
  --admin-token "$ADMIN_TOKEN" --duration-secs "$DURATION_SECS" --drain-secs "$DRAIN_SECS" \
  --join-rate "$JOIN_RATE" --configured-rate "$RATE" --patience-secs "$PATIENCE_SECS" \
  --poll-share "$POLL_SHARE" --drop-share "$DROP_SHARE" --order-share "$ORDER_SHARE" \
  --sample-secs "$SAMPLE_SECS" --out "$OUT" \
  --note "Measured $(date -u +%Y-%m-%dT%H:%MZ) by \`loadtest/soak.sh\` (DURATION=$DURATION JOIN_RATE=$JOIN_RATE BATCH=$BATCH INTERVAL_MS=$INTERVAL_MS TOKEN_TTL_SECS=$TOKEN_TTL_SECS PATIENCE_SECS=$PATIENCE_SECS POLL_SHARE=$POLL_SHARE DROP_SHARE=$DROP_SHARE ORDER_SHARE=$ORDER_SHARE)." \
  --note "Machine: $(nproc) cores, shared with other work; two waitroom instances, one redis-server $(redis-server --version | awk '{print $3}' | tr -d 'v='), and the generator on the same cores over loopback."
rc=$?
set -e
for i in 1 2; do
  if grep -qiE 'panic|ERROR' "$TMP/server-$i.log"; then
    log "instance $i logged errors:"
    grep -iE 'panic|ERROR' "$TMP/server-$i.log" | tail -5 >&2
  fi
done
log "wrote $OUT.md, $OUT.json, $OUT.svg (exit $rc)"
exit $rc
