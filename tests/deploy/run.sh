#!/usr/bin/env bash
# The nginx deployment (deploy/nginx.conf) end to end: nginx in front of two
# waitroom release instances and Redis, the page in Chromium over HTTPS and
# HTTP/2. See tests/deploy/README.md.
#
#   tests/deploy/run.sh                      build the release binary, run the test
#   WAITROOM_BIN=/path/to/waitroom run.sh    test an existing binary
#
# Installs Debian's nginx-light if /usr/sbin/nginx is missing (its service is
# not started: the test runs its own nginx), and Chromium and the Node
# packages through tests/browser. Needs Redis on 127.0.0.1:6379
# (WAITROOM_TEST_REDIS to use another), openssl, Node 20.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export DEBIAN_FRONTEND=noninteractive

apt_install() {
  timeout 600 apt-get update -qq
  timeout 900 apt-get install -y -qq "$@" >/dev/null
}

if [ ! -x "${NGINX_PATH:-/usr/sbin/nginx}" ]; then
  echo "tests/deploy/run.sh: nginx is missing; installing Debian's nginx-light" >&2
  # Keep the package's own service from starting on port 80 where
  # policy-rc.d does not already forbid it.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    rc=0
    apt_install nginx-light || rc=$?
    rm -f /usr/sbin/policy-rc.d
    [ "$rc" -eq 0 ] || exit "$rc"
  else
    apt_install nginx-light
  fi
fi
command -v openssl >/dev/null || apt_install openssl
command -v redis-cli >/dev/null || apt_install redis-tools
if [ ! -x /usr/bin/chromium ] && [ -z "${CHROMIUM_PATH:-}" ]; then
  echo "tests/deploy/run.sh: /usr/bin/chromium is missing; installing Debian's chromium" >&2
  apt_install chromium
fi

# playwright-core lives with the page tests.
if [ ! -d "$root/tests/browser/node_modules/playwright-core" ]; then
  (cd "$root/tests/browser" && timeout 300 npm ci --no-audit --no-fund)
fi

if [ -z "${WAITROOM_BIN:-}" ]; then
  (cd "$root" && timeout 1800 cargo build --release --bin waitroom)
  export WAITROOM_BIN="${CARGO_TARGET_DIR:-$root/target}/release/waitroom"
fi
echo "tests/deploy/run.sh: $WAITROOM_BIN behind $("${NGINX_PATH:-/usr/sbin/nginx}" -v 2>&1)" >&2

mkdir -p "$root/tests/browser/screenshots"
cd "$here"
# The whole test is bounded: 3 minutes, then everything is killed.
exec timeout --kill-after=20 180 node --test --test-concurrency=1 --test-timeout=150000 nginx.test.mjs
