// Metrics of one simulated run (issue 4, "Metrics, per policy and load
// point"), computed from per-session records and run-wide counters.
//
// Definitions (docs/sim.md repeats them):
//   E2E            session arrival → end of its last round, seconds
//   slowdown       E2E / T_ideal, T_ideal = the same session alone on the node
//   goodput_aN     sessions with E2E ≤ N · T_ideal (MARS's dynamic SLO), per
//                  second of makespan (first arrival → last finish)
//   throughput     completed sessions per second of makespan; rounds per
//                  minute; computed tokens (new + recomputed) per second
//   TTFT           per round: the round's submission (session arrival or tool
//                  end) → its first output token, admission wait included
//   kv_hit_rate    prompt tokens served from cache (GPU prefix cache or a host
//                  copy) / prompt tokens of every round (vLLM's prefix-cache
//                  hit rate)
//   recomputed     tokens computed again after their KV was lost (preemption,
//                  eviction, drop)
//   gpu_busy       time engines spent in steps / (engines · makespan)
//   tool_cpu_util  core-seconds tools used / (tool cores · makespan)
//   tool_stretch   per tool call, actual wall / nominal wall; mean
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/stats.h"

namespace tandem::sim {

struct SessionRecord {
  double arrival_s = 0.0;
  double finish_s = 0.0;  // end of the last round
  double ideal_s = 0.0;   // T_ideal (> 0)
  std::uint32_t rounds = 0;
  std::vector<double> ttft_s;  // one per round
};

struct RunCounters {
  std::uint64_t prompt_tokens = 0;      // Σ prompt tokens over rounds
  std::uint64_t reused_tokens = 0;      // of those, served from cache
  std::uint64_t new_tokens = 0;         // computed for the first time
  std::uint64_t recomputed_tokens = 0;  // computed again
  std::uint64_t computed_tokens = 0;    // Σ chunk tokens of every step (= new + recomputed)
  std::uint64_t preemptions = 0;
  std::uint64_t swaps = 0;                     // of those, by swapping to host memory
  std::uint64_t resume_recomputed_tokens = 0;  // recomputed by rounds never preempted: KV lost while a tool ran
  double kv_waste_block_seconds = 0.0;         // blocks held by a batch while it recomputed or copied KV
  std::uint64_t host_peak_blocks = 0;          // most KV blocks in host memory at once
  double pinned_block_seconds = 0.0;
  double gpu_busy_s = 0.0;  // Σ over engines of step time
  std::uint32_t engines = 1;
  double tool_cpu_core_s = 0.0;  // core-seconds tools consumed
  std::uint32_t tool_cores = 1;
  std::uint64_t tool_calls = 0;
  double tool_stretch_sum = 0.0;  // Σ actual / nominal over tool calls with nominal > 0
  std::uint64_t tool_stretch_calls = 0;
  std::uint64_t capped_rounds = 0;
  // Host memory (only when modelled).
  bool host_memory = false;
  std::uint64_t oom_kills = 0;  // tool calls the kernel OOM-killed
  // Of those, by the victim's drawn peak: above the node's whole capacity
  // (killed whatever else runs), or above what the admitted sessions'
  // baselines left of it; the rest overflowed with the other tools.
  std::uint64_t oom_kills_over_host = 0;
  std::uint64_t oom_kills_over_room = 0;
  std::uint64_t memory_kills = 0;  // tool calls the host rule killed (stalled at their limit)
  double rerun_tool_s = 0;         // nominal tool seconds lost to kills and run again
  double frozen_s = 0;             // Σ over tool calls of time frozen
  double throttled_s = 0;          // Σ over tool calls of time stalled on memory (throttle or reclaim)
  double stranded_block_s = 0;     // pinned KV block-seconds of sessions whose tool was frozen or stalled
  double host_mem_peak_bytes = 0;  // most host memory in use at once
  double mem_psi_some_s = 0;       // time some tool stalled on memory
  double mem_psi_full_s = 0;       // time every running tool did
  std::uint64_t throttles = 0;     // tool calls the host rule throttled
  std::uint64_t freezes = 0;       // tool calls it froze
  // A cluster (sim/cluster.h; only then reported).
  std::uint32_t nodes = 0;           // 0: a node alone
  std::uint64_t moved_sessions = 0;  // sessions a router moved at least once
  std::uint64_t session_moves = 0;   // moves (a session may move more than once)
};

struct Metrics {
  std::size_t sessions = 0;  // completed
  double e2e_mean_s = 0, e2e_p50_s = 0, e2e_p90_s = 0, e2e_p99_s = 0;
  double slowdown_mean = 0;
  double goodput_a1 = 0, goodput_a2 = 0, goodput_a3 = 0;  // sessions / s
  double throughput_sps = 0;
  double rounds_per_min = 0;
  double tokens_per_s = 0;  // tokens the engines computed (new + recomputed) per second of makespan
  double ttft_mean_s = 0, ttft_p99_s = 0;
  double kv_hit_rate = 0;
  std::uint64_t recomputed_tokens = 0;
  std::uint64_t resume_recomputed_tokens = 0;
  std::uint64_t preemptions = 0;
  std::uint64_t swaps = 0;
  double pinned_block_seconds = 0;
  double kv_waste_block_s = 0;  // pinned block-seconds + blocks waiting on recompute or copies (InferCept's waste)
  std::uint64_t host_peak_blocks = 0;
  double gpu_busy = 0;
  double tool_cpu_util = 0;
  double tool_stretch_mean = 0;
  double makespan_s = 0;
  std::uint64_t capped_rounds = 0;
  // Host memory (JSON, CSV and the table carry these only when modelled).
  bool host_memory = false;
  std::uint64_t oom_kills = 0;
  std::uint64_t oom_kills_over_host = 0;
  std::uint64_t oom_kills_over_room = 0;
  std::uint64_t memory_kills = 0;
  double rerun_tool_s = 0;
  double frozen_s = 0;
  double throttled_s = 0;
  double stranded_block_s = 0;
  double host_mem_peak_gib = 0;
  double mem_psi_some_pct = 0;  // share of the makespan some tool stalled on memory (%)
  double mem_psi_full_pct = 0;
  // A cluster (JSON, CSV and tables carry these only for one).
  std::uint32_t nodes = 0;  // 0: a node alone
  std::uint64_t moved_sessions = 0;
  std::uint64_t session_moves = 0;
};

// Linear-interpolated percentile (p in [0, 100]) of `values`: base/stats.h.
using base::percentile;

// Metrics of a run. Sessions with finish < arrival or ideal ≤ 0 are a caller
// bug (asserted in debug builds); an empty span gives all-zero metrics.
Metrics compute_metrics(std::span<const SessionRecord> sessions, const RunCounters& counters);

}  // namespace tandem::sim
