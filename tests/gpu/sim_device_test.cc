// The simulated device follows the driver's green-context rules, a planned
// pool builds and tears down in the right order on it, and the CUDA backend
// explains itself on a machine without a driver.
#include "gpu/sim_device.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <thread>

#include "gpu/cuda_device.h"
#include "gpu/partition.h"

namespace tandem::gpu {
namespace {

std::unique_ptr<SimDevice> h100() {
  auto d = SimDevice::create();
  EXPECT_TRUE(d) << d.error().message();
  return std::move(*d);
}

bool mentions(const base::Error& e, std::string_view what) { return e.context().find(what) != std::string::npos; }

TEST(SimDevice, ReportsItsConfiguration) {
  auto d = h100();
  auto info = d->info();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->sm_count, 132u);
  EXPECT_EQ(info->total_memory, 80ull << 30);
  EXPECT_EQ(d->device_count().value(), 1);
  EXPECT_EQ(d->sm_resource().value(), (SmResource{.sm_count = 132, .min_partition_size = 8, .alignment = 8}));
  EXPECT_EQ(d->backend(), "sim");
  EXPECT_EQ(d->h2d_copy_ns(50'000'000'000ull), 1'000'000'000u);  // 50 GB at 50 GB/s
  EXPECT_EQ(d->d2h_copy_ns(1), 1u);                              // rounded up

  EXPECT_FALSE(SimDevice::create({.sm_count = 0}));
  EXPECT_FALSE(SimDevice::create({.alignment = 0}));
  EXPECT_FALSE(SimDevice::create({.min_partition_size = 200}));
  EXPECT_FALSE(SimDevice::create({.ordinal = 1}));
  EXPECT_FALSE(SimDevice::create({.h2d_bytes_per_s = 0}));
}

TEST(SimDevice, SplitRoundsUpToGranularityAndKeepsTheRemainder) {
  auto d = h100();
  EXPECT_EQ(d->split_group_count(8).value(), 16u);
  EXPECT_EQ(d->split_group_count(5).value(), 16u);  // aligned up to 8
  EXPECT_EQ(d->split_group_count(0).value(), 16u);  // raised to the minimum
  EXPECT_EQ(d->split_group_count(16).value(), 8u);
  EXPECT_EQ(d->split_group_count(20).value(), 5u);  // 24-SM groups
  EXPECT_EQ(d->split_group_count(128).value(), 1u);
  // 130 rounds up to 136 > 132 (the sim's assumption; the header is silent).
  auto past = d->split_group_count(130);
  ASSERT_FALSE(past);
  EXPECT_TRUE(mentions(past.error(), "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION")) << past.error().context();
}

TEST(SimDevice, SplitRejectsWhatTheDriverRejects) {
  auto d = h100();
  auto over = d->split_group_count(133);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code(), EINVAL);
  EXPECT_TRUE(mentions(over.error(), "cuDevSmResourceSplitByCount: CUDA_ERROR_INVALID_VALUE: invalid argument"))
      << over.error().context();
  auto zero = d->split_by_count(0, 8);
  ASSERT_FALSE(zero);
  EXPECT_TRUE(mentions(zero.error(), "CUDA_ERROR_INVALID_VALUE"));
}

TEST(SimDevice, SplitMakesSymmetricGroupsAndARemainder) {
  auto d = h100();
  auto s = d->split_by_count(2, 16);  // FlashInfer's docstring example: [16, 16, 100]
  ASSERT_TRUE(s) << s.error().message();
  EXPECT_EQ(s->groups.size(), 2u);
  EXPECT_EQ(s->group_sm_count, 16u);
  ASSERT_TRUE(s->remaining.has_value());
  EXPECT_EQ(s->remaining_sm_count, 100u);

  auto all = d->split_by_count(100, 8);  // asks for more than fit: gets 16
  ASSERT_TRUE(all);
  EXPECT_EQ(all->groups.size(), 16u);
  EXPECT_EQ(all->remaining_sm_count, 4u);

  auto even = SimDevice::create({.sm_count = 128});
  ASSERT_TRUE(even);
  auto e = (*even)->split_by_count(16, 8);
  ASSERT_TRUE(e);
  EXPECT_FALSE(e->remaining.has_value());
  EXPECT_EQ(e->remaining_sm_count, 0u);
}

TEST(SimDevice, CombinesPiecesOfOneSplitOnly) {
  auto d = h100();
  auto a = d->split_by_count(16, 8);
  auto b = d->split_by_count(16, 8);
  ASSERT_TRUE(a && b);

  std::vector<ResourceId> same = {a->groups[0], a->groups[1], *a->remaining};
  auto ctx = d->create_green_context(same);
  ASSERT_TRUE(ctx) << ctx.error().message();
  EXPECT_EQ(d->green_context_sm_resource(*ctx).value().sm_count, 20u);

  std::vector<ResourceId> mixed = {a->groups[2], b->groups[3]};
  auto bad = d->create_green_context(mixed);
  ASSERT_FALSE(bad);
  EXPECT_TRUE(mentions(bad.error(), "cuDevResourceGenerateDesc: CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"))
      << bad.error().context();

  std::vector<ResourceId> twice = {a->groups[2], a->groups[2]};
  EXPECT_FALSE(d->create_green_context(twice));
  EXPECT_FALSE(d->create_green_context({}));
  std::vector<ResourceId> unknown = {9999};
  auto u = d->create_green_context(unknown);
  ASSERT_FALSE(u);
  EXPECT_TRUE(mentions(u.error(), "CUDA_ERROR_INVALID_VALUE"));

  // Overlapping contexts are legal, as on the driver.
  std::vector<ResourceId> overlap = {a->groups[0]};
  EXPECT_TRUE(d->create_green_context(overlap));
  EXPECT_EQ(d->live_green_contexts(), 2u);
}

TEST(SimDevice, StreamsBelongToContextsAndBlockTheirDestruction) {
  auto d = h100();
  auto s = d->split_by_count(16, 8);
  ASSERT_TRUE(s);
  std::vector<ResourceId> one = {s->groups[0]};
  auto ctx = d->create_green_context(one);
  ASSERT_TRUE(ctx);
  auto st = d->create_stream(*ctx, -100);
  ASSERT_TRUE(st);
  EXPECT_EQ(d->stream_priority(*st), -5);  // clamped to the device's range

  auto busy = d->destroy_green_context(*ctx);
  ASSERT_FALSE(busy);
  EXPECT_EQ(busy.error().code(), EBUSY);
  EXPECT_TRUE(mentions(busy.error(), "1 live stream(s)")) << busy.error().context();

  ASSERT_TRUE(d->destroy_stream(*st));
  auto again = d->destroy_stream(*st);
  ASSERT_FALSE(again);
  EXPECT_TRUE(mentions(again.error(), "cuStreamDestroy: CUDA_ERROR_INVALID_HANDLE"));
  ASSERT_TRUE(d->destroy_green_context(*ctx));
  auto gone = d->create_stream(*ctx, 0);
  ASSERT_FALSE(gone);
  EXPECT_TRUE(mentions(gone.error(), "cuGreenCtxStreamCreate: CUDA_ERROR_INVALID_CONTEXT"));
  EXPECT_FALSE(d->green_context_sm_resource(*ctx));
  EXPECT_FALSE(d->destroy_green_context(*ctx));
}

// What a GreenContextPool will do: plan, one split, one context + stream per
// stage, verify the SM counts; tear down streams before contexts.
TEST(SimDevice, PlannedPoolBuildsAndTearsDownInOrder) {
  auto d = h100();
  auto res = d->sm_resource();
  ASSERT_TRUE(res);
  std::vector<StageRequest> want = {{"decode", 48u}, {"prefill", 84u}};
  auto plan = plan_partitions(*res, want);
  ASSERT_TRUE(plan) << plan.error().message();
  auto split = d->split_by_count(plan->group_count, plan->group_sm_count);
  ASSERT_TRUE(split);
  ASSERT_TRUE(check_split(*plan, *split));

  std::vector<GreenCtxId> ctxs;
  std::vector<StreamId> streams;
  for (const StagePartition& stage : plan->stages) {
    auto ctx = d->create_green_context(pieces_for(stage, *split));
    ASSERT_TRUE(ctx) << ctx.error().message();
    EXPECT_EQ(d->green_context_sm_resource(*ctx).value().sm_count, stage.sm_count) << stage.stage;
    auto st = d->create_stream(*ctx, 0);
    ASSERT_TRUE(st);
    ctxs.push_back(*ctx);
    streams.push_back(*st);
  }
  for (StreamId st : streams) ASSERT_TRUE(d->destroy_stream(st));
  for (GreenCtxId ctx : ctxs) ASSERT_TRUE(d->destroy_green_context(ctx));
  EXPECT_EQ(d->live_streams(), 0u);
  EXPECT_EQ(d->live_green_contexts(), 0u);
  EXPECT_EQ(d->calls(), (std::vector<std::string>{"split 16x8+4", "ctx 1 = 48 SMs", "stream 1 in ctx 1",
                                                  "ctx 2 = 84 SMs", "stream 2 in ctx 2", "destroy stream 1",
                                                  "destroy stream 2", "destroy ctx 1", "destroy ctx 2"}));
}

TEST(SimDevice, IsUsableFromSeveralThreads) {
  auto d = h100();
  auto s = d->split_by_count(16, 8);
  ASSERT_TRUE(s);
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<ResourceId> piece = {s->groups[static_cast<std::size_t>(t)]};
      for (int i = 0; i < 100; ++i) {
        auto ctx = d->create_green_context(piece);
        ASSERT_TRUE(ctx);
        auto st = d->create_stream(*ctx, 0);
        ASSERT_TRUE(st);
        ASSERT_TRUE(d->destroy_stream(*st));
        ASSERT_TRUE(d->destroy_green_context(*ctx));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(d->live_green_contexts(), 0u);
  EXPECT_EQ(d->calls().size(), 1u + (4u * 100u * 4u));
}

TEST(CudaDevice, ExplainsWhyItCannotOpen) {
  auto dev = open_cuda_device(0);
  if (dev) GTEST_SKIP() << "a CUDA driver and device are present; real_gpu_test covers them";
  const std::string& why = dev.error().context();
  if (cuda_backend_built()) {
    // This machine: no libcuda.so.1 (or a driver that refuses: then its call is named).
    EXPECT_TRUE(why.find("libcuda.so.1") != std::string::npos || why.find("CUDA_ERROR_") != std::string::npos ||
                why.find("CUDA driver") != std::string::npos)
        << why;
  } else {
    EXPECT_EQ(dev.error().code(), ENOTSUP);
    EXPECT_NE(why.find("built without CUDA headers"), std::string::npos) << why;
  }
  EXPECT_EQ(why.rfind("open_cuda_device: ", 0), 0u) << why;
  // A second attempt gives the same answer (the load is cached).
  auto again = open_cuda_device(0);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().context(), why);
}

TEST(CuResult, NamesAndErrnos) {
  EXPECT_EQ(cu_result_name(915), "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION");
  EXPECT_EQ(cu_result_name(12345), "CUDA_ERROR_12345");
  EXPECT_EQ(cu_result_errno(kCudaErrorOutOfMemory), ENOMEM);
  EXPECT_EQ(cu_result_errno(kCudaErrorNoDevice), ENODEV);
  EXPECT_EQ(cu_result_errno(12345), EIO);
  auto e = cu_error("cuGreenCtxCreate", kCudaErrorInvalidValue, "detail");
  EXPECT_EQ(e.error().context(), "cuGreenCtxCreate: CUDA_ERROR_INVALID_VALUE: invalid argument: detail");
}

}  // namespace
}  // namespace tandem::gpu
