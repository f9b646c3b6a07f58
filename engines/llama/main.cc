// tandem-llama: an inference engine on llama.cpp that links libtandem
// (docs/llama.md). It loads the model, creates one context (a unified KV
// cache of --ctx cells), binds 127.0.0.1:PORT, opens a libtandem engine
// handle (fail-open: no daemon is fine), prints
// "tandem-llama: listening on 127.0.0.1:PORT" once it serves, and on
// SIGINT/SIGTERM stops accepting, lets rounds in flight finish (up to 5 s),
// fails the rest and exits 0. Bad flags and a missing or invalid model exit
// 2 naming the problem; another setup failure (the port, the context) exits 1.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <httplib.h>

#include "engines/llama/engine.h"
#include "engines/llama/flags.h"
#include "engines/llama/runtime.h"
#include "testbed/http_api.h"

namespace {

using namespace tandem;

constexpr auto kDrainGrace = std::chrono::seconds(5);
constexpr int kHttpThreads = 64;

int run(const llama::Flags& flags) {
  llama::init("tandem-llama: llama.cpp", flags.verbose);
  auto model = llama::Model::load({flags.model, flags.gpu_layers});
  if (!model) {
    fmt::print(stderr, "tandem-llama: {}\n", model.error().context());
    return 2;
  }
  llama::ContextOptions co;
  co.n_ctx = flags.ctx;
  co.n_batch = flags.token_budget;
  co.n_ubatch = std::min(flags.ubatch, flags.token_budget);
  co.n_seq_max = 256;
  co.threads = flags.threads;
  auto ctx = llama::Context::create(**model, co);
  if (!ctx) {
    fmt::print(stderr, "tandem-llama: {}\n", ctx.error().context());
    return 1;
  }

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  httplib::Server server;
  server.new_task_queue = [] { return new httplib::ThreadPool(kHttpThreads); };
  server.set_keep_alive_timeout(1);
  server.set_tcp_nodelay(true);
  server.set_payload_max_length(std::size_t{64} << 20);
  int port = flags.port;
  if (port == 0) {
    port = server.bind_to_any_port("127.0.0.1");
  } else if (!server.bind_to_port("127.0.0.1", port)) {
    port = -1;
  }
  if (port <= 0) {
    fmt::print(stderr, "tandem-llama: cannot listen on 127.0.0.1:{}\n", flags.port);
    return 1;
  }

  const std::string name = flags.name.empty() ? fmt::format("llama-{}", port) : flags.name;
  std::string runtime_dir = flags.runtime_dir;
  if (runtime_dir.empty()) {
    const char* env = std::getenv("TANDEM_RUNTIME_DIR");
    runtime_dir = env != nullptr && *env != '\0' ? env : "/run/tandem";
  }
  llama::EngineConfig config;
  config.name = name;
  config.block_size = flags.block_size;
  config.max_seqs = flags.max_seqs;
  config.token_budget = flags.token_budget;
  config.step_log = flags.step_log;
  config.kv_events = flags.kv_events;
  if (flags.host_kv_mb >= 0) {
    config.host_kv_bytes = static_cast<std::uint64_t>(flags.host_kv_mb) << 20;
  } else {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGE_SIZE);
    config.host_kv_bytes = pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * page / 4 : 0;
  }

  // The handle needs the pool's size, which needs the context: open it
  // after, with the engine's own parameters.
  const std::uint32_t n_ctx = (*ctx)->n_ctx();
  const std::size_t kv_token = (*model)->kv_bytes_per_token();
  const std::string desc = (*model)->description();
  tandem_options options{};
  options.sz = sizeof options;
  options.runtime_dir = runtime_dir.c_str();
  options.name = name.c_str();
  tandem_engine_params params{};
  params.sz = sizeof params;
  params.gpu_index = -1;
  params.block_size = flags.block_size;
  params.total_blocks = n_ctx / flags.block_size;
  params.max_seqs = flags.max_seqs;
  params.token_budget = flags.token_budget;
  params.max_model_len = std::min((*model)->n_ctx_train(), params.total_blocks * params.block_size);
  tandem_client* client = nullptr;
  if (const int rc = tandem_engine_open(&options, &params, &client); rc != 0) {
    fmt::print(stderr, "tandem-llama: tandem_engine_open: {}\n", std::strerror(-rc));
    return 1;
  }
  const std::uint64_t host_kv_bytes = config.host_kv_bytes;
  auto engine = llama::LlamaEngine::create(std::move(config), std::move(*model), std::move(*ctx), client);
  if (!engine) {
    tandem_close(client);
    fmt::print(stderr, "tandem-llama: {}\n", engine.error().context());
    return 1;
  }
  (*engine)->start();
  testbed::install_routes(server, **engine);
  std::thread http([&server] { server.listen_after_bind(); });
  while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  fmt::print("tandem-llama: listening on 127.0.0.1:{}\n", port);
  std::string devs;
  for (const std::string& d : llama::devices()) devs += (devs.empty() ? "" : ", ") + d;
  fmt::print(stderr,
             "tandem-llama: {} ({}), llama.cpp {} on {}; {} KV cells in blocks of {} ({} bytes a token), "
             "{} sequences a step, {} tokens a step, host KV copies up to {}, runtime dir {}, name {}\n",
             flags.model, desc, llama::build_info(), devs, n_ctx, flags.block_size, kv_token, flags.max_seqs,
             flags.token_budget,
             host_kv_bytes == 0 ? std::string("no bound") : fmt::format("{} MiB", host_kv_bytes >> 20), runtime_dir,
             name);
  std::fflush(stdout);
  std::fflush(stderr);

  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  fmt::print(stderr, "tandem-llama: {}, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  server.stop();
  (*engine)->drain(kDrainGrace);
  http.join();
  engine->reset();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  auto flags = tandem::llama::parse_flags(args);
  if (!flags) {
    fmt::print(stderr, "tandem-llama: {}\n", flags.error());
    return 2;
  }
  if (flags->help) {
    fmt::print("{}", tandem::llama::usage());
    return 0;
  }
  return run(*flags);
}
