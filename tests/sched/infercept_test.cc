// InferCept step scheduler: the preserve / discard / swap choice on both
// sides of each waste boundary, the MARS-repo preserve TTL, FCFS steps with
// the last running request as victim, pin housekeeping, determinism.
// Expectations are computed by hand from sched/infercept.h.
#include "sched/infercept.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <utility>
#include <vector>

#include "tests/sched/step_fixture.h"

namespace tandem::sched {
namespace {

using std::chrono::milliseconds;

using test::ms;
using test::req;

RoundEndInfo round_end(SessionId session, ToolKind tool, std::uint32_t context, std::uint32_t other = 0,
                       bool tool_follows = true) {
  RoundEndInfo info;
  info.session = session;
  info.tool = tool;
  info.tool_follows = tool_follows;
  info.context_tokens = context;
  info.other_running_tokens = other;
  return info;
}

std::int64_t ns_after(Time until, Time now) { return (until - now).count(); }

// Defaults, C = 2000, C_o = 0:
//   W_d = 2e-4·2000 · 2000 / 2 = 400;  TTL = 400 / 2000 = 0.2 s
//   W_s = 2 · 4e-5·(2000 − 640) · 2000 = 217.6
//   W_p = T · 2000: preserve iff T ≤ 0.1088 s, else swap.
TEST(InferceptTest, WasteFormulas) {
  InferceptStepScheduler s;
  InferceptWaste w = s.waste(2000, 0, 0.1);
  EXPECT_NEAR(w.preserve, 200, 1e-9);
  EXPECT_NEAR(w.discard, 400, 1e-9);
  EXPECT_NEAR(w.swap, 217.6, 1e-9);
  EXPECT_NEAR(w.ttl_s, 0.2, 1e-12);
  // The MARS repo's TTL: 1e-4 · (C + C_o) s.
  EXPECT_NEAR(s.waste(2000, 3000, 0).ttl_s, 0.5, 1e-12);
  EXPECT_NEAR(s.waste(300, 700, 0).ttl_s, 0.1, 1e-12);
  // Below the free-swap tokens, swapping costs nothing.
  EXPECT_EQ(s.waste(640, 100, 1).swap, 0.0);
}

TEST(InferceptTest, ShortToolPreservesLongToolSwaps) {
  InferceptStepScheduler s;
  s.on_tool_end(1, 1, milliseconds(100), ms(0));  // W_p = 200 ≤ 217.6
  s.on_tool_end(1, 2, milliseconds(110), ms(0));  // W_p = 220 > 217.6
  KeepPlan k = s.on_round_end(round_end(1, 1, 2000), ms(1000));
  EXPECT_EQ(k.decision, KeepDecision::kPin);
  EXPECT_NEAR(static_cast<double>(ns_after(k.until, ms(1000))), 0.2e9, 1e3);
  EXPECT_EQ(s.on_round_end(round_end(1, 2, 2000), ms(1000)).decision, KeepDecision::kOffload);
  // A long tool: still swap, the cheapest with the default constants.
  s.on_tool_end(1, 3, milliseconds(30000), ms(0));
  EXPECT_EQ(s.on_round_end(round_end(1, 3, 2000), ms(1000)).decision, KeepDecision::kOffload);
}

// Tool kinds are names clients chose: bounded, the longest unused forgotten
// (then their T is 0 again, as for a kind never seen).
TEST(InferceptTest, ToolKindsAreBounded) {
  InferceptStepScheduler s;
  s.on_tool_end(1, 2, milliseconds(110), ms(0));
  EXPECT_EQ(s.on_round_end(round_end(1, 2, 2000), ms(1000)).decision, KeepDecision::kOffload);
  for (ToolKind k = 100; k < 100 + 4 * kMaxToolKinds; ++k) {
    s.on_tool_end(1, k, milliseconds(110), ms(0));
    ASSERT_LE(s.kinds(), kMaxToolKinds);
  }
  EXPECT_NEAR(s.mean_s(100 + 4 * kMaxToolKinds - 1), 0.11, 1e-12);
  EXPECT_EQ(s.mean_s(2), 0.0);
  EXPECT_EQ(s.on_round_end(round_end(1, 2, 2000), ms(1000)).decision, KeepDecision::kPin);
}

TEST(InferceptTest, WithoutSwapLongToolDiscards) {
  InferceptParams p;
  p.swap = false;
  InferceptStepScheduler s(p);
  s.on_tool_end(1, 1, milliseconds(190), ms(0));  // W_p = 380 ≤ W_d = 400
  s.on_tool_end(1, 2, milliseconds(210), ms(0));  // W_p = 420 > 400
  s.on_tool_end(1, 3, milliseconds(110), ms(0));  // swapped above; preserved here
  EXPECT_EQ(s.on_round_end(round_end(1, 1, 2000), ms(0)).decision, KeepDecision::kPin);
  EXPECT_EQ(s.on_round_end(round_end(1, 2, 2000), ms(0)).decision, KeepDecision::kDrop);
  EXPECT_EQ(s.on_round_end(round_end(1, 3, 2000), ms(0)).decision, KeepDecision::kPin);
}

TEST(InferceptTest, FixedModesAreInferceptsBaselines) {
  // api_policy D, P and S: the same decision at every tool call, whatever the wastes.
  const auto decide = [](int mode, double tool_ms) {
    InferceptParams p;
    p.mode = mode;
    InferceptStepScheduler s(p);
    s.on_tool_end(1, 1, milliseconds(static_cast<std::int64_t>(tool_ms)), ms(0));
    return s.on_round_end(round_end(1, 1, 2000), ms(1000));
  };
  EXPECT_EQ(decide(1, 10).decision, KeepDecision::kDrop);
  EXPECT_EQ(decide(1, 60000).decision, KeepDecision::kDrop);
  const KeepPlan pin = decide(2, 60000);
  EXPECT_EQ(pin.decision, KeepDecision::kPin);
  EXPECT_NEAR(static_cast<double>(ns_after(pin.until, ms(1000))), 0.2e9, 1e3) << "the min-waste policy's TTL";
  EXPECT_EQ(decide(3, 10).decision, KeepDecision::kOffload);
  EXPECT_EQ(decide(0, 10).decision, KeepDecision::kPin) << "mode 0 is the min-waste choice";
}

TEST(InferceptTest, DearSwapLetsDiscardWin) {
  InferceptParams p;
  p.swap_s_per_token = 1e-4;  // W_s = 2·1e-4·1360·2000 = 544 > W_d = 400
  InferceptStepScheduler s(p);
  s.on_tool_end(1, 1, milliseconds(250), ms(0));  // W_p = 500
  s.on_tool_end(1, 2, milliseconds(300), ms(0));  // W_p = 600
  EXPECT_EQ(s.on_round_end(round_end(1, 1, 2000), ms(0)).decision, KeepDecision::kDrop);
  EXPECT_EQ(s.on_round_end(round_end(1, 2, 2000), ms(0)).decision, KeepDecision::kDrop);
  // A 0.15 s tool: W_p = 300 < W_d = 400 < W_s = 544 → preserve.
  s.on_tool_end(1, 3, milliseconds(150), ms(0));
  EXPECT_EQ(s.on_round_end(round_end(1, 3, 2000), ms(0)).decision, KeepDecision::kPin);
}

TEST(InferceptTest, SmallContextSwapsForFreeUnlessToolTimeIsUnknown) {
  InferceptStepScheduler s;
  // C = 500 < 640: W_s = 0. An unseen kind has T = 0 → W_p = 0 → preserve (ties go to preserve),
  // TTL = 1e-4·(500 + 500) = 0.1 s.
  KeepPlan k = s.on_round_end(round_end(1, 42, 500, 500), ms(0));
  EXPECT_EQ(k.decision, KeepDecision::kPin);
  EXPECT_NEAR(static_cast<double>(ns_after(k.until, ms(0))), 0.1e9, 1e3);
  s.on_tool_end(1, 5, milliseconds(10), ms(0));
  EXPECT_EQ(s.on_round_end(round_end(1, 5, 500, 500), ms(0)).decision, KeepDecision::kOffload);
}

TEST(InferceptTest, ShortTtlReleasesAndNoToolReleases) {
  InferceptStepScheduler s;
  // TTL = 1e-4 · 50 = 0.005 s ≤ 0.01 s → release to the prefix cache, as the repo does.
  EXPECT_EQ(s.on_round_end(round_end(1, 1, 50), ms(0)).decision, KeepDecision::kRelease);
  // TTL = 1e-4 · 101 = 0.0101 s > 0.01 s → pin.
  EXPECT_EQ(s.on_round_end(round_end(1, 1, 101), ms(0)).decision, KeepDecision::kPin);
  EXPECT_EQ(s.on_round_end(round_end(1, 1, 2000, 0, false), ms(0)).decision, KeepDecision::kRelease);
  EXPECT_EQ(s.on_round_end(round_end(1, 1, 0), ms(0)).decision, KeepDecision::kRelease);
}

TEST(InferceptTest, ContextCappedAtMaxModelLen) {
  InferceptStepScheduler s;
  StepInput in;
  in.max_model_len = 1000;
  StepPlan out;
  s.plan(in, ms(0), out);
  // C = min(5000, 1000) → TTL = 1e-4 · 1000 = 0.1 s.
  KeepPlan k = s.on_round_end(round_end(1, 1, 5000), ms(0));
  EXPECT_EQ(k.decision, KeepDecision::kPin);
  EXPECT_NEAR(static_cast<double>(ns_after(k.until, ms(0))), 0.1e9, 1e3);
}

struct Step {
  std::vector<StepRequest> reqs;
  std::vector<PinnedKv> pins;
  std::uint32_t free_blocks = 100000;
  std::uint32_t budget = 8192;
  StepPlan run(InferceptStepScheduler& s, Time now) const {
    StepInput in;
    in.token_budget = budget;
    in.free_blocks = free_blocks;
    in.requests = reqs;
    in.pinned = pins;
    StepPlan out;
    s.plan(in, now, out);
    return out;
  }
};

TEST(InferceptTest, FcfsAdmissionInQueueOrderWithHeadOfLineBlocking) {
  InferceptStepScheduler s;
  Step st;
  st.reqs = {req(1, 1, RequestPhase::kWaiting, 100, 0, ms(0)), req(2, 2, RequestPhase::kWaiting, 1600, 0, ms(1)),
             req(3, 3, RequestPhase::kWaiting, 100, 0, ms(2))};
  st.free_blocks = 50;  // r1 takes 7; r2 needs 100 and blocks r3
  StepPlan p = st.run(s, ms(10));
  EXPECT_EQ(p.run, (std::vector<ScheduledChunk>{{0, 100}}));
}

TEST(InferceptTest, VictimIsTheLastRunningRequest) {
  InferceptStepScheduler s;
  Step st;
  // r0 needs 25 blocks (400 tokens); none free. Victims from the back: r2 (20 blocks), r1 (10).
  st.reqs = {req(1, 1, RequestPhase::kRunning, 2000, 1600, ms(0)), req(2, 2, RequestPhase::kRunning, 100, 160, ms(1)),
             req(3, 3, RequestPhase::kRunning, 100, 320, ms(2)), req(4, 4, RequestPhase::kWaiting, 10, 0, ms(3))};
  st.pins = {{9, 100, ms(0), ms(99999)}};
  st.free_blocks = 0;
  StepPlan p = st.run(s, ms(10));
  EXPECT_EQ(p.swap, (std::vector<std::uint32_t>{2, 1})) << "InferCept swaps its victims out";
  EXPECT_TRUE(p.preempt.empty());
  EXPECT_TRUE(p.unpin.empty());                               // InferCept does not trade pins for running requests
  EXPECT_EQ(p.run, (std::vector<ScheduledChunk>{{0, 400}}));  // no admission in a step that preempted
}

TEST(InferceptTest, RecomputeVictimsAsTheMarsRepoDoes) {
  InferceptParams p;
  p.swap_preempt = false;
  InferceptStepScheduler s(p);
  Step st;
  st.reqs = {req(1, 1, RequestPhase::kRunning, 2000, 1600, ms(0)), req(2, 2, RequestPhase::kRunning, 100, 160, ms(1)),
             req(3, 3, RequestPhase::kRunning, 100, 320, ms(2))};
  st.free_blocks = 0;
  StepPlan plan = st.run(s, ms(10));
  EXPECT_EQ(plan.preempt, (std::vector<std::uint32_t>{2, 1}));
  EXPECT_TRUE(plan.swap.empty());
}

TEST(InferceptTest, PinHousekeeping) {
  InferceptStepScheduler s;
  Step st;
  // Expired pins: session 1's next request waits, so its pin stays; session 2's goes.
  st.reqs = {req(5, 5, RequestPhase::kRunning, 10, 10, ms(0)), req(1, 1, RequestPhase::kWaiting, 1600, 0, ms(0))};
  st.pins = {{1, 10, ms(0), ms(100)}, {2, 10, ms(0), ms(100)}, {3, 10, ms(0), ms(5000)}};
  st.free_blocks = 0;
  EXPECT_EQ(st.run(s, ms(200)).unpin, (std::vector<SessionId>{2}));
  // Nothing running and the head does not fit: the pin with the latest end (session 3) goes.
  st.reqs = {req(1, 1, RequestPhase::kWaiting, 1600, 0, ms(0))};
  st.pins = {{1, 10, ms(0), ms(100)}, {3, 10, ms(0), ms(5000)}};
  StepPlan p = st.run(s, ms(300));
  EXPECT_EQ(p.unpin, (std::vector<SessionId>{3}));
  EXPECT_TRUE(p.run.empty());
  // A later round end of a session supersedes its older pin.
  (void)s.on_round_end(round_end(3, 1, 2000), ms(400));
  st.reqs.clear();
  st.pins = {{3, 10, ms(0), ms(5000)}};
  EXPECT_EQ(st.run(s, ms(401)).unpin, (std::vector<SessionId>{3}));
}

TEST(InferceptTest, ParamsFromRegistrySpecs) {
  auto params = PolicyParams::create("infercept", kInferceptParams, {{"swap", 0.0}, {"fwd_s", 0.0154}});
  ASSERT_TRUE(params.has_value());
  InferceptParams i = infercept_params(*params);
  EXPECT_FALSE(i.swap);
  EXPECT_DOUBLE_EQ(i.fwd_s, 0.0154);
  EXPECT_DOUBLE_EQ(i.fwd_s_per_token, 2e-4);
  EXPECT_DOUBLE_EQ(i.swap_s_per_token, 4e-5);
  EXPECT_DOUBLE_EQ(i.swap_free_tokens, 640);
  EXPECT_EQ(make_infercept_step(*params)->name(), "infercept");
}

TEST(InferceptTest, Deterministic) {
  auto run = [] {
    InferceptStepScheduler s;
    std::vector<StepPlan> plans;
    std::vector<KeepPlan> keeps;
    std::uint64_t x = 99;
    auto next = [&] {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      return static_cast<std::uint32_t>(x >> 33);
    };
    for (int step = 0; step < 200; ++step) {
      s.on_tool_end(1 + next() % 5, next() % 4, milliseconds(next() % 3000), ms(step));
      keeps.push_back(s.on_round_end(
          round_end(1 + next() % 5, next() % 4, next() % 20000, next() % 50000, next() % 4 != 0), ms(step)));
      Step st;
      const std::uint32_t n = 1 + next() % 8;
      for (std::uint32_t i = 0; i < n; ++i) {
        const bool running = next() % 2 == 0;
        const std::uint32_t prompt = 1 + next() % 5000;
        st.reqs.push_back(req(next() % 20, 1 + next() % 5, running ? RequestPhase::kRunning : RequestPhase::kWaiting,
                              prompt, running ? next() % (prompt + 50) : 0, ms(next() % 1000)));
      }
      std::partition(st.reqs.begin(), st.reqs.end(),
                     [](const StepRequest& r) { return r.phase == RequestPhase::kRunning; });
      for (std::uint32_t k = next() % 3; k > 0; --k) {
        st.pins.push_back({1 + next() % 5, next() % 50, ms(next() % 200), ms(next() % 4000)});
      }
      st.free_blocks = next() % 400;
      plans.push_back(st.run(s, ms(step * 20)));
    }
    return std::pair(plans, keeps);
  };
  const auto a = run();
  const auto b = run();
  for (std::size_t i = 0; i < a.first.size(); ++i) {
    EXPECT_EQ(a.first[i].run, b.first[i].run) << i;
    EXPECT_EQ(a.first[i].preempt, b.first[i].preempt) << i;
    EXPECT_EQ(a.first[i].swap, b.first[i].swap) << i;
    EXPECT_EQ(a.first[i].unpin, b.first[i].unpin) << i;
    EXPECT_EQ(a.second[i].decision, b.second[i].decision) << i;
    EXPECT_EQ(a.second[i].until, b.second[i].until) << i;
  }
}

// The pin housekeeping's "is this pin's session queued?" (QueuedPins,
// sched/policy.h) against a direct search, over random steps that rebuild it
// in place: running requests and unpinned sessions never count.
TEST(QueuedPins, NamesExactlyThePinnedSessionsWithAQueuedRequest) {
  std::mt19937_64 rng(7);
  QueuedPins queued;
  for (int step = 0; step < 300; ++step) {
    std::vector<StepRequest> reqs(rng() % 40);
    for (StepRequest& r : reqs) {
      r.session = rng() % 30;
      r.phase =
          rng() % 3 == 0 ? RequestPhase::kRunning : (rng() % 2 ? RequestPhase::kWaiting : RequestPhase::kPreempted);
    }
    std::vector<PinnedKv> pins(rng() % 12);
    for (PinnedKv& p : pins) p.session = rng() % 30;
    StepInput in;
    in.requests = reqs;
    in.pinned = pins;
    queued.start(in);
    for (SessionId s = 0; s < 30; ++s) {
      const bool pinned = std::any_of(pins.begin(), pins.end(), [&](const PinnedKv& p) { return p.session == s; });
      const bool waits = std::any_of(reqs.begin(), reqs.end(), [&](const StepRequest& r) {
        return r.session == s && r.phase != RequestPhase::kRunning;
      });
      EXPECT_EQ(queued.contains(s), pinned && waits) << "step " << step << " session " << s;
    }
  }
}

}  // namespace
}  // namespace tandem::sched
