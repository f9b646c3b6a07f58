# Install layout (docs/install.md). Included before the modules, so every
# install() rule below, ours and the other folders', sees the same
# directories: GNUInstallDirs gives the FHS layout, and with the prefix /usr
# (what the .deb is built with) the Debian one — sbin, bin,
# lib/<multiarch>, include, /etc and share/doc/tandem.
#
# Components, for CPack (cmake/TandemPackaging.cmake): everything a node runs
# is `runtime` (the package `tandem`); what a developer builds against is
# `dev` (`tandem-dev`). An install() rule without COMPONENT lands in
# `runtime` — so units, man pages and other files installed from their own
# folders need no component to be packaged.
include(GNUInstallDirs)
set(CMAKE_INSTALL_DEFAULT_COMPONENT_NAME runtime)

# tandemd and tandemctl link only static tandem libraries and system
# libraries, and libtandem.so links no tandem library at all, so nothing
# installed needs a RUNPATH: CMake's default (the install RPATH is empty,
# so the build tree's RUNPATH is removed on install) is what we want.
# tests/install checks that no installed ELF file carries one.

# Where the Python binding goes, relative to the prefix: Debian's path for
# pure-Python modules of every python3 (on sys.path for /usr and /usr/local).
set(TANDEM_INSTALL_PYTHONDIR "lib/python3/dist-packages" CACHE STRING
    "Install directory of the Python binding (relative to the prefix, or absolute)")
if(IS_ABSOLUTE "${TANDEM_INSTALL_PYTHONDIR}")
  set(TANDEM_INSTALL_FULL_PYTHONDIR "${TANDEM_INSTALL_PYTHONDIR}")
else()
  set(TANDEM_INSTALL_FULL_PYTHONDIR "${CMAKE_INSTALL_PREFIX}/${TANDEM_INSTALL_PYTHONDIR}")
endif()

# Where tandemd.toml goes. GNUInstallDirs says "etc" for every prefix, and
# /etc as the full path for the prefix /usr only: use the absolute /etc
# there, and the relative one elsewhere, so that `cmake --install --prefix
# DIR` of a /usr/local build keeps the file under DIR.
if(CMAKE_INSTALL_FULL_SYSCONFDIR STREQUAL "${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_SYSCONFDIR}")
  set(TANDEM_INSTALL_SYSCONFDIR "${CMAKE_INSTALL_SYSCONFDIR}")
else()
  set(TANDEM_INSTALL_SYSCONFDIR "${CMAKE_INSTALL_FULL_SYSCONFDIR}")
endif()

# The CMake package's directory (find_package(tandem)).
set(TANDEM_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/tandem")
