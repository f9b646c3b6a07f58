// The host plane's memory rules (sched/host_memory.h), which tandemd and
// tandem-sim both run: levels, hysteresis, throttle holds, freezing, the
// stall kill, protection; and tandem's host-memory admission (addition 18).
#include "sched/host_memory.h"

#include <gtest/gtest.h>

#include "sched/tandem.h"

namespace tandem::sched {
namespace {

Time at(std::int64_t ms) { return base::from_ns(ms * 1'000'000); }
constexpr std::uint64_t kMiB = 1ull << 20;

MemoryCall call(SessionId s, std::uint64_t mib) {
  MemoryCall c;
  c.session = s;
  c.call = 1;
  c.memory_bytes = mib * kMiB;
  return c;
}

TEST(HostMemoryRule, NormalPressureLeavesToolsAlone) {
  HostMemoryRule rule({});
  std::vector<MemoryCall> calls{call(1, 100)};
  std::vector<MemoryVerdict> v;
  EXPECT_EQ(rule.decide(at(0), 9.9, 0, calls, v), MemoryLevel::kNormal);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_FALSE(v[0].throttle || v[0].freeze || v[0].kill);
}

TEST(HostMemoryRule, HighThrottlesAtPresentSizeCriticalFreezesLowPriority) {
  HostMemoryRule rule({});
  std::vector<MemoryCall> calls{call(1, 100), call(2, 100), call(3, 100)};
  calls[1].priority_class = 2;
  calls[2].low_priority = true;
  calls[2].limit_high = 50 * kMiB;  // its own limit is tighter than the hold
  std::vector<MemoryVerdict> v;
  EXPECT_EQ(rule.decide(at(0), 10.0, 0, calls, v), MemoryLevel::kHigh);
  EXPECT_TRUE(v[0].throttle);
  EXPECT_EQ(v[0].hold_bytes, 100 * kMiB + HostMemoryRule::kThrottleSlack);
  EXPECT_EQ(v[2].hold_bytes, 50 * kMiB);
  EXPECT_FALSE(v[1].freeze);
  EXPECT_EQ(rule.decide(at(250), 40.0, 0, calls, v), MemoryLevel::kCritical);
  EXPECT_FALSE(v[0].freeze);
  EXPECT_TRUE(v[1].freeze);
  EXPECT_TRUE(v[2].freeze);
}

TEST(HostMemoryRule, BudgetSetsLevelsAndHysteresisHolds) {
  HostMemoryConfig config;
  config.tools_budget = 1000;
  HostMemoryRule rule(config);
  std::vector<MemoryCall> calls{call(1, 1)};
  std::vector<MemoryVerdict> v;
  EXPECT_EQ(rule.decide(at(0), 0, 899, calls, v), MemoryLevel::kNormal);
  EXPECT_EQ(rule.decide(at(1), 0, 900, calls, v), MemoryLevel::kHigh);
  EXPECT_EQ(rule.decide(at(2), 0, 1000, calls, v), MemoryLevel::kCritical);
  // Below "high" but not calm (tools ≥ 80 % of the budget): stays high.
  EXPECT_EQ(rule.decide(at(3), 0, 850, calls, v), MemoryLevel::kHigh);
  EXPECT_EQ(rule.decide(at(4), 0, 800, calls, v), MemoryLevel::kHigh);
  EXPECT_TRUE(v[0].throttle);
  EXPECT_EQ(rule.decide(at(5), 0, 799, calls, v), MemoryLevel::kNormal);
  EXPECT_FALSE(v[0].throttle);
}

// The kernel counts the time a throttled call sleeps in memory.high's penalty
// as a memory stall, so PSI stays up while the rule throttles. Headroom ends
// the level whatever PSI says; afterwards PSI raises it again only once it
// was calm or rises again, not while the throttle's own stall decays.
TEST(HostMemoryRule, TheThrottlesOwnStallDoesNotHoldTheLevel) {
  HostMemoryRule rule({});  // no budget: the mark is what the tools held when pressure rose
  std::vector<MemoryCall> calls{call(1, 100)};
  std::vector<MemoryVerdict> v;
  EXPECT_EQ(rule.decide(at(0), 20, 1000, calls, v), MemoryLevel::kHigh);
  EXPECT_EQ(rule.decide(at(250), 25, 801, calls, v), MemoryLevel::kHigh);
  EXPECT_EQ(rule.decide(at(500), 45, 801, calls, v), MemoryLevel::kCritical);  // pressure still escalates
  // A fifth given back: over, although PSI is still far above "high".
  EXPECT_EQ(rule.decide(at(750), 45, 799, calls, v), MemoryLevel::kNormal);
  EXPECT_FALSE(v[0].throttle || v[0].freeze);
  // PSI decaying from the throttle's stall does not bring it back...
  EXPECT_EQ(rule.decide(at(1000), 30, 1000, calls, v), MemoryLevel::kNormal);
  EXPECT_EQ(rule.decide(at(1250), 12, 1000, calls, v), MemoryLevel::kNormal);
  // ...a new stall does (5 points, half of "high", above its lowest since).
  EXPECT_EQ(rule.decide(at(1500), 16.9, 1000, calls, v), MemoryLevel::kNormal);
  EXPECT_EQ(rule.decide(at(1750), 17, 1000, calls, v), MemoryLevel::kHigh);
  EXPECT_TRUE(v[0].throttle);
  // And so does pressure after it was calm.
  EXPECT_EQ(rule.decide(at(2000), 30, 700, calls, v), MemoryLevel::kNormal);
  EXPECT_EQ(rule.decide(at(2250), 4.9, 700, calls, v), MemoryLevel::kNormal);
  EXPECT_EQ(rule.decide(at(2500), 10, 700, calls, v), MemoryLevel::kHigh);
}

TEST(HostMemoryRule, WithABudgetHeadroomIsJudgedAgainstTheBudgetOrWhatPressureFound) {
  HostMemoryConfig config;
  config.tools_budget = 1000;
  HostMemoryRule rule(config);
  std::vector<MemoryCall> calls{call(1, 1)};
  std::vector<MemoryVerdict> v;
  // The budget reached: critical; PSI fed by the throttle does not hold it
  // once the tools are below 80 % of the budget.
  EXPECT_EQ(rule.decide(at(0), 0, 1000, calls, v), MemoryLevel::kCritical);
  EXPECT_EQ(rule.decide(at(1), 60, 850, calls, v), MemoryLevel::kCritical);
  EXPECT_EQ(rule.decide(at(2), 60, 799, calls, v), MemoryLevel::kNormal);
  // Pressure at half the budget: the mark is what the tools held then.
  EXPECT_EQ(rule.decide(at(3), 4, 500, calls, v), MemoryLevel::kNormal);  // calm: armed again
  EXPECT_EQ(rule.decide(at(4), 20, 500, calls, v), MemoryLevel::kHigh);
  EXPECT_EQ(rule.decide(at(5), 20, 400, calls, v), MemoryLevel::kHigh);
  EXPECT_EQ(rule.decide(at(6), 20, 399, calls, v), MemoryLevel::kNormal);
}

TEST(HostMemoryRule, PinnedSessionsAreNeverThrottledOrFrozen) {
  HostMemoryRule rule({});
  std::vector<MemoryCall> calls{call(1, 100)};
  calls[0].protected_session = true;
  calls[0].priority_class = 3;
  std::vector<MemoryVerdict> v;
  EXPECT_EQ(rule.decide(at(0), 90, 0, calls, v), MemoryLevel::kCritical);
  EXPECT_FALSE(v[0].throttle || v[0].freeze);
}

TEST(HostMemoryRule, StalledTooLongIsKilledOnceAndTheClockStartsOver) {
  HostMemoryRule rule({});  // stall_kill_after 10 s
  std::vector<MemoryCall> calls{call(1, 100)};
  calls[0].stalled = true;
  std::vector<MemoryVerdict> v;
  rule.decide(at(0), 0, 0, calls, v);
  EXPECT_FALSE(v[0].kill);
  EXPECT_EQ(calls[0].stalled_since, at(0));
  rule.decide(at(9999), 0, 0, calls, v);
  EXPECT_FALSE(v[0].kill);
  rule.decide(at(10000), 0, 0, calls, v);
  EXPECT_TRUE(v[0].kill);
  EXPECT_FALSE(calls[0].stalled_since.has_value());
  // Frozen or not stalled: no clock. Not sampled: the clock is kept as is.
  calls[0].stalled_since = at(0);
  calls[0].sampled = false;
  rule.decide(at(20000), 0, 0, calls, v);
  EXPECT_FALSE(v[0].kill);
  EXPECT_EQ(calls[0].stalled_since, at(0));
  calls[0].sampled = true;
  calls[0].frozen = true;
  rule.decide(at(20000), 0, 0, calls, v);
  EXPECT_FALSE(v[0].kill);
  EXPECT_FALSE(calls[0].stalled_since.has_value());
  // An ended call is never killed nor throttled.
  calls[0] = call(1, 100);
  calls[0].stalled = true;
  calls[0].ended = true;
  calls[0].stalled_since = at(0);
  rule.decide(at(30000), 90, 0, calls, v);
  EXPECT_FALSE(v[0].kill || v[0].throttle || v[0].freeze);
}

// Addition 18: tandem's host-memory admission.
struct MemNode {
  NodeModel model;
  MemNode() {
    EngineParams p;
    p.total_blocks = 100000;
    EXPECT_TRUE(model.observe(EngineJoined{1, p}, at(0)));
    KvPoolStats kv;
    kv.blocks_total = 100000;
    kv.blocks_free = 100000;
    EXPECT_TRUE(model.observe(KvStatsReported{1, kv}, at(0)));
    model.set_cpu(CpuView{8, 0, -1, {}});
  }
  void open(SessionId s, Time now) {
    EXPECT_TRUE(model.observe(SessionOpened{s, 0, 4}, now));
    EXPECT_TRUE(model.observe(RoundSubmitted{s, 1, 1, 1000, 0, 70}, now));
  }
  std::size_t admitted(TandemControl& c, Time now) {
    Actions out;
    c.tick(model, now, out);
    std::size_t n = 0;
    for (const Action& a : out.list()) {
      if (a.kind != ActionKind::kAdmit) continue;
      EXPECT_TRUE(model.sessions().transition(a.session, SessionState::kReasoning, now));
      ++n;
    }
    return n;
  }
};

TandemParams host_only(bool on) {
  TandemParams t;
  t.host_admission = on;
  return t;
}

TEST(TandemHostAdmission, WithoutAHostReportNothingChanges) {
  MemNode a, b;
  TandemControl on({}, host_only(true)), off({}, host_only(false));
  for (SessionId s = 1; s <= 10; ++s) {
    a.open(s, at(0));
    b.open(s, at(0));
  }
  EXPECT_EQ(a.admitted(on, at(1)), b.admitted(off, at(1)));
}

TEST(TandemHostAdmission, ProjectedBaselinesAndOneBurstMustFit) {
  MemNode node;
  HostMemoryView mem;
  mem.capacity_bytes = 10000 * kMiB;
  mem.used_bytes = 0;
  mem.session_baseline_bytes = 1000 * kMiB;
  mem.tool_peak_p95_bytes = 4000 * kMiB;
  mem.psi_some_avg10 = 0;
  node.model.set_host_memory(mem);
  for (SessionId s = 1; s <= 10; ++s) node.open(s, at(0));
  TandemControl on({}, host_only(true));
  // 0.9 × 10000 = 9000 MiB: n baselines + 4000 fit for n ≤ 5.
  EXPECT_EQ(node.admitted(on, at(1)), 5u);
  TandemControl off({}, host_only(false));
  MemNode other;
  other.model.set_host_memory(mem);
  for (SessionId s = 1; s <= 10; ++s) other.open(s, at(0));
  EXPECT_EQ(other.admitted(off, at(1)), 10u);
}

TEST(TandemHostAdmission, KillsCutTheWindowAndItRegrowsOnlyUnderTheFit) {
  MemNode node;
  HostMemoryView mem;
  mem.capacity_bytes = 100000 * kMiB;
  mem.session_baseline_bytes = 100 * kMiB;
  mem.psi_some_avg10 = 0;
  node.model.set_host_memory(mem);
  TandemControl c({}, host_only(true));
  (void)node.admitted(c, at(0));
  const double start = c.host_window();
  EXPECT_EQ(start, 30);  // MARS's window ceiling on one engine
  mem.kills = 1;
  node.model.set_host_memory(mem);
  (void)node.admitted(c, at(300));
  EXPECT_EQ(c.host_window(), 21);  // ⌊30 × 0.7⌋
  mem.psi_some_avg10 = 10;
  node.model.set_host_memory(mem);
  (void)node.admitted(c, at(600));
  EXPECT_EQ(c.host_window(), 14);
  mem.psi_some_avg10 = 0;
  node.model.set_host_memory(mem);
  (void)node.admitted(c, at(900));
  EXPECT_EQ(c.host_window(), 15);  // +1: use 0 ≤ host_low
  // Use between host_low and host_high: the soft cap pulls it toward the floor.
  mem.used_bytes = 85000 * kMiB;  // 0.85: 2/3 of the way from 0.75 to 0.9
  node.model.set_host_memory(mem);
  (void)node.admitted(c, at(1200));
  EXPECT_EQ(c.host_window(), 11);  // no cut below host_high, no growth above host_low; round(30 − 2/3 × 29)
}

// host_peaks (off by default, docs/results.md): the projection counts the
// highest use of the last host_mean_s, so a session is not admitted into the
// lull between two tool bursts.
TEST(TandemHostAdmission, WithHostPeaksTheRecentPeakOfUseCounts) {
  HostMemoryView mem;
  mem.capacity_bytes = 10000 * kMiB;
  mem.session_baseline_bytes = 1000 * kMiB;
  mem.tool_peak_p95_bytes = 1000 * kMiB;
  mem.psi_some_avg10 = 0;
  for (bool peaks : {false, true}) {
    SCOPED_TRACE(peaks ? "host_peaks" : "use now");
    TandemParams p = host_only(true);
    p.host_peaks = peaks;
    // 0.9 × 10000 = 9000 MiB: n baselines + 1000 fit for n ≤ 8 on the use
    // now (0), for n ≤ 3 on the burst's 5000 a second ago...
    MemNode node;
    TandemControl c({}, p);
    mem.used_bytes = 5000 * kMiB;
    node.model.set_host_memory(mem);
    (void)node.admitted(c, at(0));
    mem.used_bytes = 0;
    node.model.set_host_memory(mem);
    for (SessionId s = 1; s <= 10; ++s) node.open(s, at(1000));
    EXPECT_EQ(node.admitted(c, at(1000)), peaks ? 3u : 8u);
    // ...and once the burst is older than host_mean_s (30 s), on the use now.
    MemNode later;
    TandemControl c2({}, p);
    mem.used_bytes = 5000 * kMiB;
    later.model.set_host_memory(mem);
    (void)later.admitted(c2, at(0));
    mem.used_bytes = 0;
    later.model.set_host_memory(mem);
    for (SessionId s = 1; s <= 10; ++s) later.open(s, at(30500));
    EXPECT_EQ(later.admitted(c2, at(30500)), 8u);
  }
}

}  // namespace
}  // namespace tandem::sched
