// Human-readable actions, for logs, tandemctl and test failure messages.
#include "sched/actions.h"

#include <fmt/format.h>

namespace tandem::sched {

std::string to_string(const Action& a) {
  switch (a.kind) {
    case ActionKind::kAdmit:
      return fmt::format("admit {:#x}", a.session);
    case ActionKind::kPause:
      return fmt::format("pause {:#x}", a.session);
    case ActionKind::kRestore:
      return fmt::format("restore {:#x} on engine {}", a.session, a.engine);
    case ActionKind::kSetPriority:
      return fmt::format("priority {:#x} = {}", a.session, a.value);
    case ActionKind::kPin:
      return fmt::format("pin {:#x} until {} ns", a.session, a.value);
    case ActionKind::kUnpin:
      return fmt::format("unpin {:#x}", a.session);
    case ActionKind::kDrop:
      return fmt::format("drop {:#x}", a.session);
    case ActionKind::kOffload:
      return fmt::format("offload {:#x}", a.session);
    case ActionKind::kSetCpuWeight:
      return fmt::format("cpu.weight {:#x} = {}", a.session, a.value);
    case ActionKind::kSetCpuQuota:
      return fmt::format("cpu quota {:#x} = {} us/100ms", a.session, a.value);
    case ActionKind::kSetSmPartition:
      return fmt::format("sm partition engine {} = {}", a.engine, a.value);
    case ActionKind::kKillTools:
      return fmt::format("kill tools {:#x}", a.session);
  }
  return "?";
}

}  // namespace tandem::sched
