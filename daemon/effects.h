// HostEffects: the narrow interface through which a policy's CPU and GPU
// actions reach the host (CONVENTIONS.md "The daemon": side effects go through
// interfaces, tests substitute recorders).
//
// The CPU plane (cgroup weights, quotas, tool kills; issue 6) and the GPU
// plane (SM partitions; issue 9) implement it. Until they exist the daemon
// uses RecordingEffects: every call is kept, so tandemctl shows what the
// policy asked for, and nothing on the host changes.
#pragma once

#include <cstdint>
#include <map>

#include "sched/types.h"

namespace tandem::daemon {

// Thread-safety: called from the daemon's loop thread only.
class HostEffects {
 public:
  virtual ~HostEffects() = default;
  virtual void set_cpu_weight(sched::SessionId session, std::uint32_t weight) = 0;
  virtual void set_cpu_quota(sched::SessionId session, std::uint32_t us_per_100ms) = 0;
  virtual void kill_tools(sched::SessionId session) = 0;
  virtual void set_sm_partition(sched::EngineId engine, std::uint32_t index) = 0;
  // The session ended: forget what was set for it.
  virtual void session_gone(sched::SessionId session) = 0;
};

class RecordingEffects final : public HostEffects {
 public:
  struct SessionEffects {
    std::int64_t cpu_weight = -1;  // -1: never set
    std::int64_t cpu_quota = -1;
    std::uint64_t kills = 0;
  };

  void set_cpu_weight(sched::SessionId s, std::uint32_t weight) override { sessions_[s].cpu_weight = weight; }
  void set_cpu_quota(sched::SessionId s, std::uint32_t us) override { sessions_[s].cpu_quota = us; }
  void kill_tools(sched::SessionId s) override { ++sessions_[s].kills; }
  void set_sm_partition(sched::EngineId e, std::uint32_t index) override { partitions_[e] = index; }
  void session_gone(sched::SessionId s) override { sessions_.erase(s); }

  const SessionEffects* session(sched::SessionId s) const {
    auto it = sessions_.find(s);
    return it == sessions_.end() ? nullptr : &it->second;
  }
  const std::map<sched::EngineId, std::uint32_t>& partitions() const { return partitions_; }

 private:
  std::map<sched::SessionId, SessionEffects> sessions_;
  std::map<sched::EngineId, std::uint32_t> partitions_;
};

}  // namespace tandem::daemon
