// Time for tandem: one monotonic timeline in nanoseconds, read through a Clock.
//
// `Time` is a point on CLOCK_MONOTONIC (the same timeline in every process on
// a host, so wire timestamps compare across processes); the simulator uses the
// same type for virtual time starting at zero. Code that decides things (sched/)
// never reads a clock: it is handed `now`. Code that must read one takes a
// `const Clock&`, so tests and the simulator drive a VirtualClock.
#pragma once

#include <chrono>
#include <cstdint>

namespace tandem::base {

using Duration = std::chrono::nanoseconds;
using Time = std::chrono::time_point<std::chrono::steady_clock, Duration>;

// Nanoseconds since the clock's origin, as carried in wire records.
constexpr std::int64_t to_ns(Time t) { return t.time_since_epoch().count(); }
constexpr Time from_ns(std::int64_t ns) { return Time(Duration(ns)); }
// Seconds as a double, and back (truncated to whole nanoseconds).
constexpr double to_seconds(Duration d) { return std::chrono::duration<double>(d).count(); }
constexpr Duration from_seconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

// Thread-safety: implementations say.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual Time now() const = 0;
};

// CLOCK_MONOTONIC. Thread-safety: stateless, safe from any thread.
class MonotonicClock final : public Clock {
 public:
  Time now() const override;
};

// Time that moves only when told. Starts at `start` (default 0).
// Thread-safety: none; owned by one thread (tests, the simulator).
class VirtualClock final : public Clock {
 public:
  explicit VirtualClock(Time start = Time{}) : now_(start) {}
  Time now() const override { return now_; }

  // Moves forward by `d` (negative durations are ignored: time never runs back).
  void advance(Duration d) {
    if (d > Duration::zero()) now_ += d;
  }
  // Moves forward to `t`; returns false (and stays) if `t` is in the past.
  bool advance_to(Time t) {
    if (t < now_) return false;
    now_ = t;
    return true;
  }

 private:
  Time now_;
};

}  // namespace tandem::base
