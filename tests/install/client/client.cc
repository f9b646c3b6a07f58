// The same through the header-only C++ wrapper (tandem.hpp), built by the
// CMake project beside it: the installed headers work from C++20.
#include <cstdio>

#include <tandem/tandem.hpp>
#include <tandem/tandem_gpu.hpp>

int main(int argc, char** argv) {
  tandem_options opts{};
  opts.sz = sizeof opts;
  opts.runtime_dir = argc > 1 ? argv[1] : "/nonexistent/tandem-install-test";
  opts.name = "install-test-cxx";
  std::printf("session_id %llu\n", static_cast<unsigned long long>(tandem::Client::session_id("install-test")));
  tandem::Client client;
  if (const int rc = tandem::Client::open_runner(&opts, client); rc != 0) {
    std::fprintf(stderr, "open_runner: %d\n", rc);
    return 1;
  }
  std::printf("runner open, connected %d\n", client.connected() ? 1 : 0);
  // The GPU plane's header from the install: a pool on the simulated device.
  tandem_gpu_options gpu_opts{};
  gpu_opts.sz = sizeof gpu_opts;
  gpu_opts.backend = "sim";
  tandem::Gpu gpu;
  if (const int rc = tandem::Gpu::open(nullptr, &gpu_opts, gpu); rc != 0) {
    std::fprintf(stderr, "gpu open: %d\n", rc);
    return 1;
  }
  std::printf("gpu backend %s\n", gpu.backend());
  return 0;
}
