#!/usr/bin/env bash
# The Debian package, end to end, without installing it on this machine:
# builds it with cargo-deb (installed if missing; reuses the release build
# when it is current), reads its control data and file list with dpkg-deb,
# looks for secrets in it, runs its postinst and postrm against a scratch
# root, checks the unit with systemd-analyze verify, and starts the packaged
# binary from the configuration its postinst wrote: /healthz must answer 200
# on both listeners, SIGTERM must stop it within the unit's stop timeout.
#
# Every external step is bounded; the whole run fails if one hangs.
# WAITROOM_DEB=path skips the build and checks that package.
# WAITROOM_PACKAGE_FROM_DEBUG=1 packages the debug binary already built
# (`cargo deb --profile dev --no-build`) instead of making a release build:
# what scripts/test does, so every CI run checks the package, its unit, its
# maintainer scripts and the packaged binary within CI's time. The package
# to ship is the release one (`cargo deb`, this script without the switch).
set -euo pipefail
cd "$(dirname "$0")/../.."

say() { echo "package: $*" >&2; }
fail() { echo "package: FAIL: $*" >&2; exit 1; }
started=$SECONDS

# --- build --------------------------------------------------------------
deb=${WAITROOM_DEB:-}
if [ -z "$deb" ]; then
  if ! cargo deb --version >/dev/null 2>&1; then
    say "installing cargo-deb"
    # Pinned: a later cargo-deb may refuse the dev profile the CI step uses.
    timeout 900 cargo install cargo-deb --locked --version 3.8.0
  fi
  if [ "${WAITROOM_PACKAGE_FROM_DEBUG:-0}" = 1 ]; then
    say "cargo deb from the debug build"
    out="${CARGO_TARGET_DIR:-$PWD/target}/debian/waitroom-from-debug.deb"
    mkdir -p "$(dirname "$out")"
    timeout 600 cargo deb --profile dev --no-build -o "$out" >&2
    deb=$out
  else
    say "cargo deb (release build, reused when current)"
    deb=$(timeout 1800 cargo deb 2>&1 | tee /dev/stderr | grep -E '\.deb$' | tail -n1)
  fi
fi
[ -f "$deb" ] || fail "no .deb built ($deb)"
say "built $deb in $((SECONDS - started)) s"

work=$(mktemp -d "${TMPDIR:-/tmp}/waitroom-package.XXXXXX")
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
root=$work/root

# --- control data ---------------------------------------------------------
info=$(dpkg-deb -I "$deb")
for field in 'Package: waitroom' 'Depends:.*adduser' 'Depends:.*libc6'; do
  grep -Eq "^ ?$field" <<<"$info" || fail "control lacks '$field'"
done
dpkg-deb -e "$deb" "$work/control"
[ ! -e "$work/control/conffiles" ] || fail "conffiles shipped: $(cat "$work/control/conffiles")"
for script in postinst postrm prerm; do
  [ ! -e "$work/control/$script" ] || [ -x "$work/control/$script" ] || fail "$script not executable"
done
# Installed, never enabled nor started: no maintainer script starts or
# restarts the unit, and one enables it only where the operator had
# (`was-enabled`: dh_installsystemd's way of keeping that choice on upgrade).
if grep -nE '^[^#]*(deb-systemd-invoke +(start|restart|try-restart)|systemctl +(--[a-z-]+ +)*(enable|start|restart))' \
    "$work/control"/p*; then
  fail "a maintainer script starts the unit"
fi
awk '/was-enabled/ { guarded = NR } /deb-systemd-helper +enable/ && NR - guarded > 3 { print FILENAME ":" NR ": " $0; bad = 1 }
     END { exit bad }' "$work/control"/p* || fail "a maintainer script enables the unit on its own"

# --- files ----------------------------------------------------------------
listing=$(dpkg-deb -c "$deb")
expect() { # mode path
  grep -Eq "^$1 (root/root|0/0) .* \./$2\$" <<<"$listing" || fail "no $2 with mode $1 in: $listing"
}
expect '-rwxr-xr-x' 'usr/bin/waitroom'
unit_path=$(grep -Eo '\./(usr/)?lib/systemd/system/waitroom\.service$' <<<"$listing") \
  || fail "no waitroom.service"
