// Continuum step scheduler: the pin decision (fixed and dynamic TTL), expiry,
// pinned-first program-level FCFS, pins released before preemption, the
// waiting-path rule, determinism. Expectations are computed by hand from
// sched/continuum.h.
#include "sched/continuum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "tests/sched/step_fixture.h"

namespace tandem::sched {
namespace {

using std::chrono::milliseconds;

using test::ms;
using test::req;

struct Step {
  std::vector<StepRequest> reqs;
  std::vector<PinnedKv> pins;
  std::uint32_t free_blocks = 100000;
  std::uint32_t budget = 8192;
  StepInput input() const {
    StepInput in;
    in.token_budget = budget;
    in.free_blocks = free_blocks;
    in.requests = reqs;
    in.pinned = pins;
    return in;
  }
};

StepPlan plan(ContinuumStepScheduler& s, const Step& step, Time now) {
  StepPlan out;
  s.plan(step.input(), now, out);
  return out;
}

RoundEndInfo round_end(SessionId session, ToolKind tool, bool tool_follows = true, std::uint32_t context = 1000) {
  RoundEndInfo info;
  info.session = session;
  info.tool = tool;
  info.tool_follows = tool_follows;
  info.context_tokens = context;
  return info;
}

TEST(ContinuumTest, PinsIffKindMeanAtMostThreshold) {
  ContinuumStepScheduler s;
  s.on_tool_end(1, 7, milliseconds(1500), ms(0));
  s.on_tool_end(2, 8, milliseconds(2500), ms(0));
  // Kind 10: samples 1.0 and 3.0 → mean exactly 2.0 → still pinned (≤).
  s.on_tool_end(3, 10, milliseconds(1000), ms(0));
  s.on_tool_end(3, 10, milliseconds(3000), ms(0));

  KeepPlan k = s.on_round_end(round_end(1, 7), ms(100));
  EXPECT_EQ(k.decision, KeepDecision::kPin);
  EXPECT_EQ(k.until, ms(2100));
  EXPECT_EQ(s.on_round_end(round_end(2, 8), ms(100)).decision, KeepDecision::kRelease);
  EXPECT_EQ(s.on_round_end(round_end(3, 10), ms(100)).decision, KeepDecision::kPin);
  // A kind never observed has mean 0 (the repo's cold start) → pinned; the unknown kind 0 alike.
  EXPECT_EQ(s.on_round_end(round_end(4, 99), ms(100)).decision, KeepDecision::kPin);
  EXPECT_EQ(s.on_round_end(round_end(4, 0), ms(100)).decision, KeepDecision::kPin);
  // The last round is never pinned.
  EXPECT_EQ(s.on_round_end(round_end(5, 7, false), ms(100)).decision, KeepDecision::kRelease);
  // One more slow sample pushes kind 10's mean over 2 s.
  s.on_tool_end(3, 10, milliseconds(2100), ms(0));
  EXPECT_NEAR(s.mean_s(10), 6.1 / 3, 1e-9);
  EXPECT_EQ(s.on_round_end(round_end(3, 10), ms(200)).decision, KeepDecision::kRelease);
}

// A kind is a hash of the `tool` name a request carried: an engine's
// clients naming ever new tools must not grow the scheduler without end. At
// the bound the kinds used longest ago are forgotten and count as never seen.
TEST(ContinuumTest, ToolKindsAreBounded) {
  ContinuumStepScheduler s;
  s.on_tool_end(1, 7, milliseconds(3000), ms(0));
  EXPECT_EQ(s.on_round_end(round_end(1, 7), ms(0)).decision, KeepDecision::kRelease);
  for (ToolKind k = 100; k < 100 + 4 * kMaxToolKinds; ++k) {
    s.on_tool_end(2, k, milliseconds(3000), ms(0));
    ASSERT_LE(s.kinds(), kMaxToolKinds);
  }
  EXPECT_DOUBLE_EQ(s.mean_s(100 + 4 * kMaxToolKinds - 1), 3.0) << "the newest kind is kept";
  EXPECT_DOUBLE_EQ(s.mean_s(7), 0.0) << "the oldest is forgotten";
  EXPECT_EQ(s.on_round_end(round_end(1, 7), ms(0)).decision, KeepDecision::kPin) << "as if never observed";
}

TEST(ContinuumTest, TtlBelowCutoffIsNoPin) {
  ContinuumParams p;
  p.ttl_s = 0.01;  // not > 0.01
  ContinuumStepScheduler s(p);
  EXPECT_EQ(s.on_round_end(round_end(1, 7), ms(0)).decision, KeepDecision::kRelease);
}

TEST(ContinuumTest, ExpiryUnpinsUnlessTheSessionWaits) {
  ContinuumStepScheduler s;
  Step st;
  st.pins = {{1, 10, ms(0), ms(2000)}};
  EXPECT_TRUE(plan(s, st, ms(1999)).unpin.empty());
  EXPECT_EQ(plan(s, st, ms(2000)).unpin, (std::vector<SessionId>{1}));

  // A waiting request of session 1 keeps the expired pin; another session's does not.
  ContinuumStepScheduler s2;
  Step w;
  w.pins = {{1, 10, ms(0), ms(2000)}, {2, 10, ms(0), ms(2000)}};
  // It cannot start (100 blocks; pin 2 frees 10) and something runs, so it keeps waiting.
  w.reqs = {req(6, 3, RequestPhase::kRunning, 10, 10, ms(0)), req(5, 1, RequestPhase::kWaiting, 1600, 0, ms(1500))};
  w.free_blocks = 0;
  StepPlan p = plan(s2, w, ms(2500));
  EXPECT_EQ(p.unpin, (std::vector<SessionId>{2}));
  // Once it runs, the pin (still expired) goes.
  w.pins = {{1, 10, ms(0), ms(2000)}};
  w.reqs = {req(5, 1, RequestPhase::kRunning, 1600, 50, ms(1500))};
  w.free_blocks = 100;
  p = plan(s2, w, ms(2600));
  EXPECT_EQ(p.unpin, (std::vector<SessionId>{1}));
}

TEST(ContinuumTest, OlderPinOfASessionGoesAtItsNextRoundEnd) {
  ContinuumStepScheduler s;
  (void)s.on_round_end(round_end(1, 7), ms(5000));
  Step st;
  st.pins = {{1, 10, ms(1000), ms(9000)}, {2, 10, ms(1000), ms(9000)}};
  EXPECT_EQ(plan(s, st, ms(5001)).unpin, (std::vector<SessionId>{1}));
  // A pin made at that round end is not stale.
  st.pins = {{1, 10, ms(5000), ms(7000)}};
  EXPECT_TRUE(plan(s, st, ms(5002)).unpin.empty());
}

TEST(ContinuumTest, WaitingOrderIsPinnedFirstThenProgramFcfs) {
  ContinuumStepScheduler s;
  // Session 3's program started at 1 (an earlier round), session 4's at 2.
  Step first;
  first.reqs = {req(30, 3, RequestPhase::kRunning, 10, 10, ms(1)), req(40, 4, RequestPhase::kRunning, 10, 10, ms(2))};
  plan(s, first, ms(3));

  Step st;
  st.reqs = {req(10, 1, RequestPhase::kWaiting, 100, 0, ms(0)),    // program 1 at 0, no pin
             req(41, 4, RequestPhase::kWaiting, 100, 0, ms(3)),    // program 4 at 2
             req(20, 2, RequestPhase::kWaiting, 100, 0, ms(5)),    // program 2 at 5, pinned
             req(31, 3, RequestPhase::kWaiting, 100, 0, ms(20))};  // program 3 at 1 (this round arrived last)
  st.pins = {{2, 4, ms(4), ms(100000)}};
  StepPlan p = plan(s, st, ms(30));
  ASSERT_EQ(p.run.size(), 4u);
  EXPECT_EQ(p.run[0].request, 2u);  // pinned session first
  EXPECT_EQ(p.run[1].request, 0u);  // then by program first arrival: 0, 1, 2
  EXPECT_EQ(p.run[2].request, 3u);
  EXPECT_EQ(p.run[3].request, 1u);
}

TEST(ContinuumTest, PinReleasedBeforeTheOnlyRunningRequestIsPreempted) {
  ContinuumStepScheduler s;
  Step st;
  // One running request at a block boundary needs a block; none is free. Two
  // pins: the one with the later end is released, and that is enough.
  st.reqs = {req(1, 1, RequestPhase::kRunning, 100, 160, ms(0))};
  st.pins = {{7, 3, ms(0), ms(9000)}, {8, 2, ms(0), ms(9500)}};
  st.free_blocks = 0;
  StepPlan p = plan(s, st, ms(100));
  EXPECT_EQ(p.unpin, (std::vector<SessionId>{8}));
  EXPECT_TRUE(p.preempt.empty());
  EXPECT_EQ(p.run, (std::vector<ScheduledChunk>{{0, 1}}));
}

TEST(ContinuumTest, PinsReleasedUntilFitThenSelfPreemptWhenNoneLeft) {
  ContinuumStepScheduler s;
  Step st;
  // Needs 10 blocks (160 more tokens); the two pins give 5: both go, then the request itself.
  st.reqs = {req(1, 1, RequestPhase::kRunning, 320, 160, ms(0))};
  st.pins = {{7, 3, ms(0), ms(9000)}, {8, 2, ms(0), ms(9500)}};
  st.free_blocks = 0;
  StepPlan p = plan(s, st, ms(100));
  EXPECT_EQ(p.unpin, (std::vector<SessionId>{8, 7}));
  EXPECT_EQ(p.preempt, (std::vector<std::uint32_t>{0}));
  EXPECT_TRUE(p.run.empty());
}

TEST(ContinuumTest, WithSeveralRunningTheLatestProgramIsPreemptedNotThePin) {
  ContinuumStepScheduler s;
  Step st;
  // Programs: r0 at 0, r1 at 2 (last round), r2 at 1. r0 needs a block: the
  // victim is the latest program not on its last round, r2; the pin stays.
  st.reqs = {req(1, 1, RequestPhase::kRunning, 100, 160, ms(0)),
             req(2, 2, RequestPhase::kRunning, 100, 160, ms(2), /*last_round=*/true),
             req(3, 3, RequestPhase::kRunning, 100, 160, ms(1))};
  st.pins = {{9, 50, ms(0), ms(9000)}};
  st.free_blocks = 0;
  StepPlan p = plan(s, st, ms(100));
  EXPECT_TRUE(p.unpin.empty());
  EXPECT_EQ(p.preempt, (std::vector<std::uint32_t>{2}));
  // r2's 10 blocks feed r0 and r1.
  EXPECT_EQ(p.run, (std::vector<ScheduledChunk>{{0, 1}, {1, 1}}));
}

TEST(ContinuumTest, LastRoundRequestsArePreemptedOnlyWhenNothingElseIs) {
  ContinuumStepScheduler s;
  Step st;
  // Both last-round: the latest program (r1 at 2) pays.
  st.reqs = {req(1, 1, RequestPhase::kRunning, 100, 160, ms(0), true),
             req(2, 2, RequestPhase::kRunning, 100, 160, ms(2), true),
             req(3, 3, RequestPhase::kRunning, 100, 160, ms(1), true)};
  st.free_blocks = 0;
  EXPECT_EQ(plan(s, st, ms(100)).preempt, (std::vector<std::uint32_t>{1}));
}

TEST(ContinuumTest, WaitingHeadBlockedWithNothingRunningFreesOnePin) {
  ContinuumStepScheduler s;
  Step st;
  st.reqs = {req(1, 1, RequestPhase::kWaiting, 1600, 0, ms(0))};  // 100 blocks
  st.pins = {{7, 60, ms(0), ms(9000)}, {8, 60, ms(0), ms(9500)}};
  st.free_blocks = 50;
  StepPlan p = plan(s, st, ms(100));
  EXPECT_EQ(p.unpin, (std::vector<SessionId>{8}));  // one pin, the latest end; the request waits
  EXPECT_TRUE(p.run.empty());
  // With something running the rule does not apply.
  ContinuumStepScheduler s2;
  st.reqs.insert(st.reqs.begin(), req(2, 2, RequestPhase::kRunning, 10, 10, ms(0)));
  p = plan(s2, st, ms(100));
  EXPECT_TRUE(p.unpin.empty());
  EXPECT_EQ(p.run, (std::vector<ScheduledChunk>{{0, 1}}));
}

// Dynamic TTL with min_samples = 3 and T = 0 (nothing preempted), so the
// benefit is reload = 2e-4 s/token × context.
TEST(ContinuumTest, DynamicTtlArgmaxOnHandMadeDurations) {
  ContinuumParams params;
  params.dynamic = true;
  params.min_samples = 3;
  ContinuumStepScheduler s(params);
  EXPECT_EQ(s.name(), "continuum_dy");
  // Cold start: ≤ 3 samples in all → the default 2 s.
  for (int sample_ms : {500, 1000, 1000}) s.on_tool_end(1, 1, milliseconds(sample_ms), ms(0));
  EXPECT_DOUBLE_EQ(s.ttl_for(1, 10000), 2.0);
  s.on_tool_end(1, 1, milliseconds(4000), ms(0));
  // Kind 1 has 4 samples {0.5, 1, 1, 4}. Context 10000 → benefit 2 s:
  //   τ=0: 0;  0.5: .25·2−.5 = 0;  1: .75·2−1 = .5;  4: 2−4 = −2  → τ = 1.
  EXPECT_DOUBLE_EQ(s.ttl_for(1, 10000), 1.0);
  KeepPlan k = s.on_round_end(round_end(1, 1, true, 10000), ms(100));
  EXPECT_EQ(k.decision, KeepDecision::kPin);
  EXPECT_EQ(k.until, ms(1100));
  // Context 5000 → benefit 1 s: every τ > 0 loses; best is τ = 0 with reward 0 → no pin.
  EXPECT_DOUBLE_EQ(s.ttl_for(1, 5000), 0.0);
  EXPECT_EQ(s.on_round_end(round_end(1, 1, true, 5000), ms(100)).decision, KeepDecision::kRelease);
  // Kind 2 has one sample (≤ 3) → all 5 samples {0.1, 0.5, 1, 1, 4}; benefit 1 s:
  //   0.1: .2−.1 = .1;  0.5: .4−.5;  1: .8−1;  4: 1−4  → τ = 0.1.
  s.on_tool_end(2, 2, milliseconds(100), ms(0));
  EXPECT_DOUBLE_EQ(s.ttl_for(2, 5000), 0.1);
  // Kind 1 still uses its own 4 samples.
  EXPECT_DOUBLE_EQ(s.ttl_for(1, 10000), 1.0);
}

// The dynamic TTL looks only at the newest sample_window durations, per
// kind and in all, and is the argmax the header defines over them: checked
// against a brute-force argmax over the last samples after every one of many
// observations, with ties (durations in whole 100 ms) and zeros.
TEST(ContinuumTest, DynamicTtlIsTheArgmaxOverTheNewestSamples) {
  ContinuumParams params;
  params.dynamic = true;
  params.min_samples = 3;
  params.sample_window = 7;
  ContinuumStepScheduler s(params);
  // The header's rule over `records` (any order), written out.
  auto argmax = [](std::vector<double> records, double base) {
    double best_tau = 0;
    double best = -1e300;
    std::vector<double> taus = records;
    taus.push_back(0.0);
    std::sort(taus.begin(), taus.end());
    for (double tau : taus) {
      const auto le = std::count_if(records.begin(), records.end(), [&](double d) { return d <= tau; });
      const double reward = static_cast<double>(le) / static_cast<double>(records.size()) * base - tau;
      if (reward > best) {
        best = reward;
        best_tau = tau;
      }
    }
    return best <= 0 ? 0.0 : best_tau;
  };
  std::vector<double> all;
  std::vector<std::vector<double>> by_kind(2);
  std::uint64_t x = 99;
  auto next = [&] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::uint32_t>(x >> 33);
  };
  for (int i = 0; i < 500; ++i) {
    const ToolKind kind = next() % 3 == 0 ? 1 : 0;
    const int tenths = static_cast<int>(next() % 30);
    s.on_tool_end(1, kind, milliseconds(100 * tenths), ms(0));
    all.push_back(tenths / 10.0);
    by_kind[kind].push_back(tenths / 10.0);
    auto newest = [&](const std::vector<double>& v) {
      return std::vector<double>(v.end() - static_cast<std::ptrdiff_t>(std::min<std::size_t>(v.size(), 7)), v.end());
    };
    for (ToolKind k : {ToolKind{0}, ToolKind{1}}) {
      for (std::uint32_t context : {2000u, 10000u, 20000u}) {
        const double base = 2e-4 * context;
        double want = params.ttl_s;
        if (all.size() > params.min_samples) {
          want = argmax(newest(by_kind[k].size() > params.min_samples ? by_kind[k] : all), base);
        }
        ASSERT_DOUBLE_EQ(s.ttl_for(k, context), want)
            << "observation " << i << ", kind " << k << ", context " << context;
      }
    }
  }
}

TEST(ContinuumTest, DynamicQueueDelayAndEta) {
  ContinuumParams params;
  params.dynamic = true;
  ContinuumStepScheduler s(params);
  EXPECT_DOUBLE_EQ(s.eta(), 1.0);
  EXPECT_DOUBLE_EQ(s.queue_delay_s(), 0.0);
  // r1 alone needs a block with none free and no pin → preempted at 1 s; rescheduled at 1.5 s.
  Step st;
  st.reqs = {req(1, 1, RequestPhase::kRunning, 100, 160, ms(0))};
  st.free_blocks = 0;
  EXPECT_EQ(plan(s, st, ms(1000)).preempt, (std::vector<std::uint32_t>{0}));
  st.reqs = {req(1, 1, RequestPhase::kPreempted, 100, 0, ms(0))};
  st.free_blocks = 100;
  EXPECT_EQ(plan(s, st, ms(1500)).run.size(), 1u);
  EXPECT_DOUBLE_EQ(s.queue_delay_s(), 0.5);
  // η over finished programs: two programs of 2 and 3 rounds give (k, N−k) =
  // (0,2), (1,1), (0,3), (1,2), (2,1). x = k, y = N−k: Pearson(x, y) computed by hand:
  //   n=5, Σx=4, Σy=9, Σx²=6, Σy²=19, Σxy=5 → num = 25−36 = −11,
  //   den_x = 30−16 = 14, den_y = 95−81 = 14 → corr = −11/14 → η = 11/14.
  auto round = [&](std::uint64_t id, SessionId sess, bool last, std::int64_t t) {
    Step x;
    x.reqs = {req(id, sess, RequestPhase::kWaiting, 10, 0, ms(t))};
    plan(s, x, ms(t));
    (void)s.on_round_end(round_end(sess, 1, !last), ms(t));
  };
  round(10, 5, false, 2000);
  round(11, 5, true, 2001);
  round(20, 6, false, 2002);
  round(21, 6, false, 2003);
  round(22, 6, true, 2004);
  EXPECT_NEAR(s.eta(), 11.0 / 14.0, 1e-12);
}

TEST(ContinuumTest, ParamsFromRegistrySpecs) {
  auto params = PolicyParams::create("continuum", kContinuumParams, {{"continuum_dy", 1.0}, {"min_samples", 5.0}});
  ASSERT_TRUE(params.has_value());
  ContinuumParams c = continuum_params(*params);
  EXPECT_TRUE(c.dynamic);
  EXPECT_EQ(c.min_samples, 5u);
  EXPECT_DOUBLE_EQ(c.ttl_s, 2.0);
  EXPECT_DOUBLE_EQ(c.threshold_s, 2.0);
  EXPECT_DOUBLE_EQ(c.reload_s_per_token, 2e-4);
  EXPECT_EQ(make_continuum_step(*params)->name(), "continuum_dy");
}

TEST(ContinuumTest, Deterministic) {
  auto run = [](bool dynamic) {
    ContinuumParams params;
    params.dynamic = dynamic;
    params.min_samples = 5;
    ContinuumStepScheduler s(params);
    std::vector<StepPlan> plans;
    std::vector<KeepPlan> keeps;
    std::uint64_t x = 777;
    auto next = [&] {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      return static_cast<std::uint32_t>(x >> 33);
    };
    for (int step = 0; step < 200; ++step) {
      s.on_tool_end(1 + next() % 5, next() % 4, milliseconds(next() % 5000), ms(step));
      keeps.push_back(s.on_round_end(round_end(1 + next() % 5, next() % 4, next() % 4 != 0, next() % 20000), ms(step)));
      Step st;
      const std::uint32_t n = 1 + next() % 8;
      for (std::uint32_t i = 0; i < n; ++i) {
        const bool running = next() % 2 == 0;
        const std::uint32_t prompt = 1 + next() % 5000;
        st.reqs.push_back(req(next() % 20, 1 + next() % 5, running ? RequestPhase::kRunning : RequestPhase::kWaiting,
                              prompt, running ? next() % (prompt + 50) : 0, ms(next() % 1000), next() % 3 == 0));
      }
      std::partition(st.reqs.begin(), st.reqs.end(),
                     [](const StepRequest& r) { return r.phase == RequestPhase::kRunning; });
      for (std::uint32_t k = next() % 3; k > 0; --k) {
        st.pins.push_back({1 + next() % 5, next() % 50, ms(next() % 200), ms(next() % 4000)});
      }
      st.free_blocks = next() % 400;
      StepPlan p;
      s.plan(st.input(), ms(step * 20), p);
      plans.push_back(p);
    }
    return std::pair(plans, keeps);
  };
  for (bool dynamic : {false, true}) {
    const auto a = run(dynamic);
    const auto b = run(dynamic);
    for (std::size_t i = 0; i < a.first.size(); ++i) {
      EXPECT_EQ(a.first[i].run, b.first[i].run) << i;
      EXPECT_EQ(a.first[i].preempt, b.first[i].preempt) << i;
      EXPECT_EQ(a.first[i].unpin, b.first[i].unpin) << i;
      EXPECT_EQ(a.second[i].decision, b.second[i].decision) << i;
      EXPECT_EQ(a.second[i].until, b.second[i].until) << i;
    }
  }
}

}  // namespace
}  // namespace tandem::sched
