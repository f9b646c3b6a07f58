// tandem-engine-emu's command line (docs/testbed.md "Flags"), parsed without
// side effects so tests can feed it strings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <string_view>

#include "sim/engine.h"
#include "sim/preset.h"

namespace tandem::testbed {

struct Flags {
  bool help = false;
  std::string preset = "h100-llama3-8b";
  std::uint16_t port = 8000;
  std::string runtime_dir;  // empty: $TANDEM_RUNTIME_DIR, else /run/tandem (resolved by main)
  std::string name;         // empty: emu-<port>
  double speedup = 1.0;
  std::uint32_t kv_blocks = 0;  // 0: the preset's
  std::size_t kv_block_bytes = 4096;
  bool kv_events = false;          // --kv-events on: report block hashes (tandem_kv_blocks_report)
  std::uint32_t max_seqs = 0;      // 0: the preset's
  std::uint32_t token_budget = 0;  // 0: the preset's
  // The GPU plane's backend for tandem_gpu_open: "sim", "auto" or "cuda";
  // "off": no green-context pool.
  std::string gpu = "sim";
};

// "--flag value" or "--flag=value". The error names the flag.
std::expected<Flags, std::string> parse_flags(std::span<const std::string_view> args);

// One "--flag" or "--flag=value" argument, split at the first '=' (the
// testbed binaries' shared convention).
struct FlagArg {
  std::string_view flag;
  std::string_view value;
  bool has_value = false;
};
FlagArg split_flag(std::string_view arg);
std::string usage();

// The preset with the flags' overrides: --kv-blocks sets the pool (and caps
// max_model_len to what fits it), --max-seqs and --token-budget the limits.
// The error names the flag (unknown preset, a pool a request cannot fit…).
struct EngineSetup {
  sim::Preset preset;
  sim::EngineLimits limits;
};
std::expected<EngineSetup, std::string> engine_setup(const Flags& flags);

}  // namespace tandem::testbed
