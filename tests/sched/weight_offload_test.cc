// Nova's weight-offload policy: the streaming cost model and the plan's
// choices on known inputs (order, hidden first, allow_slowdown, restore
// hysteresis, the settle after a change, unknown block size).
#include "sched/weight_offload.h"

#include <cerrno>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace tandem::sched {
namespace {

constexpr std::uint64_t kGB = 1'000'000'000;
constexpr std::uint64_t kBlockBytes = 1'000'000;  // 1 MB blocks: 1 GB frees 1,000 blocks

// A module that frees `freed_gb` GB and hides its copies at 25 GB/s:
// L = 10, K = 2, S = bytes/10, T = 50 ms; it needs S/T·8/8 = S/0.05 B/s.
WeightModuleSpec hidden_module(std::uint32_t index, std::uint64_t freed_gb) {
  // freed = 8/10 · bytes
  return {.index = index,
          .slots = 2,
          .layers = 10,
          .layer_compute_s = 0.05,
          .bytes = freed_gb * kGB * 10 / 8,
          .name = "hidden"};
}

// L = 4, K = 2, S = 1 GB (bytes 4 GB, freed 2 GB), T = 10 ms: needs
// 1e9/0.01 · 2/2 = 100 GB/s; at 25 GB/s a pass is 2·0.04 − 2·0.01 = 60 ms slower.
WeightModuleSpec slow_module(std::uint32_t index) {
  return {.index = index, .slots = 2, .layers = 4, .layer_compute_s = 0.01, .bytes = 4 * kGB, .name = "slow"};
}

OffloadParams params(std::uint32_t hold = 3, bool allow_slowdown = false) {
  OffloadParams p;
  p.hold = hold;
  p.allow_slowdown = allow_slowdown;
  return p;
}

OffloadInput input(std::uint64_t projected, std::uint32_t total, std::uint64_t block_bytes = kBlockBytes) {
  return {.projected_blocks = projected, .blocks_total = total, .block_bytes = block_bytes};
}

TEST(WeightOffload, BandwidthArithmetic) {
  // 10 layers, 2 slots, 10 GB: S = 1 GB, T = 50 ms.
  const WeightModuleSpec a{
      .index = 0, .slots = 2, .layers = 10, .layer_compute_s = 0.05, .bytes = 10 * kGB, .name = ""};
  StreamCost c = stream_cost(a, 25e9);
  EXPECT_EQ(c.freed_bytes, 8 * kGB);
  EXPECT_DOUBLE_EQ(c.required_bytes_per_s, 20e9);  // 1e9/0.05 · 8/8
  EXPECT_TRUE(c.hidden);
  EXPECT_EQ(c.slowdown_s, 0.0);
  // Exactly at the bound: hidden. Just below it: 8 copies of 1 GB at 19 GB/s
  // against 8 layers of 50 ms.
  EXPECT_TRUE(stream_cost(a, 20e9).hidden);
  c = stream_cost(a, 19e9);
  EXPECT_FALSE(c.hidden);
  EXPECT_NEAR(c.slowdown_s, 8e9 / 19e9 - 0.4, 1e-12);

  c = stream_cost(slow_module(1), 25e9);
  EXPECT_EQ(c.freed_bytes, 2 * kGB);
  EXPECT_DOUBLE_EQ(c.required_bytes_per_s, 100e9);
  EXPECT_FALSE(c.hidden);
  EXPECT_NEAR(c.slowdown_s, 0.06, 1e-12);

  // (L − K)/L of bytes, rounded down, without overflow.
  const WeightModuleSpec huge{
      .index = 2, .slots = 2, .layers = 3, .layer_compute_s = 1.0, .bytes = ~std::uint64_t{0}, .name = ""};
  EXPECT_EQ(stream_cost(huge, 1e9).freed_bytes, ~std::uint64_t{0} / 3);
  const WeightModuleSpec odd{.index = 3, .slots = 3, .layers = 7, .layer_compute_s = 1.0, .bytes = 100, .name = ""};
  EXPECT_EQ(stream_cost(odd, 1e9).freed_bytes, 57u);  // floor(400 / 7)
}

TEST(WeightOffload, ValidationNamesTheField) {
  WeightModuleSpec m = slow_module(5);
  m.slots = 4;
  auto r = validate(m);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EINVAL);
  EXPECT_EQ(r.error().context(), "weight module 5 'slow': slots 4 not in [2, layers 4)");
  m = slow_module(64);
  EXPECT_FALSE(validate(m));
  m = slow_module(1);
  m.layer_compute_s = 0.0;
  EXPECT_FALSE(validate(m));
  m = slow_module(1);
  m.bytes = 0;
  EXPECT_FALSE(validate(m));

