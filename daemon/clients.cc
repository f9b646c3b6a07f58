// Clients (daemon/clients.h): the registry, and the limits it judges.

#include "daemon/clients.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <fmt/format.h>

#include "daemon/server_parts.h"

namespace tandem::daemon {

using base::Time;

std::uint64_t TokenBucket::available(Time now) {
  if (now > last_) {
    tokens_ = std::min(rate_, tokens_ + rate_ * base::to_seconds(now - last_));
    last_ = now;
  }
  return tokens_ >= 1.0 ? static_cast<std::uint64_t>(tokens_) : 0;
}

Client* Clients::find(std::uint32_t id) {
  auto it = map_.find(id);
  return it == map_.end() || it->second.doomed() ? nullptr : &it->second;
}

const Client* Clients::entry(std::uint32_t id) const {
  auto it = map_.find(id);
  return it == map_.end() ? nullptr : &it->second;
}

Client& Clients::add(base::UniqueFd sock, const ucred& cred, Time now, const Limits& limits) {
  const std::uint32_t id = next_++;
  Client& c = map_[id];
  c.id = id;
  c.sock = std::move(sock);
  c.pid = cred.pid;
  c.uid = cred.uid;
  c.gid = cred.gid;
  c.connected_at = now;
  c.last_request = now;
  c.budgets.messages = TokenBucket(limits.messages_per_s, now);
  return c;
}

std::size_t Clients::of_uid(uid_t uid) const {
  std::size_t n = 0;
  for (const auto& [id, c] : map_) n += !c.doomed() && c.uid == uid ? 1 : 0;
  return n;
}

std::string Clients::refusal(const Limits& limits, const ucred& cred, bool serves, bool trusted,
                             std::size_t held) const {
  std::size_t live = 0;
  for (const auto& [id, c] : map_) live += c.doomed() ? 0 : 1;
  if (live >= limits.max_clients) return fmt::format("too many clients: limits.max_clients = {}", limits.max_clients);
  if (!serves && live >= limits.max_clients - limits.reserved()) {
    return fmt::format(
        "too many clients: the last {} of limits.max_clients = {} are reserved for engines and "
        "runners (limits.reserved_clients), and uid {} is neither",
        limits.reserved(), limits.max_clients, cred.uid);
  }
  const std::size_t load = of_uid(cred.uid) + held;
  if (!trusted && load >= limits.clients_per_uid) {
    return fmt::format("uid {} has {} connections already: limits.clients_per_uid = {}", cred.uid, load,
                       limits.clients_per_uid);
  }
  return {};
}

std::string Clients::ctl_refusal(const Limits& limits) const {
  std::size_t ctl = 0;
  for (const auto& [id, other] : map_) {
    ctl += !other.doomed() && other.phase == Phase::kActive &&
                   (other.role == Role::kCtlRead || other.role == Role::kCtlAdmin)
               ? 1
               : 0;
  }
  if (ctl < limits.max_clients - limits.reserved()) return {};
  return fmt::format(
      "too many ctl clients: {} of limits.max_clients = {} ({} are kept for engines and runners: "
      "limits.reserved_clients)",
      ctl, limits.max_clients, limits.reserved());
}

bool Clients::take_error(Client& c, Time now) {
  if (now - c.budgets.errors.since >= std::chrono::seconds(1)) {
    c.budgets.errors.since = now;
    c.budgets.errors.sent = 0;
  }
  if (c.budgets.errors.sent >= kErrorsPerSecond) return false;
  ++c.budgets.errors.sent;
  return true;
}

}  // namespace tandem::daemon
