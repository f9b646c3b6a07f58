// engine_bench: what tandem costs inside a real engine, and what its KV
// mechanisms cost and save (docs/llama.md "Benchmark"). On one GGUF model
// (scripts/make-model's tiny or 1b shape here, llama3-8b on a GPU):
//
//   overhead  the engine loop of tandem-llama (libtandem's step plan through
//             its C ABI, sim::Engine's ledger, the KV executor, the ledger
//             check, one llama_decode, sampling) against llama.cpp alone
//             (one llama_decode of the same batch and the same sampling), for
//             1, 8 and 32 sessions decoding; medians of the per-step times
//             and their ratio;
//   offload   llama_state_seq_get_data / _set_data of a sequence of N tokens
//             in MB/s, next to a plain memcpy of the same bytes;
//   resume    the first-token latency of a session's next round (64 new
//             tokens) at 4k, 16k and 32k tokens of context: its KV warm
//             (pinned), offloaded to host memory, or dropped (recomputed);
//   grid      steps of many shapes (decode batches over contexts, prefill
//             chunks over prior context) through the engine with its step
//             log on, for `tandem-sim --calibrate`.
//
// Run without a daemon: libtandem runs fail-open and plans locally (fcfs),
// which is what an engine does between reconnects, and costs the same.
// Numbers are medians of repeated runs measured side by side in one process;
// the machine should be otherwise idle.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <tandem/tandem.h>

#include "base/stats.h"
#include "engines/llama/engine.h"
#include "engines/llama/runtime.h"
#include "sim/calibrate.h"

namespace {

using namespace tandem;
using namespace tandem::llama;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

using base::median;

struct Options {
  std::string model;
  int threads = 0;
  int gpu_layers = 0;
  std::uint32_t ctx = 0;  // 0: what the run needs
  std::vector<std::uint32_t> sessions = {1, 8, 32};
  std::vector<std::uint32_t> contexts = {4096, 16384, 32768};
  std::uint32_t steps = 24;
  bool overhead = false, offload = false, resume = false;
  std::string grid;  // step log path
  std::vector<std::uint32_t> grid_batches = {1, 2, 4, 8, 16, 32};
  std::vector<std::uint32_t> grid_contexts = {128, 1024, 3072};
  std::vector<std::uint32_t> grid_prefills = {16, 64, 256, 1024, 4096};
  std::uint32_t budget = 512;
  std::string preset_out;
  std::string preset_name;
  std::string json;
  bool verbose = false;
};

int usage_error(const std::string& what) {
  fmt::print(stderr, "engine_bench: {} (see --help)\n", what);
  return 2;
}

constexpr std::string_view kUsage = R"(usage: engine_bench --model FILE.gguf [what] [options]

what (default: --overhead --offload --resume)
  --overhead            tandem-llama's step against llama.cpp alone, 1/8/32 sessions decoding
  --offload             sequence state out and back in MB/s, against memcpy
  --resume              first-token latency: warm (pinned) vs offloaded vs dropped KV
  --grid STEPLOG        steps of many shapes with the engine's step log (tandem-sim --calibrate)
  --preset-out FILE     with --grid: the engine's preset to calibrate (its pool, limits and measured
                        KV copy cost; the step model is what tandem-sim --calibrate fits)
  --ctx N               with --grid: the engine's KV cells (default 65536)
  --name NAME           with --preset-out: the preset's name (default llama-<model>)
  --grid-batches LIST   with --grid: sessions decoding together (default 1,2,4,8,16,32)
  --grid-contexts LIST  with --grid: their contexts (default 128,1024,3072)
  --grid-prefills LIST  with --grid: prompt lengths prefilled alone (default 16,64,256,1024,4096)
  --budget N            tokens per step, the llama_decode batch (default 512)
options
  --sessions LIST       sessions for --overhead (default 1,8,32)
  --contexts LIST       contexts for --offload and --resume (default 4096,16384,32768)
  --steps N             decode steps measured per point (default 24)
  --threads N           CPU threads (default: every CPU this process may run on)
  --gpu-layers N        layers on the GPU, -1 all (a CUDA build)
  --json FILE           every number as JSON
  --verbose             llama.cpp's log too
)";

