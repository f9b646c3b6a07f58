// tandemd's session table around the policy's: session meta, runner handles (owners), tombstones, resync
// (daemon/server.h).

#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "base/ids.h"
#include "base/text.h"
#include "daemon/events.h"
#include "daemon/server.h"
#include "daemon/server_parts.h"

namespace tandem::daemon {

using base::Time;
using sched::SessionState;

namespace {

// Runs a resync's steps (events.h resync_steps) in order: each event through
// `feed`, a MarkRunning as the table's WAITING → REASONING. False when the
// table refuses a session's opening; nothing after it runs then.
template <class Feed>
bool run_steps(const std::vector<ResyncStep>& steps, Feed&& feed, sched::SessionTable& table, Time now) {
  for (const ResyncStep& step : steps) {
    if (const auto* mark = std::get_if<MarkRunning>(&step)) {
      const sched::Session* s = table.find(mark->session);
      if (s != nullptr && s->state == SessionState::kWaiting) {
        (void)table.transition(mark->session, SessionState::kReasoning, now);
      }
      continue;
    }
    const auto& e = std::get<sched::Event>(step);
    if (!feed(e) && std::holds_alternative<sched::SessionOpened>(e)) return false;
  }
  return true;
}

}  // namespace

void Server::release_sessions(Client& c, Time now) {
  if (stopping_) return;  // the journal keeps who owns what for the next tandemd
  if (c.role == Role::kEngine) {
    // Its rounds in flight are lost; their runners may submit them elsewhere.
    control_->engine_gone(c.id, now);
    // The sessions it opened by submitting that no runner took die with it
    // (its resync brings them back if it returns).
    for (sched::SessionId id : sessions_.unowned_of(c.id)) {
      close_session(id, ipc::ToolExitReason::kKilledSession, std::nullopt, now);
    }
    sessions_.engine_gone(c.id);  // no one is charged for what is left of them
    return;
  }
  if (c.role != Role::kRunner) return;
  Owner* found = sessions_.owners().find(c.owner);
  if (found == nullptr || found->client != c.id) return;  // replaced by a newer connection of the handle
  Owner& o = *found;
  o.client = 0;
  if (c.doom.process_gone || !o.pidfd) {
    // The runner is gone (or its exit could not be watched): its sessions
    // end with it, their tools killed.
    end_owner(o.id, Closed::kOwnerGone, now);
    return;
  }
  if (o.sessions.empty()) {
    forget_owner(o);
    return;
  }
  // Only the connection ended: the runner lives, and so do its sessions and
  // their tools, held for it until it reconnects (its resync takes them
  // back) or its process exits (the pidfd).
  stats_.sessions_detached += o.sessions.size();
  o.sessions.for_each([&](sched::SessionId id) {
    if (SessionMeta* m = sessions_.find(id)) m->attached_conn = 0;
  });
  spdlog::info("runner handle of pid {} (uid {}): its {} sessions are held until it reconnects or its process exits",
               o.key.pid, o.key.uid, o.sessions.size());
}

Owner& Server::owner_for(const OwnerKey& key) {
  if (Owner* known = sessions_.owners().find(key)) return *known;
  Owner& o = sessions_.owners().add(key);
  if (key.pid > 0) {
    base::UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_open, key.pid, 0)));
    // The pidfd is of whatever process has the pid now: it is the owner's
    // only if its start time is the owner's.
    if (fd && (key.start == 0 || process_start_time(kProcRoot, key.pid).value_or(0) == key.start)) {
      o.pidfd = std::move(fd);
      if (armed_) {
        loop_.uring().poll_in(o.pidfd.get(), Tag{Op::kOwnerPidfd, o.id});
        o.pidfd_armed = true;
      }
    }
  }
  return o;
}

void Server::end_owner(std::uint32_t owner, Closed why, Time now) {
  const Owner* o = sessions_.owners().find(owner);
  if (o == nullptr) return;
  const std::vector<sched::SessionId> sessions = o->sessions.ids();
  for (sched::SessionId id : sessions) close_session(id, ipc::ToolExitReason::kKilledSession, why, now);
  o = sessions_.owners().find(owner);  // close_session may have touched the table
  if (o == nullptr) return;
  if (Client* c = find_client(o->client)) c->owner = 0;
  forget_owner(*o);
}

void Server::forget_owner(const Owner& o) {
  if (o.pidfd_armed) loop_.uring().cancel(Tag{Op::kOwnerPidfd, o.id});
  sessions_.owners().erase(o.id);
}

void Server::close_session(sched::SessionId id, ipc::ToolExitReason reason, std::optional<Closed> why, Time now) {
  const sched::Session* s = control_->model().sessions().find(id);
  if (s == nullptr || s->state == SessionState::kDone) return;
  effects_->kill_tools(id, reason);
  ++stats_.effects_kill_tools;
  (void)unplaced_.kill(id);
  if (why) sessions_.ledger().ended(id, *why);
  (void)control_->feed(sched::SessionClosed{id}, now);
}

