// The daemon's GPU plane: records and KV stats in, the published partition
// index (Nova's SM_dec through the chooser's hysteresis) and the offload plan
// out; projected KV demand from the session table.
#include "daemon/gpu_plane.h"

#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "ipc/records.h"
#include "sched/model.h"

namespace tandem::daemon {
namespace {

constexpr sched::EngineId kEngine = 7;

ipc::Record decode(const ipc::Slot& slot) {
  ipc::RecordDecoder decoder(ipc::Direction::kToDaemon);
  ipc::Record r;
  std::string_view problem;
  EXPECT_EQ(decoder.decode(slot, r, &problem), ipc::DecodeStatus::kOk) << problem;
  return r;
}

template <class T>
ipc::Record rec(const T& r) {
  return decode(ipc::encode(r, 0, 1));
}

ipc::GpuPartitions pool(std::vector<std::uint16_t> decode_sms, std::uint16_t device_sms = 132) {
  ipc::GpuPartitions p;
  p.count = static_cast<std::uint8_t>(decode_sms.size());
  p.device_sms = device_sms;
  p.pool_id = 1;
  for (std::size_t i = 0; i < decode_sms.size(); ++i) p.decode_sms[i] = decode_sms[i];
  return p;
}

ipc::StageProfileRow row(std::uint8_t i, std::uint8_t n, std::uint32_t sms, double latency, double throughput) {
  ipc::StageProfileRow r;
  r.stage = static_cast<std::uint8_t>(ipc::GpuStage::kDecode);
  r.row = i;
  r.row_count = n;
  r.sm_count = sms;
  r.latency_s = latency;
  r.throughput = throughput;
  return r;
}

class GpuPlaneTest : public ::testing::Test {
 protected:
  GpuPlaneTest() {
    config_.sm_min = 16;
    config_.alpha = 8.0;
    config_.grow_hold = 2;
    model_.observe(sched::EngineJoined{kEngine, {}}, now_);
  }

  void stats(std::uint32_t waiting, std::uint32_t total = 1000, std::uint64_t block_bytes = 0) {
    sched::KvPoolStats s;
    s.blocks_total = total;
    s.blocks_free = total;
    s.waiting_seqs = waiting;
    model_.observe(sched::KvStatsReported{kEngine, s}, now_);
    ipc::KvStats k;
    k.blocks_total = total;
    k.blocks_free = total;
    k.waiting_seqs = waiting;
    k.block_bytes = block_bytes;
    plane_.on_kv_stats(kEngine, k);
  }

  // One tick; the change for kEngine, if any.
  std::optional<GpuChange> tick() {
    std::vector<GpuChange> out;
    plane_.tick(model_, out);
    EXPECT_LE(out.size(), 1u);
    if (out.empty()) return std::nullopt;
    EXPECT_EQ(out[0].engine, kEngine);
    return out[0];
  }

  // The index published after a tick with `waiting` pending prefills (the last one if unchanged).
  std::uint32_t index_after(std::uint32_t waiting) {
    stats(waiting);
    if (auto c = tick(); c && c->sm) published_ = c->sm_partition;
    return published_;
  }

