#!/usr/bin/env bash
# tests/install: the Debian packages (docs/install.md).
#   1. builds them: with cpack in this build when it is configured with the
#      prefix /usr, else with packaging/build-deb in $TANDEM_BUILD_DIR/deb
#      (a build of its own, incremental after the first run);
#   2. checks the control fields (name, version, architecture, section,
#      Depends computed by dpkg-shlibdeps, shlibs, conffiles, maintainer
#      scripts) and the contents: the Debian layout, nothing from tests,
#      benchmarks or the simulator, stripped binaries, no file in both
#      packages, and every file `cmake --install` installs in one of them;
#   3. unpacks both (dpkg -x) and builds and runs the external clients
#      against them, with the packaged tandem.pc (prefix /usr) and CMake
#      package;
#   4. installs both into a throwaway root with dpkg --root, its status
#      database holding this system's entries for the packages they depend
#      on (so Depends are checked for real), with the maintainer scripts run
#      (they honour $DPKG_ROOT); reinstalls over an edited conffile, which
#      must survive; removes (the conffile stays) and purges (it goes, and no
#      file of the packages is left).
#
# Environment (set by tests/install/CMakeLists.txt): TANDEM_BUILD_DIR,
# TANDEM_SOURCE_DIR, TANDEM_PREFIX, TANDEM_VERSION, TANDEM_API_VERSION, CMAKE,
# CPACK, CC, CXX, and TANDEM_DEB_CMAKE_ARGS (the configure arguments of the
# build of its own: compilers, build type, options, separated by '|').
set -euo pipefail

fail() { echo "package_test: FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

for v in TANDEM_BUILD_DIR TANDEM_SOURCE_DIR TANDEM_PREFIX TANDEM_VERSION TANDEM_API_VERSION CMAKE CPACK CC CXX; do
  [ -n "${!v:-}" ] || fail "$v is not set (run through ctest)"
done
for tool in dpkg dpkg-deb dpkg-shlibdeps dpkg-architecture file readelf; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool not found (scripts/install-deps installs it)"
done
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tandem-package-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
debs=$tmp/debs
arch=$(dpkg --print-architecture)
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || "$CC" -print-multiarch)
[ -n "$ma" ] || fail "no multiarch triplet"
v=$TANDEM_VERSION n=$TANDEM_API_VERSION
deb=$debs/tandem_${v}_$arch.deb
devdeb=$debs/tandem-dev_${v}_$arch.deb

# ---- 1. build --------------------------------------------------------------
if [ "$TANDEM_PREFIX" = /usr ]; then
  pkgbuild=$TANDEM_BUILD_DIR
  step "cpack -G DEB in $pkgbuild"
  (cd "$pkgbuild" && "$CPACK" -G DEB -B "$debs") >"$tmp/cpack.log" 2>&1 ||
    { cat "$tmp/cpack.log" >&2; fail "cpack failed"; }
else
  pkgbuild=$TANDEM_BUILD_DIR/deb
  step "packaging/build-deb --build-dir $pkgbuild (this build's prefix is $TANDEM_PREFIX)"
  IFS='|' read -r -a deb_args <<<"${TANDEM_DEB_CMAKE_ARGS:-}"
  "$TANDEM_SOURCE_DIR/packaging/build-deb" --build-dir "$pkgbuild" --out "$debs" -- "${deb_args[@]}" \
    >"$tmp/build-deb.log" 2>&1 || { tail -n 60 "$tmp/build-deb.log" >&2; fail "packaging/build-deb failed"; }
fi
[ -f "$deb" ] || fail "no $(basename "$deb") in: $(ls "$debs")"
[ -f "$devdeb" ] || fail "no $(basename "$devdeb") in: $(ls "$debs")"
[ "$(find "$debs" -maxdepth 1 -name '*.deb' | wc -l)" -eq 2 ] || fail "more packages than tandem and tandem-dev: $(ls "$debs")"

# ---- 2. control fields and contents ----------------------------------------
step "control fields"
field() { dpkg-deb -f "$1" "$2"; }
for f in "$deb" "$devdeb"; do
  [ "$(field "$f" Version)" = "$v" ] || fail "$(basename "$f"): Version $(field "$f" Version), want $v"
  [ "$(field "$f" Architecture)" = "$arch" ] || fail "$(basename "$f"): Architecture $(field "$f" Architecture)"
  [ -n "$(field "$f" Maintainer)" ] || fail "$(basename "$f"): no Maintainer"
done
[ "$(field "$deb" Package)" = tandem ] || fail "Package $(field "$deb" Package), want tandem"
[ "$(field "$devdeb" Package)" = tandem-dev ] || fail "Package $(field "$devdeb" Package), want tandem-dev"
[ "$(field "$deb" Section)" = admin ] || fail "tandem: Section $(field "$deb" Section), want admin"
depends=$(field "$deb" Depends)
echo "   tandem Depends: $depends"
dep_names=$(sed -E 's/ *\([^)]*\)//g; s/ *, */\n/g' <<<"$depends")
for d in libc6 libstdc++6 libsystemd0 liburing2; do
  grep -qxF "$d" <<<"$dep_names" || fail "tandem does not depend on $d (dpkg-shlibdeps did not run?)"
