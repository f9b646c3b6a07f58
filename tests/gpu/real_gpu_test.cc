// The real-GPU suite: the CUDA backend, green contexts and the layer streamer
// on a real device, with kernels (gpu/testing/kernels.cu, built by nvcc and
// launched through the dlopen'd driver API by gpu/testing/CudaHarness).
//
//   GreenContextsGetThePlannedSmCounts  the driver's split matches the plan
//   KernelsStayOnTheirPartition         %smid of every block: each context's
//                                       kernel used ≤ its SMs, disjoint
//                                       contexts used disjoint SMs
//   Costs                               cuGreenCtxCreate, stream creation, a
//                                       GreenContextPool build, a stream
//                                       switch at a pass boundary (printed,
//                                       not asserted: timings are benchmarks)
//   LayerStreamerAtLinkSpeed            16 × 64 MiB layers through K=2 slots:
//                                       every layer's kernel saw its layer,
//                                       pass time vs all layers resident
//
// Every test skips (GTEST_SKIP naming why) without a driver and device, or
// when the build had no nvcc for the kernels; each destroys what it made,
// streams before contexts, and checks the harness holds nothing at the end.
// scripts/gpu-suite builds and runs this on a GPU machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "gpu/cuda_device.h"
#include "gpu/green_pool.h"
#include "gpu/layer_streamer.h"
#include "gpu/partition.h"
#include "gpu/testing/cuda_harness.h"
#include "gpu/testing/kernels_image.h"

namespace tandem::gpu {
namespace {

using testing::CudaHarness;
using testing::Dim3;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::ranges::sort(v);
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A Result as a gtest assertion that prints the driver's error.
template <class T>
::testing::AssertionResult ok(const base::Result<T>& r) {
  if (r) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << r.error().message();
}

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

// A DeviceApi and the kernel harness on device 0, or the reason to skip.
class RealGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    auto opened = open_cuda_device(0);
    if (!opened) GTEST_SKIP() << "no usable CUDA device: " << opened.error().message();
    device_ = std::move(*opened);
    auto h = CudaHarness::open(0);
    if (!h) GTEST_SKIP() << "kernel harness unavailable: " << h.error().message();
    harness_ = std::move(*h);
    auto res = device_->sm_resource();
    ASSERT_TRUE(res) << res.error().message();
    res_ = *res;
  }

  void TearDown() override {
    if (harness_) {
      EXPECT_EQ(harness_->live_allocations(), 0u);
      EXPECT_EQ(harness_->live_streams(), 0u);
      EXPECT_EQ(harness_->live_events(), 0u);
    }
    harness_.reset();
    device_.reset();
  }

  void* native(StreamId s) {
    auto n = device_->native_stream(s);
    EXPECT_TRUE(n) << n.error().message();
    return n ? *n : nullptr;
  }

  std::unique_ptr<DeviceApi> device_;
  std::unique_ptr<CudaHarness> harness_;
  SmResource res_;
};

// Runs everywhere the build had nvcc: the embedded image is a fatbin (its
// magic), aligned for the driver, and holds every kernel the harness looks up.
TEST(GpuKernelImage, EmbeddedFatbinHoldsTheKernels) {
  const std::span<const unsigned char> image = testing::kernels_fatbin();
  if (image.empty()) GTEST_SKIP() << testing::kernels_missing_reason();
  EXPECT_TRUE(testing::kernels_missing_reason().empty());
  ASSERT_GT(image.size(), 16u);
  // The magic of the fatbin header nvcc -fatbin writes, 0xBA55ED50 little-endian.
  EXPECT_EQ(image[0], 0x50);
  EXPECT_EQ(image[1], 0xed);
  EXPECT_EQ(image[2], 0x55);
  EXPECT_EQ(image[3], 0xba);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(image.data()) % 64, 0u);
  const std::string_view bytes(reinterpret_cast<const char*>(image.data()), image.size());
  for (const char* k : {"tandem_record_smid", "tandem_empty", "tandem_consume_layer", "tandem_triad", "tandem_fma"}) {
    EXPECT_NE(bytes.find(k), std::string_view::npos) << k << " is not in the embedded fatbin";
  }
}

