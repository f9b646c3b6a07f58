// ToolDurationModel: the prior alone, the data taking over, the conditional
// question residency rules ask, and the sample window.
#include "sched/tool_model.h"

#include <cmath>
#include <cstdint>
#include <deque>
#include <random>

#include <gtest/gtest.h>

namespace tandem::sched {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(ToolModel, UnseenKindFollowsThePrior) {
  ToolDurationModel m;  // median 0.08 s
  EXPECT_NEAR(m.cdf(1, milliseconds(80)), 0.5, 1e-9);
  EXPECT_NEAR(m.cdf(1, milliseconds(0)), 0.0, 1e-12);
  // sigma 2: x = median · e^2 is one sigma up → Φ(1) = 0.8413.
  EXPECT_NEAR(m.cdf(1, std::chrono::nanoseconds(static_cast<std::int64_t>(0.08e9 * std::exp(2.0)))), 0.8413, 1e-3);
  EXPECT_EQ(m.samples(1), 0u);
}

TEST(ToolModel, DataOutweighsThePriorAsItGrows) {
  ToolDurationModel m(ToolModelParams{0.08, 2.0, 4.0, 256});
  for (int i = 0; i < 36; ++i) m.observe(7, seconds(10));  // pytest-like: always 10 s
  // F(5 s) = (36·0 + 4·Φ((ln 5 − ln 0.08)/2)) / 40
  double prior = 0.5 * std::erfc(-((std::log(5.0) - std::log(0.08)) / 2.0) / std::sqrt(2.0));
  EXPECT_NEAR(m.cdf(7, seconds(5)), 4.0 * prior / 40.0, 1e-9);
  EXPECT_GT(m.cdf(7, seconds(11)), 0.95);
  EXPECT_NEAR(m.mean_s(7), (360.0 + 4.0 * 0.08 * std::exp(2.0)) / 40.0, 1e-9);
}

TEST(ToolModel, ConditionalReturnProbability) {
  ToolDurationModel m(ToolModelParams{0.08, 2.0, 0.0001, 256});  // essentially data-only
  for (int i = 1; i <= 10; ++i) m.observe(3, seconds(i));        // 1..10 s, uniform
  // Running for 5 s: 5 of 10 samples left (6..10); within 2 more s: 6 and 7.
  EXPECT_NEAR(m.p_return_within(3, seconds(5), seconds(2)), 0.4, 1e-3);
  // Just started: 3 of 10 finish within 3 s.
  EXPECT_NEAR(m.p_return_within(3, seconds(0), seconds(3)), 0.3, 1e-3);
  // Past every sample only the heavy-tailed prior is left, and it says an
  // overdue call is unlikely to return soon — what a residency rule should
  // hear about a tool that has run 10× longer than any seen.
  EXPECT_LT(m.p_return_within(3, seconds(100), seconds(1)), 0.05);
}

TEST(ToolModel, APooledPriorJudgesAnUnseenKindByEveryToolSeen) {
  ToolDurationModel m;
  for (int i = 0; i < 100; ++i) m.observe(7, seconds(10));  // every tool on this node takes 10 s
  // Kind 9 was never seen. The dev traces' log-normal says it is most likely done in 5 s
  // (Φ((ln 5 − ln 0.08)/2) ≈ 0.98); the pool says almost surely not.
  const double lognormal = 0.5 * std::erfc(-((std::log(5.0) - std::log(0.08)) / 2.0) / std::sqrt(2.0));
  EXPECT_NEAR(m.cdf(9, seconds(5)), lognormal, 1e-9);
  EXPECT_NEAR(m.cdf(9, seconds(5), true), 4.0 * lognormal / 104.0, 1e-9) << "(100 · 0 + 4 · prior) / 104";
  EXPECT_GT(m.p_return_within(9, seconds(0), seconds(1)), 0.85);
  EXPECT_LT(m.p_return_within(9, seconds(0), seconds(1), true), 0.05);
  EXPECT_NEAR(m.mean_s(9, true), (1000.0 + 4 * 0.08 * std::exp(2.0)) / 104.0, 1e-9);
}

TEST(ToolModel, ExpectedRemainingTime) {
  ToolDurationModel m(ToolModelParams{0.08, 2.0, 0.0001, 256, 0});  // essentially data-only
  for (int i = 1; i <= 10; ++i) m.observe(3, seconds(i));           // 1..10 s
  // Just started: the mean, 5.5 s; after 5 s, 6..10 are left: 8 − 5 = 3 s.
  EXPECT_NEAR(m.remaining_s(3, seconds(0), 100), 5.5, 0.1);
  EXPECT_NEAR(m.remaining_s(3, seconds(5), 100), 3.0, 0.1);
  EXPECT_NEAR(m.remaining_s(3, seconds(0), 2), 1.9, 0.05) << "E[min(T, 2)] = 1 + 0.9";
}

TEST(ToolModel, WindowForgetsOldSamples) {
  ToolDurationModel m(ToolModelParams{0.08, 2.0, 0.0001, 4});
  for (int i = 0; i < 4; ++i) m.observe(5, seconds(100));
  for (int i = 0; i < 4; ++i) m.observe(5, milliseconds(10));
  EXPECT_EQ(m.samples(5), 4u);
  EXPECT_GT(m.cdf(5, seconds(1)), 0.999) << "the 100 s samples aged out";
}

// The window's sorted samples are kept by replacing the oldest in place
// (sched/tool_model.cc): after every observation the empirical CDF must be
// exactly that of the last `window` samples, ties (many equal durations)
// and all, for the kind and for the pool.
TEST(ToolModel, TheWindowIsExactlyTheLastSamplesAfterEveryObservation) {
  constexpr std::size_t kWindow = 7;
  constexpr std::size_t kPool = 11;
  // Data-only for the kind (no prior weight); the pool is read through an
  // unseen kind with one pseudo-sample of prior.
  ToolDurationModel data(ToolModelParams{0.08, 2.0, 0.0, kWindow, kPool});
  ToolDurationModel pooled(ToolModelParams{0.08, 2.0, 1.0, kWindow, kPool});
  std::mt19937_64 rng(20261128);
  std::deque<double> kind_ref;
  std::deque<double> pool_ref;
  auto cdf_of = [](const std::deque<double>& ref, double x) {
    std::size_t n = 0;
    for (double v : ref) n += v <= x ? 1 : 0;
    return static_cast<double>(n) / static_cast<double>(ref.size());
  };
  const double probes[] = {0.0, 0.0005, 0.001, 0.0015, 0.002, 0.0025, 0.003, 0.004, 0.005, 1.0};
  for (int i = 0; i < 2000; ++i) {
    // Durations from a few values (ties, equal neighbours) or anywhere in between.
    const std::int64_t us =
        rng() % 3 == 0 ? static_cast<std::int64_t>(rng() % 5000) : static_cast<std::int64_t>(1000 * (rng() % 5));
    const auto wall = std::chrono::microseconds(us);
    data.observe(9, wall);
    pooled.observe(9, wall);
    const double s = static_cast<double>(us) / 1e6;
    kind_ref.push_back(s);
    if (kind_ref.size() > kWindow) kind_ref.pop_front();
    pool_ref.push_back(s);
    if (pool_ref.size() > kPool) pool_ref.pop_front();
    for (double x : probes) {
      const auto at = std::chrono::nanoseconds(static_cast<std::int64_t>(x * 1e9));
      ASSERT_EQ(data.cdf(9, at), cdf_of(kind_ref, x)) << "observation " << i << ", x = " << x;
      // An unseen kind: F = (n·pool + 1·log-normal) / (n + 1), n = the pool's size.
      const double n = static_cast<double>(pool_ref.size());
      const double expected = (n * cdf_of(pool_ref, x) + pooled.cdf(8, at, false)) / (n + 1.0);
      ASSERT_DOUBLE_EQ(pooled.cdf(8, at, true), expected) << "observation " << i << ", x = " << x;
    }
  }
  EXPECT_EQ(data.samples(9), kWindow);
}

// A kind is a hash of a name a client chose: a client reporting calls of
// ever new kinds must not grow the model (tandemd's) without end. At the
// bound the quarter observed longest ago is forgotten; the pool keeps their
// calls.
TEST(ToolModel, KindsAreBoundedAndTheLongestUnobservedAreForgottenFirst) {
  ToolModelParams p;
  p.max_kinds = 8;
  ToolDurationModel m(p);
  for (ToolKind k = 1; k <= 8; ++k) m.observe(k, seconds(10));
  m.observe(1, seconds(10));  // kind 1 is now the most recently observed
  EXPECT_EQ(m.kinds(), 8u);
  m.observe(9, seconds(10));
  EXPECT_EQ(m.kinds(), 7u) << "8 at the bound, a quarter (2) forgotten, the new one added";
  EXPECT_EQ(m.samples(2), 0u);
  EXPECT_EQ(m.samples(3), 0u);
  EXPECT_EQ(m.samples(1), 2u) << "observed recently: kept";
  EXPECT_EQ(m.samples(4), 1u);
  EXPECT_EQ(m.samples(9), 1u);
  EXPECT_DOUBLE_EQ(m.cdf(2, seconds(1)), m.cdf(1000, seconds(1))) << "a forgotten kind is answered as an unseen one";
  // Ten thousand new kinds: the table never passes its bound, and every call
  // is still in the pool (all ran 10 s, so an unseen kind's pooled CDF at 5 s
  // is only the log-normal's weight).
  for (ToolKind k = 100; k < 10'100; ++k) {
    m.observe(k, seconds(10));
    ASSERT_LE(m.kinds(), 8u);
  }
  EXPECT_EQ(m.samples(10'099), 1u);
  EXPECT_LT(m.cdf(424242, seconds(5), true), 0.01);
}

// In tandemd each runner's uid owns its kinds: a principal naming ever new
// tools forgets its own kinds at the bound, not those of principals that
// hold fewer; between owners that all flood, the bound is shared out evenly.
TEST(ToolModel, AtTheBoundTheOwnerHoldingTheMostForgets) {
  ToolModelParams p;
  p.max_kinds = 16;
  ToolDurationModel m(p);
  for (ToolKind k = 1; k <= 3; ++k) m.observe(k, seconds(10), 1);  // the honest user's three tools, used long ago
  for (ToolKind k = 100; k < 10'100; ++k) {
    m.observe(k, seconds(10), 7);
    ASSERT_LE(m.kinds(), 16u);
  }
  EXPECT_EQ(m.kinds_of(1), 3u);
  for (ToolKind k = 1; k <= 3; ++k) EXPECT_EQ(m.samples(k), 1u) << "kind " << k;
  EXPECT_EQ(m.samples(10'099), 1u);
  EXPECT_EQ(m.samples(100), 0u);
  // A second flooder: the two end up holding half each, and the honest
  // user's kinds are still never the ones forgotten.
  for (ToolKind k = 20'000; k < 21'000; ++k) m.observe(k, seconds(10), 8);
  EXPECT_EQ(m.kinds_of(1), 3u);
  EXPECT_LE(m.kinds_of(7) > m.kinds_of(8) ? m.kinds_of(7) - m.kinds_of(8) : m.kinds_of(8) - m.kinds_of(7), 2u);
  EXPECT_EQ(m.kinds_of(7) + m.kinds_of(8) + 3, m.kinds());
}

}  // namespace
}  // namespace tandem::sched
