// Nova's SM partitioning: profile validation, the Pareto front and knee on a
// hand-computed decode profile, SM_dec's arithmetic (rounding, clamping,
// N_pend = 0 / 1 / large), and the chooser's index and hysteresis on a known
// pool.
#include "sched/sm_partition.h"

#include <cerrno>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tandem::sched {
namespace {

// A made-up H100 decode profile. per_sm = throughput / sm_count:
//   sm   lat_s   tput  per_sm
//   16   0.040    800   50
//   24   0.045    600   25     dominated by 16 (slower and less per SM)
//   32   0.026   1440   45
//   48   0.016   1920   40
//   64   0.0145  2240   35
//   80   0.013   2400   30
//   96   0.013   2400   25     dominated by 80 (same latency, less per SM)
//  112   0.0135  2300   ~20.5  dominated by 80 (slower and less per SM)
std::vector<ProfileRow> decode_rows() {
  return {{16, 0.040, 800},   {24, 0.045, 600},  {32, 0.026, 1440}, {48, 0.016, 1920},
          {64, 0.0145, 2240}, {80, 0.013, 2400}, {96, 0.013, 2400}, {112, 0.0135, 2300}};
}

StageProfile profile(std::vector<ProfileRow> rows) {
  auto p = StageProfile::create("decode", std::move(rows));
  EXPECT_TRUE(p.has_value()) << p.error().message();
  return std::move(*p);
}

std::string create_error(std::vector<ProfileRow> rows) {
  auto p = StageProfile::create("decode", std::move(rows));
  EXPECT_FALSE(p.has_value());
  if (p.has_value()) return {};
  EXPECT_EQ(p.error().code(), EINVAL);
  return p.error().context();
}

std::vector<std::uint32_t> sms(const std::vector<ProfileRow>& rows) {
  std::vector<std::uint32_t> out;
  out.reserve(rows.size());
  for (const ProfileRow& r : rows) out.push_back(r.sm_count);
  return out;
}

TEST(StageProfile, AcceptsAValidTableAndKeepsIt) {
  const StageProfile p = profile(decode_rows());
  EXPECT_EQ(p.stage(), "decode");
  ASSERT_EQ(p.rows().size(), 8U);
  EXPECT_EQ(p.rows()[3], (ProfileRow{48, 0.016, 1920}));
  // Zero throughput is a legal measurement (the stage did no work).
  EXPECT_TRUE(StageProfile::create("decode", {{8, 1.0, 0.0}}).has_value());
}

TEST(StageProfile, ErrorsNameTheStageAndRow) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(create_error({}), "profile 'decode': no rows");
  EXPECT_EQ(create_error({{0, 0.01, 1}}), "profile 'decode' row 0: sm_count 0");
  EXPECT_EQ(create_error({{8, 0.02, 1}, {16, 0.01, 1}, {16, 0.01, 1}}),
            "profile 'decode' row 2: sm_count 16 not above row 1's 16");
  EXPECT_EQ(create_error({{16, 0.02, 1}, {8, 0.01, 1}}), "profile 'decode' row 1: sm_count 8 not above row 0's 16");
  EXPECT_NE(create_error({{8, 0.02, 1}, {16, 0.0, 1}}).find("row 1: latency_s 0"), std::string::npos);
  EXPECT_NE(create_error({{8, -1.0, 1}}).find("row 0: latency_s"), std::string::npos);
  EXPECT_NE(create_error({{8, nan, 1}}).find("row 0: latency_s"), std::string::npos);
  EXPECT_NE(create_error({{8, inf, 1}}).find("row 0: latency_s"), std::string::npos);
  EXPECT_NE(create_error({{8, 0.1, 1}, {16, 0.1, -1}}).find("row 1: throughput -1"), std::string::npos);
  EXPECT_NE(create_error({{8, 0.1, nan}}).find("row 0: throughput"), std::string::npos);
  EXPECT_NE(create_error({{8, 0.1, inf}}).find("row 0: throughput"), std::string::npos);
}

TEST(ParetoFront, DropsRowsBeatenOnLatencyAndPerSmThroughput) {
  const auto front = pareto_front(profile(decode_rows()));
  EXPECT_EQ(sms(front), (std::vector<std::uint32_t>{16, 32, 48, 64, 80}));
  EXPECT_EQ(front[2], (ProfileRow{48, 0.016, 1920}));
}

TEST(ParetoFront, LinearScalingLeavesOnlyTheFastestRow) {
  // Throughput exactly proportional to SMs: every row has the same per-SM
  // throughput, so the fastest row dominates the rest.
  const auto front = pareto_front(profile({{16, 0.04, 160}, {32, 0.02, 320}, {64, 0.01, 640}}));
  EXPECT_EQ(sms(front), (std::vector<std::uint32_t>{64}));
}

TEST(ParetoFront, EqualLatencyKeepsTheSmallerPartition) {
  const auto front = pareto_front(profile({{8, 0.01, 100}, {16, 0.01, 100}}));
  EXPECT_EQ(sms(front), (std::vector<std::uint32_t>{8}));
}

