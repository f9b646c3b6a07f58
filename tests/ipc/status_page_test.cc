// StatusPage: snapshots are never torn, even while a writer hammers the page,
// and a stalled writer costs the reader EAGAIN rather than a hang.
#include "ipc/status_page.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "ipc/segment.h"

namespace tandem::ipc {
namespace {

// Every word holds the same value, so a torn read shows as unequal words.
struct Payload {
  std::uint64_t words[8];
};

class StatusPageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const RegionSpec specs[] = {{RegionKind::kStatusPage, sizeof(Payload)}};
    auto seg = ShmSegment::create("status-test", specs);
    ASSERT_TRUE(seg);
    segment_ = std::move(*seg);
    region_ = segment_.region(segment_.layout().regions[0]);
  }
  ShmSegment segment_;
  std::span<std::byte> region_;
};

Payload filled(std::uint64_t v) {
  Payload p;
  for (auto& w : p.words) w = v;
  return p;
}

TEST_F(StatusPageTest, PublishThenRead) {
  auto writer = StatusWriter<Payload>::attach(region_);
  auto reader = StatusReader<Payload>::attach(region_);
  ASSERT_TRUE(writer && reader);
  EXPECT_EQ(reader->sequence(), 0u);
  writer->publish(filled(7));
  auto snap = reader->read();
  ASSERT_TRUE(snap);
  EXPECT_EQ(snap->words[3], 7u);
  EXPECT_EQ(reader->sequence(), 2u);
  EXPECT_EQ(writer->sequence(), 2u);
}

TEST_F(StatusPageTest, ConcurrentReadsAreNeverTorn) {
  auto writer = StatusWriter<Payload>::attach(region_);
  auto reader = StatusReader<Payload>::attach(region_);
  ASSERT_TRUE(writer && reader);
  writer->publish(filled(0));
  std::atomic<bool> stop{false};
  std::thread w([&] {
    for (std::uint64_t v = 1; !stop.load(std::memory_order_relaxed); ++v) writer->publish(filled(v));
  });
  // Make 200,000 read attempts, and go on until the writer has visibly moved
  // 1,000 updates on, however the two threads are scheduled (on a loaded
  // 2-core machine the writer may not run at all for a while), or 20 s pass.
  // Failures end the loop rather than the test, so the writer is always joined.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::uint64_t last = 0;
  int attempts = 0;
  int reads = 0;
  bool torn = false;
  bool backwards = false;
  while ((attempts < 200000 || last < 1000) && std::chrono::steady_clock::now() < deadline) {
    ++attempts;
    auto snap = reader->read(100);
    if (!snap) continue;  // raced the writer 100 times in a row: allowed, just unlucky
    ++reads;
    for (auto word : snap->words) torn = torn || word != snap->words[0];
    backwards = snap->words[0] < last;
    last = snap->words[0];
    if (torn || backwards) break;
  }
  stop = true;
  w.join();
  EXPECT_FALSE(torn) << "torn snapshot";
  EXPECT_FALSE(backwards) << "snapshots go back in time";
  EXPECT_GT(reads, 0);
  EXPECT_GE(last, 1000u) << "the reader saw the writer's progress";
}

TEST_F(StatusPageTest, StalledWriterGivesEagainNotAHang) {
  auto reader = StatusReader<Payload>::attach(region_);
  ASSERT_TRUE(reader);
  // A writer that died mid-update leaves the sequence odd.
  reinterpret_cast<StatusControl*>(region_.data())->seq = 3;
  auto snap = reader->read(50);
  ASSERT_FALSE(snap);
  EXPECT_EQ(snap.error().code(), EAGAIN);
  // A new writer recovers the page: it starts from an even sequence past it.
  auto writer = StatusWriter<Payload>::attach(region_);
  ASSERT_TRUE(writer);
  writer->publish(filled(1));
  EXPECT_TRUE(reader->read());
  EXPECT_EQ(writer->sequence() % 2, 0u);
  EXPECT_GT(writer->sequence(), 3u);
}

TEST_F(StatusPageTest, AttachChecksRegion) {
  EXPECT_FALSE(StatusReader<Payload>::attach(region_.first(100)));
  EXPECT_FALSE(StatusWriter<Payload>::attach(region_.subspan(8)));
}

}  // namespace
}  // namespace tandem::ipc
