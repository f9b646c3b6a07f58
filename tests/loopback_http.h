// One plain blocking HTTP exchange with a server on 127.0.0.1, for the
// metrics endpoint's tests (tests/daemon, tests/integration).
// Thread-safety: a free function; safe anywhere.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>

namespace tandem::test_support {

// A TCP connection to 127.0.0.1:`port` (the caller closes it); -1 if it
// cannot be made.
inline int loopback_connect(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` to 127.0.0.1:`port` and reads until the server closes;
// nullopt if the connection cannot be made.
inline std::optional<std::string> loopback_exchange(std::uint16_t port, const std::string& request) {
  const int fd = loopback_connect(port);
  if (fd < 0) return std::nullopt;
  (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}

}  // namespace tandem::test_support
