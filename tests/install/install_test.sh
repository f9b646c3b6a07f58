#!/usr/bin/env bash
# tests/install: `cmake --install` of the build into a temporary root
# (DESTDIR), then checks of the installed tree and of what a user builds
# against it (docs/install.md):
#   1. the layout: tandemd in sbin, tandemctl in bin, libtandem.so.N with its
#      links and soname, headers, tandem.pc, the CMake package, the config
#      and its copy under the doc dir, the Python binding; no test, bench or
#      simulator binary; no RUNPATH in any installed ELF file; libtandem
#      exports tandem_* only and resolves every library it needs;
#   2. the installed tandemd accepts the installed config (--check-config);
#   3. an external C client built with pkg-config, and the same C client plus
#      a C++ one (tandem.hpp) built by a CMake project with
#      find_package(tandem) — both found in the temporary root only;
#   4. the clients run against the installed library (fail-open, no daemon)
#      and print the session id libtandem must compute; the installed Python
#      binding loads the installed library and agrees.
#
# Environment (set by tests/install/CMakeLists.txt): TANDEM_BUILD_DIR,
# TANDEM_SOURCE_DIR, TANDEM_VERSION, TANDEM_API_VERSION, TANDEM_PREFIX and
# TANDEM_{SBIN,BIN,LIB,INCLUDE,SYSCONF,DOC,PYTHON}DIR (absolute, before
# DESTDIR), CMAKE, CC, CXX, PYTHON, TANDEM_SAN_CFLAGS / TANDEM_SAN_LDFLAGS
# (the sanitizer flags of a TANDEM_SANITIZE build: its libtandem.so needs the
# sanitizer runtime in the executable), TANDEM_EXPORTS_CHECK.
set -euo pipefail

fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

for v in TANDEM_BUILD_DIR TANDEM_SOURCE_DIR TANDEM_VERSION TANDEM_API_VERSION TANDEM_PREFIX \
         TANDEM_SBINDIR TANDEM_BINDIR TANDEM_LIBDIR TANDEM_INCLUDEDIR TANDEM_SYSCONFDIR \
         TANDEM_DOCDIR TANDEM_PYTHONDIR CMAKE CC CXX TANDEM_EXPORTS_CHECK; do
  [ -n "${!v:-}" ] || fail "$v is not set (run through ctest)"
done
san_ldflags=${TANDEM_SAN_LDFLAGS:-}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tandem-install-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
here=$(cd "$(dirname "$0")" && pwd)

step "cmake --install $TANDEM_BUILD_DIR (DESTDIR=$root, prefix $TANDEM_PREFIX)"
DESTDIR=$root "$CMAKE" --install "$TANDEM_BUILD_DIR" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; fail "cmake --install failed"; }

# ---- 1. layout -------------------------------------------------------------
step "layout"
sbin=$root$TANDEM_SBINDIR bin=$root$TANDEM_BINDIR lib=$root$TANDEM_LIBDIR
inc=$root$TANDEM_INCLUDEDIR etc=$root$TANDEM_SYSCONFDIR doc=$root$TANDEM_DOCDIR
py=$root$TANDEM_PYTHONDIR
n=$TANDEM_API_VERSION
real=libtandem.so.$n.$TANDEM_VERSION
must_file() { if [ ! -f "$1" ] || [ -L "$1" ]; then fail "missing file ${1#"$root"}"; fi; }
must_link() {
  [ -L "$1" ] || fail "${1#"$root"} is not a symlink"
  [ "$(readlink "$1")" = "$2" ] || fail "${1#"$root"} -> $(readlink "$1"), want $2"
}
must_file "$sbin/tandemd"
[ -x "$sbin/tandemd" ] || fail "tandemd is not executable"
must_file "$bin/tandemctl"
[ -x "$bin/tandemctl" ] || fail "tandemctl is not executable"
must_file "$lib/$real"
must_link "$lib/libtandem.so.$n" "$real"
must_link "$lib/libtandem.so" "libtandem.so.$n"
must_file "$inc/tandem/tandem.h"
must_file "$inc/tandem/tandem.hpp"
must_file "$inc/tandem/tandem_gpu.h"
must_file "$inc/tandem/tandem_gpu.hpp"
must_file "$lib/pkgconfig/tandem.pc"
for f in tandemConfig.cmake tandemConfigVersion.cmake tandemTargets.cmake; do
  must_file "$lib/cmake/tandem/$f"