expect '-rw-r--r--' "${unit_path#./}"
expect '-rw-r--r--' 'usr/share/doc/waitroom/copyright'
if grep -E ' \./etc/' <<<"$listing"; then
  fail "the package ships files under /etc (the configuration is written at install time)"
fi
dpkg-deb -x "$deb" "$root"
cmp -s "$root/${unit_path#./}" deploy/debian/waitroom.service || fail "packaged unit differs from deploy/debian/waitroom.service"

# --- no secret inside -----------------------------------------------------
# The secrets `waitroom init` writes are 64 hex digits: none in any text
# file, no `key = "value"` for a secret anywhere (the binary included), no
# private key.
secret_keys='(ticket_secret|admin_token|service_token|jwt_secret|secret|token) *= *"[^"]{8,}'
if grep -rlaE "$secret_keys" "$root" "$work/control"; then
  fail "a secret-looking assignment is inside the package"
fi
if grep -rlaE -- '-----BEGIN ([A-Z]+ )?PRIVATE KEY-----' "$root" "$work/control"; then
  fail "a private key is inside the package"
fi
while IFS= read -r -d '' f; do
  if grep -Iq . "$f" && grep -qE '(^|[^0-9a-fA-F])[0-9a-f]{64}([^0-9a-fA-F]|$)' "$f"; then
    fail "$f holds a 64-hex-digit value (a generated secret?)"
  fi
done < <(find "$root" "$work/control" -type f -print0)

# --- the binary -------------------------------------------------------------
bin=$root/usr/bin/waitroom
version=$(timeout 10 "$bin" --version)
say "$version"
grep -Eq '^waitroom [0-9]+\.[0-9]+\.[0-9]+ \(commit [^ ,]+, features: [a-z0-9,-]+\)$' <<<"$version" \
  || fail "--version says '$version'"
if [ -z "${WAITROOM_DEB:-}" ] && head=$(git rev-parse --short=12 HEAD 2>/dev/null); then
  grep -q "(commit $head," <<<"$version" || fail "--version names another commit than HEAD ($head)"
fi
# Only the C library's own shared objects: what the README promises.
libs=$(ldd "$bin" | awk '{print $1}' | sed 's|.*/||' | sort)
while read -r lib; do
  case $lib in
    linux-vdso.so.1 | ld-linux-*.so.* | libc.so.6 | libm.so.6 | libgcc_s.so.1 | libpthread.so.0 | libdl.so.2 | librt.so.1) ;;
    *) fail "the binary needs $lib (README lists libc, libm, libgcc_s only)" ;;
  esac
done <<<"$libs"

# --- postinst / postrm on a scratch root -------------------------------------
conf=$root/etc/waitroom/waitroom.toml
WAITROOM_ROOT=$root timeout 30 sh "$work/control/postinst" configure
[ -f "$conf" ] || fail "postinst wrote no $conf"
[ "$(stat -c %a "$conf")" = 640 ] || fail "$conf has mode $(stat -c %a "$conf"), not 640"
for key in secret admin_token service_token; do # [tickets] secret, [auth] *_token
  grep -Eq "^$key = \"[0-9a-f]{64}\"\$" "$conf" || fail "$conf has no fresh $key"
done
# An upgrade (postinst again) keeps the operator's file as it is.
echo '# edited by the operator' >>"$conf"
before=$(sha256sum <"$conf")
WAITROOM_ROOT=$root timeout 30 sh "$work/control/postinst" configure 2
[ "$before" = "$(sha256sum <"$conf")" ] || fail "postinst changed an existing configuration"
# Another install gets other secrets.
other=$work/other
mkdir -p "$other/usr/bin" && cp "$bin" "$other/usr/bin/"
WAITROOM_ROOT=$other timeout 30 sh "$work/control/postinst" configure
[ "$(grep '^admin_token' "$conf")" != "$(grep '^admin_token' "$other/etc/waitroom/waitroom.toml")" ] \
  || fail "two installs got the same admin token"
