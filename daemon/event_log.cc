#include "daemon/event_log.h"

#include <fmt/format.h>

namespace tandem::daemon {
namespace {

// The index of the next slot of a ring that grows to EventLog::kSize and
// then overwrites its oldest, at `head`.
template <class T>
std::size_t next_slot(std::vector<T>& ring, std::size_t& head) {
  if (ring.size() < EventLog::kSize) {
    ring.emplace_back();
    return ring.size() - 1;
  }
  const std::size_t slot = head;
  head = (head + 1) % EventLog::kSize;
  return slot;
}

}  // namespace

void EventLog::add(base::Time now, Kind kind, sched::SessionId session, std::array<std::int64_t, 4> v,
                   std::string_view name) {
  Entry* e = &ring_[next_slot(ring_, head_)];
  e->seq = next_++;
  e->t = base::to_seconds(now - origin_);
  e->session = session;
  e->v = v;
  e->kind = kind;
  e->name_slot = kNoName;
  if (name.empty()) return;
  const std::size_t slot = next_slot(names_, names_head_);
  names_[slot].assign(name);
  e->name_slot = static_cast<std::uint16_t>(slot);
}

std::uint64_t EventLog::lost_after(std::uint64_t since) const {
  const std::uint64_t oldest = ring_.empty() ? next_ : at(0).seq;
  return since + 1 < oldest ? oldest - since - 1 : 0;
}

std::pair<std::string_view, std::string> EventLog::describe(const Entry& e) {
  using L = Kind;
  const auto& v = e.v;
  switch (e.kind) {
    case L::kSessionOpen:
      return {"session_open", ""};
    case L::kSessionTakeover:
      return {"session_open", "by its runner, after its engine's first round"};
    case L::kSessionClose:
      return {"session_close", ""};
    case L::kRoundSubmit:
      return {"round_submit",
              fmt::format("round {} on engine {}: {} prompt tokens, {} cached", v[0], v[1], v[2], v[3])};
    case L::kRoundEnd:
      return {"round_end", fmt::format("round {}: {} output tokens{}", v[0], v[1], v[2] ? ", a tool follows" : "")};
    case L::kToolStart:
      return {"tool_start", fmt::format("call {}", v[0])};
    case L::kToolEnd:
      return {"tool_end", fmt::format("call {}: exit {} after {:.3f} s", v[0], v[1], static_cast<double>(v[2]) * 1e-9)};
    case L::kKv: {
      static constexpr const char* kKinds[] = {"evicted", "restored", "offloaded", "dropped"};
      return {"kv", fmt::format("{} {} blocks", kKinds[static_cast<std::size_t>(v[0]) % 4], v[1])};
    }
    case L::kAdmit:
      return {"admit", fmt::format("on engine {}", v[0])};
    case L::kPause:
      return {"pause", ""};
    case L::kRestore:
      return {"restore", fmt::format("onto engine {}", v[0])};
    case L::kPin:
      return {"pin", fmt::format("for {:.3f} s", static_cast<double>(v[0]) * 1e-9)};
    case L::kUnpin:
      return {"unpin", ""};
    case L::kDrop:
      return {"drop", ""};
    case L::kOffload:
      return {"offload", ""};
    case L::kKillTools:
      return {"kill_tools", "by the policy"};
    case L::kDrain:
      return {"drain", "by an operator"};
    case L::kUndrain:
      return {"undrain", "by an operator"};
    case L::kEvict:
      return {"evict", "by an operator"};
    case L::kKill:
      return {"kill", "by an operator"};
    case L::kSmPartition:
      return {"sm_partition",
              fmt::format("engine {}: partition {} ({} decode SMs) for SM_dec {}", v[0], v[1], v[2], v[3])};
    case L::kOffloadPlan:
      return {"offload_plan", fmt::format("engine {}: modules {:#x}, {} bytes freed, at pressure {:.3f}", v[0],
                                          static_cast<std::uint64_t>(v[1]), v[2], static_cast<double>(v[3]) / 1000.0)};
  }
  return {"?", ""};
}

}  // namespace tandem::daemon
