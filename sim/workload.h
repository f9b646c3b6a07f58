// Workloads for tandem-sim: agent sessions as the simulator replays them.
//
// A session is a list of rounds; each round is one LLM call (a prompt that
// carries the whole context so far, and the tokens generated) followed by a
// tool call (none after the last round). Sessions come from the real traces of
// data/traces (load_trace) or from a named synthetic generator
// (synthetic_pool); make_workload() then draws the sessions of one run with a
// seed and gives them arrival times (Poisson or fixed rate), capping every
// round's context at the model's maximum length.
//
// Pure apart from load_trace() reading its file. Everything here is
// deterministic for a given seed: every policy of a comparison sees the same
// sessions arriving at the same instants.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace tandem::sim {

struct RoundSpec {
  std::uint32_t input_tokens = 0;   // whole prompt of this LLM call (context so far + new tokens)
  std::uint32_t output_tokens = 0;  // generated tokens (≥ 1)
  std::string tool;                 // tool kind run after the call; empty = final answer, no tool
  double tool_seconds = 0.0;        // nominal (uncontended) wall time of the tool call
  bool capped = false;              // input was cut to fit max_model_len (make_workload)
};

struct SessionSpec {
  std::string name;               // trace id, or "<workload>-<n>" for synthetic ones
  std::string source;             // the trace's "source" (agent and model), "" for synthetic ones
  double arrival_s = 0.0;         // set by make_workload()
  double mem_scale = 1.0;         // scales every tool call's memory peak (agentic-mem draws it per session)
  std::vector<RoundSpec> rounds;  // ≥ 1; the last has no tool
};

struct Workload {
  std::string name;                   // trace file stem or synthetic name
  std::vector<SessionSpec> sessions;  // in arrival order
  std::uint64_t rounds = 0;           // total rounds
  std::uint64_t capped_rounds = 0;    // rounds whose context was capped
};

// Parses a data/traces JSONL file (format in its README.md). Every line
// must be a JSON object with a non-empty "rounds" array whose entries have
// integer input_tokens ≥ 1 and output_tokens ≥ 0 (0 becomes 1: a call
// generates at least one token), an optional string-or-null "tool" and a
// number tool_seconds ≥ 0 (absent = 0). A round with a null tool that is not
// the last ends the session there (the rest is dropped, counted in
// `dropped_rounds`). Blank lines are skipped. Errors name the file, the line
// number and the field (EINVAL), or the I/O failure (errno).
struct TraceStats {
  std::size_t sessions = 0;
  std::uint64_t rounds = 0;
  std::uint64_t dropped_rounds = 0;
};
base::Result<std::vector<SessionSpec>> load_trace(const std::string& path, TraceStats* stats = nullptr);
// The same, from text already in memory (`origin` names it in errors).
base::Result<std::vector<SessionSpec>> parse_trace(std::string_view text, std::string_view origin,
                                                   TraceStats* stats = nullptr);

// The sessions of `pool` whose source starts with one of `include` (all of
// them when `include` is empty) and with none of `exclude`, in pool order.
// How the dev trace is split into a tuning and a validation part
// (docs/results.md): by source, so the validation part holds agents and
// models the tuning part never showed.
std::vector<SessionSpec> filter_by_source(std::span<const SessionSpec> pool, std::span<const std::string> include,
                                          std::span<const std::string> exclude);

// Named synthetic generators. Each documents its parameters in `doc`.
struct SyntheticSpec {
  std::string_view name;
  std::string_view doc;
};
std::span<const SyntheticSpec> synthetic_workloads();
// `count` sessions of the named generator. ENOENT for an unknown name (the
// message lists the known ones), EINVAL for count 0.
base::Result<std::vector<SessionSpec>> synthetic_pool(std::string_view name, std::size_t count, std::uint64_t seed);

struct ArrivalSpec {
  double rate_sps = 0.1;     // sessions per second, > 0
  bool poisson = true;       // false: fixed spacing 1/rate
  std::size_t sessions = 0;  // sessions to draw; 0 = every session of the pool once
  std::uint64_t seed = 1;
  std::uint32_t max_model_len = 131072;  // contexts are capped to fit this many tokens
};

// Draws `sessions` sessions from `pool` (a seeded shuffle, repeating the pool
// when more are asked than it holds), sets arrival times starting at 0, and
// caps every round so input + output ≤ max_model_len (input is cut first;
// output is kept ≤ max_model_len / 2). EINVAL for an empty pool, a rate ≤ 0
// or not finite, or max_model_len < 2.
base::Result<Workload> make_workload(std::span<const SessionSpec> pool, std::string_view name,
                                     const ArrivalSpec& arrivals);

// CPU demand of a tool call, in cores, by tool kind: how much of its wall
// time a tool spends runnable. The defaults follow the traces' tool names:
// build, test and interpreter runs (pytest, pip, python, …) ≈ 1 core; git
// and shell utilities partly; harness I/O tools (Read, Edit, Grep, Glob, …)
// and network tools (WebFetch, …) a little. Unknown kinds get `fallback`.
class ToolCpuTable {
 public:
  ToolCpuTable();  // the defaults
  double demand(std::string_view kind) const;
  // Applies "kind=cores,kind=cores,..." (cores in [0, 64]; "*" sets the
  // fallback). EINVAL naming the bad entry; on error nothing changes.
  base::Result<void> apply(std::string_view spec);
  const std::map<std::string, double, std::less<>>& table() const { return table_; }
  double fallback() const { return fallback_; }

 private:
  std::map<std::string, double, std::less<>> table_;
  double fallback_ = 0.5;
};

}  // namespace tandem::sim
