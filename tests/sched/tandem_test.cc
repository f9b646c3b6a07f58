// tandem: with every addition switched off it is mars; each addition at its
// boundaries; and the same input gives the same output.
#include "sched/tandem.h"

#include <random>

#include <gtest/gtest.h>

#include "sched/registry.h"

namespace tandem::sched {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

Time at(std::int64_t ms) { return base::from_ns(ms * 1'000'000); }
constexpr EngineId kE = 1;
constexpr ToolKind kPytest = 11;
constexpr ToolKind kGrep = 12;

TandemParams all_off() {
  TandemParams t;
  t.residency = t.cost_eviction = t.cpu_weights = t.global_queue = t.growth_check = t.knee_quanta = t.kv_admission =
      t.engine_window = false;
  t.pin_admission = t.long_admission = t.prompt_projection = t.queue_admission = t.pending_restore = t.host_prices =
      t.pooled_prior = t.swap_preempt = t.fill_idle_budget = t.cpu_slots = t.cpu_las = t.headroom_keep = false;
  return t;
}

// A node with one engine of `total` blocks, `free_blocks` of them free.
struct Node {
  NodeModel model;
  explicit Node(std::uint32_t total = 1000, std::uint32_t free_blocks = 1000) {
    EngineParams p;
    p.total_blocks = total;
    EXPECT_TRUE(model.observe(EngineJoined{kE, p}, at(0)));
    stats(free_blocks, at(0));
    model.set_cpu(CpuView{8, 0, -1, {}});
  }
  void stats(std::uint32_t free_blocks, Time now, EngineId e = kE, std::uint32_t total = 1000) {
    KvPoolStats kv;
    kv.blocks_total = total;
    kv.blocks_free = free_blocks;
    EXPECT_TRUE(model.observe(KvStatsReported{e, kv}, now));
  }
  // A session that ran one round of `context` tokens and now runs `tool`.
  void acting(SessionId s, std::uint32_t context, ToolKind tool, Time now, EngineId e = kE) {
    EXPECT_TRUE(model.observe(RoundSubmitted{s, e, 0, context - 100, 0, (context + 15) / 16}, now));
    EXPECT_TRUE(model.sessions().transition(s, SessionState::kReasoning, now));
    EXPECT_TRUE(model.observe(RoundEnded{s, e, 0, 100, (context + 15) / 16, true}, now));
    EXPECT_TRUE(model.observe(ToolStarted{s, tool, 1}, now));
  }
  // Teaches the tool model that `kind` takes `wall`.
  void teach(ToolKind kind, Duration wall, int n = 50) {
    for (int i = 0; i < n; ++i) {
      SessionId s = 100000 + static_cast<SessionId>(kind) * 1000 + static_cast<SessionId>(i);
      acting(s, 200, kind, at(0));
      EXPECT_TRUE(model.observe(ToolEnded{s, kind, 1, 0, wall, {}}, at(0)));
      EXPECT_TRUE(model.observe(SessionClosed{s}, at(0)));
    }
    model.sessions().reap_done();
  }
};

std::vector<Action> tick(TandemControl& c, const NodeModel& m, Time now) {
  Actions out;
  c.tick(m, now, out);
  return out.list();
}

bool has(const std::vector<Action>& a, ActionKind kind, SessionId s) {
  return std::any_of(a.begin(), a.end(), [&](const Action& x) { return x.kind == kind && x.session == s; });
}

// The cpu.weight values set for session `s`, in order.
std::vector<std::int64_t> weights(const std::vector<Action>& a, SessionId s) {
  std::vector<std::int64_t> w;
  for (const Action& x : a) {
    if (x.kind == ActionKind::kSetCpuWeight && x.session == s) w.push_back(x.value);
  }
  return w;
}

TEST(Tandem, AllAdditionsOffIsMarsControl) {
  std::mt19937_64 rng(3);
  Node node;
  MarsControl mars({});
  TandemControl tandem({}, all_off());
  for (int i = 0; i < 400; ++i) {
    Time now = at(i * 100);
    SessionId s = 1 + rng() % 40;
    switch (rng() % 4) {
      case 0:
        (void)node.model.observe(RoundSubmitted{s, kE, 0, static_cast<std::uint32_t>(1000 + rng() % 60000), 0, 200},
                                 now);
        break;
      case 1:
        node.stats(static_cast<std::uint32_t>(rng() % 1000), now);
        break;
      case 2:
        (void)node.model.observe(SessionClosed{s}, now);
        break;
      case 3:
        break;
    }
    Actions a;
    Actions b;
    mars.tick(node.model, now, a);
    tandem.tick(node.model, now, b);
    ASSERT_EQ(a.list(), b.list()) << "tick " << i;
    for (const Action& x : a.list()) {
      if (x.kind == ActionKind::kAdmit)
        (void)node.model.sessions().transition(x.session, SessionState::kReasoning, now);
    }
  }
}

TEST(Tandem, NotesOnlyFirstPromptsForItsMedianOfLongSessions) {
  // Addition 10 judges "long" against the median of first prompts: a round
  // submitted while its session waits for admission, not a later one.
  Node n;
  TandemControl c(MarsControlParams{}, TandemParams{});
  auto feed = [&](const Event& e) {
    ASSERT_TRUE(n.model.observe(e, at(1)));
    c.on_event(e, n.model, at(1));
  };
  feed(SessionOpened{1});
  feed(RoundSubmitted{1, kE, 0, 4000, 0, 250});
  EXPECT_EQ(c.mars().first_prompts_noted(), 1u);
  n.acting(2, 5000, kGrep, at(1));  // admitted, ran a round, now in a tool
  feed(ToolEnded{2, kGrep, 1, 0, Duration(1000), {}});
  feed(RoundSubmitted{2, kE, 1, 5200, 4900, 330});
  EXPECT_EQ(c.mars().first_prompts_noted(), 1u) << "a later round is no first prompt";
  TandemParams off;
  off.long_admission = false;
  TandemControl without(MarsControlParams{}, off);
  ASSERT_TRUE(n.model.observe(SessionOpened{3}, at(1)));
  const Event r = RoundSubmitted{3, kE, 0, 4000, 0, 250};
  ASSERT_TRUE(n.model.observe(r, at(1)));
  without.on_event(r, n.model, at(1));
  EXPECT_EQ(without.mars().first_prompts_noted(), 0u) << "MARS's rule needs no median";
}

TEST(Tandem, IdleMemoryKeepsEveryToolsKv) {
  Node node(1000, 900);  // 10 % used: price 0
  node.teach(kPytest, seconds(60));
  node.acting(1, 8000, kPytest, at(0));
  TandemControl c({}, {});
  auto a = tick(c, node.model, at(100));
  EXPECT_TRUE(has(a, ActionKind::kPin, 1));
  EXPECT_EQ(c.residency_of(1)->residence, Residence::kKeep);
  EXPECT_TRUE(has(a, ActionKind::kSetCpuWeight, 1)) << "kept KV raises the tool's cpu.weight";
}

TEST(Tandem, LongToolUnderPressureIsOffloadedOnce) {
  Node node(1000, 0);  // full pool: price 3.2e-4 per block-second
  node.teach(kPytest, seconds(60));
  node.acting(1, 8000, kPytest, at(0));
  TandemParams p;
  p.growth_check = false;  // isolate residency (the full pool would also trip the growth check)
  TandemControl c({}, p);
  auto first = tick(c, node.model, at(100));
  EXPECT_TRUE(has(first, ActionKind::kOffload, 1));
  EXPECT_FALSE(has(first, ActionKind::kPin, 1));
  EXPECT_FALSE(has(first, ActionKind::kSetCpuWeight, 1)) << "nothing kept, nothing raised";
  auto second = tick(c, node.model, at(300));
  EXPECT_FALSE(has(second, ActionKind::kOffload, 1)) << "decisions go out when they change, not every tick";
}

// headroom_keep (addition 21): on a full pool the price says offload for
// every session below, but one whose blocks expected back within the
// horizon (P x 500) exceed the headroom ((1 - 0.8) x 1,000 = 200 blocks)
// keeps its KV: released, it could come back only after the engine drained
// 500 blocks.
TEST(Tandem, ASessionPastTheHeadroomKeepsItsKvThroughAShortTool) {
  constexpr ToolKind kShort = 13;
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "headroom_keep" : "without");
    Node node(1000, 0);
    node.teach(kShort, milliseconds(800));
    node.teach(kPytest, seconds(60));
    node.acting(1, 8000, kShort, at(0));   // 500 blocks, back in 0.8 s
    node.acting(2, 2400, kShort, at(0));   // 150 blocks: within the headroom whatever P is
    node.acting(3, 8000, kPytest, at(0));  // 500 blocks, back in a minute
    TandemParams p;
    p.growth_check = false;  // residency alone
    p.headroom_keep = on;
    TandemControl c({}, p);
    auto a = tick(c, node.model, at(100));
    EXPECT_EQ(has(a, ActionKind::kPin, 1), on);
    EXPECT_EQ(has(a, ActionKind::kOffload, 1), !on);
    EXPECT_TRUE(has(a, ActionKind::kOffload, 2)) << "a release within the headroom is at the margin";
    EXPECT_TRUE(has(a, ActionKind::kOffload, 3)) << "a tool unlikely back within the horizon lets go";
  }
}

