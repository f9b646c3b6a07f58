// The Server as CtlService (daemon/ctl_service.h) sees it: CtlView's
// read-only cards of clients and sessions, and CtlCommands' operator
// actions (drain, evict, kill; reload and apply_config are tick.cc's).

#include <poll.h>

#include <utility>

#include "daemon/server.h"
#include "daemon/server_parts.h"

namespace tandem::daemon {

using base::Time;

namespace {

// How long session kill waits for a killed unplaced tool to be gone.
constexpr int kKillCheckMs = 200;

}  // namespace

// ---- CtlView -------------------------------------------------------------------

ClientCard Server::card(const Client& c) {
  ClientCard card;
  card.id = c.id;
  card.active = !c.doomed() && c.phase == Phase::kActive;
  card.role = c.role;
  card.name = c.name;
  card.pid = c.pid;
  card.engine = c.engine.params;
  card.gpu_index = c.engine.gpu_index;
  card.gpu = c.engine.gpu;
  card.accepted = c.counts.accepted;
  card.rejected = c.counts.rejected;
  card.late = c.counts.late;
  return card;
}

SessionCard Server::card(const SessionMeta& m) const {
  SessionCard card;
  card.name = m.name;
  card.owner = m.owner;
  if (const Owner* o = sessions_.owners().find(m.owner)) card.owner_client = o->client;
  card.priority = m.steer.priority;
  card.cpu_weight = m.steer.cpu_weight;
  card.cpu_quota = m.steer.cpu_quota;
  return card;
}

void Server::for_each_client(const std::function<void(const ClientCard&)>& f) const {
  for (const auto& [id, c] : clients_) f(card(c));
}

std::optional<ClientCard> Server::client(std::uint32_t id) const {
  const Client* c = clients_.entry(id);
  if (c == nullptr) return std::nullopt;
  return card(*c);
}

std::optional<SessionCard> Server::session(sched::SessionId id) const {
  const SessionMeta* m = sessions_.find(id);
  if (m == nullptr) return std::nullopt;
  return card(*m);
}

void Server::for_each_session(const std::function<void(sched::SessionId, const SessionCard&)>& f) const {
  sessions_.for_each([&](sched::SessionId id, const SessionMeta& m) { f(id, card(m)); });
}

// ---- CtlCommands ---------------------------------------------------------------

void Server::refresh() {
  for (auto& [id, c] : clients_) c.rings.pending = c.rings.attached && !c.doomed();
  pump();
}

void Server::set_draining(bool on, Time now) {
  if (on != control_->draining()) log_event(now, on ? LogKind::kDrain : LogKind::kUndrain, 0);
  control_->set_draining(on);
}

void Server::evict_session(sched::SessionId id, Time now) {
  log_event(now, LogKind::kEvict, id);
  // The operator's actions go the policy's way (sched/apply.h).
  control_->apply({sched::ActionKind::kUnpin, id}, now);
  control_->apply({sched::ActionKind::kDrop, id}, now);
}

std::vector<std::int32_t> Server::kill_session(sched::SessionId id, Time now) {
  log_event(now, LogKind::kKill, id);
  // Its tools outside any cgroup (started unplaced) are killed by pid; kept
  // here to see them gone.
  std::vector<UnplacedTools::Tool> unplaced = unplaced_.kill(id);
  close_session(id, ipc::ToolExitReason::kKilledSession, Closed::kKilled, now);
  session_done(id);
  control_->model().sessions().reap_done();
  std::vector<std::int32_t> alive = effects_->survivors(id);
  for (const UnplacedTools::Tool& t : unplaced) {
    pollfd p{t.pidfd.get(), POLLIN, 0};
    if (::poll(&p, 1, kKillCheckMs) == 0) alive.push_back(t.pid);
  }
  return alive;
}

}  // namespace tandem::daemon
