// The GPU plane through the real tandemd: an engine sends its green-context
// pool, a decode profile, a weight module and KV stats on its ring, and reads
// the partition index and the offload plan off its status page; tandemctl
// engines shows the same.
#include <gtest/gtest.h>

#include <cstring>

#include "ipc/channel.h"
#include "ipc/records.h"
#include "tests/integration/harness.h"

namespace tandem::it {
namespace {

class GpuPlaneIt : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.start();
    auto c = RawClient::connect(daemon_.socket_path());
    ASSERT_TRUE(c) << c.error().message();
    engine_.emplace(std::move(*c));
    auto h = engine_->hello(wire::Role::Engine, "gpu-engine", test_engine_info());
    ASSERT_TRUE(h) << h.error().message();
    auto reader = engine_->channel().status_reader();
    ASSERT_TRUE(reader) << reader.error().message();
    status_ = *reader;
  }

  void TearDown() override {
    engine_.reset();
    EXPECT_EQ(daemon_.stop(), 0) << daemon_.log();
  }

  ipc::EngineStatus status() {
    auto s = status_.read();
    EXPECT_TRUE(s);
    return s ? *s : ipc::EngineStatus{};
  }

  void kv_stats(std::uint32_t waiting, std::uint64_t block_bytes = 0) {
    ipc::KvStats k;
    k.blocks_total = 1000;
    k.blocks_free = 1000;
    k.waiting_seqs = waiting;
    k.block_bytes = block_bytes;
    ASSERT_TRUE(engine_->push(record(k, 0)));
  }

  nlohmann::json engine_json() {
    const nlohmann::json engines = ctl(daemon_.socket_path(), "engines");
    for (const auto& e : engines["engines"]) {
      if (e["name"] == "gpu-engine") return e;
    }
    ADD_FAILURE() << engines.dump();
    return {};
  }

  TempDir dir_;
  // fcfs admits every round, so a submitted round counts as running at once.
  Daemon daemon_{dir_.path(), "[policy]\nname = \"fcfs\"\n[gpu]\nhold = 1\n"};
  std::optional<RawClient> engine_;
  ipc::StatusReader<ipc::EngineStatus> status_;
};

TEST_F(GpuPlaneIt, PartitionIndexFollowsPendingPrefills) {
  ipc::GpuPartitions pool;
  pool.count = 4;
  pool.device_sms = 132;
  pool.pool_id = 7;
  const std::uint16_t decode[] = {32, 64, 96, 128};
  std::memcpy(pool.decode_sms, decode, sizeof decode);
  ASSERT_TRUE(engine_->push(record(pool, 0)));
  // A decode profile whose knee is 64 SMs (throughput / (SMs · latency)).
  const double rows[][3] = {{32, 0.040, 1000}, {64, 0.025, 1600}, {96, 0.022, 1800}, {128, 0.021, 1900}};
  for (std::uint8_t i = 0; i < 4; ++i) {
    ipc::StageProfileRow r;
    r.stage = static_cast<std::uint8_t>(ipc::GpuStage::kDecode);
    r.row = i;
    r.row_count = 4;
    r.sm_count = static_cast<std::uint32_t>(rows[i][0]);
    r.latency_s = rows[i][1];
    r.throughput = rows[i][2];
    ASSERT_TRUE(engine_->push(record(r, 0)));
  }
  kv_stats(0);
  ASSERT_TRUE(eventually([&] {
    const auto s = status();
    return (s.flags & ipc::kStatusSmPartitionSet) != 0 && s.sm_partition == 1;
  })) << daemon_.log();
  // Five pending prefills: SM_dec = 64 − 8·4 = 32 → partition 0.
  kv_stats(5);
  ASSERT_TRUE(eventually([&] { return status().sm_partition == 0; })) << daemon_.log();
  const auto e = engine_json();
  EXPECT_EQ(e["sm_partition"], 0);
  EXPECT_EQ(e["sm_decode_sms"], 32);
  EXPECT_EQ(e["sm_op"], 64);
  EXPECT_EQ(e["sm_op_profiled"], true);
  EXPECT_EQ(e["device_sms"], 132);
}

TEST_F(GpuPlaneIt, OffloadPlanFollowsProjectedDemand) {
  ipc::WeightModule m;
  m.index = 3;
  m.slots = 2;
  m.layers = 10;
  m.layer_compute_us = 50'000;
  m.bytes = 1'000'000'000;  // frees 800 MB; hidden at 25 GB/s
  std::memcpy(m.name, "experts", 7);
  ASSERT_TRUE(engine_->push(record(m, 0)));
  kv_stats(0, 1'000'000);  // 1,000 blocks of 1 MB
  EXPECT_EQ(status().offload_plan, 0u);
  ipc::RoundSubmit round;
  round.prompt_tokens = 100;
  round.projected_blocks = 1200;  // 1.2 of the pool
  ASSERT_TRUE(engine_->push(record(round, 0x6b0)));
  ASSERT_TRUE(eventually([&] { return status().offload_plan == (std::uint64_t{1} << 3); })) << daemon_.log();
  EXPECT_EQ(status().offload_freed_bytes, 800'000'000u);
  const auto e = engine_json();
  EXPECT_EQ(e["projected_blocks"], 1200);
  EXPECT_EQ(e["offloaded_modules"], nlohmann::json::array({3}));
  EXPECT_EQ(e["offload_freed_bytes"], 800'000'000u);
  EXPECT_EQ(e["weight_modules"], 1);
}

TEST_F(GpuPlaneIt, BrokenProfileIsRejectedAndCounted) {
  ipc::StageProfileRow r;
  r.row = 1;  // without row 0
  r.row_count = 2;
  r.sm_count = 64;
  r.latency_s = 0.01;
  r.throughput = 100;
  const auto before = ctl(daemon_.socket_path(), "status")["records"]["rejected"].get<std::uint64_t>();
  ASSERT_TRUE(engine_->push(record(r, 0)));
  EXPECT_TRUE(eventually(
      [&] { return ctl(daemon_.socket_path(), "status")["records"]["rejected"].get<std::uint64_t>() == before + 1; }));
  EXPECT_NE(daemon_.log().find("STAGE_PROFILE decode: row 1 of 2, expected row 0 first"), std::string::npos)
      << daemon_.log();
}

}  // namespace
}  // namespace tandem::it
