# shellcheck shell=bash
# Sourced by install_test.sh and package_test.sh: builds the external clients
# of tests/install/client against a tandem installed under a root directory
# (a DESTDIR, or a .deb unpacked with dpkg -x) and runs them.
#
#   build_and_run_clients ROOT PREFIX LIBDIR WORKDIR
#
# ROOT: the directory the tree is installed under; PREFIX and LIBDIR: the
# configured install prefix and absolute library directory (as on the target
# system, before ROOT). Needs CMAKE, CC, CXX, fail() and step(); uses
# TANDEM_SAN_CFLAGS / TANDEM_SAN_LDFLAGS, TANDEM_VERSION, TANDEM_API_VERSION.
# The clients' output must carry the session id of "install-test".

# xxh64("install-test", seed 0): the session id any libtandem must compute.
expected_session_id=1281641271350698121

build_and_run_clients() {
  local root=$1 prefix=$2 libdir=$3 work=$4
  local here san_cflags=${TANDEM_SAN_CFLAGS:-} san_ldflags=${TANDEM_SAN_LDFLAGS:-}
  local lib=$root$libdir n=$TANDEM_API_VERSION
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  mkdir -p "$work"

  step "pkg-config client"
  # Only ROOT's .pc files, their paths prefixed with ROOT. System -I/-L are
  # kept: with the prefix /usr they are ROOT's directories.
  local pc_flags version
  version=$(PKG_CONFIG_LIBDIR=$lib/pkgconfig PKG_CONFIG_PATH="" PKG_CONFIG_SYSROOT_DIR=$root \
            pkg-config --modversion tandem) || fail "pkg-config finds no tandem in ${lib#"$root"}/pkgconfig"
  [ "$version" = "$TANDEM_VERSION" ] || fail "pkg-config --modversion tandem: '$version', want $TANDEM_VERSION"
  pc_flags=$(PKG_CONFIG_LIBDIR=$lib/pkgconfig PKG_CONFIG_PATH="" PKG_CONFIG_SYSROOT_DIR=$root \
             PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1 \
             pkg-config --cflags --libs tandem)
  echo "   $CC -std=c11 $san_cflags client.c $pc_flags $san_ldflags"
  # shellcheck disable=SC2086  # the flags are words
  "$CC" -std=c11 -Wall -Wextra -Werror $san_cflags -o "$work/client-pc" "$here/client/client.c" \
    $pc_flags $san_ldflags || fail "building the client with pkg-config's flags failed"

  step "CMake client (find_package(tandem))"
  local generator=()
  command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
  "$CMAKE" -S "$here/client" -B "$work/cmake-client" "${generator[@]}" \
    -DCMAKE_PREFIX_PATH="$root$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
    -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
    -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
    -DCMAKE_C_FLAGS="-Wall -Wextra -Werror $san_cflags" -DCMAKE_CXX_FLAGS="-Wall -Wextra -Werror $san_cflags" \
    -DCMAKE_EXE_LINKER_FLAGS="$san_ldflags" >"$work/cmake-client.log" 2>&1 ||
    { cat "$work/cmake-client.log" >&2; fail "configuring the find_package(tandem) client failed"; }
  grep -F "tandem $TANDEM_VERSION (API $n) from $root" "$work/cmake-client.log" ||
    { cat "$work/cmake-client.log" >&2; fail "find_package(tandem) did not find the package under $root"; }
  "$CMAKE" --build "$work/cmake-client" >"$work/cmake-build.log" 2>&1 ||
    { cat "$work/cmake-build.log" >&2; fail "building the find_package(tandem) client failed"; }

  step "run the clients against ${libdir}/libtandem.so.$n"
  local c out line
  for c in "$work/client-pc" "$work/cmake-client/client" "$work/cmake-client/client_cxx"; do
    LD_LIBRARY_PATH=$lib ldd "$c" | grep "libtandem.so.$n => $lib/libtandem.so.$n" >/dev/null ||
      fail "${c#"$work"/} does not resolve libtandem.so.$n under $root: $(LD_LIBRARY_PATH=$lib ldd "$c" | grep libtandem)"
    out=$(LD_LIBRARY_PATH=$lib "$c" "$work/no-daemon" 2>"$work/stderr") ||
      { cat "$work/stderr" >&2; fail "${c#"$work"/} failed"; }
    while IFS= read -r line; do echo "   ${c#"$work"/}: $line"; done <<<"$out"
    grep -qx "session_id $expected_session_id" <<<"$out" || fail "${c#"$work"/}: wrong session id"
    grep -qx "runner open, connected 0" <<<"$out" || fail "${c#"$work"/}: the runner did not open fail-open"
  done
}
