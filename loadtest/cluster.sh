#!/usr/bin/env bash
# loadtest/cluster.sh: several instances, one rate, on a Redis Cluster.
#
# Starts its OWN Redis Cluster (3 masters + 3 replicas on free ports,
# no persistence; the shared Redis on 6379 is never touched), then:
#   a. the cost of --redis-wait-replicas 1: join throughput (`sse-gen
#      burst`, BURST joins over 64 connections) of an instance with
#      --redis-wait-replicas 0 and one with 1, alternated ROUNDS times in
#      the same run; the ratio of the medians;
#   b. 3 instances (--redis-cluster, every instance serving 3 queues whose
#      hash tags land on the 3 different masters), and 3 SSE crowds of CROWD
#      buyers at once, crowd i joining instance i in queue i, so each master
#      holds one queue. Admission is held (the admin API's pause) while the
#      crowds open their streams and through the steady window, so every
#      instance really holds CROWD streams; then it resumes at BATCH per
#      INTERVAL_MS for each queue, shared by the 3 instances through Redis.
#      Per crowd: rank-update lag p99, RSS per stream of its instance, Redis
#      commands per waiting user per second on its queue's master (INFO
#      commandstats, steady window), and the admission rate against the
#      configured one: the most any window of passes admitted above rate x
#      window must stay within one batch. KILL_AFTER s after the resume,
#      instance 3 is killed (SIGKILL): its streams reopen on instances 1
#      and 2 (spread by buyer), and every buyer must still get exactly one
#      `ready` (lost = 0, duplicated = 0). Two survivors cannot hold 3 x
#      CROWD streams when that is over their --max-streams (the open-file
#      limit less a twentieth): over the cap a new stream is shed, or
#      evicts one of a heavier address (the crowds come from a few
#      loopback addresses each), with a `retry:` of 20-40 s, and comes back
#      as admission drains; the table reports how many were shed and
#      evicted and the most streams a survivor held.
# Writes $RESULTS_DIR/cluster.md (table), cluster.svg (chart of crowd 1)
# and the raw JSON reports; exits non-zero when a check fails.
#
# Loopback only; every loop is bounded; every process started here is
# stopped on exit. At CROWD=1000 it takes about 3 minutes, at 15000 about 9.
#
# env (defaults): CROWD (15000 per instance), ADMIT_SECS (150: how long
#   admission of a crowd lasts once resumed), BATCH (CROWD over ADMIT_SECS
#   passes: 100 at CROWD=15000), INTERVAL_MS (1000), SETTLE_SECS (20),
#   STEADY_SECS (20), KILL_AFTER (10 s after the resume; 0: no kill),
#   KILL_HELD (unset; set: the kill comes while admission is still held,
#   and admission resumes KILL_AFTER s later), SERVER_FLAGS (extra flags
#   for the 3 instances, e.g. "--max-streams 700" to reach the cap small),
#   BURST (5000), ROUNDS (3),
#   RESULTS_DIR (loadtest/results), SKIP_BUILD (unset), SKIP_WAIT_COST
#   (unset), SKIP_CROWDS (unset).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD

CROWD=${CROWD:-15000}
INTERVAL_MS=${INTERVAL_MS:-1000}
SETTLE_SECS=${SETTLE_SECS:-20}
STEADY_SECS=${STEADY_SECS:-20}
BURST=${BURST:-5000}
ROUNDS=${ROUNDS:-3}
RESULTS_DIR=${RESULTS_DIR:-loadtest/results}
((CROWD >= 10 && CROWD <= 17000)) || { echo "CROWD must be 10-17000 (one generator process per crowd)" >&2; exit 2; }
ADMIT_SECS=${ADMIT_SECS:-150}
# Time for the crowds to open (slow on a shared 2-core box: ~200 opens/s).
OPEN_SECS=$((30 + CROWD * 3 / 200))
BATCH=${BATCH:-$(((CROWD * INTERVAL_MS / 1000 + ADMIT_SECS - 1) / ADMIT_SECS))}
KILL_AFTER=${KILL_AFTER:-10}
# Open, settle, steady, then admission (CROWD / BATCH passes), with room
# for the shed streams' 20-40 s retry and the report.
CROWD_DURATION=$((OPEN_SECS + SETTLE_SECS + STEADY_SECS + CROWD * INTERVAL_MS / BATCH / 1000 + 120))

