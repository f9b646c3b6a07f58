// libtandem's GPU C ABI (tandem_gpu.h) through the shared library, on the
// simulated device: opening and closing a pool, stages and streams, option
// validation that names the field, begin_pass fail-open (no daemon) and
// following the daemon's published partition index, the engine's GPU
// records (partitions, profiles, weight modules; KvStats.block_bytes) and
// their resend after a daemon restart, the offload plan.
//
// The fake daemon here is a trimmed copy of client_test.cc's: it binds
// <tmpdir>/tandemd.sock, answers Hello with a Welcome over a real
// ipc::Channel, reads the event ring and writes the status page. It runs
// on the test's thread ("let the client act, then the daemon").
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/unique_fd.h"
#include "ipc/channel.h"
#include "ipc/messages.h"
#include "ipc/records.h"
#include "tandem/tandem.h"
#include "tandem/tandem_gpu.h"
#include "tests/libclient/fake_daemon.h"

namespace tandem {
namespace {

using libclient_testing::FakeDaemon;
using libclient_testing::pump_until;
using libclient_testing::TempDir;
using std::chrono::milliseconds;

// The handshake with room on the event ring for a pool's records.
void attach(tandem_client* c, FakeDaemon& daemon, std::uint32_t client_id) {
  libclient_testing::connect(c, daemon, client_id, "fcfs", 256);
}

tandem_options options(const char* dir) {
  tandem_options o{};
  o.sz = sizeof o;
  o.runtime_dir = dir;
  o.name = "gpu-test";
  o.reconnect_min_ms = 20;
  o.reconnect_max_ms = 100;
  return o;
}

tandem_engine_params engine_params() {
  tandem_engine_params p{};
  p.sz = sizeof p;
  p.gpu_index = 0;
  p.block_size = 16;
  p.total_blocks = 4096;
  p.max_seqs = 64;
  p.token_budget = 2048;
  return p;
}

tandem_gpu_options sim_options() {
  tandem_gpu_options o{};
  o.sz = sizeof o;
  o.backend = "sim";
  return o;
}

tandem_gpu_info info_of(const tandem_gpu* g) {
  tandem_gpu_info info{};
  info.sz = sizeof info;
  EXPECT_EQ(tandem_gpu_info_get(g, &info), 0) << tandem_gpu_last_error(g);
  return info;
}

// ---- the pool, no daemon ---------------------------------------------------------

TEST(GpuApi, OpensASimulatedPoolWithoutAClient) {
  tandem_gpu_options o = sim_options();
  tandem_gpu* g = nullptr;
  ASSERT_EQ(tandem_gpu_open(nullptr, &o, &g), 0) << tandem_gpu_last_error(nullptr);
  ASSERT_NE(g, nullptr);
  EXPECT_STREQ(tandem_gpu_backend(g), "sim");
  EXPECT_STREQ(tandem_gpu_last_error(g), "");

  tandem_gpu_info info = info_of(g);
  EXPECT_EQ(info.sz, sizeof info);
  EXPECT_EQ(info.device_sms, 132u);
  EXPECT_NE(std::string(info.device_name).find("simulated"), std::string::npos) << info.device_name;
  EXPECT_EQ(info.n_stages, 2u);
  EXPECT_EQ(info.n_partitions, 7u);  // decode 16..64 by 8
  EXPECT_EQ(info.active_partition, 6u);
  const std::uint32_t want[] = {16, 24, 32, 40, 48, 56, 64, 0};
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(info.decode_sms[i], want[i]) << i;

  std::uint32_t prefill = 9, decode = 9;
  ASSERT_EQ(tandem_gpu_stage(g, "prefill", &prefill), 0);
  ASSERT_EQ(tandem_gpu_stage(g, "decode", &decode), 0);
  EXPECT_EQ(prefill, 0u);
  EXPECT_EQ(decode, 1u);
  std::uint32_t untouched = 42;
  EXPECT_EQ(tandem_gpu_stage(g, "vision", &untouched), -ENOENT);
  EXPECT_EQ(untouched, 42u);
  EXPECT_STREQ(tandem_gpu_last_error(g), "tandem_gpu_stage: no stage 'vision' in the pool");

  std::uint32_t sms = 0;
  ASSERT_EQ(tandem_gpu_partition_sms(g, 0, decode, &sms), 0);
  EXPECT_EQ(sms, 16u);
  ASSERT_EQ(tandem_gpu_partition_sms(g, 0, prefill, &sms), 0);
  EXPECT_EQ(sms, 116u);
  EXPECT_EQ(tandem_gpu_partition_sms(g, 7, 0, &sms), -EINVAL);
  EXPECT_EQ(tandem_gpu_partition_sms(g, 0, 2, &sms), -EINVAL);

  // Streams: non-null, distinct per stage, stable within a pass.
  void* sp = nullptr;
  void* sd = nullptr;
  ASSERT_EQ(tandem_gpu_stream(g, prefill, &sp), 0);
  ASSERT_EQ(tandem_gpu_stream(g, decode, &sd), 0);
  EXPECT_NE(sp, nullptr);
  EXPECT_NE(sd, nullptr);
  EXPECT_NE(sp, sd);
  void* again = nullptr;
  ASSERT_EQ(tandem_gpu_stream(g, decode, &again), 0);
  EXPECT_EQ(again, sd);
  EXPECT_EQ(tandem_gpu_stream(g, 2, &again), -EINVAL);
  EXPECT_STREQ(tandem_gpu_last_error(g), "tandem_gpu_stream: stage 2 is out of range (the pool has 2 stages)");

  // No client: begin_pass keeps the partition; set_partition switches.
  std::uint32_t active = 99;
  ASSERT_EQ(tandem_gpu_begin_pass(g, &active), 0);
  EXPECT_EQ(active, 6u);
  ASSERT_EQ(tandem_gpu_stream(g, decode, &again), 0);
  EXPECT_EQ(again, sd);
  ASSERT_EQ(tandem_gpu_set_partition(g, 2), 0);
  ASSERT_EQ(tandem_gpu_stream(g, decode, &again), 0);
  EXPECT_NE(again, sd);
  EXPECT_EQ(tandem_gpu_set_partition(g, 7), -ERANGE);
  EXPECT_STREQ(tandem_gpu_last_error(g),
               "tandem_gpu_set_partition: partition index 7 is out of range: the pool has 7 partitions");
  info = info_of(g);
  EXPECT_EQ(info.active_partition, 2u);
  EXPECT_EQ(info.switches, 1u);
  EXPECT_EQ(info.bad_indices, 1u);
  tandem_gpu_close(g);
  tandem_gpu_close(nullptr);
}

TEST(GpuApi, ExplicitPartitionsThreeStagesAndAFullDevice) {
  const char* stages[] = {"vision", "prefill", "decode"};
  tandem_gpu_partition parts[2] = {};
  parts[0].sms[0] = 16;
  parts[0].sms[1] = 0;  // the rest
  parts[0].sms[2] = 24;
  parts[1].sms[0] = 16;
  parts[1].sms[1] = 0;
  parts[1].sms[2] = 48;
  const int32_t prio[] = {0, -1, -5};
  tandem_gpu_options o = sim_options();
  o.stages = stages;
  o.n_stages = 3;
  o.partitions = parts;
  o.n_partitions = 2;
  o.full_device = 1;
  o.stage_priorities = prio;
  tandem_gpu* g = nullptr;
  ASSERT_EQ(tandem_gpu_open(nullptr, &o, &g), 0) << tandem_gpu_last_error(nullptr);
  tandem_gpu_info info = info_of(g);
  EXPECT_EQ(info.n_stages, 3u);
  EXPECT_EQ(info.n_partitions, 3u);
  EXPECT_EQ(info.decode_sms[0], 24u);
  EXPECT_EQ(info.decode_sms[1], 48u);
  EXPECT_EQ(info.decode_sms[2], 132u);
  EXPECT_EQ(info.active_partition, 2u) << "the full device until told otherwise";
  std::uint32_t sms = 0;
  ASSERT_EQ(tandem_gpu_partition_sms(g, 0, 1, &sms), 0);
  EXPECT_EQ(sms, 132u - 16 - 24);
  ASSERT_EQ(tandem_gpu_partition_sms(g, 2, 0, &sms), 0);
  EXPECT_EQ(sms, 132u);

  // Contexts: the full device runs every stage in the primary context; a
  // partition gives each stage a green context of its own.
  void* primary = nullptr;
  ASSERT_EQ(tandem_gpu_context(g, 2, &primary), 0) << tandem_gpu_last_error(g);
  void* also_primary = nullptr;
  ASSERT_EQ(tandem_gpu_context(g, 0, &also_primary), 0);
  EXPECT_NE(primary, nullptr);
  EXPECT_EQ(also_primary, primary);
  ASSERT_EQ(tandem_gpu_set_partition(g, 1), 0);
  void* decode_ctx = nullptr;
  void* vision_ctx = nullptr;
  ASSERT_EQ(tandem_gpu_context(g, 2, &decode_ctx), 0);
  ASSERT_EQ(tandem_gpu_context(g, 0, &vision_ctx), 0);
  EXPECT_NE(decode_ctx, primary);
  EXPECT_NE(decode_ctx, vision_ctx);
  ASSERT_EQ(tandem_gpu_set_partition(g, 0), 0);
  void* smaller = nullptr;
  ASSERT_EQ(tandem_gpu_context(g, 2, &smaller), 0);
  EXPECT_NE(smaller, decode_ctx) << "another partition, another green context";
  void* untouched = &sms;
  EXPECT_EQ(tandem_gpu_context(g, 3, &untouched), -EINVAL);
  EXPECT_STREQ(tandem_gpu_last_error(g), "tandem_gpu_context: stage 3 is out of range (the pool has 3 stages)");
  EXPECT_EQ(untouched, &sms);
  EXPECT_EQ(tandem_gpu_context(g, 0, nullptr), -EINVAL);
  tandem_gpu_close(g);
}

TEST(GpuApi, BadOptionsNameTheFieldAndCreateNothing) {
  struct Case {
    std::function<void(tandem_gpu_options&)> change;
    int code;
    std::string message;
  };
  static const char* one[] = {"decode"};
  static const char* twice[] = {"decode", "decode"};
  static const char* with_null[] = {"prefill", nullptr};
  static const char* three[] = {"a", "b", "decode"};
  static tandem_gpu_partition extra[1] = {{{0, 32, 8, 0}}};
  static tandem_gpu_partition bad_sms[1] = {{{0, 30, 0, 0}}};
  std::vector<Case> cases = {
      {[](auto& o) { o.sz = 4; }, EINVAL,
       fmt::format("tandem_gpu_open: options->sz 4 is too small (at least {})", sizeof(tandem_gpu_options))},
      {[](auto& o) { o.sz = 12; }, EINVAL,
       fmt::format("tandem_gpu_open: options->sz 12 is too small (at least {})", sizeof(tandem_gpu_options))},
      {[](auto& o) { o.backend = "opencl"; }, EINVAL,
       "tandem_gpu_open: options->backend 'opencl' is not \"auto\", \"cuda\" or \"sim\""},
      {[](auto& o) { o.ordinal = -1; }, EINVAL, "tandem_gpu_open: options->ordinal -1 is not in 0..1023"},
      {[](auto& o) { o.ordinal = 2147483647; }, EINVAL,
       "tandem_gpu_open: options->ordinal 2147483647 is not in 0..1023"},
      {[](auto& o) { o.n_stages = 2; }, EINVAL, "tandem_gpu_open: options->stages is NULL with n_stages 2"},
      {[](auto& o) { o.stages = one, o.n_stages = 1; }, EINVAL, "tandem_gpu_open: options->n_stages 1 is outside 2..4"},
      {[](auto& o) { o.stages = twice, o.n_stages = 2; }, EINVAL,
       "tandem_gpu_open: options->stages[1] 'decode' repeats stages[0]"},
      {[](auto& o) { o.stages = with_null, o.n_stages = 2; }, EINVAL, "tandem_gpu_open: options->stages[1] is NULL"},
      {[](auto& o) { o.stages = three, o.n_stages = 3; }, EINVAL,
       "tandem_gpu_open: options->partitions is NULL (a generated pool) but options->n_stages is 3, not 2"},
      {[](auto& o) { o.n_partitions = 1; }, EINVAL, "tandem_gpu_open: options->partitions is NULL with n_partitions 1"},
      {[](auto& o) { o.partitions = extra, o.n_partitions = 1; }, EINVAL,
       "tandem_gpu_open: options->partitions[0].sms[2] is 8 but there are only 2 stages"},
      {[](auto& o) { o.partitions = bad_sms, o.n_partitions = 1; }, EINVAL,
       "tandem_gpu_open: partition 0: stage 'decode': 30 SMs is not a multiple of 8 SMs, optionally plus the 4-SM "
       "remainder (nearest feasible: 28 or 32)"},
      {[](auto& o) { o.decode_min_sms = 64, o.decode_max_sms = 32; }, EINVAL,
       "tandem_gpu_open: options->decode_min_sms 64 is above options->decode_max_sms 32"},
      {[](auto& o) { o.full_device = 2; }, EINVAL, "tandem_gpu_open: options->full_device 2 is not 0 or 1"},
      {[](auto& o) { o.decode_min_sms = 4, o.decode_max_sms = 128, o.decode_step_sms = 4; }, EINVAL,
       "tandem_gpu_open: two-stage pool: decode SMs [4, 128] by 4 make 31 partitions, at most 16 are allowed"},
  };
  for (const Case& c : cases) {
    tandem_gpu_options o = sim_options();
    c.change(o);
    tandem_gpu* g = reinterpret_cast<tandem_gpu*>(0x1);
    EXPECT_EQ(tandem_gpu_open(nullptr, &o, &g), -c.code) << c.message;
    EXPECT_EQ(g, reinterpret_cast<tandem_gpu*>(0x1)) << "ret_gpu is untouched on failure";
    EXPECT_EQ(tandem_gpu_last_error(nullptr), c.message);
  }
  EXPECT_EQ(tandem_gpu_open(nullptr, nullptr, nullptr), -EINVAL);
  EXPECT_STREQ(tandem_gpu_last_error(nullptr), "tandem_gpu_open: ret_gpu is NULL");
}

TEST(GpuApi, CudaBackendWithoutADriverIsENODEV) {
  tandem_gpu_options o = sim_options();
  o.backend = "cuda";
  tandem_gpu* g = nullptr;
  int r = tandem_gpu_open(nullptr, &o, &g);
  if (r == 0) {
    EXPECT_STREQ(tandem_gpu_backend(g), "cuda");
    tandem_gpu_close(g);
    GTEST_SKIP() << "a CUDA driver and device are present";
  }
  EXPECT_EQ(r, -ENODEV) << tandem_gpu_last_error(nullptr);
  EXPECT_NE(std::string(tandem_gpu_last_error(nullptr)).find("CUDA device 0"), std::string::npos)
      << tandem_gpu_last_error(nullptr);
  // "auto" then takes the simulated device.
  o.backend = nullptr;
  ASSERT_EQ(tandem_gpu_open(nullptr, &o, &g), 0) << tandem_gpu_last_error(nullptr);
  EXPECT_STREQ(tandem_gpu_backend(g), "sim");
  tandem_gpu_close(g);
}

TEST(GpuApi, EngineWithoutADaemonKeepsItsPartition) {
  TempDir dir;  // nothing listens
  auto co = options(dir.path().c_str());
  auto p = engine_params();
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_engine_open(&co, &p, &c), 0);
  tandem_gpu_options o = sim_options();
  tandem_gpu* g = nullptr;
  ASSERT_EQ(tandem_gpu_open(c, &o, &g), 0) << tandem_last_error(c);
  // One pool per engine handle.
  tandem_gpu* second = nullptr;
  EXPECT_EQ(tandem_gpu_open(c, &o, &second), -EBUSY);
  EXPECT_STREQ(tandem_last_error(c), "tandem_gpu_open: client already has an open tandem_gpu (one pool per engine)");
  std::uint32_t active = 0;
  ASSERT_EQ(tandem_gpu_begin_pass(g, &active), 0);
  EXPECT_EQ(active, 6u);
  ASSERT_EQ(tandem_gpu_set_partition(g, 3), 0);
  ASSERT_EQ(tandem_gpu_begin_pass(g, &active), 0);
  EXPECT_EQ(active, 3u) << "fail-open: the current partition stays";
  uint64_t plan = 1, freed = 1;
  ASSERT_EQ(tandem_offload_plan(c, &plan, &freed), 0);
  EXPECT_EQ(plan, 0u);
  EXPECT_EQ(freed, 0u);
  tandem_gpu_close(g);
  ASSERT_EQ(tandem_gpu_open(c, &o, &g), 0) << "closing freed the engine's pool slot";
  tandem_gpu_close(g);
  tandem_close(c);
}

TEST(GpuApi, RunnerHandlesCannotUseTheEngineCalls) {
  TempDir dir;
  auto co = options(dir.path().c_str());
  tandem_client* r = nullptr;
  ASSERT_EQ(tandem_runner_open(&co, &r), 0);
  tandem_gpu_options o = sim_options();
  tandem_gpu* g = nullptr;
  EXPECT_EQ(tandem_gpu_open(r, &o, &g), -EPERM);
  EXPECT_STREQ(tandem_last_error(r), "tandem_gpu_open: client is not an engine handle");
  tandem_profile_row row{8, 0, 0.01, 100.0};
  EXPECT_EQ(tandem_gpu_profile(r, TANDEM_GPU_STAGE_DECODE, &row, 1), -EPERM);
  EXPECT_EQ(tandem_offload_plan(r, nullptr, nullptr), -EPERM);
  EXPECT_STREQ(tandem_last_error(r), "tandem_offload_plan: not an engine handle");
  tandem_close(r);
}

TEST(GpuApi, ProfileAndModuleValidation) {
  TempDir dir;
  auto co = options(dir.path().c_str());
  auto p = engine_params();
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_engine_open(&co, &p, &c), 0);

