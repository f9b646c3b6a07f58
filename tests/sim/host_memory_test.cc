// Host memory in tandem-sim: the per-kind demands and their draws, the shape
// of a call's memory, PSI, and the node: plentiful memory changes nothing,
// an over-capacity burst is OOM-killed and run again, the host rule throttles.
#include "sim/host_memory.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string_view>

#include "sim/node.h"
#include "tests/sim/fixtures.h"

namespace tandem::sim {
namespace {

TEST(ToolMemTable, DefaultsCarryAgentCgroupsP95s) {
  ToolMemTable t;
  // P95 of the peak = median · e^(1.6449 σ).
  auto p95 = [&](std::string_view kind) { return t.dist(kind).median_mib * std::exp(1.6449 * t.dist(kind).sigma); };
  EXPECT_NEAR(p95("pytest"), 518, 1e-9);
  EXPECT_NEAR(p95("pip"), 233, 1e-9);
  // Means for file exploration (4.5 MB) and git (13.5 MB): median · e^(σ²/2).
  auto mean = [&](std::string_view kind) {
    return t.dist(kind).median_mib * std::exp(t.dist(kind).sigma * t.dist(kind).sigma / 2);
  };
  EXPECT_NEAR(mean("Read"), 4.5, 1e-9);
  EXPECT_NEAR(mean("git"), 13.5, 1e-9);
  EXPECT_EQ(t.dist("human").median_mib, 0);
  EXPECT_NEAR(p95("no-such-kind"), 233, 1e-9);
}

TEST(ToolMemTable, ApplyOverridesAndRejectsAtomically) {
  ToolMemTable t;
  ASSERT_TRUE(t.apply("pytest=1000:0.5,*=10"));
  EXPECT_NEAR(t.dist("pytest").median_mib * std::exp(1.6449 * 0.5), 1000, 1e-9);
  EXPECT_NEAR(t.dist("unknown").median_mib * std::exp(1.6449 * 1.2), 10, 1e-9);
  const double before = t.dist("pip").median_mib;
  EXPECT_FALSE(t.apply("pip=5,bad"));
  EXPECT_FALSE(t.apply("pip=-1"));
  EXPECT_FALSE(t.apply("pip=5:9"));
  EXPECT_EQ(t.dist("pip").median_mib, before);
}

TEST(ToolMemTable, DrawsAreDeterministicAndMatchTheDistribution) {
  ToolMemTable t;
  EXPECT_EQ(t.draw("pytest", 42, 10).peak_bytes, t.draw("pytest", 42, 10).peak_bytes);
  std::vector<double> peaks;
  for (std::uint64_t k = 0; k < 20000; ++k) {
    const ToolMemDraw d = t.draw("pytest", mix64(k), 10);
    peaks.push_back(d.peak_bytes);
    EXPECT_GE(d.ramp_s, 0.25);
    EXPECT_LE(d.ramp_s, 1.0);
    EXPECT_GE(d.start_s, 0.0);
    EXPECT_LE(d.start_s + d.ramp_s, 10.0);
    EXPECT_GE(d.burst_s, 1.0);
    EXPECT_LE(d.burst_s, 2.0);
  }
  std::sort(peaks.begin(), peaks.end());
  EXPECT_NEAR(peaks[19000] / 1e6, 518, 518 * 0.05);  // the P95, within sampling error
  // A short call reaches its peak by half its time.
  EXPECT_LE(t.draw("Read", 7, 0.1).ramp_s, 0.05);
}

TEST(ToolMemory, WorkingSetThenOneBurst) {
  ToolMemDraw d{1000, 2.0, 0.5, 1.5};  // burst: ramp over [2, 2.5], peak until 4
  EXPECT_EQ(tool_memory_at(d, 0), 250);
  EXPECT_FALSE(tool_memory_growing(d, 1.9));
  EXPECT_EQ(tool_memory_at(d, 2.25), 625);
  EXPECT_TRUE(tool_memory_growing(d, 2.25));
  EXPECT_EQ(tool_memory_at(d, 2.5), 1000);
  EXPECT_FALSE(tool_memory_growing(d, 2.5));
  EXPECT_EQ(tool_memory_at(d, 3.99), 1000);
  EXPECT_EQ(tool_memory_at(d, 4.0), 1000 * kResidualShare);
}

TEST(HostPsi, SomeAndFullAsTheKernelDefinesThem) {
  HostPsi p;
  p.advance(1, 1, 2);  // one of two stalled: some, not full
  p.advance(2, 2, 2);  // both: some and full
  p.advance(3, 0, 2);
  p.advance(4, 0, 0);  // idle: neither
  EXPECT_DOUBLE_EQ(p.some_total_s(), 3);
  EXPECT_DOUBLE_EQ(p.full_total_s(), 2);
  HostPsi q;
  q.advance(10, 1, 1);
  EXPECT_NEAR(q.some_avg10(), 100 * (1 - std::exp(-1.0)), 1e-9);
  // A run compressed 10x sees the kernel's 10 s as 100 s of its own time.
  HostPsi slow(100);
  slow.advance(10, 1, 1);
  EXPECT_NEAR(slow.some_avg10(), 100 * (1 - std::exp(-0.1)), 1e-9);
  EXPECT_DOUBLE_EQ(slow.some_total_s(), 10);
}

SessionSpec one_tool_session(std::string name, double arrival, const std::string& tool, double tool_s) {
  SessionSpec s;
  s.name = std::move(name);
  s.arrival_s = arrival;
  RoundSpec a;
  a.input_tokens = 1000;
  a.output_tokens = 10;
  a.tool = tool;
  a.tool_seconds = tool_s;
  RoundSpec b;
  b.input_tokens = 1200;
  b.output_tokens = 10;
  s.rounds = {a, b};
  return s;
}

// The fixtures' node with one engine.
SimConfig config(std::string policy) {
  SimConfig c = fixtures::config(std::move(policy));
  c.engines = 1;
  return c;
}

// `c`: fcfs on a 1 GiB host (1073.7 MB) with host memory modelled, each
// admitted session holding `session_mib`, tool peaks as `peaks`
// (ToolMemTable::apply). Call under ASSERT_NO_FATAL_FAILURE.
void one_gib_host(SimConfig& c, double session_mib, std::string_view peaks) {
  c = config("fcfs");
  c.tool_mem = true;
  c.session_mem_mib = session_mib;
  c.host_mem_gib = 1;
  ASSERT_TRUE(c.tool_mem_table.apply(peaks)) << peaks;
}

TEST(NodeHostMemory, PlentifulMemoryChangesNothing) {
  Workload w;
  for (int i = 0; i < 6; ++i) w.sessions.push_back(one_tool_session("s" + std::to_string(i), i * 0.5, "pytest", 3));
  for (const char* policy : {"fcfs", "mars", "tandem"}) {
    SimConfig off = config(policy);
    SimConfig on = off;
    on.tool_mem = true;
    on.host_rules = "all";
    const auto ideal = ideal_times(w, off);
    auto a = simulate(w, off, ideal);
    auto b = simulate(w, on, ideal);
    ASSERT_TRUE(a && b);
    EXPECT_FALSE(a->counters.host_memory);
    EXPECT_TRUE(b->counters.host_memory);
    EXPECT_EQ(b->counters.oom_kills, 0u);
    EXPECT_EQ(b->counters.throttles, 0u);
    EXPECT_GT(b->counters.host_mem_peak_bytes, 0);
    for (std::size_t i = 0; i < w.sessions.size(); ++i) {
      EXPECT_NEAR(a->sessions[i].finish_s, b->sessions[i].finish_s, 1e-6) << policy;
    }
  }
}

TEST(NodeHostMemory, ABurstAboveCapacityIsKilledAndRunAgain) {
  Workload w;
  w.sessions.push_back(one_tool_session("big", 0, "pytest", 4));
  // Every attempt peaks at 2 GB (σ 0) on a 1 GiB node: it never fits.
  SimConfig c;
  ASSERT_NO_FATAL_FAILURE(one_gib_host(c, 0, "pytest=2000:0"));
  c.retry_delay_s = 5;
  const auto ideal = ideal_times(w, c);
  c.stall_s = 60;  // it can never fit: the run must fail, not spin
  auto r = simulate(w, c, ideal);
  EXPECT_FALSE(r);

  // Half the calls' peaks fit: the killed call is run again with a fresh draw.
  // Median 1073.7 MB (P95 = median · e^(1.6449 · 0.6079) = 2919 MB): half the attempts fit.
  SimConfig d;
  ASSERT_NO_FATAL_FAILURE(one_gib_host(d, 0, "pytest=2919:0.6079"));
  Workload many;
  for (int i = 0; i < 8; ++i)
    many.sessions.push_back(one_tool_session("s" + std::to_string(i), i * 100.0, "pytest", 4));
  auto ok = simulate(many, d, ideal_times(many, d));
  ASSERT_TRUE(ok) << ok.error().context();
  EXPECT_GT(ok->counters.oom_kills, 0u);
  // One session at a time and no baselines: every kill is of a call whose
  // own peak is above the whole host.
  EXPECT_EQ(ok->counters.oom_kills_over_host, ok->counters.oom_kills);
  EXPECT_EQ(ok->counters.oom_kills_over_room, 0u);
  EXPECT_GT(ok->counters.rerun_tool_s, 0);
  EXPECT_LE(ok->counters.host_mem_peak_bytes, 1073741824.0);
  double stretched = 0;
  for (const auto& t : ok->tool_calls) stretched = std::max(stretched, t.wall_s / t.nominal_s);
  EXPECT_GT(stretched, 1.0 + 5.0 / 4.0);  // a killed call took its retry delay and ran again
}

TEST(NodeHostMemory, ACapHoldsEveryPeakBelowIt) {
  // The call that never fits (2 GB on a 1 GiB node) fits once no peak may
  // pass 900 MiB: nothing is killed, and the host never holds more.
  Workload w;
  w.sessions.push_back(one_tool_session("big", 0, "pytest", 4));
  SimConfig c;
  ASSERT_NO_FATAL_FAILURE(one_gib_host(c, 0, "pytest=2000:0"));
  c.tool_mem_cap_mib = 900;
  auto r = simulate(w, c, ideal_times(w, c));
  ASSERT_TRUE(r) << r.error().context();
  EXPECT_EQ(r->counters.oom_kills, 0u);
  EXPECT_NEAR(r->counters.host_mem_peak_bytes, 900.0 * 1048576, 1.0);
}

TEST(NodeHostMemory, ByDefaultNoPeakPassesTheLargestAgentCgroupMeasured) {
  // An 8,000 MB draw on a 16 GiB host: held at 4,096 MiB unless the cap is
  // lifted (0), which lets it through whole.
  Workload w;
  w.sessions.push_back(one_tool_session("big", 0, "pytest", 4));
  SimConfig c;
  ASSERT_NO_FATAL_FAILURE(one_gib_host(c, 0, "pytest=8000:0"));
  c.host_mem_gib = 16;
  EXPECT_EQ(c.tool_mem_cap_mib, kToolMemCapMib);
  auto capped = simulate(w, c, ideal_times(w, c));
  ASSERT_TRUE(capped) << capped.error().context();
  EXPECT_NEAR(capped->counters.host_mem_peak_bytes, kToolMemCapMib * 1048576, 1.0);
  c.tool_mem_cap_mib = 0;
  auto whole = simulate(w, c, ideal_times(w, c));
  ASSERT_TRUE(whole) << whole.error().context();
  EXPECT_NEAR(whole->counters.host_mem_peak_bytes, 8000e6, 1.0);
  EXPECT_EQ(capped_peak(5e9, 0), 5e9);
  EXPECT_EQ(capped_peak(5e9, 1000), 1000.0 * 1048576);
  EXPECT_EQ(capped_peak(1e6, 1000), 1e6);
}

// Twelve sessions, one at a time, each with one 4 s pytest whose peak is a
// median 672 MB against a 700 MiB budget: about half the calls pass the
// 90 % (660 MB) at which the rules throttle, on their way to the peak.
Workload twelve_pytests() {
  Workload many;
  for (int i = 0; i < 12; ++i)
    many.sessions.push_back(one_tool_session("s" + std::to_string(i), i * 100.0, "pytest", 4));
  return many;
}
void rules_near_the_budget(SimConfig& c) {
  ASSERT_NO_FATAL_FAILURE(one_gib_host(c, 0, "pytest=1100:0.3"));
  c.host_rules = "all";
  c.tools_budget_mib = 700;
  c.host_rule_config.stall_kill_after = std::chrono::seconds(3);
}

// cgroup v1 (SimConfig::memory_v1): the rules' throttle is a hard limit
// with the OOM killer off, so a call that outgrows it waits (speed 0) and
// the rules' stall kill takes it; PSI does not count the wait. On v2 the
// same throttle slows the call in reclaim, PSI counts it, and the stall
// kill never fires. Sessions one at a time, so PSI some is one call's stall.
TEST(NodeHostMemory, OnV1AThrottledCallWaitsAtItsLimitAndIsStallKilled) {
  const Workload many = twelve_pytests();
  RunCounters runs[2];
  for (const bool v1 : {false, true}) {
    SimConfig c;
    ASSERT_NO_FATAL_FAILURE(rules_near_the_budget(c));
    c.memory_v1 = v1;
    auto r = simulate(many, c, ideal_times(many, c));
    ASSERT_TRUE(r) << r.error().context();
    runs[v1 ? 1 : 0] = r->counters;
  }
  const RunCounters& v2 = runs[0];
  const RunCounters& v1 = runs[1];
  EXPECT_GT(v2.throttles, 0u);
  EXPECT_EQ(v2.memory_kills, 0u) << "v2: no per-call stall, no stall kill";
  EXPECT_NEAR(v2.mem_psi_some_s, v2.throttled_s, 1e-6) << "v2: PSI counts every stall";
  EXPECT_GT(v1.memory_kills, 0u) << "v1: a call waiting at its limit is stall-killed";
  EXPECT_LT(v1.mem_psi_some_s + 1.0, v1.throttled_s) << "v1: PSI misses the waits";
}

// SimConfig::host_period_s: the rules decide only when the host plane
// samples (tandemd: every 250 ms of wall time, C times that in a compressed
// run's trace time). The v1 workload above, with the rules sampling every
// tick, every 2 s, and once an hour (only at the start, before any tool).
TEST(NodeHostMemory, TheRulesDecideOnlyWhenTheHostPlaneSamples) {
  const Workload many = twelve_pytests();
  std::vector<RunCounters> runs;
  for (const double period : {0.0, 2.0, 3600.0}) {
    SimConfig c;
    ASSERT_NO_FATAL_FAILURE(rules_near_the_budget(c));
    c.memory_v1 = true;
    c.host_period_s = period;
    auto r = simulate(many, c, ideal_times(many, c));
    ASSERT_TRUE(r) << r.error().context();
    runs.push_back(r->counters);
  }
  EXPECT_GT(runs[0].throttles, 0u);
  EXPECT_GT(runs[1].throttles, 0u);
  EXPECT_NE(runs[1].throttled_s, runs[0].throttled_s) << "a 2 s period moves when calls are held and let go";
  EXPECT_EQ(runs[2].throttles, 0u) << "never sampled while a tool ran: never throttled";
  EXPECT_EQ(runs[2].memory_kills, 0u);
  EXPECT_EQ(runs[2].throttled_s, 0);

  SimConfig bad;
  ASSERT_NO_FATAL_FAILURE(one_gib_host(bad, 0, "pytest=1100:0.3"));
  bad.host_period_s = -1;
  auto r = simulate(many, bad, ideal_times(many, bad));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().context().find("sampling period"), std::string::npos) << r.error().context();
  bad.host_period_s = 0;
  bad.psi_window_s = 0;
  r = simulate(many, bad, ideal_times(many, bad));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().context().find("PSI"), std::string::npos) << r.error().context();
}

TEST(NodeHostMemory, KillsAreCountedByWhatTheVictimsPeakExceeds) {
  // A 1 GiB node (1073.7 MB) whose one admitted session holds a 400 MiB
  // baseline: 654 MB of room. The calls peak at a median of 653.7 MB (P95
  // 908 MB, σ 0.2): about half exceed the room, almost none the host.
  SimConfig d;
  ASSERT_NO_FATAL_FAILURE(one_gib_host(d, 400, "pytest=908:0.2"));
  Workload many;
  for (int i = 0; i < 8; ++i)
    many.sessions.push_back(one_tool_session("s" + std::to_string(i), i * 100.0, "pytest", 4));
  auto ok = simulate(many, d, ideal_times(many, d));
  ASSERT_TRUE(ok) << ok.error().context();
  EXPECT_GT(ok->counters.oom_kills_over_room, 0u);
  // One session at a time: no kill is the other tools' doing.
  EXPECT_EQ(ok->counters.oom_kills_over_room + ok->counters.oom_kills_over_host, ok->counters.oom_kills);
}

}  // namespace
}  // namespace tandem::sim
