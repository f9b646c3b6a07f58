// Autellix PLAS step scheduler: queue by program service, quantum demotion,
// anti-starvation at β, victim order, determinism. Expectations are computed
// by hand from the rules in sched/autellix.h.
#include "sched/autellix.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "tests/sched/step_fixture.h"

namespace tandem::sched {
namespace {

using std::chrono::milliseconds;

using test::ms;
using test::req;

StepInput input(const std::vector<StepRequest>& reqs, std::uint32_t free_blocks = 100000, std::uint32_t budget = 8192) {
  StepInput in;
  in.token_budget = budget;
  in.free_blocks = free_blocks;
  in.requests = reqs;
  return in;
}

StepPlan plan(AutellixStepScheduler& s, const StepInput& in, Time now = {}) {
  StepPlan out;
  s.plan(in, now, out);
  return out;
}

TEST(AutellixTest, QueueThresholdsFollowProgramService) {
  AutellixStepScheduler s;
  EXPECT_EQ(s.queue_for_service(0), 0);
  EXPECT_EQ(s.queue_for_service(2047), 0);
  EXPECT_EQ(s.queue_for_service(2048), 1);
  EXPECT_EQ(s.queue_for_service(8191), 1);
  EXPECT_EQ(s.queue_for_service(8192), 2);
  EXPECT_EQ(s.queue_for_service(32767), 2);
  EXPECT_EQ(s.queue_for_service(32768), 3);
}

TEST(AutellixTest, NextRoundEntersTheQueueOfItsProgramsService) {
  AutellixStepScheduler s;
  // Round 1: session 1 prefills 2048 tokens, session 2 prefills 2047 (one chunk each, no demotion).
  std::vector<StepRequest> r1 = {req(1, 1, RequestPhase::kWaiting, 2048, 0, ms(0)),
                                 req(2, 2, RequestPhase::kWaiting, 2047, 0, ms(1))};
  StepPlan p = plan(s, input(r1));
  ASSERT_EQ(p.run.size(), 2u);
  EXPECT_EQ(p.run[0], (ScheduledChunk{0, 2048}));
  EXPECT_EQ(p.run[1], (ScheduledChunk{1, 2047}));
  EXPECT_EQ(s.queue_of(1), 0);  // a whole prompt in one quantum leaves no work: no demotion
  EXPECT_EQ(s.program_service(1), 2048u);
  EXPECT_EQ(s.program_service(2), 2047u);
  // Round 2 of both: 2048 ≥ the first threshold → Q1; 2047 → Q0.
  std::vector<StepRequest> r2 = {req(3, 1, RequestPhase::kWaiting, 100, 0, ms(10)),
                                 req(4, 2, RequestPhase::kWaiting, 100, 0, ms(11))};
  plan(s, input(r2));
  EXPECT_EQ(s.queue_of(3), 1);
  EXPECT_EQ(s.queue_of(4), 0);
  EXPECT_EQ(s.queue_of(1), -1);  // finished requests are forgotten
  // Service accumulates across rounds: 2048 + 100 and 2047 + 100.
  EXPECT_EQ(s.program_service(1), 2148u);
  EXPECT_EQ(s.program_service(2), 2147u);
}

TEST(AutellixTest, ServiceAcrossThresholdsSelectsQ2AndQ3) {
  AutellixParams p;
  p.quantum[0] = p.quantum[1] = p.quantum[2] = p.quantum[3] = 100000;  // no demotion in this test
  AutellixStepScheduler s(p);
  std::vector<StepRequest> r1 = {req(1, 1, RequestPhase::kWaiting, 8192, 0, ms(0)),
                                 req(2, 2, RequestPhase::kWaiting, 8191, 0, ms(1))};
  plan(s, input(r1, 100000, 32768));
  std::vector<StepRequest> r2 = {req(3, 1, RequestPhase::kWaiting, 24576, 0, ms(2)),
                                 req(4, 2, RequestPhase::kWaiting, 24576, 0, ms(3))};
  plan(s, input(r2, 100000, 65536));
  EXPECT_EQ(s.queue_of(3), 2);  // 8192
  EXPECT_EQ(s.queue_of(4), 1);  // 8191
  std::vector<StepRequest> r3 = {req(5, 1, RequestPhase::kWaiting, 10, 0, ms(4)),
                                 req(6, 2, RequestPhase::kWaiting, 10, 0, ms(5))};
  plan(s, input(r3));
  EXPECT_EQ(s.queue_of(5), 3);  // 8192 + 24576 = 32768
  EXPECT_EQ(s.queue_of(6), 2);  // 32767
}

TEST(AutellixTest, FullQuantumDemotesAndQ3Saturates) {
  AutellixStepScheduler s;
  StepRequest r = req(1, 1, RequestPhase::kWaiting, 10000, 0, ms(0));
  std::vector<StepRequest> v = {r};
  StepPlan p = plan(s, input(v));
  ASSERT_EQ(p.run.size(), 1u);
  EXPECT_EQ(p.run[0].tokens, 2048u);  // Q0 quantum caps the chunk
  EXPECT_EQ(s.queue_of(1), 1);
  const std::uint32_t expect_chunk[] = {1024, 512, 256, 256};
  const int expect_queue[] = {2, 3, 3, 3};
  std::uint32_t computed = 2048;
  for (int step = 0; step < 4; ++step) {
    v = {req(1, 1, RequestPhase::kRunning, 10000, computed, ms(0))};
    p = plan(s, input(v));
    ASSERT_EQ(p.run.size(), 1u);
    EXPECT_EQ(p.run[0].tokens, expect_chunk[step]) << step;
    EXPECT_EQ(s.queue_of(1), expect_queue[step]) << step;
    computed += p.run[0].tokens;
  }
}

TEST(AutellixTest, ChunkCutByBudgetDoesNotDemoteButQuantumAccumulates) {
  AutellixStepScheduler s;
  // Budget 3000: r1's whole 2000-token prompt, then only 1000 of r2's 2048 quantum.
  std::vector<StepRequest> v = {req(1, 1, RequestPhase::kWaiting, 2000, 0, ms(0)),
                                req(2, 2, RequestPhase::kWaiting, 10000, 0, ms(1))};
  StepPlan p = plan(s, input(v, 100000, 3000));
  ASSERT_EQ(p.run.size(), 2u);
  EXPECT_EQ(p.run[1], (ScheduledChunk{1, 1000}));
  EXPECT_EQ(s.queue_of(2), 0);
  // 1048 of the quantum are left: that is the next chunk, and it completes the quantum.
  v = {req(2, 2, RequestPhase::kRunning, 10000, 1000, ms(1))};
  p = plan(s, input(v, 100000, 3000));
  EXPECT_EQ(p.run[0].tokens, 1048u);
  EXPECT_EQ(s.queue_of(2), 1);
}

TEST(AutellixTest, DecodeNeverDemotes) {
  AutellixParams params;
  params.quantum[0] = 2;
  AutellixStepScheduler s(params);
  for (std::uint32_t step = 0; step < 5; ++step) {
    std::vector<StepRequest> v = {req(1, 1, RequestPhase::kRunning, 16, 16 + step, ms(0))};
    StepPlan p = plan(s, input(v));
    EXPECT_EQ(p.run[0].tokens, 1u);
    EXPECT_EQ(s.queue_of(1), 0);
  }
}

// Session 1 has 2048 tokens of service, so its next request (id 2) waits in
// Q1 behind a running long prefill of session 2 (one seat). Each step adds
// the step's scheduled tokens to its wait: 2048, 1024, 512, 256, 256 (the
// running prefill demoting Q0→Q3). Ratio wait/2048 after step k of those:
// 1, 1.5, 1.75, 1.875, 2.0 — promotion happens at the first step that starts
// with the ratio ≥ β = 2.
TEST(AutellixTest, AntiStarvationPromotesExactlyAtBeta) {
  AutellixStepScheduler s;
  std::vector<StepRequest> r1 = {req(1, 1, RequestPhase::kWaiting, 2048, 0, ms(0))};
  plan(s, input(r1));
  ASSERT_EQ(s.program_service(1), 2048u);

  std::uint32_t computed = 0;
  const std::uint32_t chunks[] = {2048, 1024, 512, 256, 256};
  for (int step = 0; step < 5; ++step) {
    std::vector<StepRequest> v = {req(10, 2, RequestPhase::kRunning, 100000, computed, ms(5)),
                                  req(2, 1, RequestPhase::kWaiting, 100, 0, ms(10))};
    StepInput in = input(v);
    in.max_seqs = 1;
    StepPlan p = plan(s, in);
    ASSERT_EQ(p.run.size(), 1u) << step;
    EXPECT_EQ(p.run[0], (ScheduledChunk{0, chunks[step]})) << step;
    // Still in Q1 after every step here: the check runs at the top of the next step.
    EXPECT_EQ(s.queue_of(2), 1) << step;
    computed += chunks[step];
  }
  std::vector<StepRequest> v = {req(10, 2, RequestPhase::kRunning, 100000, computed, ms(5)),
                                req(2, 1, RequestPhase::kWaiting, 100, 0, ms(10))};
  StepInput in = input(v);
  in.max_seqs = 1;
  plan(s, in);
  EXPECT_EQ(s.queue_of(2), 0);
}

TEST(AutellixTest, AntiStarvationNotBeforeBeta) {
  AutellixParams params;
  params.beta = 2.01;  // 4096 / 2048 = 2.0 is not enough
  AutellixStepScheduler s(params);
  std::vector<StepRequest> r1 = {req(1, 1, RequestPhase::kWaiting, 2048, 0, ms(0))};
  plan(s, input(r1));
  std::uint32_t computed = 0;
  for (int step = 0; step < 6; ++step) {
    std::vector<StepRequest> v = {req(10, 2, RequestPhase::kRunning, 100000, computed, ms(5)),
                                  req(2, 1, RequestPhase::kWaiting, 100, 0, ms(10))};
    StepInput in = input(v);
    in.max_seqs = 1;
    StepPlan p = plan(s, in);
    computed += p.run[0].tokens;
  }
  // Six steps: wait 4096 (top of step 6) then 4352 after it, checked only at the next step.
  EXPECT_EQ(s.queue_of(2), 1);
}

TEST(AutellixTest, WaitingQ0RunsBeforeEarlierQ1) {
  // Q0 runs before Q1 when waiting: session 1 (service 2048, Q1) arrived first,
  // session 3 (new, Q0) arrived later but goes first.
  AutellixStepScheduler s;
  std::vector<StepRequest> r1 = {req(1, 1, RequestPhase::kWaiting, 2048, 0, ms(0))};
  plan(s, input(r1));
  std::vector<StepRequest> v = {req(2, 1, RequestPhase::kWaiting, 100, 0, ms(10)),
                                req(3, 3, RequestPhase::kWaiting, 100, 0, ms(11))};
  StepPlan p = plan(s, input(v, 100000, 150));
  ASSERT_EQ(p.run.size(), 2u);
  EXPECT_EQ(p.run[0], (ScheduledChunk{1, 100}));
  EXPECT_EQ(p.run[1], (ScheduledChunk{0, 50}));
}

// Victims: argmax (queue, blocks, arrival).
TEST(AutellixTest, VictimOrderIsQueueThenBlocksThenArrival) {
  AutellixParams params;
  params.service_threshold[0] = 100;
  params.service_threshold[1] = 200;
  params.service_threshold[2] = 300;
  AutellixStepScheduler s(params);
  // Round 1 gives sessions 1 and 4 service 50 (Q0), sessions 2 and 3 service 150 (Q1).
  std::vector<StepRequest> r1 = {
      req(1, 1, RequestPhase::kWaiting, 50, 0, ms(0)), req(2, 2, RequestPhase::kWaiting, 150, 0, ms(1)),
      req(3, 3, RequestPhase::kWaiting, 150, 0, ms(2)), req(4, 4, RequestPhase::kWaiting, 50, 0, ms(3))};
  plan(s, input(r1));
  // Round 2, all running, no free block. r11 (Q0, 100 blocks) wants an 800-token
  // chunk = 50 blocks: victims r13 (Q1, 20 blocks), r12 (Q1, 10), then r14
  // (Q0, 200 blocks) before r11 itself (Q0, 100 blocks).
  std::vector<StepRequest> v = {
      req(11, 1, RequestPhase::kRunning, 2400, 1600, ms(10)), req(12, 2, RequestPhase::kRunning, 100, 160, ms(11)),
      req(13, 3, RequestPhase::kRunning, 100, 320, ms(12)), req(14, 4, RequestPhase::kRunning, 100, 3200, ms(13))};
  StepPlan p = plan(s, input(v, 0));
  EXPECT_EQ(s.queue_of(11), 0);
  EXPECT_EQ(s.queue_of(12), 1);
  EXPECT_EQ(s.queue_of(13), 1);
  EXPECT_EQ(s.queue_of(14), 0);
  EXPECT_EQ(p.swap, (std::vector<std::uint32_t>{2, 1, 3})) << "the paper swaps its victims";
  EXPECT_TRUE(p.preempt.empty());
  ASSERT_EQ(p.run.size(), 1u);
  EXPECT_EQ(p.run[0], (ScheduledChunk{0, 800}));
}

TEST(AutellixTest, VictimTieBreaksOnLatestArrival) {
  AutellixStepScheduler s;
  // All Q0, 10 blocks each; the first in order needs a block: the latest arrival pays.
  std::vector<StepRequest> v = {req(1, 1, RequestPhase::kRunning, 100, 160, ms(0)),
                                req(2, 2, RequestPhase::kRunning, 100, 160, ms(2)),
                                req(3, 3, RequestPhase::kRunning, 100, 160, ms(1))};
  StepPlan p = plan(s, input(v, 0));
  EXPECT_EQ(p.swap, (std::vector<std::uint32_t>{1}));
  // r3 (arrival 1) runs second: running order is (queue, arrival); then r1's freed blocks feed it.
  ASSERT_EQ(p.run.size(), 2u);
  EXPECT_EQ(p.run[0], (ScheduledChunk{0, 1}));
  EXPECT_EQ(p.run[1], (ScheduledChunk{2, 1}));
}

TEST(AutellixTest, VictimAlreadyScheduledGivesBackItsChunk) {
  AutellixStepScheduler s;
  // Running order (Q0, arrival): r1 (10 blocks) then r2 (5 blocks, full at 80 tokens).
  // r2 needs one block and none is free; the victim is r1 (more blocks), already
  // scheduled this step: its chunk leaves the plan.
  std::vector<StepRequest> v = {req(1, 1, RequestPhase::kRunning, 100, 159, ms(0)),
                                req(2, 2, RequestPhase::kRunning, 50, 80, ms(1))};
  StepPlan p = plan(s, input(v, 0));
  EXPECT_EQ(p.swap, (std::vector<std::uint32_t>{0}));
  ASSERT_EQ(p.run.size(), 1u);
  EXPECT_EQ(p.run[0], (ScheduledChunk{1, 1}));
}

TEST(AutellixTest, RecomputeVictimsAsTheMarsRepoDoes) {
  AutellixParams params;
  params.swap_preempt = false;
  AutellixStepScheduler s(params);
  std::vector<StepRequest> v = {req(1, 1, RequestPhase::kRunning, 100, 159, ms(0)),
                                req(2, 2, RequestPhase::kRunning, 50, 80, ms(1))};
  StepPlan p = plan(s, input(v, 0));
  EXPECT_EQ(p.preempt, (std::vector<std::uint32_t>{0}));
  EXPECT_TRUE(p.swap.empty());
}

// Admission as vLLM 0.6.1 (the paper's engine) allocates: a call's whole
// prompt at once. 1,000 free blocks hold one 8,000-token prompt (500 blocks)
// beside r1's remaining 400, not two.
TEST(AutellixTest, AdmitsACallOnlyIfItsWholePromptFits) {
  std::vector<StepRequest> v = {req(1, 1, RequestPhase::kRunning, 8000, 1600, ms(0)),
                                req(2, 2, RequestPhase::kWaiting, 8000, 0, ms(1)),
                                req(3, 3, RequestPhase::kWaiting, 8000, 0, ms(2))};
  {
    AutellixStepScheduler s;
    StepPlan p = plan(s, input(v, 1000));
    ASSERT_EQ(p.run.size(), 2u) << "r1 and r2; r3's prompt would not fit beside theirs";
    EXPECT_EQ(p.run[0].request, 0u);
    EXPECT_EQ(p.run[1].request, 1u);
  }
  {
    // 1,399 blocks: r1's 400 + r2's 500 + r3's 500 = 1,400 do not fit.
    AutellixStepScheduler s;
    EXPECT_EQ(plan(s, input(v, 1399)).run.size(), 2u);
    AutellixStepScheduler t;
    EXPECT_EQ(plan(t, input(v, 1400)).run.size(), 3u);
  }
  {
    // By chunk (vLLM V1): every call's first quantum fits, so all three run.
    AutellixParams params;
    params.reserve_prompt = false;
    AutellixStepScheduler s(params);
    EXPECT_EQ(plan(s, input(v, 1000)).run.size(), 3u);
  }
}

TEST(AutellixTest, WithNothingRunningTheHeadIsAdmittedWhateverItsSize) {
  // A prompt of 16,000 tokens (1,000 blocks) and 200 free: nothing runs, so
  // the head starts its first quantum (2,048 tokens, 128 blocks) rather than
  // blocking the queue for ever.
  AutellixStepScheduler s;
  std::vector<StepRequest> v = {req(1, 1, RequestPhase::kWaiting, 16000, 0, ms(0)),
                                req(2, 2, RequestPhase::kWaiting, 100, 0, ms(1))};
  StepPlan p = plan(s, input(v, 200));
  ASSERT_EQ(p.run.size(), 1u) << "the second call does not fit beside the first's whole prompt";
  EXPECT_EQ(p.run[0], (ScheduledChunk{0, 2048}));
}

TEST(AutellixTest, ParamsFromRegistrySpecs) {
  auto params = PolicyParams::create("autellix", kAutellixParams, {{"beta", 8.0}, {"q2_service", 1000.0}});
  ASSERT_TRUE(params.has_value());
  AutellixParams a = autellix_params(*params);
  EXPECT_EQ(a.beta, 8.0);
  EXPECT_EQ(a.service_threshold[0], 2048u);
  EXPECT_EQ(a.service_threshold[1], 2048u);  // raised to stay ascending
  EXPECT_EQ(a.service_threshold[2], 32768u);
  EXPECT_EQ(a.quantum[3], 256u);
  EXPECT_EQ(make_autellix_step(*params)->name(), "autellix");
}

TEST(AutellixTest, Deterministic) {
  auto run = [] {
    AutellixStepScheduler s;
    std::vector<StepPlan> plans;
    std::uint64_t x = 12345;
    auto next = [&] {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      return static_cast<std::uint32_t>(x >> 33);
    };
    for (int step = 0; step < 200; ++step) {
      std::vector<StepRequest> v;
      const std::uint32_t n = 1 + next() % 8;
      for (std::uint32_t i = 0; i < n; ++i) {
        const bool running = next() % 2 == 0;
        const std::uint32_t prompt = 1 + next() % 5000;
        v.push_back(req(next() % 20, 1 + next() % 5, running ? RequestPhase::kRunning : RequestPhase::kWaiting, prompt,
                        running ? next() % (prompt + 50) : 0, ms(next() % 1000)));
      }
      std::partition(v.begin(), v.end(), [](const StepRequest& r) { return r.phase == RequestPhase::kRunning; });
      StepInput in = input(v, next() % 400, 512 + next() % 4096);
      StepPlan p;
      s.plan(in, ms(step), p);
      plans.push_back(p);
    }
    return plans;
  };
  const auto a = run();
  const auto b = run();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].run, b[i].run) << i;
    EXPECT_EQ(a[i].preempt, b[i].preempt) << i;
    EXPECT_EQ(a[i].swap, b[i].swap) << i;
  }
}

}  // namespace
}  // namespace tandem::sched