  GpuConfig config_;
  GpuPlane plane_{config_};
  sched::NodeModel model_;
  base::Time now_{};
  std::uint32_t published_ = 99;
};

TEST_F(GpuPlaneTest, NothingWithoutAPool) {
  stats(10);
  EXPECT_FALSE(tick());
}

TEST_F(GpuPlaneTest, PublishedIndexFollowsSmDecWithHysteresis) {
  // Partitions of 32, 64, 96 and 128 decode SMs on 132.
  auto changed = plane_.on_record(kEngine, rec(pool({32, 64, 96, 128})));
  ASSERT_TRUE(changed);
  EXPECT_TRUE(*changed);
  EXPECT_EQ(plane_.sm_params(*plane_.engine(kEngine)).granularity, 1u);
  // No profile: SM_op is the largest partition, so nothing pending keeps 128.
  stats(0);
  auto c = tick();
  ASSERT_TRUE(c && c->sm);
  EXPECT_EQ(c->sm_partition, 3u);
  EXPECT_EQ(c->decode_sms, 128u);
  EXPECT_EQ(c->sm_dec, 128u);
  published_ = 3;
  EXPECT_FALSE(tick());  // unchanged: nothing to publish
  // 5 pending: 128 − 8·4 = 96 → index 2 at once (a move to fewer decode SMs).
  EXPECT_EQ(index_after(5), 2u);
  // 9 pending: 128 − 64 = 64 → index 1.
  EXPECT_EQ(index_after(9), 1u);
  // 30 pending: 128 − 232 < sm_min 16 → 16 → the smallest partition, 32.
  EXPECT_EQ(index_after(30), 0u);
  EXPECT_EQ(plane_.engine(kEngine)->sm_dec, 16u);
  // Back to 1 pending: decode wants 128, but a grow needs two ticks in a row.
  EXPECT_EQ(index_after(1), 0u);
  // 7 pending: 128 − 48 = 80 → 96 (index 2), the second grow in a row: it
  // applies, to the smallest index wanted during the streak.
  EXPECT_EQ(index_after(7), 2u);
  // A shrink breaks a streak.
  EXPECT_EQ(index_after(1), 2u);
  EXPECT_EQ(index_after(9), 1u);
  EXPECT_EQ(index_after(1), 1u);
  EXPECT_EQ(index_after(1), 3u);
}

TEST_F(GpuPlaneTest, DecodeProfileSetsTheOperatingPoint) {
  ASSERT_TRUE(plane_.on_record(kEngine, rec(pool({32, 64, 96, 128}))));
  // throughput / (SMs · latency): 781, 1000, 852, 707 — the knee is 64 SMs.
  ASSERT_TRUE(plane_.on_record(kEngine, rec(row(0, 4, 32, 0.040, 1000))));
  ASSERT_TRUE(plane_.on_record(kEngine, rec(row(1, 4, 64, 0.025, 1600))));
  ASSERT_TRUE(plane_.on_record(kEngine, rec(row(2, 4, 96, 0.022, 1800))));
  EXPECT_EQ(plane_.engine(kEngine)->sm_op, 0u);  // not before the last row
  ASSERT_TRUE(plane_.on_record(kEngine, rec(row(3, 4, 128, 0.021, 1900))));
  EXPECT_EQ(plane_.engine(kEngine)->sm_op, 64u);
  ASSERT_TRUE(plane_.engine(kEngine)->profiles[0].has_value());
  EXPECT_EQ(index_after(0), 1u);
  EXPECT_EQ(index_after(5), 0u);  // 64 − 32 = 32
}

TEST_F(GpuPlaneTest, ProfileRowsOutOfOrderAreRefusedAndARowZeroRestarts) {
  ASSERT_TRUE(plane_.on_record(kEngine, rec(pool({32, 64, 96, 128}))));
  ASSERT_TRUE(plane_.on_record(kEngine, rec(row(0, 3, 32, 0.040, 1000))));
  auto r = plane_.on_record(kEngine, rec(row(2, 3, 96, 0.022, 1800)));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EINVAL);
  EXPECT_EQ(r.error().context(), "STAGE_PROFILE decode: row 2 of 3, expected row 1 of 3");
  // The broken profile is gone: a later row 1 is refused too.
  EXPECT_FALSE(plane_.on_record(kEngine, rec(row(1, 3, 64, 0.025, 1600))));
  // Rows whose SM counts do not increase: refused when the profile completes.
  ASSERT_TRUE(plane_.on_record(kEngine, rec(row(0, 2, 64, 0.040, 1000))));
  r = plane_.on_record(kEngine, rec(row(1, 2, 32, 0.025, 1600)));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().context().find("sm_count 32 not above"), std::string::npos) << r.error().context();
  EXPECT_EQ(plane_.engine(kEngine)->sm_op, 0u);
  // A new row 0 restarts cleanly.
  ASSERT_TRUE(plane_.on_record(kEngine, rec(row(0, 1, 96, 0.02, 1000))));
  EXPECT_EQ(plane_.engine(kEngine)->sm_op, 96u);
}

