// A simulated node: engines, tool cores and one policy, in virtual time
// (docs/sim.md). It hosts both halves of a sched/ policy unchanged: the
// control half sees every event through a NodeModel and ticks every
// `tick_s` (and at every session arrival, as MARS's controller runs at
// arrivals); each engine runs its own instance of the step half.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
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
  // Each tool call's start phase (docs/sim.md "Tools", the start phase):
  // CPU-seconds run at one full core before the call's body. Inside the
  // call's nominal time (a trace's tool time includes its exec), unless
  // tool_start_extra: then on top of it (the live replay's stand-in tool,
  // whose --wall-seconds excludes its own start). 0: none.
  double tool_start_s = 0;
  bool tool_start_extra = false;
  double stall_s = 3600;  // no round ends, tool ends or arrivals for this long (virtual): the run fails
  // Host memory for KV copies (offload, swap), per engine; the node's pool is
  // engines × this, shared. 0: unlimited. InferCept's experiments give each
  // GPU 128 GiB of swap space ([baselines] §3).
  double host_kv_gib = 128;
  // Host memory (docs/sim.md "Host memory"): off unless tool_mem is set.
  bool tool_mem = false;                     // tool calls and sessions hold memory
  ToolMemTable tool_mem_table;               // per-kind demand
  double host_mem_gib = 0;                   // per engine; 0: the preset's
  double session_mem_mib = -1;               // < 0: the preset's
  double retry_delay_s = 5;                  // a killed tool call is run again this long after
  double tool_mem_scale = 1;                 // multiplies every call's peak (on top of the session's mem_scale)
  double tool_mem_cap_mib = kToolMemCapMib;  // no call's peak above this, after the scales (0: no cap)
  // Which policies get tandemd's host-plane memory rules (sched/host_memory.h):
  // "none" (default: the policies are compared on their own), "tandem"
  // (tandem and its ablation variants) or "all".
  std::string host_rules = "none";
  sched::HostMemoryConfig host_rule_config;
  // The rules' budget, MiB (tandemd's [memory] tools_budget: the tools may
  // pass it, up to the host's capacity, and only the rules hold them back);
  // 0: the capacity less the sessions' baselines.
  double tools_budget_mib = 0;
  // The host's memory controller is cgroup v1 (docs/host.md "How long tools
  // waited"): the rules' throttle is a hard limit with the OOM killer off, so
  // a tool that outgrows it waits (speed 0, v1's under_oom) until the limit
  // lifts or the rules' stall kill takes it; PSI does not count the wait.
  // false: v2, whose memory.high slows the tool in reclaim.
  bool memory_v1 = false;
  // How often the host plane samples, in seconds: the host rules decide, and
  // the policy's host view (HostMemoryView) is refreshed, once a period
  // (tandemd: daemon/host_plane.h kHostPeriod, 250 ms). 0: every control
  // tick. The host itself (memory, OOM kills, stalls) moves every tick.
  double host_period_s = 0;
  // The window of PSI's avg10, seconds (the kernel's: 10). A compressed live
  // run sees the kernel's 10 s of wall time as C times that of trace time.
  double psi_window_s = 10;
};

struct ToolCallRecord {
  double nominal_s = 0;  // the trace's tool_seconds
  double wall_s = 0;     // what it took under contention (without a start phase on top: SimConfig::tool_start_extra)
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
  std::vector<std::uint32_t> first_node;  // a cluster's: the node of each session's first round
};

// Runs `workload` to completion under `config`. `ideal_s[i]` is session i's
// T_ideal (ideal_times()). Errors: an unknown policy or bad parameter
// (from the registry), an invalid preset, a stuck run (no progress for
// stall_s of virtual time; names the policy and what is still waiting).
base::Result<SimResult> simulate(const Workload& workload, const SimConfig& config, std::span<const double> ideal_s);

// Tokens of round `round`'s prompt equal to the session's previous context
// (0 for the first round and for a rewritten context: a prompt shorter than
// the previous one).
std::uint32_t shared_prefix(const SessionSpec& spec, std::size_t round);

