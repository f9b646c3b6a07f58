// Clocks: the monotonic clock moves forward; the virtual clock only when told.
#include "base/clock.h"

#include <time.h>

#include <gtest/gtest.h>

namespace tandem::base {
namespace {

using namespace std::chrono_literals;

TEST(MonotonicClock, MatchesClockMonotonicAndNeverGoesBack) {
  MonotonicClock clock;
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  std::int64_t before = static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  Time t1 = clock.now();
  Time t2 = clock.now();
  EXPECT_GE(to_ns(t1), before);
  EXPECT_GE(t2, t1);
}

TEST(VirtualClock, MovesOnlyWhenTold) {
  VirtualClock clock;
  EXPECT_EQ(to_ns(clock.now()), 0);
  clock.advance(5ms);
  EXPECT_EQ(clock.now(), from_ns(5'000'000));
  clock.advance(-1s);  // ignored
  EXPECT_EQ(clock.now(), from_ns(5'000'000));
  EXPECT_TRUE(clock.advance_to(from_ns(7'000'000)));
  EXPECT_FALSE(clock.advance_to(from_ns(1)));
  EXPECT_EQ(clock.now(), from_ns(7'000'000));
}

TEST(VirtualClock, UsableThroughTheInterface) {
  VirtualClock v(from_ns(100));
  const Clock& c = v;
  EXPECT_EQ(to_ns(c.now()), 100);
}

}  // namespace
}  // namespace tandem::base
