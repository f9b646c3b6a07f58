# CPACK_PRE_BUILD_SCRIPTS: cpack runs this after staging each package's files
# (one tree per package under CPACK_TEMPORARY_DIRECTORY: runtime/, dev/) and
# before building the packages. It writes DEBIAN/conffiles of `tandem`
# (CPACK_TANDEM_CONFFILES): every file the package installs under /etc, so
# an operator's edits to /etc/tandem/tandemd.toml — and to any other file a
# folder installs there — survive upgrades, and only a purge removes them.
# A file under /etc in tandem-dev is an error: it could not be a conffile.
if(NOT CPACK_GENERATOR STREQUAL "DEB")
  return()
endif()
file(GLOB_RECURSE _etc LIST_DIRECTORIES false RELATIVE "${CPACK_TEMPORARY_DIRECTORY}/runtime"
     "${CPACK_TEMPORARY_DIRECTORY}/runtime/etc/*")
file(GLOB_RECURSE _dev_etc LIST_DIRECTORIES false "${CPACK_TEMPORARY_DIRECTORY}/dev/etc/*")
if(_dev_etc)
  message(FATAL_ERROR "tandem-dev would install under /etc: ${_dev_etc}; install those files with COMPONENT runtime")
endif()
list(SORT _etc)
set(_text "")
foreach(f IN LISTS _etc)
  string(APPEND _text "/${f}\n")
  message(STATUS "conffile: /${f}")
endforeach()
file(WRITE "${CPACK_TANDEM_CONFFILES}" "${_text}")
