# llama.cpp for tandem-llama (engines/llama, docs/llama.md).
#
# scripts/fetch-llama (run by scripts/install-deps) puts llama.cpp, pinned
# and hash-checked from the npm registry, in a cache outside the source tree:
# its source at one commit, and on x86-64 the prebuilt CPU libraries built
# from that source. Nothing is downloaded here.
#
#   default      link the prebuilt libraries (libllama.v0.4.0.so and
#                libggml*; the CPU backends load from the same folder at run
#                time). About 11 s of set-up against about 12 minutes to
#                compile llama.cpp on 2 cores, at about half the speed of a
#                native build (docs/llama.md "Which llama.cpp").
#   TANDEM_LLAMA_FROM_SOURCE=ON   compile the cached source for this CPU
#                (GGML_NATIVE) into the build tree, out of tree.
#   TANDEM_LLAMA_CUDA=ON          the same with the CUDA backend for
#                TANDEM_LLAMA_CUDA_ARCHITECTURES (default 90: H100/H200).
#
# Defines the interface target tandem_llama (headers, libraries, the rpath,
# TANDEM_LLAMA_BACKEND_DIR and TANDEM_LLAMA_BUILD) when llama.cpp is there.
option(TANDEM_WITH_LLAMA "Build tandem-llama on llama.cpp from scripts/fetch-llama's cache" ON)
option(TANDEM_LLAMA_FROM_SOURCE "Compile llama.cpp from the cached source instead of linking the prebuilt libraries" OFF)
option(TANDEM_LLAMA_CUDA "Compile llama.cpp from the cached source with its CUDA backend" OFF)
set(TANDEM_LLAMA_CUDA_ARCHITECTURES "90" CACHE STRING "CUDA architectures of the llama.cpp CUDA build")

if(DEFINED ENV{TANDEM_CACHE_DIR})
  set(_llama_cache "$ENV{TANDEM_CACHE_DIR}")
elseif(DEFINED ENV{XDG_CACHE_HOME})
  set(_llama_cache "$ENV{XDG_CACHE_HOME}/tandem")
else()
  set(_llama_cache "$ENV{HOME}/.cache/tandem")
endif()
set(TANDEM_LLAMA_DIR "${_llama_cache}/llama.cpp/3.21.1" CACHE PATH "scripts/fetch-llama's cache folder")

set(TANDEM_HAVE_LLAMA OFF)
if(NOT TANDEM_WITH_LLAMA)
  tandem_feature("tandem-llama (llama.cpp)" OFF "TANDEM_WITH_LLAMA=OFF")
  return()
endif()
if(NOT EXISTS "${TANDEM_LLAMA_DIR}/.complete")
  tandem_feature("tandem-llama (llama.cpp)" OFF "no llama.cpp in ${TANDEM_LLAMA_DIR}: run scripts/fetch-llama")
  return()
endif()
file(READ "${TANDEM_LLAMA_DIR}/.complete" _stamp)
string(STRIP "${_stamp}" _stamp)
string(REGEX REPLACE "^.* " "" TANDEM_LLAMA_COMMIT "${_stamp}")
set(_src "${TANDEM_LLAMA_DIR}/src")
add_library(tandem_llama INTERFACE)
target_include_directories(tandem_llama SYSTEM INTERFACE "${_src}/include" "${_src}/ggml/include")

set(_prebuilt "${TANDEM_LLAMA_DIR}/lib/libllama.v0.4.0.so")
if(TANDEM_LLAMA_CUDA OR TANDEM_LLAMA_FROM_SOURCE OR NOT EXISTS "${_prebuilt}")
  include(ExternalProject)
  set(_prefix "${PROJECT_BINARY_DIR}/llama.cpp")
  set(_args
    -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_INSTALL_PREFIX=${_prefix}
    -DCMAKE_INSTALL_LIBDIR=lib
    -DCMAKE_C_COMPILER=${CMAKE_C_COMPILER}
    -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
    -DBUILD_SHARED_LIBS=ON
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
    # Both default to reaching the network.
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
    -DGGML_BACKEND_DL=OFF)
  if(TANDEM_LLAMA_CUDA)
    # The CPU part for any x86-64 with AVX2, not this CPU alone: a CUDA build
    # is often made on one machine and run on the GPU host.
    # One GPU: no NCCL (its library is rarely where the engine runs).
    list(APPEND _args -DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${TANDEM_LLAMA_CUDA_ARCHITECTURES}" -DGGML_NATIVE=OFF
         -DGGML_CUDA_NCCL=OFF)
    if(EXISTS /usr/local/cuda/bin/nvcc)
      list(APPEND _args -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
    endif()
    set(_what "CUDA sm_${TANDEM_LLAMA_CUDA_ARCHITECTURES}, built from source")
  else()
    list(APPEND _args -DGGML_NATIVE=ON)
    set(_what "CPU (native), built from source")
  endif()
  if(TANDEM_CCACHE AND TANDEM_CCACHE_PROGRAM)
    list(APPEND _args -DCMAKE_C_COMPILER_LAUNCHER=${TANDEM_CCACHE_PROGRAM} -DCMAKE_CXX_COMPILER_LAUNCHER=${TANDEM_CCACHE_PROGRAM})
  endif()
  set(_libs "${_prefix}/lib/libllama.so" "${_prefix}/lib/libggml.so" "${_prefix}/lib/libggml-base.so")
  ExternalProject_Add(llama_cpp
    SOURCE_DIR "${_src}"
    BINARY_DIR "${PROJECT_BINARY_DIR}/llama.cpp-build"
    INSTALL_DIR "${_prefix}"
    CMAKE_ARGS ${_args}
    BUILD_BYPRODUCTS ${_libs}
    UPDATE_COMMAND "" PATCH_COMMAND ""
    USES_TERMINAL_BUILD ON)
  add_dependencies(tandem_llama llama_cpp)
  target_link_libraries(tandem_llama INTERFACE ${_libs})
  set(_libdir "${_prefix}/lib")
  target_compile_definitions(tandem_llama INTERFACE TANDEM_LLAMA_BACKEND_DIR="")
else()
  set(_libdir "${TANDEM_LLAMA_DIR}/lib")
  target_link_libraries(tandem_llama INTERFACE
    "${_libdir}/libllama.v0.4.0.so" "${_libdir}/libggml.v0.4.0.so" "${_libdir}/libggml-base.so")
  # The prebuilt CPU backends are plug-ins, one per instruction set,
  # chosen at run time from this folder.
  target_compile_definitions(tandem_llama INTERFACE TANDEM_LLAMA_BACKEND_DIR="${_libdir}")
  set(_what "CPU, prebuilt x86-64 (@node-llama-cpp/linux-x64 3.21.1)")
endif()
target_link_options(tandem_llama INTERFACE "LINKER:-rpath,${_libdir}")
target_compile_definitions(tandem_llama INTERFACE "TANDEM_LLAMA_BUILD=\"${TANDEM_LLAMA_COMMIT} ${_what}\"")
set(TANDEM_HAVE_LLAMA ON)
tandem_feature_variant("tandem-llama (llama.cpp)" "llama.cpp ${TANDEM_LLAMA_COMMIT}, ${_what}")
