// tandem-engine-emu: an inference engine emulator for end-to-end runs of
// tandem (docs/testbed.md). It binds 127.0.0.1:PORT, opens a libtandem engine
// handle (fail-open: no daemon is fine) and, unless --gpu off, a GPU plane's
// green-context pool on it, which every step follows (docs/testbed.md), prints
// "tandem-engine-emu: listening on 127.0.0.1:PORT" once it serves, and on
// SIGINT/SIGTERM stops accepting, lets rounds in flight finish (up to 5 s),
// fails the rest, closes the pool and the handle and exits 0. Bad flags exit
// 2; a setup failure (the port, the KV pool, the GPU plane) exits 1.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <httplib.h>

#include "testbed/emulator.h"
#include "testbed/flags.h"
#include "testbed/http_api.h"

namespace {

using tandem::testbed::Emulator;

constexpr auto kDrainGrace = std::chrono::seconds(5);
constexpr int kHttpThreads = 64;

int run(const tandem::testbed::Flags& flags) {
  auto setup = tandem::testbed::engine_setup(flags);
  if (!setup) {
    fmt::print(stderr, "tandem-engine-emu: {}\n", setup.error());
    return 2;
  }

  // SIGINT/SIGTERM are taken by sigwait() below; every thread started from
  // here on inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that leaves mid-stream is a failed write, not a signal

  httplib::Server server;
  server.new_task_queue = [] { return new httplib::ThreadPool(kHttpThreads); };
  server.set_keep_alive_timeout(1);  // bounds how long an idle connection delays shutdown
  server.set_tcp_nodelay(true);      // one SSE event per token: Nagle would hold them for the ACK
  server.set_payload_max_length(std::size_t{64} << 20);
  int port = flags.port;
  if (port == 0) {
    port = server.bind_to_any_port("127.0.0.1");
  } else if (!server.bind_to_port("127.0.0.1", port)) {
    port = -1;
  }
  if (port <= 0) {
    fmt::print(stderr, "tandem-engine-emu: cannot listen on 127.0.0.1:{}\n", flags.port);
    return 1;
  }

  const std::string name = flags.name.empty() ? fmt::format("emu-{}", port) : flags.name;
  std::string runtime_dir = flags.runtime_dir;
  if (runtime_dir.empty()) {
    const char* env = std::getenv("TANDEM_RUNTIME_DIR");
    runtime_dir = env != nullptr && *env != '\0' ? env : "/run/tandem";
  }
  tandem_options options{};
  options.sz = sizeof options;
  options.runtime_dir = runtime_dir.c_str();
  options.name = name.c_str();
  tandem_engine_params params{};
  params.sz = sizeof params;
  params.gpu_index = -1;
  params.block_size = setup->preset.block_size;
  params.total_blocks = setup->preset.gpu_blocks;
  params.max_seqs = setup->limits.max_seqs;
  params.token_budget = setup->limits.token_budget;
  params.saturating_tokens = setup->preset.step.saturating_tokens();
  params.max_model_len = setup->preset.max_model_len;
  tandem_client* client = nullptr;
  if (const int rc = tandem_engine_open(&options, &params, &client); rc != 0) {
    fmt::print(stderr, "tandem-engine-emu: tandem_engine_open: {}\n", std::strerror(-rc));
    return 1;
  }

  // The GPU plane: libtandem sends tandemd the partitions now (and after
  // every reconnect); the engine thread alone uses the pool from here on.
  tandem_gpu* gpu = nullptr;
  if (flags.gpu != "off") {
    auto opened = tandem::testbed::open_gpu_plane(client, flags.gpu);
    if (!opened) {
      tandem_close(client);
      fmt::print(stderr, "tandem-engine-emu: {}\n", opened.error().message());
      return 1;
    }
    gpu = *opened;
    fmt::print(stderr, "tandem-engine-emu: GPU plane: {}\n", tandem::testbed::describe_gpu_plane(gpu));
  } else {
    fmt::print(stderr, "tandem-engine-emu: GPU plane: off\n");
  }

  tandem::testbed::EmulatorConfig config;
  config.preset = setup->preset;
  config.limits = setup->limits;
  config.speedup = flags.speedup;
  config.kv_block_bytes = flags.kv_block_bytes;
  config.kv_events = flags.kv_events;
  config.name = name;
  auto emu = Emulator::create(std::move(config), client, gpu);  // owns `client` and `gpu` once created
  if (!emu) {
    tandem_gpu_close(gpu);  // before the handle it was opened on
    tandem_close(client);
    fmt::print(stderr, "tandem-engine-emu: {}\n", emu.error().message());
    return 1;
  }
  (*emu)->start();
  tandem::testbed::install_routes(server, **emu);
  std::thread http([&server] { server.listen_after_bind(); });
  // stop() does nothing before the loop runs: wait for it (signals stay queued).
  while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  fmt::print("tandem-engine-emu: listening on 127.0.0.1:{}\n", port);
  fmt::print(stderr,
             "tandem-engine-emu: {} ({} KV blocks of {} tokens, {} bytes each; speedup {}), runtime dir {}, "
             "name {}\n",
             setup->preset.name, setup->preset.gpu_blocks, setup->preset.block_size, flags.kv_block_bytes,
             flags.speedup, runtime_dir, name);
  std::fflush(stdout);
  std::fflush(stderr);

  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  fmt::print(stderr, "tandem-engine-emu: {}, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  server.stop();               // no new connections
  (*emu)->drain(kDrainGrace);  // rounds in flight finish or fail; the engine thread ends
  http.join();                 // workers answered their requests
  emu->reset();                // closes the pool, then the tandem handle
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  auto flags = tandem::testbed::parse_flags(args);
  if (!flags) {
    fmt::print(stderr, "tandem-engine-emu: {}\n", flags.error());
    return 2;
  }
  if (flags->help) {
    fmt::print("{}", tandem::testbed::usage());
    return 0;
  }
  return run(*flags);
}
