#!/usr/bin/env bash
# loadtest/redis-cost.sh: what each buyer-facing script costs Redis per
# call (join, repeat join, poll, touch, stream re-read, leave, admission per
# admitted buyer, claim, consume, release, a protected site's session
# start, touch and end, the fairness log's append per leaf, proof and
# head, the absence walk per present buyer it passes: each buyer is walked
# once in their life, so the admission row's passes run after ones that
# let the walk catch up, and a buyer served costs at most the two rows
# added), next to the plain
# one-Lua-call join of loadtest/plain-join measured in the same run, and the Redis
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
#   each join then its own time mark, the dearest to write; add
#   "instructions": the busy calls counted in instructions by valgrind's
#   callgrind on a redis-server of their own, the same whatever the
#   machine's load, at the lengths of INSTRUCTION_LINES, "1000": a line
#   fills about fifty times slower), BEFORE (a TSV of an earlier run,
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
INSTRUCTION_LINES=${INSTRUCTION_LINES:-1000}

# A redis-server of its own under callgrind (instructions mode): counting
# from the start is off, the test zeroes and dumps the counts around each
# measured phase (callgrind_control).
start_callgrind_redis() {
  CG_PORT=$(free_port)
  mkdir -p "$TMP/cg"
  valgrind --tool=callgrind --callgrind-out-file="$TMP/cg/cg.%p" \
    redis-server --port "$CG_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$TMP" --hz 1 --latency-tracking no >"$TMP/callgrind.log" 2>&1 &
  CG_PID=$!
  EXTRA_PIDS+=("$CG_PID")
  for _ in $(seq 1 100); do
    redis-cli -p "$CG_PORT" ping >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "redis-server under callgrind did not start" >&2
  cat "$TMP/callgrind.log" >&2
  exit 1
}

for mode in $MODES; do
  url=$REDIS_URL lines=$LINES callgrind=""
  case $mode in
    busy) pace=0 ;;
    paced) pace=1000 ;;
    instructions)
      command -v valgrind >/dev/null || apt-get install -y -q valgrind >&2
      start_callgrind_redis
      pace=0 url=redis://127.0.0.1:$CG_PORT lines=$INSTRUCTION_LINES callgrind="$CG_PID:$TMP/cg"
      ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  log "measuring ($mode): lines $lines, $CALLS calls x $ROUNDS rounds"
  env REDIS_COST_URL="$url" REDIS_COST_LINES="$lines" REDIS_COST_CALLS=$CALLS \
    REDIS_COST_ROUNDS=$ROUNDS REDIS_COST_PACE_US=$pace REDIS_COST_TSV=$TMP/$mode.tsv \
    ${callgrind:+REDIS_COST_CALLGRIND=$callgrind} \
    timeout 1800 cargo test -q --test api redis_commands::redis_cost -- --ignored --nocapture --exact \
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
    print('| mode | line | script | unit | µs before | ratio before | µs now | plain µs | ratio now | plain µs, line of this length | ratio to it | commands/call before | commands/call now | commands now |')
    print('|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|')
else:
    print('| mode | line | script | unit | Redis µs | plain µs | ratio | plain µs, line of this length | ratio to it | commands/call | commands |')
    print('|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|')
for r in rows:
    line = f"{int(r['length']):,}"
    if before:
        b = before.get((r['mode'], r['length'], r['script']), {})
        print(f"| {r['mode']} | {line} | {r['script']} | {r['unit']} | {b.get('us_per_unit', '–')} | {b.get('ratio', '–')}x "
              f"| {r['us_per_unit']} | {r['plain_us_per_call']} | **{r['ratio']}x** "
              f"| {r.get('plain_at_length_us_per_call', '–')} | **{r.get('ratio_at_length', '–')}x** "
              f"| {b.get('commands_per_call', '–')} | {r['commands_per_call']} | {r['commands']} |")
    else:
        print(f"| {r['mode']} | {line} | {r['script']} | {r['unit']} | {r['us_per_unit']} | {r['plain_us_per_call']} "
              f"| **{r['ratio']}x** | {r.get('plain_at_length_us_per_call', '–')} | **{r.get('ratio_at_length', '–')}x** "
              f"| {r['commands_per_call']} | {r['commands']} |")
EOF
}
table
[[ "$REPORT" == 1 ]] || exit 0

OUT=docs/benchmarks/redis-cost-$STAMP.md
CG_LINES=""
[[ " $MODES " == *" instructions "* ]] && CG_LINES=" INSTRUCTION_LINES=\"$INSTRUCTION_LINES\""
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
  echo "- Command: \`LINES=\"$LINES\" CALLS=$CALLS ROUNDS=$ROUNDS MODES=\"$MODES\"$CG_LINES${BEFORE:+ BEFORE=$BEFORE} loadtest/redis-cost.sh\`"
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
  echo "  budget (2/s, burst 10, 2 s grace), no address limits; a group of one is"
  echo "  sent pipelined behind others (its fence written) and, idle, one at a time"
  echo "  as a server whose joins do not overlap sends it (read; its plain joins are"
  echo "  sent one at a time too); admission 50 a pass"
  echo "  with the absent sweep on (after an hour: nobody is dropped), passes run as the mode runs every call"
  echo "  (its budget never the limit), after passes that admit nobody until the"
  echo "  absence walk has caught up with the line (each buyer is walked once in"
  echo "  their life: the absence-walk row); a stream re-read is 100 buyers a call;"
  echo "  sessions start on the released buyers' tokens; the fairness log gets"
  echo "  appends of 50 leaves, proofs of a random leaf, 300-byte heads."
  echo "  Mode instructions: the busy calls on a redis-server of their own run"
  echo "  under valgrind's callgrind, zeroed and dumped where the counters are"
  echo "  reset and read; the µs columns of its rows are thousands of"
  echo "  instructions (load-independent: the same scripts and data give the"
  echo "  same counts)."
  echo "  The plain join is measured twice before each script: on a line of its"
  echo "  own (at most a phase's 100 calls long: Redis keeps it a listpack, all"
  echo "  of it in cache; the baseline as first measured) and on a line as long"
  echo "  as the measured one (same data size as the script's: a skiplist of"
  echo "  that many buyers), each with its ratio."
  echo "  Units: µs per call, or per buyer served where the unit says so."
  echo
  table
  echo
  echo "Rows: docs/benchmarks/redis-cost-$STAMP.tsv."
} >"$OUT"
log "wrote $OUT"
