#!/usr/bin/env bash
# What the audit log costs an admission pass: one `admit` of 5,000 waiting
# buyers with the log on (--audit-max-len 100000) and off (0), four of
# each in A B B A order on the shared Redis (127.0.0.1:6379), reported as
# on/off mean time and their ratio. About 30 s; loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
timeout 600 cargo test -q --test api audit::cost_of_the_log_per_admission_pass -- --ignored --nocapture 2>&1 \
  | grep -E '^admit of|test result'
