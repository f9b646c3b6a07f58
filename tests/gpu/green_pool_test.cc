// GreenContextPool on the simulated device: one split, contexts of the
// planned sizes, verification and teardown on failure, the teardown order,
// switching (events recorded and waited only at begin_pass, work ordered
// across a switch), invalid indices, stage lookup, 3-stage pools and the
// Nova/SGLang-style generated configs.
#include "gpu/green_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpu/partition.h"
#include "gpu/sim_device.h"

namespace tandem::gpu {
namespace {

// A DeviceApi in front of a SimDevice that logs every call a pool makes
// (including records and waits, which SimDevice::calls() leaves out), can
// lie about a green context's SM count and can fail the Nth create_stream.
class Recorder final : public DeviceApi {
 public:
  explicit Recorder(SimDevice& d) : d_(d) {}

  std::vector<std::string> log;
  // green_context_sm_resource of the context created `lie_ctx`-th (1-based)
  // reports `lie_by` fewer SMs.
  int lie_ctx = 0;
  std::uint32_t lie_by = 8;
  // The `fail_stream`-th create_stream (1-based, both kinds) fails.
  int fail_stream = 0;

  std::string_view backend() const override { return d_.backend(); }
  base::Result<int> device_count() override { return d_.device_count(); }
  base::Result<DeviceInfo> info() override { return d_.info(); }
  base::Result<SmResource> sm_resource() override { return d_.sm_resource(); }
  base::Result<std::uint32_t> split_group_count(std::uint32_t m) override { return d_.split_group_count(m); }
  base::Result<Split> split_by_count(std::uint32_t n, std::uint32_t m) override {
    log.push_back(fmt::format("split {} {}", n, m));
    return d_.split_by_count(n, m);
  }
  base::Result<GreenCtxId> create_green_context(std::span<const ResourceId> pieces) override {
    auto r = d_.create_green_context(pieces);
    if (r) {
      ++ctxs_;
      if (ctxs_ == lie_ctx) lied_ = *r;
      log.push_back(fmt::format("ctx {}", *r));
    }
    return r;
  }
  base::Result<SmResource> green_context_sm_resource(GreenCtxId ctx) override {
    auto r = d_.green_context_sm_resource(ctx);
    if (r && lied_ && *lied_ == ctx) r->sm_count -= lie_by;
    return r;
  }
  base::Result<StreamId> create_stream(GreenCtxId ctx, int priority) override {
    if (++streams_ == fail_stream) return cu_error("cuGreenCtxStreamCreate", kCudaErrorOutOfMemory);
    auto r = d_.create_stream(ctx, priority);
    if (r) log.push_back(fmt::format("stream {} in ctx {} prio {}", *r, ctx, priority));
    return r;
  }
  base::Result<void> destroy_stream(StreamId s) override {
    log.push_back(fmt::format("destroy stream {}", s));
    return d_.destroy_stream(s);
  }
  base::Result<void> destroy_green_context(GreenCtxId ctx) override {
    log.push_back(fmt::format("destroy ctx {}", ctx));
    return d_.destroy_green_context(ctx);
  }
  base::Result<DevicePtr> alloc_device(std::uint64_t b) override { return d_.alloc_device(b); }
  base::Result<void> free_device(DevicePtr p) override { return d_.free_device(p); }
  base::Result<void*> alloc_pinned_host(std::uint64_t b) override { return d_.alloc_pinned_host(b); }
  base::Result<void> free_pinned_host(void* p) override { return d_.free_pinned_host(p); }
  base::Result<StreamId> create_plain_stream(int priority) override {
    if (++streams_ == fail_stream) return cu_error("cuStreamCreateWithPriority", kCudaErrorOutOfMemory);
    auto r = d_.create_plain_stream(priority);
    if (r) log.push_back(fmt::format("plain stream {} prio {}", *r, priority));
    return r;
  }
  base::Result<void*> native_stream(StreamId s) override { return d_.native_stream(s); }
  base::Result<void*> native_context(GreenCtxId c) override { return d_.native_context(c); }
  base::Result<StreamId> stream_for_native(void* n) override { return d_.stream_for_native(n); }
  base::Result<void> copy_h2d_async(DevicePtr dst, const void* src, std::uint64_t b, StreamId s) override {
    return d_.copy_h2d_async(dst, src, b, s);
  }
  base::Result<EventId> create_event() override {
    auto r = d_.create_event();
    if (r) log.push_back(fmt::format("event {}", *r));
    return r;
  }
  base::Result<void> destroy_event(EventId e) override {
    log.push_back(fmt::format("destroy event {}", e));
    return d_.destroy_event(e);
  }
  base::Result<void> record_event(EventId e, StreamId s) override {
    log.push_back(fmt::format("record {} on {}", e, s));
    return d_.record_event(e, s);
  }
  base::Result<void> stream_wait_event(StreamId s, EventId e) override {
    log.push_back(fmt::format("wait {} on {}", s, e));
    return d_.stream_wait_event(s, e);
  }
  base::Result<bool> event_done(EventId e) override { return d_.event_done(e); }
  base::Result<void> event_synchronize(EventId e) override { return d_.event_synchronize(e); }
  base::Result<void> stream_synchronize(StreamId s) override { return d_.stream_synchronize(s); }
  double h2d_bytes_per_s() const override { return d_.h2d_bytes_per_s(); }