TEST(RealGpuDevice, GreenContextsGetThePlannedSmCounts) {
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

  // The planner works from the driver's group count (an H200: 15 of 8, not 16).
  const std::uint32_t block = block_size(*res);
  auto count = d.split_group_count(block);
  ASSERT_TRUE(count) << count.error().message();
  EXPECT_EQ(*count, res->groups) << "sm_resource() reports the driver's own count";
  EXPECT_LE(*count, res->sm_count / block);

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

// Several sizes from ONE split (16, 32, 64 SMs and the rest, as the device's
// granularity allows), one kernel per context, all running at once; each
// block records the SM it ran on.
TEST_F(RealGpu, KernelsStayOnTheirPartition) {
  const std::vector<std::uint32_t> feasible = feasible_sm_counts(res_);
  std::vector<StageRequest> want;
  std::uint32_t used = 0;
  for (std::uint32_t sms : {16u, 32u, 64u}) {
    // The smallest feasible count ≥ sms, if it still fits.
    auto it = std::ranges::find_if(feasible, [&](std::uint32_t c) { return c >= sms; });
    if (it == feasible.end() || used + *it > res_.sm_count) break;
    want.push_back({fmt::format("p{}", *it), *it});
    used += *it;
  }
  std::uint32_t rest = 0;
  for (std::uint32_t c : feasible) {
    if (used + c <= res_.sm_count) rest = c;
  }
  if (rest > 0) want.push_back({"rest", rest});
  ASSERT_GE(want.size(), 2u) << "a " << res_.sm_count << "-SM device cannot hold two partitions";
  auto plan = plan_partitions(res_, want);
  ASSERT_TRUE(plan) << plan.error().message();
  auto split = device_->split_by_count(plan->group_count, plan->group_sm_count);
  ASSERT_TRUE(split) << split.error().message();
  ASSERT_TRUE(check_split(*plan, *split));

  // Many more blocks than SMs, each resident for a while (~50 µs).
  const std::uint32_t blocks = res_.sm_count * 16;
  unsigned long long spin = static_cast<unsigned long long>(harness_->clock_khz()) * 50 / 1000;
  struct Part {
    std::string name;
    std::uint32_t sm_count = 0;
    GreenCtxId ctx = 0;
    StreamId stream = 0;
    DevicePtr out = 0;
    std::set<unsigned> sms;
  };
  std::vector<Part> parts;
  for (const StagePartition& stage : plan->stages) {
    Part p;
    p.name = stage.stage;
    p.sm_count = stage.sm_count;
    auto ctx = device_->create_green_context(pieces_for(stage, *split));
    ASSERT_TRUE(ctx) << stage.stage << ": " << ctx.error().message();
    p.ctx = *ctx;
    auto got = device_->green_context_sm_resource(p.ctx);
    ASSERT_TRUE(got) << got.error().message();
    EXPECT_EQ(got->sm_count, stage.sm_count) << stage.stage;
    auto st = device_->create_stream(p.ctx, 0);
    ASSERT_TRUE(st) << st.error().message();
    p.stream = *st;
    auto out = harness_->alloc(blocks * sizeof(unsigned));
    ASSERT_TRUE(out) << out.error().message();
    p.out = *out;
    ASSERT_TRUE(ok(harness_->memset_d32(p.out, 0xffffffffu, blocks)));
    parts.push_back(std::move(p));
  }
  for (Part& p : parts) {
    void* args[] = {&p.out, &spin};
    auto launched = harness_->launch("tandem_record_smid", Dim3{blocks}, Dim3{32}, native(p.stream), args);
    ASSERT_TRUE(launched) << launched.error().message();
  }
  ASSERT_TRUE(ok(harness_->synchronize()));

  std::vector<unsigned> ids(blocks);
  const char* why_more =
      "green contexts run on more SMs than provisioned only under MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) or, on "
      "compute capability 9.x, after a module with dynamic parallelism (CDP) was loaded (+2 SMs; cuda.h)";
  for (Part& p : parts) {
    ASSERT_TRUE(ok(harness_->copy_to_host(ids.data(), p.out, blocks * sizeof(unsigned))));
    for (unsigned id : ids) {
      ASSERT_NE(id, 0xffffffffu) << p.name << ": a block never ran";
      p.sms.insert(id);
    }
    std::cout << fmt::format("partition {:>5}: {:3} SMs provisioned, {:3} distinct SMs used by {} blocks\n", p.name,
                             p.sm_count, p.sms.size(), blocks);
    EXPECT_LE(p.sms.size(), p.sm_count) << p.name << " used more SMs than its green context has; " << why_more;
  }
  for (std::size_t i = 0; i < parts.size(); ++i) {
    for (std::size_t j = i + 1; j < parts.size(); ++j) {
      std::vector<unsigned> both;
      std::ranges::set_intersection(parts[i].sms, parts[j].sms, std::back_inserter(both));
      EXPECT_TRUE(both.empty()) << parts[i].name << " and " << parts[j].name
                                << " (disjoint pieces of one split) shared " << both.size() << " SMs, e.g. SM "
                                << both.front() << "; " << why_more;
    }
  }

  for (Part& p : parts) {
    EXPECT_TRUE(ok(harness_->free(p.out)));
    EXPECT_TRUE(ok(device_->destroy_stream(p.stream)));
    EXPECT_TRUE(ok(device_->destroy_green_context(p.ctx)));
  }
}

// What partitioning costs on the host, medians over 50 repetitions. Printed
// for docs/gpu.md; nothing is asserted about the numbers.
TEST_F(RealGpu, Costs) {
  constexpr int kReps = 50;
  const std::uint32_t block = block_size(res_);
  auto split = device_->split_by_count(res_.sm_count / block, block);
  ASSERT_TRUE(split) << split.error().message();
  std::cout << fmt::format("{} SMs in {} groups of {} + {} remaining\n", res_.sm_count, split->groups.size(),
                           split->group_sm_count, split->remaining_sm_count);

  // cuDevResourceGenerateDesc + cuGreenCtxCreate, and cuGreenCtxDestroy.
  for (std::uint32_t sms : {16u, 32u, 64u, res_.sm_count - split->remaining_sm_count}) {
    const std::uint32_t groups = sms / split->group_sm_count;
    if (groups == 0 || groups > split->groups.size()) continue;
    std::vector<ResourceId> pieces(split->groups.begin(), split->groups.begin() + groups);
    std::vector<double> create_us;
    std::vector<double> destroy_us;
    for (int i = 0; i < kReps; ++i) {
      auto t0 = Clock::now();
      auto ctx = device_->create_green_context(pieces);
      create_us.push_back(us_since(t0));
      ASSERT_TRUE(ctx) << ctx.error().message();
      t0 = Clock::now();
      ASSERT_TRUE(ok(device_->destroy_green_context(*ctx)));
      destroy_us.push_back(us_since(t0));
    }
    std::cout << fmt::format(
        "green context of {:3} SMs: create (desc + cuGreenCtxCreate) {:8.1f} us, destroy {:8.1f} us\n",
        groups * split->group_sm_count, median(create_us), median(destroy_us));
  }

  // cuGreenCtxStreamCreate and cuStreamCreateWithPriority.
  {
    std::vector<ResourceId> pieces(split->groups.begin(), split->groups.begin() + 1);
    auto ctx = device_->create_green_context(pieces);
    ASSERT_TRUE(ctx) << ctx.error().message();
    std::vector<double> green_us;
    std::vector<double> plain_us;
    for (int i = 0; i < kReps; ++i) {
      auto t0 = Clock::now();
      auto st = device_->create_stream(*ctx, 0);
      green_us.push_back(us_since(t0));
      ASSERT_TRUE(st) << st.error().message();
      ASSERT_TRUE(ok(device_->destroy_stream(*st)));
      t0 = Clock::now();
      auto plain = device_->create_plain_stream(0);
      plain_us.push_back(us_since(t0));
      ASSERT_TRUE(plain) << plain.error().message();
      ASSERT_TRUE(ok(device_->destroy_stream(*plain)));
    }
    ASSERT_TRUE(ok(device_->destroy_green_context(*ctx)));
    std::cout << fmt::format("stream create: green context {:.1f} us, plain {:.1f} us\n", median(green_us),
                             median(plain_us));
  }

  // A whole pool: decode 16..64 by 8 with prefill the rest, plus the full
  // device (7 partitions × 2 green contexts on an H100).
  auto config = two_stage_config(res_, TwoStageOptions{.full_device = true});
  ASSERT_TRUE(config) << config.error().message();
  std::vector<double> pool_us;
  std::vector<double> pool_down_us;
  std::size_t partitions = 0;
  for (int i = 0; i < kReps / 5; ++i) {
    auto t0 = Clock::now();
    auto pool = GreenContextPool::create(*device_, *config);
    pool_us.push_back(us_since(t0));
    ASSERT_TRUE(pool) << pool.error().message();
    partitions = (*pool)->partition_count();
    t0 = Clock::now();
    pool->reset();
    pool_down_us.push_back(us_since(t0));
  }
  std::cout << fmt::format("GreenContextPool of {} partitions: build {:.0f} us, teardown {:.0f} us (median of {})\n",
                           partitions, median(pool_us), median(pool_down_us), pool_us.size());

  // Switching at a pass boundary: empty kernel, then the next one on the
  // same stream, or begin_pass (event recorded on the old stream, the new
  // stream waits on it) and the next one on the new partition's stream.
  auto pool = GreenContextPool::create(*device_, *config);
  ASSERT_TRUE(pool) << pool.error().message();
  GreenContextPool& p = **pool;
  const std::size_t decode = p.decode_stage();
  ASSERT_GE(p.partition_count(), 2u);
  std::vector<double> same_us;
  std::vector<double> switch_us;
  std::vector<double> begin_pass_us;
  for (int i = 0; i < kReps; ++i) {
    void* s = native(p.stream(decode));
    auto t0 = Clock::now();
    ASSERT_TRUE(ok(harness_->launch("tandem_empty", Dim3{1}, Dim3{32}, s, {})));
    ASSERT_TRUE(ok(harness_->launch("tandem_empty", Dim3{1}, Dim3{32}, s, {})));
    ASSERT_TRUE(ok(harness_->stream_synchronize(s)));
    same_us.push_back(us_since(t0));

    const std::size_t next = (p.active() + 1) % p.partition_count();
    t0 = Clock::now();
    ASSERT_TRUE(ok(harness_->launch("tandem_empty", Dim3{1}, Dim3{32}, s, {})));
    auto t1 = Clock::now();
    ASSERT_TRUE(p.begin_pass(next));
    begin_pass_us.push_back(us_since(t1));
    void* s2 = native(p.stream(decode));
    ASSERT_TRUE(ok(harness_->launch("tandem_empty", Dim3{1}, Dim3{32}, s2, {})));
    ASSERT_TRUE(ok(harness_->stream_synchronize(s2)));
    switch_us.push_back(us_since(t0));
  }
  EXPECT_EQ(p.counters().switches, static_cast<std::uint64_t>(kReps));
  std::cout << fmt::format(
      "two empty kernels + sync: same stream {:.1f} us, across a partition switch {:.1f} us (begin_pass itself "
      "{:.1f} us)\n",
      median(same_us), median(switch_us), median(begin_pass_us));
  pool->reset();
}

// Nova's layer-wise weight offload at the link's real speed: L=16 layers of
// 64 MiB through K=2 device slots, a kernel per layer that sums the slot
// (so the test knows which layer the slot held when the kernel ran) and then
// computes for about twice one layer's copy time, so the copies can hide
// (B ≥ S/T · (L−K)/(L−2)). The same passes with every layer resident give
// the baseline.
TEST_F(RealGpu, LayerStreamerAtLinkSpeed) {
  constexpr std::uint32_t kLayers = 16;
  constexpr std::uint32_t kSlots = 2;
  constexpr std::uint64_t kLayerBytes = 64ull << 20;
  constexpr std::uint64_t kWords = kLayerBytes / 4;
  constexpr int kPasses = 4;

  // Layer i holds words i·2^24 + w: distinct sums per layer.
  std::vector<std::vector<std::uint32_t>> layers(kLayers);
  std::vector<unsigned long long> expect(kLayers);
  for (std::uint32_t i = 0; i < kLayers; ++i) {
    layers[i].resize(kWords);
    unsigned long long sum = 0;
    for (std::uint64_t w = 0; w < kWords; ++w) {
      layers[i][w] = (i << 24) + static_cast<std::uint32_t>(w * 2654435761u);
      sum += layers[i][w];
    }
    expect[i] = sum;
  }

  auto compute = device_->create_plain_stream(0);
  ASSERT_TRUE(compute) << compute.error().message();
  void* cs = native(*compute);
  auto start = harness_->create_timing_event();
  auto end = harness_->create_timing_event();
  ASSERT_TRUE(start && end);

  // The link: one layer from pinned memory, timed on a plain stream.
  double copy_ms = 0;
  {
    auto pinned = device_->alloc_pinned_host(kLayerBytes);
    ASSERT_TRUE(pinned) << pinned.error().message();
    std::memcpy(*pinned, layers[0].data(), kLayerBytes);
    auto dst = device_->alloc_device(kLayerBytes);
    ASSERT_TRUE(dst) << dst.error().message();
    std::vector<double> ms;
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(ok(harness_->record(*start, cs)));
      ASSERT_TRUE(ok(device_->copy_h2d_async(*dst, *pinned, kLayerBytes, *compute)));
      ASSERT_TRUE(ok(harness_->record(*end, cs)));
      auto e = harness_->elapsed_ms(*start, *end);
      ASSERT_TRUE(e) << e.error().message();
      ms.push_back(*e);
    }
    copy_ms = median(ms);
    EXPECT_TRUE(ok(device_->free_device(*dst)));
    EXPECT_TRUE(ok(device_->free_pinned_host(*pinned)));
  }
  const double link = static_cast<double>(kLayerBytes) / (copy_ms / 1e3);
  std::cout << fmt::format("H2D (pinned, one 64 MiB layer): {:.3f} ms, {:.1f} GB/s\n", copy_ms, link / 1e9);

  // Calibrate the layer kernel: T ≈ 2 × copy time.
  auto sums = harness_->alloc(sizeof(unsigned long long) * kLayers * kPasses);
  auto sink = harness_->alloc(sizeof(float));
  auto scratch = harness_->alloc(sizeof(unsigned long long));
  auto probe_layer = harness_->alloc(kLayerBytes);
  ASSERT_TRUE(sums && sink && scratch && probe_layer);
  const Dim3 grid{harness_->sm_count() * 4};
  const Dim3 block{256};
  auto time_kernel = [&](DevicePtr slot, DevicePtr sum, unsigned long long iters) -> double {
    unsigned long long words = kWords;
    void* args[] = {&slot, &words, &sum, &iters, &*sink};
    EXPECT_TRUE(ok(harness_->record(*start, cs)));
    EXPECT_TRUE(ok(harness_->launch("tandem_consume_layer", grid, block, cs, args)));
    EXPECT_TRUE(ok(harness_->record(*end, cs)));
    auto e = harness_->elapsed_ms(*start, *end);
    EXPECT_TRUE(e) << e.error().message();
    return e ? *e : 0;
  };
  unsigned long long iters = 1 << 14;
  double t_ms = time_kernel(*probe_layer, *scratch, iters);
  for (int i = 0; i < 4 && t_ms > 0; ++i) {
    iters = static_cast<unsigned long long>(static_cast<double>(iters) * (2 * copy_ms) / t_ms) + 1;
    t_ms = time_kernel(*probe_layer, *scratch, iters);
  }
  std::cout << fmt::format("layer kernel: {} FMA rounds, {:.3f} ms (target {:.3f} ms)\n", iters, t_ms, 2 * copy_ms);

  // Baseline: every layer resident.
  std::vector<DevicePtr> resident;
  for (std::uint32_t i = 0; i < kLayers; ++i) {
    auto p = harness_->alloc(kLayerBytes);
    ASSERT_TRUE(p) << p.error().message();
    ASSERT_TRUE(ok(harness_->copy_to_device(*p, layers[i].data(), kLayerBytes)));
    resident.push_back(*p);
  }
  auto run_pass = [&](auto&& slot_of, auto&& after, int pass) -> double {
    EXPECT_TRUE(ok(harness_->record(*start, cs)));
    for (std::uint32_t i = 0; i < kLayers; ++i) {
      DevicePtr slot = slot_of(i);
      DevicePtr sum = *sums + sizeof(unsigned long long) * (pass * kLayers + i);
      unsigned long long words = kWords;
      void* args[] = {&slot, &words, &sum, &iters, &*sink};
      EXPECT_TRUE(ok(harness_->launch("tandem_consume_layer", grid, block, cs, args)));
      after(i);
    }
    EXPECT_TRUE(ok(harness_->record(*end, cs)));
    auto e = harness_->elapsed_ms(*start, *end);
    EXPECT_TRUE(e) << e.error().message();
    return e ? *e : 0;
  };
  auto check_sums = [&](const char* what) {
    std::vector<unsigned long long> got(kLayers * kPasses);
    ASSERT_TRUE(ok(harness_->copy_to_host(got.data(), *sums, got.size() * sizeof(unsigned long long))));
    for (int pass = 0; pass < kPasses; ++pass) {
      for (std::uint32_t i = 0; i < kLayers; ++i) {
        EXPECT_EQ(got[pass * kLayers + i], expect[i])
            << what << ": pass " << pass << " layer " << i << " saw another layer's bytes in its slot";
      }
    }
  };
  std::vector<double> resident_ms;
  resident_ms.reserve(kPasses);
  ASSERT_TRUE(ok(harness_->memset_d32(*sums, 0, 2 * kLayers * kPasses)));
  for (int pass = 0; pass < kPasses; ++pass) {
    resident_ms.push_back(run_pass([&](std::uint32_t i) { return resident[i]; }, [](std::uint32_t) {}, pass));
  }
  check_sums("resident");
  for (DevicePtr p : resident) EXPECT_TRUE(ok(harness_->free(p)));

  // Streamed: K slots, the streamer's copy stream refilling behind the kernels.
  std::vector<const void*> host(kLayers);
  for (std::uint32_t i = 0; i < kLayers; ++i) host[i] = layers[i].data();
  LayerStreamerConfig config{.layers = kLayers,
                             .slots = kSlots,
                             .layer_bytes = kLayerBytes,
                             .layer_compute_s = t_ms / 1e3,
                             .link_bytes_per_s = link};
  std::vector<double> streamed_ms;
  streamed_ms.reserve(kPasses);
  {
    auto streamer = LayerStreamer::create(*device_, config, host);
    ASSERT_TRUE(streamer) << streamer.error().message();
    LayerStreamer& ls = **streamer;
    ASSERT_TRUE(ok(device_->stream_synchronize(*compute)));
    ASSERT_TRUE(ok(harness_->memset_d32(*sums, 0, 2 * kLayers * kPasses)));
    for (int pass = 0; pass < kPasses; ++pass) {
      streamed_ms.push_back(run_pass(
          [&](std::uint32_t i) -> DevicePtr {
            auto slot = ls.acquire(i, *compute);
            EXPECT_TRUE(slot) << slot.error().message();
            return slot ? *slot : 0;
          },
          [&](std::uint32_t i) {
            auto released = ls.release(i, *compute);
            EXPECT_TRUE(released) << released.error().message();
          },
          pass));
    }
    check_sums("streamed");
    std::cout << fmt::format("device bytes: {} MiB streamed ({} MiB freed) vs {} MiB resident\n",
                             ls.device_bytes() >> 20, ls.freed_bytes() >> 20, (kLayers * kLayerBytes) >> 20);
    ASSERT_TRUE(ok(device_->stream_synchronize(*compute)));
  }
  const double res_pass = median(resident_ms);
  const double str_pass = median(streamed_ms);
  std::cout << fmt::format(
      "pass of {} layers: resident {:.2f} ms, streamed (K={}) {:.2f} ms, ratio {:.3f} (first pass {:.2f} ms)\n",
      kLayers, res_pass, kSlots, str_pass, res_pass > 0 ? str_pass / res_pass : 0.0, streamed_ms.front());

  EXPECT_TRUE(ok(harness_->free(*sums)));
  EXPECT_TRUE(ok(harness_->free(*sink)));
  EXPECT_TRUE(ok(harness_->free(*scratch)));
  EXPECT_TRUE(ok(harness_->free(*probe_layer)));
  EXPECT_TRUE(ok(harness_->destroy_event(*start)));
  EXPECT_TRUE(ok(harness_->destroy_event(*end)));
  EXPECT_TRUE(ok(device_->destroy_stream(*compute)));
}

}  // namespace
}  // namespace tandem::gpu