  tandem_profile_row rows[3] = {{16, 0, 0.020, 50.0}, {32, 0, 0.012, 80.0}, {48, 0, 0.010, 95.0}};
  EXPECT_EQ(tandem_gpu_profile(c, TANDEM_GPU_STAGE_DECODE, rows, 3), 0) << tandem_last_error(c);
  EXPECT_EQ(tandem_gpu_profile(c, 2, rows, 3), -EINVAL);
  EXPECT_STREQ(tandem_last_error(c),
               "tandem_gpu_profile: stage 2 is not TANDEM_GPU_STAGE_DECODE (0) or TANDEM_GPU_STAGE_PREFILL (1)");
  EXPECT_EQ(tandem_gpu_profile(c, TANDEM_GPU_STAGE_PREFILL, nullptr, 3), -EINVAL);
  EXPECT_STREQ(tandem_last_error(c), "tandem_gpu_profile: rows is NULL");
  EXPECT_EQ(tandem_gpu_profile(c, TANDEM_GPU_STAGE_PREFILL, rows, 0), -EINVAL);
  EXPECT_STREQ(tandem_last_error(c), "tandem_gpu_profile: count 0 is outside 1..64");
  tandem_profile_row bad[2] = {{32, 0, 0.01, 1.0}, {32, 0, 0.01, 1.0}};
  EXPECT_EQ(tandem_gpu_profile(c, TANDEM_GPU_STAGE_PREFILL, bad, 2), -EINVAL);
  EXPECT_STREQ(tandem_last_error(c), "tandem_gpu_profile: rows[1].sm_count 32 is not above rows[0].sm_count 32");
  bad[1] = {40, 0, 0.0, 1.0};
  EXPECT_EQ(tandem_gpu_profile(c, TANDEM_GPU_STAGE_PREFILL, bad, 2), -EINVAL);
  EXPECT_STREQ(tandem_last_error(c), "tandem_gpu_profile: rows[1].latency_s 0 is not finite and > 0");
  bad[1] = {40, 0, 0.01, -1.0};
  EXPECT_EQ(tandem_gpu_profile(c, TANDEM_GPU_STAGE_PREFILL, bad, 2), -EINVAL);
  EXPECT_STREQ(tandem_last_error(c), "tandem_gpu_profile: rows[1].throughput -1 is not finite and >= 0");
  bad[0].sm_count = 0;
  EXPECT_EQ(tandem_gpu_profile(c, TANDEM_GPU_STAGE_PREFILL, bad, 2), -EINVAL);
  EXPECT_STREQ(tandem_last_error(c), "tandem_gpu_profile: rows[0].sm_count is 0");

