// SM partition planning: the split/alignment arithmetic on known devices.
#include "gpu/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <vector>

namespace tandem::gpu {
namespace {

constexpr SmResource kH100{.sm_count = 132, .min_partition_size = 8, .alignment = 8};

base::Result<PartitionPlan> plan(const SmResource& d, std::vector<StageRequest> stages) {
  return plan_partitions(d, stages);
}

TEST(Partition, BlockIsMinimumRoundedUpToAlignment) {
  EXPECT_EQ(block_size(kH100), 8u);
  EXPECT_EQ(block_size({.sm_count = 108, .min_partition_size = 4, .alignment = 2}), 4u);  // A100
  EXPECT_EQ(block_size({.sm_count = 80, .min_partition_size = 2, .alignment = 2}), 2u);   // V100
  EXPECT_EQ(block_size({.sm_count = 100, .min_partition_size = 6, .alignment = 4}), 8u);
}

TEST(Partition, DecodeAndPrefillCoverTheH100Exactly) {
  auto p = plan(kH100, {{"decode", 48u}, {"prefill", 84u}});
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->group_sm_count, 8u);
  EXPECT_EQ(p->group_count, 16u);
  EXPECT_EQ(p->remaining_sm_count, 4u);
  EXPECT_EQ(p->unused_sm_count, 0u);
  ASSERT_EQ(p->stages.size(), 2u);
  EXPECT_EQ(p->stages[0], (StagePartition{.stage = "decode", .sm_count = 48, .first_group = 0, .group_count = 6}));
  // 84 = 10 blocks of 8 plus the 4-SM remainder.
  EXPECT_EQ(p->stages[1],
            (StagePartition{
                .stage = "prefill", .sm_count = 84, .first_group = 6, .group_count = 10, .uses_remainder = true}));
}

TEST(Partition, MisalignedCountIsRejectedNamingTheStage) {
  auto p = plan(kH100, {{"decode", 50u}, {"prefill", 82u}});
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code(), EINVAL);
  EXPECT_NE(p.error().context().find("stage 'decode': 50 SMs"), std::string::npos) << p.error().context();
  EXPECT_NE(p.error().context().find("48 or 52"), std::string::npos) << p.error().context();

  auto q = plan(kH100, {{"decode", 48u}, {"prefill", 82u}});
  ASSERT_FALSE(q);
  EXPECT_NE(q.error().context().find("stage 'prefill': 82 SMs"), std::string::npos) << q.error().context();
}

TEST(Partition, OnlyOneStageGetsTheRemainder) {
  auto p = plan(kH100, {{"decode", 12u}, {"prefill", 20u}});
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().context().find("stage 'prefill'"), std::string::npos) << p.error().context();
  EXPECT_NE(p.error().context().find("stage 'decode' already has"), std::string::npos) << p.error().context();
}

TEST(Partition, OversubscriptionAndSmallStagesAreRejected) {
  auto over = plan(kH100, {{"decode", 56u}, {"prefill", 84u}});
  ASSERT_FALSE(over);
  EXPECT_NE(over.error().context().find("stages need 140 SMs (decode 56 + prefill 84), the device has 132"),
            std::string::npos)
      << over.error().context();

  auto small = plan(kH100, {{"decode", 4u}});
  ASSERT_FALSE(small);
  EXPECT_NE(small.error().context().find("stage 'decode': 4 SMs is below the device's minimum partition of 8"),
            std::string::npos)
      << small.error().context();

  EXPECT_FALSE(plan(kH100, {{"decode", 0u}}));
  EXPECT_FALSE(plan(kH100, {}));
  EXPECT_FALSE(plan(kH100, {{"decode", 8u}, {"decode", 8u}}));
  EXPECT_FALSE(plan({.sm_count = 0, .min_partition_size = 8, .alignment = 8}, {{"decode", 8u}}));
}

TEST(Partition, UnderSubscriptionLeavesUnusedSms) {
  auto p = plan(kH100, {{"decode", 32u}, {"prefill", 64u}});
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->unused_sm_count, 36u);
  EXPECT_EQ(p->stages[1].first_group, 4u);
  EXPECT_EQ(p->stages[1].group_count, 8u);
  EXPECT_FALSE(p->stages[1].uses_remainder);
}

TEST(Partition, NoRemainderOnAnEvenDevice) {
  SmResource d{.sm_count = 128, .min_partition_size = 8, .alignment = 8};
  auto p = plan(d, {{"decode", 48u}, {"prefill", 80u}});
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->remaining_sm_count, 0u);
  auto q = plan(d, {{"decode", 52u}});
  ASSERT_FALSE(q);
  EXPECT_NE(q.error().context().find("not a multiple of 8 SMs (nearest"), std::string::npos) << q.error().context();
}