void Server::track_unplaced(Client& c, sched::SessionId session, std::uint32_t call, std::int32_t pid) {
  switch (unplaced_.track(session, call, pid, c.pid, config_->config().limits.tools_per_session)) {
    case UnplacedTools::Tracked::kTracked:
      ++stats_.unplaced_tools;
      break;
    case UnplacedTools::Tracked::kUnverified:
      ++stats_.unplaced_unverified;
      break;
    case UnplacedTools::Tracked::kIgnored:
      break;
  }
}

void Server::tell(Client& c, int code, std::string_view message, sched::SessionId session) {
  // A client that sent no Hello.instance predates non-fatal Errors (an
  // older libtandem drops its connection on any Error, then resyncs into the
  // same refusal): it is not told, only counted where it was refused.
  if (c.instance == 0) return;
  // Over kErrorsPerSecond: counted where it was refused, not sent.
  if (!Clients::take_error(c, clock_->now())) return;
  send_message(c, ipc::build_error(code, message, session));
}

void Server::restore_owners(const JournalState& loaded, Time now) {
  std::size_t gone = 0;
  for (const auto& [id, key] : loaded.owned) {
    Owner& o = owner_for(key);
    if (!o.pidfd) {
      // Its runner exited while no tandemd ran: the session is over.
      forget_owner(o);
      sessions_.ledger().ended(id, Closed::kOwnerGone);
      ++gone;
      continue;
    }
    if (!control_->feed(sched::SessionOpened{id}, now)) continue;
    sessions_.restore(id, o);
    ++stats_.sessions_restored;
  }
  if (!loaded.owned.empty()) {
    spdlog::info("ownership journal: {} sessions held for their runners, {} closed (their runners exited)",
                 stats_.sessions_restored, gone);
  }
}

Server::Footprint Server::footprint() const {
  Footprint f;
  f.clients = clients_.size();
  f.sessions = control_->model().sessions().size();
  f.session_meta = sessions_.size();
  for (const auto& [id, c] : clients_) f.pending_names += c.pending_names.size();
  f.owners = sessions_.owners().size();
  f.detached = sessions_.owners().detached();
  f.tombstones = sessions_.ledger().tombstones();
  return f;
}

void Server::on_resync(Client& c, const wire::Resync& resync) {
  ++stats_.resyncs;
  if (!c.resync.open) {
    c.resync.open = true;
    c.resync.listed.clear();
    c.resync.refused = 0;
    c.resync.problem.clear();
    c.resync.position = resync.ring_position();
  }
  const std::uint32_t limit = config_->config().limits.sessions_per_client;
  if (resync.sessions() != nullptr) {
    for (const wire::SessionSnapshot* snap : *resync.sessions()) {
      const char* why = nullptr;
      int code = EINVAL;
      bool taken = false;
      if (snap->session() == 0) {
        why = "session 0";
      } else if (c.resync.listed.size() >= limit) {
        // A snapshot lists at most what the client may hold.
        why = "more sessions than limits.sessions_per_client";
        code = ENOSPC;
      } else if (snap->state() > static_cast<std::uint8_t>(SessionState::kPaused) ||
                 snap->residency() > static_cast<std::uint8_t>(sched::Residency::kDropped)) {
        why = "not a state or residency of a live session";
      } else {
        c.resync.listed.insert(snap->session());
        taken = c.role == Role::kRunner ? resync_runner(c, *snap, &why, &code) : resync_engine(c, *snap, &why, &code);
      }
      if (taken) continue;
      ++stats_.resync_refused;
      ++c.resync.refused;
      if (c.resync.problem.empty() && why != nullptr) c.resync.problem = why;
      if (why != nullptr) {
        tell(c, code, fmt::format("Resync: session {:#018x} not taken: {}", snap->session(), why), snap->session());
      }
    }
  }
  if (resync.more()) return;
  if (c.role == Role::kRunner) finish_resync(c);
  if (c.resync.refused > 0) {
    spdlog::info("client {} ({}): resync: {} entries refused (first: {})", c.id, base::escape(c.name), c.resync.refused,
                 c.resync.problem);
  }
  c.resync.open = false;
  c.resync.listed.clear();
}

void Server::take_name(Client& c, sched::SessionId id, const flatbuffers::String* name) {
  if (name == nullptr || name->size() == 0) return;
  const std::string_view text = name->string_view();
  if (base::name_problem(text) != nullptr || base::session_id(text) != id) {
    ++stats_.names_refused;
    return;
  }
  set_name(c, id, text);
}

