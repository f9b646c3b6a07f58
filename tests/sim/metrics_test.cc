// Metrics: numpy-style percentiles, and every field of compute_metrics against
// arithmetic done by hand on a small set of sessions.
#include "sim/metrics.h"

#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace tandem::sim {
namespace {

constexpr double kEps = 1e-12;

// Every double field, for the "finite everywhere" and "all zero" checks.
std::vector<double> doubles_of(const Metrics& m) {
  return {m.e2e_mean_s,   m.e2e_p50_s,     m.e2e_p90_s,         m.e2e_p99_s,      m.slowdown_mean,
          m.goodput_a1,   m.goodput_a2,    m.goodput_a3,        m.throughput_sps, m.rounds_per_min,
          m.tokens_per_s, m.ttft_mean_s,   m.ttft_p99_s,        m.kv_hit_rate,    m.pinned_block_seconds,
          m.gpu_busy,     m.tool_cpu_util, m.tool_stretch_mean, m.makespan_s};
}

TEST(Percentile, EmptyIsZero) {
  EXPECT_EQ(percentile({}, 0.0), 0.0);
  EXPECT_EQ(percentile({}, 50.0), 0.0);
  EXPECT_EQ(percentile({}, 100.0), 0.0);
}

TEST(Percentile, OneValueIsEveryPercentile) {
  const std::vector<double> v = {7.5};
  EXPECT_EQ(percentile(v, 0.0), 7.5);
  EXPECT_EQ(percentile(v, 50.0), 7.5);
  EXPECT_EQ(percentile(v, 99.0), 7.5);
  EXPECT_EQ(percentile(v, 100.0), 7.5);
}

TEST(Percentile, InterpolatesBetweenClosestRanks) {
  // Unsorted on purpose: percentile sorts a copy.
  const std::vector<double> v = {40.0, 10.0, 30.0, 20.0};
  // Rank (n − 1) · p / 100 = 3p/100.
  EXPECT_NEAR(percentile(v, 50.0), 25.0, kEps);  // rank 1.5
  EXPECT_NEAR(percentile(v, 90.0), 37.0, kEps);  // rank 2.7
  EXPECT_NEAR(percentile(v, 99.0), 39.7, kEps);  // rank 2.97
  EXPECT_NEAR(percentile(v, 100.0 / 3.0), 20.0, kEps);
  const std::vector<double> five = {1, 2, 3, 4, 5};
  EXPECT_NEAR(percentile(five, 99.0), 4.96, kEps);  // numpy.percentile([1..5], 99)
  EXPECT_NEAR(percentile(five, 25.0), 2.0, kEps);   // an exact rank
  EXPECT_EQ(v[0], 40.0) << "the input is not reordered";
}

TEST(Percentile, EndsAreMinAndMax) {
  const std::vector<double> v = {3.0, -1.0, 8.0, 2.0};
  EXPECT_EQ(percentile(v, 0.0), -1.0);
  EXPECT_EQ(percentile(v, 100.0), 8.0);
}

TEST(Percentile, IgnoresNaN) {
  const std::vector<double> v = {std::numeric_limits<double>::quiet_NaN(), 1.0, 3.0};
  EXPECT_NEAR(percentile(v, 50.0), 2.0, kEps);
}

// Four sessions whose E2E are 1, 2, 3 and 5 times their T_ideal — the first
// three exactly on the α = 1, 2, 3 bounds.
std::vector<SessionRecord> four_sessions() {
  return {
      {.arrival_s = 0.0, .finish_s = 10.0, .ideal_s = 10.0, .rounds = 2, .ttft_s = {0.5, 1.5}},
      {.arrival_s = 2.0, .finish_s = 22.0, .ideal_s = 10.0, .rounds = 3, .ttft_s = {1.0, 2.0, 3.0}},
      {.arrival_s = 4.0, .finish_s = 34.0, .ideal_s = 10.0, .rounds = 1, .ttft_s = {4.0}},
      {.arrival_s = 6.0, .finish_s = 46.0, .ideal_s = 8.0, .rounds = 4, .ttft_s = {0.25, 0.25, 0.5, 0.5}},
  };
}

RunCounters some_counters() {
  RunCounters c;
  c.prompt_tokens = 1000;
  c.reused_tokens = 250;
  c.new_tokens = 700;
  c.recomputed_tokens = 77;
  c.computed_tokens = 777;
  c.preemptions = 5;
  c.pinned_block_seconds = 123.5;
  c.gpu_busy_s = 46.0;
  c.engines = 2;
  c.tool_cpu_core_s = 23.0;
  c.tool_cores = 4;
  c.tool_calls = 6;
  c.tool_stretch_sum = 3.0;
  c.tool_stretch_calls = 2;
  c.capped_rounds = 6;
  return c;
}

TEST(ComputeMetrics, EveryFieldByHand) {
  const auto sessions = four_sessions();
  const Metrics m = compute_metrics(sessions, some_counters());

  EXPECT_EQ(m.sessions, 4u);
  // E2E = 10, 20, 30, 40.
  EXPECT_NEAR(m.e2e_mean_s, 25.0, kEps);
  EXPECT_NEAR(m.e2e_p50_s, 25.0, kEps);
  EXPECT_NEAR(m.e2e_p90_s, 37.0, kEps);
  EXPECT_NEAR(m.e2e_p99_s, 39.7, kEps);
  // Slowdowns 1, 2, 3, 5.
  EXPECT_NEAR(m.slowdown_mean, 11.0 / 4.0, kEps);
  // Makespan: first arrival 0 → last finish 46.
  EXPECT_NEAR(m.makespan_s, 46.0, kEps);
  // Boundaries count as met: α=1 {s1}, α=2 {s1, s2}, α=3 {s1, s2, s3}.
  EXPECT_NEAR(m.goodput_a1, 1.0 / 46.0, kEps);
  EXPECT_NEAR(m.goodput_a2, 2.0 / 46.0, kEps);
  EXPECT_NEAR(m.goodput_a3, 3.0 / 46.0, kEps);
  EXPECT_NEAR(m.throughput_sps, 4.0 / 46.0, kEps);
  EXPECT_NEAR(m.rounds_per_min, 10.0 / 46.0 * 60.0, kEps);
  EXPECT_NEAR(m.tokens_per_s, 777.0 / 46.0, kEps);
  // TTFTs sorted: .25 .25 .5 .5 .5 1 1.5 2 3 4 (sum 13.5); p99 at rank 8.91.
  EXPECT_NEAR(m.ttft_mean_s, 1.35, kEps);
  EXPECT_NEAR(m.ttft_p99_s, 3.91, kEps);
  EXPECT_NEAR(m.kv_hit_rate, 0.25, kEps);
  EXPECT_EQ(m.recomputed_tokens, 77u);
  EXPECT_EQ(m.preemptions, 5u);
  EXPECT_NEAR(m.pinned_block_seconds, 123.5, kEps);
  EXPECT_NEAR(m.gpu_busy, 46.0 / (2 * 46.0), kEps);
  EXPECT_NEAR(m.tool_cpu_util, 23.0 / (4 * 46.0), kEps);
  EXPECT_NEAR(m.tool_stretch_mean, 1.5, kEps);
  EXPECT_EQ(m.capped_rounds, 6u);
}

TEST(ComputeMetrics, OrderOfSessionsDoesNotMatter) {
  auto sessions = four_sessions();
  const Metrics a = compute_metrics(sessions, some_counters());
  std::swap(sessions[0], sessions[3]);
  std::swap(sessions[1], sessions[2]);
  const Metrics b = compute_metrics(sessions, some_counters());
  const auto da = doubles_of(a), db = doubles_of(b);
  for (std::size_t i = 0; i < da.size(); ++i) EXPECT_NEAR(da[i], db[i], kEps) << "field " << i;
}

TEST(ComputeMetrics, BoundaryMetDespiteRounding) {
  // 0.4 − 0.1 is 0.30000000000000004 in binary, one ulp above 1 · 0.3; the
  // session is exactly on its SLO and must count.
  const std::vector<SessionRecord> s = {{.arrival_s = 0.1, .finish_s = 0.4, .ideal_s = 0.3, .rounds = 1, .ttft_s = {}}};
  ASSERT_GT(s[0].finish_s - s[0].arrival_s, 0.3);
  const Metrics m = compute_metrics(s, RunCounters{});
  EXPECT_GT(m.goodput_a1, 0.0);
  EXPECT_NEAR(m.goodput_a1, m.throughput_sps, kEps);
}

TEST(ComputeMetrics, JustOverTheBoundIsMissed) {
  const std::vector<SessionRecord> s = {
      {.arrival_s = 0.0, .finish_s = 10.001, .ideal_s = 5.0, .rounds = 1, .ttft_s = {}}};
  const Metrics m = compute_metrics(s, RunCounters{});
  EXPECT_EQ(m.goodput_a1, 0.0);
  EXPECT_EQ(m.goodput_a2, 0.0);
  EXPECT_NEAR(m.goodput_a3, 1.0 / 10.001, kEps);
}

TEST(ComputeMetrics, NoSessionsIsAllZero) {
  const Metrics m = compute_metrics({}, some_counters());
  EXPECT_EQ(m.sessions, 0u);
  for (double v : doubles_of(m)) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(m.recomputed_tokens, 0u);
  EXPECT_EQ(m.preemptions, 0u);
  EXPECT_EQ(m.capped_rounds, 0u);
}

TEST(ComputeMetrics, ZeroMakespanAndEmptyDenominatorsGiveZeroNotNaN) {
  // One session that finishes the instant it arrives; no prompts, no tool
  // calls, no TTFTs, no engines or cores.
  const std::vector<SessionRecord> s = {{.arrival_s = 5.0, .finish_s = 5.0, .ideal_s = 1.0, .rounds = 1, .ttft_s = {}}};
  RunCounters c;
  c.engines = 0;
  c.tool_cores = 0;
  c.gpu_busy_s = 1.0;
  c.tool_cpu_core_s = 1.0;
  const Metrics m = compute_metrics(s, c);
  EXPECT_EQ(m.sessions, 1u);
  for (double v : doubles_of(m)) {
    EXPECT_TRUE(std::isfinite(v));
    EXPECT_EQ(v, 0.0);
  }
}

TEST(ComputeMetrics, NoToolCallsMeansNoStretch) {
  auto c = some_counters();
  c.tool_stretch_sum = 0.0;
  c.tool_stretch_calls = 0;
  c.prompt_tokens = 0;
  c.reused_tokens = 0;
  const Metrics m = compute_metrics(four_sessions(), c);
  EXPECT_EQ(m.tool_stretch_mean, 0.0);
  EXPECT_EQ(m.kv_hit_rate, 0.0);
}

}  // namespace
}  // namespace tandem::sim
