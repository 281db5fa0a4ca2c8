#!/usr/bin/env bash
# waitroom behind real gateways in front of an unchanged shop, in real
# Chromium: nginx auth_request (deploy/nginx-auth-request.conf) and Caddy 2
# forward_auth (deploy/Caddyfile). See tests/front/gateway.test.mjs.
#
#   tests/front/gateway.sh                    the debug build (cargo build)
#   WAITROOM_BIN=/path/to/waitroom gateway.sh an existing binary
#
# Installs Debian's nginx-light and caddy if missing (their services are not
# used: the test runs its own), Chromium and the Node packages through
# tests/browser. Bounded: 4 minutes in all.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export DEBIAN_FRONTEND=noninteractive

apt_install() {
  timeout 600 apt-get update -qq
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    rc=0
    timeout 900 apt-get install -y -qq "$@" >/dev/null || rc=$?
    rm -f /usr/sbin/policy-rc.d
    return "$rc"
  fi
  timeout 900 apt-get install -y -qq "$@" >/dev/null
}

[ -x "${NGINX_PATH:-/usr/sbin/nginx}" ] || apt_install nginx-light
[ -x "${CADDY_PATH:-/usr/bin/caddy}" ] || apt_install caddy
if [ ! -x /usr/bin/chromium ] && [ -z "${CHROMIUM_PATH:-}" ]; then
  apt_install chromium
fi
if [ ! -d "$root/tests/browser/node_modules/playwright-core" ]; then
  (cd "$root/tests/browser" && timeout 300 npm ci --no-audit --no-fund)
fi
if [ -z "${WAITROOM_BIN:-}" ]; then
  (cd "$root" && timeout 1200 cargo build --bin waitroom)
  export WAITROOM_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/waitroom"
fi
cd "$here"
exec timeout --kill-after=20 240 node --test --test-concurrency=1 --test-timeout=110000 gateway.test.mjs
