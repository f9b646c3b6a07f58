// A simulated node: engines, tool cores and one policy, in virtual time
// (docs/sim.md). It hosts both halves of a sched/ policy unchanged: the
// control half sees every event through a NodeModel and ticks every
// `tick_s` (and at every session arrival, as MARS's controller runs at
// arrivals); each engine runs its own instance of the step half.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"
#include "sched/host_memory.h"
#include "sim/engine.h"
#include "sim/host_memory.h"
#include "sim/metrics.h"
#include "sim/preset.h"
#include "sim/workload.h"

namespace tandem::sim {

struct SimConfig {
  Preset preset;
  EngineLimits limits;  // token budget and seats per step (preset defaults unless overridden)
  std::uint32_t engines = 1;
  double tool_cores = 16;
  std::string policy = "fcfs";
  std::map<std::string, double> params;  // policy parameters (validated by the registry)
  double tick_s = 0.05;                  // control tick period
  ToolCpuTable tool_cpu;
  double stall_s = 3600;  // no round ends, tool ends or arrivals for this long (virtual): the run fails
  // Host memory for KV copies (offload, swap), per engine; the node's pool is
  // engines × this, shared. 0: unlimited. InferCept's experiments give each
  // GPU 128 GiB of swap space ([baselines] §3).
  double host_kv_gib = 128;
  // Host memory (docs/sim.md "Host memory"): off unless tool_mem is set.
  bool tool_mem = false;        // tool calls and sessions hold memory
  ToolMemTable tool_mem_table;  // per-kind demand
  double host_mem_gib = 0;      // per engine; 0: the preset's
  double session_mem_mib = -1;  // < 0: the preset's
  double retry_delay_s = 5;     // a killed tool call is run again this long after
  double tool_mem_scale = 1;    // multiplies every call's peak (on top of the session's mem_scale)
  // Which policies get tandemd's host-plane memory rules (sched/host_memory.h):
  // "none" (default: the policies are compared on their own), "tandem"
  // (tandem and its ablation variants) or "all".
  std::string host_rules = "none";
  sched::HostMemoryConfig host_rule_config;
};

struct ToolCallRecord {
  double nominal_s = 0;  // the trace's tool_seconds
  double wall_s = 0;     // what it took under contention
};

struct SimResult {
  std::vector<SessionRecord> sessions;  // in workload order
  RunCounters counters;
  std::vector<ToolCallRecord> tool_calls;  // in the order they ended
  std::uint64_t engine_steps = 0;
  std::uint64_t violations = 0;  // conservation or plan violations (must be 0)
  std::string first_violation;
  std::uint64_t rejected_events = 0;  // events the session table refused (must be 0)
  std::uint64_t actions = 0;
  double virtual_s = 0;
};

// Runs `workload` to completion under `config`. `ideal_s[i]` is session i's
// T_ideal (ideal_times()). Errors: an unknown policy or bad parameter
// (from the registry), an invalid preset, a stuck run (no progress for
// stall_s of virtual time; names the policy and what is still waiting).
base::Result<SimResult> simulate(const Workload& workload, const SimConfig& config, std::span<const double> ideal_s);

// T_ideal of every session: the session alone on the node — no queueing,
// its prefix always cached, tools at nominal time — computed directly from
// the step-time model with the engine's own chunking (a test checks it equals
// a one-session simulation).
std::vector<double> ideal_times(const Workload& workload, const SimConfig& config);

}  // namespace tandem::sim
