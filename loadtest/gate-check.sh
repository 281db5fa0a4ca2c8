#!/usr/bin/env bash
# The gateway check (GET /api/gate/check with a valid pass: the hot path of
# every request nginx auth_request or Caddy forward_auth sends) against the
# floor of any HTTP answer on this machine: nginx answering a static 204.
# Same run, loopback, wrk; A G P P G A (nginx, the check on the gateway
# listener --gate-addr, the check on the public listener --addr, ...) so a
# drift of the shared machine's load hits all alike. Target: the gateway
# listener >= 0.8x nginx's requests/s (the public listener's figure is
# reported beside it). Writes docs/benchmarks/gate-check-<UTC stamp>.md.
#
#   loadtest/gate-check.sh                      release build, 10 s per leg
#   SECS=5 CONNS=32 loadtest/gate-check.sh      shorter, fewer connections
#   SERVER_BIN=/path/to/waitroom gate-check.sh  an existing binary
#
# Needs wrk, nginx (/usr/sbin/nginx), openssl, curl. Bounded: four legs of
# SECS each, every wait with a deadline.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
SECS=${SECS:-10}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
NGINX=${NGINX_PATH:-/usr/sbin/nginx}
TMP=$(mktemp -d)
RUN=$(printf '%08x' $RANDOM$RANDOM)
source "$here/lib.sh"
trap cleanup EXIT

if [[ -z "${SERVER_BIN:-}" ]]; then
  (cd "$root" && timeout 1800 cargo build --release --bin waitroom)
  SERVER_BIN="${CARGO_TARGET_DIR:-$root/target}/release/waitroom"
fi

# waitroom: memory store, header identity (the benchmark's one visitor).
openssl genpkey -algorithm ed25519 -out "$TMP/pass.pem" 2>/dev/null
WR_PORT=$(free_port)
GATE_PORT=$(free_port)
"$SERVER_BIN" --addr "127.0.0.1:$WR_PORT" --admin-addr "127.0.0.1:$(free_port)" \
  --gate-addr "127.0.0.1:$GATE_PORT" \
  --identity header --orders off --pass-key "$TMP/pass.pem" \
  --session-max-secs 3600 --session-idle-secs 3600 \
  --connections-per-address 0 >"$TMP/waitroom.log" 2>&1 &
SERVER_PID=$!
wait_ready "127.0.0.1:$WR_PORT"
ticket=$(curl -fsS -X POST -H 'x-user-id: bench' "http://127.0.0.1:$WR_PORT/api/queues/default/entries" |
  sed -n 's/.*"ticket":"\([^"]*\)".*/\1/p')
# Admission runs once a second: until then the pass endpoint answers 409
# not_admitted, so ask again (10 s at most).
pass=""
for _ in $(seq 1 40); do
  pass=$(curl -sS -H 'x-user-id: bench' -H "x-queue-ticket: $ticket" -H 'accept: application/json' \
    "http://127.0.0.1:$WR_PORT/api/queues/default/pass" | sed -n 's/.*"pass":"\([^"]*\)".*/\1/p')
  [[ -n "$pass" ]] && break
  sleep 0.25
done
[[ -n "$pass" ]] || { log "no pass"; cat "$TMP/waitroom.log" >&2; exit 1; }
code=$(curl -s -o /dev/null -w '%{http_code}' -H "cookie: waitroom_pass=$pass" \
  "http://127.0.0.1:$WR_PORT/api/gate/check?queue=default")
[[ "$code" == 200 ]] || { log "the check answered $code"; exit 1; }
code=$(curl -s -o /dev/null -w '%{http_code}' -H "cookie: waitroom_pass=$pass" \
  "http://127.0.0.1:$GATE_PORT/api/gate/check?queue=default")
[[ "$code" == 200 ]] || { log "the gateway listener answered $code"; exit 1; }

