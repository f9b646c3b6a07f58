// Channel: daemon and client ends over one segment; EventSender never loses
// silently and keeps order through its overflow queue.
#include "ipc/channel.h"

#include <fcntl.h>

#include <gtest/gtest.h>

namespace tandem::ipc {
namespace {

base::UniqueFd dup_fd(int fd) { return base::UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

struct Pair {
  Channel daemon;
  Channel client;
};

Pair make_pair(ChannelConfig config = {}) {
  auto d = Channel::create(config);
  EXPECT_TRUE(d) << d.error().message();
  auto c = Channel::attach(dup_fd(d->segment_fd()), dup_fd(d->event_bell_fd()), dup_fd(d->directive_bell_fd()));
  EXPECT_TRUE(c) << c.error().message();
  return Pair{std::move(*d), std::move(*c)};
}

Slot numbered(std::uint64_t n) {
  RoundEnd r;
  r.header.session = 1;
  r.round = static_cast<std::uint32_t>(n);
  return encode(r);
}

std::uint32_t round_of(const Slot& s) { return std::bit_cast<RoundEnd>(s).round; }

TEST(Channel, BothDirectionsAndStatus) {
  Pair p = make_pair();
  EXPECT_EQ(p.client.event_slots(), 4096u);
  EXPECT_EQ(p.client.directive_slots(), 1024u);

  auto up_tx = p.client.event_producer();
  auto up_rx = p.daemon.event_consumer();
  auto down_tx = p.daemon.directive_producer();
  auto down_rx = p.client.directive_consumer();
  auto status_tx = p.daemon.status_writer();
  auto status_rx = p.client.status_reader();
  ASSERT_TRUE(up_tx && up_rx && down_tx && down_rx && status_tx && status_rx);

  ASSERT_TRUE(up_tx->try_push(numbered(5)));
  Slot s;
  ASSERT_TRUE(up_rx->try_pop(s));
  EXPECT_EQ(round_of(s), 5u);

  Admit admit;
  admit.header.session = 9;
  ASSERT_TRUE(down_tx->try_push(encode(admit)));
  ASSERT_TRUE(down_rx->try_pop(s));
  RecordDecoder decoder(Direction::kToClient);
  Record rec;
  ASSERT_EQ(decoder.decode(s, rec), DecodeStatus::kOk);
  EXPECT_EQ(rec.type(), RecordType::kAdmit);
  EXPECT_EQ(rec.session(), 9u);

  EngineStatus st;
  st.admission_window = 12;
  st.sm_partition = 2;
  status_tx->publish(st);
  auto seen = status_rx->read();
  ASSERT_TRUE(seen);
  EXPECT_EQ(seen->admission_window, 12u);
  EXPECT_EQ(seen->sm_partition, 2u);
}

TEST(Channel, AttachNeedsAllFds) {
  auto d = Channel::create({});
  ASSERT_TRUE(d);
  auto c = Channel::attach(dup_fd(d->segment_fd()), base::UniqueFd(), dup_fd(d->directive_bell_fd()));
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), EBADF);
}

TEST(Channel, AttachRejectsASegmentWithoutTheChannelRegions) {
  const RegionSpec only_ring[] = {{RegionKind::kEventRing, 64}};
  auto seg = ShmSegment::create("not-a-channel", only_ring);
  ASSERT_TRUE(seg);
  auto bell = make_doorbell_fd();
  auto bell2 = make_doorbell_fd();
  ASSERT_TRUE(bell && bell2);
  auto c = Channel::attach(dup_fd(seg->fd()), std::move(*bell), std::move(*bell2));
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message().find("lacks"), std::string::npos);
}

TEST(Channel, CreateRejectsBadSizes) {
  auto c = Channel::create(ChannelConfig{100, 64});
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message().find("power of two"), std::string::npos);
}

TEST(EventSender, OverflowKeepsOrderThenFlagsResync) {
  Pair p = make_pair(ChannelConfig{4, 4});
  auto tx = p.client.event_producer();
  auto rx = p.daemon.event_consumer();
  ASSERT_TRUE(tx && rx);
  EventSender sender(*tx, p.client.event_doorbell(), &p.client.segment(), /*overflow_capacity=*/3);

  for (std::uint64_t i = 0; i < 7; ++i) EXPECT_TRUE(sender.send(numbered(i))) << i;  // 4 in ring, 3 queued
  EXPECT_EQ(sender.overflowed(), 3u);
  EXPECT_EQ(p.daemon.segment().take_flags(kFlagResyncNeeded), 0u) << "nothing lost yet";

  EXPECT_FALSE(sender.send(numbered(7))) << "ring and overflow full: dropped";
  EXPECT_EQ(sender.dropped(), 1u);
  EXPECT_EQ(p.daemon.segment().take_flags(kFlagResyncNeeded), kFlagResyncNeeded);

  // The daemon drains; the sender refills in order, newest last.
  std::vector<std::uint32_t> seen;
  Slot s;
  while (rx->try_pop(s)) seen.push_back(round_of(s));
  sender.flush();
  EXPECT_TRUE(sender.send(numbered(8)));
  while (rx->try_pop(s)) seen.push_back(round_of(s));
  EXPECT_EQ(seen, (std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5, 6, 8}));
  EXPECT_EQ(sender.overflowed(), 0u);
}

}  // namespace
}  // namespace tandem::ipc