  std::size_t count(std::string_view prefix) const {
    return static_cast<std::size_t>(
        std::ranges::count_if(log, [&](const std::string& l) { return l.starts_with(prefix); }));
  }
  void clear() { log.clear(); }

 private:
  SimDevice& d_;
  int ctxs_ = 0;
  int streams_ = 0;
  std::optional<GreenCtxId> lied_;
};

std::unique_ptr<SimDevice> h100() {
  auto d = SimDevice::create();
  EXPECT_TRUE(d);
  return std::move(*d);
}

// decode 16..64 by 8, prefill the rest (the tests' standard pool).
PoolConfig standard(bool full_device = false) {
  auto d = h100();
  auto config = two_stage_config(d->sm_resource().value(),
                                 {.decode_min = 16, .decode_max = 64, .step = 8, .full_device = full_device});
  EXPECT_TRUE(config) << config.error().message();
  return *config;
}

TEST(GreenContextPool, BuildsEveryPartitionFromOneSplit) {
  auto sim = h100();
  Recorder rec(*sim);
  auto pool = GreenContextPool::create(rec, standard());
  ASSERT_TRUE(pool) << pool.error().message();
  GreenContextPool& p = **pool;

  EXPECT_EQ(rec.count("split"), 1u);
  EXPECT_EQ(rec.log.front(), "split 16 8");  // 132 SMs: 16 blocks of 8 + 4 remaining
  ASSERT_EQ(p.partition_count(), 7u);
  ASSERT_EQ(p.stage_count(), 2u);
  EXPECT_EQ(p.decode_sms(), (std::vector<std::uint32_t>{16, 24, 32, 40, 48, 56, 64}));
  const std::size_t prefill = p.stage("prefill").value();
  const std::size_t decode = p.stage("decode").value();
  EXPECT_EQ(p.decode_stage(), decode);
  for (std::size_t i = 0; i < p.partition_count(); ++i) {
    // The rest: 132 - decode, and 132 - 8k is 4 + a multiple of 8, which the
    // remainder makes feasible: the whole device is used.
    EXPECT_EQ(p.sm_count(i, prefill), 132 - p.sm_count(i, decode)) << "partition " << i;
  }
  // 14 contexts, each really of the planned size; one stream each.
  EXPECT_EQ(sim->live_green_contexts(), 14u);
  EXPECT_EQ(sim->live_streams(), 14u);
  EXPECT_EQ(sim->live_events(), 2u);
  // Priorities: decode -5, prefill 0.
  EXPECT_EQ(sim->stream_priority(p.stream(0, decode)), -5);
  EXPECT_EQ(sim->stream_priority(p.stream(0, prefill)), 0);
  // The most decode SMs until told otherwise.
  EXPECT_EQ(p.active(), 6u);
  // Within a partition the stages' contexts do not overlap: their pieces
  // are disjoint groups of the one split, so the sizes add up to the device.
  for (std::size_t i = 0; i < p.partition_count(); ++i) {
    EXPECT_LE(p.sm_count(i, 0) + p.sm_count(i, 1), 132u);
  }
}

TEST(GreenContextPool, TearsDownStreamsBeforeTheirContexts) {
  auto sim = h100();
  Recorder rec(*sim);
  {
    auto pool = GreenContextPool::create(rec, standard());
    ASSERT_TRUE(pool) << pool.error().message();
    rec.clear();
  }
  EXPECT_EQ(sim->live_streams(), 0u);
  EXPECT_EQ(sim->live_green_contexts(), 0u);
  EXPECT_EQ(sim->live_events(), 0u);
  EXPECT_EQ(rec.count("destroy stream"), 14u);
  EXPECT_EQ(rec.count("destroy ctx"), 14u);
  // Every context is destroyed after every stream created in it: pair each
  // "destroy ctx N" with the streams the build put into ctx N.
  auto pos = [&](const std::string& line) { return std::ranges::find(rec.log, line) - rec.log.begin(); };
  const std::vector<std::string> all = sim->calls();
  for (const std::string& call : all) {
    unsigned stream = 0, ctx = 0;
    if (std::sscanf(call.c_str(), "stream %u in ctx %u", &stream, &ctx) == 2) {
      EXPECT_LT(pos(fmt::format("destroy stream {}", stream)), pos(fmt::format("destroy ctx {}", ctx))) << call;
    }
  }
}

TEST(GreenContextPool, AContextOfTheWrongSizeFailsCreationAndTearsDown) {
  auto sim = h100();
  Recorder rec(*sim);
  rec.lie_ctx = 6;  // partition 2's decode context (prefill, decode per partition)
  auto pool = GreenContextPool::create(rec, standard());
  ASSERT_FALSE(pool);
  EXPECT_EQ(pool.error().code(), EIO);
  EXPECT_EQ(pool.error().context(), "partition 2 stage 'decode': wanted 32 SMs, the green context got 24");
  EXPECT_EQ(sim->live_streams(), 0u);
  EXPECT_EQ(sim->live_green_contexts(), 0u);
  EXPECT_EQ(sim->live_events(), 0u);
  // Everything created was destroyed: 5 streams (the lying context got none), 6 contexts.
  EXPECT_EQ(rec.count("stream "), 5u);
  EXPECT_EQ(rec.count("destroy stream"), 5u);
  EXPECT_EQ(rec.count("destroy ctx"), 6u);
}

TEST(GreenContextPool, AFailedStreamTearsDownWhatWasBuilt) {
  auto sim = h100();
  Recorder rec(*sim);
  rec.fail_stream = 9;
  auto pool = GreenContextPool::create(rec, standard());
  ASSERT_FALSE(pool);
  EXPECT_EQ(pool.error().code(), ENOMEM);
  EXPECT_NE(pool.error().context().find("cuGreenCtxStreamCreate"), std::string::npos) << pool.error().context();
  EXPECT_EQ(sim->live_streams(), 0u);
  EXPECT_EQ(sim->live_green_contexts(), 0u);
  EXPECT_EQ(rec.count("destroy stream"), 8u);
  EXPECT_EQ(rec.count("destroy ctx"), 9u);
}

TEST(GreenContextPool, SwitchesOnlyAtBeginPassAndOrdersTheStreams) {
  auto sim = h100();
  Recorder rec(*sim);
  auto pool = GreenContextPool::create(rec, standard());
  ASSERT_TRUE(pool) << pool.error().message();
  GreenContextPool& p = **pool;
  const std::size_t decode = p.stage("decode").value();
  const std::size_t prefill = p.stage("prefill").value();
  rec.clear();

  // Stable between boundaries; the same index switches nothing.
  const StreamId before = p.stream(decode);
  EXPECT_EQ(p.stream(decode), before);
  ASSERT_TRUE(p.begin_pass(6));
  EXPECT_TRUE(rec.log.empty());
  EXPECT_EQ(p.counters().switches, 0u);

  // A long kernel on the old decode stream; after the switch, work on the
  // new decode stream starts only when it has finished.
  ASSERT_TRUE(sim->launch_kernel(p.stream(6, decode), KernelWork{.flops = 1e12}));
  const std::uint64_t old_tail = sim->stream_tail_ns(p.stream(6, decode)).value();
  ASSERT_GT(old_tail, 0u);
  ASSERT_TRUE(p.begin_pass(1));
  EXPECT_EQ(p.active(), 1u);
  EXPECT_EQ(p.counters().switches, 1u);
  EXPECT_NE(p.stream(decode), before);
  EXPECT_EQ(p.stream(decode), p.stream(1, decode));
  // Per stage: record on the old stream, then the new stream waits on it.
  ASSERT_EQ(rec.log.size(), 4u);
  for (std::size_t s = 0; s < 2; ++s) {
    EXPECT_TRUE(rec.log[2 * s].starts_with("record ")) << rec.log[2 * s];
    EXPECT_EQ(rec.log[2 * s].substr(rec.log[2 * s].find(" on ") + 4), std::to_string(p.stream(6, s)));
    EXPECT_TRUE(rec.log[2 * s + 1].starts_with(fmt::format("wait {} on ", p.stream(1, s)))) << rec.log[2 * s + 1];
  }
  EXPECT_GE(sim->stream_tail_ns(p.stream(1, decode)).value(), old_tail);
  ASSERT_TRUE(sim->launch_kernel(p.stream(decode), KernelWork{.flops = 1e9}));
  std::vector<SimOp> ops = sim->ops();
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_GE(ops[1].start_ns, ops[0].end_ns);
  // The prefill stream was not touched by the decode kernel but is ordered too.
  EXPECT_EQ(sim->stream_tail_ns(p.stream(1, prefill)).value(), sim->stream_tail_ns(p.stream(6, prefill)).value());
}

TEST(GreenContextPool, AnInvalidIndexKeepsThePartition) {
  auto sim = h100();
  Recorder rec(*sim);
  auto pool = GreenContextPool::create(rec, standard());
  ASSERT_TRUE(pool);
  GreenContextPool& p = **pool;
  ASSERT_TRUE(p.begin_pass(3));
  const StreamId decode = p.stream(1);
  rec.clear();
  auto r = p.begin_pass(7);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ERANGE);
  EXPECT_EQ(r.error().context(), "partition index 7 is out of range: the pool has 7 partitions");
  EXPECT_EQ(p.active(), 3u);
  EXPECT_EQ(p.stream(1), decode);
  EXPECT_TRUE(rec.log.empty());
  EXPECT_EQ(p.counters().bad_indices, 1u);
  EXPECT_EQ(p.counters().switches, 1u);
}

TEST(GreenContextPool, LooksUpStagesByName) {
  auto sim = h100();
  auto pool = GreenContextPool::create(*sim, standard());
  ASSERT_TRUE(pool);
  EXPECT_EQ((*pool)->stage("prefill").value(), 0u);
  EXPECT_EQ((*pool)->stage("decode").value(), 1u);
  EXPECT_EQ((*pool)->stage_name(1), "decode");
  auto missing = (*pool)->stage("vision");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ENOENT);
  EXPECT_EQ(missing.error().context(), "no stage 'vision' in the pool");
}

