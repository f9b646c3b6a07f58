// The layer streamer on the simulated device: slots hold the right layer at
// acquire time, copies wait for the compute that frees their slot, the
// virtual time of a pass matches the Nova bound's arithmetic exactly, misuse
// changes nothing, and teardown leaves nothing behind.
#include "gpu/layer_streamer.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "gpu/cuda_device.h"
#include "gpu/sim_device.h"

namespace tandem::gpu {
namespace {

constexpr std::uint64_t kLayerBytes = 6000;
// With hbm 1 TB/s and no per-SM cap, 1e7 bytes of HBM traffic take exactly
// 10 µs on a plain stream: one layer's compute.
constexpr std::uint64_t kComputeNs = 10'000;
constexpr KernelWork kLayerWork{.flops = 0, .bytes = 1e7};

// A device whose copies of kLayerBytes take `copy_ns`.
std::unique_ptr<SimDevice> device_with_copy_ns(std::uint64_t copy_ns, std::uint64_t memory_bytes = 80ull << 30) {
  auto d = SimDevice::create({.memory_bytes = memory_bytes,
                              .h2d_bytes_per_s = static_cast<double>(kLayerBytes) * 1e9 / static_cast<double>(copy_ns),
                              .hbm_bytes_per_s = 1e12,
                              .bytes_per_sm_per_s = 1e12});
  EXPECT_TRUE(d) << d.error().message();
  EXPECT_EQ((*d)->h2d_copy_ns(kLayerBytes), copy_ns);
  EXPECT_EQ((*d)->kernel_ns(kLayerWork, 132), kComputeNs);
  return std::move(*d);
}

// Distinct bytes per layer: byte j of layer i is (i * 31 + j) mod 251.
std::vector<std::vector<std::byte>> make_layers(std::uint32_t n) {
  std::vector<std::vector<std::byte>> layers(n, std::vector<std::byte>(kLayerBytes));
  for (std::uint32_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < kLayerBytes; ++j) layers[i][j] = static_cast<std::byte>((i * 31 + j) % 251);
  }
  return layers;
}

std::vector<const void*> pointers(const std::vector<std::vector<std::byte>>& layers) {
  std::vector<const void*> out;
  out.reserve(layers.size());
  for (const auto& l : layers) out.push_back(l.data());
  return out;
}

LayerStreamerConfig config(std::uint32_t layers, std::uint32_t slots) {
  return LayerStreamerConfig{.layers = layers,
                             .slots = slots,
                             .layer_bytes = kLayerBytes,
                             .layer_compute_s = static_cast<double>(kComputeNs) * 1e-9,
                             .link_bytes_per_s = 0};
}

bool mentions(const base::Error& e, std::string_view what) { return e.context().find(what) != std::string::npos; }

// One pass: acquire, one kernel, release for every layer, in order. Checks
// each slot's bytes at acquire time against `layers` when given.
void run_pass(SimDevice& d, LayerStreamer& s, StreamId compute,
              const std::vector<std::vector<std::byte>>* layers = nullptr) {
  for (std::uint32_t i = 0; i < s.config().layers; ++i) {
    auto ptr = s.acquire(i, compute);
    ASSERT_TRUE(ptr) << ptr.error().message();
    if (layers != nullptr) {
      auto bytes = d.read_device(*ptr, kLayerBytes);
      ASSERT_TRUE(bytes) << bytes.error().message();
      EXPECT_EQ(*bytes, (*layers)[i]) << "slot at acquire of layer " << i;
    }
    ASSERT_TRUE(d.launch_kernel(compute, kLayerWork));
    auto r = s.release(i, compute);
    ASSERT_TRUE(r) << r.error().message();
  }
}

TEST(CheckBandwidth, NovaBound) {
  // S/T = 6e8 B/s; (L−K)/(L−2) = 5/6 for L = 8, K = 3.
  auto at = check_bandwidth(kLayerBytes, 1e-5, 8, 3, 5e8);
  EXPECT_NEAR(at.required_bytes_per_s, 5e8, 1e-3);
  EXPECT_NEAR(at.back_to_back_bytes_per_s, 6e8, 1e-3);
  EXPECT_TRUE(at.ok);  // exactly at the bound
  EXPECT_EQ(at.slowdown_s_per_pass, 0);

  auto below = check_bandwidth(kLayerBytes, 1e-5, 8, 3, 3e8);
  EXPECT_FALSE(below.ok);
  // 5 copies of 20 µs against a 6 · 10 µs window: 40 µs late.
  EXPECT_NEAR(below.slowdown_s_per_pass, 4e-5, 1e-15);

  // K = 2: the per-pass bound is S/T, the same as back to back.
  auto two = check_bandwidth(kLayerBytes, 1e-5, 8, 2, 6e8);
  EXPECT_NEAR(two.required_bytes_per_s, 6e8, 1e-3);
  EXPECT_TRUE(two.ok);
  EXPECT_FALSE(check_bandwidth(kLayerBytes, 1e-5, 8, 2, 5.9e8).ok);

  // K = L − 1: one copy, hidden behind L − 2 layers.
  auto one = check_bandwidth(kLayerBytes, 1e-5, 8, 7, 1e8);
  EXPECT_NEAR(one.required_bytes_per_s, 1e8, 1e-3);
  EXPECT_TRUE(one.ok);
}

TEST(CheckBandwidth, EdgeCases) {
  // Everything resident: nothing to hide.
  auto resident = check_bandwidth(kLayerBytes, 1e-5, 8, 8, 0);
  EXPECT_TRUE(resident.ok);
  EXPECT_EQ(resident.required_bytes_per_s, 0);
  // No link at all.
  auto none = check_bandwidth(kLayerBytes, 1e-5, 8, 3, 0);
  EXPECT_FALSE(none.ok);
  EXPECT_TRUE(std::isinf(none.slowdown_s_per_pass));
  // Nothing to hide behind, or too few slots or layers to overlap.
  for (auto bw : {check_bandwidth(kLayerBytes, 0, 8, 3, 1e12), check_bandwidth(kLayerBytes, 1e-5, 8, 1, 1e12),
                  check_bandwidth(kLayerBytes, 1e-5, 2, 1, 1e12),
                  check_bandwidth(kLayerBytes, 1e-5, 8, 3, std::numeric_limits<double>::quiet_NaN())}) {
    EXPECT_FALSE(bw.ok);
    EXPECT_TRUE(std::isinf(bw.required_bytes_per_s));
  }
  // Empty layers need no link.
  EXPECT_TRUE(check_bandwidth(0, 1e-5, 8, 3, 0).ok);
}

TEST(LayerStreamer, SlotsHoldTheRightLayerAcrossPasses) {
  auto d = device_with_copy_ns(8'000);
  auto compute = d->create_plain_stream(0).value();
  // L = 7, K = 3: 3 does not divide 7, so slots rotate across passes.
  std::vector<std::vector<std::byte>> expected = make_layers(7);
  std::unique_ptr<LayerStreamer> s;
  {
    auto host = make_layers(7);  // freed before the passes: create() copied it
    auto created = LayerStreamer::create(*d, config(7, 3), pointers(host));
    ASSERT_TRUE(created) << created.error().message();
    s = std::move(*created);
  }
  EXPECT_EQ(s->device_bytes(), 3 * kLayerBytes);
  EXPECT_EQ(s->freed_bytes(), 4 * kLayerBytes);
  EXPECT_EQ(d->device_bytes_in_use(), 3 * kLayerBytes);
  EXPECT_EQ(d->pinned_bytes_in_use(), 7 * kLayerBytes);
  // B 0 took the device's rating.
  EXPECT_EQ(s->config().link_bytes_per_s, d->config().h2d_bytes_per_s);
  for (int pass = 0; pass < 4; ++pass) {
    SCOPED_TRACE(pass);
    run_pass(*d, *s, compute, &expected);
  }
  EXPECT_EQ(s->next_layer(), 0u);
  EXPECT_EQ(s->held(), 0u);
}

TEST(LayerStreamer, CopiesWaitForTheComputeThatFreesTheirSlot) {
  auto d = device_with_copy_ns(8'000);
  auto compute = d->create_plain_stream(0).value();
  auto host = make_layers(7);
  auto s = LayerStreamer::create(*d, config(7, 3), pointers(host)).value();
  for (int pass = 0; pass < 3; ++pass) run_pass(*d, *s, compute);

  std::vector<SimOp> copies;
  std::vector<SimOp> kernels;
  for (const SimOp& op : d->ops()) {
    if (op.kind == SimOp::Kind::kCopyH2D) {
      EXPECT_EQ(op.stream, s->copy_stream());
      copies.push_back(op);
    } else {
      kernels.push_back(op);
    }
  }
  // K prefetches, then one copy per release.
  ASSERT_EQ(kernels.size(), 21u);
  ASSERT_EQ(copies.size(), 3u + 21u);
  for (std::size_t n = 0; n < kernels.size(); ++n) {
    SCOPED_TRACE(n);
    // Kernel n reads the slot copy n filled, after that copy ended.
    EXPECT_GE(kernels[n].start_ns, copies[n].end_ns);
    // Copy n + K overwrites that slot, only after kernel n ended.
    EXPECT_EQ(copies[n + 3].dst, copies[n].dst);
    EXPECT_GE(copies[n + 3].start_ns, kernels[n].end_ns);
  }
}

// From the moment layers 0..K−1 are loaded, a pass of L layers.
std::uint64_t timed_pass(SimDevice& d, LayerStreamer& s, StreamId compute) {
  EXPECT_TRUE(s.synchronize());
  EXPECT_TRUE(d.stream_synchronize(compute));
  std::uint64_t t0 = d.now_ns();
  run_pass(d, s, compute);
  EXPECT_TRUE(d.stream_synchronize(compute));
  return d.now_ns() - t0;
}

TEST(LayerStreamer, AtTheBoundCopiesAreHidden) {
  // L = 8, K = 3: copies of 12 µs = 10 µs · 6/5, exactly the Nova bound.
  auto d = device_with_copy_ns(12'000);
  auto compute = d->create_plain_stream(0).value();
  auto host = make_layers(8);
  auto s = LayerStreamer::create(*d, config(8, 3), pointers(host)).value();
  EXPECT_TRUE(s->bandwidth().ok);
  for (int pass = 0; pass < 3; ++pass) EXPECT_EQ(timed_pass(*d, *s, compute), 8 * kComputeNs) << pass;

  // One nanosecond more per copy and the pass is late by 5 ns.
  auto slower = device_with_copy_ns(12'001);
  auto compute2 = slower->create_plain_stream(0).value();
  auto s2 = LayerStreamer::create(*slower, config(8, 3), pointers(host)).value();
  EXPECT_FALSE(s2->bandwidth().ok);
  EXPECT_EQ(timed_pass(*slower, *s2, compute2), (8 * kComputeNs) + 5);
}

TEST(LayerStreamer, WarnsOnlyWhenTheLinkCannotHideTheCopies) {
  auto host = make_layers(8);
  std::vector<std::string> warnings;
  const WarningSink sink = [&](std::string_view m) { warnings.emplace_back(m); };
  auto fast = device_with_copy_ns(12'000);
  auto s = LayerStreamer::create(*fast, config(8, 3), pointers(host), sink).value();
  EXPECT_TRUE(warnings.empty());
  auto slow = device_with_copy_ns(20'000);
  auto s2 = LayerStreamer::create(*slow, config(8, 3), pointers(host), sink).value();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("each pass will take 0.04 ms longer"), std::string::npos) << warnings[0];
}

TEST(LayerStreamer, BelowTheBoundAPassIsLateByThePredictedSlowdown) {
  // Copies of 20 µs: (L−K)·C − (L−2)·T = 5·20 − 6·10 = 40 µs late.
  auto d = device_with_copy_ns(20'000);
  auto compute = d->create_plain_stream(0).value();
  auto host = make_layers(8);
  auto s = LayerStreamer::create(*d, config(8, 3), pointers(host)).value();
  StreamerBandwidth bw = s->bandwidth();
  ASSERT_FALSE(bw.ok);
  EXPECT_NEAR(bw.slowdown_s_per_pass * 1e9, 40'000, 1e-3);
  for (int pass = 0; pass < 2; ++pass) {
    EXPECT_EQ(timed_pass(*d, *s, compute), (8 * kComputeNs) + 40'000) << pass;
  }
}

TEST(LayerStreamer, BackToBackPassesNeedTheWholeLayerRate) {
  // B = S/T (copies as long as a layer): back-to-back passes stay at L·T.
  {
    auto d = device_with_copy_ns(kComputeNs);
    auto compute = d->create_plain_stream(0).value();
    auto host = make_layers(8);
    auto s = LayerStreamer::create(*d, config(8, 3), pointers(host)).value();
    ASSERT_TRUE(s->synchronize());
    std::uint64_t t0 = d->now_ns();
    for (int pass = 0; pass < 3; ++pass) run_pass(*d, *s, compute);
    ASSERT_TRUE(d->stream_synchronize(compute));
    EXPECT_EQ(d->now_ns() - t0, 3 * 8 * kComputeNs);
  }
  // At the per-pass bound (12 µs copies) a pass alone is hidden (above), but
  // back to back the reload of layers 0..2 falls behind.
  {
    auto d = device_with_copy_ns(12'000);
    auto compute = d->create_plain_stream(0).value();
    auto host = make_layers(8);
    auto s = LayerStreamer::create(*d, config(8, 3), pointers(host)).value();
    ASSERT_TRUE(s->synchronize());
    std::uint64_t t0 = d->now_ns();
    for (int pass = 0; pass < 3; ++pass) run_pass(*d, *s, compute);
    ASSERT_TRUE(d->stream_synchronize(compute));
    EXPECT_GT(d->now_ns() - t0, 3 * 8 * kComputeNs);
  }
}

TEST(LayerStreamer, MisuseIsRefusedAndChangesNothing) {
  auto d = device_with_copy_ns(8'000);
  auto compute = d->create_plain_stream(0).value();
  auto host = make_layers(5);
  auto s = LayerStreamer::create(*d, config(5, 2), pointers(host)).value();
  const std::size_t ops = d->ops().size();

  auto out_of_order = s->acquire(1, compute);
  ASSERT_FALSE(out_of_order);
  EXPECT_EQ(out_of_order.error().code(), EINVAL);
  EXPECT_TRUE(mentions(out_of_order.error(), "acquire layer 1 out of order: layer 0 is next"))
      << out_of_order.error().context();
  auto past = s->acquire(5, compute);
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code(), EINVAL);
  EXPECT_TRUE(mentions(past.error(), "layer 5")) << past.error().context();
  auto unheld = s->release(0, compute);
  ASSERT_FALSE(unheld);
  EXPECT_EQ(unheld.error().code(), EINVAL);
  EXPECT_TRUE(mentions(unheld.error(), "release layer 0 without acquire")) << unheld.error().context();
  auto bad_stream = s->acquire(0, 9999);
  ASSERT_FALSE(bad_stream);
  EXPECT_TRUE(mentions(bad_stream.error(), "CUDA_ERROR_INVALID_HANDLE")) << bad_stream.error().context();
  EXPECT_EQ(s->next_layer(), 0u);
  EXPECT_EQ(s->held(), 0u);

  ASSERT_TRUE(s->acquire(0, compute));
  ASSERT_TRUE(s->acquire(1, compute));  // two held: both slots
  auto full = s->acquire(2, compute);
  ASSERT_FALSE(full);
  EXPECT_TRUE(mentions(full.error(), "all 2 slots are held; release layer 0 first")) << full.error().context();
  auto wrong = s->release(1, compute);
  ASSERT_FALSE(wrong);
  EXPECT_TRUE(mentions(wrong.error(), "release layer 1 out of order: layer 0 is the oldest held"))
      << wrong.error().context();
  auto bad_release_stream = s->release(0, 9999);
  ASSERT_FALSE(bad_release_stream);
  EXPECT_EQ(s->held(), 2u);
  EXPECT_EQ(d->ops().size(), ops);  // no copy was issued by any of it

  ASSERT_TRUE(s->release(0, compute));
  ASSERT_TRUE(s->release(1, compute));
  EXPECT_EQ(s->held(), 0u);
  EXPECT_EQ(s->next_layer(), 2u);
  EXPECT_EQ(d->ops().size(), ops + 2);
}

TEST(LayerStreamer, CreateRejectsBadConfigurationsAndLeavesNothing) {
  auto d = device_with_copy_ns(8'000);
  auto host = make_layers(8);
  auto ptrs = pointers(host);
  const auto rejected = [&](LayerStreamerConfig c, std::span<const void* const> layers, std::string_view what) {
    auto s = LayerStreamer::create(*d, c, layers);
    ASSERT_FALSE(s) << what;
    EXPECT_EQ(s.error().code(), EINVAL) << what;
    EXPECT_TRUE(mentions(s.error(), what)) << s.error().context();
  };
  auto c = config(8, 3);
  rejected({.layers = 2, .slots = 1, .layer_bytes = kLayerBytes, .layer_compute_s = 1e-5}, std::span(ptrs).first(2),
           "layers 2");
  rejected({.layers = 8, .slots = 1, .layer_bytes = kLayerBytes, .layer_compute_s = 1e-5}, ptrs, "slots 1");
  rejected({.layers = 8, .slots = 8, .layer_bytes = kLayerBytes, .layer_compute_s = 1e-5}, ptrs, "slots 8");
  rejected({.layers = 8, .slots = 3, .layer_bytes = 0, .layer_compute_s = 1e-5}, ptrs, "layer_bytes");
  rejected({.layers = 8, .slots = 3, .layer_bytes = kLayerBytes, .layer_compute_s = 0}, ptrs, "layer_compute_s 0");
  rejected({.layers = 8, .slots = 3, .layer_bytes = kLayerBytes, .layer_compute_s = 1e-5, .link_bytes_per_s = -1}, ptrs,
           "link_bytes_per_s -1");
  rejected(c, std::span(ptrs).first(7), "7 host layers given for 8 layers");
  std::vector<const void*> with_null = ptrs;
  with_null[5] = nullptr;
  rejected(c, with_null, "host layer 5 is NULL");
  EXPECT_EQ(d->live_device_allocations(), 0u);
  EXPECT_EQ(d->live_pinned_allocations(), 0u);
  EXPECT_EQ(d->live_events(), 0u);
  EXPECT_EQ(d->live_streams(), 0u);
}

TEST(LayerStreamer, AFailedDeviceCallMidwayReleasesWhatWasMade) {
  // Room for two slots, not three: the third cuMemAlloc fails.
  auto d = device_with_copy_ns(8'000, 2 * kLayerBytes + 100);
  auto host = make_layers(8);
  auto s = LayerStreamer::create(*d, config(8, 3), pointers(host));
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code(), ENOMEM);
  EXPECT_TRUE(mentions(s.error(), "device slot 2")) << s.error().context();
  EXPECT_TRUE(mentions(s.error(), "CUDA_ERROR_OUT_OF_MEMORY")) << s.error().context();
  EXPECT_EQ(d->live_device_allocations(), 0u);
  EXPECT_EQ(d->live_pinned_allocations(), 0u);
  EXPECT_EQ(d->live_events(), 0u);
  EXPECT_EQ(d->live_streams(), 0u);
}

TEST(LayerStreamer, TeardownLeavesNoStreamsEventsOrMemory) {
  auto d = device_with_copy_ns(8'000);
  auto compute = d->create_plain_stream(0).value();
  auto host = make_layers(6);
  {
    auto s = LayerStreamer::create(*d, config(6, 2), pointers(host)).value();
    EXPECT_EQ(d->live_streams(), 2u);
    EXPECT_EQ(d->live_events(), 4u);
    EXPECT_EQ(d->live_device_allocations(), 2u);
    EXPECT_EQ(d->live_pinned_allocations(), 6u);
    // Destroyed mid-pass, with a layer held and copies in flight.
    ASSERT_TRUE(s->acquire(0, compute));
    ASSERT_TRUE(d->launch_kernel(compute, kLayerWork));
    ASSERT_TRUE(s->release(0, compute));
    ASSERT_TRUE(s->acquire(1, compute));
  }
  EXPECT_EQ(d->live_streams(), 1u);  // the test's own compute stream
  EXPECT_EQ(d->live_events(), 0u);
  EXPECT_EQ(d->live_device_allocations(), 0u);
  EXPECT_EQ(d->device_bytes_in_use(), 0u);
  EXPECT_EQ(d->live_pinned_allocations(), 0u);
  EXPECT_EQ(d->pinned_bytes_in_use(), 0u);
}

// The CUDA backend's memory, copy and event calls under the streamer, where a
// GPU is present: passes complete, events report done, teardown frees all.
TEST(LayerStreamer, RunsOnARealDeviceWhenThereIsOne) {
  auto device = open_cuda_device(0);
  if (!device) GTEST_SKIP() << "no CUDA device: " << device.error().message();
  DeviceApi& d = **device;
  auto compute = d.create_plain_stream(0);
  ASSERT_TRUE(compute) << compute.error().message();
  auto host = make_layers(7);
  {
    auto s = LayerStreamer::create(d, config(7, 3), pointers(host));
    ASSERT_TRUE(s) << s.error().message();
    for (int pass = 0; pass < 3; ++pass) {
      for (std::uint32_t i = 0; i < 7; ++i) {
        auto ptr = (*s)->acquire(i, *compute);
        ASSERT_TRUE(ptr) << ptr.error().message();
        EXPECT_NE(*ptr, 0u);
        ASSERT_TRUE((*s)->release(i, *compute));
      }
    }
    auto e = d.create_event().value();
    ASSERT_TRUE(d.record_event(e, *compute));
    ASSERT_TRUE(d.event_synchronize(e));
    EXPECT_TRUE(d.event_done(e).value());
    ASSERT_TRUE(d.destroy_event(e));
    ASSERT_TRUE((*s)->synchronize());
  }
  ASSERT_TRUE(d.stream_synchronize(*compute));
  ASSERT_TRUE(d.destroy_stream(*compute));
}

}  // namespace
}  // namespace tandem::gpu