  WeightOffloadPolicy policy;
  EXPECT_FALSE(policy.set_module(m));
  EXPECT_TRUE(policy.modules().empty());

  OffloadParams p;
  EXPECT_TRUE(validate(p));
  p.restore_pressure = 1.0;  // not below offload_pressure
  r = validate(p);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().context().find("restore_pressure"), std::string::npos);
  p = {};
  p.hold = 0;
  EXPECT_FALSE(validate(p));
  p = {};
  p.link_bytes_per_s = 0;
  EXPECT_FALSE(validate(p));
}

TEST(WeightOffload, NothingBelowThePressureThreshold) {
  WeightOffloadPolicy policy;
  ASSERT_TRUE(policy.set_module(hidden_module(0, 8)));
  EXPECT_FALSE(policy.decide(input(9'999, 10'000), params()));
  EXPECT_EQ(policy.plan(), 0u);
  EXPECT_DOUBLE_EQ(policy.pressure(), 0.9999);
}

TEST(WeightOffload, LargestHiddenModuleFirstAndOnlyWhatCoversTheShortfall) {
  WeightOffloadPolicy policy;
  ASSERT_TRUE(policy.set_module(hidden_module(0, 2)));
  ASSERT_TRUE(policy.set_module(hidden_module(1, 8)));
  ASSERT_TRUE(policy.set_module(hidden_module(2, 4)));
  // 12,000 projected on 10,000: module 1 alone (8,000 blocks) covers it.
  EXPECT_TRUE(policy.decide(input(12'000, 10'000), params()));
  EXPECT_EQ(policy.plan(), 0b010u);
  EXPECT_EQ(policy.freed_bytes(), 8 * kGB);
  EXPECT_EQ(policy.offloaded(), std::vector<std::uint32_t>{1});

  WeightOffloadPolicy more;
  for (std::uint32_t i : {0u, 1u, 2u}) ASSERT_TRUE(more.set_module(hidden_module(i, i == 0 ? 2 : i == 1 ? 8 : 4)));
  // 19,000 on 10,000: 8,000 leaves 18,000 ≤ 19,000, so module 2 (4,000) too.
  EXPECT_TRUE(more.decide(input(19'000, 10'000), params()));
  EXPECT_EQ(more.offloaded(), (std::vector<std::uint32_t>{1, 2}));
  EXPECT_EQ(more.freed_bytes(), 12 * kGB);
}

TEST(WeightOffload, EverythingHiddenWhenTheShortfallCannotBeCovered) {
  WeightOffloadPolicy policy;
  ASSERT_TRUE(policy.set_module(hidden_module(3, 1)));
  ASSERT_TRUE(policy.set_module(hidden_module(7, 2)));
  ASSERT_TRUE(policy.set_module(slow_module(9)));
  EXPECT_TRUE(policy.decide(input(50'000, 10'000), params()));
  // Slowing modules stay unless allowed.
  EXPECT_EQ(policy.offloaded(), (std::vector<std::uint32_t>{7, 3}));
}

TEST(WeightOffload, HiddenBeforeSlowingEvenWhenSmaller) {
  WeightOffloadPolicy policy;
  ASSERT_TRUE(policy.set_module(slow_module(0)));       // 2 GB, 60 ms a pass
  ASSERT_TRUE(policy.set_module(hidden_module(1, 1)));  // 1 GB, free
  const OffloadParams p = params(3, /*allow_slowdown=*/true);
  // 10,500 on 10,000: the hidden 1,000 blocks cover it; the larger slow module is not needed.
  EXPECT_TRUE(policy.decide(input(10'500, 10'000), p));
  EXPECT_EQ(policy.offloaded(), std::vector<std::uint32_t>{1});
}

TEST(WeightOffload, SlowingModulesByFreedBytesPerSecondOfSlowdownOnlyWhenAllowed) {
  // Module 0: 2 GB per 60 ms. Module 1: L = 4, K = 2, 8 GB (S = 2 GB, freed
  // 4 GB), T = 10 ms: 2·0.08 − 0.02 = 140 ms a pass, 4 GB per 140 ms — less per second.
  const WeightModuleSpec worse{
      .index = 1, .slots = 2, .layers = 4, .layer_compute_s = 0.01, .bytes = 8 * kGB, .name = ""};
  ASSERT_NEAR(stream_cost(worse, 25e9).slowdown_s, 0.14, 1e-12);
  for (bool allowed : {false, true}) {
    WeightOffloadPolicy policy;
    ASSERT_TRUE(policy.set_module(slow_module(0)));
    ASSERT_TRUE(policy.set_module(worse));
    EXPECT_EQ(policy.decide(input(20'000, 10'000), params(3, allowed)), allowed);
    if (allowed) {
      EXPECT_EQ(policy.offloaded(), (std::vector<std::uint32_t>{0, 1}));
    } else {
      EXPECT_EQ(policy.plan(), 0u);
    }
  }
  // Covered by the better ratio alone: the larger module stays.
  WeightOffloadPolicy one;
  ASSERT_TRUE(one.set_module(slow_module(0)));
  ASSERT_TRUE(one.set_module(worse));
  EXPECT_TRUE(one.decide(input(11'000, 10'000), params(3, true)));
  EXPECT_EQ(one.offloaded(), std::vector<std::uint32_t>{0});
}

