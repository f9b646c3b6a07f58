// The goal check: lowest mean E2E, goodput and throughput at every rate, and
// the ratio at the knee, on hand-built reports.
#include "sim/verdict.h"

#include <gtest/gtest.h>

#include <sstream>

namespace tandem::sim {
namespace {

Run run(std::string policy, double rate, double e2e, double slowdown, double goodput, double throughput,
        std::string variant = "") {
  Run r;
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
  rep.failed = {{"autellix", "", 1, "livelock"}};
  Verdict v = judge(rep);
  ASSERT_EQ(v.points.size(), 1u);
  EXPECT_TRUE(v.points[0].lowest_e2e);
  ASSERT_TRUE(v.knee_rate);
  EXPECT_TRUE(v.knee_met);
}

}  // namespace
}  // namespace tandem::sim
