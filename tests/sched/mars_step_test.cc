// MarsStepScheduler: MARS's MLFQ levels, quanta, demotion and aging; running
// and waiting order; priority-aligned victims; chunk halving; vLLM's "no
// admission in a step that preempted"; determinism. Every expectation is
// computed by hand from [mars_code] §2.3–2.5 (block size 16).
#include "sched/mars_step.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace tandem::sched {
namespace {

using Chunks = std::vector<std::pair<std::uint64_t, std::uint32_t>>;  // (request id, tokens)

Time at_ms(std::int64_t ms) { return base::from_ns(ms * 1'000'000); }
Time at_s(double s) { return base::from_ns(static_cast<std::int64_t>(s * 1e9)); }

std::uint32_t blocks(std::uint32_t tokens) { return (tokens + 15) / 16; }

// A running request; `last` = Time{} means "never scheduled".
StepRequest running(std::uint64_t id, std::uint32_t prompt, std::uint32_t computed, Time arrival, Time last) {
  StepRequest r;
  r.id = id;
  r.session = id;
  r.phase = RequestPhase::kRunning;
  r.prompt_tokens = prompt;
  r.computed_tokens = computed;
  r.output_tokens = computed > prompt ? computed - prompt : 0;
  r.blocks_held = blocks(computed);
  r.arrival = arrival;
  r.last_scheduled = last;
  return r;
}

StepRequest waiting(std::uint64_t id, std::uint32_t prompt, Time arrival) {
  StepRequest r;
  r.id = id;
  r.session = id;
  r.phase = RequestPhase::kWaiting;
  r.prompt_tokens = prompt;
  r.arrival = arrival;
  return r;
}

StepInput input(const std::vector<StepRequest>& reqs, std::uint32_t free_blocks, std::uint32_t budget = 8192) {
  StepInput in;
  in.token_budget = budget;
  in.max_seqs = 256;
  in.block_size = 16;
  in.free_blocks = free_blocks;
  in.requests = reqs;
  return in;
}

Chunks chunks(const StepPlan& p, const std::vector<StepRequest>& reqs) {
  Chunks c;
  for (const ScheduledChunk& s : p.run) c.emplace_back(reqs[s.request].id, s.tokens);
  return c;
}
std::vector<std::uint64_t> preempted(const StepPlan& p, const std::vector<StepRequest>& reqs) {
  std::vector<std::uint64_t> ids;
  ids.reserve(p.preempt.size());
  for (std::uint32_t i : p.preempt) ids.push_back(reqs[i].id);
  return ids;
}

StepPlan plan(MarsStepScheduler& s, const std::vector<StepRequest>& reqs, std::uint32_t free_blocks, Time now,
              std::uint32_t budget = 8192) {
  StepPlan p;
  s.plan(input(reqs, free_blocks, budget), now, p);
  return p;
}

// A toy engine that applies plans the way vLLM would: chunks extend the KV,
// preemption frees it and sends the request back to wait.
struct Engine {
  std::vector<StepRequest> reqs;
  std::uint32_t free_blocks = 100000;
  std::uint32_t budget = 8192;

