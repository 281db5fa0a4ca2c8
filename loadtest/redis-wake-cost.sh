#!/usr/bin/env bash
# loadtest/redis-wake-cost.sh: what one Redis command costs Redis' CPU
# when Redis sleeps between commands against when it is kept busy.
#
# A fresh redis-server of its own (free port, no persistence) runs alone
# on the last core; redis-benchmark sends SET on the other cores at each
# of CONCURRENCY's connection counts (runs interleaved, REPEATS times).
# For each run: commands per second and Redis' CPU (INFO cpu, user + sys)
# per command. With one connection Redis goes to sleep after every
# command and is woken by the next; with many, it finds the next command
# already waiting. The difference is the price of a wake-up on this
# machine: why a group-commit run whose Redis idles between groups
# measures a grouped join's Redis cost far above what the same call costs
# back to back (see the group-commit reports in docs/benchmarks/).
#
# Loopback only; every redis-benchmark run is bounded in count (OPS) and
# time (60 s); the redis-server is stopped on exit.
#
# env (defaults): CONCURRENCY ("1 4 16 64"), OPS (20000), REPEATS (3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONCURRENCY=${CONCURRENCY:-"1 4 16 64"}
OPS=${OPS:-20000}
REPEATS=${REPEATS:-3}
REDIS_MAXCLIENTS=1000
SERVER_PID=
REDIS_PID=
EXTRA_PIDS=()
TMP=$(mktemp -d /tmp/waitroom-wake.XXXXXX)
# shellcheck source=loadtest/lib.sh
source "$ROOT/loadtest/lib.sh"
trap cleanup EXIT
trap 'exit 130' INT TERM

command -v redis-benchmark >/dev/null || { log "redis-benchmark is missing"; exit 1; }
last=$(($(nproc) - 1))
((last >= 1)) || { log "needs at least two cores"; exit 1; }
start_redis
taskset -a -pc "$last" "$REDIS_PID" >/dev/null

echo "| run | connections | SET/s | Redis CPU µs per SET |"
echo "|---|---|---|---|"
for run in $(seq 1 "$REPEATS"); do
  for c in $CONCURRENCY; do
    c0=$(redis_cpu)
    t0=$(date +%s.%N)
    timeout 60 taskset -c "0-$((last - 1))" redis-benchmark -p "$REDIS_PORT" \
      -c "$c" -n "$OPS" -q -t set >/dev/null
    t1=$(date +%s.%N)
    c1=$(redis_cpu)
    awk -v r="$run" -v c="$c" -v n="$OPS" -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" \
      'BEGIN { printf "| %d | %d | %.0f | %.1f |\n", r, c, n / (t1 - t0), (c1 - c0) * 1e6 / n }'
  done
done
echo
echo "Measured $(date -u +%FT%RZ) by loadtest/redis-wake-cost.sh (OPS=$OPS, $(nproc --all) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), cpuidle driver $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo unknown))."
