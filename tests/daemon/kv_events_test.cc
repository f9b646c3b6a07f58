// KV events for routers (daemon/kv_events.h): the msgpack encoding, decoded
// here with msgpack-c (an independent decoder) against vLLM's array_like
// layout; the batch's joining and bounds; the ZMQ message a subscriber gets.
#include "daemon/kv_events.h"

#include <msgpack.h>
#include <zmq.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tandem::daemon {
namespace {

using ::testing::HasSubstr;

// A decoded payload, freed with the test.
class Unpacked {
 public:
  // Strings of the decoded objects point into `bytes_`, which it keeps.
  explicit Unpacked(std::string bytes) : bytes_(std::move(bytes)) {
    msgpack_unpacked_init(&u_);
    std::size_t off = 0;
    ok_ =
        msgpack_unpack_next(&u_, bytes_.data(), bytes_.size(), &off) == MSGPACK_UNPACK_SUCCESS && off == bytes_.size();
  }
  ~Unpacked() { msgpack_unpacked_destroy(&u_); }
  Unpacked(const Unpacked&) = delete;
  Unpacked& operator=(const Unpacked&) = delete;
  bool ok() const { return ok_; }
  const msgpack_object& root() const { return u_.data; }

 private:
  std::string bytes_;
  msgpack_unpacked u_;
  bool ok_ = false;
};

const msgpack_object& at(const msgpack_object& o, std::uint32_t i) {
  EXPECT_EQ(o.type, MSGPACK_OBJECT_ARRAY);
  EXPECT_LT(i, o.via.array.size);
  return o.via.array.ptr[i];
}
std::string str(const msgpack_object& o) {
  EXPECT_EQ(o.type, MSGPACK_OBJECT_STR);
  return o.type == MSGPACK_OBJECT_STR ? std::string(o.via.str.ptr, o.via.str.size) : std::string();
}
std::vector<std::uint64_t> uints(const msgpack_object& o) {
  std::vector<std::uint64_t> out;
  for (std::uint32_t i = 0; i < o.via.array.size; ++i) {
    EXPECT_EQ(o.via.array.ptr[i].type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    out.push_back(o.via.array.ptr[i].via.u64);
  }
  return out;
}

ipc::KvBlocks record(ipc::KvBlocksOp op, std::vector<std::uint64_t> hashes, std::optional<std::uint64_t> parent = {},
                     ipc::KvMedium medium = ipc::KvMedium::kGpu) {
  ipc::KvBlocks r;
  r.op = static_cast<std::uint8_t>(op);
  r.medium = static_cast<std::uint8_t>(medium);
  r.count = static_cast<std::uint8_t>(hashes.size());
  r.block_size = op == ipc::KvBlocksOp::kStored ? 16 : 0;
  for (std::size_t i = 0; i < hashes.size(); ++i) r.hashes[i] = hashes[i];
  if (parent) {
    r.header.flags = ipc::kKvBlocksHasParent;
    r.parent = *parent;
  }
  return r;
}

TEST(KvEvents, BatchIsVllmsArrayLikeLayout) {
  std::vector<KvBlockEvent> events(3);
  events[0].op = ipc::KvBlocksOp::kStored;
  events[0].hashes = {1, 300, 0xfedcba9876543210ull};
  events[0].block_size = 16;
  events[1].op = ipc::KvBlocksOp::kStored;
  events[1].medium = ipc::KvMedium::kCpu;
  events[1].parent = 70000;
  events[1].hashes = {5};
  events[1].block_size = 32;
  events[2].op = ipc::KvBlocksOp::kRemoved;
  events[2].hashes = std::vector<std::uint64_t>(40, 9);  // past fixarray's 15
  const Unpacked u(encode_kv_batch(1700000000.25, events));
  ASSERT_TRUE(u.ok());
  const msgpack_object& batch = u.root();
  ASSERT_EQ(batch.type, MSGPACK_OBJECT_ARRAY);
  ASSERT_EQ(batch.via.array.size, 2u) << "[ts, events]: data_parallel_rank left out";
  ASSERT_EQ(at(batch, 0).type, MSGPACK_OBJECT_FLOAT64);
  EXPECT_EQ(at(batch, 0).via.f64, 1700000000.25);
  const msgpack_object& list = at(batch, 1);
  ASSERT_EQ(list.via.array.size, 3u);

  const msgpack_object& stored = at(list, 0);
  ASSERT_EQ(stored.via.array.size, 8u);
  EXPECT_EQ(str(at(stored, 0)), "BlockStored");
  EXPECT_EQ(uints(at(stored, 1)), (std::vector<std::uint64_t>{1, 300, 0xfedcba9876543210ull}));
  EXPECT_EQ(at(stored, 2).type, MSGPACK_OBJECT_NIL) << "no parent";
  EXPECT_EQ(at(stored, 3).via.array.size, 0u) << "token_ids";
  EXPECT_EQ(at(stored, 4).via.u64, 16u);
  EXPECT_EQ(at(stored, 5).type, MSGPACK_OBJECT_NIL) << "lora_id";
  EXPECT_EQ(str(at(stored, 6)), "GPU");
  EXPECT_EQ(at(stored, 7).type, MSGPACK_OBJECT_NIL) << "lora_name";

  const msgpack_object& cpu = at(list, 1);
  EXPECT_EQ(at(cpu, 2).via.u64, 70000u);
  EXPECT_EQ(at(cpu, 4).via.u64, 32u);
  EXPECT_EQ(str(at(cpu, 6)), "CPU");

  const msgpack_object& removed = at(list, 2);
  ASSERT_EQ(removed.via.array.size, 3u);
  EXPECT_EQ(str(at(removed, 0)), "BlockRemoved");
  EXPECT_EQ(uints(at(removed, 1)), std::vector<std::uint64_t>(40, 9));
  EXPECT_EQ(str(at(removed, 2)), "GPU");
}

TEST(KvEvents, ChainedRecordsOfOneSessionJoinOneEvent) {
  using ipc::KvBlocksOp;
  KvEventBatch b;
  b.add(record(KvBlocksOp::kStored, {1, 2, 3}), 7);
  b.add(record(KvBlocksOp::kStored, {4, 5}, 3), 7);  // continues the chain
  b.add(record(KvBlocksOp::kStored, {6}, 99), 7);    // another parent: a new event
  b.add(record(KvBlocksOp::kStored, {7}, 6), 8);     // another session: a new event
  b.add(record(KvBlocksOp::kRemoved, {1, 2}), 8);
  b.add(record(KvBlocksOp::kRemoved, {3}), 8);  // removals of one session and medium join
  b.add(record(KvBlocksOp::kRemoved, {4}, {}, ipc::KvMedium::kCpu), 8);
  EXPECT_EQ(b.events(), 5u);
  const Unpacked u(b.take(1.0));
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(b.empty());
  const msgpack_object& list = at(u.root(), 1);
  ASSERT_EQ(list.via.array.size, 5u);
  EXPECT_EQ(uints(at(at(list, 0), 1)), (std::vector<std::uint64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(at(at(list, 0), 2).type, MSGPACK_OBJECT_NIL);
  EXPECT_EQ(uints(at(at(list, 1), 1)), (std::vector<std::uint64_t>{6}));
  EXPECT_EQ(at(at(list, 1), 2).via.u64, 99u);
  EXPECT_EQ(uints(at(at(list, 3), 1)), (std::vector<std::uint64_t>{1, 2, 3}));
  EXPECT_EQ(str(at(at(list, 4), 2)), "CPU");
}

TEST(KvEvents, BatchIsBoundedWhateverTheEngineSends) {
  KvEventBatch b;
  // Unchained records: one event each, until the event bound.
  std::size_t added = 0;
  while (!b.full()) {
    b.add(record(ipc::KvBlocksOp::kStored, {added + 1}), 1);
    ++added;
  }
  EXPECT_EQ(added, kMaxKvBatchEvents);
  // One long chain: one event, until the hash bound.
  KvEventBatch chain;
  std::uint64_t last = 0;
  std::size_t hashes = 0;
  while (!chain.full()) {
    chain.add(record(ipc::KvBlocksOp::kStored, {last + 1, last + 2, last + 3},
                     last == 0 ? std::nullopt : std::optional(last)),
              1);
    last += 3;
    hashes += 3;
  }
  EXPECT_EQ(chain.events(), 1u);
  EXPECT_LE(hashes, kMaxKvBatchHashes);
  EXPECT_GT(hashes + ipc::kKvBlocksPerRecord, kMaxKvBatchHashes);
}

TEST(KvEvents, EndpointAndTopicChecks) {
  EXPECT_TRUE(check_kv_endpoint("tcp://127.0.0.1:5557"));
  EXPECT_TRUE(check_kv_endpoint("ipc:///tmp/kv.sock"));
  EXPECT_THAT(check_kv_endpoint("tcp://127.0.0.1:x").error().context(), HasSubstr("port"));
  EXPECT_THAT(check_kv_endpoint("tcp://h\x01:1").error().context(), HasSubstr("printable"));
  EXPECT_THAT(check_kv_endpoint(std::string(300, 'a')).error().context(), HasSubstr("256"));
  EXPECT_THAT(check_kv_endpoint("ipc://" + std::string(120, '/')).error().context(), HasSubstr("107"));
  EXPECT_TRUE(check_kv_topic(""));
  EXPECT_TRUE(check_kv_topic("kv@node@{engine}"));
  EXPECT_FALSE(check_kv_topic("{engine"));
  EXPECT_FALSE(check_kv_topic(std::string(257, 'a')));
  EXPECT_EQ(kv_topic("kv@n@{engine}.{engine}", "emu"), "kv@n@emu.emu");
  EXPECT_EQ(kv_topic("", "emu"), "");
}

TEST(KvEvents, PublisherSendsTopicSequenceAndPayload) {
  const std::string endpoint = "ipc:///tmp/tandem-kv-test-" + std::to_string(::getpid());
  auto pub = KvPublisher::open(endpoint, false, 100);
  ASSERT_TRUE(pub) << pub.error().message();
  void* ctx = zmq_ctx_new();
  void* sub = zmq_socket(ctx, ZMQ_SUB);
  ASSERT_EQ(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0), 0);
  ASSERT_EQ(zmq_connect(sub, endpoint.c_str()), 0);
  const int timeout_ms = 100;
  ASSERT_EQ(zmq_setsockopt(sub, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms), 0);
  // A PUB socket drops what it sends before the subscription arrives:
  // resend until the subscriber has one (slow joiner).
  std::vector<std::string> parts;
  for (int attempt = 0; attempt < 100 && parts.empty(); ++attempt) {
    ASSERT_TRUE((*pub)->send("kv@emu", 0x0102030405060708ull, "payload"));
    for (;;) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, sub, 0) < 0) {
        zmq_msg_close(&m);
        break;
      }
      parts.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      const bool more = zmq_msg_more(&m) != 0;
      zmq_msg_close(&m);
      if (!more) break;
    }
  }
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0], "kv@emu");
  EXPECT_EQ(parts[1], std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8)) << "8 bytes, big-endian";
  EXPECT_EQ(parts[2], "payload");
  zmq_close(sub);
  zmq_ctx_term(ctx);
  pub->reset();
  ::unlink(endpoint.substr(6).c_str());
}

