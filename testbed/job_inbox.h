// JobInbox: where the HTTP front's threads hand rounds to an engine thread,
// shared by the emulator (testbed/emulator.h) and tandem-llama
// (engines/llama/engine.h).
//
// It holds what both sides touch: the rounds not yet taken, the named
// sessions with a round in flight (a second round of one is refused as
// busy until the first is answered), the drain deadline, and the stats
// snapshot the engine thread last published.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>

#include "base/clock.h"
#include "testbed/front.h"

namespace tandem::testbed {

// Thread-safety: every member may be called from any thread.
class JobInbox {
 public:
  // HTTP threads: queue a round. kDraining once drain() was called, kBusy
  // while the named session has a round in flight (anonymous rounds never
  // are), else kQueued and the engine thread is woken.
  SubmitStatus submit(std::shared_ptr<Job> job);
  // Stop taking rounds; rounds in flight may finish until `deadline` (the
  // earliest of every call's). Wakes the engine thread.
  void drain(base::Time deadline);

  // Engine thread: moves the queued rounds to the end of `out` and returns
  // the drain deadline (nullopt: not draining).
  std::optional<base::Time> take(std::deque<std::shared_ptr<Job>>& out);
  // Engine thread: sleeps until `wake` (on base::MonotonicClock), a round
  // arrives, or the drain deadline is no longer `seen` (take()'s answer).
  void wait(base::Time wake, std::optional<base::Time> seen);
  // The named session's round is answered: its next may be submitted.
  // Anonymous sessions (empty name) are ignored.
  void round_over(const std::string& name);
  // Fails every queued round with `status` and `message`; returns how many.
  std::size_t fail_queued(int status, const std::string& message);

  // The engine's stats as JSON: what the engine thread last published.
  void publish(std::string stats);
  std::string stats() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queued_;
  std::unordered_set<std::string> in_flight_;  // named sessions with a round in flight
  bool draining_ = false;
  std::optional<base::Time> deadline_;
  std::string stats_;
};

}  // namespace tandem::testbed
