# CPACK_PROJECT_CONFIG_FILE: read by cpack once per generator, before it
# installs anything. A .deb installs under /usr; from a build configured
# with another prefix its paths would be wrong (/usr/local/etc, lib without
# the multiarch triplet, tandem.pc's prefix), so it is refused here.
if(CPACK_GENERATOR STREQUAL "DEB" AND NOT CPACK_TANDEM_INSTALL_PREFIX STREQUAL "/usr")
  message(FATAL_ERROR
    "tandem: this build is configured with CMAKE_INSTALL_PREFIX=${CPACK_TANDEM_INSTALL_PREFIX}; "
    "the .deb needs /usr. Configure a build with -DCMAKE_INSTALL_PREFIX=/usr, "
    "or run packaging/build-deb (docs/install.md).")
endif()
