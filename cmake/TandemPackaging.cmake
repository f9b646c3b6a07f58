# Files installed from the top level, and the Debian packages (CPack's DEB
# generator; docs/install.md). Included after every module, so the component
# list below sees all their install() rules.
#
# Two packages: `tandem` (the `runtime` component and any other but `dev`:
# tandemd, tandemctl, libtandem.so.N, the Python binding, the config, units,
# man pages) and `tandem-dev` (`dev`: headers, the unversioned .so link,
# tandem.pc, the CMake package). A .deb must come from a build configured
# with -DCMAKE_INSTALL_PREFIX=/usr (packaging/build-deb does that); cpack
# refuses any other prefix, whose paths (/usr/local/etc, lib without the
# multiarch triplet, tandem.pc's prefix) would be wrong inside a package.

# The example configuration is the installed one: every key at its default,
# so tandemd behaves as with no file until an operator edits it. In the .deb
# it is a conffile (packaging/conffiles.cmake), so edits survive upgrades.
install(FILES ${PROJECT_SOURCE_DIR}/examples/tandemd.toml
  DESTINATION ${TANDEM_INSTALL_SYSCONFDIR}/tandem COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/examples/tandemd.toml
  DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT runtime)

# ---- CPack -----------------------------------------------------------------
set(TANDEM_PACKAGE_MAINTAINER "tandem maintainers <tandem@example.invalid>" CACHE STRING
    "Maintainer field of the .deb packages")

set(CPACK_GENERATOR DEB)
# `package_source` (a tarball of the source tree): without build trees.
set(CPACK_SOURCE_GENERATOR TXZ)
set(CPACK_SOURCE_IGNORE_FILES "/\\.git/" "/build[^/]*/" "/\\.gl/" "/\\.whl/" "__pycache__")
set(CPACK_PACKAGE_NAME tandem)
set(CPACK_PACKAGE_VENDOR tandem)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${TANDEM_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGING_INSTALL_PREFIX "${CMAKE_INSTALL_PREFIX}")
# Installed programs and the library lose their debug sections.
set(CPACK_STRIP_FILES ON)
# The prefix check (below) reads this at cpack time.
set(CPACK_TANDEM_INSTALL_PREFIX "${CMAKE_INSTALL_PREFIX}")
set(CPACK_PROJECT_CONFIG_FILE "${PROJECT_SOURCE_DIR}/packaging/cpack-project.cmake")
# Writes DEBIAN/conffiles from what the staged package holds under /etc.
set(CPACK_TANDEM_CONFFILES "${PROJECT_BINARY_DIR}/packaging/conffiles")
set(CPACK_PRE_BUILD_SCRIPTS "${PROJECT_SOURCE_DIR}/packaging/conffiles.cmake")

# One package per component group: `dev` alone, everything else in
# `runtime`, whichever component another folder's install() names.
get_cmake_property(_tandem_components COMPONENTS)
set(CPACK_COMPONENTS_ALL ${_tandem_components})
foreach(_c IN LISTS _tandem_components)
  string(TOUPPER "${_c}" _cu)
  if(_c STREQUAL "dev")
    set(CPACK_COMPONENT_${_cu}_GROUP dev)
  else()
    set(CPACK_COMPONENT_${_cu}_GROUP runtime)
  endif()
endforeach()
set(CPACK_COMPONENTS_GROUPING ONE_PER_GROUP)
set(CPACK_DEB_COMPONENT_INSTALL ON)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)   # <name>_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# Depends from the ELF files' DT_NEEDED (dpkg-shlibdeps, from dpkg-dev), and
# a shlibs file so other packages' dpkg-shlibdeps map libtandem.so.N here.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME tandem)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION admin)
# Descriptions: the summary line, then the extended text (CPack indents it;
# an empty line becomes " ."). No CPACK_PACKAGE_DESCRIPTION_SUMMARY: CPack
# would put it before each of these.
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION "node-local resource manager for agentic LLM inference
tandemd co-schedules the GPU and the host CPU of a node for agent sessions
that alternate between LLM rounds and tool calls: session admission, KV
cache residency and eviction on the GPU side, and tool processes in cgroup
sandboxes with CPU and memory control on the host side.

This package holds the daemon tandemd, the command-line tool tandemctl,
the client library libtandem.so.${TANDEM_API_VERSION} that inference engines
and agent runtimes link, its Python binding, and the configuration
/etc/tandem/tandemd.toml.")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS "python3, bubblewrap")
# postinst/prerm/postrm (packaging/): systemd-sysusers where it is installed;
# daemon-reload, restart on upgrade and stop on removal where systemd runs.
# The triggers file runs ldconfig (the library's soname link); CPack's own
# ldconfig postinst is not generated once we bring a postinst.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA
  "${CPACK_TANDEM_CONFFILES};${PROJECT_SOURCE_DIR}/packaging/postinst;${PROJECT_SOURCE_DIR}/packaging/prerm;${PROJECT_SOURCE_DIR}/packaging/postrm;${PROJECT_SOURCE_DIR}/packaging/triggers")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME tandem-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "tandem (= ${PROJECT_VERSION})")
set(CPACK_DEBIAN_DEV_DESCRIPTION "development files of libtandem, the client library of tandemd
The C headers tandem.h and tandem_gpu.h, the header-only C++ wrappers
tandem.hpp and tandem_gpu.hpp, the link
libtandem.so, the pkg-config file tandem.pc and the CMake package
(find_package(tandem), target tandem::tandem).")

include(CPack)

if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  tandem_feature(".deb packages (cpack)" ON "")
else()
  tandem_feature(".deb packages (cpack)" OFF
                 "CMAKE_INSTALL_PREFIX is ${CMAKE_INSTALL_PREFIX}, not /usr (packaging/build-deb builds them)")
endif()
