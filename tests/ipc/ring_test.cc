// SpscRing in one process: order, capacity, wrap-around, batching, attach
// checks, and the hardening against a peer that writes impossible indices.
#include "ipc/spsc_ring.h"

#include <atomic>
#include <vector>

#include <gtest/gtest.h>

#include "ipc/segment.h"

namespace tandem::ipc {
namespace {

Slot slot_with(std::uint64_t v) {
  Slot s{};
  for (auto& w : s.words) w = v;
  return s;
}

class RingTest : public ::testing::Test {
 protected:
  static constexpr std::uint32_t kSlots = 8;

  void SetUp() override {
    const RegionSpec specs[] = {{RegionKind::kEventRing, kSlots}};
    auto seg = ShmSegment::create("ring-test", specs);
    ASSERT_TRUE(seg);
    segment_ = std::move(*seg);
    region_ = segment_.region(segment_.layout().regions[0]);
    control_ = reinterpret_cast<RingControl*>(region_.data());
  }

  void attach_both() {
    auto p = RingProducer::attach(region_, kSlots);
    auto c = RingConsumer::attach(region_, kSlots);
    ASSERT_TRUE(p && c);
    producer_ = *p;
    consumer_ = *c;
  }

  ShmSegment segment_;
  std::span<std::byte> region_;
  RingControl* control_ = nullptr;
  RingProducer producer_;
  RingConsumer consumer_;
};

TEST_F(RingTest, FifoUntilFullThenEmpty) {
  attach_both();
  Slot out;
  EXPECT_FALSE(consumer_.try_pop(out));
  for (std::uint64_t i = 0; i < kSlots; ++i) EXPECT_TRUE(producer_.try_push(slot_with(i)));
  EXPECT_FALSE(producer_.try_push(slot_with(99))) << "ring holds exactly capacity records";
  EXPECT_EQ(consumer_.available(), kSlots);
  EXPECT_EQ(producer_.in_flight(), kSlots);
  for (std::uint64_t i = 0; i < kSlots; ++i) {
    ASSERT_TRUE(consumer_.try_pop(out));
    EXPECT_EQ(out.words[0], i);
    EXPECT_EQ(out.words[7], i);
  }
  EXPECT_FALSE(consumer_.try_pop(out));
  EXPECT_TRUE(producer_.try_push(slot_with(100))) << "popped slots are reusable";
  EXPECT_EQ(producer_.corruption_count(), 0u);
  EXPECT_EQ(consumer_.corruption_count(), 0u);
}

TEST_F(RingTest, IndicesWrapAroundU32) {
  // Start both indices just below 2^32 so the run crosses the wrap.
  control_->tail = control_->head = 0xFFFFFFFFu - 3;
  attach_both();
  Slot out;
  for (std::uint64_t round = 0; round < 5; ++round) {
    for (std::uint64_t i = 0; i < kSlots; ++i) ASSERT_TRUE(producer_.try_push(slot_with(round * 100 + i)));
    for (std::uint64_t i = 0; i < kSlots; ++i) {
      ASSERT_TRUE(consumer_.try_pop(out));
      ASSERT_EQ(out.words[0], round * 100 + i);
    }
  }
  EXPECT_LT(control_->tail, 100u) << "tail wrapped";
  EXPECT_EQ(consumer_.corruption_count(), 0u);
}

TEST_F(RingTest, BatchesArePartialWhenSpaceIsShort) {
  attach_both();
  std::vector<Slot> in;
  in.reserve(12);
  for (std::uint64_t i = 0; i < 12; ++i) in.push_back(slot_with(i));
  EXPECT_EQ(producer_.push_batch(in), kSlots);
  EXPECT_EQ(producer_.push_batch(in), 0u);

  std::vector<Slot> out(5);
  EXPECT_EQ(consumer_.pop_batch(out), 5u);
  EXPECT_EQ(out[4].words[0], 4u);
  EXPECT_EQ(producer_.push_batch(std::span(in).subspan(8)), 4u) << "4 of 5 freed slots reused";
  std::vector<Slot> rest(20);
  ASSERT_EQ(consumer_.pop_batch(rest), 7u);
  EXPECT_EQ(rest[2].words[0], 7u);
  EXPECT_EQ(rest[3].words[0], 8u);
  EXPECT_EQ(rest[6].words[0], 11u);
}

TEST_F(RingTest, AttachRejectsBadGeometry) {
  EXPECT_EQ(RingProducer::attach(region_, 6).error().code(), EINVAL);
  EXPECT_EQ(RingConsumer::attach(region_, 1).error().code(), EINVAL);
  EXPECT_EQ(RingConsumer::attach(region_, kSlots * 2).error().code(), EINVAL) << "region too small";
  EXPECT_EQ(RingConsumer::attach(region_.subspan(64), kSlots / 2).error().code(), EINVAL) << "misaligned";
}

TEST_F(RingTest, ProducerAttachRejectsInconsistentIndices) {
  control_->head = 5;
  control_->tail = 5 + kSlots + 1;
  auto p = RingProducer::attach(region_, kSlots);
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().message().find("inconsistent"), std::string::npos);
}

TEST_F(RingTest, AForgedTailIsOnlyAClampedHint) {
  attach_both();
  // A hostile producer claims 1000 records in an 8-slot ring.
  std::atomic_ref<std::uint32_t>(control_->tail).store(1000);
  EXPECT_EQ(consumer_.available(), kSlots) << "the hint is clamped to capacity";
  EXPECT_GE(consumer_.corruption_count(), 1u);
  std::vector<Slot> out(64);
  EXPECT_EQ(consumer_.pop_batch(out), 0u) << "no slot carries a turn, so nothing is ready";
  EXPECT_TRUE(consumer_.empty());
}

TEST_F(RingTest, ATailBehindHeadIsCountedAndClamped) {
  attach_both();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(producer_.try_push(slot_with(i)));
  Slot out;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(consumer_.try_pop(out));
  // Tail moved backwards: tail - head wraps to ~4 billion.
  std::atomic_ref<std::uint32_t>(control_->tail).store(1);
  EXPECT_EQ(consumer_.available(), kSlots);
  EXPECT_GE(consumer_.corruption_count(), 1u);
  EXPECT_FALSE(consumer_.try_pop(out));
}

TEST_F(RingTest, ForgedTurnsAreCountedAndNotRead) {
  attach_both();
  Slot* slots = reinterpret_cast<Slot*>(region_.data() + sizeof(RingControl));
  // Slot 0 should hold turn 1 once written; 7 is neither that, nor untouched
  // (0), nor the previous lap's turn.
  std::atomic_ref<std::uint64_t>(slots[0].words[0]).store(std::uint64_t{7} << 32);
  Slot out;
  EXPECT_FALSE(consumer_.try_pop(out));
  EXPECT_FALSE(consumer_.try_pop(out));
  EXPECT_EQ(consumer_.corruption_count(), 1u) << "counted once per position, however often we spin";
  // The real record replaces the garbage and is read normally.
  ASSERT_TRUE(producer_.try_push(slot_with(5)));
  ASSERT_TRUE(consumer_.try_pop(out));
  EXPECT_EQ(out.words[1], 5u);
}

TEST_F(RingTest, RingSequenceBitsAreClearedOnPop) {
  attach_both();
  Slot in = slot_with(0);
  in.words[0] = 0xAAAAAAAA'12345678ull;  // the record tries to set the ring's bits
  ASSERT_TRUE(producer_.try_push(in));
  Slot out;
  ASSERT_TRUE(consumer_.try_pop(out));
  EXPECT_EQ(out.words[0], 0x12345678ull) << "record bits kept, ring bits cleared";
}

TEST_F(RingTest, HeadIsPublishedWhenCaughtUpOrEveryQuarterRing) {
  attach_both();
  auto shared_head = [&] { return std::atomic_ref<std::uint32_t>(control_->head).load(); };
  for (std::uint64_t i = 0; i < kSlots; ++i) ASSERT_TRUE(producer_.try_push(slot_with(i)));
  Slot out;
  ASSERT_TRUE(consumer_.try_pop(out));
  EXPECT_EQ(shared_head(), 0u) << "one pop is not worth a shared store";
  ASSERT_TRUE(consumer_.try_pop(out));
  EXPECT_EQ(shared_head(), 2u) << "capacity/4 = 2 pops publish";
  ASSERT_TRUE(consumer_.try_pop(out));
  EXPECT_EQ(shared_head(), 2u);
  std::vector<Slot> rest(2);
  EXPECT_EQ(consumer_.pop_batch(rest), 2u);
  EXPECT_EQ(shared_head(), 5u) << "a batch always publishes";
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(consumer_.try_pop(out));
  EXPECT_EQ(shared_head(), 7u) << "5 + 2";
  EXPECT_FALSE(consumer_.try_pop(out));
  EXPECT_EQ(shared_head(), 8u) << "finding the ring empty publishes";
}

TEST_F(RingTest, ProducerTreatsAnImpossibleHeadAsFull) {
  attach_both();
  for (std::uint64_t i = 0; i < kSlots; ++i) ASSERT_TRUE(producer_.try_push(slot_with(i)));
  // A hostile consumer claims to have consumed records that were never written.
  std::atomic_ref<std::uint32_t>(control_->head).store(kSlots + 50);
  Slot guard = slot_with(0xdead);
  EXPECT_FALSE(producer_.try_push(guard));
  EXPECT_EQ(producer_.push_batch(std::span(&guard, 1)), 0u);
  EXPECT_GE(producer_.corruption_count(), 1u);
  // Nothing was overwritten: a well-behaved consumer still sees the originals.
  std::atomic_ref<std::uint32_t>(control_->head).store(0);
  auto fresh = RingConsumer::attach(region_, kSlots);
  ASSERT_TRUE(fresh);
  Slot out;
  ASSERT_TRUE(fresh->try_pop(out));
  EXPECT_EQ(out.words[0], 0u);
}

}  // namespace
}  // namespace tandem::ipc
