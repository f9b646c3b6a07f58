// NodeModel: one place where events update sessions and telemetry together.
#include "sched/model.h"

#include <algorithm>
#include <type_traits>

namespace tandem::sched {

const EngineView* NodeModel::engine(EngineId id) const {
  auto it = engines_.find(id);
  return it == engines_.end() ? nullptr : &it->second;
}

bool NodeModel::observe(const Event& event, Time now) {
  // Telemetry first, from the event alone; the queued-demand bookkeeping reads
  // the session as it was before the event.
  std::visit(
      [&](const auto& e) {
        using E = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<E, EngineJoined>) {
          EngineView& v = engines_[e.engine];
          v.id = e.engine;
          v.params = e.params;
        } else if constexpr (std::is_same_v<E, EngineLeft>) {
          engines_.erase(e.engine);
        } else if constexpr (std::is_same_v<E, KvStatsReported>) {
          auto it = engines_.find(e.engine);
          if (it != engines_.end()) {
            it->second.kv = e.stats;
            it->second.has_stats = true;
            it->second.stats_at = now;
          }
        } else if constexpr (std::is_same_v<E, RoundSubmitted>) {
          const Session* s = sessions_.find(e.session);
          bool accepted = s == nullptr || (!s->round_in_flight && s->state != SessionState::kDone);
          auto it = engines_.find(e.engine);
          if (accepted && it != engines_.end()) it->second.queued_blocks += e.projected_blocks;
        } else if constexpr (std::is_same_v<E, RoundEnded> || std::is_same_v<E, SessionClosed>) {
          // A round's projected KV leaves the queue when it ends, or when its
          // session closes with the round still in flight.
          const Session* s = sessions_.find(e.session);
          bool ends_round = true;
          if constexpr (std::is_same_v<E, RoundEnded>) ends_round = s != nullptr && s->round == e.round;
          if (s != nullptr && s->round_in_flight && ends_round) {
            auto it = engines_.find(s->engine);
            if (it != engines_.end()) {
              it->second.queued_blocks -= std::min<std::uint64_t>(it->second.queued_blocks, s->projected_blocks);
            }
          }
        } else if constexpr (std::is_same_v<E, ToolStarted>) {
          ++cpu_.active_tools;
        } else if constexpr (std::is_same_v<E, ToolEnded>) {
          if (cpu_.active_tools > 0) --cpu_.active_tools;
          tools_.observe(e.kind, e.wall);
          ToolKindStats& t = tool_stats_[e.kind];
          ++t.calls;
          t.wall += e.wall;
          t.cpu += e.cpu;
          if (e.exit_code != 0) ++t.failures;
        }
      },
      event);
  return sessions_.apply(event, now);
}

}  // namespace tandem::sched