# nginx: a static 204, as many workers as cores.
NG_PORT=$(free_port)
mkdir -p "$TMP/nginx/tmp"
cat >"$TMP/nginx/nginx.conf" <<NGINX
daemon off;
worker_processes auto;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $TMP/nginx/tmp/body;
  proxy_temp_path $TMP/nginx/tmp/proxy;
  fastcgi_temp_path $TMP/nginx/tmp/fastcgi;
  uwsgi_temp_path $TMP/nginx/tmp/uwsgi;
  scgi_temp_path $TMP/nginx/tmp/scgi;
  server {
    listen 127.0.0.1:$NG_PORT;
    location = /204 { return 204; }
  }
}
NGINX
chmod -R 777 "$TMP/nginx/tmp"
"$NGINX" -c "$TMP/nginx/nginx.conf" -p "$TMP/nginx" &
EXTRA_PIDS+=($!)
for _ in $(seq 1 100); do
  curl -fsS -o /dev/null "http://127.0.0.1:$NG_PORT/204" 2>/dev/null && break
  sleep 0.1
done

# One leg: requests/s and p99 (ms) of wrk against URL.
leg() {
  local url=$1 out
  out=$(timeout $((SECS + 30)) wrk -t"$THREADS" -c"$CONNS" -d"${SECS}s" --latency \
    -H "cookie: waitroom_pass=$pass" "$url")
  echo "$out" >>"$TMP/wrk.txt"
  local rps p99 non2xx
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $5}')
  echo "$rps ${p99:-?} ${non2xx:-0}"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
NG_URL="http://127.0.0.1:$NG_PORT/204"
WR_URL="http://127.0.0.1:$WR_PORT/api/gate/check?queue=default"
GATE_URL="http://127.0.0.1:$GATE_PORT/api/gate/check?queue=default"
log "nginx 204 vs the gateway check, ${SECS}s legs, $CONNS connections, A G P P G A"
read -r n1 n1p n1x < <(leg "$NG_URL")
read -r g1 g1p g1x < <(leg "$GATE_URL")
read -r w1 w1p w1x < <(leg "$WR_URL")
read -r w2 w2p w2x < <(leg "$WR_URL")
read -r g2 g2p g2x < <(leg "$GATE_URL")
read -r n2 n2p n2x < <(leg "$NG_URL")
[[ "$g1x$g2x$w1x$w2x" == "0000" ]] || { log "the check answered non-2xx: $g1x $g2x $w1x $w2x"; exit 1; }
ratio=$(awk -v a="$n1" -v b="$g1" -v c="$g2" -v d="$n2" 'BEGIN { printf "%.2f", (b + c) / (a + d) }')
public=$(awk -v a="$n1" -v b="$w1" -v c="$w2" -v d="$n2" 'BEGIN { printf "%.2f", (b + c) / (a + d) }')
log "nginx: $n1 $n2 req/s; gateway listener: $g1 $g2 (ratio $ratio); public listener: $w1 $w2 (ratio $public)"

stamp=$(date -u +%Y%m%dT%H%MZ)
report="$root/docs/benchmarks/gate-check-$stamp.md"
cat >"$report" <<REPORT
# The gateway check vs nginx answering a static 204 ($stamp)

\`loadtest/gate-check.sh\` (SECS=$SECS, CONNS=$CONNS, THREADS=$THREADS):
wrk on loopback, six legs A G P P G A, every request with the same valid
pass cookie (the check's hot path: the cache of verified passes, a clock
read, the local set of ended sessions, an activity note). waitroom: the
release build at $(cd "$root" && git rev-parse --short HEAD)$(cd "$root" && git diff --quiet HEAD -- src || echo " with uncommitted changes to src/"), memory store; G is the check on the
gateway listener (\`--gate-addr\`, what deploy/ points gateways at), P on
the public listener (\`--addr\`, below the buyers' transport).
nginx: \`worker_processes auto\`, \`return 204\`.

Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),
load average $load_before before the run, $(cut -d' ' -f1-3 /proc/loadavg) after, shared with
other builds: read the ratio, not the absolute figures.

| leg | requests/s | p99 |
|---|---:|---:|
| nginx 204 (A) | $n1 | $n1p |
| check, gateway listener (G) | $g1 | $g1p |
| check, public listener (P) | $w1 | $w1p |
| check, public listener (P) | $w2 | $w2p |
| check, gateway listener (G) | $g2 | $g2p |
| nginx 204 (A) | $n2 | $n2p |

**Ratio, gateway listener / nginx: ${ratio}x** (target ≥ 0.8x).
Public listener / nginx: ${public}x.
REPORT
log "report: $report"
