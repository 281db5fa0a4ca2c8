#!/usr/bin/env bash
# loadtest/enter-many-cost.sh: Redis CPU per join of one enter_many.lua call
# of G new buyers, this tree's scripts against BASE_REF's (git), and the
# baseline's one-call-per-join script (`plain`, as loadtest/plain-join),
# on a private redis-server (no persistence, port chosen here), without a
# server or a generator sharing the measurement. Prints, per group size
# and variant, Redis CPU µs per join (perf stat task-clock of the
# redis-server over the run, when perf is there) and, per run, the time
# inside EVALSHA / INFO cpu per join (enter-many-cost.py).
#
# env (defaults): BASE_REF (main), GROUP_SIZES ("64 16 1"), JOINS (20000 per
#   run), REPEATS (3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BASE_REF=${BASE_REF:-main}
GROUP_SIZES=${GROUP_SIZES:-64 16 1}
JOINS=${JOINS:-20000}
REPEATS=${REPEATS:-3}
TMP=$(mktemp -d /tmp/waitroom-em.XXXXXX)
# shellcheck source=loadtest/lib.sh
source "$ROOT/loadtest/lib.sh"
trap cleanup EXIT
trap 'exit 130' INT TERM
REDIS_MAXCLIENTS=100 start_redis
mkdir -p "$TMP/base" "$TMP/tree"
for f in common gcra join enter_many; do
  git show "$BASE_REF:src/store/redis/lua/$f.lua" >"$TMP/base/$f.lua"
  cp "src/store/redis/lua/$f.lua" "$TMP/tree/$f.lua"
done
DIRS="base=$TMP/base,tree=$TMP/tree"
for g in $GROUP_SIZES; do
  calls=$((JOINS / g))
  for v in plain base tree; do
    if command -v perf >/dev/null; then
      perf stat -e task-clock -x, -o "$TMP/perf" -p "$REDIS_PID" -- \
        python3 loadtest/enter-many-cost.py "$REDIS_PORT" "$g" "$calls" "$REPEATS" "$v" "$DIRS" >"$TMP/out"
      awk -F, -v n=$((calls * g * REPEATS)) -v v="$v" -v g="$g" \
        '/task-clock/ { printf "G=%d %s: %.2f µs Redis CPU per join (perf task-clock)\n", g, v, $1 * 1000 / n }' "$TMP/perf"
    else
      python3 loadtest/enter-many-cost.py "$REDIS_PORT" "$g" "$calls" "$REPEATS" "$v" "$DIRS" >"$TMP/out"
    fi
    sed 's/^/  in EVALSHA \/ INFO cpu, µs per join, per run: /' "$TMP/out"
  done
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
