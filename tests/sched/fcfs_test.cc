// fcfs: vLLM V1's step, pinned to hand-computed plans ([baselines] §5.2).
#include "sched/fcfs.h"

#include <vector>

#include <gtest/gtest.h>

namespace tandem::sched {
namespace {

Time at(int ms) { return base::from_ns(std::int64_t{ms} * 1'000'000); }

StepRequest running(std::uint64_t id, std::uint32_t prompt, std::uint32_t computed, std::uint32_t blocks) {
  StepRequest r;
  r.id = id;
  r.session = id;
  r.phase = RequestPhase::kRunning;
  r.prompt_tokens = prompt;
  r.computed_tokens = computed;
  r.blocks_held = blocks;
  return r;
}

StepRequest waiting(std::uint64_t id, std::uint32_t prompt, std::uint32_t cached = 0, std::uint32_t shared = 0) {
  StepRequest r;
  r.id = id;
  r.session = id;
  r.phase = RequestPhase::kWaiting;
  r.prompt_tokens = prompt;
  r.cached_tokens = cached;
  r.blocks_held = shared;
  return r;
}

StepPlan plan(const std::vector<StepRequest>& reqs, std::uint32_t free_blocks, std::uint32_t budget = 4096,
              std::uint32_t max_seqs = 256) {
  StepInput in;
  in.token_budget = budget;
  in.max_seqs = max_seqs;
  in.block_size = 16;
  in.free_blocks = free_blocks;
  in.requests = reqs;
  VllmV1StepScheduler s;
  StepPlan out;
  s.plan(in, at(0), out);
  return out;
}

using Chunks = std::vector<ScheduledChunk>;

TEST(VllmV1, ChunkedPrefillTakesTheWholeBudgetInFcfsOrder) {
  auto p = plan({waiting(1, 5000), waiting(2, 100)}, 10000);
  EXPECT_EQ(p.run, (Chunks{{0, 4096}})) << "request 2 waits: the budget is spent";
  EXPECT_TRUE(p.preempt.empty());
}

TEST(VllmV1, RunningFirstThenWaiting) {
  // A decoding request (prompt done) wants 1 token; a running prefill its
  // remainder; the waiting one gets what is left.
  auto p = plan({running(1, 100, 105, 7), running(2, 3000, 1000, 63), waiting(3, 5000)}, 10000);
  EXPECT_EQ(p.run, (Chunks{{0, 1}, {1, 2000}, {2, 2095}}));
}

TEST(VllmV1, PrefixHitShortensThePrefillAndItsBlocks) {
  // 1000 cached of 1600: 600 tokens to compute; blocks for 1600 tokens = 100,
  // of which 40 are shared with a running request: 60 must be free.
  EXPECT_EQ(plan({waiting(1, 1600, 1000, 40)}, 60).run, (Chunks{{0, 600}}));
  EXPECT_TRUE(plan({waiting(1, 1600, 1000, 40)}, 59).run.empty()) << "one block short";
  // A full hit still computes one token (vLLM recomputes the last one).
  EXPECT_EQ(plan({waiting(1, 1600, 1600, 100)}, 0).run, (Chunks{{0, 1}}));
}

TEST(VllmV1, PreemptsTheNewestRunningRequestByRecompute) {
  // No free block. Request 0 (32 computed, 2 blocks) needs a third block for
  // its next token; the newest running request (index 1, 4 blocks) pays.
  auto p = plan({running(1, 32, 32, 2), running(2, 64, 64, 4), waiting(3, 16)}, 0);
  EXPECT_EQ(p.preempt, (std::vector<std::uint32_t>{1}));
  EXPECT_EQ(p.run, (Chunks{{0, 1}}));
  // No waiting request is admitted in a step that preempted: request 3 waits
  // although 3 blocks are now free.
}

TEST(VllmV1, PreemptingItselfStopsTheRunningPass) {
  auto p = plan({running(1, 32, 32, 2)}, 0);
  EXPECT_EQ(p.preempt, (std::vector<std::uint32_t>{0}));
  EXPECT_TRUE(p.run.empty());
}

TEST(VllmV1, SeveralVictimsUntilItFits) {
  // Request 0 needs 5 blocks for a 65-token chunk on an empty allocation;
  // victims come off the end (indices 2 then 1) until 5 are free.
  auto p = plan({running(1, 100, 0, 0), running(2, 48, 48, 3), running(3, 32, 32, 2)}, 0, 65);
  EXPECT_EQ(p.preempt, (std::vector<std::uint32_t>{2, 1}));
  EXPECT_EQ(p.run, (Chunks{{0, 65}}));
}

TEST(VllmV1, HeadOfLineBlocking) {
  // The head needs 100 blocks, only 50 are free: the small one behind it waits.
  auto p = plan({waiting(1, 1600), waiting(2, 16)}, 50, 8192);
  EXPECT_EQ(p.run, Chunks{}) << "strict FCFS: nothing passes the head";
}

TEST(VllmV1, SeatsLimitAdmission) {
  auto p = plan({running(1, 10, 12, 1), waiting(2, 10), waiting(3, 10)}, 100, 4096, /*max_seqs=*/2);
  EXPECT_EQ(p.run, (Chunks{{0, 1}, {1, 10}}));
}

TEST(VllmV1, SameInputSamePlan) {
  std::vector<StepRequest> reqs = {running(1, 32, 32, 2), running(2, 3000, 1000, 63), waiting(3, 5000),
                                   waiting(4, 700, 500, 10)};
  for (std::uint32_t free = 0; free < 400; free += 7) {
    StepPlan a = plan(reqs, free);
    StepPlan b = plan(reqs, free);
    ASSERT_EQ(a.run, b.run);
    ASSERT_EQ(a.preempt, b.preempt);
  }
}

TEST(AdmitAll, AdmitsEveryWaitingSession) {
  NodeModel m;
  ASSERT_TRUE(m.observe(SessionOpened{1, 0, 0}, at(0)));
  ASSERT_TRUE(m.observe(SessionOpened{2, 0, 0}, at(0)));
  ASSERT_TRUE(m.observe(RoundSubmitted{3, 0, 0, 10, 0, 1}, at(0)));
  ASSERT_TRUE(m.sessions().transition(2, SessionState::kReasoning, at(1)));
  AdmitAllControl c("fcfs");
  Actions out;
  c.tick(m, at(2), out);
  ASSERT_EQ(out.list().size(), 2u);
  EXPECT_EQ(out.list()[0], (Action{ActionKind::kAdmit, 1}));
  EXPECT_EQ(out.list()[1], (Action{ActionKind::kAdmit, 3}));
}

}  // namespace
}  // namespace tandem::sched
