// NodeModel: events update sessions and telemetry together.
#include "sched/model.h"

#include <gtest/gtest.h>

namespace tandem::sched {
namespace {

Time at(int ms) { return base::from_ns(std::int64_t{ms} * 1'000'000); }

TEST(NodeModel, EngineMirrorAndQueuedDemand) {
  NodeModel m;
  EngineParams p;
  p.total_blocks = 1000;
  ASSERT_TRUE(m.observe(EngineJoined{1, p}, at(0)));
  KvPoolStats kv;
  kv.blocks_total = 1000;
  kv.blocks_free = 250;
  ASSERT_TRUE(m.observe(KvStatsReported{1, kv}, at(1)));
  EXPECT_NEAR(m.engine(1)->usage(), 0.75, 1e-12);

  ASSERT_TRUE(m.observe(RoundSubmitted{10, 1, 0, 1600, 0, 100}, at(2)));
  ASSERT_TRUE(m.observe(RoundSubmitted{11, 1, 0, 800, 0, 50}, at(2)));
  EXPECT_EQ(m.engine(1)->queued_blocks, 150u);
  EXPECT_FALSE(m.observe(RoundSubmitted{11, 1, 1, 800, 0, 50}, at(3))) << "second round in flight";
  EXPECT_EQ(m.engine(1)->queued_blocks, 150u) << "a rejected submit queues nothing";

  ASSERT_TRUE(m.sessions().transition(10, SessionState::kReasoning, at(3)));
  ASSERT_TRUE(m.observe(RoundEnded{10, 1, 0, 20, 101, true}, at(4)));
  EXPECT_EQ(m.engine(1)->queued_blocks, 50u);
  // A prefix hit is not demand; a round's prefill leaves the queue at its first token.
  ASSERT_TRUE(m.observe(RoundSubmitted{10, 1, 1, 2000, 1600, 130}, at(4)));
  EXPECT_EQ(m.engine(1)->queued_blocks, 80u);
  ASSERT_TRUE(m.observe(RoundFirstToken{10, 1, 0, {}, {}}, at(4)));
  EXPECT_EQ(m.engine(1)->queued_blocks, 80u) << "a late first token of round 0 does not unqueue round 1";
  ASSERT_TRUE(m.observe(RoundFirstToken{10, 1, 1, {}, {}}, at(4)));
  EXPECT_EQ(m.engine(1)->queued_blocks, 50u);
  ASSERT_TRUE(m.observe(SessionClosed{11}, at(5)));
  EXPECT_EQ(m.engine(1)->queued_blocks, 0u) << "a closed session's round leaves the queue";

  ASSERT_TRUE(m.observe(EngineLeft{1}, at(6)));
  EXPECT_EQ(m.engine(1), nullptr);
}

TEST(NodeModel, ToolsFeedTheCpuViewAndTheDurationModel) {
  NodeModel m;
  ASSERT_TRUE(m.observe(RoundSubmitted{10, 1, 0, 100, 0, 7}, at(0)));
  ASSERT_TRUE(m.sessions().transition(10, SessionState::kReasoning, at(0)));
  ASSERT_TRUE(m.observe(ToolStarted{10, 77, 1}, at(1)));
  m.set_cpu(CpuView{8, 0, 12.5, {}});
  EXPECT_EQ(m.cpu().active_tools, 1u) << "sampled CPU readings do not clobber the event count";
  EXPECT_EQ(m.cpu().tool_cores, 8u);
  EXPECT_DOUBLE_EQ(m.cpu().psi_some_avg10, 12.5);
  ASSERT_TRUE(m.observe(ToolEnded{10, 77, 1, 0, std::chrono::seconds(3), std::chrono::seconds(1)}, at(3001)));
  EXPECT_EQ(m.cpu().active_tools, 0u);
  EXPECT_EQ(m.tools().samples(77), 1u);
  ASSERT_TRUE(m.observe(ToolStarted{10, 77, 2}, at(3002)));
  ASSERT_TRUE(m.observe(ToolEnded{10, 77, 2, 1, std::chrono::seconds(2), std::chrono::seconds(2)}, at(5002)));
  EXPECT_EQ(m.tools().samples(77), 2u) << "a failed call's wall time counts as any other's";
}

TEST(NodeModel, ToolCallsOfEverNewKindsHoldABoundedModel) {
  NodeModel m;
  ASSERT_TRUE(m.observe(RoundSubmitted{10, 1, 0, 100, 0, 7}, at(0)));
  ASSERT_TRUE(m.sessions().transition(10, SessionState::kReasoning, at(0)));
  for (std::uint32_t call = 1; call <= 5'000; ++call) {
    const ToolKind kind = 0x9e3779b97f4a7c15ULL * call;  // a new kind each call, as a hostile runner might send
    ASSERT_TRUE(m.observe(ToolStarted{10, kind, call}, at(call)));
    ASSERT_TRUE(m.observe(ToolEnded{10, kind, call, 0, std::chrono::seconds(1), std::chrono::seconds(1)}, at(call)));
  }
  EXPECT_LE(m.tools().kinds(), ToolModelParams{}.max_kinds);
}

}  // namespace
}  // namespace tandem::sched