std::vector<std::uint32_t> parse_list(std::string_view v) {
  std::vector<std::uint32_t> out;
  std::size_t at = 0;
  while (at <= v.size()) {
    const std::size_t comma = v.find(',', at);
    const std::string_view part = v.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
    const long n = std::strtol(std::string(part).c_str(), nullptr, 10);
    if (n <= 0) return {};
    out.push_back(static_cast<std::uint32_t>(n));
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  return out;
}

// ---- a context on the model ----------------------------------------------------

// The model, loaded once (a 16 GB one takes seconds to reach the GPU).
std::shared_ptr<const Model> g_model;

struct Rig {
  std::unique_ptr<Context> ctx;
};

base::Result<Rig> rig(const Options& o, std::uint32_t n_ctx, std::uint32_t n_batch) {
  ContextOptions co;
  co.n_ctx = n_ctx;
  co.n_batch = n_batch;
  co.n_ubatch = std::min<std::uint32_t>(n_batch, 512);
  co.n_seq_max = 256;
  co.threads = o.threads;
  auto c = Context::create(*g_model, co);
  if (!c) return std::unexpected(c.error());
  return Rig{std::move(*c)};
}

// An engine around a fresh context, fail-open (no daemon) through a real
// libtandem handle, so the plan goes through the C ABI as in production.
base::Result<std::unique_ptr<LlamaEngine>> engine(const Options& o, std::uint32_t n_ctx, std::uint32_t max_seqs,
                                                  std::uint32_t budget, const std::string& step_log = "") {
  auto r = rig(o, n_ctx, budget);
  if (!r) return std::unexpected(r.error());
  tandem_options opts{};
  opts.sz = sizeof opts;
  opts.runtime_dir = "/nonexistent/engine_bench";  // fail-open: no daemon
  opts.name = "engine_bench";
  tandem_engine_params p{};
  p.sz = sizeof p;
  p.gpu_index = -1;
  p.block_size = 16;
  p.total_blocks = r->ctx->n_ctx() / 16;
  p.max_seqs = max_seqs;
  p.token_budget = budget;
  p.max_model_len = r->ctx->n_ctx();
  tandem_client* client = nullptr;
  if (const int rc = tandem_engine_open(&opts, &p, &client); rc != 0) {
    return base::make_error(-rc, "tandem_engine_open");
  }
  EngineConfig c;
  c.name = "bench";
  c.max_seqs = max_seqs;
  c.token_budget = budget;
  c.step_log = step_log;
  return LlamaEngine::create(c, g_model, std::move(r->ctx), client);
}

// One step the engine ran: its wall time and shape.
struct TimedStep {
  double ms = 0;
  sim::StepShape shape;
};

// Ticks until every job is done (or fails); `on_step` sees every step.
bool run_jobs(LlamaEngine& e, const std::vector<std::shared_ptr<testbed::Job>>& jobs,
              const std::function<void(const TimedStep&)>& on_step = {}) {
  for (const auto& j : jobs) {
    if (e.submit(j) != testbed::SubmitStatus::kQueued) return false;
  }
  for (;;) {
    bool all = true;
    for (const auto& j : jobs) {
      const auto p = j->wait(0, base::MonotonicClock().now());
      if (p.status != 0) {
        fmt::print(stderr, "engine_bench: a round failed: {}\n", p.error);
        return false;
      }
      all = all && p.done;
    }
    if (all) return true;
    const auto t0 = Clock::now();
    const LlamaEngine::Tick t = e.tick();
    if (t == LlamaEngine::Tick::kStepped && on_step) on_step({ms_since(t0), e.last_shape()});
  }
}

// ---- overhead ---------------------------------------------------------------------

json overhead(const Options& o) {
  constexpr std::uint32_t kPrompt = 512;
  constexpr std::uint32_t kBudget = 512;
  constexpr std::uint32_t kWarm = 2;  // warm-up steps of each, not counted
  json out = json::array();
  fmt::print("\n== tandem-llama's step vs llama.cpp alone (decode, {}-token contexts; median of {} paired steps)\n",
             kPrompt, o.steps);
  fmt::print("{:>9} {:>14} {:>14} {:>10}\n", "sessions", "llama alone", "tandem-llama", "overhead");
  for (const std::uint32_t n : o.sessions) {
    const std::uint32_t n_ctx = std::max<std::uint32_t>(4096, n * (kPrompt + o.steps + 64));
    // llama.cpp alone: n sequences prefilled, then decode steps of n tokens
    // with greedy sampling, as the engine samples.
    auto r = rig(o, n_ctx, kBudget);
    if (!r) {
      fmt::print(stderr, "engine_bench: {}\n", r.error().context());
      return out;
    }
    Batch b(kBudget);
    std::vector<std::unique_ptr<Sampler>> samplers;
    for (std::uint32_t s = 0; s < n; ++s) {
      samplers.push_back(std::make_unique<Sampler>(0.0, 1));
      for (std::uint32_t p = 0; p < kPrompt; p += 256) {
        b.clear();
        for (std::uint32_t q = p; q < std::min(kPrompt, p + 256); ++q) {
          b.add(static_cast<Token>(1000 + (q * 7919 + s) % 50000), static_cast<std::int32_t>(q), static_cast<SeqId>(s),
                q + 1 == kPrompt);
        }
        r->ctx->decode(b);
      }
    }
    std::vector<Token> last(n, 1000);
    std::uint32_t alone_steps = 0;
    auto alone_step = [&] {
      const auto t0 = Clock::now();
      b.clear();
      for (std::uint32_t s = 0; s < n; ++s) {
        b.add(last[s], static_cast<std::int32_t>(kPrompt + alone_steps), static_cast<SeqId>(s), true);
      }
      r->ctx->decode(b);
      for (std::uint32_t s = 0; s < n; ++s) last[s] = samplers[s]->sample(*r->ctx, static_cast<int>(s));
      r->ctx->synchronize();
      ++alone_steps;
      return ms_since(t0);
    };
    // tandem-llama: n sessions, each a round of kPrompt prompt tokens, all
    // in one batch (max_seqs = n). The prompts are prefilled in chunks of
    // the step budget, so sessions start decoding at different steps and
    // finish at different steps: each generates enough tokens that, after
    // the last prefill, every session decodes together for kWarm + o.steps
    // steps. Only those steps (n sequences, n tokens: the baseline's shape)
    // are compared; the steps where fewer sessions decode are cheaper and
    // once made this row look faster than llama.cpp alone. Each counted
    // engine step is followed by one step of llama.cpp alone, so the two
    // series see the same machine (this one is shared and noisy).
    const std::uint32_t prefill_steps = (n * kPrompt + kBudget - 1) / kBudget;
    auto e = engine(o, n_ctx + n * prefill_steps, std::max<std::uint32_t>(n, 1), kBudget);
    if (!e) {
      fmt::print(stderr, "engine_bench: {}\n", e.error().context());
      return out;
    }
    std::vector<std::shared_ptr<testbed::Job>> jobs;
    jobs.reserve(n);
    for (std::uint32_t s = 0; s < n; ++s) {
      jobs.push_back(synthetic_round(fmt::format("s{}", s), 0, kPrompt, prefill_steps + kWarm + o.steps + 2, false));
    }
    std::vector<double> alone;
    std::vector<double> dec;
    std::uint32_t full = 0;
    const bool ran = run_jobs(**e, jobs, [&](const TimedStep& st) {
      if (st.shape.seqs != n || st.shape.tokens != n || st.shape.prefill_pairs != 0) return;
      if (full++ >= kWarm + o.steps) return;
      const double a = alone_step();
      if (full > kWarm) {
        dec.push_back(st.ms);
        alone.push_back(a);
      }
    });
    if (!ran) return out;
    if (dec.size() < o.steps) {
      fmt::print(stderr, "engine_bench: {} sessions: only {} steps decoded all of them (wanted {})\n", n, dec.size(),
                 o.steps);
      if (dec.empty()) return out;
    }
    const double a = median(alone);
    const double t = median(dec);
    fmt::print("{:>9} {:>11.2f} ms {:>11.2f} ms {:>+9.1f}%\n", n, a, t, 100.0 * (t - a) / a);
    out.push_back({{"sessions", n}, {"llama_ms", a}, {"tandem_ms", t}, {"overhead", (t - a) / a}});
  }
  return out;
}

// ---- offload ------------------------------------------------------------------------

json offload(const Options& o) {
  json out = json::array();
  fmt::print("\n== a sequence's KV state out to host memory and back, against memcpy of the same bytes\n");
  fmt::print("{:>8} {:>10} {:>12} {:>12} {:>12}\n", "tokens", "MB", "out MB/s", "in MB/s", "memcpy MB/s");
  for (const std::uint32_t n : o.contexts) {
    auto r = rig(o, n + 256, 512);
    if (!r) {
      fmt::print(stderr, "engine_bench: {}\n", r.error().context());
      return out;
    }
    Batch b(512);
    for (std::uint32_t p = 0; p < n; p += 512) {
      b.clear();
      for (std::uint32_t q = p; q < std::min(n, p + 512); ++q) {
        b.add(static_cast<Token>(1000 + q % 50000), static_cast<std::int32_t>(q), 0, false);
      }
      if (r->ctx->decode(b) != 0) {
        fmt::print(stderr, "engine_bench: prefill of {} tokens failed\n", n);
        return out;
      }
    }
    std::vector<std::uint8_t> state;
    std::vector<double> get_ms, set_ms, copy_ms;
    for (int rep = 0; rep < 5; ++rep) {
      auto t0 = Clock::now();
      r->ctx->state_get(0, state);
      get_ms.push_back(ms_since(t0));
      t0 = Clock::now();
      if (!r->ctx->state_set(0, state)) {
        fmt::print(stderr, "engine_bench: restore of {} tokens failed\n", n);
        return out;
      }
      r->ctx->synchronize();
      set_ms.push_back(ms_since(t0));
      std::vector<std::uint8_t> copy(state.size());
      t0 = Clock::now();
      std::memcpy(copy.data(), state.data(), state.size());
      copy_ms.push_back(ms_since(t0));
      if (copy[state.size() / 2] != state[state.size() / 2]) std::abort();  // keeps the copy
    }
    const double mb = static_cast<double>(state.size()) / 1e6;
    const double g = median(get_ms), s = median(set_ms), c = median(copy_ms);
    fmt::print("{:>8} {:>10.1f} {:>12.0f} {:>12.0f} {:>12.0f}\n", n, mb, mb / g * 1e3, mb / s * 1e3, mb / c * 1e3);
    out.push_back({{"tokens", n}, {"bytes", state.size()}, {"out_ms", g}, {"in_ms", s}, {"memcpy_ms", c}});
  }
  return out;
}

// ---- resume ---------------------------------------------------------------------------

json resume(const Options& o) {
  constexpr std::uint32_t kNew = 64;
  json out = json::array();
  fmt::print("\n== first-token latency of a session's next round ({} new tokens)\n", kNew);
  fmt::print("{:>8} {:>12} {:>12} {:>12}\n", "context", "warm (pin)", "offloaded", "dropped");
  for (const std::uint32_t c : o.contexts) {
    json row = {{"context", c}};
    std::string line = fmt::format("{:>8}", c);
    for (const char* how : {"warm", "offloaded", "dropped"}) {
      auto e = engine(o, c + 2 * kNew + 256, 4, 512);
      if (!e) {
        fmt::print(stderr, "engine_bench: {}\n", e.error().context());
        return out;
      }
      LlamaEngine& eng = **e;
      if (!run_jobs(eng, {synthetic_round("s", 0, c, 2)})) return out;
      const std::uint64_t id = tandem_session_id("s");
      if (std::strcmp(how, "warm") == 0) {
        eng.apply({TANDEM_DIR_PIN, 0, id, INT64_MAX});
      } else if (std::strcmp(how, "offloaded") == 0) {
        eng.apply({TANDEM_DIR_OFFLOAD, 0, id, 0});
        eng.tick();
        eng.apply({TANDEM_DIR_DROP, 0, id, 0});  // the GPU copy goes; the host copy stays
      } else {
        eng.apply({TANDEM_DIR_DROP, 0, id, 0});
      }
      auto job = synthetic_round("s", 1, c + 1 + kNew, 1);
      const auto t0 = Clock::now();
      if (!run_jobs(eng, {job})) return out;
      const double ms = ms_since(t0);
      row[how] = ms;
      line += fmt::format(" {:>9.1f} ms", ms);
    }
    fmt::print("{}\n", line);
    out.push_back(row);
  }
  return out;
}

// ---- the calibration grid ---------------------------------------------------------------

int grid(const Options& o) {
  // Decode batches over contexts, and prefills of several lengths (chunked
  // at the budget over their own prior context), twice each, with the step
  // log on.
  const std::uint32_t cells = o.ctx != 0 ? o.ctx : 65536;
  const std::uint32_t max_batch = *std::max_element(o.grid_batches.begin(), o.grid_batches.end());
  if (max_batch > 255) {
    fmt::print(stderr, "engine_bench: --grid-batches: at most 255 sessions decode together\n");
    return 2;
  }
  auto e = engine(o, cells, max_batch, o.budget, o.grid);
  if (!e) {
    fmt::print(stderr, "engine_bench: {}\n", e.error().context());
    return 1;
  }
  std::uint32_t k = 0;
  const auto t0 = Clock::now();
  for (int rep = 0; rep < 2; ++rep) {
    for (const std::uint32_t ctx : o.grid_contexts) {
      for (const std::uint32_t n : o.grid_batches) {
        if (static_cast<std::uint64_t>(n) * (ctx + 32) > static_cast<std::uint64_t>(cells) * 9 / 10) continue;
        std::vector<std::shared_ptr<testbed::Job>> jobs;
        jobs.reserve(n);
        for (std::uint32_t s = 0; s < n; ++s) {
          jobs.push_back(synthetic_round(fmt::format("g{}", k++), 0, ctx, 24, false));
        }
        if (!run_jobs(**e, jobs)) return 1;
      }
    }
    for (const std::uint32_t n : o.grid_prefills) {
      if (n + 4 > cells) continue;
      if (!run_jobs(**e, {synthetic_round(fmt::format("g{}", k++), 0, n, 2, false)})) return 1;
    }
  }
  fmt::print("engine_bench: grid of {} sessions in {:.1f} s; step log {}\n", k, ms_since(t0) / 1e3, o.grid);
  if (o.preset_out.empty()) return 0;

  // The preset to calibrate: this engine's pool and limits, and what a
  // sequence's KV costs to copy out and back (2,048 tokens, median of 5;
  // the simulator charges it per token both ways).
  sim::Preset p = (*e)->preset();
  const std::string name = o.preset_name.empty() ? fmt::format("llama-{}", p.name) : o.preset_name;
  const std::string doc =
      fmt::format("tandem-llama on {} ({}), fitted by tandem-sim --calibrate", o.model, std::string(build_info()));
  p.name = name;
  p.doc = doc;
  e->reset();
  auto r = rig(o, 4096, 512);
  if (!r) {
    fmt::print(stderr, "engine_bench: {}\n", r.error().context());
    return 1;
  }
  constexpr std::uint32_t kTokens = 2048;
  Batch b(512);
  for (std::uint32_t q = 0; q < kTokens; q += 512) {
    b.clear();
    for (std::uint32_t i = q; i < q + 512; ++i)
      b.add(static_cast<Token>(1000 + i), static_cast<std::int32_t>(i), 0, false);
    r->ctx->decode(b);
  }
  std::vector<std::uint8_t> state;
  std::vector<double> us;
  for (int rep = 0; rep < 5; ++rep) {
    auto c0 = Clock::now();
    r->ctx->state_get(0, state);
    const double out_ms = ms_since(c0);
    c0 = Clock::now();
    r->ctx->state_set(0, state);
    r->ctx->synchronize();
    us.push_back(500.0 * (out_ms + ms_since(c0)));  // the mean of out and in, µs
  }
  p.swap_us_per_token = median(us) / kTokens;
  p.swap_fixed_us = 0;
  std::FILE* f = std::fopen(o.preset_out.c_str(), "we");
  const std::string text = sim::preset_json(p);
  if (f == nullptr || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0) {
    fmt::print(stderr, "engine_bench: {}: cannot write\n", o.preset_out);
    return 1;
  }
  fmt::print("engine_bench: the preset to calibrate: {} ({} blocks of {}, KV copy {:.3f} µs a token)\n", o.preset_out,
             p.gpu_blocks, p.block_size, p.swap_us_per_token);
  return 0;
}

int run_main(int argc, char** argv) {
  // The model goes before main returns: freed by a static destructor, its
  // CUDA buffers would meet a driver that is shutting down (an abort at exit).
  struct DropModel {
    DropModel() = default;
    DropModel(const DropModel&) = delete;
    DropModel& operator=(const DropModel&) = delete;
    ~DropModel() { g_model.reset(); }
  } drop_model;
  Options o;
  std::vector<std::string_view> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    auto value = [&]() -> std::string_view { return i + 1 < args.size() ? args[++i] : std::string_view(); };
    if (a == "-h" || a == "--help") {
      fmt::print("{}", kUsage);
      return 0;
    } else if (a == "--model") {
      o.model = value();
    } else if (a == "--overhead") {
      o.overhead = true;
    } else if (a == "--offload") {
      o.offload = true;
    } else if (a == "--resume") {
      o.resume = true;
    } else if (a == "--grid") {
      o.grid = value();
      if (o.grid.empty()) return usage_error("--grid needs a file");
    } else if (a == "--name") {
      o.preset_name = value();
      if (o.preset_name.empty()) return usage_error("--name needs a name");
    } else if (a == "--preset-out") {
      o.preset_out = value();
      if (o.preset_out.empty()) return usage_error("--preset-out needs a file");
    } else if (a == "--json") {
      o.json = value();
    } else if (a == "--verbose") {
      o.verbose = true;
    } else if (a == "--sessions" || a == "--contexts" || a == "--grid-batches" || a == "--grid-contexts" ||
               a == "--grid-prefills") {
      auto l = parse_list(value());
      if (l.empty()) return usage_error(std::string(a) + " wants positive integers separated by commas");
      (a == "--sessions"        ? o.sessions
       : a == "--contexts"      ? o.contexts
       : a == "--grid-batches"  ? o.grid_batches
       : a == "--grid-contexts" ? o.grid_contexts
                                : o.grid_prefills) = l;
    } else if (a == "--steps" || a == "--threads" || a == "--gpu-layers" || a == "--ctx" || a == "--budget") {
      const std::string v(value());
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < (a == "--gpu-layers" ? -1 : 0)) {
        return usage_error(std::string(a) + ": '" + v + "' is not a valid number");
      }
      if (a == "--steps") o.steps = static_cast<std::uint32_t>(std::max(1L, n));
      if (a == "--threads") o.threads = static_cast<int>(n);
      if (a == "--gpu-layers") o.gpu_layers = static_cast<int>(n);
      if (a == "--ctx") o.ctx = static_cast<std::uint32_t>(n);
      if (a == "--budget") o.budget = static_cast<std::uint32_t>(std::clamp(n, 16L, 65536L));
    } else {
      return usage_error("unknown argument '" + std::string(a) + "'");
    }
  }
  if (o.model.empty()) return usage_error("--model is required");
  if (!o.overhead && !o.offload && !o.resume && o.grid.empty()) o.overhead = o.offload = o.resume = true;
  init("engine_bench: llama.cpp", o.verbose);
  {
    const auto t0 = Clock::now();
    auto m = Model::load({o.model, o.gpu_layers});
    if (!m) {
      fmt::print(stderr, "engine_bench: {}\n", m.error().context());
      return 2;
    }
    g_model = std::move(*m);
    std::string devs;
    for (const std::string& d : devices()) devs += (devs.empty() ? "" : ", ") + d;
    fmt::print("engine_bench: {} ({}), llama.cpp {}, on {}; loaded in {:.1f} s\n", o.model, g_model->description(),
               build_info(), devs, ms_since(t0) / 1e3);
  }
  if (!o.grid.empty()) return grid(o);
  json out = {{"model", o.model}, {"llama", std::string(build_info())}};
  // A part that could not measure every row has said why on stderr; the
  // rows it did measure are still written, and the exit status says so.
  bool complete = true;
  if (o.overhead) {
    out["overhead"] = overhead(o);
    complete = complete && out["overhead"].size() == o.sessions.size();
  }
  if (o.offload) out["offload"] = offload(o);
  if (o.resume) out["resume"] = resume(o);
  if (!o.json.empty()) {
    std::FILE* f = std::fopen(o.json.c_str(), "we");
    if (f == nullptr) {
      fmt::print(stderr, "engine_bench: {}: {}\n", o.json, std::strerror(errno));
      return 1;
    }
    const std::string text = out.dump(2);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  return complete ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& e) {
    // bad_alloc, a JSON error writing the preset, …
    std::fprintf(stderr, "engine_bench: %s\n", e.what());
    return 1;
  }
}
