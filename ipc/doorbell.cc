// Doorbell: the syscall side of the wake-up protocol.
#include "ipc/doorbell.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>

namespace tandem::ipc {

bool Doorbell::ring_eventfd() {
  std::uint64_t one = 1;
  // EAGAIN means the counter is saturated: a wake-up is already pending, so
  // the consumer will run; count it as sent. Anything else (EBADF) is a bug in
  // the caller's fd handling and sends nothing.
  if (::write(fd_, &one, sizeof one) != sizeof one && errno != EAGAIN) return false;
  ++sent_;
  return true;
}

void Doorbell::arm(std::uint32_t watermark) {
  std::atomic_ref<std::uint32_t>(*flag_).store(watermark > 0 ? watermark : 1, std::memory_order_relaxed);
  // SYNC: full fence orders the flag store before the caller's re-check of the
  // ring (RingConsumer::empty(): tail hint, then slot turn). Pairs with the
  // fence in notify().
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void Doorbell::disarm() { std::atomic_ref<std::uint32_t>(*flag_).store(0, std::memory_order_relaxed); }

base::Result<void> Doorbell::consume() {
  std::uint64_t count;
  if (::read(fd_, &count, sizeof count) < 0 && errno != EAGAIN) return base::errno_error("doorbell: read eventfd");
  return {};
}

base::Result<bool> Doorbell::sleep_until(base::Time deadline) {
  ++sleeps_;
  while (true) {
    base::Duration left = deadline - clock_.now();
    if (left <= base::Duration::zero()) return false;
    // Round up so we never wake a hair early and spin through poll(…, 0).
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    pollfd p{fd_, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(ms > 1'000'000 ? 1'000'000 : ms));
    if (r < 0) {
      if (errno == EINTR) continue;
      return base::errno_error("doorbell: poll eventfd");
    }
    if (r > 0) {
      auto consumed = consume();
      if (!consumed) return base::propagate(std::move(consumed.error()));
      return true;
    }
  }
}

base::Result<base::UniqueFd> make_doorbell_fd() {
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return base::errno_error("doorbell: eventfd");
  return base::UniqueFd(fd);
}

}  // namespace tandem::ipc
