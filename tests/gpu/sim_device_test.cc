// The simulated device follows the driver's green-context rules, a planned
// pool builds and tears down in the right order on it, and the CUDA backend
// explains itself on a machine without a driver.
#include "gpu/sim_device.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

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
  EXPECT_EQ(d->sm_resource().value(),
            (SmResource{.sm_count = 132, .min_partition_size = 8, .alignment = 8, .groups = 16}));
  EXPECT_EQ(d->backend(), "sim");
  EXPECT_EQ(d->h2d_copy_ns(50'000'000'000ull), 1'000'000'000u);  // 50 GB at 50 GB/s
  EXPECT_EQ(d->d2h_copy_ns(1), 1u);                              // rounded up

  EXPECT_FALSE(SimDevice::create({.sm_count = 0}));
  EXPECT_FALSE(SimDevice::create({.alignment = 0}));
  EXPECT_FALSE(SimDevice::create({.min_partition_size = 200}));
  EXPECT_FALSE(SimDevice::create({.ordinal = 1}));
  EXPECT_FALSE(SimDevice::create({.h2d_bytes_per_s = 0}));
}

TEST(SimDevice, AGpcLimitedSplitMakesFewerGroupsAndALargerRemainder) {
  // What an H200 did: 15 groups of 8 and 12 SMs remaining, not 16 and 4.
  SimDeviceConfig c;
  c.block_groups = 15;
  auto made = SimDevice::create(c);
  ASSERT_TRUE(made) << made.error().message();
  SimDevice& d = **made;
  EXPECT_EQ(d.sm_resource().value().groups, 15u);
  EXPECT_EQ(d.split_group_count(8).value(), 15u);
  EXPECT_EQ(d.split_group_count(16).value(), 8u) << "larger groups: the arithmetic";
  auto split = d.split_by_count(16, 8);
  ASSERT_TRUE(split);
  EXPECT_EQ(split->groups.size(), 15u);
  EXPECT_EQ(split->remaining_sm_count, 12u);
  // The planner, given that resource, plans what the split makes.
  auto plan = plan_partitions(d.sm_resource().value(), std::vector<StageRequest>{{"decode", 20u}, {"prefill", 112u}});
  ASSERT_TRUE(plan) << plan.error().message();
  EXPECT_EQ(plan->group_count, 15u);
  EXPECT_EQ(plan->remaining_sm_count, 12u);
  EXPECT_TRUE(plan->stages[0].uses_remainder);
  EXPECT_TRUE(check_split(*plan, *split));
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

TEST(SimDevice, DeviceMemoryIsAccountedAndBacked) {
  auto d = SimDevice::create({.memory_bytes = 10'000}).value();
  auto zero = d->alloc_device(0);
  ASSERT_FALSE(zero);
  EXPECT_TRUE(mentions(zero.error(), "cuMemAlloc: CUDA_ERROR_INVALID_VALUE")) << zero.error().context();
  auto a = d->alloc_device(6'000);
  ASSERT_TRUE(a);
  EXPECT_NE(*a, 0u);
  auto too_big = d->alloc_device(4'001);
  ASSERT_FALSE(too_big);
  EXPECT_EQ(too_big.error().code(), ENOMEM);
  EXPECT_TRUE(mentions(too_big.error(),
                       "CUDA_ERROR_OUT_OF_MEMORY: out of memory: 4001 bytes requested, 6000 of "
                       "10000 in use"))
      << too_big.error().context();
  auto b = d->alloc_device(4'000);
  ASSERT_TRUE(b);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(d->device_bytes_in_use(), 10'000u);
  EXPECT_EQ(d->live_device_allocations(), 2u);

  ASSERT_TRUE(d->free_device(*a));
  auto again = d->free_device(*a);
  ASSERT_FALSE(again);
  EXPECT_TRUE(mentions(again.error(), "cuMemFree: CUDA_ERROR_INVALID_VALUE")) << again.error().context();
  EXPECT_FALSE(d->free_device(*b + 8));  // inside an allocation, not its base
  EXPECT_EQ(d->device_bytes_in_use(), 4'000u);
  auto c = d->alloc_device(6'000);
  ASSERT_TRUE(c);
  EXPECT_NE(*c, *a);  // addresses are never reused

  auto h = d->alloc_pinned_host(100);
  ASSERT_TRUE(h);
  EXPECT_NE(*h, nullptr);
  EXPECT_EQ(d->pinned_bytes_in_use(), 100u);
  EXPECT_FALSE(d->free_pinned_host(static_cast<char*>(*h) + 1));
  ASSERT_TRUE(d->free_pinned_host(*h));
  EXPECT_EQ(d->live_pinned_allocations(), 0u);
  EXPECT_FALSE(d->alloc_pinned_host(0));
}

TEST(SimDevice, CopiesMoveBytesWithinOneAllocation) {
  auto d = h100();
  auto s = d->create_plain_stream(0).value();
  auto p = d->alloc_device(64).value();
  std::vector<std::byte> src(16);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i + 1);
  ASSERT_TRUE(d->copy_h2d_async(p + 8, src.data(), src.size(), s));
  EXPECT_EQ(d->read_device(p + 8, 16).value(), src);
  // The last byte of the allocation is a valid destination; one past is not.
  ASSERT_TRUE(d->copy_h2d_async(p + 63, src.data(), 1, s));
  auto over = d->copy_h2d_async(p + 56, src.data(), 9, s);
  ASSERT_FALSE(over);
  EXPECT_TRUE(mentions(over.error(), "cuMemcpyHtoDAsync: CUDA_ERROR_INVALID_VALUE")) << over.error().context();
  EXPECT_FALSE(d->copy_h2d_async(p + 64, src.data(), 1, s));
  EXPECT_FALSE(d->copy_h2d_async(p - 1, src.data(), 1, s));
  EXPECT_FALSE(d->copy_h2d_async(p, nullptr, 1, s));
  auto bad_stream = d->copy_h2d_async(p, src.data(), 1, 999);
  ASSERT_FALSE(bad_stream);
  EXPECT_TRUE(mentions(bad_stream.error(), "CUDA_ERROR_INVALID_HANDLE")) << bad_stream.error().context();
  EXPECT_FALSE(d->read_device(p + 60, 8));
  EXPECT_EQ(d->ops().size(), 2u);  // failed copies leave no trace
}

TEST(SimDevice, CopiesShareOneEngineAndStreamsAreFifo) {
  // 1 GB/s: 1000 bytes take 1 µs.
  auto d = SimDevice::create({.h2d_bytes_per_s = 1e9}).value();
  auto a = d->create_plain_stream(0).value();
  auto b = d->create_plain_stream(0).value();
  auto p = d->alloc_device(4000).value();
  std::vector<std::byte> src(1000);
  ASSERT_TRUE(d->copy_h2d_async(p, src.data(), 1000, a));
  ASSERT_TRUE(d->copy_h2d_async(p + 1000, src.data(), 1000, b));  // waits for the engine
  ASSERT_TRUE(d->copy_h2d_async(p + 2000, src.data(), 1000, a));
  auto ops = d->ops();
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(ops[0].start_ns, 0u);
  EXPECT_EQ(ops[0].end_ns, 1000u);
  EXPECT_EQ(ops[1].start_ns, 1000u);
  EXPECT_EQ(ops[1].end_ns, 2000u);
  EXPECT_EQ(ops[2].start_ns, 2000u);
  EXPECT_EQ(ops[2].end_ns, 3000u);
  EXPECT_EQ(d->stream_tail_ns(a).value(), 3000u);
  EXPECT_EQ(d->stream_tail_ns(b).value(), 2000u);

  // A kernel on stream b queues behind b's copy, not behind the engine.
  ASSERT_TRUE(d->launch_kernel(b, KernelWork{.flops = 0, .bytes = 3.35e9}));  // 1 ms at full HBM
  EXPECT_EQ(d->ops().back().start_ns, 2000u);
  EXPECT_EQ(d->ops().back().end_ns, 2000u + 1'000'000u);

  // Nothing starts before it is issued.
  d->advance(5'000'000);
  ASSERT_TRUE(d->copy_h2d_async(p, src.data(), 1000, a));
  EXPECT_EQ(d->ops().back().start_ns, 5'000'000u);
  EXPECT_EQ(d->now_ns(), 5'000'000u);
}

TEST(SimDevice, EventsOrderStreamsInVirtualTime) {
  auto d = SimDevice::create({.h2d_bytes_per_s = 1e9}).value();
  auto copy = d->create_plain_stream(0).value();
  auto compute = d->create_plain_stream(0).value();
  auto p = d->alloc_device(1000).value();
  std::vector<std::byte> src(1000);
  auto e = d->create_event().value();
  EXPECT_TRUE(d->event_done(e).value());  // never recorded: complete
  ASSERT_TRUE(d->copy_h2d_async(p, src.data(), 1000, copy));
  ASSERT_TRUE(d->record_event(e, copy));
  EXPECT_EQ(d->event_time_ns(e).value(), 1000u);
  EXPECT_FALSE(d->event_done(e).value());

  // compute waits for the copy: its kernel starts at 1 µs, not 0.
  ASSERT_TRUE(d->stream_wait_event(compute, e));
  ASSERT_TRUE(d->launch_kernel(compute, KernelWork{.flops = 0, .bytes = 3.35e6}));  // 1 µs
  EXPECT_EQ(d->ops().back().start_ns, 1000u);
  EXPECT_EQ(d->ops().back().end_ns, 2000u);

  d->advance(999);
  EXPECT_FALSE(d->event_done(e).value());
  ASSERT_TRUE(d->event_synchronize(e));
  EXPECT_EQ(d->now_ns(), 1000u);
  EXPECT_TRUE(d->event_done(e).value());
  ASSERT_TRUE(d->stream_synchronize(compute));
  EXPECT_EQ(d->now_ns(), 2000u);
  ASSERT_TRUE(d->event_synchronize(e));  // never moves the clock back
  EXPECT_EQ(d->now_ns(), 2000u);

  EXPECT_FALSE(d->record_event(e, 999));
  EXPECT_FALSE(d->record_event(999, copy));
  EXPECT_FALSE(d->stream_wait_event(compute, 999));
  EXPECT_FALSE(d->event_done(999));
  ASSERT_TRUE(d->destroy_event(e));
  auto gone = d->event_synchronize(e);
  ASSERT_FALSE(gone);
  EXPECT_TRUE(mentions(gone.error(), "cuEventSynchronize: CUDA_ERROR_INVALID_HANDLE")) << gone.error().context();
  EXPECT_EQ(d->live_events(), 0u);
}

TEST(SimDevice, KernelTimeIsARooflineOverTheStreamsSms) {
  auto d = h100();
  const SimDeviceConfig& c = d->config();
  // Compute-bound: 989 TFLOP over all 132 SMs takes a second.
  EXPECT_EQ(d->kernel_ns(KernelWork{.flops = 989e12, .bytes = 0}, 132), 1'000'000'000u);
  EXPECT_EQ(d->kernel_ns(KernelWork{.flops = 989e12, .bytes = 0}, 66), 2'000'000'000u);
  // Memory-bound: 44 SMs (a third) already saturate HBM; 22 get half of it.
  const KernelWork stream_hbm{.flops = 0, .bytes = c.hbm_bytes_per_s};  // a second at full bandwidth
  EXPECT_EQ(d->kernel_ns(stream_hbm, 132), 1'000'000'000u);
  EXPECT_EQ(d->kernel_ns(stream_hbm, 44), 1'000'000'000u);
  EXPECT_EQ(d->kernel_ns(stream_hbm, 22), 2'000'000'000u);
  // The slower of the two.
  EXPECT_EQ(d->kernel_ns(KernelWork{.flops = 989e12, .bytes = c.hbm_bytes_per_s * 3}, 132), 3'000'000'000u);
  EXPECT_EQ(d->kernel_ns(KernelWork{}, 132), 0u);

  // A green context's stream runs kernels on its SMs only.
  auto split = d->split_by_count(1, 16).value();
  std::vector<ResourceId> small{split.groups[0]};
  auto ctx = d->create_green_context(small).value();
  auto narrow = d->create_stream(ctx, 0).value();
  auto wide = d->create_plain_stream(0).value();
  const KernelWork work{.flops = 989e12 / 132 * 16, .bytes = 0};  // a second on 16 SMs
  ASSERT_TRUE(d->launch_kernel(narrow, work));
  ASSERT_TRUE(d->launch_kernel(wide, work));
  auto ops = d->ops();
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].end_ns - ops[0].start_ns, d->kernel_ns(work, 16));
  EXPECT_EQ(ops[1].end_ns - ops[1].start_ns, d->kernel_ns(work, 132));
  EXPECT_GT(ops[0].end_ns - ops[0].start_ns, ops[1].end_ns - ops[1].start_ns);
  EXPECT_FALSE(d->launch_kernel(narrow, KernelWork{.flops = -1, .bytes = 0}));
  EXPECT_FALSE(d->launch_kernel(999, work));

  EXPECT_FALSE(SimDevice::create({.hbm_bytes_per_s = 0}));
}

TEST(SimDevice, NativeStreamsMapBothWays) {
  auto d = h100();
  auto split = d->split_by_count(1, 8).value();
  std::vector<ResourceId> piece{split.groups[0]};
  auto ctx = d->create_green_context(piece).value();
  auto green = d->create_stream(ctx, 0).value();
  auto plain = d->create_plain_stream(-100).value();
  EXPECT_EQ(d->stream_priority(plain), -5);  // clamped
  void* g = d->native_stream(green).value();
  void* p = d->native_stream(plain).value();
  EXPECT_NE(g, nullptr);
  EXPECT_NE(p, nullptr);
  EXPECT_NE(g, p);
  EXPECT_EQ(d->stream_for_native(g).value(), green);
  EXPECT_EQ(d->stream_for_native(p).value(), plain);
  EXPECT_FALSE(d->stream_for_native(nullptr));
  EXPECT_FALSE(d->stream_for_native(static_cast<char*>(p) + 1));
  ASSERT_TRUE(d->destroy_stream(plain));
  EXPECT_FALSE(d->stream_for_native(p));
  EXPECT_FALSE(d->native_stream(plain));
  EXPECT_EQ(d->calls().back(), "destroy stream " + std::to_string(plain));
}

TEST(SimDevice, NativeContextsAreDistinctTokens) {
  auto d = SimDevice::create().value();
  auto split = d->split_by_count(2, 16).value();
  auto a = d->create_green_context(std::span(split.groups).first(1)).value();
  auto b = d->create_green_context(std::span(split.groups).subspan(1, 1)).value();
  void* primary = d->native_context(0).value();
  void* ca = d->native_context(a).value();
  void* cb = d->native_context(b).value();
  EXPECT_NE(primary, nullptr);
  EXPECT_NE(ca, primary);
  EXPECT_NE(ca, cb);
  EXPECT_EQ(d->native_context(a).value(), ca) << "stable";
  auto unknown = d->native_context(b + 10);
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().context().find("CUDA_ERROR_INVALID_CONTEXT"), std::string::npos)
      << unknown.error().context();
}

TEST(SimDevice, TeardownWithEverythingLiveIsSafe) {
  auto d = h100();
  auto split = d->split_by_count(2, 8).value();
  std::vector<ResourceId> piece{split.groups[0]};
  auto ctx = d->create_green_context(piece).value();
  auto s = d->create_stream(ctx, 0).value();
  auto p = d->alloc_device(1 << 20).value();
  void* h = d->alloc_pinned_host(1 << 20).value();
  std::memset(h, 7, 1 << 20);
  auto e = d->create_event().value();
  ASSERT_TRUE(d->copy_h2d_async(p, h, 1 << 20, s));
  ASSERT_TRUE(d->record_event(e, s));
  d.reset();  // streams, contexts, events and memory all still live
  SUCCEED();
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
