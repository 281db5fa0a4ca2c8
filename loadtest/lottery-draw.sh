#!/usr/bin/env bash
# loadtest/lottery-draw.sh: how long the draw of a scheduled opening takes
# for N pre-queue entries (default 100,000), on a redis-server of its own,
# against a baseline of the same run (N ordinary joins). Bounded: one draw.
# A debug build (the Rust half, SHA-256 and the sort, is faster in release).
#   loadtest/lottery-draw.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-100000}
LOTTERY_BENCH_N=$N cargo test -j 2 --test api lottery::draw_of_many_entries_measured \
  -- --ignored --nocapture 2>&1 | grep -E "lottery draw of|test result"
