#!/usr/bin/env bash
# loadtest/lottery-draw.sh: what the draw of a scheduled opening with N
# pre-queue entries (default 100,000) does to Redis, two builds A B B A in
# one run: the longest single Redis call (SLOWLOG, every call over 1 ms
# kept), the longest PING a bystander client waited meanwhile (every other
# queue, join and pass waits that long), and the draw's total time (from
# opensAt to the moment the lottery reads drawn: the 250 ms look, the
# read, the sort and the apply). Each run: a redis-server of its own, one fresh
# instance, the pre-queue written straight into Redis (HSET; quicker than
# N HTTP joins, same records), opensAt 2 s ahead. Bounded: one draw per
# run, 60 s at most each. Loopback only.
#   loadtest/lottery-draw.sh [N] [BASELINE_BIN] [CANDIDATE_BIN]
# (default: /tmp/waitroom-main and target/release/waitroom).
set -euo pipefail
cd "$(dirname "$0")/.."
source loadtest/lib.sh
N=${1:-100000}
BIN_A=${2:-/tmp/waitroom-main}
BIN_B=${3:-target/release/waitroom}
TMP=$(mktemp -d /tmp/waitroom-lottery.XXXXXX)
RUN=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
ADMIN_TOKEN=adm$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
TICKET_SECRET=sec$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
trap cleanup EXIT
start_redis

schedule() {
  curl -fsS -XPUT "http://$ADMIN_ADDR/api/admin/queues/default/lottery" \
    -H "Authorization: Bearer $ADMIN_TOKEN" -H 'content-type: application/json' \
    -d "{\"opensAt\": $1}" >/dev/null
}

store_ms() {
  redis-cli -p "$REDIS_PORT" --raw TIME | awk 'NR==1{s=$1} NR==2{printf "%d\n", s*1000 + int($1/1000)}'
}

# The pre-queue: N records user -> 'preEntry:nonce', the entry counter
# past them, the version bumped (what N pre-queue joins leave).
POPULATE='
local pre, lot, seq, n = KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1])
local base = 1000000
for lo = 1, n, 1000 do
  local args = {}
  for i = lo, math.min(n, lo + 999) do
    args[#args + 1] = string.format("u%07d", i)
    args[#args + 1] = string.format("%d:%08x%08x", base + i, i, (i * 2654435761) % 4294967296)
  end
  redis.call("HSET", pre, unpack(args))
end
redis.call("SET", seq, base + n)
redis.call("HINCRBY", lot, "version", 1)
return redis.call("HLEN", pre)'

# Watches one draw: PINGs as fast as answered (the longest wait), until
# the lottery is drawn; then the slow log's longest call. One line of
# key=value.
PROBE='
import socket, sys, time
port, lot, waiting = int(sys.argv[1]), sys.argv[2], sys.argv[3]
s = socket.create_connection(("127.0.0.1", port)); f = s.makefile("rb")
def cmd(*a):
    s.sendall(b"*%d\r\n" % len(a) + b"".join(b"$%d\r\n%s\r\n" % (len(x.encode()), x.encode()) for x in a))
    return read()
def read():
    line = f.readline()[:-2]; t, rest = line[:1], line[1:]
    if t in (b"+", b"-"): return rest.decode()
    if t == b":": return int(rest)
    if t == b"$":
        n = int(rest)
        if n < 0: return None
        d = f.read(n + 2)[:-2]; return d.decode(errors="replace")
    if t == b"*":
        n = int(rest); return None if n < 0 else [read() for _ in range(n)]
    raise ValueError(line)
worst, slow, pings, end = 0.0, 0, 0, time.time() + 60
while time.time() < end:
    t = time.perf_counter(); cmd("PING"); rtt = (time.perf_counter() - t) * 1e3
    worst, pings = max(worst, rtt), pings + 1
    slow += rtt > 50
    if pings % 20 == 0 and cmd("HGET", lot, "state") == "drawn":
        break
seen = time.time() * 1e3
opens = int(cmd("HGET", lot, "opensAt"))
log = cmd("SLOWLOG", "GET", "-1")
calls = sorted(((e[2], " ".join(a[:24] for a in e[3][:3])) for e in log), reverse=True)
longest = calls[0] if calls else (0, "-")
print("draw_total_ms=%d longest_call_ms=%.1f calls_over_1ms=%d calls_over_50ms=%d "
      "longest_ping_ms=%.1f pings_over_50ms=%d placed=%d"
      % (seen - opens, longest[0] / 1e3, len(calls),
         sum(1 for c in calls if c[0] > 50000), worst, slow, cmd("ZCARD", waiting)))
for us, what in calls[:4]:
    print("  slowlog %.1f ms: %s" % (us / 1e3, what))
'

one_run() {
  local name=$1 bin=$2
  SERVER_BIN=$bin start_server "$name" --max-active 0 --abandon-after-secs 600
  local base="$PREFIX:{default}:"
  schedule $(( $(store_ms) + 600000 ))
  redis-cli -p "$REDIS_PORT" EVAL "$POPULATE" 3 "${base}lottery:pre" "${base}lottery" "${base}seq" "$N" >/dev/null
  redis-cli -p "$REDIS_PORT" CONFIG SET slowlog-log-slower-than 1000 >/dev/null
  redis-cli -p "$REDIS_PORT" CONFIG SET slowlog-max-len 100000 >/dev/null
  redis-cli -p "$REDIS_PORT" SLOWLOG RESET >/dev/null
  schedule $(( $(store_ms) + 2000 ))
  local out
  out=$(python3 -c "$PROBE" "$REDIS_PORT" "${base}lottery" "${base}waiting")
  echo "$name $(basename "$bin") N=$N $out load=\"$(uptime | sed 's/.*load average: //')\""
  grep -h "lottery draw applied" "$TMP/$name-server.log" | sed 's/^/  server: /' || true
}

log "N=$N, A=$BIN_A, B=$BIN_B; $(uptime)"
one_run a1 "$BIN_A"
one_run b1 "$BIN_B"
one_run b2 "$BIN_B"
one_run a2 "$BIN_A"
