// The block pool against sim::Engine: after every submit, step, pin, unpin,
// drop and offload the pool's occupancy per place equals the engine's own
// counters, and the KV a step wrote survives an offload and reload (the data
// really travels through the host copy).
#include "testbed/kv_pool.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <memory>

#include "sched/registry.h"
#include "sim/engine.h"

namespace tandem::testbed {
namespace {

using namespace std::chrono_literals;
using sim::KvPlace;

// fcfs, with the round-end decision the test sets.
class KeepScheduler final : public sched::StepScheduler {
 public:
  KeepScheduler() : fcfs_(std::move(sched::make_policy("fcfs")->step)) {}
  std::string_view name() const override { return "keep"; }
  void plan(const sched::StepInput& in, sched::Time now, sched::StepPlan& out) override { fcfs_->plan(in, now, out); }
  sched::KeepPlan on_round_end(const sched::RoundEndInfo& /*info*/, sched::Time /*now*/) override { return keep; }
  sched::KeepPlan keep;

 private:
  std::unique_ptr<sched::StepScheduler> fcfs_;
};

class Host final : public sim::EngineHost {
 public:
  void first_token(sim::EngineId, const sim::RoundWork&, sim::Time) override {}
  void round_done(sim::EngineId, const sim::RoundWork& w, std::uint32_t, std::uint32_t, sim::Time) override {
    ++done[w.session];
  }
  void kv_changed(sim::EngineId, sim::SessionId, sched::KvChange, std::uint32_t, sim::Time) override {}
  void token(sim::EngineId, const sim::RoundWork&, std::uint32_t, sim::Time) override { ++tokens; }
  std::map<sim::SessionId, int> done;
  std::uint64_t tokens = 0;
};

class PoolTest : public ::testing::Test {
 protected:
  static constexpr std::uint32_t kBlocks = 64;
  static constexpr std::size_t kBlockBytes = 512;

  void SetUp() override {
    preset_ = *sim::find_preset("h100-llama3-8b");
    preset_.gpu_blocks = kBlocks;
    preset_.max_model_len = kBlocks * preset_.block_size;
    pool_ = std::move(*BlockPool::create(kBlocks, preset_.block_size, kBlockBytes));
    engine_ = std::make_unique<sim::Engine>(0, preset_, sim::EngineLimits{}, sched_, host_, counters_);
    engine_->set_kv_observer(pool_.get());
  }

  // The pool agrees with the engine, place by place.
  void check() {
    const PoolOccupancy o = pool_->occupancy();
    const sched::KvPoolStats k = engine_->stats();
    ASSERT_EQ(pool_->errors(), 0u);
    ASSERT_EQ(engine_->violations(), 0u) << engine_->first_violation();
    EXPECT_EQ(o.total, kBlocks);
    EXPECT_EQ(o.free + o.held + o.pinned + o.cached + o.offloading, kBlocks);
    EXPECT_EQ(o.free + o.cached, k.blocks_free);
    EXPECT_EQ(o.pinned, k.blocks_pinned);
    EXPECT_EQ(o.cached, engine_->cached_blocks());
    EXPECT_EQ(o.offloading, engine_->offloading_blocks());
  }

  void submit(sim::SessionId s, std::uint32_t round, std::uint32_t prompt, std::uint32_t output, std::uint32_t shared,
              bool last = false) {
    sim::RoundWork w;
    w.session = s;
    w.round = round;
    w.prompt_tokens = prompt;
    w.output_tokens = output;
    w.shared_prefix = shared;
    w.last_round = last;
    w.submitted = now_;
    w.content = &content_[s];
    engine_->submit(w, now_);
    check();
  }

  // Steps until the engine has nothing to do, checking after each step.
  void run() {
    for (int i = 0; i < 10000 && engine_->has_work(); ++i) {
      auto end = engine_->start_step(now_);
      check();
      if (!end) {
        now_ += 1ms;
        engine_->complete_offloads(now_);
        continue;
      }
      now_ = *end;
      engine_->finish_step(now_);
      check();
    }
    ASSERT_FALSE(engine_->has_work());
  }

