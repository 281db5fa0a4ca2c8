#!/usr/bin/env bash
# The built-in reverse proxy (--origin) in headless Chromium, in front of
# the shop of tests/front/origin.mjs. See tests/front/proxy.test.mjs.
#
#   tests/front/run.sh                      build the server, run the test
#   WAITROOM_BIN=/path/to/waitroom run.sh   test an existing binary
#
# Chromium and playwright-core come with the page tests (tests/browser).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
if [ ! -x /usr/bin/chromium ] && [ -z "${CHROMIUM_PATH:-}" ]; then
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -qq
  timeout 900 apt-get install -y -qq chromium >/dev/null
fi
if [ ! -d "$root/tests/browser/node_modules/playwright-core" ]; then
  (cd "$root/tests/browser" && timeout 300 npm ci --no-audit --no-fund)
fi
if [ -z "${WAITROOM_BIN:-}" ]; then
  (cd "$root" && timeout 1800 cargo build --bin waitroom)
  export WAITROOM_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/waitroom"
fi
mkdir -p "$root/tests/browser/screenshots"
cd "$here"
# Bounded: 3 minutes for the whole run.
exec timeout --kill-after=20 180 node --test --test-concurrency=1 --test-timeout=150000 proxy.test.mjs
