#include "ipc/daemon_connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace tandem::ipc {

base::Result<DaemonConnection> DaemonConnection::connect(const std::string& socket_path) {
  DaemonConnection c;
  c.sock_ = base::UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!c.sock_) return base::errno_error("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) {
    return base::make_error(ENAMETOOLONG, fmt::format("socket path {} is too long", socket_path));
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  if (::connect(c.sock_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    return base::errno_error(fmt::format("connect {}", socket_path));
  }
  return c;
}

base::Result<void> DaemonConnection::send(std::span<const std::uint8_t> bytes) { return send_message(fd(), bytes); }

base::Result<void> DaemonConnection::send_raw(const void* data, std::size_t size) {
  if (::send(fd(), data, size, MSG_NOSIGNAL) < 0) return base::errno_error("send");
  return {};
}

base::Result<ReceivedMessage> DaemonConnection::recv(std::chrono::milliseconds timeout) {
  pollfd p{fd(), POLLIN, 0};
  const int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
  if (n == 0) return base::make_error(ETIMEDOUT, "no message in time");
  if (n < 0) return base::errno_error("poll");
  return recv_message(fd());
}

bool DaemonConnection::closed_by_peer(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto m = recv(std::chrono::milliseconds(50));
    if (!m && m.error().code() == ECONNRESET) return true;
  }
  return false;
}

base::Result<void> DaemonConnection::hello(wire::Role role, const std::string& name,
                                           const std::optional<EngineInfo>& engine, std::chrono::milliseconds timeout) {
  if (auto s = send(build_hello(role, name, ::getpid(), engine)); !s) return base::propagate(std::move(s.error()));
  auto m = recv(timeout);
  if (!m) return base::propagate(std::move(m.error()));
  const wire::Message* msg = m->message();
  if (msg->payload_type() == wire::Payload::Error) {
    const auto* e = msg->payload_as_Error();
    return base::make_error(e->code(), e->message() ? e->message()->str() : "");
  }
  if (msg->payload_type() != wire::Payload::Welcome) return base::make_error(EPROTO, "expected Welcome");
  client_id_ = msg->payload_as_Welcome()->client_id();
  if (role != wire::Role::Engine && role != wire::Role::Runner) return {};
  if (m->fds.size() != 3) return base::make_error(EPROTO, "Welcome without the three fds");
  auto ch = Channel::attach(std::move(m->fds[0]), std::move(m->fds[1]), std::move(m->fds[2]));
  if (!ch) return base::propagate(std::move(ch.error()), "attach");
  channel_ = std::move(*ch);
  auto ev = channel_->event_producer();
  if (!ev) return base::propagate(std::move(ev.error()), "event ring");
  auto dir = channel_->directive_consumer();
  if (!dir) return base::propagate(std::move(dir.error()), "directive ring");
  events_ = *ev;
  directives_ = *dir;
  event_bell_ = channel_->event_doorbell();
  directive_bell_ = channel_->directive_doorbell();
  return {};
}

base::Result<std::string> DaemonConnection::ctl(const std::string& command, std::chrono::milliseconds timeout) {
  return ctl(command, {}, timeout);
}

base::Result<std::string> DaemonConnection::ctl(const std::string& command, std::span<const std::string> args,
                                                std::chrono::milliseconds timeout) {
  if (auto s = send(build_ctl_request(command, args, true)); !s) return base::propagate(std::move(s.error()));
  while (true) {
    auto m = recv(timeout);
    if (!m) return base::propagate(std::move(m.error()), "ctl reply");
    const wire::Message* msg = m->message();
    if (msg->payload_type() != wire::Payload::CtlResponse) continue;
    const auto* r = msg->payload_as_CtlResponse();
    std::string body = r->body() ? r->body()->str() : "";
    if (r->status() != 0) return base::make_error(r->status(), std::move(body));
    return body;
  }
}

bool DaemonConnection::push(const Slot& slot) {
  if (!events_.try_push(slot)) return false;
  event_bell_.notify_if([this] { return events_.in_flight(); });
  return true;
}

}  // namespace tandem::ipc