// A runner's entry: its own session, given back; a session no runner owns
// (an engine opened it), taken over; a new one, opened — and never another
// runner's, whoever asks first, nor one an operator killed.
bool Server::resync_runner(Client& c, const wire::SessionSnapshot& snap, const char** why, int* code) {
  const sched::SessionId id = snap.session();
  const Time now = clock_->now();
  auto& table = control_->model().sessions();
  const sched::Session* s = table.find(id);
  const bool live = s != nullptr && s->state != SessionState::kDone;
  const SessionMeta* m = sessions_.find(id);
  if (live && m != nullptr && m->owner != 0 && m->owner != c.owner) {
    *why = "it belongs to another runner";
    *code = EPERM;
    return false;
  }
  if (!live && sessions_.ledger().tombstone(id) == Closed::kKilled) {
    *why = "an operator killed it";
    *code = ECANCELED;
    return false;
  }
  const bool mine = m != nullptr && m->owner == c.owner;
  if (!mine && !may_open_session(c)) {
    refuse_session(c, id);
    *why = nullptr;  // told already, with its own message
    return false;
  }
  if (!run_steps(
          resync_steps(snap, Sender::kRunner, c.id, c.uid, s, false),
          [&](const sched::Event& e) { return control_->feed(e, now); }, table, now)) {
    *why = "the session table refused it";
    return false;
  }
  take_name(c, id, snap.name());
  SessionMeta& m2 = sessions_.meta_for(c, id);
  const bool was_held = m2.owner == c.owner && m2.attached_conn != c.id;
  sessions_.set_owner(c, id, m2);
  m2.attached_at = 0;
  if (was_held) ++stats_.sessions_reattached;
  // Its tools that run without a cgroup: known by pid from here on.
  if (snap.tools() != nullptr) {
    for (const wire::ToolSnapshot* t : *snap.tools()) {
      if (t->cgroup_id() == 0) track_unplaced(c, id, t->call(), t->pid());
    }
  }
  return true;
}

// An engine's entry re-attaches its round in flight and the KV a session
// holds on it. It cannot recreate a session that ended, claim a round in
// flight on another engine, or change a runner's session beyond attaching
// its own round (whether a tool runs is the runner's word).
bool Server::resync_engine(Client& c, const wire::SessionSnapshot& snap, const char** why, int* code) {
  const sched::SessionId id = snap.session();
  const Time now = clock_->now();
  auto& table = control_->model().sessions();
  const auto state = static_cast<SessionState>(snap.state());
  const sched::Session* s = table.find(id);
  const bool live = s != nullptr && s->state != SessionState::kDone;
  if (!live && sessions_.ledger().tombstone(id)) {
    // Its runner closed it, or an operator killed it: the engine should
    // forget it, and is told to.
    push_directive(c, directive_slot(ipc::Close{}, id, now));
    *why = "the session has ended";
    *code = ECANCELED;
    return false;
  }
  if (state == SessionState::kPaused) {
    // Paused: nothing on the engine to account for; its name, if known.
    take_name(c, id, snap.name());
    return true;
  }
  if (live && s->round_in_flight && s->engine != c.id) {
    *why = "its round is in flight on another engine";
    *code = EBUSY;
    return false;
  }
  const SessionMeta* m = sessions_.find(id);
  const bool runners = m != nullptr && m->owner != 0;
  if (!live && !may_open_session(c)) {
    refuse_session(c, id);
    *why = nullptr;  // told already, with its own message
    return false;
  }
  take_name(c, id, snap.name());
  // What the entry says, as events (a runner's session between rounds is
  // the runner's to describe).
  (void)run_steps(
      resync_steps(snap, Sender::kEngine, c.id, c.uid, s, runners),
      [&](const sched::Event& e) { return control_->feed(e, now); }, table, now);
  if (table.find(id) != nullptr) sessions_.meta_for(c, id);
  return true;
}

void Server::finish_resync(Client& c) {
  // The snapshot is the runner's word on its sessions: those it holds that
  // are not in it were closed while the daemon could not hear it. Only
  // sessions the snapshot knew of are judged: held ones (attached to no
  // connection or another one of the handle's) and ones this connection
  // opened at a record before the snapshot was taken.
  const Owner* o = sessions_.owners().find(c.owner);
  if (o == nullptr) return;
  std::vector<sched::SessionId> gone;
  o->sessions.for_each([&](sched::SessionId id) {
    if (c.resync.listed.contains(id)) return;
    const SessionMeta* m = sessions_.find(id);
    if (m == nullptr) return;
    const bool judged = m->attached_conn != c.id ||
                        (c.resync.position != 0 && m->attached_at != 0 && m->attached_at <= c.resync.position);
    if (judged) gone.push_back(id);
  });
  std::sort(gone.begin(), gone.end());
  const Time now = clock_->now();
  for (sched::SessionId id : gone) {
    spdlog::info("session {:#018x}: closed, its runner's resync leaves it out", id);
    close_session(id, ipc::ToolExitReason::kKilledSession, Closed::kByOwner, now);
  }
}

bool Server::may_open_session(const Client& c) const {
  return sessions_.held(c) < config_->config().limits.sessions_per_client;
}

void Server::refuse_session(Client& c, sched::SessionId id) {
  const std::uint32_t limit = config_->config().limits.sessions_per_client;
  if (!c.warned.limit) {
    spdlog::warn("client {} ({}): at limits.sessions_per_client = {}; its new sessions are refused (each is told)",
                 c.id, base::escape(c.name), limit);
    c.warned.limit = true;
  }
  // Each refusal is answered: the client keeps its connection and knows
  // which session was not taken.
  tell(c, ENOSPC,
       fmt::format("session {:#018x} refused: limits.sessions_per_client = {}; new sessions are refused until some "
                   "close",
                   id, limit),
       id);
}

}  // namespace tandem::daemon