TEST(WeightOffload, UnknownBlockBytesChangesNothing) {
  WeightOffloadPolicy policy;
  ASSERT_TRUE(policy.set_module(hidden_module(0, 8)));
  EXPECT_FALSE(policy.decide(input(30'000, 10'000, /*block_bytes=*/0), params()));
  EXPECT_EQ(policy.plan(), 0u);
  EXPECT_FALSE(policy.decide(input(30'000, 0), params()));  // no pool reported
  EXPECT_EQ(policy.plan(), 0u);
}

TEST(WeightOffload, SettlesAfterAChangeThenRestoresWithHysteresis) {
  WeightOffloadPolicy policy;
  ASSERT_TRUE(policy.set_module(hidden_module(0, 2)));
  ASSERT_TRUE(policy.set_module(hidden_module(1, 8)));
  const OffloadParams p = params(/*hold=*/3);
  ASSERT_TRUE(policy.decide(input(12'000, 10'000), p));
  ASSERT_EQ(policy.plan(), 0b10u);
  // For `hold` decisions the engine resizes; even more pressure changes nothing.
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(policy.decide(input(30'000, 10'000), p)) << i;
  // The pool grew by 8,000 blocks. 17,000 on 18,000 is below 1.0: no more offload.
  EXPECT_FALSE(policy.decide(input(17'000, 18'000), p));
  // Without module 1 the pool is 10,000, and 7,000 is below 0.8 · 10,000: a restore is wanted.
  EXPECT_FALSE(policy.decide(input(7'000, 18'000), p));
  EXPECT_FALSE(policy.decide(input(7'000, 18'000), p));
  // The streak is broken by one decision that would not restore (8,500 ≥ 8,000).
  EXPECT_FALSE(policy.decide(input(8'500, 18'000), p));
  EXPECT_FALSE(policy.decide(input(7'000, 18'000), p));
  EXPECT_FALSE(policy.decide(input(7'000, 18'000), p));
  EXPECT_EQ(policy.plan(), 0b10u);
  EXPECT_TRUE(policy.decide(input(7'000, 18'000), p));  // the third in a row
  EXPECT_EQ(policy.plan(), 0u);
  EXPECT_EQ(policy.freed_bytes(), 0u);
}

TEST(WeightOffload, RestoresTheLastOffloadedFirst) {
  WeightOffloadPolicy policy;
  ASSERT_TRUE(policy.set_module(hidden_module(0, 2)));
  ASSERT_TRUE(policy.set_module(hidden_module(1, 8)));
  ASSERT_TRUE(policy.set_module(hidden_module(2, 4)));
  const OffloadParams p = params(/*hold=*/1);
  ASSERT_TRUE(policy.decide(input(19'000, 10'000), p));  // 1 then 2
  ASSERT_EQ(policy.offloaded(), (std::vector<std::uint32_t>{1, 2}));
  EXPECT_FALSE(policy.decide(input(19'000, 22'000), p));  // settling
  // Pool 22,000 = 10,000 + 8,000 + 4,000. 13,000 < 0.8 · 18,000 = 14,400
  // without module 2, but not < 0.8 · 10,000 without module 1 as well.
  EXPECT_TRUE(policy.decide(input(13'000, 22'000), p));
  EXPECT_EQ(policy.offloaded(), std::vector<std::uint32_t>{1});
  EXPECT_EQ(policy.freed_bytes(), 8 * kGB);
}

TEST(WeightOffload, ReplacingAPlannedModuleKeepsItPlanned) {
  WeightOffloadPolicy policy;
  ASSERT_TRUE(policy.set_module(hidden_module(4, 8)));
  ASSERT_TRUE(policy.decide(input(12'000, 10'000), params()));
  ASSERT_TRUE(policy.set_module(hidden_module(4, 4)));  // a resync describes it again, smaller
  EXPECT_EQ(policy.plan(), 0b10000u);
  EXPECT_EQ(policy.freed_bytes(), 4 * kGB);
  ASSERT_NE(policy.module(4), nullptr);
  EXPECT_EQ(policy.module(5), nullptr);
}

}  // namespace
}  // namespace tandem::sched
