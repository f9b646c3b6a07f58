// Command-line parsing for tandem-llama.
#include "engines/llama/flags.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include <fmt/core.h>

#include "testbed/flags.h"

namespace tandem::llama {
namespace {

template <class T>
std::expected<T, std::string> parse_int(std::string_view flag, std::string_view v, std::int64_t lo, std::int64_t hi) {
  std::int64_t x = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size() || x < lo || x > hi) {
    return std::unexpected(fmt::format("{}: '{}' is not an integer in [{}, {}]", flag, v, lo, hi));
  }
  return static_cast<T>(x);
}

}  // namespace

std::string usage() {
  return R"(usage: tandem-llama --model FILE.gguf [flags]

An inference engine on llama.cpp scheduled by tandemd: continuous batching
of one llama.cpp sequence per session in one unified KV cache, the policy's
step plan through libtandem, KV directives (pin, drop, offload, restore)
carried out on llama.cpp's cache, an OpenAI-style HTTP API.

  --model FILE         GGUF model (scripts/make-model writes random-weight ones)
  --port N             TCP port on 127.0.0.1; 0 picks one (default 8000)
  --runtime-dir DIR    tandemd's runtime dir (default $TANDEM_RUNTIME_DIR or /run/tandem)
  --name NAME          engine name shown by tandemctl (default llama-<port>)
  --ctx N              KV cells (tokens) of the cache, all sessions together (default 16384)
  --block-size N       tokens per KV block the daemon counts (default 16)
  --max-seqs N         sequences per step, at most 255 (default 32)
  --token-budget N     tokens per step: one llama_decode (default 512)
  --ubatch N           tokens per compute graph (default 512)
  --threads N          CPU threads; 0: every CPU it may run on (default 0)
  --gpu-layers N       layers on the GPU, -1 all (a CUDA build of llama.cpp; default 0)
  --host-kv-mb N       MiB of offloaded KV kept in host memory, least recently used dropped
                       beyond; 0 no bound (default: a quarter of the machine's memory)
  --step-log FILE      one JSON line per step: its shape and measured time
  --kv-events on|off   report the prefix cache's block hashes (tandem_kv_blocks_report)
                       for tandemd's [kv_events] (default off)
  --verbose            llama.cpp's own log too
  --help               this text
)";
}

std::expected<Flags, std::string> parse_flags(std::span<const std::string_view> args) {
  Flags f;
  static constexpr std::string_view kKnown[] = {
      "--model",        "--port",   "--runtime-dir", "--name",       "--ctx",      "--block-size", "--max-seqs",
      "--token-budget", "--ubatch", "--threads",     "--gpu-layers", "--step-log", "--host-kv-mb", "--kv-events"};
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (a == "--help" || a == "-h") {
      f.help = true;
      continue;
    }
    if (a == "--verbose") {
      f.verbose = true;
      continue;
    }
    if (!a.starts_with("--")) return std::unexpected(fmt::format("unexpected argument '{}'", a));
    auto [flag, value, has_value] = testbed::split_flag(a);
    if (std::find(std::begin(kKnown), std::end(kKnown), flag) == std::end(kKnown)) {
      return std::unexpected(fmt::format("unknown flag '{}' (see --help)", flag));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return std::unexpected(fmt::format("{} needs a value", flag));
      value = args[++i];
    }
    std::expected<void, std::string> ok;
    auto set = [&]<class T>(T& out, std::int64_t lo, std::int64_t hi) {
      auto v = parse_int<T>(flag, value, lo, hi);
      if (!v) {
        ok = std::unexpected(v.error());
      } else {
        out = *v;
      }
    };
    if (flag == "--model") {
      if (value.empty()) return std::unexpected("--model: empty path");
      f.model = value;
    } else if (flag == "--port") {
      set(f.port, 0, 65535);
    } else if (flag == "--runtime-dir") {
      if (value.empty()) return std::unexpected("--runtime-dir: empty path");
      f.runtime_dir = value;
    } else if (flag == "--name") {
      if (value.empty()) return std::unexpected("--name: empty name");
      f.name = value;
    } else if (flag == "--ctx") {
      set(f.ctx, 16, 1 << 24);
    } else if (flag == "--block-size") {
      set(f.block_size, 1, 4096);
    } else if (flag == "--max-seqs") {
      set(f.max_seqs, 1, 255);
    } else if (flag == "--token-budget") {
      set(f.token_budget, 1, 1 << 20);
    } else if (flag == "--ubatch") {
      set(f.ubatch, 1, 1 << 20);
    } else if (flag == "--threads") {
      set(f.threads, 0, 4096);
    } else if (flag == "--gpu-layers") {
      set(f.gpu_layers, -1, 100000);
    } else if (flag == "--host-kv-mb") {
      set(f.host_kv_mb, 0, std::int64_t{1} << 40);
    } else if (flag == "--step-log") {
      if (value.empty()) return std::unexpected("--step-log: empty path");
      f.step_log = value;
    } else if (flag == "--kv-events") {
      if (value != "on" && value != "off")
        return std::unexpected(fmt::format("--kv-events: '{}' is not on or off", value));
      f.kv_events = value == "on";
    }
    if (!ok) return std::unexpected(ok.error());
  }
  if (!f.help && f.model.empty()) return std::unexpected("--model is required (a GGUF file; see --help)");
  if (f.block_size > f.ctx) {
    return std::unexpected(fmt::format("--block-size: {} tokens do not fit --ctx {}", f.block_size, f.ctx));
  }
  if (f.token_budget < f.block_size) {
    return std::unexpected(
        fmt::format("--token-budget: {} is below one KV block ({} tokens)", f.token_budget, f.block_size));
  }
  return f;
}

}  // namespace tandem::llama
