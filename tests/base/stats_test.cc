// base/stats.h: numpy's linear percentile, NaN ignored, empty sets, summaries.
#include "base/stats.h"

#include <cmath>
#include <cstdint>
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

TEST(Stats, SummaryHoldsThePercentilesExtremesAndMean) {
  std::vector<double> ten;
  for (int i = 10; i >= 1; --i) ten.push_back(i);  // descending on purpose
  const Summary s = summarize(ten);
  EXPECT_EQ(s.count, 10u);
  EXPECT_DOUBLE_EQ(s.p50, 5.5);
  EXPECT_DOUBLE_EQ(s.p90, 9.1);  // numpy.percentile(range(1, 11), 90)
  EXPECT_DOUBLE_EQ(s.p99, 9.91);
  EXPECT_DOUBLE_EQ(s.min, 1.0);
  EXPECT_DOUBLE_EQ(s.max, 10.0);
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  // A skewed set tells the mean from the median.
  const Summary skew = summarize(std::vector<double>{1, 1, 1, 1, 16});
  EXPECT_DOUBLE_EQ(skew.p50, 1.0);
  EXPECT_DOUBLE_EQ(skew.mean, 4.0);
  EXPECT_DOUBLE_EQ(skew.max, 16.0);
}

TEST(Stats, SummaryLeavesNanOutAndIsZeroWhenEmpty) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Summary s = summarize(std::vector<double>{nan, 2, 4, nan});
  EXPECT_EQ(s.count, 2u);
  EXPECT_DOUBLE_EQ(s.p50, 3.0);
  EXPECT_DOUBLE_EQ(s.min, 2.0);
  EXPECT_DOUBLE_EQ(s.mean, 3.0);
  for (const Summary& e : {summarize(std::vector<double>{}), summarize(std::vector<double>{nan}),
                           summarize_ns_as_us(std::vector<std::int64_t>{})}) {
    EXPECT_EQ(e.count, 0u);
    EXPECT_EQ(e.p50, 0.0);
    EXPECT_EQ(e.p99, 0.0);
    EXPECT_EQ(e.max, 0.0);
    EXPECT_EQ(e.mean, 0.0);
  }
}

TEST(Stats, NanosecondSamplesAreSummarisedInMicroseconds) {
  const std::vector<std::int64_t> ns = {3'000, 1'500, 2'000'000, 500};
  const Summary s = summarize_ns_as_us(ns);
  EXPECT_EQ(s.count, 4u);
  EXPECT_DOUBLE_EQ(s.min, 0.5);
  EXPECT_DOUBLE_EQ(s.p50, 2.25);  // between 1.5 and 3 µs
  EXPECT_DOUBLE_EQ(s.max, 2000.0);
  EXPECT_DOUBLE_EQ(s.mean, (0.5 + 1.5 + 3.0 + 2000.0) / 4);
  EXPECT_DOUBLE_EQ(s.p99, percentile(std::vector<double>{0.5, 1.5, 3.0, 2000.0}, 99));
}

}  // namespace
}  // namespace tandem::base
