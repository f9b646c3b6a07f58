// DaemonConnection: a blocking client of tandemd's socket protocol, for the
// tools that speak it by hand — the integration tests (which must send what
// libtandem never would) and daemon_bench. Engines and runners use libtandem,
// whose connection never blocks.
//
// connect(), then hello() (Welcome; for engines and runners the three fds
// are attached as a Channel), then records on the event ring with push(),
// directives from directives(), and ctl requests with ctl().
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "base/result.h"
#include "base/unique_fd.h"
#include "ipc/channel.h"
#include "ipc/messages.h"

namespace tandem::ipc {

// Thread-safety: one thread at a time.
class DaemonConnection {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{5000};

  // Connects to tandemd's socket at `socket_path`.
  static base::Result<DaemonConnection> connect(const std::string& socket_path);

  base::Result<void> send(std::span<const std::uint8_t> bytes);
  // Sends raw bytes as one datagram, unverified.
  base::Result<void> send_raw(const void* data, std::size_t size);
  // One verified message within `timeout` (ETIMEDOUT if none).
  base::Result<ReceivedMessage> recv(std::chrono::milliseconds timeout = kDefaultTimeout);
  // Whether the daemon closed the connection within `timeout`.
  bool closed_by_peer(std::chrono::milliseconds timeout = kDefaultTimeout);

  // Hello as `role`, then the Welcome; engines and runners must get the
  // segment and doorbells with it (EPROTO otherwise). The daemon's Error
  // reply comes back as the error (its code and message).
  base::Result<void> hello(wire::Role role, const std::string& name,
                           const std::optional<EngineInfo>& engine = std::nullopt,
                           std::chrono::milliseconds timeout = kDefaultTimeout);
  // A ctl request (after hello as CtlRead/CtlAdmin): the reply's body, or
  // its status and message as the error.
  base::Result<std::string> ctl(const std::string& command, std::chrono::milliseconds timeout = kDefaultTimeout);
  base::Result<std::string> ctl(const std::string& command, std::span<const std::string> args,
                                std::chrono::milliseconds timeout = kDefaultTimeout);

  // Pushes one record on the event ring and rings the doorbell as
  // libtandem's EventSender does (honouring the daemon's wake-up watermark);
  // false if the ring is full. REQUIRES: hello() as an engine or runner.
  bool push(const Slot& slot);

  int fd() const { return sock_.get(); }
  std::uint32_t client_id() const { return client_id_; }
  // REQUIRES: hello() as an engine or runner.
  Channel& channel() { return *channel_; }
  RingConsumer& directives() { return directives_; }
  Doorbell& directive_bell() { return directive_bell_; }

 private:
  base::UniqueFd sock_;
  std::uint32_t client_id_ = 0;
  std::optional<Channel> channel_;
  RingProducer events_;
  RingConsumer directives_;
  Doorbell event_bell_;
  Doorbell directive_bell_;
};

}  // namespace tandem::ipc
