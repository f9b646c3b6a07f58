// Weighted processor sharing: stretch under contention, weights, quotas.
#include "sim/cpu_pool.h"

#include <gtest/gtest.h>

#include <chrono>

namespace tandem::sim {
namespace {

using base::Time;

Time at(double s) { return Time(std::chrono::duration_cast<base::Duration>(std::chrono::duration<double>(s))); }
double secs(Time t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }

// Runs the pool to completion; returns each tool's end time.
std::map<std::uint64_t, double> drain(CpuPool& pool) {
  std::map<std::uint64_t, double> ends;
  while (auto t = pool.next_completion()) {
    for (std::uint64_t id : pool.complete(*t)) ends[id] = secs(*t);
  }
  return ends;
}

TEST(CpuPool, UncontendedToolTakesItsNominalTime) {
  CpuPool pool(4);
  pool.start(1, 10, 1.0, 2.0, at(0));
  pool.start(2, 11, 0.05, 5.0, at(0));
  auto ends = drain(pool);
  EXPECT_NEAR(ends[1], 2.0, 1e-6);
  EXPECT_NEAR(ends[2], 5.0, 1e-6);
  EXPECT_NEAR(pool.core_seconds(), 2.0 + 0.25, 1e-6);
}

TEST(CpuPool, ContendedToolsStretchByDemandOverShare) {
  // Two 1-core tools of 2 s on one core: each gets half, both end at 4 s.
  CpuPool pool(1);
  pool.start(1, 10, 1.0, 2.0, at(0));
  pool.start(2, 11, 1.0, 2.0, at(0));
  auto ends = drain(pool);
  EXPECT_NEAR(ends[1], 4.0, 1e-6);
  EXPECT_NEAR(ends[2], 4.0, 1e-6);
}

TEST(CpuPool, LightToolsKeepTheirDemandWhileHeavyOnesShareTheRest) {
  // 2 cores; an I/O tool wanting 0.2 and two 1-core tools: water-filling
  // gives 0.2 to the light one and 0.9 to each heavy one.
  CpuPool pool(2);
  pool.start(1, 10, 0.2, 1.0, at(0));
  pool.start(2, 11, 1.0, 0.9, at(0));
  pool.start(3, 12, 1.0, 0.9, at(0));
  auto ends = drain(pool);
  EXPECT_NEAR(ends[1], 1.0, 1e-6);
  EXPECT_NEAR(ends[2], 1.0, 1e-6);  // 0.9 s of work at 0.9 cores
  EXPECT_NEAR(ends[3], 1.0, 1e-6);
}

TEST(CpuPool, WeightsSplitContendedCores) {
  // One core, weights 300 : 100 → shares 0.75 : 0.25. Tool 1 (1.5 s of work)
  // ends at 2 s; tool 2 has done 0.5 s by then and finishes alone at 2.5 s.
  CpuPool pool(1);
  pool.set_weight(10, 300, at(0));
  pool.start(1, 10, 1.0, 1.5, at(0));
  pool.start(2, 11, 1.0, 1.0, at(0));
  auto ends = drain(pool);
  EXPECT_NEAR(ends[1], 2.0, 1e-6);
  EXPECT_NEAR(ends[2], 2.5, 1e-6);
}

TEST(CpuPool, QuotaCapsAToolEvenWhenCoresAreFree) {
  CpuPool pool(8);
  pool.set_quota(10, 0.5, at(0));
  pool.start(1, 10, 1.0, 1.0, at(0));
  EXPECT_NEAR(secs(*pool.next_completion()), 2.0, 1e-6);
}

TEST(CpuPool, StopEndsAToolAndReleasesItsShare) {
  CpuPool pool(1);
  pool.start(1, 10, 1.0, 10.0, at(0));
  pool.start(2, 11, 1.0, 1.0, at(0));
  EXPECT_TRUE(pool.stop(1, at(1)));  // tool 2 had 0.5 s done
  EXPECT_FALSE(pool.stop(1, at(1)));
  auto ends = drain(pool);
  EXPECT_NEAR(ends[2], 1.5, 1e-6);
}

TEST(CpuPool, PressureRisesOnlyUnderContention) {
  CpuPool pool(1);
  pool.start(1, 10, 0.5, 20.0, at(0));
  pool.complete(at(10));
  EXPECT_EQ(pool.pressure_avg10(), 0.0);
  pool.start(2, 11, 1.0, 20.0, at(10));
  pool.complete(at(20));
  EXPECT_GT(pool.pressure_avg10(), 50.0);
}

}  // namespace
}  // namespace tandem::sim
