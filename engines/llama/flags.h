// tandem-llama's command line (docs/llama.md "Flags"), parsed without side
// effects so tests can feed it strings.
#pragma once

#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <string_view>

namespace tandem::llama {

struct Flags {
  bool help = false;
  std::string model;  // GGUF file (required)
  std::uint16_t port = 8000;
  std::string runtime_dir;           // empty: $TANDEM_RUNTIME_DIR, else /run/tandem
  std::string name;                  // empty: llama-<port>
  std::uint32_t ctx = 16384;         // KV cells of the unified cache
  std::uint32_t block_size = 16;     // tokens per ledger block
  std::uint32_t max_seqs = 32;       // sequences per step
  std::uint32_t token_budget = 512;  // tokens per step (llama_decode batch)
  std::uint32_t ubatch = 512;        // tokens per compute graph
  int threads = 0;                   // 0: every CPU this process may run on
  int gpu_layers = 0;                // -1: all (a CUDA build)
  std::int64_t host_kv_mb = -1;      // host copies of offloaded KV, MiB; -1: a quarter of the memory, 0: no bound
  std::string step_log;              // JSONL of every step
  bool kv_events = false;            // --kv-events on: report block hashes (tandem_kv_blocks_report)
  bool verbose = false;
};

// "--flag value" or "--flag=value". The error names the flag.
std::expected<Flags, std::string> parse_flags(std::span<const std::string_view> args);
std::string usage();

}  // namespace tandem::llama