  tandem_weight_module_info m{};
  m.sz = sizeof m;
  m.index = 3;
  m.slots = 2;
  m.layers = 32;
  m.layer_compute_us = 150;
  m.bytes = 8ull << 30;
  m.name = "mlp";
  EXPECT_EQ(tandem_weight_module(c, &m), 0) << tandem_last_error(c);
  struct Case {
    std::function<void(tandem_weight_module_info&)> change;
    std::string message;
  };
  std::vector<Case> cases = {
      {[](auto& x) { x.sz = 8; }, "tandem_weight_module: module->sz is too small"},
      {[](auto& x) { x.index = 64; }, "tandem_weight_module: module->index 64 is not below 64"},
      {[](auto& x) { x.layers = 2; }, "tandem_weight_module: module->layers 2 is outside 3..65535"},
      {[](auto& x) { x.slots = 32; },
       "tandem_weight_module: module->slots 32 is outside 2..31 (fewer than layers, at most 255)"},
      {[](auto& x) { x.slots = 1; },
       "tandem_weight_module: module->slots 1 is outside 2..31 (fewer than layers, at most 255)"},
      {[](auto& x) { x.layer_compute_us = 0; }, "tandem_weight_module: module->layer_compute_us is 0"},
      {[](auto& x) { x.bytes = 0; }, "tandem_weight_module: module->bytes is 0"},
      {[](auto& x) { x.name = nullptr; }, "tandem_weight_module: module->name is NULL"},
      {[](auto& x) { x.name = ""; }, "tandem_weight_module: module->name must have 1 to 23 characters"},
      {[](auto& x) { x.name = "a-name-that-is-too-long-"; },
       "tandem_weight_module: module->name must have 1 to 23 characters"},
      {[](auto& x) { x.name = "tab\there"; }, "tandem_weight_module: module->name has a non-printable byte 0x09 at 3"},
  };
  for (const Case& k : cases) {
    tandem_weight_module_info x = m;
    k.change(x);
    EXPECT_EQ(tandem_weight_module(c, &x), -EINVAL) << k.message;
    EXPECT_EQ(tandem_last_error(c), k.message);
  }
  EXPECT_EQ(tandem_weight_module(c, nullptr), -EINVAL);
  tandem_close(c);
}

