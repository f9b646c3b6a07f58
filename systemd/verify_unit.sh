#!/bin/sh
# ctest systemd_unit_verify: checks the unit with `systemd-analyze verify` and
# the sysusers.d entry with `systemd-sysusers --dry-run`.
#
#   verify_unit.sh UNIT SYSUSERS
#
# systemd-analyze exits 0 for a key it does not know or a value it cannot
# parse (it logs "..., ignoring"), so any line that names the unit fails the
# test too. Lines about other units (the host's own, pulled in as
# dependencies) are printed, not counted. Exit 77 (skipped) only when
# systemd-analyze is not installed.
set -u
unit=$1
sysusers=$2
name=$(basename "$unit")

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "SKIPPED: systemd-analyze is not installed (Debian package systemd); $name not verified"
  exit 77
fi

fail=0
systemd-analyze --version | head -n 1
echo "systemd-analyze verify --man=no $unit"
out=$(systemd-analyze verify --man=no "$unit" 2>&1)
rc=$?
[ -n "$out" ] && printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then
  echo "FAIL: systemd-analyze verify exited with $rc"
  fail=1
fi
if printf '%s\n' "$out" | grep -qF "$name"; then
  echo "FAIL: systemd-analyze complained about $name (see above)"
  fail=1
fi

if command -v systemd-sysusers >/dev/null 2>&1; then
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  mkdir -p "$root/etc"
  echo "systemd-sysusers --dry-run $sysusers (into an empty root)"
  out=$(systemd-sysusers --root="$root" --dry-run "$sysusers" 2>&1)
  rc=$?
  [ -n "$out" ] && printf '%s\n' "$out"
  if [ "$rc" -ne 0 ]; then
    echo "FAIL: systemd-sysusers exited with $rc"
    fail=1
  elif ! printf '%s\n' "$out" | grep -q "group 'tandem'"; then
    echo "FAIL: the sysusers entry does not create group tandem"
    fail=1
  fi
else
  echo "note: systemd-sysusers is not installed; $(basename "$sysusers") not checked"
fi

[ "$fail" -eq 0 ] && echo "OK: $name verified"
exit "$fail"
