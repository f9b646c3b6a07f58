// The layer streamer's C ABI (tandem_gpu.h), through libtandem.so on the
// simulated device: create, the acquire/release protocol over the pool's
// native streams, info, and the errors and their messages.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "tandem/tandem_gpu.h"

namespace {

constexpr std::uint64_t kLayerBytes = 4096;

class StreamerApi : public ::testing::Test {
 protected:
  void SetUp() override {
    tandem_gpu_options o{};
    o.sz = sizeof o;
    o.backend = "sim";
    ASSERT_EQ(tandem_gpu_open(nullptr, &o, &gpu_), 0) << tandem_gpu_last_error(nullptr);
    std::uint32_t decode = 0;
    ASSERT_EQ(tandem_gpu_stage(gpu_, "decode", &decode), 0) << tandem_gpu_last_error(gpu_);
    ASSERT_EQ(tandem_gpu_stream(gpu_, decode, &stream_), 0) << tandem_gpu_last_error(gpu_);
    ASSERT_NE(stream_, nullptr);
    for (std::uint32_t i = 0; i < 8; ++i) host_.emplace_back(kLayerBytes, static_cast<unsigned char>(i));
    for (const auto& h : host_) ptrs_.push_back(h.data());
  }
  void TearDown() override { tandem_gpu_close(gpu_); }

  tandem_streamer_options options(std::uint32_t layers, std::uint32_t slots) const {
    tandem_streamer_options o{};
    o.sz = sizeof o;
    o.layers = layers;
    o.slots = slots;
    o.layer_bytes = kLayerBytes;
    o.layer_compute_us = 100;
    o.link_bytes_per_s = 0;  // the device's rating
    return o;
  }
  std::string error() const { return tandem_gpu_last_error(gpu_); }