mkdir -p "$RESULTS_DIR"
RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)
TMP=$(mktemp -d /tmp/waitroom-cluster.XXXXXX)
RUN=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
ADMIN_TOKEN=adm$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
TICKET_SECRET=sec$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
GEN=$ROOT/target/release/sse-gen
SERVER_BIN=$ROOT/target/release/waitroom

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
PIDS=()
log() { printf '[cluster.sh %s] %s\n' "$(date +%T)" "$*" >&2; }
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

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Below 22768, so the cluster bus (port + 10000) stays below the
# ephemeral range too.
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 2700))
    if port_free "$p" && port_free $((p + 10000)); then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# --- the cluster ----------------------------------------------------------
NODES=()
for _ in 1 2 3 4 5 6; do
  p=$(free_port)
  redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file "nodes-$p.conf" \
    --cluster-node-timeout 2000 --save "" --appendonly no --repl-diskless-sync-delay 0 \
    --dir "$TMP" --logfile "$TMP/redis-$p.log" &
  PIDS+=($!)
  NODES+=("$p")
done
for p in "${NODES[@]}"; do
  for _ in $(seq 1 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${NODES[@]}") --cluster-replicas 1 --cluster-yes >"$TMP/create.log"
for _ in $(seq 1 150); do
  ok=1
  for p in "${NODES[@]}"; do
    redis-cli -p "$p" cluster info | grep -q cluster_state:ok || ok=0
  done
  synced=$(for p in "${NODES[@]}"; do redis-cli -p "$p" info replication; done | grep -c master_link_status:up || true)
  ((ok && synced == 3)) && break
  sleep 0.2
done
((ok && synced == 3)) || { log "the cluster did not settle"; exit 1; }
SEEDS=$(printf 'redis://127.0.0.1:%s,' "${NODES[@]}")
SEEDS=${SEEDS%,}
log "cluster of 6 nodes (3 masters + 3 replicas): ${NODES[*]}"

# master_of SLOT: the port of the master serving SLOT.
master_of() {
  redis-cli -p "${NODES[0]}" cluster nodes | awk -v s="$1" '$3 ~ /master/ && $3 !~ /fail/ {
    for (i = 9; i <= NF; i++) { n = split($i, r, "-"); lo = r[1]; hi = (n == 2 ? r[2] : r[1]);
      if (s >= lo && s <= hi) { split($2, a, "[:@]"); print a[2]; exit } } }'
}
# Three queues whose hash tags land on three different masters.
QUEUES=() QMASTERS=()
for i in $(seq 0 300); do
  slot=$(redis-cli -p "${NODES[0]}" cluster keyslot "{q$i}")
  m=$(master_of "$slot")
  [[ " ${QMASTERS[*]} " == *" $m "* ]] && continue
  QUEUES+=("q$i") QMASTERS+=("$m")
  ((${#QUEUES[@]} == 3)) && break
done
((${#QUEUES[@]} == 3)) || { log "no three queues on three masters"; exit 1; }
log "queues ${QUEUES[*]} on masters ${QMASTERS[*]}"

ADDRESS_LIMIT_FLAGS=(--joins-per-address-per-minute 0 --places-per-address 0
  --visitors-per-address-per-minute 0 --streams-per-address 0
  --connections-per-address 0)
# start NAME PREFIX [flags…]: an instance on the cluster; sets S_PID,
# S_ADDR and S_ADMIN (its operator listener).
start() {
  local name=$1 prefix=$2
  shift 2
  S_ADDR=127.0.0.1:$(free_port)
  S_ADMIN=127.0.0.1:$(free_port)
  "$SERVER_BIN" --addr "$S_ADDR" --admin-addr "$S_ADMIN" --redis-url "$SEEDS" --redis-cluster \
    --key-prefix "$prefix" --orders-db "$TMP/$name-orders.db" --admin-token "$ADMIN_TOKEN" \
    --ticket-secret "$TICKET_SECRET" --drain-secs 1 --identity header "${ADDRESS_LIMIT_FLAGS[@]}" \
    "$@" >"$TMP/$name.log" 2>&1 &
  S_PID=$!
  PIDS+=("$S_PID")
  for _ in $(seq 1 100); do
    curl -fsS "http://$S_ADDR/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -fsS "http://$S_ADDR/readyz" >/dev/null || { log "$name did not start"; tail -5 "$TMP/$name.log" >&2; exit 1; }
}

STATUS=0
TABLE=$TMP/table.md
: >"$TABLE"

# --- a. the cost of --redis-wait-replicas 1 ---------------------------------
if [[ -z "${SKIP_WAIT_COST:-}" ]]; then
  W0=() W1=()
  for round in $(seq 1 "$ROUNDS"); do
    for w in 0 1; do
      start "wait$w-$round" "wr-w$w-$round-$RUN" --redis-wait-replicas "$w"
      "$GEN" burst --addr "$S_ADDR" --users "$BURST" --concurrency 64 --source-ips 127.0.0.2-127.0.0.11 \
        --duration-secs 60 --out "$RESULTS_DIR/cluster-burst-w$w-$round.json" >"$TMP/burst.log" 2>&1 || true
      rate=$(jq -r '.enters_per_s | round' "$RESULTS_DIR/cluster-burst-w$w-$round.json")
      stop_pid "$S_PID"
      log "a. round $round, --redis-wait-replicas $w: $rate joins/s"
      if ((w == 0)); then W0+=("$rate"); else W1+=("$rate"); fi
    done
  done
  median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
  M0=$(median "${W0[@]}") M1=$(median "${W1[@]}")
  RATIO=$(awk -v a="$M1" -v b="$M0" 'BEGIN { printf "%.2f", a / b }')
  {
    echo "| joins/s, one instance, --redis-wait-replicas 0 (median of $ROUNDS) | $M0 (${W0[*]}) |"
    echo "| joins/s, one instance, --redis-wait-replicas 1 (median of $ROUNDS) | $M1 (${W1[*]}) |"
    echo "| cost of --redis-wait-replicas 1 (ratio, same run) | ${RATIO}× |"
  } >>"$TABLE"
fi

# --- b. three instances, three crowds, one rate per queue -------------------
if [[ -z "${SKIP_CROWDS:-}" ]]; then
  PREFIX=wr-crowd-$RUN
  QLIST=$(IFS=,; echo "${QUEUES[*]}")
  INST_PID=() INST_ADDR=() INST_ADMIN=()
  for i in 0 1 2; do
    start "inst$i" "$PREFIX" --queues "$QLIST" \
      --admission-batch "$BATCH" --admission-interval-ms "$INTERVAL_MS" --token-ttl-secs 600 ${SERVER_FLAGS:-}
    INST_PID+=("$S_PID") INST_ADDR+=("$S_ADDR") INST_ADMIN+=("$S_ADMIN")
    log "b. instance $((i + 1)) pid $S_PID on $S_ADDR"
  done
  admin() { curl -fsS -X POST -H "Authorization: Bearer $ADMIN_TOKEN" "http://${INST_ADMIN[0]}/api/admin/queues/$1/$2" >/dev/null; }
  # metric ADMIN NAME: one unlabelled gauge or counter of an instance.
  # (awk reads to the end: an early exit would fail curl's write, and
  # with pipefail the script.)
  metric() { { curl -fsS --max-time 5 "http://$1/metrics" 2>/dev/null || true; } | awk -v n="$2" '$1 == n && !v { v = $2 } END { print v }'; }
  # Held while the crowds open, so every instance holds its whole crowd.
  for q in "${QUEUES[@]}"; do admin "$q" pause; done
  CROWD_PIDS=()
  for i in 0 1 2; do
    others=()
    for j in 0 1 2; do ((j != i)) && others+=("${INST_ADDR[$j]}"); done
    lo=$((2 + i * 10))
    "$GEN" crowd --mode sse --addr "${INST_ADDR[$i]}" --queue "${QUEUES[$i]}" --users "$CROWD" \
      --fallback-addrs "$(IFS=,; echo "${others[*]}")" --max-reconnects 8 \
      --source-ips "127.0.0.$lo-127.0.0.$((lo + 9))" --connect-concurrency 100 \
      --redis-url "redis://127.0.0.1:${QMASTERS[$i]}" --sharded --key-prefix "$PREFIX" \
      --server-pid "${INST_PID[$i]}" --admin-addr "${INST_ADMIN[$i]}" --no-orders \
      --settle-secs "$SETTLE_SECS" --steady-secs "$STEADY_SECS" --open-timeout-secs "$OPEN_SECS" \
      --duration-secs "$CROWD_DURATION" --out "$RESULTS_DIR/cluster-crowd-$i.json" >"$TMP/crowd-$i.log" 2>&1 &
    CROWD_PIDS+=($!)
    PIDS+=($!)
  done
  log "b. 3 crowds of $CROWD streams (limit ${CROWD_DURATION}s), admission held until their steady windows end"
  # Every crowd prints one of these lines once its steady window is over.
  for _ in $(seq 1 $(((OPEN_SECS + SETTLE_SECS + STEADY_SECS + 60) / 2))); do
    n=$(cat "$TMP"/crowd-?.log 2>/dev/null | grep -cE '^steady window|^no time left' || true)
    ((n >= 3)) && break
    sleep 2
  done
  OPEN_AT_RESUME=()
  for i in 0 1 2; do OPEN_AT_RESUME+=("$(metric "${INST_ADMIN[$i]}" waitroom_streams_open)"); done
  RESUMED=0
  resume() {
    for q in "${QUEUES[@]}"; do admin "$q" resume; done
    RESUMED=1
    log "b. admission resumed at $BATCH per ${INTERVAL_MS} ms per queue"
  }
  log "b. streams open on the 3 instances: ${OPEN_AT_RESUME[*]}"
  PEAK=(0 0) SHED=(0 0) EVICTED=(0 0)
  if ((KILL_AFTER > 0)); then
    # Held: the kill comes first, while every stream still waits (the
    # worst case for the survivors); otherwise KILL_AFTER s into admission.
    KILLED_AT=$SECONDS
    if [[ -z "${KILL_HELD:-}" ]]; then
      resume
      sleep "$KILL_AFTER"
      KILLED_AT=$SECONDS
    fi
    kill -KILL "${INST_PID[2]}"
    log "b. instance 3 killed (its streams reopen on instances 1 and 2)"
    # The survivors' load while the moved streams come back: sampled every
    # 2 s until the crowds end (bounded by their own limit).
    for _ in $(seq 1 $((CROWD_DURATION / 2))); do
      alive=0
      for pid in "${CROWD_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
      ((alive)) || break
      ((RESUMED || SECONDS - KILLED_AT < KILL_AFTER)) || resume
      for k in 0 1; do
        o=$(metric "${INST_ADMIN[$k]}" waitroom_streams_open)
        o=${o%.*}
        [[ -n "$o" ]] && ((o > PEAK[k])) && PEAK[k]=$o
      done
      sleep 2
    done
    for k in 0 1; do
      s=$(metric "${INST_ADMIN[$k]}" waitroom_streams_shed_total); s=${s%.*}; SHED[k]=${s:-0}
      s=$(metric "${INST_ADMIN[$k]}" waitroom_streams_evicted_total); s=${s%.*}; EVICTED[k]=${s:-0}
    done
    log "b. survivors: most streams open ${PEAK[*]}, shed ${SHED[*]}, evicted ${EVICTED[*]} (--max-streams $(curl -fsS -H "Authorization: Bearer $ADMIN_TOKEN" "http://${INST_ADMIN[0]}/api/admin/queues" | jq -r '.maxStreams // "?"' 2>/dev/null))"
  else
    resume
  fi
  for pid in "${CROWD_PIDS[@]}"; do wait "$pid" || true; done
  if ((KILL_AFTER > 0)); then
    when="${KILL_AFTER} s into admission"
    [[ -n "${KILL_HELD:-}" ]] && when="while admission was held (resumed ${KILL_AFTER} s later)"
    echo "| survivors (instances 1 and 2) after the kill, $when | streams open on the 3 instances before ${OPEN_AT_RESUME[*]}; most open after the kill ${PEAK[0]} and ${PEAK[1]}; at the cap shed ${SHED[0]} and ${SHED[1]}, evicted ${EVICTED[0]} and ${EVICTED[1]} | |" >>"$TABLE"
  fi

  RATE=$(awk -v b="$BATCH" -v i="$INTERVAL_MS" 'BEGIN { printf "%g", b * 1000 / i }')
  for i in 0 1 2; do
    f=$RESULTS_DIR/cluster-crowd-$i.json
    [[ -s "$f" ]] || { log "crowd $((i + 1)) wrote no report"; tail -5 "$TMP/crowd-$i.log" >&2; STATUS=1; continue; }
    # Over-admission: the most any run of consecutive passes admitted
    # above the configured rate over its span, against one batch.
    over=$(jq -r '.series.passes[] | "\(.t) \(.admitted)"' "$f" | awk -v r="$RATE" -v i="$INTERVAL_MS" '
      { t[NR] = $1; a[NR] = $2 }
      END { m = 0; for (x = 1; x <= NR; x++) { s = 0; for (y = x; y <= NR; y++) { s += a[y];
        o = s - r * (t[y] - t[x] + i / 1000); if (o > m) m = o } } printf "%.0f", m }')
    read -r p99 rss calls lost dup rate_s opened shed evicted never <<<"$(jq -r '[.rank_update_lag_ms.p99 // "n/a", .rss.per_stream_kib // "n/a",
      .steady.redis_calls_per_user_s // "n/a", .readiness.lost, .readiness.duplicated,
      .admission.admissions_per_s // "n/a", .events.streams_opened, .events.streams_shed // 0, .events.streams_evicted // 0,
      .events.users_never_streamed // "n/a"]
      | map(if type == "number" then (. * 100 | round / 100) else . end | tostring) | join(" ")' "$f")"
    verdict=met
    if [[ "$lost" != 0 || "$dup" != 0 ]] || ((over > BATCH)); then verdict="**not met**"; STATUS=1; fi
    killed=""
    ((i == 2 && KILL_AFTER > 0)) && killed=" (instance killed mid-run)"
    echo "| crowd $((i + 1))$killed: queue ${QUEUES[$i]} on master :${QMASTERS[$i]}, $CROWD buyers ($opened streams opened, $shed shed and $evicted evicted at a cap, $never never streamed) | rank-update p99 ${p99} ms; RSS ${rss} KiB/stream; ${calls} Redis commands per waiting user per s on its master; admission ${rate_s}/s vs ${RATE}/s configured, most over-admitted ${over} (≤ ${BATCH}); lost ready ${lost}, duplicated ${dup} | ${verdict} |" >>"$TABLE"
  done
  "$GEN" chart --report "$RESULTS_DIR/cluster-crowd-0.json" --out "$RESULTS_DIR/cluster.svg" || true
fi

{
  echo "| figure | measured | |"
  echo "|---|---|---|"
  cat "$TABLE"
  echo
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) by \`loadtest/cluster.sh\` (CROWD=$CROWD BATCH=$BATCH INTERVAL_MS=$INTERVAL_MS SETTLE_SECS=$SETTLE_SECS STEADY_SECS=$STEADY_SECS ADMIT_SECS=$ADMIT_SECS KILL_AFTER=$KILL_AFTER${KILL_HELD:+ KILL_HELD=$KILL_HELD}${SERVER_FLAGS:+ SERVER_FLAGS=\"$SERVER_FLAGS\"} BURST=$BURST ROUNDS=$ROUNDS): a Redis Cluster of 3 masters + 3 replicas $(redis-server --version | awk '{print $3}' | tr -d 'v='), no persistence; 3 waitroom instances; $(nproc) shared cores, loopback; load average $LOAD_START at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end."
} >"$RESULTS_DIR/cluster.md"
cat "$RESULTS_DIR/cluster.md"
exit $STATUS