TEST(Partition, FeasibleCountsOnH100) {
  std::vector<std::uint32_t> all = feasible_sm_counts(kH100);
  ASSERT_EQ(all.size(), 32u);
  EXPECT_EQ(all.front(), 8u);
  EXPECT_EQ(all[1], 12u);
  EXPECT_EQ(all[2], 16u);
  EXPECT_EQ(all[all.size() - 2], 128u);
  EXPECT_EQ(all.back(), 132u);
  for (std::uint32_t c : all) {
    std::vector<StageRequest> one = {{"s", c}};
    EXPECT_TRUE(plan_partitions(kH100, one)) << c;
  }
  // A100-like: min 4, alignment 2, 108 SMs → blocks of 4, no remainder.
  std::vector<std::uint32_t> a100 = feasible_sm_counts({.sm_count = 108, .min_partition_size = 4, .alignment = 2});
  ASSERT_EQ(a100.size(), 27u);
  EXPECT_EQ(a100.front(), 4u);
  EXPECT_EQ(a100.back(), 108u);
}

TEST(Partition, TheDriversGroupCountDecidesWhatIsFeasible) {
  // An H200's split: 15 groups of 8 and 12 SMs remaining (its GPCs).
  constexpr SmResource kH200{.sm_count = 132, .min_partition_size = 8, .alignment = 8, .groups = 15};
  const std::vector<std::uint32_t> f = feasible_sm_counts(kH200);
  EXPECT_TRUE(std::binary_search(f.begin(), f.end(), 12u));
  EXPECT_TRUE(std::binary_search(f.begin(), f.end(), 120u));
  EXPECT_TRUE(std::binary_search(f.begin(), f.end(), 124u));
  EXPECT_FALSE(std::binary_search(f.begin(), f.end(), 128u)) << "16 groups of 8 do not exist";
  EXPECT_FALSE(std::binary_search(f.begin(), f.end(), 4u));
  auto p = plan(kH200, {{"decode", 44u}, {"prefill", 88u}});
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->group_count, 15u);
  EXPECT_EQ(p->remaining_sm_count, 12u);
  EXPECT_TRUE(p->stages[0].uses_remainder);  // 4·8 + 12
  EXPECT_EQ(p->stages[1].group_count, 11u);
  // 128 SMs are 16 groups: one more than the split makes.
  auto too_many = plan(kH200, {{"a", 64u}, {"b", 64u}});
  ASSERT_FALSE(too_many);
  EXPECT_NE(too_many.error().message().find("a split of the device makes 15"), std::string::npos)
      << too_many.error().message();
}

TEST(Partition, FractionsRoundToTheNearestFeasibleCount) {
  EXPECT_EQ(sms_for_fraction(kH100, "decode", 0.36).value(), 48u);  // 47.52
  EXPECT_EQ(sms_for_fraction(kH100, "decode", 1.0).value(), 132u);
  EXPECT_EQ(sms_for_fraction(kH100, "decode", 0.001).value(), 8u);
  // 0.1875 × 64 = 12 exactly, between 8 and 16: ties go to the smaller.
  EXPECT_EQ(sms_for_fraction({.sm_count = 64, .min_partition_size = 8, .alignment = 8}, "decode", 0.1875).value(), 8u);
  auto bad = sms_for_fraction(kH100, "decode", 1.5);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().context().find("stage 'decode': fraction 1.5"), std::string::npos);
  EXPECT_FALSE(sms_for_fraction(kH100, "decode", 0.0));

  auto p = plan(kH100, {{"decode", 0.36}, {"prefill", 84u}});
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->stages[0].sm_count, 48u);
}

TEST(Partition, PiecesAndSplitCheck) {
  auto p = plan(kH100, {{"decode", 48u}, {"prefill", 84u}});
  ASSERT_TRUE(p);
  Split split;
  for (ResourceId i = 1; i <= 16; ++i) split.groups.push_back(i);
  split.group_sm_count = 8;
  split.remaining = 17;
  split.remaining_sm_count = 4;
  EXPECT_TRUE(check_split(*p, split));
  EXPECT_EQ(pieces_for(p->stages[0], split), (std::vector<ResourceId>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(pieces_for(p->stages[1], split), (std::vector<ResourceId>{7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}));

  split.groups.pop_back();  // a device that made fewer groups than the arithmetic says
  auto bad = check_split(*p, split);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), EIO);
}

}  // namespace
}  // namespace tandem::gpu
