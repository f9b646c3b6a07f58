// SessionTable: every live session and the state machine of docs/architecture.md "Sessions".
//
// The host (daemon or simulator) owns the table. It applies each event with
// apply(), then hands the table to policies read-only; a policy's admit,
// pause and restore come back as Actions, which the host applies with
// transition(). An event or action that implies an illegal transition is
// rejected and counted, never a crash: a buggy or hostile client can confuse
// only its own sessions.
//
// Events from different rings are not ordered against each other (a runner's
// TOOL_START can arrive before the engine's ROUND_END that precedes it), so
// apply() accepts the orders that interleaving can produce — a tool start seen
// while REASONING implies the round ended — and rejects the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "base/id_map.h"
#include "sched/types.h"

namespace tandem::sched {

struct Session {
  SessionId id = 0;
  SessionState state = SessionState::kWaiting;
  Residency residency = Residency::kNone;
  EngineId engine = kNoEngine;        // engine of the latest round
  std::uint8_t priority_class = 0;    // SESSION_OPEN hint, 0 = default
  std::uint32_t expected_rounds = 0;  // 0 = unknown
  std::uint32_t round = 0;            // latest round submitted
  std::uint32_t rounds_done = 0;
  bool round_in_flight = false;        // submitted and not yet ended
  std::uint32_t prompt_tokens = 0;     // of the latest round
  std::uint32_t cached_tokens = 0;     // prefix hit of the latest round at submit
  std::uint32_t context_tokens = 0;    // prompt + output after the latest round ended
  std::uint32_t projected_blocks = 0;  // KV the latest round will hold at its end
  std::uint32_t blocks_held = 0;       // KV held now (as last reported)
  std::uint64_t service_tokens = 0;    // tokens computed for this session (prefill + decode)
  ToolKind tool = 0;                   // running tool, 0 if none
  std::uint32_t tool_call = 0;
  Time opened{};
  Time state_since{};
  Time tool_started{};
  Time last_round_end{};
  Duration tool_time{};          // wall time of the session's ended tool calls
  std::uint32_t state_slot = 0;  // maintained by SessionTable: position in in_state()
};

// What a walk over many sessions of one state needs, kept beside the state
// index in a flat array (SessionTable::briefs): a control tick reads these
// for every reasoning session without touching the sessions themselves.
struct SessionBrief {
  EngineId engine = kNoEngine;
  std::uint32_t prompt_tokens = 0;
  bool round_in_flight = false;
};

// Thread-safety: one thread.
class SessionTable {
 public:
  SessionTable() = default;
  // Not copyable: the indexes hold pointers into pool_, and a copy's would
  // point into the original. A move keeps them valid (a deque's move takes
  // its blocks, so no session moves; noexcept: only allocating the moved-from
  // deque's empty map can throw, and that is out of memory).
  SessionTable(const SessionTable&) = delete;
  SessionTable& operator=(const SessionTable&) = delete;
  SessionTable(SessionTable&&) noexcept = default;
  SessionTable& operator=(SessionTable&&) noexcept = default;
  ~SessionTable() = default;

  // Applies an event. Returns false if it was rejected (an illegal transition
  // or an event for an unknown or finished session); the table is unchanged.
  bool apply(const Event& e, Time now);

  // A policy-driven transition (admit, pause, restore, close). Returns false
  // and changes nothing if it is illegal or the session is unknown.
  bool transition(SessionId id, SessionState to, Time now, EngineId engine = kNoEngine);

  // The engine running the session's round went away (it died or
  // disconnected): the round is lost and its KV with it. The session keeps
  // its state, so its runner can submit the round again elsewhere. Returns
  // false if the session is unknown, done, or has no round in flight.
  bool abort_round(SessionId id, Time now);

  // A PIN (`pinned`) or UNPIN directive went to the session's engine: a
  // resident session becomes PINNED, a pinned one RESIDENT again. Returns
  // false and changes nothing for an unknown or finished session, or one
  // whose KV is not on the GPU (dropped, offloaded: nothing to pin).
  bool set_pinned(SessionId id, bool pinned);

  // Removes sessions in DONE; call once the policies have seen them.
  std::size_t reap_done();

  const Session* find(SessionId id) const { return lookup(id); }
  // Every session, in id order (the order a deterministic walk needs). The
  // index is sorted when first asked for after sessions came or went: fine
  // for tools and the simple policies, too slow for a control tick at 100K
  // sessions (use in_state()).
  std::span<const Session* const> by_id() const;
  // The sessions in one state, O(1) to get and proportional to their number
  // to walk. The order is deterministic for a given event sequence but is
  // not id order (removal swaps the last entry into the hole).
  std::span<const Session* const> in_state(SessionState s) const { return by_state_[static_cast<std::size_t>(s)]; }
  // The briefs of the sessions in one state, in in_state()'s order.
  std::span<const SessionBrief> briefs(SessionState s) const { return briefs_[static_cast<std::size_t>(s)]; }
  std::size_t size() const { return index_.size(); }
  std::size_t count(SessionState s) const { return by_state_[static_cast<std::size_t>(s)].size(); }
  std::uint64_t rejected() const { return rejected_; }

 private:
  Session& create(SessionId id, Time now);
  // The session by hash (index_), writable: every per-event lookup goes
  // through here, never through a walk of sessions_.
  Session* lookup(SessionId id) const;
  void set_state(Session& s, SessionState to, Time now);
  void index_add(Session& s);
  void index_remove(Session& s);
  // Writes the session's brief after a change to its engine, prompt or round.
  void refresh(const Session& s) {
    briefs_[static_cast<std::size_t>(s.state)][s.state_slot] = {s.engine, s.prompt_tokens, s.round_in_flight};
  }
  bool reject() {
    ++rejected_;
    return false;
  }

  // The sessions live in pool_ (a deque: addresses stay put, so the indexes
  // hold pointers) and reaped ones are reused from free_: a session opened
  // costs no allocation and no ordered-map insert (both showed in tandemd's
  // profile at 800 sessions opened a second).
  std::deque<Session> pool_;
  std::vector<Session*> free_;
  // find() by hash: policies and the daemon look sessions up per event and
  // per tick.
  base::IdMap<Session*> index_;
  std::vector<const Session*> by_state_[5];
  std::vector<SessionBrief> briefs_[5];        // parallel to by_state_
  mutable std::vector<const Session*> by_id_;  // sorted lazily (by_id())
  mutable bool by_id_stale_ = false;
  std::uint64_t rejected_ = 0;
};

}  // namespace tandem::sched
