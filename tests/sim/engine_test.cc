// The engine model against hand-computed steps, blocks and prefix hits, on a
// tiny preset whose step time is 1 ms + 1 µs per token.
#include "sim/engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "sched/fcfs.h"

namespace tandem::sim {
namespace {

using namespace std::chrono_literals;

Preset tiny(std::uint32_t blocks) {
  Preset p;
  p.name = "tiny";
  p.gpu_blocks = blocks;
  p.token_budget = 64;
  p.max_seqs = 8;
  p.max_model_len = blocks * 16;
  p.step.t0_us = 1000;
  p.step.b_us_per_token = 1;
  p.swap_us_per_token = 10;
  p.swap_fixed_us = 100;
  return p;
}

struct Recorder final : EngineHost {
  struct Done {
    SessionId session;
    std::uint32_t round;
    std::uint32_t blocks;
    Time at;
  };
  std::vector<std::pair<SessionId, Time>> first;
  std::vector<Done> done;
  std::vector<std::pair<SessionId, sched::KvChange>> kv;
  void first_token(EngineId, const RoundWork& w, Time now) override { first.emplace_back(w.session, now); }
  void round_done(EngineId, const RoundWork& w, std::uint32_t blocks, std::uint32_t, Time now) override {
    done.push_back({w.session, w.round, blocks, now});
  }
  void kv_changed(EngineId, SessionId s, sched::KvChange c, std::uint32_t, Time) override { kv.emplace_back(s, c); }
};

// A vLLM V1 step half whose round-end decision is scripted.
class Scripted final : public sched::StepScheduler {
 public:
  std::string_view name() const override { return "scripted"; }
  void plan(const sched::StepInput& in, Time now, sched::StepPlan& out) override {
    vllm_.plan(in, now, out);
    if (swap) std::swap(out.preempt, out.swap);
  }
  sched::KeepPlan on_round_end(const sched::RoundEndInfo&, Time now) override {
    return {keep, now + std::chrono::seconds(100)};
  }
  sched::KeepDecision keep = sched::KeepDecision::kRelease;
  bool swap = false;  // preempt victims by swapping them to host memory

 private:
  sched::VllmV1StepScheduler vllm_;
};

struct Fixture {
  explicit Fixture(std::uint32_t blocks) : preset(tiny(blocks)), engine(0, preset, {64, 8}, sched, host, counters) {}
  Preset preset;
  Scripted sched;
  Recorder host;
  RunCounters counters;
  Engine engine;
  std::map<SessionId, SessionContent> content;

