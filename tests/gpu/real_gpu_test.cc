// The CUDA backend on a real GPU: two green contexts of different sizes from
// one split, and the SM counts the driver says they got. Skips without a
// driver and device (GTEST_SKIP naming why). No kernels: those need nvcc/PTX.
#include <gtest/gtest.h>

#include <cerrno>
#include <iostream>

#include "gpu/cuda_device.h"
#include "gpu/partition.h"

namespace tandem::gpu {
namespace {

TEST(RealGpu, GreenContextsGetThePlannedSmCounts) {
  auto opened = open_cuda_device(0);
  if (!opened) GTEST_SKIP() << "no usable CUDA device: " << opened.error().message();
  DeviceApi& d = **opened;

  auto info = d.info();
  ASSERT_TRUE(info) << info.error().message();
  auto res = d.sm_resource();
  ASSERT_TRUE(res) << res.error().message();
  EXPECT_EQ(res->sm_count, info->sm_count);
  std::cout << info->name << ": " << res->sm_count << " SMs, minimum partition " << res->min_partition_size
            << ", alignment " << res->alignment << ", " << (info->total_memory >> 20) << " MiB\n";

  // The simulated split must agree with the driver's (else the plan is wrong).
  const std::uint32_t block = block_size(*res);
  auto count = d.split_group_count(block);
  ASSERT_TRUE(count) << count.error().message();
  EXPECT_EQ(*count, res->sm_count / block);

  // About a third and the rest, as the planner rounds them.
  auto small = sms_for_fraction(*res, "decode", 1.0 / 3);
  ASSERT_TRUE(small) << small.error().message();
  std::vector<std::uint32_t> feasible = feasible_sm_counts(*res);
  std::uint32_t rest = 0;
  for (std::uint32_t c : feasible) {
    if (c + *small <= res->sm_count) rest = c;
  }
  ASSERT_GT(rest, 0u);
  std::vector<StageRequest> want = {{"decode", *small}, {"prefill", rest}};
  auto plan = plan_partitions(*res, want);
  ASSERT_TRUE(plan) << plan.error().message();

  auto split = d.split_by_count(plan->group_count, plan->group_sm_count);
  ASSERT_TRUE(split) << split.error().message();
  ASSERT_TRUE(check_split(*plan, *split));

  std::vector<GreenCtxId> ctxs;
  std::vector<StreamId> streams;
  for (const StagePartition& stage : plan->stages) {
    auto ctx = d.create_green_context(pieces_for(stage, *split));
    ASSERT_TRUE(ctx) << stage.stage << ": " << ctx.error().message();
    ctxs.push_back(*ctx);
    auto got = d.green_context_sm_resource(*ctx);
    ASSERT_TRUE(got) << got.error().message();
    EXPECT_EQ(got->sm_count, stage.sm_count) << stage.stage;
    auto st = d.create_stream(*ctx, 0);
    ASSERT_TRUE(st) << st.error().message();
    streams.push_back(*st);
  }
  // The destroy-order rule holds on the real backend too.
  auto busy = d.destroy_green_context(ctxs[0]);
  ASSERT_FALSE(busy);
  EXPECT_EQ(busy.error().code(), EBUSY);
  for (StreamId st : streams) EXPECT_TRUE(d.destroy_stream(st));
  for (GreenCtxId ctx : ctxs) EXPECT_TRUE(d.destroy_green_context(ctx));
}

}  // namespace
}  // namespace tandem::gpu
