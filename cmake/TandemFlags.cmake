# tandem_flags: the interface target every tandem target links PRIVATE.
# It carries C++23, the warning set, -Werror when asked, and the sanitizers,
# so no flag ever goes into CMAKE_CXX_FLAGS.
add_library(tandem_flags INTERFACE)
target_compile_features(tandem_flags INTERFACE cxx_std_23)
target_compile_options(tandem_flags INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wimplicit-fallthrough
  -Wmissing-declarations -Wundef
  $<$<BOOL:${TANDEM_WERROR}>:-Werror>)

if(TANDEM_SANITIZE)
  set(_san -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  target_compile_options(tandem_flags INTERFACE ${_san})
  target_link_options(tandem_flags INTERFACE ${_san})
endif()
tandem_feature("ASan+UBSan" "${TANDEM_SANITIZE}" "TANDEM_SANITIZE=OFF")
tandem_feature("warnings as errors" "${TANDEM_WERROR}" "TANDEM_WERROR=OFF")

# libFuzzer needs clang. The libraries the fuzzers exercise get coverage
# instrumentation (fuzzer-no-link); only the fuzz executables link libFuzzer.
set(TANDEM_FUZZ_ENABLED OFF)
if(TANDEM_BUILD_FUZZ)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    set(TANDEM_FUZZ_ENABLED ON)
    target_compile_options(tandem_flags INTERFACE -fsanitize=fuzzer-no-link)
    tandem_feature("libFuzzer targets" ON "")
  else()
    tandem_feature("libFuzzer targets" OFF "needs clang, compiler is ${CMAKE_CXX_COMPILER_ID}")
  endif()
else()
  tandem_feature("libFuzzer targets" OFF "TANDEM_BUILD_FUZZ=OFF")
endif()