// ---- against a daemon -------------------------------------------------------------

TEST(GpuApi, RecordsReachTheDaemonAndBeginPassFollowsItsIndex) {
  TempDir dir;
  FakeDaemon daemon(dir.path());
  auto co = options(dir.path().c_str());
  auto p = engine_params();
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_engine_open(&co, &p, &c), 0);
  ASSERT_NO_FATAL_FAILURE(attach(c, daemon, 5));

  tandem_gpu_options o = sim_options();
  o.full_device = 1;
  tandem_gpu* g = nullptr;
  ASSERT_EQ(tandem_gpu_open(c, &o, &g), 0) << tandem_last_error(c);
  tandem_profile_row rows[2] = {{16, 0, 0.020, 50.0}, {64, 0, 0.010, 95.0}};
  ASSERT_EQ(tandem_gpu_profile(c, TANDEM_GPU_STAGE_DECODE, rows, 2), 0);
  tandem_weight_module_info m{};
  m.sz = sizeof m;
  m.index = 1;
  m.slots = 3;
  m.layers = 40;
  m.layer_compute_us = 200;
  m.bytes = 1ull << 30;
  m.name = "experts";
  ASSERT_EQ(tandem_weight_module(c, &m), 0);
  tandem_kv_stats kv{};
  kv.sz = sizeof kv;
  kv.blocks_total = 4096;
  kv.blocks_free = 4096;
  kv.block_bytes = 2u << 20;
  ASSERT_EQ(tandem_kv_stats_report(c, &kv), 0);

  auto events = daemon.events();
  auto parts = FakeDaemon::only<ipc::GpuPartitions>(events);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].header.session, 0u);
  EXPECT_EQ(parts[0].count, 8u);
  EXPECT_EQ(parts[0].device_sms, 132u);
  EXPECT_NE(parts[0].pool_id, 0u);
  const std::uint16_t want[] = {16, 24, 32, 40, 48, 56, 64, 132, 0};
  for (std::size_t i = 0; i < 9; ++i) EXPECT_EQ(parts[0].decode_sms[i], want[i]) << i;
  auto profile = FakeDaemon::only<ipc::StageProfileRow>(events);
  ASSERT_EQ(profile.size(), 2u);
  EXPECT_EQ(profile[0].stage, static_cast<std::uint8_t>(ipc::GpuStage::kDecode));
  EXPECT_EQ(profile[0].row, 0u);
  EXPECT_EQ(profile[1].row, 1u);
  EXPECT_EQ(profile[1].row_count, 2u);
  EXPECT_EQ(profile[1].sm_count, 64u);
  EXPECT_DOUBLE_EQ(profile[1].latency_s, 0.010);
  auto modules = FakeDaemon::only<ipc::WeightModule>(events);
  ASSERT_EQ(modules.size(), 1u);
  EXPECT_EQ(modules[0].index, 1u);
  EXPECT_EQ(modules[0].slots, 3u);
  EXPECT_EQ(modules[0].layers, 40u);
  EXPECT_STREQ(modules[0].name, "experts");
  auto kvs = FakeDaemon::only<ipc::KvStats>(events);
  ASSERT_EQ(kvs.size(), 1u);
  EXPECT_EQ(kvs[0].block_bytes, 2u << 20);

  // An index without kStatusSmPartitionSet is not the daemon's choice yet.
  std::uint32_t decode = 0;
  ASSERT_EQ(tandem_gpu_stage(g, "decode", &decode), 0);
  void* before = nullptr;
  ASSERT_EQ(tandem_gpu_stream(g, decode, &before), 0);
  ipc::EngineStatus st;
  st.updated_ns = 1;
  st.sm_partition = 2;
  daemon.publish(st);
  std::uint32_t active = 0;
  ASSERT_EQ(tandem_gpu_begin_pass(g, &active), 0);
  EXPECT_EQ(active, 7u);

  // An index chosen for another pool (one this engine had before) is not
  // followed either.
  st.flags = ipc::kStatusSmPartitionSet;
  st.sm_partition_pool = parts[0].pool_id + 1;
  daemon.publish(st);
  ASSERT_EQ(tandem_gpu_begin_pass(g, &active), 0);
  EXPECT_EQ(active, 7u);

  // The daemon's choice for this pool: the pool switches at the next pass,
  // and the stream for decode changes with it.
  st.sm_partition_pool = parts[0].pool_id;
  st.offload_plan = 0b10;
  st.offload_freed_bytes = 123456;
  daemon.publish(st);
  void* still = nullptr;
  ASSERT_EQ(tandem_gpu_stream(g, decode, &still), 0);
  EXPECT_EQ(still, before) << "no switch between pass boundaries";
  ASSERT_EQ(tandem_gpu_begin_pass(g, &active), 0);
  EXPECT_EQ(active, 2u);
  void* after = nullptr;
  ASSERT_EQ(tandem_gpu_stream(g, decode, &after), 0);
  EXPECT_NE(after, before);
  uint64_t plan = 0, freed = 0;
  ASSERT_EQ(tandem_offload_plan(c, &plan, &freed), 0);
  EXPECT_EQ(plan, 0b10u);
  EXPECT_EQ(freed, 123456u);

  // An index out of range: -ERANGE, the partition stays.
  st.sm_partition = 8;
  daemon.publish(st);
  EXPECT_EQ(tandem_gpu_begin_pass(g, &active), -ERANGE);
  EXPECT_STREQ(tandem_gpu_last_error(g),
               "tandem_gpu_begin_pass: the daemon's partition index 8 is out of range: the pool has 8 partitions");
  tandem_gpu_info info = info_of(g);
  EXPECT_EQ(info.active_partition, 2u);
  EXPECT_EQ(info.bad_indices, 1u);
  EXPECT_EQ(info.switches, 1u);
  tandem_gpu_close(g);
  tandem_close(c);
}

