#!/usr/bin/env bash
# loadtest/fanout-floor.sh: the floor under a pass's fan-out on this
# machine, to read the SSE crowd's first-pass p99 against.
#
# Builds loadtest/fanout-floor/floor.c (cc -O2) and runs it: one 200-byte
# write to each of USERS loopback TCP connections per round, read by
# epoll threads in another process, each frame timed from the round's
# stamp to its arrival — the loopback sends and reads a pass cannot
# avoid, with no HTTP, no SSE framing, no Redis and no per-stream state.
# For each writers/readers split in SPLITS it prints every round's p99
# and the median over the rounds after the first (the first round meets
# cold sockets), as a Markdown table.
#
# Loopback only; each run is bounded (ROUNDS rounds, 30 s a round at most,
# 180 s a run).
#
# env (defaults): USERS (15000), ROUNDS (6), SPLITS ("1/1 2/1 2/2":
#   writer threads / reader threads), CC (cc).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
USERS=${USERS:-15000}
ROUNDS=${ROUNDS:-6}
SPLITS=${SPLITS:-"1/1 2/1 2/2"}
CC=${CC:-cc}
TMP=$(mktemp -d /tmp/waitroom-floor.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
ulimit -n "$(ulimit -Hn)"
# Each process holds one end of every connection.
(($(ulimit -n) > USERS + 64)) || {
  echo "fanout-floor.sh: $USERS connections need $((USERS + 64)) descriptors a process; the limit is $(ulimit -n)" >&2
  exit 1
}

"$CC" -O2 -Wall -pthread -o "$TMP/floor" "$ROOT/loadtest/fanout-floor/floor.c"

echo "| writers / readers | p99 per round, ms | median p99 after round 1, ms |"
echo "|---|---|---|"
for split in $SPLITS; do
  writers=${split%/*} readers=${split#*/}
  p99s=$(timeout 180 "$TMP/floor" "$USERS" "$writers" "$readers" "$ROUNDS" 2>/dev/null |
    awk '{ print $9 }')
  median=$(echo "$p99s" | tail -n +2 | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  echo "| $writers / $readers | $(echo "$p99s" | paste -sd' ') | $median |"
done
echo
echo "Measured $(date -u +%FT%RZ) by loadtest/fanout-floor.sh (USERS=$USERS ROUNDS=$ROUNDS; $(nproc --all) cores, load average $(cut -d' ' -f1-3 /proc/loadavg))."
