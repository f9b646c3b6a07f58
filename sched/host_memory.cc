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
  const double calm_psi = config_.pressure_high / 2;
  // Recovery. The kernel counts the time a task sleeps in memory.high's
  // penalty as a memory stall, so while the rule throttles, PSI is partly its
  // own doing and cannot say when to stop. Besides calm pressure (as before),
  // headroom ends a degraded level: the tools below 80 % of the mark, which
  // is the budget, or, when pressure raised the level, what the tools held
  // then (never above the budget). With nothing held then, only calm
  // pressure recovers.
  if (level_ != MemoryLevel::kNormal) {
    const bool calm = psi < calm_psi && (budget == 0 || used * 10 < budget * 8);
    const bool headroom = used * 10 < mark_ * 8;
    if (calm || headroom) {
      level_ = MemoryLevel::kNormal;
      // The throttle's own stall decays out of PSI over ~10 s: pressure may
      // raise the level again once it was calm, or once it rises again (a
      // new stall, not the throttle's), not while it merely decays.
      armed_ = psi < calm_psi;
      psi_low_ = psi;
    }
  }
  if (!armed_) {
    psi_low_ = std::min(psi_low_, psi);
    if (psi < calm_psi || psi >= psi_low_ + calm_psi) armed_ = true;
  }
  const bool degraded = level_ != MemoryLevel::kNormal;
  MemoryLevel level = MemoryLevel::kNormal;
  if (armed_ || degraded) {
    if (psi >= config_.pressure_high) level = MemoryLevel::kHigh;
    if (psi >= config_.pressure_critical) level = MemoryLevel::kCritical;
  }
  bool by_budget = false;
  if (budget != 0) {
    if (used >= budget) {
      level = MemoryLevel::kCritical;
      by_budget = true;
    } else if (used * 10 >= budget * 9) {
      if (level == MemoryLevel::kNormal) level = MemoryLevel::kHigh;
      by_budget = true;
    }
  }
  if (degraded) {
    // Not recovered: at least "high" until headroom or calm says otherwise.
    level = std::max(level, MemoryLevel::kHigh);
  } else if (level != MemoryLevel::kNormal) {
    // Entering: the mark is the budget if it raised the level, else what the
    // tools hold now (never above the budget).
    mark_ = by_budget ? budget : (budget != 0 ? std::min(budget, used) : used);
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
