#!/usr/bin/env bash
# loadtest/ab.sh: the SSE crowd (run.sh's scenario b) against two builds in
# the same run, so a change is judged by a ratio taken on the same noisy
# machine at the same time.
#
# A = the base build: BASE_BIN (a binary), or else the release binary of
# BASE (a git revision, default HEAD^), built in a temporary git worktree
# with its own target dir (AB_CACHE/target, seeded from this checkout's
# target/release the first time, so only the waitroom crate compiles) and
# kept as AB_CACHE/waitroom-<commit> for the next run. B = this checkout's
# release binary (built unless SKIP_BUILD).
#
# Both face the same crowd from the same generator and a fresh Redis
# database each: ROUNDS=1 runs A then B; ROUNDS=2 runs A B B A, so a drift
# in the machine's load over the run hits both alike. Reports, for each
# build (the mean over its rounds) and as the ratio B/A: rank-update p99
# (every update of the run), first-admission-pass p99 (every stream still
# waiting after that pass: its first frame of that pass or a later one; and,
# as before, only the streams that got that pass's own frame), the p99 of the pass that reached most streams (one sample
# less exposed to a burst of load at one moment), ready p99 (receive -
# admittedAt), ready frames lost or duplicated, and RSS per open stream.
# Writes $RESULTS_DIR/ab.md and the raw reports ab-{A,B}-<round>.json.
#
# Loopback only; every crowd is bounded by --duration-secs; every process
# started here is stopped on exit.
#
# env (defaults): USERS (15000), BATCH (500), STOCK (2/3 of USERS),
#   SETTLE_SECS (20), STEADY_SECS (10), ROUNDS (1), BASE (HEAD^), BASE_BIN,
#   AB_CACHE (target/ab), WORKERS (0), RESULTS_DIR (loadtest/results),
#   SKIP_BUILD (unset).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD

USERS=${USERS:-15000}
BATCH=${BATCH:-500}
STOCK=${STOCK:-$((USERS * 2 / 3))}
SETTLE_SECS=${SETTLE_SECS:-20}
STEADY_SECS=${STEADY_SECS:-10}
ROUNDS=${ROUNDS:-1}
BASE=${BASE:-HEAD^}
AB_CACHE=${AB_CACHE:-$ROOT/target/ab}
WORKERS=${WORKERS:-0}
RESULTS_DIR=${RESULTS_DIR:-loadtest/results}
SOURCE_IPS=127.0.0.2-127.0.0.11

mkdir -p "$RESULTS_DIR" "$AB_CACHE"
RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)
AB_CACHE=$(cd "$AB_CACHE" && pwd)
TMP=$(mktemp -d /tmp/waitroom-ab.XXXXXX)
RUN=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
ADMIN_TOKEN=adm$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
TICKET_SECRET=sec$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
GEN=$ROOT/target/release/sse-gen
NEW_BIN=$ROOT/target/release/waitroom

# shellcheck source=loadtest/lib.sh
source "$ROOT/loadtest/lib.sh"
BASE_TREE=""
ab_cleanup() {
  cleanup
  if [[ -n "$BASE_TREE" ]]; then
    git -C "$ROOT" worktree remove --force "$BASE_TREE" 2>/dev/null || true
  fi
}
trap ab_cleanup EXIT
trap 'exit 130' INT TERM
ulimit -n "$(ulimit -Hn)"

# --- the two binaries ----------------------------------------------------
if [[ -n "${BASE_BIN:-}" ]]; then
  OLD_BIN=$(realpath "$BASE_BIN")
  OLD_NAME="$OLD_BIN"
else
  SHA=$(git rev-parse --verify "$BASE^{commit}")
  OLD_BIN=$AB_CACHE/waitroom-$SHA
  OLD_NAME="$BASE (${SHA:0:7})"
  if [[ ! -x "$OLD_BIN" ]]; then
    if [[ ! -d "$AB_CACHE/target/release" && -d "$ROOT/target/release" ]]; then
      log "seeding $AB_CACHE/target with this checkout's release dependencies"
      mkdir -p "$AB_CACHE/target"
      cp -a "$ROOT/target/release" "$AB_CACHE/target/release"
    fi
    BASE_TREE=$TMP/base-src
    git -C "$ROOT" worktree add --detach "$BASE_TREE" "$SHA" >&2
    log "building the base $OLD_NAME"
    (cd "$BASE_TREE" && CARGO_TARGET_DIR=$AB_CACHE/target cargo build --release --bin waitroom >&2)
    cp "$AB_CACHE/target/release/waitroom" "$OLD_BIN"
    git -C "$ROOT" worktree remove --force "$BASE_TREE"
    BASE_TREE=""
  fi
