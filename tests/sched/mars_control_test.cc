// mars control half: every rule of [mars_code] §2.1–2.2 pinned to a
// hand-computed expectation, driven through a NodeModel fed events at virtual
// times.
#include "sched/mars_control.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sched/model.h"
#include "sched/registry.h"

namespace tandem::sched {
namespace {

using Ids = std::vector<SessionId>;

Time at(double s) { return base::from_ns(std::llround(s * 1e9)); }

// A host in miniature: feeds events to a NodeModel, ticks the policy, and
// applies its admissions the way the daemon does.
class Host {
 public:
  void join(EngineId e, std::uint32_t total, std::uint32_t block_size = 16) {
    EngineParams p;
    p.block_size = block_size;
    p.total_blocks = total;
    observe(EngineJoined{e, p}, at(0));
  }
  void kv(std::uint32_t total, std::uint32_t free, Time t = at(0), EngineId e = 1) {
    KvPoolStats s;
    s.blocks_total = total;
    s.blocks_free = free;
    observe(KvStatsReported{e, s}, t);
  }
  void cores(std::uint32_t n) {
    CpuView c;
    c.tool_cores = n;
    model.set_cpu(c);
  }
  // Opened at `t`, nothing submitted: est unknown.
  void open(SessionId s, Time t) { observe(SessionOpened{s}, t); }
  // WAITING with a submitted round of `prompt` tokens.
  void waiting(SessionId s, std::uint32_t prompt, Time t, EngineId e = 1) {
    open(s, t);
    RoundSubmitted r{s, e};
    r.round = 1;
    r.prompt_tokens = prompt;
    observe(r, t);
  }
  // Admitted and reasoning.
  void live(SessionId s, std::uint32_t prompt, Time t) {
    waiting(s, prompt, t);
    ASSERT_TRUE(model.sessions().transition(s, SessionState::kReasoning, t));
  }
  void tools_start(SessionId s, int n, Time t) {
    for (int i = 0; i < n; ++i) observe(ToolStarted{s, 7, next_call_++}, t);
  }
  void tools_end(SessionId s, int n, Time t) {
    for (int i = 0; i < n; ++i) observe(ToolEnded{s, 7, 0, 0, Duration(1000), Duration(1000)}, t);
  }
  // One tick; returns the admitted ids in decision order and applies them.
  Ids tick(MarsControl& p, Time t) {
    Actions out;
    p.tick(model, t, out);
    Ids ids;
    for (const Action& a : out.list()) {
      EXPECT_EQ(a.kind, ActionKind::kAdmit);
      ids.push_back(a.session);
      EXPECT_TRUE(model.sessions().transition(a.session, SessionState::kReasoning, t));
    }
    log.insert(log.end(), out.list().begin(), out.list().end());
    return ids;
  }

  NodeModel model;
  std::vector<Action> log;

