#!/usr/bin/env bash
# loadtest/redis-cost.sh: what each buyer-facing script costs Redis per
# call (join, repeat join, poll, touch, stream re-read, leave, admission per
# admitted buyer, claim, consume, release, a protected site's session
# start, touch and end, the fairness log's append per leaf, proof and
# head), next to the plain one-Lua-call
# join of loadtest/plain-join measured in the same run, and the Redis
# commands each call runs. Counted by Redis itself (INFO commandstats after
# CONFIG RESETSTAT, on a redis-server of its own; the shared one is never
# touched), through the store API (tests/api/redis_commands.rs,
# `redis_cost`): the `evalsha` row gives µs per call, the other rows the
# commands per call. Writes the dated report
# docs/benchmarks/redis-cost-<UTC>.md. About a minute (after the build).
#
# env (defaults): LINES ("1000 100000", line lengths), CALLS (100 per
#   script and round), ROUNDS (3; medians), MODES ("busy": 8 calls in
#   flight, Redis runs them back to back, as when it is what limits a
#   server; add "paced": one call a millisecond, Redis idle in between,
#   each join then its own time mark, the dearest to write), BEFORE (a TSV of an earlier run,
#   docs/benchmarks/redis-cost-*.tsv: its µs and ratio shown as "before"),
#   NOTE (a line for the report), REPORT (1; 0: print only).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LINES=${LINES:-1000 100000}
CALLS=${CALLS:-100}
ROUNDS=${ROUNDS:-3}
MODES=${MODES:-busy}
BEFORE=${BEFORE:-}
REPORT=${REPORT:-1}
TMP=$(mktemp -d /tmp/waitroom-rc.XXXXXX)
# shellcheck source=loadtest/lib.sh
source "$ROOT/loadtest/lib.sh"
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building the test binary"
cargo test -q --test api --no-run 2>&1 | grep -v '^ *Executable' >&2 || true
start_redis
STAMP=$(date -u +%Y%m%dT%H%MZ)
: >"$TMP/rows.tsv"
for mode in $MODES; do
  case $mode in
    busy) pace=0 ;;
    paced) pace=1000 ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  log "measuring ($mode): lines $LINES, $CALLS calls x $ROUNDS rounds"
  REDIS_COST_URL=$REDIS_URL REDIS_COST_LINES=$LINES REDIS_COST_CALLS=$CALLS \
    REDIS_COST_ROUNDS=$ROUNDS REDIS_COST_PACE_US=$pace REDIS_COST_TSV=$TMP/$mode.tsv \
    timeout 900 cargo test -q --test api redis_commands::redis_cost -- --ignored --nocapture --exact \
    >"$TMP/test.log" 2>&1 || { cat "$TMP/test.log" >&2; exit 1; }
  grep -E '^line of' "$TMP/test.log" >&2 || true
  if [[ -s "$TMP/rows.tsv" ]]; then tail -n +2 "$TMP/$mode.tsv" >>"$TMP/rows.tsv"; else cat "$TMP/$mode.tsv" >"$TMP/rows.tsv"; fi
done

# The table: per line length and script, µs per unit, the plain join's µs
# per call beside it, the ratio, commands per call (and "before" columns
# from BEFORE's rows of the same length and script).
table() {
  python3 - "$TMP/rows.tsv" "$BEFORE" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter='\t'))
before = {}
if sys.argv[2]:
    for r in csv.DictReader(open(sys.argv[2]), delimiter='\t'):
        before[(r.get('mode', 'busy'), r['length'], r['script'])] = r
if before:
    print('| mode | line | script | unit | µs before | ratio before | µs now | plain µs | ratio now | commands/call before | commands/call now | commands now |')
    print('|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|')
else:
    print('| mode | line | script | unit | Redis µs | plain µs | ratio | commands/call | commands |')
    print('|---|---:|---|---|---:|---:|---:|---:|---|')
for r in rows:
    line = f"{int(r['length']):,}"
    if before:
        b = before.get((r['mode'], r['length'], r['script']), {})
        print(f"| {r['mode']} | {line} | {r['script']} | {r['unit']} | {b.get('us_per_unit', '–')} | {b.get('ratio', '–')}x "
              f"| {r['us_per_unit']} | {r['plain_us_per_call']} | **{r['ratio']}x** "
              f"| {b.get('commands_per_call', '–')} | {r['commands_per_call']} | {r['commands']} |")
    else:
        print(f"| {r['mode']} | {line} | {r['script']} | {r['unit']} | {r['us_per_unit']} | {r['plain_us_per_call']} "
              f"| **{r['ratio']}x** | {r['commands_per_call']} | {r['commands']} |")
EOF
}
table
[[ "$REPORT" == 1 ]] || exit 0

OUT=docs/benchmarks/redis-cost-$STAMP.md
cp "$TMP/rows.tsv" "docs/benchmarks/redis-cost-$STAMP.tsv"
{
  echo "# Redis time per script call, $STAMP"
  echo
  echo "What each buyer-facing script costs Redis per call, next to the plain"
  echo "one-Lua-call join (loadtest/plain-join/src/join.lua: ZSCORE, INCR, ZADD,"
  echo "ZRANK, ZCARD) measured right before it in the same run; the ratio is"
  echo "script / plain (median over the rounds of each adjacent pair)."
  [[ -n "${NOTE:-}" ]] && { echo; echo "$NOTE"; }
  echo
  echo "- Command: \`LINES=\"$LINES\" CALLS=$CALLS ROUNDS=$ROUNDS MODES=\"$MODES\"${BEFORE:+ BEFORE=$BEFORE} loadtest/redis-cost.sh\`"
  echo "- Commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src/store/redis || echo ' (Lua or store changed since)')"
  echo "- Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
  echo "- Redis: $(redis-server --version | awk '{print $3}' | sed 's/v=//'), private, no persistence"
  echo "- How: through the store API (tests/api/redis_commands.rs \`redis_cost\`),"
  echo "  mode busy: 8 calls in flight (Redis runs them back to back); mode paced:"
  echo "  a call at a time, 1 ms apart (Redis idle in between, a cold core each call,"
  echo "  and each join its own time mark). CONFIG RESETSTAT before each measured"
  echo "  phase, INFO commandstats after: \`cmdstat_evalsha\` usec/calls is the µs"
  echo "  per call, every other row's calls per script call its commands."
  echo "  The line: the first min(length, 1,000) buyers joined one a millisecond"
  echo "  (each entry its own time mark, the dearest to write and read; the measured"
  echo "  buyers are these), the rest in groups. Joins and polls use the HTTP layer's"
  echo "  budget (2/s, burst 10, 2 s grace), no address limits; admission 50 a pass"
  echo "  with the absent sweep on (120 s), passes run as the mode runs every call"
  echo "  (its budget never the limit); a stream re-read is 100 buyers a call;"
  echo "  sessions start on the released buyers' tokens; the fairness log gets"
  echo "  appends of 50 leaves, proofs of a random leaf, 300-byte heads."
  echo "  Units: µs per call, or per buyer served where the unit says so."
  echo
  table
  echo
  echo "Rows: docs/benchmarks/redis-cost-$STAMP.tsv."
} >"$OUT"
log "wrote $OUT"