TEST(GreenContextPool, ThreeStagesWithTheRestAndFractions) {
  auto sim = h100();
  Recorder rec(*sim);
  PoolConfig config;
  config.stages = {{"vision", 0}, {"prefill", 0}, {"decode", -5}};
  config.partitions = {
      {.sizes = {16u, 0u, 32u}},
      {.sizes = {16u, 0u, 0.5}},  // half of 132 → 64 or 68 (ties to the smaller: 64 is 2 away, 68 is 2 away)
  };
  auto pool = GreenContextPool::create(rec, config);
  ASSERT_TRUE(pool) << pool.error().message();
  GreenContextPool& p = **pool;
  EXPECT_EQ(rec.count("split"), 1u);
  EXPECT_EQ(p.stage_count(), 3u);
  EXPECT_EQ(p.sm_count(0, 0), 16u);
  EXPECT_EQ(p.sm_count(0, 2), 32u);
  EXPECT_EQ(p.sm_count(0, 1), 132u - 16 - 32);  // 84 = 10 blocks + the remainder
  EXPECT_EQ(p.sm_count(1, 2), 64u);
  EXPECT_EQ(p.sm_count(1, 1), 132u - 16 - 64);  // 52 = 6 blocks + 4
  EXPECT_EQ(sim->live_green_contexts(), 6u);
  EXPECT_EQ(p.decode_sms(), (std::vector<std::uint32_t>{32, 64}));
  // A switch orders all three stages.
  rec.clear();
  ASSERT_TRUE(p.begin_pass(0));
  EXPECT_EQ(rec.count("record"), 3u);
  EXPECT_EQ(rec.count("wait"), 3u);
}

