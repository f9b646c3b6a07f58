// SessionTable: event effects and legal transitions.
#include "sched/session_table.h"

#include <algorithm>
#include <type_traits>

namespace tandem::sched {

std::string_view to_string(SessionState s) {
  switch (s) {
    case SessionState::kWaiting:
      return "WAITING";
    case SessionState::kReasoning:
      return "REASONING";
    case SessionState::kActing:
      return "ACTING";
    case SessionState::kPaused:
      return "PAUSED";
    case SessionState::kDone:
      return "DONE";
  }
  return "?";
}

std::string_view to_string(Residency r) {
  switch (r) {
    case Residency::kNone:
      return "NONE";
    case Residency::kResident:
      return "RESIDENT";
    case Residency::kPinned:
      return "PINNED";
    case Residency::kOffloaded:
      return "OFFLOADED";
    case Residency::kDropped:
      return "DROPPED";
  }
  return "?";
}

bool legal_transition(SessionState from, SessionState to) {
  using S = SessionState;
  if (from == S::kDone) return false;
  if (to == S::kDone) return true;
  switch (from) {
    case S::kWaiting:
      return to == S::kReasoning;
    case S::kReasoning:
      return to == S::kActing || to == S::kPaused;
    case S::kActing:
      return to == S::kReasoning || to == S::kPaused;
    case S::kPaused:
      return to == S::kReasoning;
    case S::kDone:
      return false;
  }
  return false;
}

Session& SessionTable::create(SessionId id, Time now) {
  Session* slot;
  if (free_.empty()) {
    slot = &pool_.emplace_back();
  } else {
    slot = free_.back();
    free_.pop_back();
    *slot = Session{};
  }
  Session& s = *slot;
  s.id = id;
  s.opened = now;
  s.state_since = now;
  index_add(s);
  index_[id] = &s;
  by_id_stale_ = true;
  return s;
}

std::span<const Session* const> SessionTable::by_id() const {
  if (by_id_stale_) {
    by_id_.clear();
    by_id_.reserve(index_.size());
    index_.for_each([&](SessionId, Session* s) { by_id_.push_back(s); });
    std::sort(by_id_.begin(), by_id_.end(), [](const Session* a, const Session* b) { return a->id < b->id; });
    by_id_stale_ = false;
  }
  return by_id_;
}

void SessionTable::index_add(Session& s) {
  auto& v = by_state_[static_cast<std::size_t>(s.state)];
  s.state_slot = static_cast<std::uint32_t>(v.size());
  v.push_back(&s);
  briefs_[static_cast<std::size_t>(s.state)].push_back({s.engine, s.prompt_tokens, s.round_in_flight});
}

void SessionTable::index_remove(Session& s) {
  auto& v = by_state_[static_cast<std::size_t>(s.state)];
  auto& b = briefs_[static_cast<std::size_t>(s.state)];
  const Session* last = v.back();
  v[s.state_slot] = last;
  b[s.state_slot] = b.back();
  // `last` is the same Session as a non-const entry of pool_; its slot is
  // ours to maintain.
  const_cast<Session*>(last)->state_slot = s.state_slot;
  v.pop_back();
  b.pop_back();
}

void SessionTable::set_state(Session& s, SessionState to, Time now) {
  index_remove(s);
  s.state = to;
  s.state_since = now;
  index_add(s);
}

bool SessionTable::transition(SessionId id, SessionState to, Time now, EngineId engine) {
  Session* s = lookup(id);
  if (s == nullptr || !legal_transition(s->state, to)) return reject();
  if (engine != kNoEngine) s->engine = engine;
  set_state(*s, to, now);  // its brief moves with the session's current fields
  return true;
}

bool SessionTable::abort_round(SessionId id, Time now) {
  Session* found = lookup(id);
  if (found == nullptr || found->state == SessionState::kDone || !found->round_in_flight) return false;
  Session& s = *found;
  s.round_in_flight = false;
  s.blocks_held = 0;
  s.residency = Residency::kDropped;
  s.last_round_end = now;
  refresh(s);
  return true;
}

bool SessionTable::set_pinned(SessionId id, bool pinned) {
  Session* found = lookup(id);
  if (found == nullptr || found->state == SessionState::kDone) return false;
  Session& s = *found;
  if (pinned && s.residency == Residency::kResident) {
    s.residency = Residency::kPinned;
    return true;
  }
  if (!pinned && s.residency == Residency::kPinned) {
    s.residency = Residency::kResident;
    return true;
  }
  return false;
}

std::size_t SessionTable::reap_done() {
  // Walks the DONE index, not the table: a host reaps every tick.
  auto& done = by_state_[static_cast<std::size_t>(SessionState::kDone)];
  const std::size_t n = done.size();
  while (!done.empty()) {
    // The index entry is a non-const Session of pool_ (see index_remove()).
    Session* s = const_cast<Session*>(done.back());
    done.pop_back();
    index_.erase(s->id);
    free_.push_back(s);
  }
  briefs_[static_cast<std::size_t>(SessionState::kDone)].clear();
  if (n > 0) by_id_stale_ = true;
  return n;
}

Session* SessionTable::lookup(SessionId id) const {
  Session* const* s = index_.find(id);
  return s == nullptr ? nullptr : *s;
}

bool SessionTable::apply(const Event& event, Time now) {
  return std::visit(
      [&](const auto& e) -> bool {
        using E = std::decay_t<decltype(e)>;
        using S = SessionState;
        if constexpr (std::is_same_v<E, EngineJoined> || std::is_same_v<E, EngineLeft> ||
                      std::is_same_v<E, KvStatsReported> || std::is_same_v<E, RoundFirstToken>) {
          return true;  // no session state in these
        } else if constexpr (std::is_same_v<E, SessionOpened>) {
          if (e.session == 0 || index_.contains(e.session)) return reject();
          Session& s = create(e.session, now);
          s.priority_class = e.priority_class;
          s.expected_rounds = e.expected_rounds;
          return true;
        } else if constexpr (std::is_same_v<E, RoundSubmitted>) {
          if (e.session == 0) return reject();
          Session* found = lookup(e.session);
          // An engine may submit for a session no runner opened (engine-only
          // deployments): the round opens it.
          Session& s = found == nullptr ? create(e.session, now) : *found;
          if (s.state == S::kDone || s.round_in_flight) return reject();
          if (s.state == S::kActing) {  // the round's submit implies the tool ended
            s.tool = 0;
            set_state(s, S::kReasoning, now);
          }
          s.engine = e.engine;
          s.round = e.round;
          s.round_in_flight = true;
          s.prompt_tokens = e.prompt_tokens;
          s.cached_tokens = e.cached_tokens;
          s.projected_blocks = e.projected_blocks;
          refresh(s);
          return true;
        } else if constexpr (std::is_same_v<E, RoundEnded>) {
          Session* found = lookup(e.session);
          if (found == nullptr) return reject();
          Session& s = *found;
          // A round can only end if it ran, i.e. the session was admitted.
          if (s.state != S::kReasoning && s.state != S::kActing && s.state != S::kPaused) return reject();
          if (!s.round_in_flight || e.round != s.round) return reject();
          s.round_in_flight = false;
          refresh(s);
          ++s.rounds_done;
          s.context_tokens = s.prompt_tokens + e.output_tokens;
          s.service_tokens += (s.prompt_tokens - s.cached_tokens) + e.output_tokens;
          s.blocks_held = e.blocks_held;
          s.residency = e.blocks_held > 0 ? Residency::kResident : Residency::kDropped;
          s.last_round_end = now;
          if (e.tool_follows && s.state == S::kReasoning) set_state(s, S::kActing, now);
          return true;
        } else if constexpr (std::is_same_v<E, ToolStarted>) {
          Session* found = lookup(e.session);
          if (found == nullptr) return reject();
          Session& s = *found;
          // REASONING: the runner's ring beat the engine's ROUND_END here.
          if (s.state == S::kReasoning) {
            set_state(s, S::kActing, now);
          } else if (s.state != S::kActing && s.state != S::kPaused) {
            return reject();
          }
          s.tool = e.kind;
          s.tool_call = e.tool_call;
          s.tool_started = now;
          return true;
        } else if constexpr (std::is_same_v<E, ToolEnded>) {
          Session* found = lookup(e.session);
          if (found == nullptr) return reject();
          Session& s = *found;
          if (s.state == S::kActing) {
            set_state(s, S::kReasoning, now);
          } else if (s.state != S::kPaused && s.state != S::kReasoning) {
            return reject();
          }
          if (s.tool != 0) s.tool_time += now - s.tool_started;
          s.tool = 0;
          return true;
        } else if constexpr (std::is_same_v<E, KvChanged>) {
          Session* found = lookup(e.session);
          if (found == nullptr) return reject();
          Session& s = *found;
          switch (e.change) {
            case KvChange::kEvicted:
            case KvChange::kDropped:
              s.residency = Residency::kDropped;
              s.blocks_held = 0;
              break;
            case KvChange::kRestored:
              s.residency = Residency::kResident;
              s.blocks_held = e.blocks;
              break;
            case KvChange::kOffloaded:
              s.residency = Residency::kOffloaded;
              s.blocks_held = 0;
              break;
          }
          return true;
        } else if constexpr (std::is_same_v<E, SessionClosed>) {
          Session* s = lookup(e.session);
          if (s == nullptr || s->state == S::kDone) return reject();
          set_state(*s, S::kDone, now);
          s->round_in_flight = false;
          s->tool = 0;
          refresh(*s);
          return true;
        }
      },
      event);
}

}  // namespace tandem::sched
