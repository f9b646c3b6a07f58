// HostMemoryRule: the host plane's memory rules as a pure function
// (docs/host.md "Memory", docs/sched.md "Host memory rules").
//
// Degrade before killing. Given the node's memory pressure (PSI some avg10)
// and the tools' memory against a budget, the rule sets a level — normal,
// high or critical — with hysteresis, and answers for every tool call:
//   - throttle: at "high" or above, hold every call of an unprotected session
//     at its present size (memory.high = its memory + 16 MiB, never above a
//     limit the call was given);
//   - freeze: at "critical", also freeze the calls of low-priority sessions
//     (priority class ≥ 2, or a call flagged low_priority);
//   - kill: a call stalled at its memory limit for `stall_kill_after` is
//     killed (the daemon reports kKilledMemory).
// Recovery: once pressure is calm (below half of pressure_high, the tools
// below 80 % of the budget), or on headroom alone — the tools below 80 % of
// the mark (the budget, or what they held when pressure raised the level).
// The throttle's own stall counts as memory pressure, so pressure alone
// would keep the throttle on; and after a recovery on headroom, pressure
// raises the level again only once it has been calm or rises again.
// Sessions whose KV is pinned are protected: never throttled or frozen (their
// tool is on the critical path of KV the GPU is holding).
//
// tandemd's host plane (daemon/host_plane.h) feeds it from cgroup files and
// applies its verdicts to cgroups; tandem-sim (sim/host_memory.h) feeds it
// from its model of the host and applies the verdicts there. Both call the
// same object, so the simulator runs the daemon's rules.
//
// Pure: no syscalls, no clock reads. Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "sched/types.h"

namespace tandem::sched {

struct HostMemoryConfig {
  double pressure_high = 10.0;      // memory PSI some avg10 (%) from which tools are throttled
  double pressure_critical = 40.0;  // ... from which low-priority tools are frozen
  std::uint64_t tools_budget = 0;   // bytes all tools may use (0 = none); 90 % counts as high, 100 % critical
  Duration stall_kill_after = std::chrono::seconds(10);  // a call stalled at its limit this long is killed
};

// How often tandemd's host plane samples the tools' memory and runs this
// rule (daemon/host_plane.h; the policy tick may be faster, but reading every
// tool's files at 20 Hz would cost more than the rest of the daemon). The
// simulator's SimConfig::host_period_s models it.
inline constexpr Duration kHostMemoryPeriod = std::chrono::milliseconds(250);

enum class MemoryLevel : std::uint8_t { kNormal, kHigh, kCritical };

// One tool call as the host sees it. `stalled_since` is the rule's memory of
// the call: the caller keeps it with the call and hands it back every time.
struct MemoryCall {
  SessionId session = 0;
  std::uint32_t call = 0;
  bool sampled = true;             // its usage was read this period (else no stall tracking)
  std::uint64_t memory_bytes = 0;  // at the last sample
  std::uint64_t limit_high = 0;    // memory.high it was given (0 = none)
  bool stalled = false;            // stalled at its memory limit now
  bool ended = false;              // its tool ended (leftovers may still run)
  bool low_priority = false;
  bool frozen = false;  // frozen now
  std::uint8_t priority_class = 0;
  bool protected_session = false;  // the session's KV is pinned
  std::optional<Time> stalled_since;
};

struct MemoryVerdict {
  bool kill = false;      // kill it now (stalled too long)
  bool throttle = false;  // memory.high held at `hold_bytes` (else its own limits)
  bool freeze = false;
  std::uint64_t hold_bytes = 0;
};

class HostMemoryRule {
 public:
  explicit HostMemoryRule(const HostMemoryConfig& config) : config_(config) {}

  // Decides for every call at `now`; out[i] answers calls[i] (resized).
  // `tools_bytes` is the tools' memory (the daemon sums the calls it could
  // read). Updates every call's stalled_since. A killed call is treated as
  // thawed (the killer thaws it first). Returns the level.
  MemoryLevel decide(Time now, double psi_some_avg10, std::uint64_t tools_bytes, std::span<MemoryCall> calls,
                     std::vector<MemoryVerdict>& out);

  MemoryLevel level() const { return level_; }
  // The simulator's budget follows the sessions' baselines.
  void set_tools_budget(std::uint64_t bytes) { config_.tools_budget = bytes; }
  const HostMemoryConfig& config() const { return config_; }

  // The extra room a throttled call keeps above its present size, so that it
  // can finish what it is doing.
  static constexpr std::uint64_t kThrottleSlack = 16ull << 20;

 private:
  HostMemoryConfig config_;
  MemoryLevel level_ = MemoryLevel::kNormal;
  std::uint64_t mark_ = 0;  // the tools' memory against which headroom ends a degraded level
  bool armed_ = true;       // pressure may raise the level (not while the throttle's own stall decays)
  double psi_low_ = 0;      // the lowest pressure since the last recovery, while not armed
};

}  // namespace tandem::sched
