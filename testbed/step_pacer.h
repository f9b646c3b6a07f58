// How long the emulator's engine thread sleeps for each modelled step
// (docs/testbed.md "Pace").
//
// A step of d modelled seconds lasts d / speedup of wall time. The thread
// that waits for its end wakes a little late, by its wake-up latency and
// the loop's own work, and that lateness does not shrink with the speedup:
// at 16× about 0.2 ms a step made the modelled GPU 15 % slower than the
// model. The pacer keeps what the thread owes: the next steps sleep that
// much less, so over a busy stretch the steps' wall time is the model's.
// When the engine goes idle the debt is forgiven, as a real GPU with nothing
// to run would have waited too; what was forgiven is the lateness that
// delayed the model (`unrecovered`).
//
// Thread-safety: one thread (the engine's).
#pragma once

#include <algorithm>

#include "base/clock.h"

namespace tandem::testbed {

class StepPacer {
 public:
  using Duration = base::Duration;

  // The step whose modelled wall time is `real` starts: how long to sleep.
  Duration start(Duration real) {
    const Duration paid = std::clamp(owed_, Duration::zero(), std::max(real, Duration::zero()));
    owed_ -= paid;
    return real - paid;
  }
  // The thread woke `late` after the step's end.
  void woke(Duration late) {
    if (late <= Duration::zero()) return;
    late_ += late;
    owed_ += late;
  }
  // No step to start: the engine waits for work.
  void idle() {
    forgiven_ += owed_;
    owed_ = Duration::zero();
  }

  Duration late() const { return late_; }                     // Σ lateness
  Duration unrecovered() const { return forgiven_ + owed_; }  // of which not made up (yet)

 private:
  Duration late_{};
  Duration owed_{};
  Duration forgiven_{};
};

}  // namespace tandem::testbed
