// Loop: tandemd's io_uring (daemon/uring.h) and the two inputs every
// daemon has whatever its clients do: the signalfd (SIGTERM and SIGINT
// stop, SIGHUP reloads) and the control tick's timerfd.
//
// The Server arms everything else on uring() itself (accept, clients'
// sockets, pidfds and doorbells, the host plane's events, the metrics
// endpoint) and dispatches every completion; Loop re-arms its own two
// reads, says which signal a kSignal completion read, and re-times the
// tick on reload. A Loop must not move once a read is armed: the reads
// land in its buffers.
#pragma once

#include <cstdint>

#include "base/clock.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "daemon/uring.h"

namespace tandem::daemon {

// Thread-safety: one thread (the loop's).
class Loop {
 public:
  Loop() = default;
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // Makes the signalfd (SIGTERM, SIGINT, SIGHUP must already be blocked in
  // every thread), a timer firing every `tick`, and the ring.
  base::Result<void> open(base::Duration tick);
  Uring& uring() { return uring_; }
  // Arms the read of the next signal (Op::kSignal) or timer expiry
  // (Op::kTimer): once at start, and again after each completion.
  void arm_signal();
  void arm_timer();
  // The signal a kSignal completion with result `res` read (0: none).
  int signal_read(int res) const;
  // Makes the timer fire every `tick` from now on. The armed read holds
  // the old timer's file: it fires once more and is re-armed on the new one.
  // On an error the old tick stays.
  base::Result<void> retime(base::Duration tick);

 private:
  Uring uring_;
  base::UniqueFd signal_fd_;
  base::UniqueFd timer_fd_;
  unsigned char signal_buf_[128] = {};  // one signalfd_siginfo
  std::uint64_t timer_buf_ = 0;
};

}  // namespace tandem::daemon
