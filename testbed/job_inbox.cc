// JobInbox: rounds from the HTTP front to an engine thread.
#include "testbed/job_inbox.h"

#include <chrono>
#include <utility>

namespace tandem::testbed {

SubmitStatus JobInbox::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard lock(mu_);
    if (draining_) return SubmitStatus::kDraining;
    const std::string& name = job->request().session_name;
    if (!name.empty() && !in_flight_.insert(name).second) return SubmitStatus::kBusy;
    queued_.push_back(std::move(job));
  }
  cv_.notify_one();
  return SubmitStatus::kQueued;
}

void JobInbox::drain(base::Time deadline) {
  {
    std::lock_guard lock(mu_);
    if (!deadline_ || deadline < *deadline_) deadline_ = deadline;
    draining_ = true;
  }
  cv_.notify_one();
}

std::optional<base::Time> JobInbox::take(std::deque<std::shared_ptr<Job>>& out) {
  std::lock_guard lock(mu_);
  if (out.empty()) {
    out.swap(queued_);
  } else {
    for (auto& job : queued_) out.push_back(std::move(job));
    queued_.clear();
  }
  return deadline_;
}

void JobInbox::wait(base::Time wake, std::optional<base::Time> seen) {
  std::unique_lock lock(mu_);
  // base::MonotonicClock reads CLOCK_MONOTONIC, as steady_clock does.
  const auto until = std::chrono::steady_clock::time_point(wake.time_since_epoch());
  cv_.wait_until(lock, until, [&] { return !queued_.empty() || deadline_ != seen; });
}

void JobInbox::round_over(const std::string& name) {
  if (name.empty()) return;
  std::lock_guard lock(mu_);
  in_flight_.erase(name);
}

std::size_t JobInbox::fail_queued(int status, const std::string& message) {
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard lock(mu_);
    left.swap(queued_);
    for (const auto& job : left) in_flight_.erase(job->request().session_name);
  }
  for (const auto& job : left) job->fail(status, message);
  return left.size();
}

void JobInbox::publish(std::string stats) {
  std::lock_guard lock(mu_);
  stats_ = std::move(stats);
}

std::string JobInbox::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace tandem::testbed
