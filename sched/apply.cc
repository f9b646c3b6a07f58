// One interpreter of actions, for tandemd and tandem-sim (sched/apply.h).
#include "sched/apply.h"

namespace tandem::sched {

void apply(const Action& a, SessionTable& table, ActionSink& sink, Time now) {
  using K = ActionKind;
  if (a.kind == K::kSetSmPartition) {
    sink.sm_partition(a.engine, a.value, now);
    return;
  }
  const Session* s = table.find(a.session);
  if (s == nullptr || s->state == SessionState::kDone) return;
  switch (a.kind) {
    case K::kAdmit:
      if (sink.may_admit() && table.transition(a.session, SessionState::kReasoning, now)) sink.admitted(*s, now);
      break;
    case K::kPause:
      if (table.transition(a.session, SessionState::kPaused, now)) sink.paused(*s, now);
      break;
    case K::kRestore: {
      const EngineId from = s->engine;
      if (table.transition(a.session, SessionState::kReasoning, now, a.engine)) sink.restored(*s, from, now);
      break;
    }
    case K::kSetPriority:
      sink.priority(*s, a.value, now);
      break;
    case K::kPin:
      sink.pinned(*s, base::from_ns(a.value), now);
      table.set_pinned(a.session, true);  // the host plane protects pinned sessions' tools
      break;
    case K::kUnpin:
      sink.unpinned(*s, now);
      table.set_pinned(a.session, false);
      break;
    case K::kDrop:
      sink.dropped(*s, now);
      break;
    case K::kOffload:
      sink.offloaded(*s, now);
      break;
    case K::kSetCpuWeight:
      sink.cpu_weight(*s, a.value, now);
      break;
    case K::kSetCpuQuota:
      sink.cpu_quota(*s, a.value, now);
      break;
    case K::kKillTools:
      sink.kill_tools(*s, now);
      break;
    case K::kSetSmPartition:
      break;
  }
}

}  // namespace tandem::sched
