// MonotonicClock.
#include "base/clock.h"

#include <time.h>

namespace tandem::base {

Time MonotonicClock::now() const {
  timespec ts;
  // CLOCK_MONOTONIC cannot fail with a valid pointer; it goes through the vDSO.
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return from_ns(static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec);
}

}  // namespace tandem::base