done
if grep -qxF tandem-dev <<<"$dep_names"; then fail "tandem depends on tandem-dev"; fi
[ "$(field "$devdeb" Depends)" = "tandem (= $v)" ] || fail "tandem-dev: Depends '$(field "$devdeb" Depends)', want 'tandem (= $v)'"

mkdir -p "$tmp/control"
dpkg-deb -e "$deb" "$tmp/control"
[ "$(cat "$tmp/control/shlibs")" = "libtandem $n tandem (>= $v)" ] ||
  fail "shlibs: '$(cat "$tmp/control/shlibs")', want 'libtandem $n tandem (>= $v)'"
grep -qx 'activate-noawait ldconfig' "$tmp/control/triggers" || fail "no ldconfig trigger"
for s in postinst prerm postrm; do
  [ -x "$tmp/control/$s" ] || fail "no executable $s"
  sh -n "$tmp/control/$s" || fail "$s is not valid sh"
done
grep -qx /etc/tandem/tandemd.toml "$tmp/control/conffiles" || fail "/etc/tandem/tandemd.toml is not a conffile"

step "contents"
list() { dpkg-deb --fsys-tarfile "$1" | tar -t | sed 's|^\./|/|; s|/$||' | grep -v '^/\?$' | sort; }
list "$deb" >"$tmp/tandem.list"
list "$devdeb" >"$tmp/dev.list"
want() {
  grep -qx "$2" "$tmp/$1.list" || fail "$1 lacks $2"
}
want tandem /usr/sbin/tandemd
want tandem /usr/bin/tandemctl
want tandem "/usr/lib/$ma/libtandem.so.$n.$v"
want tandem "/usr/lib/$ma/libtandem.so.$n"
want tandem /etc/tandem/tandemd.toml
want tandem /usr/share/doc/tandem/examples/tandemd.toml
want tandem /usr/lib/python3/dist-packages/tandem/__init__.py
want tandem /usr/lib/python3/dist-packages/tandem/_ffi.py
want dev /usr/include/tandem/tandem.h
want dev /usr/include/tandem/tandem.hpp
want dev /usr/include/tandem/tandem_gpu.h
want dev /usr/include/tandem/tandem_gpu.hpp
want dev "/usr/lib/$ma/libtandem.so"
want dev "/usr/lib/$ma/pkgconfig/tandem.pc"
want dev "/usr/lib/$ma/cmake/tandem/tandemConfig.cmake"
want dev "/usr/lib/$ma/cmake/tandem/tandemConfigVersion.cmake"
want dev "/usr/lib/$ma/cmake/tandem/tandemTargets.cmake"
bad=$(cat "$tmp/tandem.list" "$tmp/dev.list" | grep -E '^/usr/local|^/usr/etc|_test$|_bench$|_fuzz$|/tandem-(sim|engine-emu|agents|toolburn|man-policies)$|\.a$' || true)
[ -z "$bad" ] || fail "the packages hold what they must not: $bad"
# Files (not directories) in both packages would make dpkg refuse the second.
mkdir -p "$tmp/x/tandem" "$tmp/x/dev"
dpkg-deb -x "$deb" "$tmp/x/tandem"
dpkg-deb -x "$devdeb" "$tmp/x/dev"
files() { (cd "$1" && find . \( -type f -o -type l \) | sed 's|^\.||' | sort); }
files "$tmp/x/tandem" >"$tmp/tandem.files"
files "$tmp/x/dev" >"$tmp/dev.files"
both=$(comm -12 "$tmp/tandem.files" "$tmp/dev.files")
[ -z "$both" ] || fail "in both packages: $both"
# Every file tandem installs under /etc is a conffile; tandem-dev has none.
while IFS= read -r f; do
  grep -qx "$f" "$tmp/control/conffiles" || fail "$f is under /etc but not a conffile"
done < <(grep '^/etc/' "$tmp/tandem.files" || true)
! grep '^/etc/' "$tmp/dev.files" || fail "tandem-dev installs under /etc"
# What `cmake --install` of the same build installs is all packaged: an
# install() rule in a component CPack does not package would show here.
DESTDIR=$tmp/full "$CMAKE" --install "$pkgbuild" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; fail "cmake --install $pkgbuild failed"; }
files "$tmp/full" >"$tmp/full.files"
missing=$(sort "$tmp/tandem.files" "$tmp/dev.files" | comm -23 "$tmp/full.files" -)
[ -z "$missing" ] || fail "installed by cmake --install but in no package: $missing"
# Stripped: no DWARF left in the programs and the library.
for f in /usr/sbin/tandemd /usr/bin/tandemctl "/usr/lib/$ma/libtandem.so.$n.$v"; do
  if readelf -S "$tmp/x/tandem$f" | grep debug_info >/dev/null; then fail "$f is not stripped"; fi
