// base/stats.h: numpy's linear percentile, NaN ignored, empty sets.
#include "base/stats.h"

#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace tandem::base {
namespace {

TEST(Stats, PercentileInterpolatesLinearlyAsNumpy) {
  const std::vector<double> v = {4, 1, 3, 2};  // unsorted on purpose
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4.0);
  std::vector<double> ten;
  for (int i = 1; i <= 10; ++i) ten.push_back(i);
  EXPECT_DOUBLE_EQ(percentile(ten, 90), 9.1);  // numpy.percentile(range(1, 11), 90)
  EXPECT_DOUBLE_EQ(percentile(ten, 99), 9.91);
}

TEST(Stats, MedianOfOddAndEvenSets) {
  EXPECT_DOUBLE_EQ(median(std::vector<double>{5, 1, 3}), 3.0);
  EXPECT_DOUBLE_EQ(median(std::vector<double>{5, 1, 3, 7}), 4.0);
}

TEST(Stats, NanIsIgnoredAndEmptyIsZero) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_DOUBLE_EQ(percentile(std::vector<double>{nan, 2, nan, 4}, 50), 3.0);
  EXPECT_EQ(percentile(std::vector<double>{}, 50), 0.0);
  EXPECT_EQ(percentile(std::vector<double>{nan}, 50), 0.0);
  EXPECT_EQ(sorted_finite(std::vector<double>{3, nan, 1}), (std::vector<double>{1, 3}));
}

}  // namespace
}  // namespace tandem::base
