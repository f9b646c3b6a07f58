// Weighted processor sharing: stretch under contention, weights, quotas.
#include "sim/cpu_pool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <optional>
#include <vector>

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

TEST(CpuPool, StartPhaseAddsItsCpuUncontended) {
  // A 0.1-core tool of 1 s with a 0.05 CPU-second start: 0.05 s at one core,
  // then its body, so it ends at 1.05 s and used 0.05 + 0.1 core-seconds.
  CpuPool pool(4);
  pool.start(1, 10, 0.1, 1.0, at(0), 0.05);
  EXPECT_EQ(pool.progress(1, at(0.04)), 0.0);  // no progress while it starts
  auto ends = drain(pool);
  EXPECT_NEAR(ends[1], 1.05, 1e-6);
  EXPECT_NEAR(pool.core_seconds(), 0.15, 1e-6);
}

TEST(CpuPool, StartPhaseWaitsBehindBusyToolsAtAWholeCoresDemand) {
  // One core, three 1-core tools running long. A light tool (0.1 core) with
  // a 0.1 CPU-second start competes as a fourth whole-core task while it
  // starts: a quarter of the core, so its start takes 0.4 s. Then its body
  // wants only 0.1 core, which water-filling grants in full: 1 s more.
  // Without the start phase it would have ended at 1 s, unstretched.
  CpuPool pool(1);
  for (std::uint64_t id = 1; id <= 3; ++id) pool.start(id, 10 + id, 1.0, 100.0, at(0));
  pool.start(9, 19, 0.1, 1.0, at(0), 0.1);
  std::optional<double> end;
  double start_wall = -1;
  while (auto t = pool.next_completion()) {
    std::vector<double> start_walls;
    const auto done = pool.complete(*t, &start_walls);
    ASSERT_EQ(done.size(), start_walls.size());
    for (std::size_t i = 0; i < done.size(); ++i) {
      if (done[i] != 9) continue;
      end = secs(*t);
      start_wall = start_walls[i];
    }
    if (end) break;
  }
  ASSERT_TRUE(end.has_value());
  EXPECT_NEAR(*end, 1.4, 1e-6);
  EXPECT_NEAR(start_wall, 0.4, 1e-6);  // the wait for its start, which the call's run excludes
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
