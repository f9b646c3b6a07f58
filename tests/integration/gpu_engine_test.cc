// The GPU plane end to end, as an engine uses it: libtandem (an engine
// handle, the green-context pool on the simulated device, a layer streamer)
// against the real tandemd. The daemon picks the pool's partition from the
// engine's pending prefills and its decode profile (Nova), and asks for a
// weight module to be offloaded when projected KV demand outgrows the pool;
// the engine follows both through libtandem alone.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "tandem/tandem.h"
#include "tandem/tandem_gpu.h"
#include "tests/integration/harness.h"

namespace tandem::it {
namespace {

class GpuEngineIt : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.start();
    tandem_options o{};
    o.sz = sizeof o;
    o.runtime_dir = dir_.path().c_str();
    o.name = "gpu-engine";
    tandem_engine_params p{};
    p.sz = sizeof p;
    p.gpu_index = 0;
    p.block_size = 16;
    p.total_blocks = 1000;
    p.max_seqs = 64;
    p.token_budget = 2048;
    ASSERT_EQ(tandem_engine_open(&o, &p, &engine_), 0);
    ASSERT_TRUE(eventually([&] {
      tandem_poll(engine_, 0, 0, nullptr);
      return tandem_connected(engine_) == 1;
    })) << daemon_.log();

    // Prefill and decode; decode gets 16, 24, …, 64 SMs of the simulated
    // H100's 132, prefill the rest: seven partitions from one split.
    tandem_gpu_options g{};
    g.sz = sizeof g;
    g.backend = "sim";
    ASSERT_EQ(tandem_gpu_open(engine_, &g, &gpu_), 0) << tandem_gpu_last_error(nullptr);
    ASSERT_EQ(tandem_gpu_stage(gpu_, "decode", &decode_), 0);
  }

  void TearDown() override {
    tandem_gpu_close(gpu_);
    tandem_close(engine_);
    EXPECT_EQ(daemon_.stop(), 0) << daemon_.log();
  }

  void kv_stats(std::uint32_t waiting, std::uint64_t block_bytes) {
    tandem_kv_stats k{};
    k.sz = sizeof k;
    k.blocks_total = 1000;
    k.blocks_free = 1000;
    k.waiting_seqs = waiting;
    k.block_bytes = block_bytes;
    ASSERT_EQ(tandem_kv_stats_report(engine_, &k), 0) << tandem_last_error(engine_);
  }

  // Forward-pass boundaries (with the engine's poll) until the pass runs on
  // `want`.
  bool runs_on(std::uint32_t want) {
    return eventually([&] {
      tandem_poll(engine_, 0, 0, nullptr);
      std::uint32_t p = 0;
      return tandem_gpu_begin_pass(gpu_, &p) == 0 && p == want;
    });
  }

  void* decode_stream() {
    void* s = nullptr;
    EXPECT_EQ(tandem_gpu_stream(gpu_, decode_, &s), 0);
    return s;
  }

  TempDir dir_;
  // fcfs admits every round at once; hold = 1 lets the offload plan move
  // every tick.
  Daemon daemon_{dir_.path(), "[policy]\nname = \"fcfs\"\n[gpu]\nhold = 1\n"};
  tandem_client* engine_ = nullptr;
  tandem_gpu* gpu_ = nullptr;
  std::uint32_t decode_ = 0;
};

TEST_F(GpuEngineIt, PassesMoveToThePartitionTheDaemonChooses) {
  tandem_gpu_info info{};
  info.sz = sizeof info;
  ASSERT_EQ(tandem_gpu_info_get(gpu_, &info), 0);
  ASSERT_EQ(info.n_partitions, 7u);
  EXPECT_STREQ(tandem_gpu_backend(gpu_), "sim");
  EXPECT_EQ(info.active_partition, 6u) << "a new pool starts with the most decode SMs";

  // A decode profile whose knee (throughput per SM per second of latency)
  // is 48 SMs.
  const tandem_profile_row rows[] = {
      {16, 0, 0.060, 500}, {32, 0, 0.035, 900}, {48, 0, 0.025, 1300}, {64, 0, 0.022, 1400}};
  ASSERT_EQ(tandem_gpu_profile(engine_, TANDEM_GPU_STAGE_DECODE, rows, 4), 0) << tandem_last_error(engine_);
  kv_stats(0, 0);
  // Nothing pending: SM_dec = SM_op = 48, partition 4.
  ASSERT_TRUE(runs_on(4)) << daemon_.log();
  void* before = decode_stream();

  // Three pending prefills: SM_dec = 48 − 8·2 = 32, partition 2, at once.
  kv_stats(3, 0);
  ASSERT_TRUE(runs_on(2)) << daemon_.log();
  std::uint32_t sms = 0;
  ASSERT_EQ(tandem_gpu_partition_sms(gpu_, 2, decode_, &sms), 0);
  EXPECT_EQ(sms, 32u);
  EXPECT_NE(decode_stream(), before) << "another partition, another green-context stream";

  // The queue drains: back to the knee (after the chooser's hold-down).
  kv_stats(0, 0);
  ASSERT_TRUE(runs_on(4)) << daemon_.log();
  EXPECT_EQ(decode_stream(), before);
  ASSERT_EQ(tandem_gpu_info_get(gpu_, &info), 0);
  EXPECT_GE(info.switches, 3u);
  EXPECT_EQ(info.bad_indices, 0u);

  const nlohmann::json engines = ctl(daemon_.socket_path(), "engines");
  ASSERT_EQ(engines["engines"].size(), 1u) << engines.dump();
  EXPECT_EQ(engines["engines"][0]["sm_partition"], 4);
  EXPECT_EQ(engines["engines"][0]["sm_decode_sms"], 48);
}