TEST(GreenContextPool, TheRestTakesWhatTheOtherStagesLeave) {
  auto sim = h100();
  PoolConfig config;
  config.stages = {{"prefill", 0}, {"decode", -5}};
  config.partitions = {{.sizes = {0u, 20u}}};  // decode 20 = 2 blocks + the remainder
  auto pool = GreenContextPool::create(*sim, config);
  ASSERT_TRUE(pool) << pool.error().message();
  EXPECT_EQ((*pool)->sm_count(0, 0), 112u);    // 112 left: 14 blocks, the remainder is decode's
  config.partitions = {{.sizes = {0u, 12u}}};  // decode 12 = 1 block + 4: prefill 120 = 15 blocks
  pool = GreenContextPool::create(*sim, config);
  ASSERT_TRUE(pool) << pool.error().message();
  EXPECT_EQ((*pool)->sm_count(0, 0), 120u);
}

TEST(GreenContextPool, WithoutADecodeStageTheLastStageOrders) {
  auto sim = h100();
  PoolConfig config;
  config.stages = {{"encode", 0}, {"generate", -5}};
  config.partitions = {{.sizes = {0u, 16u}}, {.sizes = {0u, 32u}}};
  auto pool = GreenContextPool::create(*sim, config);
  ASSERT_TRUE(pool) << pool.error().message();
  EXPECT_EQ((*pool)->decode_stage(), 1u);
  EXPECT_EQ((*pool)->decode_sms(), (std::vector<std::uint32_t>{16, 32}));
}