  StepPlan step(StepScheduler& s, Time now) {
    StepPlan p;
    s.plan(input(reqs, free_blocks, budget), now, p);
    for (std::uint32_t i : p.preempt) {
      StepRequest& r = reqs[i];
      free_blocks += r.blocks_held;
      r.blocks_held = 0;
      r.computed_tokens = 0;
      r.output_tokens = 0;
      r.phase = RequestPhase::kPreempted;
    }
    for (const ScheduledChunk& c : p.run) {
      StepRequest& r = reqs[c.request];
      if (r.phase != RequestPhase::kRunning) r.computed_tokens = r.cached_tokens;
      r.phase = RequestPhase::kRunning;
      r.computed_tokens += c.tokens;
      if (r.computed_tokens > r.prompt_tokens) r.output_tokens = r.computed_tokens - r.prompt_tokens;
      const std::uint32_t need = blocks(r.computed_tokens);
      free_blocks -= need - r.blocks_held;
      r.blocks_held = need;
      r.last_scheduled = now;
    }
    return p;
  }
  // A request finishes: its blocks go back and it leaves the queue.
  void finish(std::uint64_t id) {
    auto it = std::find_if(reqs.begin(), reqs.end(), [id](const StepRequest& r) { return r.id == id; });
    ASSERT_NE(it, reqs.end());
    free_blocks += it->blocks_held;
    reqs.erase(it);
  }
  const StepRequest& get(std::uint64_t id) const {
    return *std::find_if(reqs.begin(), reqs.end(), [id](const StepRequest& r) { return r.id == id; });
  }
};

// ---- levels and quanta ------------------------------------------------------

TEST(MarsFill, ALonePrefillTakesTheUnusedBudgetOnlyWhenAsked) {
  // One new request of 20,000 tokens: MARS gives it quantum 0 (2048) of the
  // 8192-token budget; with fill_idle_budget it takes all 8192.
  const std::vector<StepRequest> lone = {waiting(1, 20000, at_ms(0))};
  MarsStepScheduler mars;
  StepPlan a;
  mars.plan(input(lone, 10000), at_ms(1), a);
  ASSERT_EQ(a.run.size(), 1u);
  EXPECT_EQ(a.run[0].tokens, 2048u);
  MarsStepParams p;
  p.fill_idle_budget = true;
  MarsStepScheduler filled(p);
  StepPlan b;
  filled.plan(input(lone, 10000), at_ms(1), b);
  ASSERT_EQ(b.run.size(), 1u);
  EXPECT_EQ(b.run[0].tokens, 8192u);
  // A decode in the step: the quanta stand, nobody's step grows.
  const std::vector<StepRequest> mixed = {running(2, 100, 120, at_ms(0), at_ms(0)), waiting(1, 20000, at_ms(0))};
  MarsStepScheduler filled2(p);
  StepPlan c;
  filled2.plan(input(mixed, 10000), at_ms(1), c);
  ASSERT_EQ(c.run.size(), 2u);
  EXPECT_EQ(c.run[1].tokens, 2048u);
  // Not enough blocks for the rest: the chunk keeps what it had.
  MarsStepScheduler filled3(p);
  StepPlan d;
  filled3.plan(input(lone, 200), at_ms(1), d);
  ASSERT_EQ(d.run.size(), 1u);
  EXPECT_EQ(d.run[0].tokens, 2048u);
}

TEST(MarsProgramQuanta, ASessionsServiceOverItsRoundsCapsItsNextPrefillChunk) {
  // Session 1's first round has 40,000 tokens scheduled (quantum 0 raised to
  // take it in one step): by service it is at level 3. Its next round has
  // 1,000 new tokens, level 0 by themselves: with program_quanta its chunk is
  // quantum 3 (256); session 2, with no service, takes all 1,000.
  MarsStepParams p;
  p.quanta = {40000, 1024, 512, 256};
  p.program_quanta = true;
  auto second_round = [](MarsStepScheduler& s) {
    std::vector<StepRequest> next = {running(2, 41000, 40000, at_s(1), at_s(9)),
                                     running(3, 41000, 40000, at_s(1), at_s(9))};
    next[0].session = 1;
    next[1].session = 2;
    return chunks(plan(s, next, 100000, at_s(10), 50000), next);
  };
  MarsStepScheduler on(p);
  const std::vector<StepRequest> first = {waiting(1, 40000, at_s(0))};
  EXPECT_EQ(chunks(plan(on, first, 100000, at_s(1), 50000), first), (Chunks{{1, 40000}}));
  EXPECT_EQ(on.program_level(1), 3u);
  EXPECT_EQ(on.program_level(2), 0u);
  EXPECT_EQ(second_round(on), (Chunks{{2, 256}, {3, 1000}}));
  // Its end forgets the session's service.
  on.on_session_end(1, at_s(11));
  EXPECT_EQ(on.program_level(1), 0u);

  // Off (MARS): the round's own remaining prefill decides.
  p.program_quanta = false;
  MarsStepScheduler off(p);
  plan(off, first, 100000, at_s(1), 50000);
  EXPECT_EQ(off.program_level(1), 0u);
  EXPECT_EQ(second_round(off), (Chunks{{2, 1000}, {3, 1000}}));
}

TEST(MarsProgramQuanta, ServiceOfASessionNotSeenForAnHourIsForgotten) {
  // An engine that never reports session ends must not hold their service
  // for ever.
  MarsStepParams p;
  p.quanta = {40000, 1024, 512, 256};
  p.program_quanta = true;
  MarsStepScheduler s(p);
  const std::vector<StepRequest> one = {waiting(1, 40000, at_s(0))};
  plan(s, one, 100000, at_s(1), 50000);
  EXPECT_EQ(s.program_level(1), 3u);
  // Session 5 runs 100 tokens a step for 64 steps, starting an hour later:
  // the sweep at step 64 forgets session 1 and keeps session 5 (6,400
  // tokens: level 1).
  const std::vector<StepRequest> other = {waiting(5, 100, at_s(4000))};
  for (int i = 0; i < 64; ++i) plan(s, other, 100000, at_s(4000 + i));
  EXPECT_EQ(s.program_level(1), 0u);
  EXPECT_EQ(s.program_level(5), 1u);
}

TEST(MarsLevels, FromRemainingPrefillTokens) {
  MarsStepScheduler s;
  EXPECT_EQ(s.level_for(1000), 0u);
  EXPECT_EQ(s.level_for(2048), 0u);
  EXPECT_EQ(s.level_for(2049), 1u);
  EXPECT_EQ(s.level_for(5000), 1u);
  EXPECT_EQ(s.level_for(8192), 1u);
  EXPECT_EQ(s.level_for(20000), 2u);
  EXPECT_EQ(s.level_for(32768), 2u);
  EXPECT_EQ(s.level_for(32769), 3u);
  EXPECT_EQ(s.level_for(50000), 3u);
}

TEST(MarsLevels, RecentlyServedRunningRequestGetsItsLevelsQuantum) {
  // Running, scheduled 1 s ago (no aging), feedback 0: the base level is the
  // remaining prefill's, so the chunk is quanta[level] (or the remainder).
  MarsStepScheduler s;
  const Time now = at_s(10);
  const Time last = at_s(9);
  std::vector<StepRequest> reqs = {
      running(1, 16 + 1000, 16, at_s(1), last),   // level 0: the whole remainder
      running(2, 16 + 5000, 16, at_s(2), last),   // level 1: 1024
      running(3, 16 + 20000, 16, at_s(3), last),  // level 2: 512
      running(4, 16 + 50000, 16, at_s(4), last),  // level 3: 256
  };
  StepPlan p = plan(s, reqs, 100000, now);
  EXPECT_EQ(chunks(p, reqs), (Chunks{{1, 1000}, {2, 1024}, {3, 512}, {4, 256}}));
  EXPECT_EQ(s.effective_level(reqs[3], now), 3u);
}

TEST(MarsLevels, FirstChunkOfANewRequestIsTheTopQuantum) {
  // Never scheduled: aged by levels+1, so level 0 whatever its size.
  MarsStepScheduler s;
  std::vector<StepRequest> reqs = {waiting(1, 1000, at_s(1)), waiting(2, 5000, at_s(2)), waiting(3, 20000, at_s(3)),
                                   waiting(4, 50000, at_s(4))};
  StepPlan p = plan(s, reqs, 100000, at_s(5), 16384);
  // Waiting order is by total-prompt level: 1000 (0), 5000 (1), 20000 (2), 50000 (3).
  EXPECT_EQ(chunks(p, reqs), (Chunks{{1, 1000}, {2, 2048}, {3, 2048}, {4, 2048}}));
  // A running request this scheduler never saw, never scheduled: also level 0.
  MarsStepScheduler s2;
  std::vector<StepRequest> r2 = {running(7, 60000, 16, at_s(1), Time{})};
  EXPECT_EQ(chunks(plan(s2, r2, 100000, at_s(5)), r2), (Chunks{{7, 2048}}));
}

TEST(MarsLevels, QuantumIsCappedByTheTokenBudgetAndAFullCappedChunkDemotes) {
  MarsStepScheduler s;
  std::vector<StepRequest> reqs = {waiting(1, 50000, at_s(1))};
  StepPlan p = plan(s, reqs, 100000, at_s(2), /*budget=*/1500);
  EXPECT_EQ(chunks(p, reqs), (Chunks{{1, 1500}}));
  ASSERT_NE(s.state(1), nullptr);
  EXPECT_EQ(s.state(1)->feedback, 1u);
}

// ---- feedback ---------------------------------------------------------------

TEST(MarsFeedback, FullQuantumDemotesButABudgetCutChunkDoesNot) {
  MarsStepScheduler s;
  Engine e;
  e.budget = 3000;
  e.reqs = {waiting(1, 2500, at_s(1)), waiting(2, 2500, at_s(2))};
  // Step 1: A takes its full quantum (2048), B what is left of the budget (952).
  StepPlan p1 = e.step(s, at_s(10));
  EXPECT_EQ(chunks(p1, e.reqs), (Chunks{{1, 2048}, {2, 952}}));
  EXPECT_EQ(s.state(1)->feedback, 1u);
  EXPECT_EQ(s.state(2)->feedback, 0u);
  // Step 2: B (level 0) now runs before A (demoted to level 1, quantum 1024).
  StepPlan p2 = e.step(s, at_s(10.05));
  EXPECT_EQ(chunks(p2, e.reqs), (Chunks{{2, 1548}, {1, 452}}));
  // Both finished their prefill: feedback back to 0.
  EXPECT_EQ(s.state(1)->feedback, 0u);
  EXPECT_EQ(s.state(2)->feedback, 0u);
}

TEST(MarsFeedback, ARequestServedEveryStepSettlesAt256TokenChunks) {
  MarsStepScheduler s;
  Engine e;
  e.reqs = {waiting(1, 8000, at_s(1))};
  std::vector<std::uint32_t> got;
  for (int step = 0; step < 22; ++step) {
    StepPlan p = e.step(s, at_ms(2000 + 50 * step));
    ASSERT_EQ(p.run.size(), 1u);
    got.push_back(p.run[0].tokens);
  }
  // 2048 (level 0) → 1024 (feedback 1) → 512 (2) → 256 (3) until the prefill
  // is done — even once the remainder drops below 2048 (remaining level 0):
  // 8000 − 3584 = 4416 = 17 × 256 + 64; then decode.
  std::vector<std::uint32_t> want = {2048, 1024, 512};
  want.insert(want.end(), 17, 256);
  want.push_back(64);
  want.push_back(1);
  EXPECT_EQ(got, want);
}

TEST(MarsFeedback, AgingPromotesOneLevelPer30SecondsUnscheduled) {
  MarsStepScheduler s;
  Engine e;
  e.reqs = {waiting(1, 100000, at_s(0))};
  e.step(s, at_ms(1000));  // 2048, feedback 1
  const std::int64_t last = 1100;
  e.step(s, at_ms(last));  // level max(1, 3) = 3: 256, feedback 2
  ASSERT_EQ(e.get(1).computed_tokens, 2048u + 256u);
  const StepRequest& r = e.get(1);
  EXPECT_EQ(s.effective_level(r, at_ms(last + 29'999)), 3u);
  EXPECT_EQ(s.effective_level(r, at_ms(last + 30'000)), 2u);
  EXPECT_EQ(s.effective_level(r, at_ms(last + 59'999)), 2u);
  EXPECT_EQ(s.effective_level(r, at_ms(last + 60'000)), 1u);
  EXPECT_EQ(s.effective_level(r, at_ms(last + 90'000)), 0u);
  EXPECT_EQ(s.effective_level(r, at_ms(last + 600'000)), 0u);  // floor at 0
  // Scheduled after 30 s idle: level 2, a 512 chunk.
  StepPlan p = e.step(s, at_ms(last + 30'000));
  EXPECT_EQ(chunks(p, e.reqs), (Chunks{{1, 512}}));
  // Feedback is now 3; 60 s later the level is 3 − 2 = 1: 1024.
  p = e.step(s, at_ms(last + 90'000));
  EXPECT_EQ(chunks(p, e.reqs), (Chunks{{1, 1024}}));
}

// ---- order ------------------------------------------------------------------

TEST(MarsOrder, DecodeRequestsRunFirst) {
  // P is older and was served earlier, but it is at level 1 (5000 left);
  // D decodes (level 0). The budget of 100 shows the order.
  MarsStepScheduler s;
  std::vector<StepRequest> reqs = {running(1, 16 + 5000, 16, at_s(0), at_s(5)),
                                   running(2, 100, 150, at_s(1), at_s(5.5))};
  StepPlan p = plan(s, reqs, 100000, at_s(6), /*budget=*/100);
  EXPECT_EQ(chunks(p, reqs), (Chunks{{2, 1}, {1, 99}}));
}

TEST(MarsOrder, RunningTiesBrokenByLastScheduledThenArrival) {
  MarsStepScheduler s;
  std::vector<StepRequest> reqs = {
      running(1, 116, 16, at_s(0), at_s(5)),  // served last
      running(2, 116, 16, at_s(2), at_s(3)),  // served at 3 s, arrived after 3
      running(3, 116, 16, at_s(1), at_s(3)),  // served at 3 s, arrived first of the two
  };
  StepPlan p = plan(s, reqs, 100000, at_s(6));
  EXPECT_EQ(chunks(p, reqs), (Chunks{{3, 100}, {2, 100}, {1, 100}}));
}

TEST(MarsOrder, WaitingQueueIsPreemptedFirstThenPromptLevelThenArrival) {
  MarsStepScheduler s;
  std::vector<StepRequest> reqs = {waiting(1, 40000, at_s(1)), waiting(2, 1000, at_s(2)), waiting(3, 5000, at_s(3)),
                                   waiting(4, 1000, at_s(4)), waiting(5, 50000, at_s(5))};
  reqs[4].phase = RequestPhase::kPreempted;
  StepPlan p = plan(s, reqs, 100000, at_s(6), 16384);
  EXPECT_EQ(chunks(p, reqs), (Chunks{{5, 2048}, {2, 1000}, {4, 1000}, {3, 2048}, {1, 2048}}));
}

TEST(MarsOrder, OverflowWindowBoundsTheWaitingRequestsConsidered) {
  MarsStepParams params;
  params.overflow_window = 3;
  MarsStepScheduler s(params);
  // One running: room for the first two arrivals; among them the smaller
  // prompt goes first. Request 3 sits in the overflow.
  std::vector<StepRequest> reqs = {running(9, 10, 20, at_s(0), at_s(1)), waiting(1, 5000, at_s(1)),
                                   waiting(2, 1000, at_s(2)), waiting(3, 1000, at_s(3))};
  StepPlan p = plan(s, reqs, 100000, at_s(6), 16384);
  EXPECT_EQ(chunks(p, reqs), (Chunks{{9, 1}, {2, 1000}, {1, 2048}}));
  // Off: all three.
  params.overflow_window = 0;
  MarsStepScheduler all(params);
  p = plan(all, reqs, 100000, at_s(6), 16384);
  EXPECT_EQ(chunks(p, reqs), (Chunks{{9, 1}, {2, 1000}, {3, 1000}, {1, 2048}}));
}

// ---- victims ------------------------------------------------------------------

TEST(MarsVictim, LowestPriorityLevelFirstAndThePreemptedGoToTheHead) {
  MarsStepScheduler s;
  Engine e;
  e.free_blocks = 0;
  const Time last = at_s(9);
  e.reqs = {
      running(1, 3900, 4000, at_s(0), last),  // decoding, 250 blocks, needs a 251st
      running(2, 6000, 1024, at_s(1), last),  // prefill, 4976 left: level 1
      running(3, 60000, 16, at_s(2), last),   // prefill, level 3, one block
  };
  // D1 does not fit: the victim is the level-3 prefill (not the decode with
  // 250 blocks). P2 then halves 1024 → 16 and still does not fit: the victim
  // is P2 itself (level 1 > decode's −1), which ends the running pass.
  StepPlan p = e.step(s, at_s(10));
  EXPECT_EQ(chunks(p, e.reqs), (Chunks{{1, 1}}));
  EXPECT_EQ(preempted(p, e.reqs), (std::vector<std::uint64_t>{3, 2}));
  EXPECT_FALSE(s.state(2)->last_scheduled.has_value());
  EXPECT_EQ(s.state(2)->feedback, 0u);
  // D1 finishes; the most recently preempted (2) is at the head, then 3.
  e.finish(1);
  p = e.step(s, at_s(11));
  EXPECT_EQ(chunks(p, e.reqs), (Chunks{{2, 2048}, {3, 2048}}));
}

TEST(MarsVictim, SameLevelMostBlocksThenLatestArrival) {
  MarsStepScheduler s;
  const Time last = at_s(9);
  std::vector<StepRequest> reqs = {
      running(1, 100, 160, at_s(0), last),   // decoding, needs an 11th block
      running(2, 6000, 320, at_s(3), last),  // level 1, 20 blocks, latest arrival
      running(3, 6000, 640, at_s(1), last),  // level 1, 40 blocks
      running(4, 6000, 640, at_s(2), last),  // level 1, 40 blocks, later than 3
  };
  // Victim 4 frees 40 blocks; D1 takes 1 (39 left). Then 3 (earlier arrival)
  // halves 1024 → 512 (32 blocks, 7 left) and 2 halves to 64 (4 blocks).
  StepPlan p = plan(s, reqs, 0, at_s(10));
  EXPECT_EQ(preempted(p, reqs), (std::vector<std::uint64_t>{4}));
  EXPECT_EQ(chunks(p, reqs), (Chunks{{1, 1}, {3, 512}, {2, 64}}));
}

TEST(MarsVictim, DecodingRequestsOnlyWhenAllRunningDecode) {
  MarsStepScheduler s;
  const Time last = at_s(9);
  std::vector<StepRequest> reqs = {
      running(1, 100, 160, at_s(0), last),  // 10 blocks
      running(2, 100, 320, at_s(1), last),  // 20 blocks
      running(3, 100, 320, at_s(2), last),  // 20 blocks, latest
  };
  StepPlan p = plan(s, reqs, 0, at_s(10));
  EXPECT_EQ(preempted(p, reqs), (std::vector<std::uint64_t>{3}));
  EXPECT_EQ(chunks(p, reqs), (Chunks{{1, 1}, {2, 1}}));
}

TEST(MarsVictim, AVictimAlreadyScheduledThisStepGivesBackItsChunk) {
  // P was never scheduled (effective level 0, first in order) and takes 128
  // blocks; Q halves 1000 → 16 and still does not fit; the victim is P
  // (level max(0, 3) = 3: aging is ignored for victims), already scheduled.
  MarsStepScheduler s;
  std::vector<StepRequest> reqs = {running(1, 50000, 16, at_s(0), Time{}), running(2, 1016, 16, at_s(1), at_s(9))};
  StepPlan p = plan(s, reqs, 128, at_s(10));
  EXPECT_EQ(preempted(p, reqs), (std::vector<std::uint64_t>{1}));
  EXPECT_EQ(chunks(p, reqs), (Chunks{{2, 16}}));
  EXPECT_EQ(s.state(2)->feedback, 0u);  // cut by halving: no demotion
  EXPECT_EQ(s.state(1)->feedback, 0u);
  EXPECT_FALSE(s.state(1)->last_scheduled.has_value());

  // With a 2064-token budget P leaves Q 16 tokens (one block, not there);
  // preempting P gives its 2048 tokens back, so R (served after Q) runs too.
  MarsStepScheduler s2;
  reqs.push_back(running(3, 116, 16, at_s(2), at_s(9.5)));
  p = plan(s2, reqs, 128, at_s(10), /*budget=*/2064);
  EXPECT_EQ(preempted(p, reqs), (std::vector<std::uint64_t>{1}));
  EXPECT_EQ(chunks(p, reqs), (Chunks{{2, 16}, {3, 100}}));
}

// ---- chunk halving --------------------------------------------------------------

TEST(MarsHalving, HalvesFrom2048DownToOneBlockUntilItFits) {
  struct Case {
    std::uint32_t free_blocks;
    std::uint32_t want;  // 0: not admitted
  };
  // 2048 tokens = 128 blocks, 1024 = 64, …, 32 = 2, 16 = 1.
  for (Case c :
       {Case{128, 2048}, Case{127, 1024}, Case{64, 1024}, Case{8, 128}, Case{2, 32}, Case{1, 16}, Case{0, 0}}) {
    MarsStepScheduler s;
    std::vector<StepRequest> reqs = {waiting(1, 10000, at_s(0))};
    StepPlan p = plan(s, reqs, c.free_blocks, at_s(1));
    EXPECT_TRUE(p.preempt.empty());
    if (c.want == 0) {
      EXPECT_TRUE(p.run.empty()) << "free " << c.free_blocks;
    } else {
      EXPECT_EQ(chunks(p, reqs), (Chunks{{1, c.want}})) << "free " << c.free_blocks;
      // Only the full quantum demotes.
      EXPECT_EQ(s.state(1)->feedback, c.want == 2048 ? 1u : 0u) << "free " << c.free_blocks;
    }
  }
}

TEST(MarsHalving, OffMeansAChunkThatDoesNotFitIsNotAdmitted) {
  MarsStepParams params;
  params.chunk_halving = false;
  MarsStepScheduler s(params);
  // Both at prompt level 0, 1 first by arrival: 2000 tokens need 125 blocks.
  std::vector<StepRequest> reqs = {waiting(1, 2000, at_s(0)), waiting(2, 10, at_s(1))};
  StepPlan p = plan(s, reqs, 2, at_s(1));
  EXPECT_TRUE(p.run.empty());  // head-of-line: 2 (one block) is not tried either
  MarsStepScheduler on;
  p = plan(on, reqs, 2, at_s(1));
  // With halving: 2000 → 1000 → … → 62 → 31 (two blocks) fits.
  EXPECT_EQ(chunks(p, reqs), (Chunks{{1, 31}}));
}

TEST(MarsStep, NoWaitingAdmissionInAStepThatPreempted) {
  MarsStepScheduler s;
  Engine e;
  e.free_blocks = 0;
  e.reqs = {running(1, 100, 160, at_s(0), at_s(9)), running(2, 6000, 160, at_s(1), at_s(9)), waiting(3, 10, at_s(2))};
  // D1 needs a block: P2 (level 1) is preempted and frees 10; 9 stay free,
  // enough for request 3, which is still not admitted.
  StepPlan p = e.step(s, at_s(10));
  EXPECT_EQ(chunks(p, e.reqs), (Chunks{{1, 1}}));
  EXPECT_EQ(preempted(p, e.reqs), (std::vector<std::uint64_t>{2}));
  EXPECT_EQ(e.free_blocks, 9u);
  // Next step: D1 runs, then the preempted 2 (halved to 128 = 8 blocks), then 3.
  p = e.step(s, at_s(10.05));
  EXPECT_EQ(chunks(p, e.reqs), (Chunks{{1, 1}, {2, 128}, {3, 10}}));
}

// ---- the rest ---------------------------------------------------------------------

TEST(MarsStep, DeterministicUnderPressure) {
  auto run = [](std::vector<StepPlan>& plans) {
    MarsStepScheduler s;
    Engine e;
    e.free_blocks = 600;
    e.budget = 2048;
    for (std::uint64_t i = 0; i < 12; ++i) {
      e.reqs.push_back(waiting(i + 1, 500 + static_cast<std::uint32_t>((i * 7919) % 6000), at_ms(i * 10)));
    }
    std::size_t preemptions = 0;
    for (int step = 0; step < 300; ++step) {
      plans.push_back(e.step(s, at_ms(1000 + 20 * step)));
      preemptions += plans.back().preempt.size();
      // Requests finish after 64 output tokens.
      for (std::size_t i = e.reqs.size(); i-- > 0;) {
        if (e.reqs[i].output_tokens >= 64) e.finish(e.reqs[i].id);
      }
    }
    return preemptions;
  };
  std::vector<StepPlan> a;
  std::vector<StepPlan> b;
  const std::size_t pa = run(a);
  const std::size_t pb = run(b);
  EXPECT_GT(pa, 0u) << "the workload should exercise preemption";
  EXPECT_EQ(pa, pb);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].run, b[i].run) << "step " << i;
    EXPECT_EQ(a[i].preempt, b[i].preempt) << "step " << i;
  }
}

TEST(MarsStep, ForgetsRequestsThatLeaveTheQueue) {
  MarsStepScheduler s;
  std::vector<StepRequest> reqs = {waiting(1, 100, at_s(0)), waiting(2, 100, at_s(1))};
  plan(s, reqs, 1000, at_s(1));
  EXPECT_EQ(s.remembered(), 2u);
  reqs.erase(reqs.begin());
  plan(s, reqs, 1000, at_s(2));
  EXPECT_EQ(s.remembered(), 1u);
  EXPECT_EQ(s.state(1), nullptr);
  EXPECT_NE(s.state(2), nullptr);
}

TEST(MarsStep, ReleasesKvAtRoundEnds) {
  MarsStepScheduler s;
  RoundEndInfo info;
  info.session = 1;
  info.tool_follows = true;
  info.blocks = 100;
  EXPECT_EQ(s.on_round_end(info, at_s(1)).decision, KeepDecision::kRelease);
}

TEST(MarsParams, DefaultsAndOverrides) {
  auto d = PolicyParams::create("mars", kMarsStepParams, {});
  ASSERT_TRUE(d.has_value());
  MarsStepParams m = mars_step_params(*d);
  EXPECT_EQ(m.levels, 4u);
  EXPECT_EQ(m.quanta, (std::array<std::uint32_t, 4>{2048, 1024, 512, 256}));
  EXPECT_EQ(m.thresholds, (std::array<std::uint32_t, 3>{2048, 8192, 32768}));
  EXPECT_EQ(m.aging_interval, std::chrono::seconds(30));
  EXPECT_TRUE(m.chunk_halving);
  EXPECT_EQ(m.overflow_window, 30u);
  EXPECT_FALSE(m.program_quanta);

  auto o = PolicyParams::create("mars", kMarsStepParams,
                                {{"levels", 2},
                                 {"quantum_0", 4096},
                                 {"threshold_0", 1000},
                                 {"threshold_1", 500},
                                 {"aging_interval_s", 1.5},
                                 {"chunk_halving", 0},
                                 {"overflow_window", 0}});
  ASSERT_TRUE(o.has_value());
  m = mars_step_params(*o);
  EXPECT_EQ(m.levels, 2u);
  EXPECT_EQ(m.quanta[0], 4096u);
  EXPECT_EQ(m.thresholds[1], 1000u);  // raised to threshold_0: levels never overlap
  EXPECT_EQ(m.aging_interval, std::chrono::milliseconds(1500));
  EXPECT_FALSE(m.chunk_halving);
  EXPECT_EQ(m.overflow_window, 0u);
  MarsStepScheduler two(m);
  EXPECT_EQ(two.level_for(1000), 0u);
  EXPECT_EQ(two.level_for(50000), 1u);  // capped at levels − 1

  EXPECT_FALSE(PolicyParams::create("mars", kMarsStepParams, {{"levels", 5}}).has_value());
  EXPECT_FALSE(PolicyParams::create("mars", kMarsStepParams, {{"quantum_4", 1}}).has_value());

  auto step = make_mars_step(*d);
  EXPECT_EQ(step->name(), "mars-mlfq");
}

}  // namespace
}  // namespace tandem::sched
