// NodeModel: what policies see of the node — sessions, each engine's KV pool,
// the host CPU, and the tool-duration model.
//
// The host owns one NodeModel, feeds every event to observe() (which updates
// the session table and the telemetry together), and sets the CPU readings it
// samples (PSI, run-queue delay) with set_cpu(). Policies get it read-only.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "base/id_map.h"
#include "sched/session_table.h"
#include "sched/tool_model.h"
#include "sched/types.h"

namespace tandem::sched {

// The daemon's mirror of one engine's KV pool (docs/architecture.md "GPU plane").
struct EngineView {
  EngineId id = kNoEngine;
  EngineParams params;
  KvPoolStats kv;  // as last reported
  bool has_stats = false;
  Time stats_at{};
  // KV that submitted rounds still have to allocate: each round's projected
  // blocks minus its prefix hit at submit, from its submit until its prefill
  // is done (first token), it ends, or its session closes. A running
  // round's blocks are in kv (allocated) from then on, never in both.
  std::uint64_t queued_blocks = 0;
  // Prompt tokens of every round submitted, and of those the prefix the
  // engine served from its cache (vLLM's prefix-cache queries and hits).
  std::uint64_t prompt_tokens_total = 0;
  std::uint64_t cached_tokens_total = 0;

  // Fraction of the pool in use (0 when unknown).
  double usage() const {
    std::uint32_t total = has_stats ? kv.blocks_total : params.total_blocks;
    if (total == 0 || !has_stats) return 0.0;
    return 1.0 - static_cast<double>(kv.blocks_free) / static_cast<double>(total);
  }
};

struct CpuView {
  std::uint32_t tool_cores = 0;    // cores available to tools (0 = unknown)
  std::uint32_t active_tools = 0;  // tool calls started and not ended
  double psi_some_avg10 = -1.0;    // cpu.pressure "some avg10" of the tools subtree, -1 = unknown
  Duration runq_delay_p50{};       // from eBPF, zero = unknown
};

// The host's memory as the host plane samples it (docs/host.md "Memory").
// capacity_bytes 0: unknown, and policies must not gate on it.
struct HostMemoryView {
  std::uint64_t capacity_bytes = 0;          // memory agents and tools may use on the node
  std::uint64_t used_bytes = 0;              // what they use now (session baselines + tools)
  std::uint64_t session_baseline_bytes = 0;  // what one admitted session holds between tools
  std::uint64_t tool_peak_p95_bytes = 0;     // 95th percentile of recent tool calls' peaks (0 = none seen)
  double psi_some_avg10 = -1.0;              // memory.pressure "some avg10" (%), -1 = unknown
  std::uint64_t kills = 0;                   // tool calls killed for memory so far (OOM and the host rule)
};

// Thread-safety: one thread.
class NodeModel {
 public:
  explicit NodeModel(ToolModelParams tool_params = {}) : tools_(tool_params) {}

  // Applies an event to sessions and telemetry. Returns false if the session
  // table rejected it (telemetry that does not depend on the session, such
  // as KV stats, is still taken).
  bool observe(const Event& e, Time now);

  void set_cpu(const CpuView& cpu) {
    std::uint32_t active = cpu_.active_tools;
    cpu_ = cpu;
    cpu_.active_tools = active;  // maintained from events, not sampled
  }

  void set_host_memory(const HostMemoryView& memory) { memory_ = memory; }

  // Engine `engine` is gone: its view leaves (as EngineLeft does) and every
  // round in flight on it is aborted (SessionTable::abort_round). Returns the
  // sessions whose round was aborted.
  std::vector<SessionId> engine_gone(EngineId engine, Time now);

  SessionTable& sessions() { return sessions_; }
  const SessionTable& sessions() const { return sessions_; }
  const std::map<EngineId, EngineView>& engines() const { return engines_; }
  const EngineView* engine(EngineId id) const;
  const CpuView& cpu() const { return cpu_; }
  const HostMemoryView& host_memory() const { return memory_; }
  const ToolDurationModel& tools() const { return tools_; }

 private:
  SessionTable sessions_;
  std::map<EngineId, EngineView> engines_;
  CpuView cpu_;
  HostMemoryView memory_;
  ToolDurationModel tools_;
  struct QueuedRound {
    EngineId engine = kNoEngine;
    std::uint32_t round = 0;
    std::uint64_t blocks = 0;
  };
  base::IdMap<QueuedRound> queued_;  // rounds counted in an engine's queued_blocks (never walked)
  void unqueue(SessionId s);
};

}  // namespace tandem::sched