TEST_F(GpuPlaneTest, ANewPoolIsPublishedAgainAndAResyncIsNot) {
  ASSERT_TRUE(plane_.on_record(kEngine, rec(pool({32, 64, 96, 128}))));
  EXPECT_EQ(index_after(0), 3u);
  auto same = plane_.on_record(kEngine, rec(pool({32, 64, 96, 128})));
  ASSERT_TRUE(same);
  EXPECT_FALSE(*same);
  EXPECT_FALSE(tick());
  // A smaller pool: index 3 does not exist any more; the next tick publishes 1.
  auto other = plane_.on_record(kEngine, rec(pool({16, 48}, 64)));
  ASSERT_TRUE(other);
  EXPECT_TRUE(*other);
  EXPECT_EQ(plane_.sm_params(*plane_.engine(kEngine)).total, 64u);
  stats(0);
  auto c = tick();
  ASSERT_TRUE(c && c->sm);
  EXPECT_EQ(c->sm_partition, 1u);
}

TEST_F(GpuPlaneTest, SmMinIsClampedToTheDevice) {
  config_.sm_min = 200;
  plane_.configure(config_);
  ASSERT_TRUE(plane_.on_record(kEngine, rec(pool({40}, 48))));
  const sched::SmDecParams p = plane_.sm_params(*plane_.engine(kEngine));
  EXPECT_EQ(p.sm_min, 48u);
  EXPECT_EQ(p.granularity, 1u);
  EXPECT_EQ(index_after(50), 0u);
}

TEST_F(GpuPlaneTest, EveryPartitionOfAnUnevenPoolIsReachable) {
  // A small decode partition and the whole device (SGLang's pair): many
  // pending prefills must reach the 16-SM partition.
  ASSERT_TRUE(plane_.on_record(kEngine, rec(pool({16, 132}))));
  EXPECT_EQ(index_after(0), 1u);
  EXPECT_EQ(index_after(40), 0u);

  // 24, 64 and the device: the knee (64, from a profile) with one pending
  // prefill is 64, not the device; a long queue reaches 24.
  const sched::EngineId other = kEngine + 1;
  ASSERT_TRUE(plane_.on_record(other, rec(pool({24, 64, 132}))));
  const double rows[][3] = {{24, 0.050, 700}, {64, 0.024, 1800}, {132, 0.021, 1900}};
  for (std::uint8_t i = 0; i < 3; ++i) {
    ipc::StageProfileRow r;
    r.stage = static_cast<std::uint8_t>(ipc::GpuStage::kDecode);
    r.row = i;
    r.row_count = 3;
    r.sm_count = static_cast<std::uint32_t>(rows[i][0]);
    r.latency_s = rows[i][1];
    r.throughput = rows[i][2];
    ASSERT_TRUE(plane_.on_record(other, rec(r)));
  }
  model_.observe(sched::EngineJoined{other, {}}, now_);
  const auto index_of_other = [&](std::uint32_t waiting) {
    sched::KvPoolStats ks;
    ks.blocks_total = 1000;
    ks.blocks_free = 1000;
    ks.waiting_seqs = waiting;
    model_.observe(sched::KvStatsReported{other, ks}, now_);
    ipc::KvStats k;
    k.blocks_total = 1000;
    k.blocks_free = 1000;
    k.waiting_seqs = waiting;
    plane_.on_kv_stats(other, k);
    std::optional<std::uint32_t> got;
    std::vector<GpuChange> changes;
    plane_.tick(model_, changes);
    for (const GpuChange& g : changes) {
      if (g.engine == other && g.sm) got = g.sm_partition;
    }
    return got;
  };
  EXPECT_EQ(index_of_other(1), std::optional<std::uint32_t>(1));
  EXPECT_EQ(index_of_other(10), std::optional<std::uint32_t>(0));

  // Partitions with the split's 4-SM remainder (12, 20, 28): SM_dec 12 picks
  // 12, not the 20 a grid of 8 would round it to.
  const sched::EngineId third = kEngine + 2;
  ASSERT_TRUE(plane_.on_record(third, rec(pool({12, 20, 28}))));
  config_.sm_min = 12;
  plane_.configure(config_);
  EXPECT_EQ(sched::sm_dec(28, 3, plane_.sm_params(*plane_.engine(third))), 12u);
}