  sim::Preset preset_;
  KeepScheduler sched_;
  Host host_;
  sim::RunCounters counters_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<sim::Engine> engine_;
  std::map<sim::SessionId, sim::SessionContent> content_;
  sim::Time now_ = sim::Time(1s);
};

TEST_F(PoolTest, ReleaseCachesThePrefixAndTheNextRoundHitsIt) {
  submit(1, 0, 100, 4, 0);
  run();
  check();
  // 100 + 4 tokens, the last one generated but not computed: 103 tokens, 6 full blocks cached.
  EXPECT_EQ(pool_->blocks(1, KvPlace::kCached), 6u);
  EXPECT_TRUE(pool_->holds_tokens(1, KvPlace::kCached, 96));
  EXPECT_GT(pool_->occupancy().touched_bytes, 0u);
  EXPECT_EQ(host_.tokens, 4u);

  submit(1, 1, 120, 4, 104);
  run();
  EXPECT_EQ(counters_.reused_tokens, 96u);
  EXPECT_EQ(host_.done[1], 2);
}

TEST_F(PoolTest, PinUnpinDropFollowTheEngine) {
  sched_.keep = {sched::KeepDecision::kPin, now_ + 100s};
  submit(1, 0, 200, 3, 0);
  run();
  EXPECT_EQ(engine_->pinned_blocks(), 12u);  // 202 computed tokens: 12 full blocks
  EXPECT_EQ(pool_->blocks(1, KvPlace::kPinned), 12u);
  EXPECT_TRUE(pool_->holds_tokens(1, KvPlace::kPinned, 192));

  engine_->unpin(1, now_);
  check();
  EXPECT_EQ(pool_->blocks(1, KvPlace::kCached), 12u);
  engine_->pin(1, now_ + 10s, now_);
  check();
  EXPECT_EQ(pool_->blocks(1, KvPlace::kPinned), 12u);
  engine_->drop(1, now_);
  check();
  EXPECT_EQ(pool_->blocks(1, KvPlace::kPinned), 0u);
  EXPECT_EQ(pool_->occupancy().free, kBlocks);
}

TEST_F(PoolTest, OffloadCopiesToHostAndReloadCopiesBack) {
  sched_.keep = {sched::KeepDecision::kOffload, {}};
  submit(7, 0, 160, 2, 0);
  run();
  // The copy is under way: its blocks are neither free nor reusable.
  EXPECT_EQ(pool_->blocks(7, KvPlace::kOffloading), 10u);
  EXPECT_EQ(pool_->host_blocks(7), 10u);
  EXPECT_EQ(pool_->occupancy().offloaded_bytes, 10 * kBlockBytes);
  now_ += 1s;
  engine_->complete_offloads(now_);
  check();
  EXPECT_EQ(pool_->blocks(7, KvPlace::kCached), 10u);
  EXPECT_EQ(content_[7].host_tokens, 160u);

  // The GPU copy goes; another session overwrites the freed blocks.
  engine_->drop(7, now_);
  check();
  sched_.keep = {sched::KeepDecision::kRelease, {}};
  submit(8, 0, static_cast<std::uint32_t>((kBlocks - 2) * preset_.block_size), 1, 0, true);
  run();
  EXPECT_EQ(pool_->blocks(7, KvPlace::kCached), 0u);

  // The next round of session 7 reloads its prefix from the host copy.
  submit(7, 1, 200, 2, 161);
  auto end = engine_->start_step(now_);
  ASSERT_TRUE(end);
  check();
  EXPECT_EQ(pool_->occupancy().reloaded_bytes, 10 * kBlockBytes);
  EXPECT_TRUE(pool_->holds_tokens(7, KvPlace::kHeld, 200));  // reloaded 160 + computed 40
  engine_->finish_step(*end);
  now_ = *end;
  run();
  EXPECT_EQ(counters_.reused_tokens, 160u);
}

TEST_F(PoolTest, EvictionAndPreemptionUnderPressureStayConsistent) {
  // Eight sessions whose rounds together need more than the pool: the engine
  // evicts cached prefixes and preempts; the pool follows every move.
  for (std::uint32_t round = 0; round < 3; ++round) {
    for (sim::SessionId s = 1; s <= 8; ++s) {
      const std::uint32_t prompt = 150 + 60 * round + static_cast<std::uint32_t>(s) * 7;
      const std::uint32_t shared = round == 0 ? 0 : 150 + 60 * (round - 1) + static_cast<std::uint32_t>(s) * 7 + 40;
      submit(s, round, prompt, 40, std::min(shared, prompt));
    }
    run();
  }
  EXPECT_GT(counters_.preemptions + counters_.recomputed_tokens, 0u);  // there was pressure
  for (sim::SessionId s = 1; s <= 8; ++s) EXPECT_EQ(host_.done[s], 3);
  check();
  const PoolOccupancy o = pool_->occupancy();
  EXPECT_EQ(o.held, 0u);
  EXPECT_EQ(o.free + o.cached, kBlocks);
}

TEST(Pool, RejectsImpossibleSizes) {
  EXPECT_FALSE(BlockPool::create(0, 16, 4096));
  EXPECT_FALSE(BlockPool::create(10, 16, 8));  // under a byte per token
  auto p = BlockPool::create(4, 16, 4096);
  ASSERT_TRUE(p);
  // A move of more blocks than a place holds is an error, not a silent success.
  (*p)->moved(1, KvPlace::kCached, KvPlace::kFree, 1);
  EXPECT_EQ((*p)->errors(), 1u);
  (*p)->moved(1, KvPlace::kFree, KvPlace::kHeld, 5);
  EXPECT_EQ((*p)->errors(), 2u);
  EXPECT_EQ((*p)->occupancy().held, 4u);
}

}  // namespace
}  // namespace tandem::testbed
