#!/usr/bin/env bash
# poll-budget.sh: what the per-buyer budget costs a poll in Redis.
#
# A poll is one EVALSHA of status.lua either way; with the budget the
# script also reads and writes the buyer's GCRA key. This runs the real
# script (as the adapter sends it: prelude and helpers assembled, written by
# the ignored test `write_assembled_scripts`) under redis-benchmark, as the
# HTTP layer polls (no presence write, the entry time known), without a
# budget (the baseline) and with one that never refuses, interleaved over
# ROUNDS rounds, and prints the median rate of each and their ratio. Needs
# redis-server/redis-benchmark; uses REDIS_PORT (default 6379) and keys
# under bench-poll-budget:*.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${REDIS_PORT:-6379}
ROUNDS=${ROUNDS:-5}
N=${N:-100000}
OUT=$(mktemp -d /tmp/waitroom-pb.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
(cd "$ROOT" && WAITROOM_SCRIPTS_OUT=$OUT cargo test -q --lib -- --ignored --exact \
  store::redis::scripts::written::write_assembled_scripts >/dev/null)
SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$(cat "$OUT/status.lua")")
P="bench-poll-budget:{q}:"
KEYS=("${P}waiting" "${P}seq" "${P}entered" "${P}seen" "${P}active" "${P}bucket" "${P}pass" "${P}paused" "${P}token:u1" "${P}budget:u1" "${P}stock")
redis-cli -p "$PORT" ZADD "${P}waiting" 1 u1 >/dev/null
rate() { # period burst
  redis-benchmark -p "$PORT" -n "$N" -c 50 -P 1 -q \
    EVALSHA "$SHA" 11 "${KEYS[@]}" "${P}token:" ch u1 0 "$1" "$2" 1 1700000000000 |
    grep -o '[0-9.]* requests per second' | cut -d' ' -f1
}
base=() budget=()
for _ in $(seq 1 "$ROUNDS"); do
  base+=("$(rate 0 0)")
  budget+=("$(rate 1 1000000000)")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mb=$(median "${base[@]}") mg=$(median "${budget[@]}")
echo "status.lua without budget (baseline): ${base[*]} -> median $mb polls/s"
echo "status.lua with budget:                ${budget[*]} -> median $mg polls/s"
awk -v b="$mb" -v g="$mg" 'BEGIN {printf "with / without = %.2f\n", g / b}'
redis-cli -p "$PORT" --scan --pattern 'bench-poll-budget:*' | xargs -r redis-cli -p "$PORT" DEL >/dev/null