TEST_F(GpuEngineIt, OffloadPlanBecomesALayerStreamer) {
  // A module of 10 layers of 1 MiB that can run from 2 device slots: it
  // frees 8 MiB, and at 50 ms of compute a layer any link hides the copies.
  constexpr std::uint32_t kLayers = 10;
  constexpr std::uint64_t kLayerBytes = 1 << 20;
  tandem_weight_module_info m{};
  m.sz = sizeof m;
  m.index = 5;
  m.slots = 2;
  m.layers = kLayers;
  m.layer_compute_us = 50'000;
  m.bytes = kLayers * kLayerBytes;
  m.name = "experts";
  ASSERT_EQ(tandem_weight_module(engine_, &m), 0) << tandem_last_error(engine_);
  kv_stats(0, 8192);  // 1,000 blocks of 8 KiB
  std::uint64_t plan = 1;
  std::uint64_t freed = 1;
  ASSERT_EQ(tandem_offload_plan(engine_, &plan, &freed), 0);
  EXPECT_EQ(plan, 0u);

  // A round projected to hold 1.2 pools: the daemon offloads the module.
  tandem_round r{};
  r.sz = sizeof r;
  r.prompt_tokens = 100;
  r.projected_blocks = 1200;
  ASSERT_EQ(tandem_round_submit(engine_, tandem_session_id("agent-1"), &r), 0) << tandem_last_error(engine_);
  ASSERT_TRUE(eventually([&] {
    tandem_poll(engine_, 0, 0, nullptr);
    return tandem_offload_plan(engine_, &plan, &freed) == 0 && plan == (std::uint64_t{1} << 5);
  })) << daemon_.log();
  EXPECT_EQ(freed, (kLayers - 2) * kLayerBytes);

  // The engine carries the plan out: the module's layers stream through two
  // slots on the decode stage's stream, each layer in its slot when asked.
  std::vector<std::vector<unsigned char>> layers(kLayers, std::vector<unsigned char>(kLayerBytes));
  std::vector<const void*> host;
  for (std::uint32_t i = 0; i < kLayers; ++i) {
    std::memset(layers[i].data(), static_cast<int>(i + 1), kLayerBytes);
    host.push_back(layers[i].data());
  }
  tandem_streamer_options so{};
  so.sz = sizeof so;
  so.layers = kLayers;
  so.slots = 2;
  so.layer_bytes = kLayerBytes;
  so.layer_compute_us = 50'000;
  tandem_layer_streamer* streamer = nullptr;
  ASSERT_EQ(tandem_streamer_create(gpu_, &so, host.data(), &streamer), 0) << tandem_gpu_last_error(gpu_);
  tandem_streamer_info si{};
  si.sz = sizeof si;
  ASSERT_EQ(tandem_streamer_info_get(streamer, &si), 0);
  EXPECT_EQ(si.freed_bytes, freed) << "the streamer frees what the daemon planned with";
  EXPECT_EQ(si.hidden, 1u);
  for (int pass = 0; pass < 2; ++pass) {
    for (std::uint32_t i = 0; i < kLayers; ++i) {
      std::uint64_t w = 0;
      ASSERT_EQ(tandem_streamer_acquire(streamer, i, decode_stream(), &w), 0) << tandem_gpu_last_error(gpu_);
      EXPECT_NE(w, 0u);
      ASSERT_EQ(tandem_streamer_release(streamer, i, decode_stream()), 0) << tandem_gpu_last_error(gpu_);
    }
  }
  tandem_streamer_destroy(streamer);

  const nlohmann::json engines = ctl(daemon_.socket_path(), "engines");
  ASSERT_EQ(engines["engines"].size(), 1u) << engines.dump();
  EXPECT_EQ(engines["engines"][0]["offloaded_modules"], nlohmann::json::array({5}));
  EXPECT_EQ(engines["engines"][0]["offload_freed_bytes"], freed);
}

}  // namespace
}  // namespace tandem::it
