// Command-line parsing for tandem-engine-emu.
#include "testbed/flags.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/core.h>

namespace tandem::testbed {
namespace {

template <class T>
std::expected<T, std::string> parse_uint(std::string_view flag, std::string_view v, std::uint64_t lo,
                                         std::uint64_t hi) {
  std::uint64_t x = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size() || x < lo || x > hi) {
    return std::unexpected(fmt::format("{}: '{}' is not an integer in [{}, {}]", flag, v, lo, hi));
  }
  return static_cast<T>(x);
}

}  // namespace

std::string usage() {
  return R"(usage: tandem-engine-emu [flags]

An LLM engine emulator: sim::Engine's batching and KV model in real time,
an OpenAI-style HTTP API, scheduling by tandemd through libtandem.

  --preset NAME          node preset, as tandem-sim's (default h100-llama3-8b)
  --port N               TCP port on 127.0.0.1; 0 picks one (default 8000)
  --runtime-dir DIR      tandemd's runtime dir (default $TANDEM_RUNTIME_DIR or /run/tandem)
  --name NAME            engine name shown by tandemctl (default emu-<port>)
  --speedup X            divide modelled step times by X (default 1)
  --kv-blocks N          KV blocks in the pool (default: the preset's)
  --kv-block-bytes N     bytes of host memory per KV block (default 4096)
  --max-seqs N           running sequences per step (default: the preset's)
  --token-budget N       tokens per step (default: the preset's)
  --gpu BACKEND          GPU plane backend: sim, auto, cuda or off (default sim)
  --kv-events on|off     report the prefix cache's block hashes (tandem_kv_blocks_report)
                         for tandemd's [kv_events] (default off)
  --help                 this text
)";
}

FlagArg split_flag(std::string_view arg) {
  const auto eq = arg.find('=');
  if (eq == std::string_view::npos) return {arg, {}, false};
  return {arg.substr(0, eq), arg.substr(eq + 1), true};
}

std::expected<Flags, std::string> parse_flags(std::span<const std::string_view> args) {
  Flags f;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (a == "--help" || a == "-h") {
      f.help = true;
      continue;
    }
    if (!a.starts_with("--")) return std::unexpected(fmt::format("unexpected argument '{}'", a));
    auto [flag, value, has_value] = split_flag(a);
    static constexpr std::string_view kKnown[] = {"--preset",       "--port",      "--runtime-dir",    "--name",
                                                  "--speedup",      "--kv-blocks", "--kv-block-bytes", "--max-seqs",
                                                  "--token-budget", "--gpu",       "--kv-events"};
    if (std::find(std::begin(kKnown), std::end(kKnown), flag) == std::end(kKnown)) {
      return std::unexpected(fmt::format("unknown flag '{}' (see --help)", flag));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return std::unexpected(fmt::format("{} needs a value", flag));
      value = args[++i];
    }
    if (flag == "--preset") {
      if (value.empty()) return std::unexpected("--preset: empty name");
      f.preset = value;
    } else if (flag == "--port") {
      auto v = parse_uint<std::uint16_t>(flag, value, 0, 65535);
      if (!v) return std::unexpected(v.error());
      f.port = *v;
    } else if (flag == "--runtime-dir") {
      if (value.empty()) return std::unexpected("--runtime-dir: empty path");
      f.runtime_dir = value;
    } else if (flag == "--name") {
      if (value.empty()) return std::unexpected("--name: empty name");
      f.name = value;
    } else if (flag == "--speedup") {
      double x = 0;
      const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
      if (value.empty() || ec != std::errc() || p != value.data() + value.size() || !(x > 0) || !std::isfinite(x) ||
          x > 1e6) {
        return std::unexpected(fmt::format("--speedup: '{}' is not a number in (0, 1e6]", value));
      }
      f.speedup = x;
    } else if (flag == "--kv-blocks") {
      auto v = parse_uint<std::uint32_t>(flag, value, 1, std::numeric_limits<std::uint32_t>::max());
      if (!v) return std::unexpected(v.error());
      f.kv_blocks = *v;
    } else if (flag == "--kv-block-bytes") {
      auto v = parse_uint<std::size_t>(flag, value, 1, std::size_t{1} << 30);
      if (!v) return std::unexpected(v.error());
      f.kv_block_bytes = *v;
    } else if (flag == "--max-seqs") {
      auto v = parse_uint<std::uint32_t>(flag, value, 1, 1U << 20);
      if (!v) return std::unexpected(v.error());
      f.max_seqs = *v;
    } else if (flag == "--token-budget") {
      auto v = parse_uint<std::uint32_t>(flag, value, 1, 1U << 24);
      if (!v) return std::unexpected(v.error());
      f.token_budget = *v;
    } else if (flag == "--gpu") {
      static constexpr std::string_view kBackends[] = {"sim", "auto", "cuda", "off"};
      if (std::find(std::begin(kBackends), std::end(kBackends), value) == std::end(kBackends)) {
        return std::unexpected(fmt::format("--gpu: '{}' is not one of sim, auto, cuda, off", value));
      }
      f.gpu = value;
    } else if (flag == "--kv-events") {
      if (value != "on" && value != "off")
        return std::unexpected(fmt::format("--kv-events: '{}' is not on or off", value));
      f.kv_events = value == "on";
    }
  }
  return f;
}

std::expected<EngineSetup, std::string> engine_setup(const Flags& flags) {
  auto p = sim::find_preset(flags.preset);
  if (!p) return std::unexpected("--preset: " + p.error().context());
  EngineSetup s;
  s.preset = *p;
  if (flags.kv_blocks != 0) {
    s.preset.gpu_blocks = flags.kv_blocks;
    const std::uint64_t fits = static_cast<std::uint64_t>(flags.kv_blocks) * s.preset.block_size;
    if (fits < 2) return std::unexpected("--kv-blocks: the pool must hold at least 2 tokens");
    s.preset.max_model_len = static_cast<std::uint32_t>(std::min<std::uint64_t>(s.preset.max_model_len, fits));
  }
  if (flags.token_budget != 0) s.preset.token_budget = flags.token_budget;
  if (flags.max_seqs != 0) s.preset.max_seqs = flags.max_seqs;
  if (s.preset.token_budget < s.preset.block_size) {
    return std::unexpected(fmt::format("--token-budget: {} is below one KV block ({} tokens)", s.preset.token_budget,
                                       s.preset.block_size));
  }
  if (flags.kv_block_bytes < s.preset.block_size) {
    return std::unexpected(fmt::format("--kv-block-bytes: {} bytes cannot hold a block of {} tokens",
                                       flags.kv_block_bytes, s.preset.block_size));
  }
  if (auto v = sim::validate(s.preset); !v) return std::unexpected("--preset: " + v.error().context());
  s.limits.token_budget = s.preset.token_budget;
  s.limits.max_seqs = s.preset.max_seqs;
  return s;
}

}  // namespace tandem::testbed
