// Actions: the only way a policy changes the world (docs/architecture.md "Policies").
//
// A policy appends actions during tick(); the host (daemon or simulator)
// applies them in order. Each action is a small POD, so a tick's output is a
// comparable value: property tests check that the same input always yields
// the same actions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sched/types.h"

namespace tandem::sched {

enum class ActionKind : std::uint8_t {
  kAdmit,           // session: WAITING → REASONING
  kPause,           // session: → PAUSED (its next round waits; KV may be dropped)
  kRestore,         // session, engine: PAUSED → REASONING on `engine`
  kSetPriority,     // session, value = MLFQ level (0 = highest)
  kPin,             // session, value = deadline (ns, same clock as `now`)
  kUnpin,           // session
  kDrop,            // session: free its KV now
  kOffload,         // session: copy its KV to host memory
  kSetCpuWeight,    // session, value = cgroup v2 cpu.weight (1..10000)
  kSetCpuQuota,     // session, value = microseconds of CPU per 100 ms period (0 = unlimited)
  kSetSmPartition,  // engine, value = partition index
  kKillTools,       // session
};

struct Action {
  ActionKind kind;
  SessionId session = 0;
  EngineId engine = kNoEngine;
  std::int64_t value = 0;

  friend bool operator==(const Action&, const Action&) = default;
};

std::string to_string(const Action& a);

// Thread-safety: one thread (the policy's).
class Actions {
 public:
  void admit(SessionId s) { add({ActionKind::kAdmit, s}); }
  void pause(SessionId s) { add({ActionKind::kPause, s}); }
  void restore(SessionId s, EngineId e) { add({ActionKind::kRestore, s, e}); }
  void set_priority(SessionId s, std::uint8_t level) { add({ActionKind::kSetPriority, s, kNoEngine, level}); }
  void pin(SessionId s, Time until) { add({ActionKind::kPin, s, kNoEngine, base::to_ns(until)}); }
  void unpin(SessionId s) { add({ActionKind::kUnpin, s}); }
  void drop(SessionId s) { add({ActionKind::kDrop, s}); }
  void offload(SessionId s) { add({ActionKind::kOffload, s}); }
  void set_cpu_weight(SessionId s, std::uint32_t weight) { add({ActionKind::kSetCpuWeight, s, kNoEngine, weight}); }
  void set_cpu_quota(SessionId s, std::uint32_t us_per_100ms) {
    add({ActionKind::kSetCpuQuota, s, kNoEngine, us_per_100ms});
  }
  void set_sm_partition(EngineId e, std::uint32_t index) { add({ActionKind::kSetSmPartition, 0, e, index}); }
  void kill_tools(SessionId s) { add({ActionKind::kKillTools, s}); }

  // Appends an action built elsewhere (a wrapped policy's).
  void add_action(const Action& a) { add(a); }
  const std::vector<Action>& list() const { return list_; }
  bool empty() const { return list_.empty(); }
  void clear() { list_.clear(); }

 private:
  void add(Action a) { list_.push_back(a); }
  std::vector<Action> list_;
};

}  // namespace tandem::sched