TEST(Tandem, WithoutOffloadALongToolIsReleasedToTheCacheAndAShortOneKept) {
  TandemParams p;
  p.offload = false;
  Node node(1000, 0);
  node.teach(kPytest, seconds(60));
  node.teach(kGrep, milliseconds(50));
  node.acting(1, 8000, kPytest, at(0));
  node.acting(2, 8000, kGrep, at(0));
  TandemControl c({}, p);
  auto a = tick(c, node.model, at(10));
  EXPECT_TRUE(has(a, ActionKind::kUnpin, 1)) << "released to the prefix cache, not dropped";
  EXPECT_FALSE(has(a, ActionKind::kDrop, 1));
  EXPECT_TRUE(has(a, ActionKind::kPin, 2)) << "P(grep returns within 1 s) ≈ 1 beats the price of holding";
}

TEST(Tandem, PinsOutlastTheNextEvaluation) {
  Node node(1000, 900);
  node.acting(1, 4000, kGrep, at(0));
  TandemControl c({}, {});
  // h = 1 s, ticks every 0.5 s, one session: the rotation is one tick. A pin
  // runs until now + rotation + 2h and is renewed once less than rotation + h
  // is left. The first tick has no interval yet and assumes h.
  auto first = tick(c, node.model, at(0));  // until 0 + 1 + 2 = 3 s
  ASSERT_TRUE(has(first, ActionKind::kPin, 1));
  EXPECT_EQ(std::find_if(first.begin(), first.end(), [](const Action& x) { return x.kind == ActionKind::kPin; })->value,
            3'000'000'000);
  EXPECT_FALSE(has(tick(c, node.model, at(500)), ActionKind::kPin, 1));   // 2.5 s left ≥ 1.5
  EXPECT_FALSE(has(tick(c, node.model, at(1000)), ActionKind::kPin, 1));  // 2.0 s left
  EXPECT_FALSE(has(tick(c, node.model, at(1500)), ActionKind::kPin, 1));  // 1.5 s left, not < 1.5
  EXPECT_TRUE(has(tick(c, node.model, at(2000)), ActionKind::kPin, 1));   // 1.0 s left: renewed
}

TEST(Tandem, ResidencyWorkPerTickIsBounded) {
  Node node(1000, 900);
  for (SessionId s = 1; s <= 5; ++s) node.acting(s, 4000, kGrep, at(0));
  TandemParams p;
  p.residency_budget = 2;
  TandemControl c({}, p);
  auto pins = [](const std::vector<Action>& a) {
    return std::count_if(a.begin(), a.end(), [](const Action& x) { return x.kind == ActionKind::kPin; });
  };
  // Five acting sessions, two evaluations a tick: 2, 2, then 1 first decisions.
  EXPECT_EQ(pins(tick(c, node.model, at(0))), 2);
  EXPECT_EQ(pins(tick(c, node.model, at(200))), 2);
  EXPECT_EQ(pins(tick(c, node.model, at(400))), 1);
  for (SessionId s = 1; s <= 5; ++s) EXPECT_NE(c.residency_of(s), nullptr) << s;
  // A session whose state changes is decided at the next tick, whatever the
  // rotation: its tool ended, and its raised weight comes back at once.
  ASSERT_TRUE(node.model.observe(ToolEnded{4, kGrep, 1, 0, milliseconds(10), {}}, at(450)));
  c.on_event(ToolEnded{4, kGrep, 1, 0, milliseconds(10), {}}, node.model, at(450));
  auto a = tick(c, node.model, at(600));
  EXPECT_TRUE(std::any_of(a.begin(), a.end(), [](const Action& x) {
    return x.kind == ActionKind::kSetCpuWeight && x.session == 4 && x.value == 100;
  }));
  EXPECT_EQ(c.residency_of(4), nullptr);
}

TEST(Tandem, CpuWeightIsGivenBackWhenTheToolEnds) {
  Node node(1000, 900);
  node.acting(1, 4000, kGrep, at(0));
  TandemControl c({}, {});
  auto a = tick(c, node.model, at(0));
  ASSERT_TRUE(std::any_of(a.begin(), a.end(),
                          [](const Action& x) { return x.kind == ActionKind::kSetCpuWeight && x.value == 400; }));
  ASSERT_TRUE(node.model.observe(ToolEnded{1, kGrep, 1, 0, milliseconds(30), {}}, at(30)));
  auto b = tick(c, node.model, at(200));
  EXPECT_TRUE(std::any_of(b.begin(), b.end(), [](const Action& x) {
    return x.kind == ActionKind::kSetCpuWeight && x.session == 1 && x.value == 100;
  }));
}

// cpu_las (addition 20): a session's weight falls 2.5x at each level of
// its tools' total wall time (4 s, then 16 s, ...), times 4 while its KV is
// kept; it keeps its level between calls, and a session whose tools stay
// short gets exactly the writes it gets without cpu_las.
TEST(Tandem, LeastAttainedToolTimeLowersTheWeightByLevel) {
  TandemParams p;
  Node node(1000, 900);  // idle memory: every tool's KV is kept (critical)
  node.acting(1, 4000, kPytest, at(0));
  TandemControl c({}, p);
  EXPECT_EQ(weights(tick(c, node.model, at(0)), 1), std::vector<std::int64_t>{400});
  EXPECT_TRUE(weights(tick(c, node.model, at(3900)), 1).empty()) << "under 4 s: the first level";
  EXPECT_EQ(weights(tick(c, node.model, at(4000)), 1), std::vector<std::int64_t>{160}) << "4 s: 40, kept: x4";
  ASSERT_TRUE(node.model.observe(ToolEnded{1, kPytest, 1, 0, seconds(5), {}}, at(5000)));
  EXPECT_EQ(weights(tick(c, node.model, at(5050)), 1), std::vector<std::int64_t>{40}) << "no longer kept";
  // The next call starts where the last left off: 5 s so far.
  ASSERT_TRUE(node.model.observe(RoundSubmitted{1, kE, 1, 4000, 3900, 260}, at(6000)));
  ASSERT_TRUE(node.model.observe(RoundEnded{1, kE, 1, 100, 260, true}, at(6000)));
  ASSERT_TRUE(node.model.observe(ToolStarted{1, kPytest, 2}, at(6000)));
  EXPECT_EQ(weights(tick(c, node.model, at(6000)), 1), std::vector<std::int64_t>{160});
  EXPECT_EQ(weights(tick(c, node.model, at(17000)), 1), std::vector<std::int64_t>{64}) << "16 s: 16, x4";
  EXPECT_EQ(node.model.sessions().find(1)->tool_time, seconds(5)) << "only ended calls are summed";

  // A session whose KV left the GPU is not critical, and its level still
  // grows with the running call.
  node.acting(3, 4000, kPytest, at(20000));
  EXPECT_EQ(weights(tick(c, node.model, at(20000)), 3), std::vector<std::int64_t>{400});
  ASSERT_TRUE(node.model.observe(KvChanged{3, kE, KvChange::kEvicted, 250}, at(20010)));
  ASSERT_EQ(node.model.sessions().find(3)->blocks_held, 0u);
  EXPECT_EQ(weights(tick(c, node.model, at(20050)), 3), std::vector<std::int64_t>{100}) << "no KV: not critical";
  EXPECT_TRUE(weights(tick(c, node.model, at(23000)), 3).empty());
  EXPECT_EQ(weights(tick(c, node.model, at(24000)), 3), std::vector<std::int64_t>{40}) << "4 s without KV: 40";
  // Its cgroup keeps 40 between calls: neither the call's end nor the next
  // call, again without KV, writes it again.
  ASSERT_TRUE(node.model.observe(ToolEnded{3, kPytest, 1, 0, seconds(5), {}}, at(25000)));
  EXPECT_TRUE(weights(tick(c, node.model, at(25050)), 3).empty());
  ASSERT_TRUE(node.model.observe(RoundSubmitted{3, kE, 1, 4000, 3900, 260}, at(26000)));
  ASSERT_TRUE(node.model.observe(RoundEnded{3, kE, 1, 100, 260, true}, at(26000)));
  ASSERT_TRUE(node.model.observe(ToolStarted{3, kPytest, 2}, at(26000)));
  ASSERT_TRUE(node.model.observe(KvChanged{3, kE, KvChange::kEvicted, 260}, at(26000)));
  EXPECT_TRUE(weights(tick(c, node.model, at(26050)), 3).empty()) << "the cgroup has 40 already";

  // Short tools: the same writes as without cpu_las (400 while kept, 100 after).
  Node a(1000, 900);
  Node b(1000, 900);
  a.acting(2, 4000, kGrep, at(0));
  b.acting(2, 4000, kGrep, at(0));
  TandemParams without = p;
  without.cpu_las = false;
  TandemControl las({}, p);
  TandemControl plain({}, without);
  EXPECT_EQ(tick(las, a.model, at(0)), tick(plain, b.model, at(0)));
  ASSERT_TRUE(a.model.observe(ToolEnded{2, kGrep, 1, 0, milliseconds(30), {}}, at(30)));
  ASSERT_TRUE(b.model.observe(ToolEnded{2, kGrep, 1, 0, milliseconds(30), {}}, at(30)));
  EXPECT_EQ(tick(las, a.model, at(100)), tick(plain, b.model, at(100)));
}

// las_levels bounds how far cpu_las takes a weight: with one level a
// session stays at 40 (160 while kept) however long its tools run.
TEST(Tandem, LasLevelsBoundsHowFarAWeightFalls) {
  TandemParams p;
  p.las_levels = 1;
  Node node(1000, 900);
  node.acting(1, 4000, kPytest, at(0));
  TandemControl c({}, p);
  EXPECT_EQ(weights(tick(c, node.model, at(0)), 1), std::vector<std::int64_t>{400});
  EXPECT_EQ(weights(tick(c, node.model, at(4000)), 1), std::vector<std::int64_t>{160});
  EXPECT_TRUE(weights(tick(c, node.model, at(17000)), 1).empty()) << "16 s: still the first level";
  EXPECT_TRUE(weights(tick(c, node.model, at(600000)), 1).empty()) << "10 min: still the first level";
  ASSERT_TRUE(node.model.observe(ToolEnded{1, kPytest, 1, 0, seconds(601), {}}, at(601000)));
  EXPECT_EQ(weights(tick(c, node.model, at(601050)), 1), std::vector<std::int64_t>{40}) << "no longer kept";
}

TEST(Tandem, SessionsWithoutKvInStarvedToolsHoldNoWindowSlot) {
  // A window of one, held by session 1 in a tool call; session 2 waits.
  MarsControlParams m;
  m.window_max = m.window_min = m.window_init = 1;
  auto admits_second = [&](double cpu_psi, bool kv_gone, bool cpu_slots) {
    Node node(1000, 900);
    node.model.set_cpu(CpuView{4, 1, cpu_psi, {}});
    node.acting(1, 1600, kPytest, at(0));
    if (kv_gone) {
      EXPECT_TRUE(node.model.observe(KvChanged{1, kE, KvChange::kEvicted, 100}, at(1)));
    }
    EXPECT_TRUE(node.model.observe(RoundSubmitted{2, kE, 0, 100, 0, 7}, at(1)));
    TandemParams p;
    p.cpu_slots = cpu_slots;
    TandemControl c(m, p);
    return has(tick(c, node.model, at(1000)), ActionKind::kAdmit, 2);
  };
  EXPECT_TRUE(admits_second(95, true, true)) << "CPU-bound, KV gone: the slot is free";
  EXPECT_TRUE(admits_second(90, true, true)) << "at the threshold";
  EXPECT_FALSE(admits_second(95, false, true)) << "its KV is still on the GPU";
  EXPECT_FALSE(admits_second(50, true, true)) << "the tools are not CPU-bound";
  EXPECT_FALSE(admits_second(-1, true, true)) << "pressure unknown";
  EXPECT_FALSE(admits_second(95, true, false)) << "switched off: MARS's window";
}

TEST(Tandem, GrowthCheckPausesTheCheapestToLose) {
  // 1000 blocks, 950 allocated; three running rounds will each grow by
  // 256/16 = 16 blocks: projected 998/1000 + queued. Two acting sessions: a
  // pytest (60 s, cheap to lose now) and a grep (50 ms, dear).
  Node node(1000, 50);
  node.teach(kPytest, seconds(60));
  node.teach(kGrep, milliseconds(50));
  node.acting(1, 1600, kPytest, at(0));
  node.acting(2, 1600, kGrep, at(0));
  for (SessionId s = 10; s < 13; ++s) {
    ASSERT_TRUE(node.model.observe(RoundSubmitted{s, kE, 0, 100, 0, 7}, at(0)));
    ASSERT_TRUE(node.model.sessions().transition(s, SessionState::kReasoning, at(0)));
  }
  // Projected (950 allocated + 48 growth) / 1000 = 0.998: fits; 11 more
  // blocks allocated tip it over: (961 + 48) / 1000 = 1.009.
  node.stats(39, at(1));
  TandemParams p;
  p.residency = false;  // isolate the growth check
  p.pause_pressure = 1.0;
  p.resume_pressure = 0.9;
  TandemControl c({}, p);
  auto a = tick(c, node.model, at(1000));
  EXPECT_TRUE(has(a, ActionKind::kPause, 1)) << "excess 9 blocks; pytest's 100 blocks cover it";
  EXPECT_FALSE(has(a, ActionKind::kPause, 2));
  EXPECT_TRUE(has(a, ActionKind::kOffload, 1)) << "its KV leaves the GPU";

  // Without the growth term the same node projects 0.961 < 1: no pause.
  TandemParams no_growth = p;
  no_growth.growth_decode_tokens = 0;
  TandemControl c2({}, no_growth);
  EXPECT_FALSE(has(tick(c2, node.model, at(1000)), ActionKind::kPause, 1));
}

TEST(Tandem, SessionsWaitingForAdmissionDoNotTriggerPauses) {
  Node node(1000, 100);  // 90 % allocated
  node.teach(kPytest, seconds(60));
  node.acting(1, 1600, kPytest, at(0));
  for (SessionId s = 10; s < 60; ++s) {  // 50 waiting rounds of 100 blocks each
    ASSERT_TRUE(node.model.observe(RoundSubmitted{s, kE, 0, 1600, 0, 100}, at(0)));
  }
  TandemParams p;
  p.residency = false;
  TandemControl c({}, p);
  EXPECT_FALSE(has(tick(c, node.model, at(10)), ActionKind::kPause, 1))
      << "5000 queued blocks are admission's to refuse, not a reason to evict admitted work";
}

TEST(Tandem, RestoreGoesToTheEngineWithMostRoomWithLocalityBonus) {
  Node node(1000, 1000);
  EngineParams p2;
  p2.total_blocks = 1000;
  ASSERT_TRUE(node.model.observe(EngineJoined{2, p2}, at(0)));
  node.acting(1, 1600, kGrep, at(0));
  ASSERT_TRUE(node.model.sessions().transition(1, SessionState::kPaused, at(1)));
  // Engine 1 (its old engine): 60 % projected; engine 2: 45 %.
  node.stats(400, at(2));
  node.stats(550, at(2), 2);
  TandemParams tp;
  tp.residency = false;
  tp.locality_bonus = 0.0;
  TandemControl no_bonus({}, tp);
  auto a = tick(no_bonus, node.model, at(10));
  ASSERT_TRUE(has(a, ActionKind::kRestore, 1));
  EXPECT_EQ(std::find_if(a.begin(), a.end(), [](const Action& x) { return x.kind == ActionKind::kRestore; })->engine,
            2u);
  tp.locality_bonus = 0.2;  // 200 blocks of bonus outweigh the 150-block difference
  TandemControl bonus({}, tp);
  auto b = tick(bonus, node.model, at(10));
  EXPECT_EQ(std::find_if(b.begin(), b.end(), [](const Action& x) { return x.kind == ActionKind::kRestore; })->engine,
            1u);
  tp.global_queue = false;
  tp.locality_bonus = 0.0;
  TandemControl local({}, tp);
  auto c = tick(local, node.model, at(10));
  EXPECT_EQ(std::find_if(c.begin(), c.end(), [](const Action& x) { return x.kind == ActionKind::kRestore; })->engine,
            1u)
      << "without the global queue a session returns only to its own engine";
}

TEST(Tandem, AFullHostDisplacesACopyOnlyForASessionBackSooner) {
  // Full GPU pool, a 60 s pytest 0.1 s in: offloading pays. Host memory holds
  // 1000 blocks, 950 in use: this copy (500 blocks) would evict the oldest.
  auto decide = [](Duration oldest_idle, bool host_prices) {
    Node node(1000, 0);
    node.teach(kPytest, seconds(60));
    node.acting(1, 8000, kPytest, at(0));
    KvPoolStats kv;
    kv.blocks_total = 1000;
    kv.blocks_free = 0;
    kv.host_blocks_total = 1000;
    kv.blocks_offloaded = 950;
    kv.host_oldest_idle = oldest_idle;
    EXPECT_TRUE(node.model.observe(KvStatsReported{kE, kv}, at(50)));
    TandemParams p;
    p.growth_check = false;
    p.host_prices = host_prices;
    TandemControl c({}, p);
    return tick(c, node.model, at(100));
  };
  // The oldest copy has idled 1 h: by every tool this node has seen (60 s), it
  // is expected back later than this pytest, so it goes.
  EXPECT_TRUE(has(decide(std::chrono::hours(1), true), ActionKind::kOffload, 1));
  // It has idled 1 s: it is expected back in about a minute, as is this session,
  // which is 0.1 s into a 60 s call — no sooner, so no displacement: released.
  auto a = decide(seconds(1), true);
  EXPECT_FALSE(has(a, ActionKind::kOffload, 1));
  EXPECT_TRUE(has(a, ActionKind::kUnpin, 1));
  EXPECT_TRUE(has(decide(seconds(1), false), ActionKind::kOffload, 1)) << "without the addition: the LRU decides";
}

TEST(Tandem, PromptProjectionCountsWholePromptsOfAdmittedRounds) {
  // 1000 blocks, 100 allocated (session 1's pinned pytest KV). Three admitted
  // rounds of 4300-token prompts, not yet prefilled: each will hold
  // ceil((4300 + 256) / 16) = 285 blocks; with the pin, (855 + 100) / 1000 > 0.9.
  Node node(1000, 900);
  node.teach(kPytest, seconds(60));
  node.acting(1, 1600, kPytest, at(0));
  KvPoolStats kv;
  kv.blocks_total = 1000;
  kv.blocks_free = 900;
  kv.blocks_pinned = 100;
  ASSERT_TRUE(node.model.observe(KvStatsReported{kE, kv}, at(1)));
  for (SessionId s = 10; s < 13; ++s) {
    ASSERT_TRUE(node.model.observe(RoundSubmitted{s, kE, 0, 4300, 0, 275}, at(1)));
    ASSERT_TRUE(node.model.sessions().transition(s, SessionState::kReasoning, at(1)));
  }
  TandemParams p;
  p.residency = false;
  TandemControl with({}, p);
  auto a = tick(with, node.model, at(10));
  EXPECT_TRUE(has(a, ActionKind::kPause, 1)) << "the prompts still to be prefilled overflow the pool";
  p.prompt_projection = false;
  TandemControl without({}, p);
  EXPECT_FALSE(has(tick(without, node.model, at(10)), ActionKind::kPause, 1))
      << "allocated 100 + growth 48 of 1000: no overflow seen";
}

// Session 1 paused with its next round waiting (216 blocks), and sessions
// 10 and 11 running rounds that will hold 300 blocks each, on engine kE.
void paused_behind_two_rounds(Node& node) {
  node.acting(1, 3200, kGrep, at(0));
  ASSERT_TRUE(node.model.observe(ToolEnded{1, kGrep, 1, 0, milliseconds(10), {}}, at(0)));
  ASSERT_TRUE(node.model.sessions().transition(1, SessionState::kPaused, at(1)));
  ASSERT_TRUE(node.model.observe(RoundSubmitted{1, kE, 1, 3300, 3200, 216}, at(1)));
  for (SessionId s = 10; s < 12; ++s) {
    ASSERT_TRUE(node.model.observe(RoundSubmitted{s, kE, 0, 4544, 0, 300}, at(1)));
    ASSERT_TRUE(node.model.sessions().transition(s, SessionState::kReasoning, at(1)));
  }
}

TEST(Tandem, NewSessionsEnterOnlyIfTheyFitAsARestoreWould) {
  // Two admitted rounds will hold 300 blocks each (0.6 of the pool). Session
  // 1 is paused with its next round waiting; it needs (3200 + 256) / 16 = 216
  // blocks, which resume_pressure 0.8 cannot give (0.816). A new small
  // session (26 blocks) fits under 0.8 and enters: it does not queue behind
  // the paused round (the gate that cost the validation part 5-16 %). A new
  // large one (266 blocks) would not fit as a restore would, and waits.
  Node node(1000, 1000);
  paused_behind_two_rounds(node);
  ASSERT_TRUE(node.model.observe(RoundSubmitted{20, kE, 0, 160, 0, 11}, at(2)));    // new, small
  ASSERT_TRUE(node.model.observe(RoundSubmitted{21, kE, 0, 4000, 0, 250}, at(3)));  // new, large
  TandemParams p;
  p.residency = false;
  TandemControl with({}, p);
  auto a = tick(with, node.model, at(10));
  EXPECT_FALSE(has(a, ActionKind::kRestore, 1)) << "0.6 + 0.216 > resume_pressure";
  EXPECT_TRUE(has(a, ActionKind::kAdmit, 20)) << "0.6 + 0.026 fits: it does not wait for the paused round";
  EXPECT_FALSE(has(a, ActionKind::kAdmit, 21)) << "0.6 + 0.026 + 0.266 does not fit";
  p.queue_admission = false;
  TandemControl without({}, p);
  auto b = tick(without, node.model, at(10));
  EXPECT_TRUE(has(b, ActionKind::kAdmit, 20));
  EXPECT_TRUE(has(b, ActionKind::kAdmit, 21)) << "MARS alone admits it";
}

TEST(Tandem, APausedRoundPassedOverForRestoreWaitMaxHoldsNewSessionsBack) {
  // As above: session 1 is paused with its next round waiting (216 blocks),
  // two rounds hold 0.6 of the pool, and small new sessions fit under
  // resume_pressure where the restore does not. They may pass it for
  // restore_wait_max_s; after that they wait, so a stream of them cannot
  // starve it, and once the running rounds end it is restored.
  Node node(1000, 1000);
  paused_behind_two_rounds(node);
  TandemParams p;
  p.residency = false;
  p.restore_wait_max_s = 30;
  TandemControl c({}, p);
  // A new small session every 10 s; each would fit beside the running rounds.
  SessionId fresh = 20;
  auto offer = [&](std::int64_t ms) {
    EXPECT_TRUE(node.model.observe(RoundSubmitted{fresh, kE, 0, 160, 0, 11}, at(ms)));
    auto a = tick(c, node.model, at(ms));
    EXPECT_FALSE(has(a, ActionKind::kRestore, 1)) << "0.6 + 0.216 > resume_pressure, at " << ms << " ms";
    return has(a, ActionKind::kAdmit, fresh++);
  };
  EXPECT_TRUE(offer(10)) << "the paused round has waited 0 s";
  EXPECT_TRUE(offer(20'000)) << "20 s";
  EXPECT_FALSE(offer(30'010)) << "30 s: new sessions wait behind the paused round";
  EXPECT_FALSE(offer(40'000));
  // The running rounds end (their sessions close): the paused round fits.
  for (SessionId s = 10; s < 12; ++s) ASSERT_TRUE(node.model.observe(SessionClosed{s}, at(41'000)));
  auto a = tick(c, node.model, at(42'000));
  EXPECT_TRUE(has(a, ActionKind::kRestore, 1));
  // Restored: new sessions enter again (the held ones are MARS's to offer).
  ASSERT_TRUE(node.model.sessions().transition(1, SessionState::kReasoning, at(42'001), kE));
  EXPECT_TRUE(offer(43'000));

  // 0 switches the bound off: the stream passes the paused round forever.
  p.restore_wait_max_s = 0;
  Node n2(1000, 1000);
  paused_behind_two_rounds(n2);
  TandemControl off({}, p);
  for (std::int64_t ms : {10, 30'010, 600'000}) {
    ASSERT_TRUE(n2.model.observe(RoundSubmitted{fresh, kE, 0, 160, 0, 11}, at(ms)));
    EXPECT_TRUE(has(tick(off, n2.model, at(ms)), ActionKind::kAdmit, fresh++)) << ms << " ms";
  }
}

TEST(Tandem, APausedRoundPassedOverTooLongDrainsOnlyTheEngineItWillGoTo) {
  // Two engines: rounds hold 0.6 of engine 1 and 0.7 of engine 2, and session
  // 1's paused round (0.216) fits on neither under resume_pressure 0.8. Once
  // it has been passed over for restore_wait_max_s, new sessions wait on
  // engine 1, the least loaded, where it will be restored; engine 2 still
  // takes them.
  constexpr EngineId kE2 = 2;
  Node node(1000, 1000);
  EngineParams ep;
  ep.total_blocks = 1000;
  ASSERT_TRUE(node.model.observe(EngineJoined{kE2, ep}, at(0)));
  node.stats(1000, at(0), kE2);
  paused_behind_two_rounds(node);
  ASSERT_TRUE(node.model.observe(RoundSubmitted{12, kE2, 0, 10944, 0, 700}, at(1)));
  ASSERT_TRUE(node.model.sessions().transition(12, SessionState::kReasoning, at(1)));
  TandemParams p;
  p.residency = false;
  p.restore_wait_max_s = 30;
  TandemControl c({}, p);
  EXPECT_FALSE(has(tick(c, node.model, at(10)), ActionKind::kRestore, 1));
  ASSERT_TRUE(node.model.observe(RoundSubmitted{20, kE, 0, 160, 0, 11}, at(30'020)));
  ASSERT_TRUE(node.model.observe(RoundSubmitted{21, kE2, 0, 160, 0, 11}, at(30'020)));
  auto a = tick(c, node.model, at(30'020));
  EXPECT_FALSE(has(a, ActionKind::kRestore, 1));
  EXPECT_FALSE(has(a, ActionKind::kAdmit, 20)) << "engine 1 drains for the paused round";
  EXPECT_TRUE(has(a, ActionKind::kAdmit, 21)) << "engine 2 (0.7 + 0.011) still takes new sessions";
}

TEST(Tandem, AnIdleEngineGetsAPausedRoundEvenIfItsProjectionDoesNotFit) {
  // What a live replay on a 128-block pool deadlocked on: session 1 is paused
  // with its next round waiting and needs (1900 + 256) / 16 = 135 blocks, more
  // than the whole pool; a new session's round is queued behind it. The
  // engine runs, queues and pins nothing.
  Node node(128, 128);
  node.stats(128, at(0), kE, 128);
  node.acting(1, 1900, kGrep, at(0));
  ASSERT_TRUE(node.model.observe(ToolEnded{1, kGrep, 1, 0, milliseconds(10), {}}, at(0)));
  ASSERT_TRUE(node.model.sessions().transition(1, SessionState::kPaused, at(1)));
  ASSERT_TRUE(node.model.observe(RoundSubmitted{1, kE, 1, 2000, 1900, 135}, at(1)));
  ASSERT_TRUE(node.model.observe(RoundSubmitted{20, kE, 0, 1800, 0, 113}, at(2)));
  node.stats(128, at(3), kE, 128);
  TandemParams p;
  p.residency = false;
  TandemControl c({}, p);
  auto a = tick(c, node.model, at(10));
  EXPECT_TRUE(has(a, ActionKind::kRestore, 1)) << "the idle engine takes the oldest paused round";
  // Once it runs there, the engine is not idle: nothing more is forced.
  ASSERT_TRUE(node.model.sessions().transition(1, SessionState::kReasoning, at(11), kE));
  auto b = tick(c, node.model, at(12));
  EXPECT_FALSE(has(b, ActionKind::kAdmit, 20)) << "the restored round is on its way to the engine";
}

TEST(Tandem, PausedSessionsWhoseRoundWaitsAreRestoredFirst) {
  // Room for one restore of 516 blocks under resume_pressure 0.8. Session 1 was
  // paused first but its tool still runs; session 2's next round waits.
  Node node(1000, 1000);
  node.acting(1, 8000, kPytest, at(0));
  node.acting(2, 8000, kGrep, at(0));
  ASSERT_TRUE(node.model.sessions().transition(1, SessionState::kPaused, at(1)));
  ASSERT_TRUE(node.model.observe(ToolEnded{2, kGrep, 1, 0, milliseconds(10), {}}, at(2)));
  ASSERT_TRUE(node.model.sessions().transition(2, SessionState::kPaused, at(2)));
  ASSERT_TRUE(node.model.observe(RoundSubmitted{2, kE, 1, 8100, 8000, 513}, at(2)));
  TandemParams p;
  p.residency = false;
  TandemControl pending({}, p);
  auto a = tick(pending, node.model, at(10));
  EXPECT_TRUE(has(a, ActionKind::kRestore, 2));
  EXPECT_FALSE(has(a, ActionKind::kRestore, 1));
  p.pending_restore = false;
  TandemControl oldest({}, p);
  auto b = tick(oldest, node.model, at(10));
  EXPECT_TRUE(has(b, ActionKind::kRestore, 1)) << "oldest first";
  EXPECT_FALSE(has(b, ActionKind::kRestore, 2));
}

// ---- step half ----------------------------------------------------------------

// A request not running: a new round, or one whose `cached` tokens are a
// prefix hit (`held` of its blocks its own, pinned).
StepRequest waiting(std::uint64_t id, SessionId session, std::uint32_t prompt, std::uint32_t cached = 0,
                    std::uint32_t held = 0, Time arrival = {}) {
  StepRequest r;
  r.id = id;
  r.session = session;
  r.prompt_tokens = prompt;
  r.cached_tokens = cached;
  r.blocks_held = held;
  r.arrival = arrival;
  return r;
}

StepRequest running(std::uint64_t id, std::uint32_t computed, std::uint32_t blocks) {
  StepRequest r;
  r.id = id;
  r.session = id;
  r.phase = RequestPhase::kRunning;
  r.prompt_tokens = computed;
  r.computed_tokens = computed;
  r.blocks_held = blocks;
  r.last_scheduled = at(1);
  return r;
}

TEST(TandemStep, PinsAtAToolCallOnlyWithResidency) {
  TandemStepScheduler on({}, {});
  RoundEndInfo info{7, true, kGrep, 3200, 200, 0};
  KeepPlan k = on.on_round_end(info, at(1000));
  EXPECT_EQ(k.decision, KeepDecision::kPin);
  EXPECT_EQ(k.until, at(3000));
  info.tool_follows = false;
  EXPECT_EQ(on.on_round_end(info, at(1000)).decision, KeepDecision::kRelease) << "last round: nothing to keep";
  TandemStepScheduler off({}, all_off());
  info.tool_follows = true;
  EXPECT_EQ(off.on_round_end(info, at(1000)).decision, KeepDecision::kRelease) << "as mars";
}

TEST(TandemStep, APinItDidNotSeeMadeIsPricedAtTheEnginesBlockSize) {
  TandemStepScheduler s({}, {});
  for (int i = 0; i < 50; ++i) s.on_tool_end(0, 0, seconds(2), at(0));
  // Session 7's pin was made through this scheduler: 100 blocks holding 3,200
  // tokens. Session 8's pin came from the engine alone (before the scheduler
  // attached): its context is its blocks full at the engine's block size.
  (void)s.on_round_end({7, true, 0, 3200, 100, 0}, at(0));
  const PinnedKv seen{7, 100, at(0), at(60000)};
  const PinnedKv unseen{8, 100, at(0), at(60000)};
  EXPECT_DOUBLE_EQ(s.release_cost_per_block(unseen, 32, at(10)), s.release_cost_per_block(seen, 32, at(10)));
  EXPECT_LT(s.release_cost_per_block(unseen, 16, at(10)), s.release_cost_per_block(unseen, 32, at(10)))
      << "a bigger block holds more context, which costs more to recompute";
}

TEST(TandemStep, ReleasesTheCheapestPinPerBlockFirst) {
  TandemStepScheduler s({}, {});
  for (int i = 0; i < 50; ++i) {
    s.on_tool_end(0, kPytest, seconds(60), at(0));
    s.on_tool_end(0, kGrep, milliseconds(50), at(0));
  }
  // Two pins of 100 blocks: session 5 waits on pytest (cheap to lose),
  // session 6 on grep (about to return). One running request needs 1 block.
  (void)s.on_round_end({5, true, kPytest, 1600, 100, 0}, at(0));
  (void)s.on_round_end({6, true, kGrep, 1600, 100, 0}, at(0));
  std::vector<StepRequest> reqs = {running(1, 32, 2)};
  std::vector<PinnedKv> pins = {{6, 100, at(0), at(60000)}, {5, 100, at(0), at(90000)}};
  StepInput in;
  in.free_blocks = 0;
  in.requests = reqs;
  in.pinned = pins;
  StepPlan out;
  s.plan(in, at(10), out);
  EXPECT_EQ(out.unpin, (std::vector<SessionId>{5}));
  EXPECT_EQ(out.run.size(), 1u);
  EXPECT_TRUE(out.preempt.empty()) << "a pin is released instead of preempting running work";
  EXPECT_LT(s.release_cost_per_block(pins[1], 16, at(10)), s.release_cost_per_block(pins[0], 16, at(10)));

  TandemParams by_expiry;
  by_expiry.cost_eviction = false;
  TandemStepScheduler e({}, by_expiry);
  StepPlan out2;
  e.plan(in, at(10), out2);
  EXPECT_EQ(out2.unpin, (std::vector<SessionId>{6})) << "ablated: earliest expiry first";
}

TEST(TandemStep, ExpiredPinsGoAndNothingElseWhenDemandFits) {
  TandemStepScheduler s({}, {});
  std::vector<StepRequest> reqs = {running(1, 32, 2)};
  std::vector<PinnedKv> pins = {{5, 10, at(0), at(5)}, {6, 10, at(0), at(60000)}};
  StepInput in;
  in.free_blocks = 100;
  in.requests = reqs;
  in.pinned = pins;
  StepPlan out;
  s.plan(in, at(10), out);
  EXPECT_EQ(out.unpin, (std::vector<SessionId>{5}));
}

TEST(TandemStep, APinWhoseNextRoundIsQueuedIsNeverReleased) {
  TandemStepScheduler s({}, {});
  // Session 5's next round waits, counting its pinned blocks as its own; the
  // pin has expired and the running request wants more than is free.
  std::vector<StepRequest> reqs = {running(1, 32, 2), waiting(9, 5, 1700, 1600, 100)};
  std::vector<PinnedKv> pins = {{5, 100, at(0), at(5)}};
  StepInput in;
  in.free_blocks = 0;
  in.requests = reqs;
  in.pinned = pins;
  StepPlan out;
  s.plan(in, at(10), out);
  EXPECT_TRUE(out.unpin.empty());
}

TEST(TandemStep, QueuedPinsGoLastWhenNothingElseCanFit) {
  // The head of the queue (session 1) needs 100 blocks and none are free;
  // the only pin belongs to session 5, whose next round waits behind it.
  // Nothing else can free memory, so that pin is released (a deadlock
  // otherwise) and its request loses the blocks it counted as its own.
  TandemStepScheduler s({}, {});
  std::vector<StepRequest> reqs = {waiting(1, 1, 1600, 0, 0, at(1)), waiting(9, 5, 1700, 1600, 100, at(2))};
  std::vector<PinnedKv> pins = {{5, 100, at(0), at(60000)}};
  StepInput in;
  in.free_blocks = 0;
  in.requests = reqs;
  in.pinned = pins;
  StepPlan out;
  s.plan(in, at(10), out);
  EXPECT_EQ(out.unpin, (std::vector<SessionId>{5}));
  ASSERT_FALSE(out.run.empty());
  EXPECT_EQ(out.run[0].request, 0u) << "the head runs on the released blocks";
  std::uint32_t blocks = 0;
  for (const ScheduledChunk& c : out.run) blocks += (c.tokens + 15) / 16;
  EXPECT_LE(blocks, 100u) << "the released blocks are counted once";
}

TEST(TandemStep, AStalledEngineReleasesPinsForTheRequestMarsPicks) {
  // Nothing runs. In queue order the head is session 1 (3,000 new tokens,
  // 188 blocks: it fits the 200 free, so no pin goes for it), but MARS takes
  // requests preempted by recompute first: session 2, whose 30,100-token
  // prompt has a 30,000-token prefix hit on unreferenced blocks, needs 1,882
  // blocks and cannot start. Session 6's pin holds 2,000 blocks until a
  // minute from now: without the progress rule the engine would wait that
  // minute (for ever with the pins of queued sessions).
  TandemStepScheduler s({}, {});
  StepRequest b = waiting(2, 2, 30100, 30000, 0, at(2));
  b.phase = RequestPhase::kPreempted;
  std::vector<StepRequest> reqs = {waiting(1, 1, 3000, 0, 0, at(1)), b};
  std::vector<PinnedKv> pins = {{6, 2000, at(0), at(60000)}};
  StepInput in;
  in.free_blocks = 200;
  in.requests = reqs;
  in.pinned = pins;
  StepPlan out;
  s.plan(in, at(10), out);
  ASSERT_TRUE(out.run.empty()) << "MARS's head does not fit: nothing is scheduled this plan";
  EXPECT_EQ(out.unpin, (std::vector<SessionId>{6})) << "so the pin goes, and the engine plans again";
}

TEST(TandemStep, AllAdditionsOffPlansAsMars) {
  std::mt19937_64 rng(9);
  MarsStepScheduler mars(MarsStepParams{});
  TandemStepScheduler tandem({}, all_off());
  for (int step = 0; step < 200; ++step) {
    std::vector<StepRequest> reqs;
    for (std::uint64_t id = 1; id <= 6; ++id) {
      StepRequest r;
      r.id = id;
      r.session = id;
      r.phase = id <= 3 ? RequestPhase::kRunning : RequestPhase::kWaiting;
      r.prompt_tokens = 500 + static_cast<std::uint32_t>(rng() % 20000);
      r.computed_tokens = r.phase == RequestPhase::kRunning ? static_cast<std::uint32_t>(rng() % r.prompt_tokens) : 0;
      r.blocks_held = (r.computed_tokens + 15) / 16;
      r.arrival = at(static_cast<std::int64_t>(id));
      reqs.push_back(r);
    }
    StepInput in;
    in.free_blocks = static_cast<std::uint32_t>(rng() % 300);
    in.requests = reqs;
    StepPlan a;
    StepPlan b;
    mars.plan(in, at(step * 20), a);
    tandem.plan(in, at(step * 20), b);
    ASSERT_EQ(a.run, b.run) << step;
    ASSERT_EQ(a.preempt, b.preempt) << step;
    ASSERT_TRUE(b.swap.empty()) << step;
  }
}

TEST(TandemStep, SwapPreemptSwapsMarsVictims) {
  std::mt19937_64 rng(4);
  MarsStepScheduler mars(MarsStepParams{});
  TandemParams only = all_off();
  only.swap_preempt = true;
  TandemStepScheduler tandem({}, only);
  std::size_t victims = 0;
  for (int step = 0; step < 200; ++step) {
    std::vector<StepRequest> reqs;
    for (std::uint64_t id = 1; id <= 6; ++id) {
      StepRequest r;
      r.id = id;
      r.session = id;
      r.phase = id <= 3 ? RequestPhase::kRunning : RequestPhase::kWaiting;
      r.prompt_tokens = 500 + static_cast<std::uint32_t>(rng() % 20000);
      r.computed_tokens = r.phase == RequestPhase::kRunning ? static_cast<std::uint32_t>(rng() % r.prompt_tokens) : 0;
      r.blocks_held = (r.computed_tokens + 15) / 16;
      r.arrival = at(static_cast<std::int64_t>(id));
      reqs.push_back(r);
    }
    StepInput in;
    in.free_blocks = static_cast<std::uint32_t>(rng() % 300);
    in.requests = reqs;
    StepPlan a;
    StepPlan b;
    mars.plan(in, at(step * 20), a);
    tandem.plan(in, at(step * 20), b);
    ASSERT_EQ(a.run, b.run) << step;
    ASSERT_EQ(a.preempt, b.swap) << step;
    ASSERT_TRUE(b.preempt.empty()) << step;
    victims += b.swap.size();
  }
  EXPECT_GT(victims, 0u) << "the test must preempt";
}

TEST(Tandem, AdmissionIgnoresTheCpuGateThatMarsApplies) {
  // One tool core and 12 running tools: MARS's CPU side caps the window at
  // max(W_min = 4, ceil(1 · 2.5)) and cuts it while overloaded; tandem admits on KV alone.
  Node node;
  node.model.set_cpu(CpuView{1, 0, -1, {}});
  for (SessionId s = 1; s <= 12; ++s) node.acting(s, 1600, kGrep, at(0));
  TandemControl ours({}, {});
  TandemParams off;
  off.kv_admission = false;
  TandemControl mars_like({}, off);
  for (int i = 1; i <= 10; ++i) {
    (void)tick(ours, node.model, at(i * 200));
    (void)tick(mars_like, node.model, at(i * 200));
  }
  EXPECT_TRUE(mars_like.mars().cpu_overloaded());
  EXPECT_EQ(mars_like.mars().w_adm(), 4u);
  EXPECT_FALSE(ours.mars().cpu_overloaded());
  EXPECT_EQ(ours.mars().w_adm(), 30u);
}

TEST(Tandem, TheAdmissionWindowScalesWithTheEngines) {
  Node node;
  EngineParams p;
  p.total_blocks = 1000;
  ASSERT_TRUE(node.model.observe(EngineJoined{kE + 1, p}, at(0)));
  node.stats(1000, at(0), kE + 1);
  TandemControl ours({}, {});
  TandemParams off;
  off.engine_window = false;
  TandemControl mars_like({}, off);
  (void)tick(ours, node.model, at(200));
  (void)tick(mars_like, node.model, at(200));
  EXPECT_EQ(ours.mars().window(), 60u) << "MARS's 30 per engine, two engines";
  EXPECT_EQ(mars_like.mars().window(), 30u);
}

TEST(Tandem, RegistryBuildsItAndAblationFlagsParse) {
  auto p = make_policy("tandem", {{"residency", 0}, {"growth_check", 0}, {"window_max", 20}});
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->control->name(), "tandem");
  EXPECT_EQ(p->step->name(), "tandem");
  TandemParams t = tandem_params(p->params);
  EXPECT_FALSE(t.residency);
  EXPECT_FALSE(t.growth_check);
  EXPECT_TRUE(t.cost_eviction);
  EXPECT_FALSE(make_policy("tandem", {{"residency", 2}})) << "switches are 0 or 1";
}

}  // namespace
}  // namespace tandem::sched
