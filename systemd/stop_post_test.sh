#!/bin/sh
# ctest systemd_stop_post_test: tandemd-stop-post on real cgroups.
#
#   stop_post_test.sh HELPER
#
# Builds a stand-in for a delegated unit's cgroup beneath this test's own
# cgroup-v2 cgroup (tandem-sdtest-<pid>/ with .control, daemon and
# tandem/tools/<session>/<call> holding a tool and a daemonised
# grandchild), then runs the helper in .control as systemd would:
#   1. from a cgroup not named .control it does nothing;
#   2. with no controllers on it keeps the tools (they are adopted later);
#   3. with controllers on (only where this host's v2 hierarchy offers
#      some), or forced, it kills the tools and removes everything but
#      .control, and turns the controllers off.
# Needs root and a cgroup-v2 mount; exits 77 (skipped) otherwise. Everything
# is removed on every exit path.
# The sh -c '...' snippets take their values as arguments, on purpose; the
# functions are reached through check and trap.
# shellcheck disable=SC2016,SC2317
set -u
helper=$1

skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (writes cgroupfs)"
own=$(sed -n 's/^0:://p' /proc/self/cgroup)
mnt=$(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") { if ($(i + 1) == "cgroup2") { print $5; exit } break } }' \
  /proc/self/mountinfo)
if [ -z "$own" ] || [ -z "$mnt" ]; then
  skip "no cgroup v2 hierarchy mounted"
fi
base=$mnt${own%/}
unit=$base/tandem-sdtest-$$
[ -e "$base/cgroup.procs" ] || skip "cannot see our own cgroup $base"

pids=
cleanup() {
  for p in $pids; do kill -9 "$p" 2>/dev/null; done
  if [ -d "$unit" ]; then
    [ -e "$unit/cgroup.kill" ] && echo 1 >"$unit/cgroup.kill" 2>/dev/null
    sleep 0.2
    find "$unit" -depth -type d -exec rmdir {} \; 2>/dev/null
  fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

failures=0
check() {  # check DESCRIPTION COMMAND...
  what=$1
  shift
  if "$@"; then
    echo "ok: $what"
  else
    echo "FAIL: $what"
    failures=$((failures + 1))
  fi
}
alive() { for p in $pids; do kill -0 "$p" 2>/dev/null || return 1; done; }
# Gone or a zombie (the tool is our child until we reap it).
dead() {
  for p in $pids; do
    [ -e "/proc/$p/stat" ] || continue
    [ "$(sed 's/^.*) //' "/proc/$p/stat" | cut -d' ' -f1)" = Z ] || return 1
  done
  return 0
}

# Runs the helper with its process in cgroup $1 (relative to $unit's parent
# dir or absolute), further arguments passed on; prints its output.
run_helper_in() {
  cg=$1
  shift
  sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$cg" "$helper" "$@"
}

# A tool and its daemonised grandchild in tandem/tools/<session>/<call>.
start_tool() {
  call=$unit/tandem/tools/0123456789abcdef/1
  mkdir -p "$call" "$unit/daemon" "$unit/.control" "$unit/elsewhere"
  sh -c 'echo $$ >"$1/cgroup.procs" && (setsid sleep 300 >/dev/null 2>&1 &) && exec sleep 300' sh "$call" &
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    n=$(wc -l <"$call/cgroup.procs")
    [ "$n" -ge 2 ] && break
    sleep 0.1
  done
  pids=$(tr '\n' ' ' <"$call/cgroup.procs")
  echo "tool processes in $call: $pids"
  [ "$(echo "$pids" | wc -w)" -ge 2 ]
}

mkdir "$unit" || skip "cannot create $unit"
check "a tool and a daemonised grandchild start in the stand-in's tool cgroup" start_tool

# 1. Not in .control: nothing happens.
out=$(run_helper_in "$unit/elsewhere" --even-without-controllers 2>&1)
echo "$out"
check "outside .control it does nothing" sh -c 'printf "%s" "$1" | grep -q "nothing done"' sh "$out"
check "... and the tools still run" alive

# 2. No controllers on: the tools are kept for adoption.
if [ -z "$(cat "$unit/cgroup.subtree_control")" ]; then
  out=$(run_helper_in "$unit/.control" 2>&1)
  rc=$?
  echo "$out"
  check "without controllers it exits 0" [ "$rc" -eq 0 ]
  check "... says the tools are left for the next tandemd" sh -c 'printf "%s" "$1" | grep -q "left for the next tandemd"' sh "$out"
  check "... and the tools still run" alive
  check "... in their cgroup" [ -d "$unit/tandem/tools/0123456789abcdef/1" ]
fi

# 3. Controllers on (turned on here if this host's v2 hierarchy offers one
#    to the stand-in), else forced: the tools die and the subtree goes.
on=
for c in pids memory cpu; do
  if grep -qw "$c" "$unit/cgroup.controllers" && echo "+$c" >"$unit/cgroup.subtree_control" 2>/dev/null; then
    on="$on $c"
  fi
done
if [ -n "$on" ]; then
  echo "controllers on in the stand-in:$on"
  out=$(run_helper_in "$unit/.control" 2>&1)
else
  echo "note: this host's cgroup v2 offers no controller to the stand-in (hybrid hierarchy?); forcing"
  out=$(run_helper_in "$unit/.control" --even-without-controllers 2>&1)
fi
rc=$?
echo "$out"
check "clearing exits 0" [ "$rc" -eq 0 ]
check "... counts the 2 leftover processes" sh -c 'printf "%s" "$1" | grep -q "killing 2 leftover"' sh "$out"
sleep 0.2
check "... the tool and its grandchild are dead" dead
check "... tandem/, daemon/ and the other children are removed" \
  sh -c '[ ! -e "$1/tandem" ] && [ ! -e "$1/daemon" ] && [ ! -e "$1/elsewhere" ]' sh "$unit"
check "... .control is left to systemd" [ -d "$unit/.control" ]
check "... no controller is on any more" [ -z "$(cat "$unit/cgroup.subtree_control")" ]
if [ -n "$on" ]; then
  # What systemd does next: start tandemd in the unit's cgroup itself.
  check "... a process can join the unit's own cgroup again" \
    sh -c 'echo $$ >"$1/cgroup.procs" && echo $$ >"$2/cgroup.procs"' sh "$unit" "$base"
fi

[ "$failures" -eq 0 ] && echo "OK: all checks passed"
exit $((failures != 0))
