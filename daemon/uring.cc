#include "daemon/uring.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace tandem::daemon {

Uring::~Uring() {
  if (live_) io_uring_queue_exit(&ring_);
}

Uring::Uring(Uring&& other) noexcept : ring_(other.ring_), live_(std::exchange(other.live_, false)) {}

Uring& Uring::operator=(Uring&& other) noexcept {
  if (this != &other) {
    if (live_) io_uring_queue_exit(&ring_);
    ring_ = other.ring_;
    live_ = std::exchange(other.live_, false);
  }
  return *this;
}

base::Result<Uring> Uring::create(unsigned entries) {
  Uring u;
  int rc = io_uring_queue_init(entries, &u.ring_, 0);
  if (rc < 0) return base::make_error(-rc, fmt::format("io_uring_queue_init({}): {}", entries, std::strerror(-rc)));
  u.live_ = true;
  return u;
}

io_uring_sqe* Uring::sqe() {
  io_uring_sqe* s = io_uring_get_sqe(&ring_);
  if (s == nullptr) {
    // The submission queue is full: hand it to the kernel and take a fresh one.
    io_uring_submit(&ring_);
    s = io_uring_get_sqe(&ring_);
  }
  return s;  // non-null: the queue was just emptied
}

void Uring::read(int fd, void* buf, unsigned len, Tag tag) {
  io_uring_sqe* s = sqe();
  io_uring_prep_read(s, fd, buf, len, 0);
  io_uring_sqe_set_data64(s, tag.pack());
}

void Uring::poll_in(int fd, Tag tag) {
  io_uring_sqe* s = sqe();
  io_uring_prep_poll_add(s, fd, POLLIN);
  io_uring_sqe_set_data64(s, tag.pack());
}

void Uring::accept(int fd, Tag tag) {
  io_uring_sqe* s = sqe();
  io_uring_prep_accept(s, fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  io_uring_sqe_set_data64(s, tag.pack());
}

void Uring::cancel(Tag tag) {
  io_uring_sqe* s = sqe();
  io_uring_prep_cancel64(s, tag.pack(), 0);
  io_uring_sqe_set_data64(s, Tag{Op::kCancel}.pack());
}

base::Result<unsigned> Uring::wait(base::Duration timeout, const std::function<void(Tag, int)>& handle) {
  io_uring_cqe* cqe = nullptr;
  int rc;
  if (timeout > base::Duration::zero()) {
    const auto ns = timeout.count();
    __kernel_timespec ts{};
    ts.tv_sec = ns / 1'000'000'000;
    ts.tv_nsec = ns % 1'000'000'000;
    rc = io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &ts, nullptr);
  } else {
    rc = io_uring_submit(&ring_);
  }
  if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
    return base::make_error(-rc, fmt::format("io_uring wait: {}", std::strerror(-rc)));
  }
  unsigned n = 0;
  unsigned head;
  io_uring_for_each_cqe(&ring_, head, cqe) {
    handle(Tag::unpack(io_uring_cqe_get_data64(cqe)), cqe->res);
    ++n;
  }
  io_uring_cq_advance(&ring_, n);
  return n;
}

}  // namespace tandem::daemon