TEST(GpuApi, RecordsAreSentAgainAfterTheDaemonRestarts) {
  TempDir dir;
  auto daemon = std::make_unique<FakeDaemon>(dir.path());
  auto co = options(dir.path().c_str());
  auto p = engine_params();
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_engine_open(&co, &p, &c), 0);
  ASSERT_NO_FATAL_FAILURE(attach(c, *daemon, 5));
  tandem_gpu_options o = sim_options();
  tandem_gpu* g = nullptr;
  ASSERT_EQ(tandem_gpu_open(c, &o, &g), 0) << tandem_last_error(c);
  tandem_profile_row rows[2] = {{16, 0, 0.020, 50.0}, {64, 0, 0.010, 95.0}};
  ASSERT_EQ(tandem_gpu_profile(c, TANDEM_GPU_STAGE_PREFILL, rows, 2), 0);
  tandem_weight_module_info m{};
  m.sz = sizeof m;
  m.index = 0;
  m.slots = 2;
  m.layers = 10;
  m.layer_compute_us = 100;
  m.bytes = 1ull << 20;
  m.name = "embed";
  ASSERT_EQ(tandem_weight_module(c, &m), 0);
  m.slots = 4;  // replaces module 0
  ASSERT_EQ(tandem_weight_module(c, &m), 0);
  const std::vector<ipc::Record> sent = daemon->events();
  EXPECT_EQ(FakeDaemon::only<ipc::WeightModule>(sent).size(), 2u);

  // The daemon's choice is followed while connected.
  ipc::EngineStatus st;
  st.flags = ipc::kStatusSmPartitionSet;
  st.sm_partition_pool = FakeDaemon::only<ipc::GpuPartitions>(sent).at(0).pool_id;
  st.sm_partition = 1;
  daemon->publish(st);
  std::uint32_t active = 0;
  ASSERT_EQ(tandem_gpu_begin_pass(g, &active), 0);
  EXPECT_EQ(active, 1u);

  // The daemon dies: fail-open keeps partition 1.
  daemon->stop();
  ASSERT_TRUE(pump_until(c, [&] { return tandem_connected(c) == 0; }));
  ASSERT_EQ(tandem_gpu_begin_pass(g, &active), 0);
  EXPECT_EQ(active, 1u);

  // A new daemon: the pool, the profile and the latest module arrive again.
  daemon.reset();
  daemon = std::make_unique<FakeDaemon>(dir.path());
  ASSERT_NO_FATAL_FAILURE(attach(c, *daemon, 6));
  auto events = daemon->events();
  auto parts = FakeDaemon::only<ipc::GpuPartitions>(events);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].count, 7u);
  auto profile = FakeDaemon::only<ipc::StageProfileRow>(events);
  ASSERT_EQ(profile.size(), 2u);
  EXPECT_EQ(profile[0].stage, static_cast<std::uint8_t>(ipc::GpuStage::kPrefill));
  auto modules = FakeDaemon::only<ipc::WeightModule>(events);
  ASSERT_EQ(modules.size(), 1u);
  EXPECT_EQ(modules[0].slots, 4u);
  // Nothing chosen by the new daemon yet: the partition stays.
  ASSERT_EQ(tandem_gpu_begin_pass(g, &active), 0);
  EXPECT_EQ(active, 1u);

  // Once the pool is closed it is no longer announced.
  tandem_gpu_close(g);
  daemon->stop();
  ASSERT_TRUE(pump_until(c, [&] { return tandem_connected(c) == 0; }));
  daemon.reset();
  daemon = std::make_unique<FakeDaemon>(dir.path());
  ASSERT_NO_FATAL_FAILURE(attach(c, *daemon, 7));
  events = daemon->events();
  EXPECT_TRUE(FakeDaemon::only<ipc::GpuPartitions>(events).empty());
  EXPECT_EQ(FakeDaemon::only<ipc::WeightModule>(events).size(), 1u);
  tandem_close(c);
}

}  // namespace
}  // namespace tandem