TEST(GreenContextPool, FullDevicePartitionUsesPlainStreams) {
  auto sim = h100();
  Recorder rec(*sim);
  auto pool = GreenContextPool::create(rec, standard(/*full_device=*/true));
  ASSERT_TRUE(pool) << pool.error().message();
  GreenContextPool& p = **pool;
  ASSERT_EQ(p.partition_count(), 8u);
  EXPECT_TRUE(p.full_device(7));
  EXPECT_FALSE(p.full_device(6));
  EXPECT_EQ(p.decode_sms().back(), 132u);
  EXPECT_EQ(p.sm_count(7, 0), 132u);
  EXPECT_EQ(rec.count("plain stream"), 2u);
  EXPECT_EQ(sim->live_green_contexts(), 14u);
  EXPECT_EQ(p.active(), 7u);
  ASSERT_TRUE(p.begin_pass(0));
  ASSERT_TRUE(p.begin_pass(7));
  EXPECT_EQ(p.counters().switches, 2u);
}

TEST(GreenContextPool, RejectsBadConfigsBeforeCreatingAnything) {
  auto sim = h100();
  Recorder rec(*sim);
  struct Case {
    PoolConfig config;
    std::string message;
  };
  std::vector<Case> cases = {
      {{.stages = {{"decode", 0}}, .partitions = {{.sizes = {16u}}}}, "pool: 1 stages, 2 to 4 are allowed"},
      {{.stages = {{"a", 0}, {"a", 0}}, .partitions = {{.sizes = {16u, 16u}}}}, "pool: stage 'a' is named twice"},
      {{.stages = {{"prefill", 0}, {"decode", 0}}, .partitions = {}}, "pool: 0 partitions, 1 to 16 are allowed"},
      {{.stages = {{"prefill", 0}, {"decode", 0}}, .partitions = {{.sizes = {16u}}}},
       "partition 0: 1 sizes for 2 stages"},
      {{.stages = {{"prefill", 0}, {"decode", 0}}, .partitions = {{.sizes = {0u, 0u}}}},
       "partition 0: stages 'prefill' and 'decode' both ask for the rest"},
      {{.stages = {{"prefill", 0}, {"decode", 0}}, .partitions = {{.sizes = {0u, 32u}}, {.sizes = {0u, 24u}}}},
       "pool: partition 1 gives stage 'decode' 24 SMs, not more than partition 0's 32 (partitions are ordered by it, "
       "strictly increasing)"},
      {{.stages = {{"prefill", 0}, {"decode", 0}}, .partitions = {{.sizes = {64u, 30u}}}},
       "partition 0: stage 'decode': 30 SMs is not a multiple of 8 SMs, optionally plus the 4-SM remainder (nearest "
       "feasible: 28 or 32)"},
  };
  for (const Case& c : cases) {
    auto pool = GreenContextPool::create(rec, c.config);
    ASSERT_FALSE(pool) << c.message;
    EXPECT_EQ(pool.error().code(), EINVAL);
    EXPECT_EQ(pool.error().context(), c.message);
  }
  EXPECT_TRUE(rec.log.empty()) << rec.log.front();
  EXPECT_EQ(sim->live_green_contexts(), 0u);
}

