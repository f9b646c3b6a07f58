// Uring: the daemon's one io_uring, as the loop uses it.
//
// Every input of tandemd — signals, the control-tick timer, the listening
// socket, client sockets, pidfds, doorbell eventfds — is one armed operation
// whose completion carries a 64-bit tag (docs/contributing.md "The daemon"). The
// loop decodes the tag (Tag below) and dispatches; nothing else waits.
//
// Operations are one-shot: the handler re-arms what it still wants. An
// operation holds a reference to its file, so closing an fd does not stop
// it: before a client's fds are closed, cancel() every tag it has armed.
#pragma once

#include <liburing.h>

#include <cstdint>
#include <functional>

#include "base/clock.h"
#include "base/result.h"

namespace tandem::daemon {

enum class Op : std::uint8_t {
  kSignal = 1,     // read of a signalfd_siginfo
  kTimer,          // read of the timerfd's expiry count
  kAccept,         // accept on the listening socket
  kClientSock,     // POLLIN on a client socket
  kClientPidfd,    // POLLIN on a client's pidfd: the process exited
  kClientBell,     // read of a client's event-ring doorbell
  kCancel,         // completion of a cancel request (ignored)
  kHostEvents,     // POLLIN on the host plane's event fd (the eBPF ring buffer)
  kMetricsAccept,  // accept on the metrics endpoint's TCP socket
  kMetricsConn,    // POLLIN on a metrics connection (client = its connection id)
  kOwnerPidfd,     // POLLIN on a runner handle's pidfd (client = its Owner id): the process exited
};

// op (8 bits) | source (16 bits) | client id (32 bits). Client ids are never
// reused, so a late completion for a client that is gone finds no client and
// is dropped. `source` tells like sources apart (which metrics endpoint).
struct Tag {
  Op op;
  std::uint32_t client = 0;
  std::uint16_t source = 0;

  std::uint64_t pack() const {
    return (std::uint64_t{static_cast<std::uint8_t>(op)} << 56) | (std::uint64_t{source} << 32) | client;
  }
  static Tag unpack(std::uint64_t v) {
    return Tag{static_cast<Op>(v >> 56), static_cast<std::uint32_t>(v), static_cast<std::uint16_t>(v >> 32)};
  }
};

// Thread-safety: one thread (the loop's).
class Uring {
 public:
  Uring() = default;
  ~Uring();
  Uring(Uring&& other) noexcept;
  Uring& operator=(Uring&& other) noexcept;
  Uring(const Uring&) = delete;
  Uring& operator=(const Uring&) = delete;

  static base::Result<Uring> create(unsigned entries);

  // Queue operations (submitted by the next wait()). `buf` must stay valid
  // until the completion arrives.
  void read(int fd, void* buf, unsigned len, Tag tag);
  void poll_in(int fd, Tag tag);
  void accept(int fd, Tag tag);
  // Cancels the operation armed with `tag`, if any.
  void cancel(Tag tag);

  // Submits what is queued, waits up to `timeout` for at least one
  // completion (none: returns 0 at once when `timeout` is zero), then calls
  // `handle(tag, res)` for every completion available. Returns how many.
  base::Result<unsigned> wait(base::Duration timeout, const std::function<void(Tag, int)>& handle);

 private:
  io_uring_sqe* sqe();

  io_uring ring_{};
  bool live_ = false;
};

}  // namespace tandem::daemon
