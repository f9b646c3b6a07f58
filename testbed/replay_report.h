// tandem-agents' output: one run's summary and JSON, and the side-by-side
// comparison of runs (the demo's table, merged JSON and plot).
//
// A run file is the simulator's --json document for the measured run (one
// entry in "runs"), with two more keys: "predicted", the simulator's
// document for its prediction of the same run, and "testbed", what only the
// live run knows (compression, daemon and engine state, tool checks, every
// session's E2E and every round's TTFT, and the predicted ones).
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "sim/metrics.h"
#include "testbed/replay.h"

namespace tandem::testbed {

struct RunSummary {
  std::string preset;
  std::string workload;
  std::string policy;
  double rate = 0;
  double compress = 1;
  std::size_t sessions = 0;
  double wall_s = 0;
  sim::Metrics measured;
  std::vector<double> e2e_s;   // completed sessions, trace seconds
  std::vector<double> ttft_s;  // every round of a completed session, trace seconds
  std::optional<sim::Metrics> predicted;
  std::string prediction_error;
  std::vector<double> predicted_e2e_s;
  std::vector<double> predicted_ttft_s;
  double tool_start_ms = 0;  // CPU per tool call beyond its step's, wall ms (the prediction's start phase)
  // Mean tool stretch over calls of at least kLongToolWallS compressed.
  double long_stretch = 0, predicted_long_stretch = 0;
  const std::vector<SessionLog>* logs = nullptr;
  nlohmann::json engine_stats;          // tandem-engine-emu's /stats at the end
  nlohmann::json daemon_first;          // tandemctl status at the start (null: unreachable)
  nlohmann::json daemon_last;           // ... and the last sample
  std::uint64_t peak_tools_memory = 0;  // bytes, tandemd's tools_memory_bytes sampled every 250 ms
  // The node's memory stall over the run (/proc/pressure/memory totals), %
  // of its wall time; NaN where the kernel has no PSI.
  double mem_psi_some_pct = std::numeric_limits<double>::quiet_NaN();
  double mem_psi_full_pct = std::numeric_limits<double>::quiet_NaN();
  bool timed_out = false;
  bool interrupted = false;
};

// The run file's document.
nlohmann::ordered_json run_document(const RunSummary& run);
base::Result<void> write_run(const RunSummary& run, const std::string& path);
// A short human summary of one run.
void print_run(std::FILE* out, const RunSummary& run);

// Reads run files, prints the side-by-side table (one column per run, the
// ratio of the last to the first when there are two, then the simulator's
// prediction for each), and writes what is asked: `json` (the measured runs,
// the simulator's format, plus "testbed" per policy), `sim_json` (the
// predictions) and `plot` (PNG: E2E and TTFT CDFs, measured and predicted).
// Errors name the file (unreadable, not a run file) or runs of different
// workloads.
base::Result<void> compare_runs(std::FILE* out, std::span<const std::string> inputs, const std::string& json,
                                const std::string& sim_json, const std::string& plot);

}  // namespace tandem::testbed