TEST_F(GpuPlaneTest, ProjectedBlocksCountRunningRoundsAndKeptKv) {
  auto& table = model_.sessions();
  auto submit = [&](sched::SessionId s, std::uint32_t projected) {
    ASSERT_TRUE(model_.observe(sched::RoundSubmitted{s, kEngine, 0, 100, 0, projected}, now_));
  };
  submit(1, 40);  // waiting: not admitted, not counted
  submit(2, 50);  // running
  ASSERT_TRUE(table.transition(2, sched::SessionState::kReasoning, now_));
  submit(3, 60);  // ends its round holding 30 and goes to a tool
  ASSERT_TRUE(table.transition(3, sched::SessionState::kReasoning, now_));
  ASSERT_TRUE(model_.observe(sched::RoundEnded{3, kEngine, 0, 10, 30, true}, now_));
  ASSERT_EQ(table.find(3)->state, sched::SessionState::kActing);
  auto p = GpuPlane::projected_blocks(table);
  EXPECT_EQ(p[kEngine], 50u + 30u);
  // Its KV dropped while the tool runs: it counts nothing any more.
  ASSERT_TRUE(model_.observe(sched::KvChanged{3, kEngine, sched::KvChange::kDropped, 30}, now_));
  EXPECT_EQ(GpuPlane::projected_blocks(table)[kEngine], 50u);
}

TEST_F(GpuPlaneTest, OffloadPlanFromProjectedDemand) {
  config_.hold = 1;
  plane_.configure(config_);
  ipc::WeightModule m;
  m.index = 5;
  m.slots = 2;
  m.layers = 10;
  m.layer_compute_us = 50'000;  // 50 ms a layer
  m.bytes = 1'000'000'000;      // S = 100 MB: hidden at 25 GB/s; frees 800 MB
  std::memcpy(m.name, "mlp", 3);
  ASSERT_TRUE(plane_.on_record(kEngine, rec(m)));
  ASSERT_EQ(plane_.engine(kEngine)->offload.module(5)->name, "mlp");
  // 1,000 blocks of 1 MB; one running round projected to hold 1,200.
  ASSERT_TRUE(model_.observe(sched::RoundSubmitted{42, kEngine, 0, 100, 0, 1200}, now_));
  ASSERT_TRUE(model_.sessions().transition(42, sched::SessionState::kReasoning, now_));
  stats(0, 1000, /*block_bytes=*/0);
  EXPECT_FALSE(tick());  // block size unknown: no plan
  stats(0, 1000, 1'000'000);
  auto c = tick();
  ASSERT_TRUE(c && c->offload);
  EXPECT_FALSE(c->sm);
  EXPECT_EQ(c->offload_plan, std::uint64_t{1} << 5);
  EXPECT_EQ(c->freed_bytes, 800'000'000u);
  EXPECT_DOUBLE_EQ(c->pressure, 1.2);
  EXPECT_EQ(plane_.engine(kEngine)->projected_blocks, 1200u);
  // The engine grows its pool; the session closes; after the settle and the
  // restore hold the module comes back.
  stats(0, 1800, 1'000'000);
  EXPECT_FALSE(tick());  // settling
  ASSERT_TRUE(model_.observe(sched::SessionClosed{42}, now_));
  c = tick();
  ASSERT_TRUE(c && c->offload);
  EXPECT_EQ(c->offload_plan, 0u);
  EXPECT_EQ(c->freed_bytes, 0u);
}

TEST_F(GpuPlaneTest, EngineGoneForgetsIt) {
  ASSERT_TRUE(plane_.on_record(kEngine, rec(pool({32, 64}))));
  plane_.engine_gone(kEngine);
  EXPECT_EQ(plane_.engine(kEngine), nullptr);
  EXPECT_FALSE(tick());
}

}  // namespace
}  // namespace tandem::daemon