  tandem_gpu* gpu_ = nullptr;
  void* stream_ = nullptr;
  std::vector<std::vector<unsigned char>> host_;
  std::vector<const void*> ptrs_;
};

TEST_F(StreamerApi, RunsPassesOverThePoolsStreams) {
  auto o = options(8, 3);
  tandem_layer_streamer* s = nullptr;
  ASSERT_EQ(tandem_streamer_create(gpu_, &o, ptrs_.data(), &s), 0) << error();
  ASSERT_NE(s, nullptr);

  tandem_streamer_info info{};
  info.sz = sizeof info;
  ASSERT_EQ(tandem_streamer_info_get(s, &info), 0) << error();
  EXPECT_EQ(info.sz, sizeof info);
  EXPECT_EQ(info.layers, 8u);
  EXPECT_EQ(info.slots, 3u);
  EXPECT_EQ(info.device_bytes, 3 * kLayerBytes);
  EXPECT_EQ(info.freed_bytes, 5 * kLayerBytes);
  EXPECT_GT(info.link_bytes_per_s, 0);  // the sim's rated H2D bandwidth
  // S/T = 4096 B / 100 µs = 40.96 MB/s, times 5/6.
  EXPECT_NEAR(info.required_bytes_per_s, 40.96e6 * 5 / 6, 1);
  EXPECT_NEAR(info.back_to_back_bytes_per_s, 40.96e6, 1);
  EXPECT_EQ(info.hidden, 1u);
  EXPECT_EQ(info.slowdown_s_per_pass, 0);

  std::set<std::uint64_t> slots;
  std::vector<std::uint64_t> first_pass;
  for (int pass = 0; pass < 3; ++pass) {
    for (std::uint32_t i = 0; i < 8; ++i) {
      std::uint64_t ptr = 0;
      ASSERT_EQ(tandem_streamer_acquire(s, i, stream_, &ptr), 0) << error();
      EXPECT_NE(ptr, 0u);
      slots.insert(ptr);
      if (pass == 0) first_pass.push_back(ptr);
      ASSERT_EQ(tandem_streamer_release(s, i, stream_), 0) << error();
    }
  }
  EXPECT_EQ(slots.size(), 3u);  // K slots, reused
  // Slots rotate in acquisition order: 8 layers over 3 slots.
  for (std::size_t n = 3; n < first_pass.size(); ++n) EXPECT_EQ(first_pass[n], first_pass[n - 3]);
  ASSERT_EQ(tandem_streamer_info_get(s, &info), 0);
  EXPECT_EQ(info.next_layer, 0u);
  tandem_streamer_destroy(s);
  tandem_streamer_destroy(nullptr);
}

TEST_F(StreamerApi, ReportsASlowLink) {
  auto o = options(8, 3);
  o.link_bytes_per_s = 20e6;  // below 34.13 MB/s
  tandem_layer_streamer* s = nullptr;
  ASSERT_EQ(tandem_streamer_create(gpu_, &o, ptrs_.data(), &s), 0) << error();
  tandem_streamer_info info{};
  info.sz = sizeof info;
  ASSERT_EQ(tandem_streamer_info_get(s, &info), 0);
  EXPECT_EQ(info.hidden, 0u);
  EXPECT_EQ(info.link_bytes_per_s, 20e6);
  // 5 · 4096 / 20e6 − 6 · 100e-6 = 424 µs.
  EXPECT_NEAR(info.slowdown_s_per_pass, 5 * 4096 / 20e6 - 600e-6, 1e-12);

  // An older caller's shorter struct gets what fits.
  tandem_streamer_info short_info{};
  short_info.sz = offsetof(tandem_streamer_info, freed_bytes);
  ASSERT_EQ(tandem_streamer_info_get(s, &short_info), 0);
  EXPECT_EQ(short_info.sz, offsetof(tandem_streamer_info, freed_bytes));
  EXPECT_EQ(short_info.device_bytes, 3 * kLayerBytes);
  EXPECT_EQ(short_info.freed_bytes, 0u);  // not written
  tandem_streamer_destroy(s);
}

TEST_F(StreamerApi, CreateErrorsNameTheField) {
  tandem_layer_streamer* s = nullptr;
  auto o = options(8, 3);
  EXPECT_EQ(tandem_streamer_create(nullptr, &o, ptrs_.data(), &s), -EINVAL);
  EXPECT_EQ(tandem_streamer_create(gpu_, nullptr, ptrs_.data(), &s), -EINVAL);
  EXPECT_NE(error().find("options is NULL"), std::string::npos) << error();
  EXPECT_EQ(tandem_streamer_create(gpu_, &o, nullptr, &s), -EINVAL);
  EXPECT_NE(error().find("host_layers is NULL"), std::string::npos) << error();
  EXPECT_EQ(tandem_streamer_create(gpu_, &o, ptrs_.data(), nullptr), -EINVAL);

  auto small = o;
  small.sz = sizeof(std::size_t);
  EXPECT_EQ(tandem_streamer_create(gpu_, &small, ptrs_.data(), &s), -EINVAL);
  EXPECT_NE(error().find("options->sz"), std::string::npos) << error();
  auto slots = options(8, 8);
  EXPECT_EQ(tandem_streamer_create(gpu_, &slots, ptrs_.data(), &s), -EINVAL);
  EXPECT_NE(error().find("slots 8 must be in 2..7"), std::string::npos) << error();
  auto no_time = options(8, 3);
  no_time.layer_compute_us = 0;
  EXPECT_EQ(tandem_streamer_create(gpu_, &no_time, ptrs_.data(), &s), -EINVAL);
  EXPECT_NE(error().find("layer_compute_us"), std::string::npos) << error();
  auto reserved = options(8, 3);
  reserved.reserved = 1;
  EXPECT_EQ(tandem_streamer_create(gpu_, &reserved, ptrs_.data(), &s), -EINVAL);
  std::vector<const void*> with_null = ptrs_;
  with_null[2] = nullptr;
  EXPECT_EQ(tandem_streamer_create(gpu_, &o, with_null.data(), &s), -EINVAL);
  EXPECT_NE(error().find("host layer 2 is NULL"), std::string::npos) << error();
  EXPECT_EQ(s, nullptr);  // never written on failure
}

TEST_F(StreamerApi, ProtocolErrorsChangeNothing) {
  auto o = options(5, 2);
  tandem_layer_streamer* s = nullptr;
  ASSERT_EQ(tandem_streamer_create(gpu_, &o, ptrs_.data(), &s), 0) << error();
  std::uint64_t ptr = 7;
  EXPECT_EQ(tandem_streamer_acquire(s, 1, stream_, &ptr), -EINVAL);
  EXPECT_NE(error().find("acquire layer 1 out of order: layer 0 is next"), std::string::npos) << error();
  EXPECT_EQ(ptr, 7u);  // untouched on failure
  EXPECT_EQ(tandem_streamer_acquire(s, 0, nullptr, &ptr), -EINVAL);
  EXPECT_NE(error().find("stream is NULL"), std::string::npos) << error();
  int not_a_stream = 0;
  EXPECT_EQ(tandem_streamer_acquire(s, 0, &not_a_stream, &ptr), -EINVAL);
  EXPECT_NE(error().find("not a live stream of this tandem_gpu"), std::string::npos) << error();
  EXPECT_EQ(tandem_streamer_acquire(s, 0, stream_, nullptr), -EINVAL);
  EXPECT_EQ(tandem_streamer_release(s, 0, stream_), -EINVAL);
  EXPECT_NE(error().find("release layer 0 without acquire"), std::string::npos) << error();
  EXPECT_EQ(tandem_streamer_acquire(s, 9, stream_, &ptr), -EINVAL);
  EXPECT_NE(error().find("layer 9"), std::string::npos) << error();

  tandem_streamer_info info{};
  info.sz = sizeof info;
  ASSERT_EQ(tandem_streamer_info_get(s, &info), 0);
  EXPECT_EQ(info.next_layer, 0u);
  ASSERT_EQ(tandem_streamer_acquire(s, 0, stream_, &ptr), 0) << error();
  EXPECT_NE(ptr, 7u);
  ASSERT_EQ(tandem_streamer_release(s, 0, stream_), 0) << error();
  EXPECT_EQ(tandem_streamer_info_get(nullptr, &info), -EINVAL);
  EXPECT_EQ(tandem_streamer_info_get(s, nullptr), -EINVAL);
  tandem_streamer_destroy(s);
}

}  // namespace
