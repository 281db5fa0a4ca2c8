#!/usr/bin/env bash
# What the public admission log (--fairness-log) costs a join and an
# admission: the same build with the log on and off, A B B A, each run on
# a private redis-server (INFO commandstats counts nothing else): 2,000
# joins over HTTP (admission held), then all of them admitted; Redis time
# per join and per admission and the join's wall time, on/off as ratios,
# and the Redis bytes a leaf takes. Writes a dated report to
# docs/benchmarks/. About a minute; loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=$(date -u +%Y%m%dT%H%MZ)
out=$(timeout 900 cargo test -q --test api fairness::cost_of_the_log_per_join_and_admission -- --ignored --nocapture 2>&1 \
  | grep -E '^(a burst|Redis|runs|test result)')
echo "$out"
report=docs/benchmarks/fairness-cost-$stamp.md
{
  echo "# What the public admission log costs ($stamp)"
  echo
  echo "Command: \`loadtest/fairness-cost.sh\` (the ignored test"
  echo "\`fairness::cost_of_the_log_per_join_and_admission\`, debug build)."
  echo "Machine: $(nproc) cores, $(uname -sr), redis-server $(redis-server --version | awk '{print $3}')."
  echo
  echo "Baseline: the same build, same run, with \`--fairness-log\` off (A B B A,"
  echo "each run on a private redis-server). 2,000 joins over HTTP, 50 at a"
  echo "time on a fixed schedule (one burst every 400 ms, so both runs last as"
  echo "long), admission held; then every buyer admitted (batch 500, 100 ms),"
  echo "measured over a fixed 3 s."
  echo
  echo '```'
  echo "$out"
  echo '```'
} > "$report"
echo "report: $report"