TEST(SmOp, KneeOfTheKnownFront) {
  // score = per_sm / latency over the front:
  //   16: 50 / 0.040  = 1250
  //   32: 45 / 0.026  = 1731
  //   48: 40 / 0.016  = 2500   <- max
  //   64: 35 / 0.0145 = 2414
  //   80: 30 / 0.013  = 2308
  const auto front = pareto_front(profile(decode_rows()));
  EXPECT_EQ(sm_op(front), 48U);
  // The maximum over all rows is on the front: the dominated rows change nothing.
  EXPECT_EQ(sm_op(profile(decode_rows()).rows()), 48U);
}

TEST(SmOp, SingleRowAndTies) {
  const std::vector<ProfileRow> one{{24, 0.02, 100}};
  EXPECT_EQ(sm_op(one), 24U);
  // 4 / 0.5 = 2 / 0.25 = 8 exactly: the tie goes to the lower latency.
  const std::vector<ProfileRow> tie{{16, 0.5, 64}, {32, 0.25, 64}};
  EXPECT_EQ(sm_op(tie), 32U);
  // Two rows are compared on the score alone: 50/0.03 = 1667 > 31.25/0.02 = 1563.
  const std::vector<ProfileRow> two{{16, 0.03, 800}, {32, 0.02, 1000}};
  EXPECT_EQ(sm_op(two), 16U);
}

TEST(SmOp, MovesWithTheShapeOfTheCurve) {
  // Decode saturates early: 32 SMs get within 2% of the best latency.
  //   scores: 32: 49 / 0.0204 = 2402, 64: 24.75 / 0.0202 = 1225, 128: 12.5 / 0.020 = 625
  const auto early =
      pareto_front(profile({{16, 0.050, 640}, {32, 0.0204, 1568}, {64, 0.0202, 1584}, {128, 0.020, 1600}}));
  EXPECT_EQ(sms(early), (std::vector<std::uint32_t>{32, 64, 128}));  // 16 is slower and less per SM
  EXPECT_EQ(sm_op(early), 32U);
  // Latency keeps falling almost linearly until 96: the knee moves up.
  //   scores: 16: 833, 32: 1552, 64: 2813, 96: 3818, 128: 3048
  const auto late = pareto_front(
      profile({{16, 0.060, 800}, {32, 0.031, 1540}, {64, 0.016, 2880}, {96, 0.011, 4032}, {128, 0.0105, 4096}}));
  EXPECT_EQ(sm_op(late), 96U);
}

SmDecParams hopper() { return {.total = 132, .granularity = 8, .sm_min = 16, .alpha = 8.0}; }

TEST(SmDec, FormulaStepsAlphaPerExtraPendingPrefill) {
  const SmDecParams p = hopper();
  EXPECT_EQ(sm_dec(48, 1, p), 48U);
  EXPECT_EQ(sm_dec(48, 2, p), 40U);
  EXPECT_EQ(sm_dec(48, 3, p), 32U);
  EXPECT_EQ(sm_dec(48, 4, p), 24U);
  EXPECT_EQ(sm_dec(48, 5, p), 16U);
  EXPECT_EQ(sm_dec(48, 6, p), 16U);  // raw 8, floored at SM_min
}

TEST(SmDec, NoPendingPrefillKeepsTheOperatingPoint) {
  // Read literally, N_pend = 0 would give SM_op + α; tandem clamps N_pend to 1.
  EXPECT_EQ(sm_dec(48, 0, hopper()), 48U);
}

TEST(SmDec, LargeBacklogsFloorAtSmMin) {
  const SmDecParams p = hopper();
  EXPECT_EQ(sm_dec(48, 1000000, p), 16U);
  EXPECT_EQ(sm_dec(132, std::numeric_limits<std::uint32_t>::max(), p), 16U);
}

TEST(SmDec, RoundsUpToTheGranularity) {
  SmDecParams p = hopper();
  EXPECT_EQ(sm_dec(60, 1, p), 64U);  // SM_op itself unaligned
  p.alpha = 5.0;
  EXPECT_EQ(sm_dec(48, 2, p), 48U);  // 43 -> 48
  EXPECT_EQ(sm_dec(48, 3, p), 40U);  // 38 -> 40
  p.alpha = 2.5;
  EXPECT_EQ(sm_dec(48, 3, p), 48U);  // 43 -> 48
  EXPECT_EQ(sm_dec(48, 4, p), 48U);  // 40.5 -> 41 -> 48
  p.granularity = 1;
  EXPECT_EQ(sm_dec(48, 4, p), 41U);  // 40.5 rounded up to a whole SM
}

TEST(SmDec, ClampsToTheDevice) {
  SmDecParams p = hopper();
  EXPECT_EQ(sm_dec(130, 1, p), 132U);  // 136 after rounding, but only 132 exist
  EXPECT_EQ(sm_dec(200, 1, p), 132U);
  EXPECT_EQ(sm_dec(200, 4, p), 132U);  // 176
  EXPECT_EQ(sm_dec(8, 1, p), 16U);     // below the floor from the start
  p.sm_min = 20;                       // an unaligned floor rounds up too
  EXPECT_EQ(sm_dec(48, 100, p), 24U);
  p = {.total = 20, .granularity = 8, .sm_min = 20, .alpha = 8.0};
  EXPECT_EQ(sm_dec(48, 100, p), 20U);  // round_up(20) = 24 > total
  p = hopper();
  p.alpha = 0.0;  // no reaction to the backlog at all
  EXPECT_EQ(sm_dec(40, 100, p), 40U);
}

