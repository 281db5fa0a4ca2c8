#!/usr/bin/env bash
# End-to-end tests of the waiting-room page (static/) in headless Chromium.
#
#   tests/browser/run.sh                      build the server, run every test
#   WAITROOM_BIN=/path/to/waitroom run.sh     test an existing binary
#   run.sh polling.test.js                    run only some test files
#
# Needs Debian's chromium (installed here if missing), Node 20 and npm.
# Screenshots land in tests/browser/screenshots/ (gitignored).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

if [ ! -x /usr/bin/chromium ] && [ -z "${CHROMIUM_PATH:-}" ]; then
  echo "run.sh: /usr/bin/chromium is missing; installing Debian's chromium" >&2
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -qq
  timeout 900 apt-get install -y -qq chromium >/dev/null
fi

cd "$here"
if [ ! -d node_modules/playwright-core ] || [ ! -d node_modules/axe-core ]; then
  if [ -f package-lock.json ]; then
    timeout 300 npm ci --no-audit --no-fund
  else
    timeout 300 npm install --no-audit --no-fund
  fi
fi

if [ -z "${WAITROOM_BIN:-}" ]; then
  (cd "$root" && timeout 1800 cargo build --bin waitroom)
  export WAITROOM_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/waitroom"
fi
echo "run.sh: testing $WAITROOM_BIN with $("${CHROMIUM_PATH:-/usr/bin/chromium}" --version 2>/dev/null || echo chromium)" >&2

mkdir -p screenshots
if [ "$#" -gt 0 ]; then
  files=("$@")
else
  files=(*.test.js)
fi
# One file at a time (each starts its own server and browser); every test
# has its own timeout, and the whole run is bounded too.
exec timeout --kill-after=30 900 node --test --test-concurrency=1 --test-timeout=180000 "${files[@]}"
