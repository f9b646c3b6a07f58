// Loop (daemon/loop.h): the ring, the signalfd and the tick's timerfd.

#include "daemon/loop.h"

#include <sys/signalfd.h>
#include <sys/timerfd.h>

#include <csignal>
#include <cstring>
#include <utility>

namespace tandem::daemon {
namespace {

constexpr unsigned kUringEntries = 1024;

base::Result<base::UniqueFd> make_timer(base::Duration tick) {
  base::UniqueFd fd(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!fd) return base::errno_error("timerfd_create");
  itimerspec spec{};
  const auto ns = tick.count();
  spec.it_interval.tv_sec = ns / 1'000'000'000;
  spec.it_interval.tv_nsec = ns % 1'000'000'000;
  spec.it_value = spec.it_interval;
  if (::timerfd_settime(fd.get(), 0, &spec, nullptr) != 0) return base::errno_error("timerfd_settime");
  return fd;
}

}  // namespace

base::Result<void> Loop::open(base::Duration tick) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  signal_fd_ = base::UniqueFd(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signal_fd_) return base::errno_error("signalfd");

  auto timer = make_timer(tick);
  if (!timer) return base::propagate(std::move(timer.error()));
  timer_fd_ = std::move(*timer);

  auto uring = Uring::create(kUringEntries);
  if (!uring) return base::propagate(std::move(uring.error()));
  uring_ = std::move(*uring);
  return {};
}

void Loop::arm_signal() { uring_.read(signal_fd_.get(), signal_buf_, sizeof(signalfd_siginfo), Tag{Op::kSignal}); }

void Loop::arm_timer() { uring_.read(timer_fd_.get(), &timer_buf_, sizeof timer_buf_, Tag{Op::kTimer}); }

int Loop::signal_read(int res) const {
  if (res != static_cast<int>(sizeof(signalfd_siginfo))) return 0;
  signalfd_siginfo info;
  std::memcpy(&info, signal_buf_, sizeof info);
  return static_cast<int>(info.ssi_signo);
}

base::Result<void> Loop::retime(base::Duration tick) {
  auto timer = make_timer(tick);
  if (!timer) return base::propagate(std::move(timer.error()));
  timer_fd_ = std::move(*timer);
  return {};
}

}  // namespace tandem::daemon
