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
#   - descriptors back to their baseline (nothing above it) after the crowd
#     left; the baseline is read after one buyer per instance went the
#     whole way (join, order, stream), before the crowd;
#   - Redis back to its constant keys (bucket, pass, sequence, secret, and
#     the queue's audit log, a stream trimmed to AUDIT_MAX_LEN entries);
#   - admission = the configured rate (+-10 %) in every sample after the
#     first minute, each sample measured from pass to pass on Redis' clock.
#
# The rates (defaults), both instances together:
#   joins      30/s, spread over the instances
#   admission  20/s (BATCH 10 every INTERVAL_MS 500, one bucket for both)
#   leaves     ~10/s: a waiting buyer's patience is exponential with a mean
#              of 120 s, so the line settles where joins = admitted + left,
#              ~(30 - 20) x 120 = 1,200 waiting, within ~6 min (3 x the
#              patience): warm-up, inside the first third of the load
#   polls      20 % of the buyers poll instead of streaming; 30 % of the
#              streams drop once (3-30 s in) and reopen on the other
#              instance
#   orders     60 % of the admitted order (~12/s, one SQLite file per
#              instance), the rest let their 60-s token expire
#
# Loopback only; bounded: at most DURATION + DRAIN + 2 min; every process
# started here is stopped on exit.
#
# env (defaults): DURATION (30m; s/m suffix, 1-30 min), JOIN_RATE (30 per s),
#   BATCH (10) and INTERVAL_MS (500): 20 admissions per s,
#   TOKEN_TTL_SECS (60), PATIENCE_SECS (120, mean; ~(JOIN_RATE - rate) *
#   PATIENCE waiting at steady state, reached after ~3 x PATIENCE: keep
#   that inside the first third of DURATION), POLL_SHARE (0.2), DROP_SHARE (0.3),
#   ORDER_SHARE (0.6), DRAIN_SECS (240), SAMPLE_SECS (10), AUDIT_MAX_LEN
#   (5000: the audit log, ~50 entries a second here, fills within the
#   warm-up and then stays at its bound; 0 turns it off),
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
AUDIT_MAX_LEN=${AUDIT_MAX_LEN:-5000}
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

# shellcheck source=loadtest/lib.sh
source "$ROOT/loadtest/lib.sh"
trap cleanup EXIT
trap 'exit 130' INT TERM
ulimit -n "$(ulimit -Hn)"

if [[ -z "${SKIP_BUILD:-}" ]]; then
  log "building release binaries"
  cargo build --release --bin waitroom >&2
  cargo build --release -p sse-gen >&2
fi

REDIS_MAXCLIENTS=10000 start_redis
PREFIX=soak-$RUN

ADDRS=() ADMINS=() SERVER_PIDS=()
for i in 1 2; do
  addr=127.0.0.1:$(free_port)
  admin=127.0.0.1:$(free_port)
  "$SERVER_BIN" --addr "$addr" --admin-addr "$admin" --redis-url "$REDIS_URL" --key-prefix "$PREFIX" \
    --orders-db "$TMP/orders-$i.db" --admin-token "$ADMIN_TOKEN" --ticket-secret "$TICKET_SECRET" \
    --identity header --drain-secs 1 --audit-max-len "$AUDIT_MAX_LEN" \
    --admission-batch "$BATCH" --admission-interval-ms "$INTERVAL_MS" --token-ttl-secs "$TOKEN_TTL_SECS" \
    "${ADDRESS_LIMIT_FLAGS[@]}" >"$TMP/server-$i.log" 2>&1 &
  pid=$!
  EXTRA_PIDS+=("$pid")
  wait_ready "$addr"
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
