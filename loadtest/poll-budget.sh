#!/usr/bin/env bash
# poll-budget.sh: what the per-buyer budget costs a poll in Redis.
#
# A poll is one EVALSHA of status.lua either way; with the budget the
# script also reads and writes the buyer's GCRA key. This runs the real
# script (common.lua + gcra.lua + status.lua, as the adapter sends it)
# under redis-benchmark, without a budget (the baseline) and with one that
# never refuses, interleaved over ROUNDS rounds, and prints the median
# rate of each and their ratio. Needs redis-server/redis-benchmark; uses
# REDIS_PORT (default 6379) and keys under bench-poll-budget:*.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${REDIS_PORT:-6379}
ROUNDS=${ROUNDS:-5}
N=${N:-100000}
LUA=$ROOT/src/store/redis/lua
SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$(cat "$LUA/common.lua" "$LUA/gcra.lua" "$LUA/status.lua")")
P="bench-poll-budget:{q}:"
KEYS=("${P}waiting" "${P}seq" "${P}entered" "${P}seen" "${P}active" "${P}bucket" "${P}pass" "${P}paused" "${P}budget:u1")
redis-cli -p "$PORT" ZADD "${P}waiting" 1 u1 >/dev/null
rate() { # period burst
  redis-benchmark -p "$PORT" -n "$N" -c 50 -P 1 -q \
    EVALSHA "$SHA" 9 "${KEYS[@]}" "${P}token:" ch u1 1 "$1" "$2" |
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
