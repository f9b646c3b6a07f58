// Expected-value residency: the cost model, the shadow price, and the
// keep / offload / drop choice at its boundaries (all values hand-computed).
#include "sched/residency.h"

#include <limits>

#include <gtest/gtest.h>

namespace tandem::sched {
namespace {

EngineView engine(std::uint32_t total, std::uint32_t free_blocks, std::uint64_t queued = 0) {
  EngineView e;
  e.has_stats = true;
  e.kv.blocks_total = total;
  e.kv.blocks_free = free_blocks;
  e.queued_blocks = queued;
  return e;
}

TEST(CostModel, CalibratedPrefillAndReload) {
  CostModel c;
  // 20 µs × 10^4 + 1.3e-3 µs × 10^8 / 2 = 200,000 + 65,000 µs.
  EXPECT_NEAR(c.recompute_s(10000), 0.265, 1e-12);
  // 3.3 µs × 10^4 + 30 µs.
  EXPECT_NEAR(c.reload_s(10000), 0.03303, 1e-12);
  EXPECT_EQ(c.recompute_s(0), 0.0);
}

TEST(KvPrice, ZeroWhileIdleThenLinearThenCapped) {
  PriceParams p;  // idle below 0.7, full price 3.2e-4 at pressure 1
  EXPECT_EQ(kv_price(engine(1000, 300), p), 0.0) << "pressure exactly 0.7";
  EXPECT_NEAR(kv_price(engine(1000, 150), p), 0.5 * 3.2e-4, 1e-15) << "pressure 0.85";
  EXPECT_NEAR(kv_price(engine(1000, 300, 300), p), 3.2e-4, 1e-15) << "queued demand counts: 0.7 + 0.3";
  EXPECT_NEAR(kv_price(engine(1000, 0, 2100), p), 4 * 3.2e-4, 1e-15) << "capped at 4x";
  EngineView unknown;
  EXPECT_EQ(kv_price(unknown, p), 0.0) << "no stats: no price";
}

ResidencyInput pressured(double p_return, bool offload) {
  ResidencyInput in;
  in.p_return_within_horizon = p_return;
  in.horizon_s = 1.0;
  in.context_tokens = 10000;
  in.blocks = 625;
  in.price = 3.2e-4;  // full pool: hold = 625 × 1 × 3.2e-4 = 0.2 GPU-s
  in.offload_allowed = offload;
  return in;
}

TEST(Residency, IdleMemoryAlwaysKeeps) {
  ResidencyInput in = pressured(0.01, true);
  in.price = 0;
  EXPECT_EQ(decide_residency(in, {}).residence, Residence::kKeep);
  in.p_return_within_horizon = 0;
  EXPECT_EQ(decide_residency(in, {}).residence, Residence::kKeep);
}

TEST(Residency, LongToolUnderPressureOffloadsOrDrops) {
  EXPECT_EQ(decide_residency(pressured(0.02, true), {}).residence, Residence::kOffload);
  EXPECT_EQ(decide_residency(pressured(0.02, false), {}).residence, Residence::kDrop);
}

TEST(Residency, KeepBoundaryWithoutOffload) {
  // keep iff P × 0.265 > 0.2, i.e. P > 0.75472.
  EXPECT_EQ(decide_residency(pressured(0.76, false), {}).residence, Residence::kKeep);
  EXPECT_EQ(decide_residency(pressured(0.75, false), {}).residence, Residence::kDrop);
  EXPECT_NEAR(decide_residency(pressured(0.76, false), {}).keep_value, 0.76 * 0.265 - 0.2, 1e-12);
}

TEST(Residency, WithOffloadKeepingMustBeatTheReload) {
  // Keeping only spares the offload: the 0.03303 s reload plus the blocks
  // held while the copy crosses the link (625 × 0.03303 s × price), which
  // never beats 0.2 s of held memory; at a tenth of the price (hold 0.02)
  // offload costs 0.03303 + 625 × 0.03303 × 3.2e-5 = 0.033691 and P > 0.59363 keeps.
  EXPECT_EQ(decide_residency(pressured(1.0, true), {}).residence, Residence::kOffload);
  ResidencyInput cheap = pressured(0.60, true);
  cheap.price = 3.2e-5;
  EXPECT_EQ(decide_residency(cheap, {}).residence, Residence::kKeep);
  EXPECT_NEAR(decide_residency(cheap, {}).offload_cost, 0.03303 + 625 * 0.03303 * 3.2e-5, 1e-12);
  cheap.p_return_within_horizon = 0.59;
  EXPECT_EQ(decide_residency(cheap, {}).residence, Residence::kOffload);
}

TEST(Residency, ABackedUpLinkMakesReleaseCheaperThanOffload) {
  // Full price: offload = 0.03303 + 625 × (wait + 0.03303) × 3.2e-4, which
  // passes the 0.265 s recompute once the copies queued ahead take more
  // than (0.265 − 0.03303) / 0.2 − 0.03303 = 1.1268 s.
  ResidencyInput in = pressured(0.02, true);
  in.link_wait_s = 1.1;
  EXPECT_EQ(decide_residency(in, {}).residence, Residence::kOffload);
  in.link_wait_s = 1.2;
  EXPECT_EQ(decide_residency(in, {}).residence, Residence::kDrop);
  in.offload_allowed = false;
  in.link_wait_s = 0;
  EXPECT_EQ(decide_residency(in, {}).residence, Residence::kDrop) << "no host room: release";
}

TEST(Residency, ShortContextsAreDroppedNotOffloaded) {
  // 10 tokens: recompute 200 µs + 0.065 µs; reload 33 µs + 30 µs = 63 µs is
  // cheaper, so offload... but at 1 token reload (33.3 µs) beats recompute
  // (20 µs) no more: dropping is the better alternative.
  ResidencyInput in = pressured(0.0, true);
  in.context_tokens = 1;
  in.blocks = 1;
  EXPECT_EQ(decide_residency(in, {}).residence, Residence::kDrop);
  in.context_tokens = 10;
  EXPECT_EQ(decide_residency(in, {}).residence, Residence::kOffload);
}

TEST(Residency, KeepsWhileTheBlocksExpectedBackExceedTheHeadroom) {
  // 625 blocks at full price lose to the offload at any P (above). With a
  // headroom of 300 blocks the release is not at the margin while
  // P x 625 > 300, i.e. P > 0.48.
  ResidencyInput in = pressured(0.49, true);
  in.headroom_blocks = 300;
  ResidencyDecision d = decide_residency(in, {});
  EXPECT_EQ(d.residence, Residence::kKeep);
  EXPECT_LT(d.keep_value, 0) << "the expected value alone still says release";
  in.p_return_within_horizon = 0.47;
  EXPECT_EQ(decide_residency(in, {}).residence, Residence::kOffload) << "a tool unlikely back lets it go";
  in.p_return_within_horizon = 1.0;
  in.headroom_blocks = 625;
  EXPECT_EQ(decide_residency(in, {}).residence, Residence::kOffload) << "within the headroom: the price decides";
  in.offload_allowed = false;  // keep iff P x 0.265 > 0.2 (above): not at P = 0.5
  in.p_return_within_horizon = 0.5;
  in.headroom_blocks = 312;
  EXPECT_EQ(decide_residency(in, {}).residence, Residence::kKeep) << "past it (312.5 blocks), nowhere to offload";
  in.headroom_blocks = std::numeric_limits<double>::infinity();
  EXPECT_EQ(decide_residency(in, {}).residence, Residence::kDrop) << "the default: no such rule";
}

}  // namespace
}  // namespace tandem::sched