fi
if [[ -z "${SKIP_BUILD:-}" ]]; then
  log "building this checkout"
  cargo build --release --bin waitroom >&2
  cargo build --release -p sse-gen >&2
fi

start_redis

SERVER_FLAGS=(--admission-batch "$BATCH" --admission-interval-ms 1000 --max-active "$BATCH" --token-ttl-secs 600)
DURATION=$((SETTLE_SECS + STEADY_SECS + 150))

# crowd LABEL ROUND: scenario b against the binary LABEL names.
crowd() {
  local label=$1 round=$2
  SERVER_BIN=$OLD_BIN
  [[ "$label" == B ]] && SERVER_BIN=$NEW_BIN
  start_server "ab$label$round" "${SERVER_FLAGS[@]}"
  log "$label round $round: $USERS buyers against $SERVER_BIN (limit ${DURATION}s)"
  "$GEN" crowd --mode sse --addr "$SERVER_ADDR" --users "$USERS" --source-ips "$SOURCE_IPS" \
    --redis-url "$REDIS_URL" --key-prefix "$PREFIX" --server-pid "$SERVER_PID" \
    --plug "$BATCH" --settle-secs "$SETTLE_SECS" --steady-secs "$STEADY_SECS" \
    --stock "$STOCK" --admin-token "$ADMIN_TOKEN" --admin-addr "$ADMIN_ADDR" \
    --duration-secs "$DURATION" --workers "$WORKERS" \
    --out "$RESULTS_DIR/ab-$label-$round.json" >"$TMP/crowd-$label-$round.log"
  stop_pid "$SERVER_PID"
  SERVER_PID=""
}

START=$SECONDS
ORDER=(A B)
((ROUNDS >= 2)) && ORDER=(A B B A)
declare -A SEEN=()
for label in "${ORDER[@]}"; do
  SEEN[$label]=$((${SEEN[$label]:-0} + 1))
  crowd "$label" "${SEEN[$label]}"
done

# --- the figures ------------------------------------------------------
FIGURES=(
  "rank-update p99, every update (ms)|.rank_update_lag_ms.p99"
  "first admission pass p99, every stream waiting after it (ms)|.first_admission_every_stream.summary.p99"
  "first admission pass p99, only streams that got its own frame (ms)|.rank_update_first_admission.summary.p99"
  "largest pass p99 (the pass that reached most streams, ms)|.rank_update_broadcast.summary.p99"
  "ready p99, receive - admittedAt (ms)|.ready_lag_ms.p99"
  "ready lost + duplicated + token mismatches|(.readiness.lost // 0) + (.readiness.duplicated // 0) + (.readiness.token_mismatch // 0)"
  "RSS per open stream (KiB)|.rss.per_stream_kib"
)
mean_of() {
  jq -s "map($2 // empty) | if length == 0 then null else (add / length * 100 | round / 100) end" \
    "$RESULTS_DIR"/ab-"$1"-*.json
}
{
  echo "| figure | A: $OLD_NAME | B: this checkout | B / A |"
  echo "|---|---|---|---|"
  for f in "${FIGURES[@]}"; do
    name=${f%%|*}
    expr=${f#*|}
    a=$(mean_of A "$expr")
    b=$(mean_of B "$expr")
    ratio=$(jq -n --argjson a "$a" --argjson b "$b" \
      'if $a == null or $b == null or $a == 0 then "–" else "\($b / $a * 100 | round / 100)×" end' -r)
    echo "| $name | $a | $b | $ratio |"
  done
  echo
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) by \`loadtest/ab.sh\` (USERS=$USERS BATCH=$BATCH STOCK=$STOCK SETTLE_SECS=$SETTLE_SECS STEADY_SECS=$STEADY_SECS ROUNDS=$ROUNDS, order ${ORDER[*]}) in $((SECONDS - START)) s; $(nproc) cores shared with the generator and Redis, loopback."
} >"$RESULTS_DIR/ab.md"
cat "$RESULTS_DIR/ab.md"
