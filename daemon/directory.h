// SessionDirectory: what tandemd holds of each session beside the policy's
// table (docs/architecture.md "The daemon's parts") — its meta (name, the
// runner handle that owns it or the engine charged for it, the connection
// that attached it, what Control last told about it), the runner handles
// that own sessions (Owners), tombstones and the ownership journal
// (SessionLedger), and what each engine is charged under
// limits.sessions_per_client for the sessions it opened that no runner took.
//
// Pure bookkeeping: it sends, kills and closes nothing, and arms no I/O (the
// Server does, over what it answers); its only I/O is the journal's file,
// through the ledger.
//
// Thread-safety: one thread (the daemon loop's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "daemon/clients.h"
#include "daemon/control.h"
#include "daemon/owners.h"
#include "sched/types.h"

namespace tandem::daemon {

struct SessionMeta {
  std::string name;
  std::uint32_t owner = 0;    // the runner handle (Owner id) it belongs to (0: none, an engine opened it)
  std::uint32_t creator = 0;  // engine client charged for it while no runner owns it (0: none)
  // The connection that attached it and at which of its records (its
  // records_taken then; 0: by a resync): a later snapshot of that
  // connection taken after that record judges it (Resync.ring_position).
  std::uint32_t attached_conn = 0;
  std::uint64_t attached_at = 0;
  bool named_by_owner = false;  // its name came from its runner (or no runner owns it)
  SessionSteer steer;           // what Control last told about it
};

class SessionDirectory {
 public:
  // Several times per record: defined here, so it inlines. A meta moves
  // when another session's is created or erased (base::IdMap): hold no
  // pointer or reference across meta_for() or erase().
  SessionMeta* find(sched::SessionId id) { return meta_.find(id); }
  const SessionMeta* find(sched::SessionId id) const { return meta_.find(id); }
  std::size_t size() const { return meta_.size(); }
  // Calls f(id, meta) for every session, in no defined order.
  template <class F>
  void for_each(F&& f) const {
    meta_.for_each(f);
  }

  // Sessions `c` holds under limits.sessions_per_client: its handle's for a
  // runner, those it opened that no runner took for an engine.
  std::size_t held(const Client& c) const;

  // The session's meta, created on first use: owned by runner `c`'s handle,
  // or charged to engine `c`; a name `c` sent before the session existed
  // comes with it, and a tombstone of an earlier session of its id goes.
  SessionMeta& meta_for(Client& c, sched::SessionId id);
  // Runner `c`'s handle owns session `id` from now (charged to it; the
  // engine that opened it, if any, is charged no more), attached through
  // `c`'s connection. Nothing if `c` has no handle.
  void set_owner(Client& c, sched::SessionId id, SessionMeta& m);
  // Session `id`, restored from the journal, is held for handle `o`.
  void restore(sched::SessionId id, Owner& o);
  // Session `id` left the policy's table: its meta goes, its engine is
  // charged no more, its handle holds it no more, and the journal stops
  // holding it for its runner (unless a tombstone said why it ended).
  void erase(sched::SessionId id);
  // The sessions engine `engine` opened that no runner took, ascending.
  std::vector<sched::SessionId> unowned_of(std::uint32_t engine) const;
  // Engine `engine` is gone: no session is charged to it any more.
  void engine_gone(std::uint32_t engine);

  Owners& owners() { return owners_; }
  const Owners& owners() const { return owners_; }
  SessionLedger& ledger() { return ledger_; }
  const SessionLedger& ledger() const { return ledger_; }
  void set_ledger(SessionLedger ledger) { ledger_ = std::move(ledger); }

 private:
  void uncharge(std::uint32_t engine);

  base::IdMap<SessionMeta> meta_;
  std::unordered_map<std::uint32_t, std::size_t> charged_;  // engine client id → sessions charged to it
  Owners owners_;
  SessionLedger ledger_;
};

}  // namespace tandem::daemon