TEST(KvEvents, ABindThatFailsSaysWhy) {
  auto bad = KvPublisher::open("tcp://no-such-host.invalid:5557", false, 10);
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message(), HasSubstr("bind tcp://no-such-host.invalid:5557"));
  auto connect = KvPublisher::open("tcp://127.0.0.1:5557", true, 10);  // connecting succeeds without a peer
  EXPECT_TRUE(connect) << connect.error().message();
}

// KvEventsOut: off takes nothing; a socket it could not have says why and
// counts every event as dropped, each batch still taking a sequence number;
// a full batch is published before the next record goes in.
TEST(KvEvents, OutCountsWhatItPublishesAndDrops) {
  KvEventsOut off;
  KvEventBatch batch;
  std::uint64_t seq = 0;
  EXPECT_EQ(off.state(), "off");
  EXPECT_EQ(off.add(batch, seq, "e", record(ipc::KvBlocksOp::kStored, {1}), 1).published, 0u);
  EXPECT_TRUE(batch.empty());  // nothing kept while off

  KvEventsConfig bad;
  bad.endpoint = "tcp://no-such-host.invalid:5557";
  bad.topic = "kv@{engine}";
  KvEventsOut failed(bad);
  EXPECT_THAT(failed.state(), HasSubstr("off: bind tcp://no-such-host.invalid:5557"));
  (void)failed.add(batch, seq, "e", record(ipc::KvBlocksOp::kStored, {1}), 1);
  (void)failed.add(batch, seq, "e", record(ipc::KvBlocksOp::kStored, {9}), 2);
  EXPECT_EQ(batch.events(), 2u);
  const auto sent = failed.flush(batch, seq, "e");
  EXPECT_EQ(sent.published, 0u);
  EXPECT_EQ(sent.dropped, 2u);
  EXPECT_EQ(seq, 1u);
  EXPECT_TRUE(batch.empty());

  KvEventsConfig local;
  local.endpoint = "tcp://127.0.0.1:5557";
  local.connect = true;  // connecting succeeds without a peer; sends queue up to the high-water mark
  local.topic = "kv";
  KvEventsOut out(local);
  EXPECT_EQ(out.state(), "connect tcp://127.0.0.1:5557");
  std::size_t published = 0;
  std::size_t added = 0;
  while (!batch.full()) {
    published += out.add(batch, seq, "e", record(ipc::KvBlocksOp::kStored, {added + 1}), 1).published;
    ++added;
  }
  EXPECT_EQ(published, 0u);
  published += out.add(batch, seq, "e", record(ipc::KvBlocksOp::kStored, {added + 1}), 1).published;
  EXPECT_EQ(published, added);  // the full batch went first
  EXPECT_EQ(batch.events(), 1u);
  EXPECT_EQ(seq, 2u);
}

}  // namespace
}  // namespace tandem::daemon