TEST(SmDec, ValidateNamesTheField) {
  auto err = [](SmDecParams p) {
    auto r = validate(p);
    EXPECT_FALSE(r.has_value());
    return r.has_value() ? std::string() : r.error().context();
  };
  EXPECT_TRUE(validate(hopper()).has_value());
  SmDecParams p = hopper();
  p.total = 0;
  EXPECT_NE(err(p).find("total 0"), std::string::npos);
  p = hopper();
  p.granularity = 0;
  EXPECT_NE(err(p).find("granularity 0"), std::string::npos);
  p = hopper();
  p.sm_min = 0;
  EXPECT_NE(err(p).find("sm_min 0"), std::string::npos);
  p.sm_min = 133;
  EXPECT_NE(err(p).find("sm_min 133"), std::string::npos);
  p = hopper();
  p.alpha = -1.0;
  EXPECT_NE(err(p).find("alpha"), std::string::npos);
  p.alpha = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(err(p).find("alpha"), std::string::npos);
}

PartitionChooser pool(std::uint32_t grow_hold) {
  auto c = PartitionChooser::create({16, 32, 48, 64, 96, 132}, grow_hold);
  EXPECT_TRUE(c.has_value()) << c.error().message();
  return std::move(*c);
}

TEST(PartitionChooser, TargetIsTheSmallestPartitionWithEnough) {
  const PartitionChooser c = pool(2);
  EXPECT_EQ(c.target(1), 0U);
  EXPECT_EQ(c.target(16), 0U);
  EXPECT_EQ(c.target(17), 1U);
  EXPECT_EQ(c.target(48), 2U);
  EXPECT_EQ(c.target(50), 3U);
  EXPECT_EQ(c.target(132), 5U);
  EXPECT_EQ(c.target(200), 5U);  // none has enough: the largest
}

TEST(PartitionChooser, ShrinksAtOnceAndGrowsAfterTheHold) {
  PartitionChooser c = pool(2);
  EXPECT_FALSE(c.has_current());
  EXPECT_EQ(c.choose(48), 2U);  // first decision applies at once
  EXPECT_TRUE(c.has_current());
  EXPECT_EQ(c.choose(16), 0U);  // fewer decode SMs: at once
  EXPECT_EQ(c.choose(64), 0U);  // grow wanted once: held
  EXPECT_EQ(c.choose(96), 3U);  // twice: grows to the smaller of {64, 96}'s indices
  EXPECT_EQ(c.current(), 3U);
  EXPECT_EQ(c.choose(48), 2U);  // shrink: at once
  EXPECT_EQ(c.choose(64), 2U);  // grow streak 1
  EXPECT_EQ(c.choose(48), 2U);  // agreeing with the current partition breaks the streak
  EXPECT_EQ(c.choose(64), 2U);  // streak 1 again
  EXPECT_EQ(c.choose(64), 3U);  // streak 2
}

TEST(PartitionChooser, HoldOfOneHasNoHysteresis) {
  PartitionChooser c = pool(1);
  EXPECT_EQ(c.choose(16), 0U);
  EXPECT_EQ(c.choose(132), 5U);
  EXPECT_EQ(c.choose(33), 2U);
}

TEST(PartitionChooser, CreateRejectsBadPools) {
  auto err = [](std::vector<std::uint32_t> sms, std::uint32_t hold) {
    auto c = PartitionChooser::create(std::move(sms), hold);
    EXPECT_FALSE(c.has_value());
    return c.has_value() ? std::string() : c.error().context();
  };
  EXPECT_EQ(err({}, 2), "partition pool: no partitions");
  EXPECT_EQ(err({16}, 0), "partition pool: grow_hold 0");
  EXPECT_EQ(err({0, 16}, 2), "partition pool: index 0: 0 decode SMs");
  EXPECT_EQ(err({16, 32, 32}, 2), "partition pool: index 2: 32 decode SMs not above index 1's 32");
}

TEST(SmPartition, EndToEndFromProfileToIndex) {
  // Knee 48; with 3 prefills pending SM_dec = 48 − 8·2 = 32 -> index 1; the
  // backlog clears, and the return to 48 waits for the second decision.
  const std::uint32_t op = sm_op(pareto_front(profile(decode_rows())));
  PartitionChooser c = pool(2);
  EXPECT_EQ(c.choose(sm_dec(op, 1, hopper())), 2U);
  EXPECT_EQ(c.choose(sm_dec(op, 3, hopper())), 1U);
  EXPECT_EQ(c.choose(sm_dec(op, 0, hopper())), 1U);
  EXPECT_EQ(c.choose(sm_dec(op, 0, hopper())), 2U);
}

}  // namespace
}  // namespace tandem::sched
