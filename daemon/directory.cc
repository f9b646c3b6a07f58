// SessionDirectory: the daemon's record of each session beside the policy's table (daemon/directory.h).
#include "daemon/directory.h"

#include <algorithm>
#include <utility>

namespace tandem::daemon {

std::size_t SessionDirectory::held(const Client& c) const {
  if (c.role == Role::kRunner) {
    const Owner* o = owners_.find(c.owner);
    return o == nullptr ? 0 : o->sessions.size();
  }
  auto it = charged_.find(c.id);
  return it == charged_.end() ? 0 : it->second;
}

SessionMeta& SessionDirectory::meta_for(Client& c, sched::SessionId id) {
  if (SessionMeta* known = meta_.find(id)) return *known;
  SessionMeta& m = meta_[id];
  if (c.role == Role::kRunner) {
    set_owner(c, id, m);
  } else {
    m.creator = c.id;
    ++charged_[c.id];
  }
  if (auto n = c.pending_names.find(id); n != c.pending_names.end()) {
    m.name = std::move(n->second);
    c.pending_names.erase(n);
  }
  ledger_.revive(id);
  return m;
}

void SessionDirectory::set_owner(Client& c, sched::SessionId id, SessionMeta& m) {
  Owner* o = owners_.find(c.owner);
  if (o == nullptr) return;
  if (m.owner == c.owner) {
    m.attached_conn = c.id;
    return;
  }
  uncharge(m.creator);
  m.creator = 0;
  if (Owner* old = owners_.find(m.owner)) old->sessions.erase(id);
  m.owner = c.owner;
  m.attached_conn = c.id;
  o->sessions.insert(id);
  ledger_.owned(id, o->key);
}

void SessionDirectory::restore(sched::SessionId id, Owner& o) {
  meta_[id].owner = o.id;
  o.sessions.insert(id);
}

void SessionDirectory::erase(sched::SessionId id) {
  const SessionMeta* m = meta_.find(id);
  if (m == nullptr) return;
  uncharge(m->creator);
  if (Owner* o = owners_.find(m->owner)) {
    o->sessions.erase(id);
    ledger_.released(id);  // ended some other way: not owned any more
  }
  meta_.erase(id);
}

std::vector<sched::SessionId> SessionDirectory::unowned_of(std::uint32_t engine) const {
  std::vector<sched::SessionId> ids;
  meta_.for_each([&](sched::SessionId id, const SessionMeta& m) {
    if (m.owner == 0 && m.creator == engine) ids.push_back(id);
  });
  std::sort(ids.begin(), ids.end());
  return ids;
}

void SessionDirectory::engine_gone(std::uint32_t engine) {
  meta_.for_each([&](sched::SessionId, SessionMeta& m) {
    if (m.creator == engine) m.creator = 0;
  });
  charged_.erase(engine);
}

void SessionDirectory::uncharge(std::uint32_t engine) {
  if (engine == 0) return;
  auto it = charged_.find(engine);
  if (it == charged_.end()) return;
  if (--it->second == 0) charged_.erase(it);
}

}  // namespace tandem::daemon
