// [kv_events] in-process (tests/daemon/inprocess.h): an engine's KV_BLOCKS
// reach a ZMQ subscriber in bounded batches, a runner's are rejected without
// costing it its connection, and with [kv_events] off they are taken and
// ignored.
#include <msgpack.h>
#include <unistd.h>
#include <zmq.h>

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/daemon/inprocess.h"

namespace tandem::testing {
namespace {

using nlohmann::json;

ipc::KvBlocks stored(std::uint64_t first, std::uint8_t count, bool chained) {
  ipc::KvBlocks r;
  r.op = static_cast<std::uint8_t>(ipc::KvBlocksOp::kStored);
  r.count = count;
  r.block_size = 16;
  for (std::uint8_t i = 0; i < count; ++i) r.hashes[i] = first + i;
  if (chained) {
    r.header.flags = ipc::kKvBlocksHasParent;
    r.parent = first - 1;
  }
  return r;
}

class Subscriber {
 public:
  explicit Subscriber(const std::string& endpoint) : ctx_(zmq_ctx_new()), sock_(zmq_socket(ctx_, ZMQ_SUB)) {
    zmq_setsockopt(sock_, ZMQ_SUBSCRIBE, "", 0);
    zmq_connect(sock_, endpoint.c_str());
  }
  ~Subscriber() {
    zmq_close(sock_);
    zmq_ctx_term(ctx_);
  }
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  // One message's frames, if one is waiting.
  std::vector<std::string> receive() {
    std::vector<std::string> parts;
    for (;;) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, sock_, parts.empty() ? ZMQ_DONTWAIT : 0) < 0) {
        zmq_msg_close(&m);
        return parts;
      }
      parts.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      const bool more = zmq_msg_more(&m) != 0;
      zmq_msg_close(&m);
      if (!more) return parts;
    }
  }

 private:
  void* ctx_;
  void* sock_;
};

// The probe records that find the subscription carry hashes from here up;
// one can still be in a batch when the flood starts, so the flood's count
// leaves them out.
constexpr std::uint64_t kProbeBase = 1'000'000;

// (events, flood hashes) of a payload.
std::pair<std::size_t, std::size_t> count(const std::string& payload) {
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  std::size_t off = 0;
  std::pair<std::size_t, std::size_t> out{0, 0};
  if (msgpack_unpack_next(&u, payload.data(), payload.size(), &off) == MSGPACK_UNPACK_SUCCESS) {
    const msgpack_object& events = u.data.via.array.ptr[1];
    out.first = events.via.array.size;
    for (std::uint32_t i = 0; i < events.via.array.size; ++i) {
      const msgpack_object& hashes = events.via.array.ptr[i].via.array.ptr[1];
      for (std::uint32_t h = 0; h < hashes.via.array.size; ++h)
        if (hashes.via.array.ptr[h].via.u64 < kProbeBase) ++out.second;
    }
  }
  msgpack_unpacked_destroy(&u);
  return out;
}

TEST(KvEventsInProcess, AFloodIsPublishedInBoundedBatchesAndARunnersRecordsAreRejected) {
  const std::string endpoint = "ipc:///tmp/tandem-kv-ip-" + std::to_string(::getpid());
  InProcessDaemon d("[kv_events]\nendpoint = \"" + endpoint + "\"\ntopic = \"kv@{engine}\"\n");
  ASSERT_TRUE(d.ok()) << d.error();
  Subscriber sub(endpoint);
  auto engine = d.connect();
  ASSERT_TRUE(engine.hello(wire::Role::Engine, "eng", test_engine_info()));
  // A PUB socket drops what it sends before a subscription arrives: send
  // single records until one gets through.
  std::vector<std::string> first;
  for (int i = 0; i < 200 && first.empty(); ++i) {
    ASSERT_TRUE(engine.push(stored(kProbeBase + i, 1, false), 7));
    d.step();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    first = sub.receive();
  }
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0], "kv@eng");
  while (!sub.receive().empty()) {
  }

  // 1,000 chained records (3,000 hashes) in one go: more than one batch holds.
  for (std::uint64_t i = 0; i < 1000; ++i) ASSERT_TRUE(engine.push(stored(1 + 3 * i, 3, i > 0), 9));
  std::size_t hashes = 0;
  std::size_t messages = 0;
  ASSERT_TRUE(d.until([&] {
    for (auto m = sub.receive(); !m.empty(); m = sub.receive()) {
      EXPECT_EQ(m.size(), 3u);
      if (m.size() != 3) continue;
      auto [events, n] = count(m[2]);
      EXPECT_LE(events, daemon::kMaxKvBatchEvents);
      EXPECT_LE(n, daemon::kMaxKvBatchHashes);
      EXPECT_GE(events, 1u);
      hashes += n;
      ++messages;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return hashes >= 3000;
  }));
  EXPECT_EQ(hashes, 3000u);
  EXPECT_GE(messages, 2u) << "the batch was published when it reached its bound";
  EXPECT_EQ(d.server().stats().kv_events_dropped, 0u);
  EXPECT_GE(d.server().stats().kv_events_published, messages);

  // A runner may not describe a cache: rejected, counted, still connected.
  auto runner = d.connect();
  ASSERT_TRUE(runner.hello(wire::Role::Runner, "run"));
  const std::uint64_t rejected = d.server().stats().records_rejected;
  ASSERT_TRUE(runner.push(stored(5, 1, false), 11));
  ASSERT_TRUE(d.until([&] { return d.server().stats().records_rejected > rejected; }));
  EXPECT_FALSE(runner.closed());

  auto admin = d.connect();
  ASSERT_TRUE(admin.hello(wire::Role::CtlRead, "reader"));
  const json status = json::parse(admin.ctl("status").second);
  EXPECT_EQ(status["kv_events"]["endpoint"], "bind " + endpoint);
  ::unlink(endpoint.substr(6).c_str());
}

TEST(KvEventsInProcess, OffTheRecordsAreTakenAndIgnored) {
  InProcessDaemon d;
  ASSERT_TRUE(d.ok()) << d.error();
  auto engine = d.connect();
  ASSERT_TRUE(engine.hello(wire::Role::Engine, "eng", test_engine_info()));
  const std::uint64_t accepted = d.server().stats().records_accepted;
  ASSERT_TRUE(engine.push(stored(1, 3, false), 7));
  ASSERT_TRUE(d.until([&] { return d.server().stats().records_accepted > accepted; }));
  EXPECT_EQ(d.server().stats().records_rejected, 0u);
  EXPECT_EQ(d.server().stats().kv_events_published + d.server().stats().kv_events_dropped, 0u);
  auto admin = d.connect();
  ASSERT_TRUE(admin.hello(wire::Role::CtlRead, "reader"));
  EXPECT_EQ(json::parse(admin.ctl("status").second)["kv_events"]["endpoint"], "off");
}

}  // namespace
}  // namespace tandem::testing