done
must_file "$etc/tandem/tandemd.toml"
cmp -s "$etc/tandem/tandemd.toml" "$TANDEM_SOURCE_DIR/examples/tandemd.toml" ||
  fail "${etc#"$root"}/tandem/tandemd.toml differs from examples/tandemd.toml"
must_file "$doc/examples/tandemd.toml"
must_file "$py/tandem/__init__.py"
must_file "$py/tandem/_ffi.py"

# Programs: exactly tandemd and tandemctl. Nothing from tests/, bench/,
# sim/ or testbed/, anywhere.
names() { find "$1" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort | tr '\n' ' '; }
[ "$(names "$sbin")" = "tandemd " ] || fail "sbin holds more than tandemd: $(names "$sbin")"
[ "$(names "$bin")" = "tandemctl " ] || fail "bin holds more than tandemctl: $(names "$bin")"
stray=$(find "$root" \( -name '*_test' -o -name '*_bench' -o -name '*_fuzz' -o -name 'tandem-sim' \
          -o -name 'tandem-engine-emu' -o -name 'tandem-agents' -o -name 'tandem-toolburn' \
          -o -name 'tandem-man-policies' -o -name 'lib*.a' \) -print)
[ -z "$stray" ] || fail "installed but not meant to be: ${stray//$root/}"

# ELF hygiene: no RUNPATH/RPATH anywhere (nothing points into the build tree).
while IFS= read -r -d '' f; do
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  if readelf -d "$f" | grep -E '\((RPATH|RUNPATH)\)'; then
    fail "${f#"$root"} has $(readelf -d "$f" | grep -E '\((RPATH|RUNPATH)\)')"
  fi
done < <(find "$root" -type f -print0)
soname=$(readelf -d "$lib/$real" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libtandem.so.$n" ] || fail "soname is '$soname', want libtandem.so.$n"
"$CMAKE" -DLIBRARY="$lib/$real" -P "$TANDEM_EXPORTS_CHECK" || fail "libtandem exports more than tandem_*"
if ldd "$lib/$real" | grep 'not found'; then
  fail "libtandem needs a library that is not there: $(ldd "$lib/$real")"
fi
if ldd "$sbin/tandemd" "$bin/tandemctl" | grep 'not found'; then
  fail "tandemd/tandemctl need a library that is not there"
fi
if ldd "$sbin/tandemd" "$bin/tandemctl" | grep libtandem; then
  fail "tandemd/tandemctl link libtandem.so (expected: static tandem libraries only)"
fi

# ---- 2. the installed daemon reads the installed config ---------------------
step "tandemd --check-config --config ${TANDEM_SYSCONFDIR}/tandem/tandemd.toml"
"$sbin/tandemd" --check-config --config "$etc/tandem/tandemd.toml" >"$tmp/check.log" 2>&1 ||
  { cat "$tmp/check.log" >&2; fail "tandemd rejects its installed config"; }
grep -q 'configuration OK' "$tmp/check.log" || fail "tandemd --check-config did not say OK"

# ---- 3./4. external clients, built and run ---------------------------------
# shellcheck source=tests/install/clients.sh
. "$here/clients.sh"
build_and_run_clients "$root" "$TANDEM_PREFIX" "$TANDEM_LIBDIR" "$tmp/clients"

step "Python binding from ${TANDEM_PYTHONDIR}"
if [ -z "${PYTHON:-}" ]; then
  echo "   skipped: no python3"
else
  # Under the sanitizers python3 cannot load the sanitized library without
  # preloading the runtime (tests/python does that); import only there.
  load=1
  [ -n "$san_ldflags" ] && load=0
  LD_LIBRARY_PATH=$lib PYTHONPATH=$py PYTHONDONTWRITEBYTECODE=1 "$PYTHON" - "$py" "$lib" "$expected_session_id" "$load" <<'EOF' ||
import sys
py, lib, expected, load = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
import tandem
assert tandem.__file__.startswith(py + "/"), f"imported {tandem.__file__}, not from {py}"
if not load:
    print("   imported from", tandem.__file__, "(library not loaded under the sanitizers)")
    sys.exit(0)
sid = tandem.session_id("install-test")
assert sid == expected, f"session_id {sid}, want {expected}"
with open("/proc/self/maps") as maps:
    libs = {line.split()[-1] for line in maps if "libtandem.so" in line}
assert libs and all(p.startswith(lib + "/") for p in libs), f"loaded {libs}, not from {lib}"
print("   imported from", tandem.__file__, "session_id", sid, "library", *libs)
EOF
    fail "the installed Python binding"
fi

echo "install_test: OK"
