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
          if (accepted && it != engines_.end()) {
            it->second.prompt_tokens_total += e.prompt_tokens;
            it->second.cached_tokens_total += std::min(e.cached_tokens, e.prompt_tokens);
            unqueue(e.session);
            const std::uint32_t bs = it->second.params.block_size_or_default();
            const std::uint64_t hit = e.cached_tokens / bs;
            const std::uint64_t need = e.projected_blocks > hit ? e.projected_blocks - hit : 0;
            it->second.queued_blocks += need;
            queued_[e.session] = {e.engine, e.round, need};
          }
        } else if constexpr (std::is_same_v<E, RoundFirstToken> || std::is_same_v<E, RoundEnded>) {
          // At its first token a round's prefill is allocated (now in the
          // pool's usage); a round that ends first leaves too. A late event
          // of an older round changes nothing.
          if (const QueuedRound* q = queued_.find(e.session); q != nullptr && q->round == e.round) unqueue(e.session);
        } else if constexpr (std::is_same_v<E, SessionClosed>) {
          unqueue(e.session);
        } else if constexpr (std::is_same_v<E, ToolStarted>) {
          ++cpu_.active_tools;
        } else if constexpr (std::is_same_v<E, ToolEnded>) {
          if (cpu_.active_tools > 0) --cpu_.active_tools;
          tools_.observe(e.kind, e.wall, e.principal);
        }
      },
      event);
  return sessions_.apply(event, now);
}

void NodeModel::unqueue(SessionId s) {
  const QueuedRound* q = queued_.find(s);
  if (q == nullptr) return;
  auto it = engines_.find(q->engine);
  if (it != engines_.end()) it->second.queued_blocks -= std::min(it->second.queued_blocks, q->blocks);
  queued_.erase(s);
}

std::vector<SessionId> NodeModel::engine_gone(EngineId engine, Time now) {
  std::vector<SessionId> aborted;
  for (const Session* s : sessions_.by_id()) {
    if (s->engine == engine && s->round_in_flight) aborted.push_back(s->id);
  }
  for (SessionId id : aborted) {
    unqueue(id);
    sessions_.abort_round(id, now);
  }
  observe(EngineLeft{engine}, now);
  return aborted;
}

}  // namespace tandem::sched