// ---------------------------------------------------------------------------
// The steppable node, for a cluster of nodes in one virtual clock
// (sim/cluster.h, docs/sim.md "Multi-node"). simulate() runs the same node
// alone, fed the workload's arrivals.

// Virtual time starts at 1 s: sched/ reads Time{} as "never".
inline constexpr Time kSimEpoch = Time(std::chrono::seconds(1));

// What a cluster router reads of a node.
struct NodeLoad {
  std::uint32_t waiting = 0;    // requests queued in the engines (vLLM's num_requests_waiting)
  std::uint32_t running = 0;    // requests running in the engines
  std::uint32_t held = 0;       // rounds ready but held by the node's policy (not admitted, paused), or just moved in
  double kv_usage = 0;          // 1 - free / total GPU blocks over the engines (vLLM's kv_cache_usage_perc:
                                // cached-but-free blocks count as free)
  double cpu_pressure = 0;      // the tool cores' CPU PSI some avg10, in [0, 1] (what the control half reads)
  std::uint64_t kv_blocks = 0;  // GPU KV blocks of the node
};

// A session handed to a node: a new one a router placed there, or one it
// moved from another node (a full prefill there: its KV stayed behind).
struct SessionHandoff {
  const SessionSpec* spec = nullptr;
  std::size_t index = 0;            // in the cluster's workload
  double ideal_s = 0;               // T_ideal
  Time arrival{};                   // the session's arrival, where its E2E starts
  std::size_t round = 0;            // the round to run next
  std::uint32_t computed_high = 0;  // tokens of its content computed before, anywhere (again: recomputed)
  std::uint32_t tool_call = 0;      // tool calls so far
  std::vector<double> ttft_s;       // its rounds' TTFTs so far
  std::size_t target = 0;           // the node a router moved it to
};

// A cluster's router, asked by a node whenever a session's next round is
// ready there (its tool ended). It answers the node for that round.
class RoundRouter {
 public:
  virtual ~RoundRouter() = default;
  virtual std::size_t route_round(std::size_t node, std::size_t index, SessionId session, std::size_t round,
                                  Time now) = 0;
};

namespace detail {
class Node;
}

class NodeSim {
 public:
  // Node `node_index` of a cluster; `router` (may be nullptr: the node keeps
  // every session) routes rounds after tools. `config` must outlive it.
  NodeSim(const SimConfig& config, std::size_t node_index, RoundRouter* router);
  ~NodeSim();
  NodeSim(NodeSim&&) noexcept;
  NodeSim& operator=(NodeSim&&) noexcept;

  // Validates the config and builds the engines and the policy (its errors).
  base::Result<void> start();
  // The next instant anything happens here (at least the next control tick).
  Time next_event() const;
  // Runs every event up to and including `t`. Fails as simulate() does on a
  // node that makes no progress with sessions on it.
  base::Result<void> advance_to(Time t);
  // A session arrives now (processed by the next advance_to(now)).
  void accept(SessionHandoff session, Time now);
  // Sessions the router moved away since the last call (their KV here is released).
  std::vector<SessionHandoff> take_moved();
  // Sessions finished since the last call, by workload index.
  std::vector<std::pair<std::size_t, SessionRecord>> take_finished();
  NodeLoad load() const;
  // Prompt tokens of the session's next round its pinned or offloaded KV here
  // would serve (tandem's residency, which the engine's cache may have lost);
  // 0 when it has neither here.
  std::uint32_t tandem_hit(SessionId session) const;
  bool has(SessionId session) const;  // live here
  std::size_t live() const;           // sessions here, not finished or moved away
  std::uint64_t moved_out() const;
  // End of the run: counters, conservation (SimResult without sessions; the
  // cluster has taken them).
  SimResult finish();

 private:
  std::unique_ptr<detail::Node> impl_;
};

// T_ideal of every session: the session alone on the node — no queueing,
// its prefix always cached, tools at nominal time — computed directly from
// the step-time model with the engine's own chunking (a test checks it equals
// a one-session simulation).
std::vector<double> ideal_times(const Workload& workload, const SimConfig& config);

}  // namespace tandem::sim
