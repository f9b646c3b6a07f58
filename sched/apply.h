// What an Action means, in one place (docs/architecture.md "Policies"): the
// session-table transition it makes, then the effect its host carries out.
// tandemd (daemon/control.cc: directives, cgroups, its event log) and
// tandem-sim (sim/node.cc: its engine and CPU models) implement ActionSink
// and apply a tick's actions through apply(), so the two agree by
// construction on which actions take effect and in what state.
#pragma once

#include <cstdint>

#include "sched/actions.h"
#include "sched/session_table.h"
#include "sched/types.h"

namespace tandem::sched {

// The effects of actions on one host. Each is called after the table's
// transition (or, where the action makes none, with the session as it is;
// pinned and unpinned come before the table's pinned mark changes), and only
// for a live session (never one that is DONE or unknown). Thread-safety: the
// policy's thread.
class ActionSink {
 public:
  virtual ~ActionSink() = default;
  // Whether a WAITING session may be admitted now (tandemd: not while an
  // operator drains it). Paused sessions are restored regardless.
  virtual bool may_admit() const { return true; }
  // WAITING → REASONING on `s.engine`.
  virtual void admitted(const Session& s, Time now) = 0;
  // → PAUSED; `s.engine` still names the engine that held it.
  virtual void paused(const Session& s, Time now) = 0;
  // PAUSED → REASONING on `s.engine`, which was `from` before.
  virtual void restored(const Session& s, EngineId from, Time now) = 0;
  // The policy's MLFQ level, as the policy gave it (each host clamps it to
  // what it can carry).
  virtual void priority(const Session& s, std::int64_t level, Time now) = 0;
  // Keep its KV until `until` (the table marks it pinned after this call).
  virtual void pinned(const Session& s, Time until, Time now) = 0;
  // Its KV may go (the table marks it unpinned after this call).
  virtual void unpinned(const Session& s, Time now) = 0;
  virtual void dropped(const Session& s, Time now) = 0;
  virtual void offloaded(const Session& s, Time now) = 0;
  virtual void cpu_weight(const Session& s, std::int64_t weight, Time now) = 0;
  virtual void cpu_quota(const Session& s, std::int64_t us_per_100ms, Time now) = 0;
  virtual void kill_tools(const Session& s, Time now) = 0;
  // An engine's SM partition (no session).
  virtual void sm_partition(EngineId engine, std::int64_t index, Time now) = 0;
};

// Applies `a`: its transition in `table` (refused transitions do nothing),
// its pinned mark, and its effect on `sink`. An action for a session the
// table does not hold, or holds as DONE, does nothing.
void apply(const Action& a, SessionTable& table, ActionSink& sink, Time now);

}  // namespace tandem::sched
