// The goal check: lowest mean E2E, goodput and throughput at every rate, and
// the ratio at the knee, on hand-built reports.
#include "sim/verdict.h"

#include <gtest/gtest.h>

#include <sstream>

namespace tandem::sim {
namespace {

Run run(std::string policy, double rate, double e2e, double slowdown, double goodput, double throughput,
        std::string variant = "", std::uint64_t seed = 1) {
  Run r;
  r.seed = seed;
  r.policy = std::move(policy);
  r.variant = std::move(variant);
  r.rate = rate;
  r.metrics.e2e_mean_s = e2e;
  r.metrics.slowdown_mean = slowdown;
  r.metrics.goodput_a3 = goodput;
  r.metrics.throughput_sps = throughput;
  return r;
}

TEST(Verdict, FindsTheKneeOfTheBestOtherPolicyAndTheRatioThere) {
  Report rep;
  rep.runs = {run("fcfs", 1, 100, 1.2, 0.9, 1.0),    run("tandem", 1, 99, 1.1, 0.9, 1.0),
              run("fcfs", 2, 400, 4.0, 0.5, 1.9),    run("mars", 2, 300, 3.5, 0.6, 1.9),
              run("tandem", 2, 150, 1.5, 1.8, 1.95), run("tandem", 2, 90, 1.0, 2.0, 2.0, "-residency")};
  Verdict v = judge(rep);
  ASSERT_EQ(v.points.size(), 2u);
  EXPECT_EQ(v.points[1].best_other, "mars");
  EXPECT_DOUBLE_EQ(v.points[1].e2e_ratio, 2.0);
  ASSERT_TRUE(v.knee_rate);
  EXPECT_EQ(*v.knee_rate, 2.0);
  EXPECT_TRUE(v.knee_met);
  EXPECT_TRUE(v.lowest_everywhere) << "ablation variants are not competitors";
  EXPECT_TRUE(v.goodput_everywhere);
  EXPECT_TRUE(v.throughput_everywhere);
}

TEST(Verdict, ShortfallsAreReportedAndTiesAreNot) {
  Report rep;
  rep.runs = {run("fcfs", 1, 100, 1.0, 1.0, 1.0), run("tandem", 1, 100.05, 1.0, 0.9995, 1.0),
              run("fcfs", 2, 200, 2.0, 1.0, 2.0), run("tandem", 2, 210, 2.1, 0.9, 1.9)};
  Verdict v = judge(rep);
  EXPECT_TRUE(v.points[0].lowest_e2e) << "within 0.1 % is a tie";
  EXPECT_TRUE(v.points[0].goodput_ok);
  EXPECT_FALSE(v.points[1].lowest_e2e);
  EXPECT_FALSE(v.points[1].goodput_ok);
  EXPECT_FALSE(v.points[1].throughput_ok) << "1.9 < 0.97 x 2.0";
  EXPECT_FALSE(v.lowest_everywhere);
  EXPECT_FALSE(v.knee_rate) << "nobody's slowdown exceeded 3";
  EXPECT_FALSE(v.knee_met);
  std::ostringstream os;
  print_verdict(os, v);
  EXPECT_NE(os.str().find("short of the goal"), std::string::npos);
  EXPECT_NE(os.str().find("knee not reached"), std::string::npos);
}

TEST(Verdict, AFailedRunIsInfinitelySlow) {
  Report rep;
  rep.runs = {run("tandem", 1, 500, 5.0, 0.1, 1.0)};
  rep.failed = {{"autellix", "", 1, 1, "livelock"}};
  Verdict v = judge(rep);
  ASSERT_EQ(v.points.size(), 1u);
  EXPECT_TRUE(v.points[0].lowest_e2e);
  ASSERT_TRUE(v.knee_rate);
  EXPECT_TRUE(v.knee_met);
}

TEST(Verdict, SeedsAreAveragedAndTheRatioHasAnInterval) {
  Report rep;
  // Seed 1: tandem 100 vs fcfs 200 (2x); seed 2: 100 vs 400 (4x).
  rep.runs = {run("fcfs", 1, 200, 4, 0.5, 1, "", 1), run("tandem", 1, 100, 2, 0.9, 1, "", 1),
              run("fcfs", 1, 400, 8, 0.3, 1, "", 2), run("tandem", 1, 100, 2, 0.9, 1, "", 2)};
  Verdict v = judge(rep);
  EXPECT_EQ(v.seeds, 2u);
  ASSERT_EQ(v.points.size(), 1u);
  const VerdictPoint& p = v.points[0];
  EXPECT_EQ(p.seeds, 2u);
  EXPECT_DOUBLE_EQ(p.best_other_e2e.mean, 300);
  EXPECT_DOUBLE_EQ(p.e2e_ratio, 3.0) << "ratio of the means";
  EXPECT_DOUBLE_EQ(p.seed_ratio.mean, 3.0);
  // Two values 2 and 4: sd = sqrt(2), t(1) = 12.706, half = 12.706 * sqrt(2) / sqrt(2).
  EXPECT_NEAR(p.seed_ratio.half, 12.706, 1e-9);
  ASSERT_TRUE(v.knee_rate);
  EXPECT_TRUE(v.knee_met);
}

TEST(Verdict, AnIntervalTieCountsOnlyAtLightLoad) {
  // tandem is 1 % slower on the mean, but the seeds disagree on the sign.
  auto make = [](double slowdown) {
    Report rep;
    rep.runs = {run("fcfs", 1, 100, slowdown, 1, 1, "", 1), run("tandem", 1, 104, slowdown, 1, 1, "", 1),
                run("fcfs", 1, 100, slowdown, 1, 1, "", 2), run("tandem", 1, 98, slowdown, 1, 1, "", 2),
                run("fcfs", 1, 100, slowdown, 1, 1, "", 3), run("tandem", 1, 101, slowdown, 1, 1, "", 3)};
    return judge(rep);
  };
  Verdict light = make(1.2);
  EXPECT_TRUE(light.points[0].lowest_e2e);
  EXPECT_TRUE(light.points[0].e2e_tie_by_interval);
  Verdict loaded = make(2.0);
  EXPECT_FALSE(loaded.points[0].lowest_e2e) << "above light load the mean must be lower";
  EXPECT_FALSE(loaded.lowest_everywhere);
}

TEST(Verdict, OursFailingAtOneSeedFailsThePoint) {
  Report rep;
  rep.runs = {run("fcfs", 1, 100, 1, 1, 1, "", 1), run("tandem", 1, 50, 1, 1, 1, "", 1),
              run("fcfs", 1, 100, 1, 1, 1, "", 2)};
  rep.failed = {{"tandem", "", 1, 2, "livelock"}};
  Verdict v = judge(rep);
  ASSERT_EQ(v.points.size(), 1u);
  EXPECT_TRUE(v.points[0].ours_failed);
  EXPECT_FALSE(v.points[0].lowest_e2e);
  EXPECT_FALSE(v.lowest_everywhere);
  std::ostringstream os;
  print_verdict(os, v);
  EXPECT_NE(os.str().find("FAILED"), std::string::npos) << os.str();
}

}  // namespace
}  // namespace tandem::sim
