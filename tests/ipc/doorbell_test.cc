// Doorbell: no syscall while the consumer is awake, a wake-up when it sleeps,
// no lost wake-up under a racing producer, timeouts, and both directions.
#include "ipc/doorbell.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "ipc/channel.h"

namespace tandem::ipc {
namespace {

using namespace std::chrono_literals;

class DoorbellTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ch = Channel::create(ChannelConfig{64, 64});
    ASSERT_TRUE(ch) << ch.error().message();
    channel_ = std::move(*ch);
  }
  Channel channel_;
};

std::uint64_t eventfd_count(int fd) {
  std::uint64_t v = 0;
  if (::read(fd, &v, sizeof v) < 0) return 0;
  return v;
}

TEST_F(DoorbellTest, AwakeConsumerCostsNoSyscall) {
  Doorbell bell = channel_.event_doorbell();
  auto producer = channel_.event_producer();
  ASSERT_TRUE(producer);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(producer->try_push(Slot{}));
    EXPECT_FALSE(bell.notify()) << "consumer never announced sleep";
  }
  EXPECT_EQ(bell.wakeups_sent(), 0u);
  EXPECT_EQ(eventfd_count(bell.fd()), 0u) << "nothing was written to the eventfd";
}

TEST_F(DoorbellTest, ArmedConsumerGetsExactlyOneWakeupPerSleep) {
  Doorbell consumer_side = channel_.event_doorbell();
  Doorbell producer_side = channel_.event_doorbell();
  consumer_side.arm();
  EXPECT_TRUE(producer_side.notify());
  EXPECT_FALSE(producer_side.notify()) << "a burst rings once";
  EXPECT_EQ(eventfd_count(producer_side.fd()), 1u);
  consumer_side.disarm();
  EXPECT_FALSE(producer_side.notify());
}

TEST_F(DoorbellTest, AWatermarkWakesOnlyOnceThatManyRecordsWait) {
  Doorbell consumer_side = channel_.event_doorbell();
  Doorbell producer_side = channel_.event_doorbell();
  auto producer = channel_.event_producer();
  ASSERT_TRUE(producer);
  consumer_side.arm(4);
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(producer->try_push(Slot{}));
    EXPECT_FALSE(producer_side.notify_if([&] { return producer->in_flight(); })) << i << " records, watermark 4";
  }
  EXPECT_EQ(eventfd_count(producer_side.fd()), 0u);
  ASSERT_TRUE(producer->try_push(Slot{}));
  EXPECT_TRUE(producer_side.notify_if([&] { return producer->in_flight(); }));
  EXPECT_FALSE(producer_side.notify_if([&] { return producer->in_flight(); })) << "rings once per sleep";
  EXPECT_EQ(eventfd_count(producer_side.fd()), 1u);
  // A plain notify() ignores the watermark: the ring is full, say.
  consumer_side.arm(1000);
  EXPECT_TRUE(producer_side.notify());
}

TEST_F(DoorbellTest, WaitReturnsImmediatelyWhenWorkIsThere) {
  Doorbell bell = channel_.event_doorbell();
  auto r = bell.wait([] { return true; }, 1s);
  ASSERT_TRUE(r);
  EXPECT_TRUE(*r);
  EXPECT_EQ(bell.sleeps(), 0u);
}

TEST_F(DoorbellTest, WaitTimesOut) {
  Doorbell bell = channel_.event_doorbell();
  auto start = std::chrono::steady_clock::now();
  auto r = bell.wait([] { return false; }, 30ms, 0);
  ASSERT_TRUE(r);
  EXPECT_FALSE(*r);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 30ms);
  EXPECT_GE(bell.sleeps(), 1u);
}

// A sleeping consumer is woken by a producer in another thread, in both ring
// directions, thousands of times; a lost wake-up would hang until the
// (generous) timeout and fail the test.
void ping_pong(Channel& ch, bool events_direction) {
  auto producer = events_direction ? ch.event_producer() : ch.directive_producer();
  auto consumer = events_direction ? ch.event_consumer() : ch.directive_consumer();
  ASSERT_TRUE(producer && consumer);
  Doorbell send_bell = events_direction ? ch.event_doorbell() : ch.directive_doorbell();
  Doorbell wait_bell = send_bell;
  constexpr int kMessages = 5000;

  std::atomic<bool> failed{false};
  std::thread sender([&] {
    for (int i = 0; i < kMessages; ++i) {
      Slot s{};
      s.words[0] = static_cast<std::uint64_t>(i);
      while (!producer->try_push(s)) {
        if (failed) return;
        std::this_thread::yield();
      }
      send_bell.notify();
      if (i % 64 == 0) std::this_thread::sleep_for(50us);  // let the consumer fall asleep
    }
  });
  for (int i = 0; i < kMessages; ++i) {
    auto ready = wait_bell.wait([&] { return !consumer->empty(); }, 10s, 16);
    if (!ready || !*ready) {
      failed = true;
      break;
    }
    Slot s;
    if (!consumer->try_pop(s) || s.words[0] != static_cast<std::uint64_t>(i)) {
      ADD_FAILURE() << "record " << i << " missing or out of order";
      failed = true;
      break;
    }
  }
  sender.join();
  EXPECT_FALSE(failed) << "consumer timed out: lost wake-up";
  EXPECT_GT(wait_bell.sleeps(), 0u) << "the test must exercise the sleeping path";
  EXPECT_GT(send_bell.wakeups_sent(), 0u);
}

TEST_F(DoorbellTest, NoLostWakeupClientToDaemon) { ping_pong(channel_, true); }
TEST_F(DoorbellTest, NoLostWakeupDaemonToClient) { ping_pong(channel_, false); }

}  // namespace
}  // namespace tandem::ipc