  void submit(SessionId s, std::uint32_t round, std::uint32_t prompt, std::uint32_t output, std::uint32_t shared,
              Time now) {
    RoundWork w;
    w.session = s;
    w.round = round;
    w.prompt_tokens = prompt;
    w.output_tokens = output;
    w.shared_prefix = shared;
    w.submitted = now;
    w.content = &content[s];
    engine.submit(w, now);
  }
  // Runs steps back to back until idle; returns the end of the last step.
  Time run(Time now, std::vector<double>* step_ms = nullptr) {
    while (auto end = engine.start_step(now)) {
      if (step_ms) step_ms->push_back(std::chrono::duration<double, std::milli>(*end - now).count());
      now = *end;
      engine.finish_step(now);
      engine.check_conservation();
    }
    return now;
  }
};

const Time kT0 = Time(1s);

TEST(Engine, ChunkedPrefillThenDecodeWithHandComputedSteps) {
  Fixture f(100);
  f.submit(1, 1, 100, 3, 0, kT0);
  std::vector<double> steps;
  const Time end = f.run(kT0, &steps);
  // Chunks of 64 and 36 (the second ends the prefill and samples token 1),
  // then two decode steps: 1 ms + 1 µs per token each.
  ASSERT_EQ(steps.size(), 4u);
  EXPECT_DOUBLE_EQ(steps[0], 1.064);
  EXPECT_DOUBLE_EQ(steps[1], 1.036);
  EXPECT_DOUBLE_EQ(steps[2], 1.001);
  EXPECT_DOUBLE_EQ(steps[3], 1.001);
  ASSERT_EQ(f.host.first.size(), 1u);
  EXPECT_EQ(f.host.first[0].second, kT0 + std::chrono::microseconds(1064 + 1036));
  ASSERT_EQ(f.host.done.size(), 1u);
  EXPECT_EQ(f.host.done[0].at, end);
  EXPECT_EQ(f.host.done[0].blocks, 7u);  // 102 computed tokens (the last sampled one has no KV)
  // Released: 6 full blocks cached, the partial one free; nothing held.
  EXPECT_EQ(f.engine.stats().blocks_free, 100u);
  EXPECT_EQ(f.counters.new_tokens, 102u);
  EXPECT_EQ(f.counters.computed_tokens, 102u);
  EXPECT_EQ(f.counters.prompt_tokens, 100u);
  EXPECT_EQ(f.counters.reused_tokens, 0u);
  EXPECT_EQ(f.engine.violations(), 0u);
}

TEST(Engine, NextRoundHitsItsCachedFullBlocks) {
  Fixture f(100);
  f.submit(1, 1, 100, 3, 0, kT0);
  Time now = f.run(kT0);
  // Round 2 extends the 103-token context: 6 full blocks (96 tokens) hit.
  f.submit(1, 2, 150, 1, 103, now);
  std::vector<double> steps;
  f.run(now, &steps);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_DOUBLE_EQ(steps[0], 1.054);  // 150 − 96 tokens
  EXPECT_EQ(f.counters.reused_tokens, 96u);
  EXPECT_EQ(f.counters.prompt_tokens, 250u);
  // Tokens 96..101 were computed in round 1 and are recomputed now (their
  // blocks were partial or beyond the hit), the rest is new.
  EXPECT_EQ(f.counters.recomputed_tokens, 102u - 96u);
  EXPECT_EQ(f.counters.computed_tokens, f.counters.new_tokens + f.counters.recomputed_tokens);
}

TEST(Engine, ARewrittenContextReusesNothing) {
  Fixture f(100);
  f.submit(1, 1, 100, 3, 0, kT0);
  Time now = f.run(kT0);
  f.submit(1, 2, 80, 1, 0, now);  // shorter prompt: the agent rewrote its context
  std::vector<double> steps;
  f.run(now, &steps);
  EXPECT_DOUBLE_EQ(steps[0], 1.064);
  EXPECT_DOUBLE_EQ(steps[1], 1.016);
  EXPECT_EQ(f.counters.reused_tokens, 0u);
  EXPECT_EQ(f.counters.recomputed_tokens, 0u);  // new content, not a recompute
}

TEST(Engine, PinHoldsBlocksAndTheNextRoundTakesThemOver) {
  Fixture f(100);
  f.sched.keep = sched::KeepDecision::kPin;
  f.submit(1, 1, 100, 3, 0, kT0);
  Time now = f.run(kT0);
  EXPECT_EQ(f.engine.pinned_blocks(), 6u);
  EXPECT_EQ(f.engine.stats().blocks_free, 94u);
  now += 2s;  // the tool ran for 2 s
  f.submit(1, 2, 150, 1, 103, now);
  EXPECT_EQ(f.engine.pinned_blocks(), 6u);  // held for the queued round until it is scheduled
  f.run(now);
  EXPECT_EQ(f.engine.pinned_blocks(), 9u);  // the old pin was taken over; round 2's 150 tokens are pinned now
  EXPECT_EQ(f.counters.reused_tokens, 96u);
  EXPECT_NEAR(f.counters.pinned_block_seconds, 12.0, 1e-9);
}

TEST(Engine, LeastRecentlyFreedSessionIsEvictedFirstAndReported) {
  Fixture f(20);
  f.submit(1, 1, 64, 1, 0, kT0);  // 4 blocks → 4 cached
  Time now = f.run(kT0);
  f.submit(2, 1, 64, 1, 0, now);
  now = f.run(now);
  f.submit(3, 1, 16 * 14, 1, 0, now);  // 14 blocks: the 12 free ones + 2 of session 1's, from its tail
  now = f.run(now);
  EXPECT_TRUE(f.host.kv.empty());     // session 1 still has 2 cached blocks
  f.submit(4, 1, 16 * 5, 1, 0, now);  // 5 blocks: session 1's last 2 (reported), then 3 of session 2's
  f.run(now);
  ASSERT_FALSE(f.host.kv.empty());
  EXPECT_EQ(f.host.kv[0].first, 1u);
  EXPECT_EQ(f.host.kv[0].second, sched::KvChange::kEvicted);
  EXPECT_EQ(f.engine.violations(), 0u);
}

TEST(Engine, PreemptionByRecomputeCountsRecomputedTokens) {
  // 8 blocks; two sessions decode until the newest is preempted and recomputed.
  Fixture f(8);
  f.submit(1, 1, 60, 40, 0, kT0);
  f.submit(2, 1, 60, 40, 0, kT0);
  f.run(kT0);
  EXPECT_GT(f.counters.preemptions, 0u);
  EXPECT_GT(f.counters.recomputed_tokens, 0u);
  EXPECT_EQ(f.counters.computed_tokens, f.counters.new_tokens + f.counters.recomputed_tokens);
  EXPECT_EQ(f.host.done.size(), 2u);
  EXPECT_EQ(f.engine.violations(), 0u);
}

TEST(Engine, OffloadFreesBlocksAfterTheCopyAndReloadCostsPcieTime) {
  Fixture f(100);
  f.sched.keep = sched::KeepDecision::kPin;
  f.submit(1, 1, 100, 3, 0, kT0);
  Time now = f.run(kT0);
  f.engine.offload(1, now);
  // 96 tokens at 10 µs + 100 µs fixed = 1.06 ms on the link.
  auto done = f.engine.complete_offloads(now);
  ASSERT_TRUE(done);
  EXPECT_EQ(*done, now + std::chrono::microseconds(1060));
  EXPECT_EQ(f.engine.stats().blocks_free, 94u);
  f.engine.complete_offloads(*done);
  EXPECT_EQ(f.content[1].host_tokens, 96u);
  EXPECT_EQ(f.engine.stats().blocks_free, 100u);
  ASSERT_EQ(f.host.kv.size(), 1u);
  EXPECT_EQ(f.host.kv[0].second, sched::KvChange::kOffloaded);
  // Lose the GPU copy; the next round reloads 96 tokens from the host.
  f.engine.drop(1, *done);
  f.submit(1, 2, 150, 1, 103, *done);
  std::vector<double> steps;
  f.run(*done, &steps);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_NEAR(steps[0], 1.054 + 1.06, 1e-9);
  EXPECT_EQ(f.counters.reused_tokens, 96u);
}

TEST(Engine, DropAndUnpinAreNoOpsWhileTheSessionRuns) {
  Fixture f(100);
  f.submit(1, 1, 100, 3, 0, kT0);
  f.engine.drop(1, kT0);
  f.engine.offload(1, kT0);
  f.engine.pin(1, kT0 + 5s, kT0);
  f.run(kT0);
  EXPECT_TRUE(f.host.kv.empty());
  EXPECT_EQ(f.engine.pinned_blocks(), 0u);
}

TEST(Engine, ControlPinTakesCachedBlocksAndUnpinReturnsThem) {
  Fixture f(100);
  f.submit(1, 1, 100, 3, 0, kT0);
  Time now = f.run(kT0);
  f.engine.pin(1, now + 5s, now);
  EXPECT_EQ(f.engine.pinned_blocks(), 6u);
  EXPECT_EQ(f.engine.stats().blocks_free, 94u);
  f.engine.unpin(1, now + 1s);
  EXPECT_EQ(f.engine.pinned_blocks(), 0u);
  EXPECT_EQ(f.engine.stats().blocks_free, 100u);
  f.engine.account(now + 1s);
  EXPECT_NEAR(f.counters.pinned_block_seconds, 6.0, 1e-9);
}

TEST(Engine, PreemptionBySwapKeepsTheVictimsWorkInHostMemory) {
  // The scenario above, victims swapped: their full blocks come back from the
  // host (10 µs a token on the link, in the step) instead of being recomputed.
  Fixture recompute(8);
  recompute.submit(1, 1, 60, 40, 0, kT0);
  recompute.submit(2, 1, 60, 40, 0, kT0);
  recompute.run(kT0);
  Fixture swapped(8);
  swapped.sched.swap = true;
  HostPool pool;
  swapped.engine.set_host_pool(&pool);
  swapped.submit(1, 1, 60, 40, 0, kT0);
  swapped.submit(2, 1, 60, 40, 0, kT0);
  swapped.run(kT0);
  EXPECT_GT(swapped.counters.swaps, 0u);
  EXPECT_EQ(swapped.counters.swaps, swapped.counters.preemptions) << "every victim found room on the host";
  EXPECT_LT(swapped.counters.recomputed_tokens, recompute.counters.recomputed_tokens);
  EXPECT_GT(pool.peak_blocks(), 0u);
  EXPECT_EQ(swapped.host.done.size(), 2u);
  EXPECT_EQ(swapped.engine.violations(), 0u);
  EXPECT_EQ(swapped.counters.computed_tokens, swapped.counters.new_tokens + swapped.counters.recomputed_tokens);
  EXPECT_EQ(swapped.counters.resume_recomputed_tokens, 0u) << "recomputes after a preemption are not resumptions";
}

TEST(HostPool, EvictsTheLeastRecentlyUsedCopyToMakeRoom) {
  HostPool pool(10);  // blocks
  std::map<SessionId, SessionContent> c;
  EXPECT_TRUE(pool.store(1, c[1], 64, 16, kT0));       // 4 blocks
  EXPECT_TRUE(pool.store(2, c[2], 64, 16, kT0 + 1s));  // 4
  EXPECT_EQ(pool.used_blocks(), 8u);
  EXPECT_EQ(pool.oldest_idle(kT0 + 3s), 3s) << "session 1's copy, stored at 0";
  pool.touch(1, kT0 + 2s);                             // 1 is now the most recently used
  EXPECT_TRUE(pool.store(3, c[3], 48, 16, kT0 + 3s));  // 3 blocks: 11 > 10, session 2 goes
  EXPECT_EQ(c[2].host_tokens, 0u);
  EXPECT_EQ(c[1].host_tokens, 64u);
  EXPECT_EQ(c[3].host_tokens, 48u);
  EXPECT_EQ(pool.used_blocks(), 7u);
  EXPECT_EQ(pool.evicted_blocks(), 4u);
  EXPECT_FALSE(pool.store(4, c[4], 16 * 11, 16, kT0)) << "larger than the pool";
  EXPECT_EQ(c[4].host_tokens, 0u);
  pool.cut(1, c[1], 20, 16);  // a rewritten context keeps one full block
  EXPECT_EQ(c[1].host_tokens, 16u);
  EXPECT_EQ(pool.used_blocks(), 4u);
  pool.cut(3, c[3], 0, 16);  // its session ended
  EXPECT_EQ(pool.used_blocks(), 1u);
  EXPECT_EQ(pool.peak_blocks(), 8u);
}

}  // namespace
}  // namespace tandem::sim