WAITROOM_ROOT=$other timeout 30 sh "$work/control/postrm" remove
[ -f "$other/etc/waitroom/waitroom.toml" ] || fail "postrm remove deleted the configuration"
WAITROOM_ROOT=$other timeout 30 sh "$work/control/postrm" purge
[ ! -e "$other/etc/waitroom" ] || fail "postrm purge left /etc/waitroom"
timeout 30 "$bin" check -c "$conf" >"$work/check.txt" || fail "waitroom check rejects the generated configuration"

# --- the unit ---------------------------------------------------------------
unit=$root/${unit_path#./}
for directive in NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes \
  'CapabilityBoundingSet=$' 'LimitNOFILE=[0-9]+' Restart=on-failure 'TimeoutStopSec=[0-9]+s?' \
  'ExecStart=/usr/bin/waitroom -c /etc/waitroom/waitroom.toml$'; do
  grep -Eq "^$directive" "$unit" || fail "the unit lacks $directive"
done
# The stop timeout covers the drain window, with room to spare.
drain=$(sed -nE 's/^drain_secs *= *([0-9]+).*/\1/p; s/^# drain_secs = ([0-9]+).*/\1/p' "$conf" | head -n1)
stop=$(sed -nE 's/^TimeoutStopSec=([0-9]+)s?$/\1/p' "$unit")
[ -n "$drain" ] || fail "no drain_secs in $conf"
[ "$stop" -ge $((drain + 10)) ] || fail "TimeoutStopSec=$stop does not cover drain_secs=$drain"
# systemd-analyze verify resolves ExecStart on this machine: check a copy
# whose paths point into the scratch root (the rest of it as shipped).
verify_dir=$work/verify
mkdir -p "$verify_dir"
sed -e "s|^ExecStart=/usr/bin/waitroom -c /etc/waitroom/waitroom.toml|ExecStart=$bin -c $conf|" \
  "$unit" >"$verify_dir/waitroom.service"
if ! out=$(SYSTEMD_LOG_LEVEL=notice timeout 60 systemd-analyze verify "$verify_dir/waitroom.service" 2>&1); then
  echo "$out" >&2
  fail "systemd-analyze verify rejects the unit"
fi
# Warnings about the unit itself fail too (others, about this host's units, do not).
if grep -E 'waitroom\.service' <<<"$out"; then
  fail "systemd-analyze verify warns about the unit"
fi

# Its exposure as systemd rates it (0 best, 10 worst): 1.5 when written;
# fail past 2.0 so a loosened unit is noticed.
exposure=$(timeout 60 systemd-analyze security --offline=yes "$verify_dir/waitroom.service" 2>/dev/null \
  | sed -nE 's/.*Overall exposure level for waitroom\.service: ([0-9.]+).*/\1/p')
say "systemd-analyze security: exposure ${exposure:-?}"
[ -n "$exposure" ] || fail "systemd-analyze security gave no rating"
awk -v e="$exposure" 'BEGIN { exit !(e <= 2.0) }' || fail "the unit's exposure is $exposure (> 2.0)"

# --- run it -----------------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
admin_port=$(free_port)
state=$root/var/lib/waitroom
mkdir -p "$state"
# As the unit runs it: the packaged file, the state directory as working
# directory; only the addresses are moved to free ports.
(cd "$state" && exec "$bin" -c "$conf" --addr "127.0.0.1:$port" --admin-addr "127.0.0.1:$admin_port") \
  >"$work/server.log" 2>&1 &
pid=$!
code=
for _ in $(seq 1 100); do
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/healthz" || true)
  [ "$code" = 200 ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/server.log" >&2; fail "the packaged binary exited"; }
  sleep 0.2
done
[ "$code" = 200 ] || { cat "$work/server.log" >&2; fail "/healthz answered '$code', not 200"; }
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$admin_port/healthz" || true)
[ "$code" = 200 ] || fail "operator /healthz answered '$code', not 200"
say "/healthz 200 on 127.0.0.1:$port and 127.0.0.1:$admin_port"
stop_started=$SECONDS
kill -TERM "$pid"
if ! timeout "$stop" tail --pid="$pid" -f /dev/null; then
  fail "SIGTERM did not stop it within TimeoutStopSec=${stop}s"
fi
rc=0
wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || { cat "$work/server.log" >&2; fail "it exited with $rc after SIGTERM"; }
say "stopped in $((SECONDS - stop_started)) s after SIGTERM"
say "ok in $((SECONDS - started)) s"
