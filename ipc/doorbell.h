// Doorbell: wakes a sleeping ring consumer without a syscall on the awake path.
//
// The pattern of io_uring's SQPOLL NEED_WAKEUP flag and folly's TurnSequencer
// ([gpu_and_ipc] B.2): a flag word in shared memory (RingControl::
// consumer_waiting) plus an eventfd both processes hold.
//
//   consumer:  spin a while on the ring; then  flag = 1; full fence;
//              re-check the ring; only if still empty, block on the eventfd.
//   producer:  publish (slot turn, then tail); full fence; if flag != 0,
//              clear it and write the eventfd.
//
// The two fences make this Dekker's handshake: either the producer sees the
// flag, or the consumer's re-check sees the new tail, so no wake-up is lost.
// While the consumer is awake the flag is 0 and notify() costs one fence and
// one load. The eventfd is pollable, so the daemon's io_uring loop can wait on
// many doorbells at once (arm(), re-check, then poll the fd).
//
// The same type serves both directions: each ring has its own flag and fd.
#pragma once

#include <atomic>
#include <cstdint>

#include "base/clock.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "ipc/spsc_ring.h"

namespace tandem::ipc {

// Thread-safety: notify() is called by the ring's one producer; arm(),
// disarm(), wait() and consume() by its one consumer.
class Doorbell {
 public:
  // Default spin budget before sleeping: about 20-50 µs of `pause` on x86,
  // well under a GPU step, far over a cache-line transfer.
  static constexpr std::uint32_t kDefaultSpins = 1024;

  Doorbell() = default;
  // `flag` is the ring's consumer_waiting word; `eventfd` stays owned by the
  // caller and must outlive the doorbell.
  Doorbell(std::uint32_t* flag, int eventfd) : flag_(flag), fd_(eventfd) {}

  // Producer: call after publishing records. Returns true if the consumer was
  // asleep and a wake-up was written (the only case that makes a syscall).
  // Inline: it runs after every push or batch.
  bool notify() {
    return notify_if([] { return ~std::uint32_t{0}; });
  }

  // Producer: as notify(), for a consumer that may have armed with a
  // watermark W > 1 ("wake me when W records wait"): `pending()` gives the
  // records in the ring not yet handed back (an upper bound is fine), and is
  // called only while the consumer sleeps.
  template <class Pending>
  bool notify_if(Pending&& pending) {
    // SYNC: full fence orders the caller's publishing stores (slot turn,
    // tail) before the flag load. Pairs with the fence in arm(): either we
    // see the flag, or the consumer's re-check after arm() sees the record.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    std::atomic_ref<std::uint32_t> flag(*flag_);
    const std::uint32_t want = flag.load(std::memory_order_relaxed);
    if (want == 0) return false;                     // awake: no syscall
    if (want > 1 && pending() < want) return false;  // asleep, below its watermark
    // Clear before writing so a burst of pushes rings once per sleep.
    if (flag.exchange(0, std::memory_order_relaxed) == 0) return false;
    return ring_eventfd();
  }

  // Consumer: announce that we are about to sleep. The caller must re-check
  // the ring after arm() and only then block on fd(). With a `watermark` W >
  // 1, a producer using notify_if() wakes us only once W records wait: a
  // consumer that polls anyway on a timer (tandemd pumps every ring at each
  // control tick) trades latency for fewer wake-ups. Its re-check should then
  // look for W records, not one.
  void arm(std::uint32_t watermark = 1);
  // Consumer: we are awake again.
  void disarm();
  // Consumer: resets the eventfd counter after a wake-up (non-blocking).
  base::Result<void> consume();

  // Consumer: returns true as soon as `has_work()` is true, false after
  // `timeout` without work. Spins `spins` times first, then sleeps.
  template <class HasWork>
  base::Result<bool> wait(HasWork&& has_work, base::Duration timeout, std::uint32_t spins = kDefaultSpins) {
    for (std::uint32_t i = 0; i < spins; ++i) {
      if (has_work()) return true;
      detail::cpu_relax();
    }
    const base::Time deadline = clock_.now() + timeout;
    while (true) {
      arm();
      if (has_work()) {
        disarm();
        return true;
      }
      auto slept = sleep_until(deadline);
      disarm();
      if (!slept) return base::propagate(std::move(slept.error()));
      if (has_work()) return true;
      if (!*slept) return false;  // deadline passed
    }
  }

  int fd() const { return fd_; }
  // Wake-ups this end has written (producer) or slept for (consumer).
  std::uint64_t wakeups_sent() const { return sent_; }
  std::uint64_t sleeps() const { return sleeps_; }

 private:
  // Writes the eventfd; false if the write failed (then nothing was counted).
  bool ring_eventfd();
  // Blocks on the eventfd until it is signalled (true) or `deadline` (false).
  base::Result<bool> sleep_until(base::Time deadline);

  std::uint32_t* flag_ = nullptr;
  int fd_ = -1;
  std::uint64_t sent_ = 0;
  std::uint64_t sleeps_ = 0;
  base::MonotonicClock clock_;
};

// A new eventfd for a doorbell (EFD_CLOEXEC | EFD_NONBLOCK).
base::Result<base::UniqueFd> make_doorbell_fd();

}  // namespace tandem::ipc
