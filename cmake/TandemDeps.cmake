# Finds the libraries the modules need. Required ones fail configuration with
# the Debian package to install; optional ones are reported in the summary.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)

find_package(fmt REQUIRED)   # libfmt-dev
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)   # libxxhash-dev
find_package(nlohmann_json 3 REQUIRED)   # nlohmann-json3-dev (the simulator's traces and reports)
find_program(TANDEM_GNUPLOT gnuplot)   # gnuplot-nox: tandem-sim --plot (found at run time too)

# The daemon and the client library.
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)   # liburing-dev
pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)   # libsystemd-dev (sd_notify)
find_package(spdlog REQUIRED)   # libspdlog-dev
find_package(tomlplusplus 3 REQUIRED)   # libtomlplusplus-dev (tandemd.toml)
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)   # libzmq3-dev (tandemd's KV events for routers)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)   # libcpp-httplib-dev (tandem-engine-emu)
find_package(Python3 COMPONENTS Interpreter)   # python3: the libtandem binding's tests

find_package(FlatBuffers REQUIRED)   # libflatbuffers-dev
find_program(TANDEM_FLATC flatc REQUIRED)   # flatbuffers-compiler

if(TANDEM_BUILD_TESTS)
  find_package(GTest REQUIRED)   # libgtest-dev libgmock-dev
  pkg_check_modules(MSGPACK REQUIRED IMPORTED_TARGET msgpack)   # libmsgpack-dev (msgpack-c: decodes the KV events in tests)
  include(GoogleTest)
endif()