done
echo "   tandem: $(wc -l <"$tmp/tandem.files") files, tandem-dev: $(wc -l <"$tmp/dev.files") files"

# ---- 3. external clients against the unpacked packages ---------------------
# (Both unpacked into one tree, as installed on a system.)
dpkg-deb -x "$deb" "$tmp/x/both"
dpkg-deb -x "$devdeb" "$tmp/x/both"
grep -qx 'prefix=/usr' "$tmp/x/both/usr/lib/$ma/pkgconfig/tandem.pc" || fail "tandem.pc's prefix is not /usr"
# shellcheck source=tests/install/clients.sh
. "$here/clients.sh"
build_and_run_clients "$tmp/x/both" /usr "/usr/lib/$ma" "$tmp/clients"

# ---- 4. dpkg --root: install, reinstall, remove, purge ---------------------
step "dpkg --root: install both"
root=$tmp/root
admin=$root/var/lib/dpkg
mkdir -p "$admin/info" "$admin/updates" "$admin/triggers"
: >"$admin/status"
# This system's status entries for the packages Depends names, or that
# provide them (libspdlog1.10 provides libspdlog1.10-fmt9). Their files are
# not copied: dpkg checks dependencies against its database only.
installed=$(dpkg-query -W -f='${db:Status-Abbrev}\t${Package}\t${Provides}\n' | awk -F'\t' '$1 == "ii " {print $2 "\t" $3}')
seeded=" "
for name in $dep_names; do
  pkg=$(awk -F'\t' -v n="$name" '
    $1 == n { print $1; exit }
    { k = split($2, p, / *, */); for (i = 1; i <= k; i++) { sub(/ .*/, "", p[i]); if (p[i] == n) { print $1; exit } } }
  ' <<<"$installed")
  [ -n "$pkg" ] || fail "$name (a Depends of tandem) is neither installed here nor provided by an installed package"
  case "$seeded" in *" $pkg "*) continue ;; esac
  seeded+="$pkg "
  dpkg-query -s "$pkg" >>"$admin/status"
  echo >>"$admin/status"
  for bin in $(dpkg-query -W -f='${binary:Package}\n' "$pkg"); do : >"$admin/info/$bin.list"; done
done
dpkg_root() {
  dpkg --root="$root" --force-not-root --force-script-chrootless --log=/dev/null "$@"
}
dpkg_root -i "$deb" "$devdeb" >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log" >&2; fail "dpkg -i failed"; }
grep -iE 'warning|error' "$tmp/dpkg.log" && fail "dpkg -i warned"
for p in tandem tandem-dev; do
  [ "$(dpkg-query --admindir="$admin" -W -f='${db:Status-Abbrev}' "$p")" = "ii " ] ||
    fail "$p is not installed and configured: $(dpkg-query --admindir="$admin" -W -f='${db:Status-Abbrev}' "$p")"
done
dpkg-query --admindir="$admin" -W -f='${Conffiles}\n' tandem | grep -q '^ /etc/tandem/tandemd.toml ' ||
  fail "dpkg does not track /etc/tandem/tandemd.toml as a conffile"
if [ ! -x "$root/usr/sbin/tandemd" ] || [ ! -L "$root/usr/lib/$ma/libtandem.so.$n" ]; then
  fail "files missing after dpkg -i"
fi
if command -v systemd-sysusers >/dev/null 2>&1 && [ -e "$root/usr/lib/sysusers.d/tandem.conf" ]; then
  grep -q '^tandem:' "$root/etc/group" || fail "postinst did not create the group tandem in the root"
  echo "   postinst created the group tandem (systemd-sysusers --root)"
fi

step "dpkg --root: reinstall over an edited conffile"
echo '# edited by the operator' >>"$root/etc/tandem/tandemd.toml"
dpkg_root -i "$deb" >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log" >&2; fail "reinstall failed"; }
tail -n 1 "$root/etc/tandem/tandemd.toml" | grep -qx '# edited by the operator' || fail "the reinstall replaced the edited conffile"

step "dpkg --root: remove, then purge"
dpkg_root -r tandem-dev tandem >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log" >&2; fail "dpkg -r failed"; }
[ ! -e "$root/usr/sbin/tandemd" ] || fail "tandemd is left after dpkg -r"
[ -f "$root/etc/tandem/tandemd.toml" ] || fail "dpkg -r removed the conffile (only purge may)"
dpkg_root -P tandem tandem-dev >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log" >&2; fail "dpkg -P failed"; }
# Left: dpkg's database, and what systemd-sysusers wrote (a group stays on
# purge, Debian's custom).
left=$(find "$root" -mindepth 1 ! -type d -printf '/%P\n' |
       grep -Ev '^/var/lib/dpkg/|^/etc/(group|gshadow|passwd|shadow)-?$|^/etc/\.pwd\.lock$' || true)
[ -z "$left" ] || fail "left after purge: $left"
[ ! -e "$root/etc/tandem" ] || fail "/etc/tandem is left after purge"

echo "package_test: OK"
