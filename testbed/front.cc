// Job: a round in flight between an HTTP worker and an engine thread.
#include "testbed/front.h"

#include <algorithm>
#include <chrono>

namespace tandem::testbed {

Job::Progress Job::wait(std::uint32_t seen, Time deadline) const {
  std::unique_lock lock(mu_);
  const auto until = std::chrono::steady_clock::time_point(deadline.time_since_epoch());
  cv_.wait_until(lock, until, [&] { return p_.tokens > seen || p_.done || p_.status != 0; });
  return p_;
}

std::string Job::text(std::uint32_t from, std::uint32_t to) const {
  std::lock_guard lock(mu_);
  to = std::min(to, p_.tokens);
  if (from >= to) return {};
  if (pieces_.empty()) return filler_text(to - from);
  std::string out;
  for (std::uint32_t i = from; i < to && i < pieces_.size(); ++i) out += pieces_[i];
  return out;
}

void Job::set_session(std::string name) {
  std::lock_guard lock(mu_);
  p_.session = std::move(name);
}

void Job::set_cached(std::uint32_t cached) {
  std::lock_guard lock(mu_);
  p_.cached_tokens = cached;
}

void Job::add_tokens(std::uint32_t total) {
  {
    std::lock_guard lock(mu_);
    p_.tokens = std::max(p_.tokens, total);
  }
  cv_.notify_all();
}

void Job::add_piece(std::string piece) {
  {
    std::lock_guard lock(mu_);
    pieces_.push_back(std::move(piece));
    p_.tokens = static_cast<std::uint32_t>(pieces_.size());
  }
  cv_.notify_all();
}

void Job::finish(std::string_view reason) {
  {
    std::lock_guard lock(mu_);
    p_.done = true;
    p_.finish_reason = std::string(reason);
  }
  cv_.notify_all();
}

void Job::fail(int status, std::string message) {
  {
    std::lock_guard lock(mu_);
    if (p_.done || p_.status != 0) return;
    p_.status = status;
    p_.error = std::move(message);
  }
  cv_.notify_all();
}

}  // namespace tandem::testbed
