# A configure-time summary: every optional feature says whether it is built
# and, if not, why. Modules call tandem_feature(); the top level prints.
set_property(GLOBAL PROPERTY TANDEM_SUMMARY "")

# `reason` says why a feature is off; it is shown only then.
function(tandem_feature name enabled reason)
  if(enabled)
    set(line "  ${name}: yes")
  else()
    set(line "  ${name}: no (${reason})")
  endif()
  set_property(GLOBAL APPEND PROPERTY TANDEM_SUMMARY "${line}")
endfunction()

# A feature that is built, with which variant of it.
function(tandem_feature_variant name variant)
  set_property(GLOBAL APPEND PROPERTY TANDEM_SUMMARY "  ${name}: yes (${variant})")
endfunction()

function(tandem_print_summary)
  get_property(lines GLOBAL PROPERTY TANDEM_SUMMARY)
  message(STATUS "")
  message(STATUS "tandem ${PROJECT_VERSION} configuration")
  message(STATUS "  compiler: ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}, build type ${CMAKE_BUILD_TYPE}")
  foreach(line IN LISTS lines)
    message(STATUS "${line}")
  endforeach()
  message(STATUS "")
endfunction()