TEST(TwoStageConfig, GeneratesDecodeCountsBetweenTheBounds) {
  SmResource h100{132, 8, 8};
  auto c = two_stage_config(h100, {.decode_min = 12, .decode_max = 28, .step = 4});
  ASSERT_TRUE(c) << c.error().message();
  ASSERT_EQ(c->stages.size(), 2u);
  EXPECT_EQ(c->stages[1].name, "decode");
  EXPECT_EQ(c->stages[1].priority, -5);
  std::vector<std::uint32_t> decode;
  for (const PoolPartition& p : c->partitions) decode.push_back(std::get<std::uint32_t>(p.sizes[1]));
  EXPECT_EQ(decode, (std::vector<std::uint32_t>{12, 16, 20, 24, 28}));

  auto none = two_stage_config(h100, {.decode_min = 130, .decode_max = 131, .step = 1});
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().context(),
            "two-stage pool: no feasible decode SM count in [130, 131] that is a multiple of 1 on a 132-SM device");
  auto many = two_stage_config(h100, {.decode_min = 8, .decode_max = 128, .step = 4});
  ASSERT_FALSE(many);
  EXPECT_NE(many.error().context().find("at most 16 are allowed"), std::string::npos) << many.error().context();
}

}  // namespace
}  // namespace tandem::gpu
