#!/usr/bin/env bash
# loadtest/million.sh: the embedded (memory) store grown to a million.
#
# For each server binary (this tree's release build, and the baseline's
# when BASE_BIN is given): a fresh release server with the memory store,
# admission at BATCH per second, then `sse-gen million`: CONCURRENCY
# connections join new buyers closed-loop until WAITING wait, while STREAMS
# of the first joiners hold SSE streams and POLLS position polls a second
# run. Prints one table: joins/s, join p50/p99/max, RSS growth per waiting
# buyer at SAMPLE_AT waiting and at the end, and the ratio new/base.
#
# Loopback only; each run is bounded by RUN_SECS; every process started
# here is stopped on exit. The runs go one after the other, never together.
#
# env (defaults): WAITING (1000000), SAMPLE_AT (200000), CONCURRENCY (64),
#   STREAMS (300), POLLS (100 per second), BATCH (500), RUN_SECS (180),
#   BASE_BIN (unset: no baseline; e.g. a release build of main),
#   RESULTS_DIR (loadtest/results), SKIP_BUILD (unset).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD

WAITING=${WAITING:-1000000}
SAMPLE_AT=${SAMPLE_AT:-200000}
CONCURRENCY=${CONCURRENCY:-64}
STREAMS=${STREAMS:-300}
POLLS=${POLLS:-100}
BATCH=${BATCH:-500}
RUN_SECS=${RUN_SECS:-180}
RESULTS_DIR=${RESULTS_DIR:-loadtest/results}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
GEN=$TARGET/release/sse-gen
NEW_BIN=$TARGET/release/waitroom

mkdir -p "$RESULTS_DIR"
RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)
TMP=$(mktemp -d /tmp/waitroom-million.XXXXXX)
ADMIN_TOKEN=adm$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
# shellcheck source=loadtest/lib.sh
source "$ROOT/loadtest/lib.sh"
trap cleanup EXIT
trap 'exit 130' INT TERM

ulimit -n "$(ulimit -Hn)"

if [[ -z "${SKIP_BUILD:-}" ]]; then
  log "building release binaries"
  cargo build --release --bin waitroom >&2
  cargo build --release -p sse-gen >&2
fi

# run NAME BINARY: one server, one `sse-gen million`; $RESULTS_DIR/million-NAME.json.
run() {
  local name=$1 bin=$2
  local addr=127.0.0.1:$(free_port) admin=127.0.0.1:$(free_port)
  "$bin" --addr "$addr" --admin-addr "$admin" --admin-token "$ADMIN_TOKEN" \
    --identity header --orders off --drain-secs 1 --admission-batch "$BATCH" \
    "${ADDRESS_LIMIT_FLAGS[@]}" >"$TMP/$name-server.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "$addr"
  log "$name: $bin pid $SERVER_PID on $addr; joining until $WAITING wait"
  "$GEN" million --addr "$addr" --admin-addr "$admin" --admin-token "$ADMIN_TOKEN" \
    --pid "$SERVER_PID" --waiting "$WAITING" --sample-at "$SAMPLE_AT" \
    --concurrency "$CONCURRENCY" --streams "$STREAMS" --polls-per-sec "$POLLS" \
    --duration-secs "$RUN_SECS" --out "$RESULTS_DIR/million-$name.json" >&2
  stop_pid "$SERVER_PID"
  SERVER_PID=""
}

run new "$NEW_BIN"
if [[ -n "${BASE_BIN:-}" ]]; then
  run base "$BASE_BIN"
fi

# One markdown table (ratios when there is a baseline).
python3 - "$RESULTS_DIR" "${BASE_BIN:+base}" <<'EOF' | tee "$RESULTS_DIR/million.md"
import json, sys
d, base = sys.argv[1], sys.argv[2]
runs = {n: json.load(open(f"{d}/million-{n}.json")) for n in ["new"] + ([base] if base else [])}
rows = [
    ("joins/s", lambda r: r["joins_per_s"]),
    ("join p50 (ms)", lambda r: r["join_latency_ms"]["p50"]),
    ("join p99 (ms)", lambda r: r["join_latency_ms"]["p99"]),
    ("join max (ms)", lambda r: r["join_latency_ms"]["max"]),
    ("poll p99 (ms)", lambda r: r["poll_latency_ms"]["p99"]),
    ("SSE events read", lambda r: r["events"]),
    ("waiting at the end", lambda r: r["final"]["waiting"]),
    ("B per waiting (RSS) at %s" % (runs["new"]["at_sample"] or {}).get("waiting", "-"),
     lambda r: (r["at_sample"] or {}).get("bytes_per_waiting")),
    ("B per waiting (RSS) at the end", lambda r: r["final"]["bytes_per_waiting"]),
]
head = "| | new |" + (" base | new/base |" if base else "")
print(head)
print("|---|---:|" + ("---:|---:|" if base else ""))
def f(v):
    return "-" if v is None else (f"{v:,.1f}" if isinstance(v, float) else f"{v:,}")
for label, get in rows:
    n = get(runs["new"])
    line = f"| {label} | {f(n)} |"
    if base:
        b = get(runs[base])
        ratio = f"{n / b:.2f}" if n is not None and b else "-"
        line += f" {f(b)} | {ratio} |"
    print(line)
EOF