 private:
  void observe(const Event& e, Time t) { ASSERT_TRUE(model.observe(e, t)); }
  std::uint32_t next_call_ = 1;
};

MarsControlParams defaults() { return MarsControlParams{}; }

// ---- parameters ---------------------------------------------------------------

TEST(MarsControl, ParamTableMatchesStructDefaultsAndBuilds) {
  auto params = PolicyParams::create("mars", kMarsControlParams, {});
  ASSERT_TRUE(params.has_value());
  const MarsControlParams p = mars_control_params(*params);
  const MarsControlParams d;
  EXPECT_EQ(p.window_max, 30u);
  EXPECT_EQ(p.window_min, 4u);
  EXPECT_EQ(p.window_init, 30u);
  EXPECT_EQ(p.window_inc, 1u);
  EXPECT_DOUBLE_EQ(p.window_dec_factor, 0.7);
  EXPECT_DOUBLE_EQ(p.control_interval_s, 0.2);
  EXPECT_DOUBLE_EQ(p.kv_target_ratio, 0.9);
  EXPECT_DOUBLE_EQ(p.cpu_backlog_low, 1);
  EXPECT_DOUBLE_EQ(p.cpu_backlog_high, 4);
  EXPECT_DOUBLE_EQ(p.cpu_queue_wait_low_s, 2);
  EXPECT_DOUBLE_EQ(p.cpu_queue_wait_high_s, 5);
  EXPECT_EQ(p.long_prefill_tokens, 50000u);
  EXPECT_DOUBLE_EQ(p.long_kv_ratio, 0.95);
  EXPECT_EQ(p.non_tail_long_cap, 2u);
  EXPECT_DOUBLE_EQ(p.needle_wait_s, 5);
  EXPECT_DOUBLE_EQ(p.tail_quiet_s, d.tail_quiet_s);
  for (const ParamSpec& spec : kMarsControlParams) {
    EXPECT_GE(spec.default_value, spec.min) << spec.name;
    EXPECT_LE(spec.default_value, spec.max) << spec.name;
    EXPECT_FALSE(spec.doc.empty()) << spec.name;
  }
  auto control = make_mars_control(*params);
  EXPECT_EQ(control->name(), "mars");
}

TEST(MarsControl, ParamsAreClampedAsTheRunnerDoes) {
  auto params =
      PolicyParams::create("mars", kMarsControlParams, {{"window_max", 8}, {"window_min", 10}, {"window_init", 30}});
  ASSERT_TRUE(params.has_value());
  MarsControl c(mars_control_params(*params));
  EXPECT_EQ(c.params().window_max, 8u);
  EXPECT_EQ(c.params().window_min, 8u);  // clamped to [1, W_max]
  EXPECT_EQ(c.window(), 8u);             // W_init clamped to [W_min, W_max]
}

// ---- AIMD (§2.1) --------------------------------------------------------------

TEST(MarsControl, MultiplicativeDecreaseOncePerInterval) {
  Host h;
  h.join(1, 1000);  // CPU unknown: W_cpu = W_max, never overloaded
  MarsControl c(defaults());
  h.kv(1000, 500);
  h.tick(c, at(0.0));  // first call controls: healthy, already at W_max
  EXPECT_EQ(c.window(), 30u);

  // Overload is set between control ticks (u = 0.95): no AIMD step yet, but
  // the admission window is capped by W_kv = W_min at once.
  h.kv(1000, 50);
  h.tick(c, at(0.1));
  EXPECT_TRUE(c.kv_overloaded());
  EXPECT_EQ(c.window(), 30u);
  EXPECT_EQ(c.w_kv(), 4u);
  EXPECT_EQ(c.w_adm(), 4u);

  // u = 0.86: still overloaded (clears only at <= 0.85); W_kv = round(24.8)
  // = 25 does not bind, so the pure MD sequence shows.
  h.kv(1000, 140);
  const std::vector<std::pair<double, std::uint32_t>> steps = {{0.2, 21}, {0.3, 21}, {0.39, 21}, {0.4, 14}, {0.5, 14},
                                                               {0.6, 9},  {0.8, 6},  {1.0, 4},   {1.2, 4}};
  for (auto [t, w] : steps) {
    h.tick(c, at(t));
    EXPECT_EQ(c.window(), w) << "t=" << t;
    EXPECT_EQ(c.w_kv(), 25u);
  }
}

TEST(MarsControl, AdditiveIncreaseOncePerIntervalWhenHealthy) {
  Host h;
  h.join(1, 1000);
  h.kv(1000, 500);
  h.cores(8);
  h.live(100, 100, at(0));
  MarsControlParams p = defaults();
  p.window_init = 10;
  MarsControl c(p);
  const std::vector<std::pair<double, std::uint32_t>> steps = {{0.0, 11}, {0.1, 11}, {0.2, 12}, {0.35, 12}, {0.4, 13}};
  for (auto [t, w] : steps) {
    h.tick(c, at(t));
    EXPECT_EQ(c.window(), w) << "t=" << t;
  }
  // r = 12/8 = 1.5: neither healthy for growth (> 1) nor overloaded (< 4): hold.
  h.tools_start(100, 12, at(0.5));
  h.tick(c, at(0.6));
  EXPECT_FALSE(c.cpu_overloaded());
  EXPECT_EQ(c.window(), 13u);
  h.tick(c, at(0.8));
  EXPECT_EQ(c.window(), 13u);
}

TEST(MarsControl, HoldInsideTheKvBandAndFoldTheCap) {
  Host h;
  h.join(1, 1000);
  MarsControlParams p = defaults();
  p.window_inc = 10;
  MarsControl c(p);
  h.kv(1000, 50);  // u = 0.95
  h.tick(c, at(0.0));
  EXPECT_EQ(c.window(), 4u);  // MD to 21, then W_kv = W_min folded in
  h.kv(1000, 140);            // u = 0.86, still overloaded
  h.tick(c, at(0.2));
  EXPECT_TRUE(c.kv_overloaded());
  EXPECT_EQ(c.window(), 4u);  // floor(4 * 0.7) = 2, floored at W_min
  h.kv(1000, 150);            // u = 0.85: clears, and AI
  h.tick(c, at(0.4));
  EXPECT_FALSE(c.kv_overloaded());
  EXPECT_EQ(c.window(), 14u);
  h.kv(1000, 500);
  h.tick(c, at(0.6));
  EXPECT_EQ(c.window(), 24u);
  h.kv(1000, 140);  // u = 0.86, not overloaded: the band holds
  h.tick(c, at(0.8));
  EXPECT_FALSE(c.kv_overloaded());
  EXPECT_EQ(c.w_kv(), 25u);
  EXPECT_EQ(c.window(), 24u);
  h.kv(1000, 125);  // u = 0.875: hold, but W_kv = 17 is folded into the state
  h.tick(c, at(1.0));
  EXPECT_EQ(c.w_kv(), 17u);
  EXPECT_EQ(c.window(), 17u);
  h.kv(1000, 500);  // healthy again: grows from the folded value
  h.tick(c, at(1.2));
  EXPECT_EQ(c.window(), 27u);
}

TEST(MarsControl, KvHysteresisEdges) {
  Host h;
  h.join(1, 1000);
  MarsControl c(defaults());
  const std::vector<std::pair<std::uint32_t, bool>> steps = {
      {101, false},  // u = 0.899: below the set threshold
      {100, true},   // u = 0.90: set
      {149, true},   // u = 0.851: held
      {150, false},  // u = 0.85: cleared
      {101, false},  // u = 0.899: not set again from below
  };
  double t = 0;
  for (auto [free, overloaded] : steps) {
    h.kv(1000, free, at(t));
    h.tick(c, at(t));
    EXPECT_EQ(c.kv_overloaded(), overloaded) << "free=" << free;
    t += 0.05;
  }
}

TEST(MarsControl, KvWindowRamp) {
  Host h;
  h.join(1, 1000);
  MarsControl c(defaults());
  const std::vector<std::pair<std::uint32_t, std::uint32_t>> steps = {
      {500, 30},  // u = 0.5
      {150, 30},  // u = 0.85
      {140, 25},  // u = 0.86: round(24.8)
      {130, 20},  // u = 0.87: round(19.6)
      {125, 17},  // u = 0.875: round(30 - 0.5 * 26)
      {110, 9},   // u = 0.89: round(30 - 0.8 * 26) = round(9.2)
      {100, 4},   // u = 0.90
      {10, 4},
  };
  for (auto [free, w] : steps) {
    h.kv(1000, free);
    h.tick(c, at(0));
    EXPECT_EQ(c.w_kv(), w) << "free=" << free;
  }
}

TEST(MarsControl, CpuWindowIsStatic) {
  Host h;
  h.join(1, 1000);
  h.kv(1000, 500);
  h.live(100, 100, at(0));
  MarsControl c(defaults());
  h.tick(c, at(0));
  EXPECT_EQ(c.w_cpu(), 30u);  // tool cores unknown: no CPU cap
  h.cores(8);
  h.tick(c, at(0.2));
  EXPECT_EQ(c.w_cpu(), 20u);  // ceil(8 * (1 + 4) / 2)
  h.tools_start(100, 40, at(0.3));
  h.tick(c, at(0.4));
  EXPECT_EQ(c.w_cpu(), 20u);  // independent of load
  h.cores(2);
  h.tick(c, at(0.5));
  EXPECT_EQ(c.w_cpu(), 5u);

  MarsControlParams p = defaults();
  p.cpu_backlog_high = 2;
  MarsControl c12(p);
  h.cores(8);
  h.tick(c12, at(1));
  EXPECT_EQ(c12.w_cpu(), 12u);  // ceil(8 * 1.5)
}

TEST(MarsControl, CpuOverloadHysteresis) {
  Host h;
  h.join(1, 1000);
  h.kv(1000, 500);
  h.cores(8);
  h.live(100, 100, at(0));
  MarsControl c(defaults());
  h.tools_start(100, 31, at(0));  // r = 3.875
  h.tick(c, at(0));
  EXPECT_FALSE(c.cpu_overloaded());
  EXPECT_EQ(c.window(), 20u);      // hold at 30, W_cpu = 20 folded in
  h.tools_start(100, 1, at(0.1));  // r = 4
  h.tick(c, at(0.1));
  EXPECT_TRUE(c.cpu_overloaded());
  EXPECT_EQ(c.window(), 20u);  // no control inside the interval
  h.tick(c, at(0.2));
  EXPECT_EQ(c.window(), 14u);     // floor(20 * 0.7)
  h.tools_end(100, 23, at(0.3));  // 9 left: r = 1.125
  h.tick(c, at(0.4));
  EXPECT_TRUE(c.cpu_overloaded());
  EXPECT_EQ(c.window(), 9u);
  h.tools_end(100, 1, at(0.5));  // r = 1
  h.tick(c, at(0.6));
  EXPECT_FALSE(c.cpu_overloaded());
  EXPECT_EQ(c.window(), 10u);  // healthy (r <= 1): AI
}

TEST(MarsControl, CpuUnknownNeverOverloads) {
  Host h;
  h.join(1, 1000);
  h.kv(1000, 500);
  h.live(100, 100, at(0));
  h.tools_start(100, 500, at(0));
  MarsControl c(defaults());
  h.tick(c, at(0));
  EXPECT_FALSE(c.cpu_overloaded());
  EXPECT_EQ(c.window(), 30u);
}

// ---- PackQueue (§2.2) ---------------------------------------------------------

TEST(MarsControl, SlotsNeverExceedWindowMinusLive) {
  Host h;
  h.join(1, 100000);
  h.kv(100000, 90000);
  h.cores(8);  // W_cpu = 20
  for (SessionId s = 1; s <= 4; ++s) h.live(s, 1000, at(0));
  for (SessionId s = 10; s < 40; ++s) h.waiting(s, 1000, at(0));
  MarsControl c(defaults());
  const Ids first = h.tick(c, at(0));
  EXPECT_EQ(c.w_adm(), 20u);
  EXPECT_EQ(first.size(), 16u);                     // 20 - 4 live
  EXPECT_EQ(c.last_mode(), MarsMode::kShortFirst);  // backlog 30 > 16 slots
  EXPECT_TRUE(h.tick(c, at(0.2)).empty());          // 20 live now
  EXPECT_EQ(c.last_mode(), MarsMode::kIdle);
  // The window shrinks below the live count: nothing, not a negative count.
  h.kv(100000, 12500);  // u = 0.875: W_kv = 17
  EXPECT_TRUE(h.tick(c, at(0.4)).empty());
  EXPECT_EQ(c.w_adm(), 17u);
  // One session ends: still 19 live against 17, nothing admitted.
  h.model.observe(SessionClosed{1}, at(0.5));
  EXPECT_TRUE(h.tick(c, at(0.6)).empty());
}

TEST(MarsControl, ShortFirstByEstimateWithFirstFit) {
  Host h;
  h.join(1, 1000);
  h.kv(1000, 400);  // u = 0.6; budget = 400 - ceil(100) = 300 blocks
  h.cores(8);
  h.live(100, 100, at(0));
  h.tools_start(100, 12, at(0));  // r = 1.5: not healthy, not overloaded
  h.waiting(1, 3200, at(1.0));    // 200 blocks
  h.waiting(2, 1600, at(1.1));    // 100
  h.waiting(3, 4800, at(1.2));    // 300
  h.waiting(4, 800, at(1.3));     // 50
  h.waiting(5, 2400, at(1.4));    // 150
  h.open(6, at(1.5));             // no round yet: est 0, short
  MarsControl c(defaults());
  EXPECT_EQ(h.tick(c, at(2)), (Ids{6, 4, 2, 5}));  // 0, 50, 100, 150 blocks; 200 and 300 do not fit
  EXPECT_EQ(c.last_mode(), MarsMode::kShortFirst);
  EXPECT_EQ(c.budget_blocks(), 300u);
}

TEST(MarsControl, LowPressureAdmitsInArrivalOrder) {
  Host h;
  h.join(1, 1000);
  h.kv(1000, 900);  // budget 800
  h.cores(8);
  h.waiting(1, 3200, at(1.0));  // 200 blocks
  h.waiting(2, 1600, at(1.1));  // 100
  h.waiting(3, 800, at(1.2));   // 50
  MarsControl c(defaults());
  EXPECT_EQ(h.tick(c, at(2)), (Ids{1, 2, 3}));
  EXPECT_EQ(c.last_mode(), MarsMode::kLowPressureFcfs);
}

TEST(MarsControl, LongHeldBackThenNeedleInserted) {
  Host h;
  h.join(1, 100000);
  h.kv(100000, 90000);
  h.cores(8);
  h.live(100, 1000, at(0));    // something in flight
  h.waiting(1, 60000, at(0));  // long
  MarsControl c(defaults());
  EXPECT_TRUE(h.tick(c, at(0)).empty());  // short queue empty since 0
  EXPECT_EQ(c.last_mode(), MarsMode::kLowPressureFcfs);
  EXPECT_TRUE(h.tick(c, at(4.8)).empty());
  EXPECT_EQ(h.tick(c, at(5.0)), (Ids{1}));  // empty for needle_wait_s = 5
  EXPECT_EQ(c.long_in_flight().at(1), 3750u);
}

TEST(MarsControl, NeedleTimerRestartsWhenAShortSessionQueues) {
  Host h;
  h.join(1, 100000);
  h.kv(100000, 90000);
  h.cores(8);
  h.live(100, 1000, at(0));
  h.waiting(1, 60000, at(0));
  MarsControl c(defaults());
  EXPECT_TRUE(h.tick(c, at(0)).empty());
  h.waiting(2, 1000, at(3));
  EXPECT_EQ(h.tick(c, at(3)), (Ids{2}));    // the short one; the long one is skipped
  EXPECT_TRUE(h.tick(c, at(3.2)).empty());  // timer restarts here
  EXPECT_TRUE(h.tick(c, at(8.0)).empty());  // 4.8 s
  EXPECT_EQ(h.tick(c, at(8.2)), (Ids{1}));
}

TEST(MarsControl, LongAdmittedAtOnceWhenNothingIsInFlightUpToTheCap) {
  Host h;
  h.join(1, 100000);
  h.kv(100000, 90000);
  h.cores(8);
  h.waiting(1, 60000, at(0));
  h.waiting(2, 70000, at(0.1));
  h.waiting(3, 55000, at(0.2));
  MarsControl c(defaults());
  EXPECT_EQ(h.tick(c, at(1)), (Ids{1, 2}));  // FCFS, non_tail_long_cap = 2
  EXPECT_TRUE(h.tick(c, at(7)).empty());     // cap reached; not tail (arrival 6.8 s ago < 10)
  EXPECT_EQ(c.last_mode(), MarsMode::kLowPressureFcfs);
}

TEST(MarsControl, LongByFitCountsNoSessionLongWhenAllAreAsLong) {
  // tandem's addition 10: as above, but every recent first prompt was about
  // as long, so none of the three is an outlier and all enter at once.
  Host h;
  h.join(1, 100000);
  h.kv(100000, 90000);
  h.cores(8);
  h.live(100, 1000, at(0));  // something in flight: no needle wait either
  h.waiting(1, 60000, at(0));
  h.waiting(2, 70000, at(0.1));
  h.waiting(3, 55000, at(0.2));
  MarsControl c(defaults());
  c.long_by_fit();
  for (int i = 0; i < 16; ++i) c.note_first_prompt(60000);
  EXPECT_EQ(h.tick(c, at(1)), (Ids{1, 2, 3}));
  EXPECT_TRUE(c.long_in_flight().empty()) << "none is 4x the median of 60,000";
}

// Six 60k-token sessions and a short one on a pool of 40,000 blocks of 16
// tokens (640k tokens): MARS's cap of 2 per 262,144 tokens scales to 4.
void six_long_and_one_short(Host& h) {
  h.join(1, 40000);
  h.kv(40000, 39000);
  h.cores(8);
  h.live(100, 1000, at(0));
  h.waiting(1, 4000, at(0));
  for (SessionId s = 2; s <= 7; ++s) h.waiting(s, 60000, at(0.1 * static_cast<double>(s)));
}

TEST(MarsControl, LongByFitCapsOutliersToMarsCapScaledToThePool) {
  // The recent first prompts were 4,000 tokens: 60,000 is an outlier (more
  // than 4 x 4,000 and past MARS's 50,000). Four enter by fit, after the short one.
  Host h;
  six_long_and_one_short(h);
  MarsControl c(defaults());
  c.long_by_fit();
  for (int i = 0; i < 16; ++i) c.note_first_prompt(4000);
  EXPECT_EQ(h.tick(c, at(1)), (Ids{1, 2, 3, 4, 5}));
  EXPECT_EQ(c.long_in_flight().size(), 4u);
  EXPECT_TRUE(h.tick(c, at(1.05)).empty()) << "the cap is reached";
  // MARS itself: two at most, and only once no short session waits (needle).
  Host m;
  six_long_and_one_short(m);
  MarsControl mars(defaults());
  EXPECT_EQ(m.tick(mars, at(1)), (Ids{1}));
}

TEST(MarsControl, LongByFitAllowsMarsCapPerEngineOnSmallPools) {
  // Four engines of 4,096 blocks: 262,144 tokens in all, MARS's one pool,
  // but four engines. A cap of 1 becomes 4 (per engine), not 1 (per pool).
  Host h;
  for (EngineId e = 1; e <= 4; ++e) {
    h.join(e, 4096);
    h.kv(4096, 4096, at(0), e);
  }
  h.cores(8);
  h.live(100, 1000, at(0));
  h.waiting(1, 4000, at(0));
  for (SessionId s = 2; s <= 7; ++s) h.waiting(s, 51000, at(0.1 * static_cast<double>(s)));
  MarsControlParams p = defaults();
  p.non_tail_long_cap = 1;
  p.kv_target_ratio = 0.999;  // a reserve of 17 blocks: five 3,188-block sessions fit
  MarsControl c(p);
  c.long_by_fit();
  for (int i = 0; i < 16; ++i) c.note_first_prompt(4000);
  EXPECT_EQ(h.tick(c, at(1)), (Ids{1, 2, 3, 4, 5}));
  EXPECT_EQ(c.long_in_flight().size(), 4u);
}

TEST(MarsControl, LongByFitLetsOneLongSessionInEvenWithACapOfZero) {
  // MARS with non_tail_long_cap = 0 still has its tail mode; tandem's rule
  // has none, so its cap is at least one.
  Host h;
  six_long_and_one_short(h);
  MarsControlParams p = defaults();
  p.non_tail_long_cap = 0;
  MarsControl c(p);
  c.long_by_fit();
  for (int i = 0; i < 16; ++i) c.note_first_prompt(4000);
  EXPECT_EQ(h.tick(c, at(1)), (Ids{1, 2}));
}

TEST(MarsControl, LongByFitUsesMarsThresholdAloneUntilItHasSeenSixteenPrompts) {
  Host h;
  six_long_and_one_short(h);
  MarsControl c(defaults());
  c.long_by_fit();
  for (int i = 0; i < 15; ++i) c.note_first_prompt(60000);  // one short of a median
  EXPECT_EQ(h.tick(c, at(1)), (Ids{1, 2, 3, 4, 5}));
  c.note_first_prompt(0);  // ignored
  c.note_first_prompt(60000);
  EXPECT_EQ(h.tick(c, at(1.05)), (Ids{6, 7})) << "16 prompts of 60,000: no outlier left, no cap";
}

TEST(MarsControl, PinnedBlocksCountAsFreeWhenAsked) {
  // tandem's addition 9: 900 of 1000 blocks pinned, 50 free. MARS sees 95 %
  // used (overloaded); counting the pins as room, 5 %.
  Host h;
  h.join(1, 1000);
  KvPoolStats s;
  s.blocks_total = 1000;
  s.blocks_free = 50;
  s.blocks_pinned = 900;
  ASSERT_TRUE(h.model.observe(KvStatsReported{1, s}, at(0)));
  MarsControl mars(defaults());
  h.tick(mars, at(0));
  EXPECT_NEAR(mars.kv_usage(), 0.95, 1e-12);
  EXPECT_TRUE(mars.kv_overloaded());
  MarsControl ours(defaults());
  ours.pinned_is_free();
  h.tick(ours, at(0));
  EXPECT_NEAR(ours.kv_usage(), 0.05, 1e-12);
  EXPECT_FALSE(ours.kv_overloaded());
}

TEST(MarsControl, ShortFirstNeedleTakesSmallestLongFirst) {
  Host h;
  h.join(1, 100000);
  h.kv(100000, 90000);
  h.cores(8);
  h.live(100, 1000, at(0));
  h.tools_start(100, 12, at(0));  // not healthy → short-first
  h.waiting(1, 70000, at(0));
  h.waiting(2, 60000, at(0.1));
  h.waiting(3, 65000, at(0.2));
  MarsControl c(defaults());
  EXPECT_TRUE(h.tick(c, at(1)).empty());
  EXPECT_EQ(c.last_mode(), MarsMode::kShortFirst);
  EXPECT_EQ(h.tick(c, at(6)), (Ids{2, 3}));  // ascending est, cap 2
}

TEST(MarsControl, TailModeFirstFitInArrivalOrder) {
  Host h;
  h.join(1, 20000, 64);
  h.kv(20000, 10000);  // tail budget = floor(10000 * 0.95) = 9500
  h.cores(8);
  h.waiting(1, 400000, at(0));    // 6250 blocks
  h.waiting(2, 320000, at(0.1));  // 5000
  h.waiting(3, 192000, at(0.2));  // 3000
  h.waiting(4, 60000, at(0.3));   // 938
  MarsControl c(defaults());
  EXPECT_EQ(h.tick(c, at(10.3)), (Ids{1, 3}));  // 9500 - 6250 = 3250; 5000 skipped; 3000 fits; 938 > 250
  EXPECT_EQ(c.last_mode(), MarsMode::kTail);
  // The reservations stay while the sessions live: nothing more fits.
  EXPECT_TRUE(h.tick(c, at(10.5)).empty());
  // One long session finishes: its reservation goes, and 5000 fits 9500 - 3000.
  h.model.observe(SessionClosed{1}, at(11));
  EXPECT_EQ(h.tick(c, at(11)), (Ids{2, 4}));
}

TEST(MarsControl, TailModeDeadlockEscape) {
  Host h;
  h.join(1, 20000, 64);
  h.kv(20000, 1000);  // tail budget 950: no long session fits
  h.cores(8);
  h.waiting(1, 400000, at(0));
  h.waiting(2, 320000, at(0.1));
  MarsControl c(defaults());
  EXPECT_EQ(h.tick(c, at(20)), (Ids{1}));  // the oldest, over budget
  EXPECT_EQ(c.last_mode(), MarsMode::kTail);
  EXPECT_TRUE(h.tick(c, at(20.2)).empty());  // a long session is in flight now
}

TEST(MarsControl, TailModeSoftStartWithShortInFlight) {
  Host h;
  h.join(1, 20000, 64);
  h.kv(20000, 10000);
  h.cores(8);
  h.live(100, 1000, at(0));  // untracked (short) in flight
  h.waiting(1, 192000, at(0));
  h.waiting(2, 60000, at(0.1));
  MarsControl c(defaults());
  EXPECT_EQ(h.tick(c, at(11)), (Ids{1}));  // both fit, but one at a time
  EXPECT_EQ(h.tick(c, at(11.2)), (Ids{2}));
}

TEST(MarsControl, TailModeIgnoresTheAdaptiveWindow) {
  Host h;
  h.join(1, 200000, 16);
  h.kv(200000, 19000);  // u = 0.905: W_kv = W_min = 4; tail budget 18050
  h.cores(8);
  for (SessionId s = 1; s <= 6; ++s) h.waiting(s, 51200, at(0));  // 3200 blocks each
  MarsControl c(defaults());
  EXPECT_EQ(h.tick(c, at(10)), (Ids{1, 2, 3, 4, 5}));  // 5 * 3200 = 16000 <= 18050 < 6 * 3200
  EXPECT_EQ(c.w_adm(), 4u);
}

TEST(MarsControl, CpuOverloadedLongFirstWithFirstFit) {
  Host h;
  h.join(1, 10000);
  h.kv(10000, 5000);  // budget 5000 - 1000 = 4000
  h.cores(8);
  h.live(100, 1000, at(0));
  h.tools_start(100, 32, at(0));  // r = 4
  h.waiting(1, 1000, at(1.0));    // 63 blocks
  h.waiting(2, 60000, at(1.1));   // 3750
  h.waiting(3, 20000, at(1.2));   // 1250
  h.waiting(4, 100000, at(1.3));  // 6250
  h.waiting(5, 1000, at(1.4));    // 63, same est as 1, younger
  MarsControl c(defaults());
  EXPECT_EQ(h.tick(c, at(2)), (Ids{2, 1, 5}));  // 6250 skip; 3750; 1250 skip (250 left); 63; 63
  EXPECT_TRUE(c.cpu_overloaded());
  EXPECT_EQ(c.last_mode(), MarsMode::kCpuLongFirst);
}

TEST(MarsControl, NoKvStatsShortOnlyAtTheFloor) {
  Host h;
  h.join(1, 10000);  // joined, never reported stats
  h.cores(8);
  h.waiting(1, 60000, at(0));  // long
  h.waiting(2, 40000, at(0.1));
  h.waiting(3, 45000, at(0.2));
  MarsControl c(defaults());
  EXPECT_EQ(h.tick(c, at(1)), (Ids{2, 3}));  // no budget check; no long
  EXPECT_FALSE(c.kv_known());
  EXPECT_TRUE(c.kv_overloaded());
  EXPECT_EQ(c.w_kv(), 4u);
  EXPECT_EQ(c.window(), 4u);
  EXPECT_TRUE(h.tick(c, at(6)).empty());  // the long one waits (not tail: arrivals 5.8 s ago)
}

TEST(MarsControl, NoKvStatsLongFirstStillSkipsLong) {
  Host h;
  h.join(1, 10000);
  h.cores(8);
  h.live(100, 1000, at(0));
  h.tools_start(100, 32, at(0));  // CPU overloaded: long-first ordering
  h.waiting(1, 60000, at(0.1));
  h.waiting(2, 1000, at(0.2));
  h.waiting(3, 2000, at(0.3));
  MarsControl c(defaults());
  EXPECT_EQ(h.tick(c, at(1)), (Ids{3, 2}));  // descending est, the long one skipped
  EXPECT_EQ(c.last_mode(), MarsMode::kCpuLongFirst);
}

TEST(MarsControl, NoKvStatsTailAdmitsOneSmallestLong) {
  Host h;
  h.join(1, 10000);
  h.cores(8);
  h.waiting(1, 90000, at(0));
  h.waiting(2, 60000, at(0.1));
  h.waiting(3, 70000, at(0.2));
  MarsControl c(defaults());
  EXPECT_EQ(h.tick(c, at(11)), (Ids{2}));
  EXPECT_TRUE(h.tick(c, at(11.2)).empty());
}

// ---- determinism ----------------------------------------------------------------

std::vector<Action> scenario() {
  Host h;
  h.join(1, 4000);
  h.join(2, 4000, 32);
  h.cores(8);
  MarsControl c(defaults());
  std::uint64_t id = 1;
  for (int step = 0; step < 60; ++step) {
    const Time t = at(step * 0.25);
    h.kv(4000, static_cast<std::uint32_t>(400 + (step * 137) % 3000), t, 1);
    h.kv(4000, static_cast<std::uint32_t>(300 + (step * 71) % 3500), t, 2);
    for (int k = 0; k < 3; ++k) {
      const std::uint32_t prompt = static_cast<std::uint32_t>(500 + (id * 7919) % 80000);
      h.waiting(id, prompt, t, static_cast<EngineId>(1 + id % 2));
      ++id;
    }
    if (step % 5 == 4 && id > 10) h.model.observe(SessionClosed{id - 10}, t);
    h.tick(c, t);
  }
  return h.log;
}

TEST(MarsControl, SameEventsSameActions) {
  const std::vector<Action> a = scenario();
  const std::vector<Action> b = scenario();
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace tandem::sched
