// The host plane's memory rules (sched/host_memory.h).
#include "sched/host_memory.h"

#include <algorithm>

namespace tandem::sched {

MemoryLevel HostMemoryRule::decide(Time now, double psi, std::uint64_t used, std::span<MemoryCall> calls,
                                   std::vector<MemoryVerdict>& out) {
  out.assign(calls.size(), MemoryVerdict{});
  // Stalls: a call stalled at its limit (and not frozen) for stall_kill_after
  // is killed; the clock starts over after the kill.
  for (std::size_t i = 0; i < calls.size(); ++i) {
    MemoryCall& c = calls[i];
    if (!c.sampled) continue;
    if (c.stalled && !c.frozen) {
      if (!c.stalled_since) c.stalled_since = now;
      if (now - *c.stalled_since >= config_.stall_kill_after && !c.ended) {
        out[i].kill = true;
        c.frozen = false;  // the killer thaws it first
        c.stalled_since.reset();
      }
    } else {
      c.stalled_since.reset();
    }
  }

  const std::uint64_t budget = config_.tools_budget;
  MemoryLevel level = MemoryLevel::kNormal;
  if (psi >= config_.pressure_high) level = MemoryLevel::kHigh;
  if (psi >= config_.pressure_critical) level = MemoryLevel::kCritical;
  if (budget != 0) {
    if (used >= budget) {
      level = MemoryLevel::kCritical;
    } else if (used * 10 >= budget * 9 && level == MemoryLevel::kNormal) {
      level = MemoryLevel::kHigh;
    }
  }
  // Hysteresis: stay degraded until pressure falls below half of "high" (and
  // the tools below 80 % of the budget).
  if (level == MemoryLevel::kNormal && level_ != MemoryLevel::kNormal) {
    const bool calm = psi < config_.pressure_high / 2 && (budget == 0 || used * 10 < budget * 8);
    if (!calm) level = MemoryLevel::kHigh;
  }
  level_ = level;

  for (std::size_t i = 0; i < calls.size(); ++i) {
    const MemoryCall& c = calls[i];
    MemoryVerdict& v = out[i];
    if (c.ended) continue;
    const bool exempt = c.protected_session;
    v.throttle = !exempt && level != MemoryLevel::kNormal;
    v.freeze = !exempt && level == MemoryLevel::kCritical && (c.low_priority || c.priority_class >= 2);
    if (v.throttle) {
      const std::uint64_t hold = c.memory_bytes + kThrottleSlack;
      v.hold_bytes = c.limit_high != 0 ? std::min(hold, c.limit_high) : hold;
    }
  }
  return level;
}

}  // namespace tandem::sched
