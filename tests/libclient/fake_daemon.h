// The daemon end of a libtandem connection, for libclient's tests: a fake
// tandemd that accepts one client, answers its Hello with a Welcome (and a
// PolicyConfig for engines), reads its event ring, pushes directives and
// publishes its status page. Plus the helpers every such test needs.
// Thread-safety: one test thread.
#pragma once

#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/unique_fd.h"
#include "ipc/channel.h"
#include "ipc/messages.h"
#include "ipc/records.h"
#include "tandem/tandem.h"

namespace tandem::libclient_testing {

inline std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// A fresh directory, removed at the end.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/libclient-test-XXXXXX";
    char* d = ::mkdtemp(tmpl);
    EXPECT_NE(d, nullptr);
    path_ = d != nullptr ? d : "/tmp";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Calls tandem_poll (10 ms at a time) until `done` or `timeout`.
inline bool pump_until(tandem_client* c, const std::function<bool()>& done,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(3000)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    EXPECT_GE(tandem_poll(c, 10, 0, nullptr), 0);
  }
  return true;
}

// One snapshot entry as the fake daemon read it.
struct Snap {
  std::uint8_t state = 0;
  std::uint8_t residency = 0;
  std::uint32_t round = 0;
  std::uint32_t blocks_held = 0;
  bool in_tool = false;
  std::uint64_t tool_kind = 0;
  std::string name;
};

// The daemon end of one client connection.
class FakeDaemon {
 public:
  explicit FakeDaemon(const std::string& dir) : path_(dir + "/tandemd.sock") {
    listener_ = base::UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    EXPECT_TRUE(listener_.valid());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    ::unlink(path_.c_str());
    EXPECT_EQ(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
    EXPECT_EQ(::listen(listener_.get(), 8), 0);
  }
  ~FakeDaemon() { stop(); }

  // The daemon dies: connection and listener close, the socket file goes.
  void stop() {
    conn_.reset();
    listener_.reset();
    ::unlink(path_.c_str());
    event_consumer_.reset();
    directive_producer_.reset();
    status_.reset();
    channel_.reset();
  }

  // Accepts a pending connection (waiting up to `timeout_ms`).
  bool accept(int timeout_ms) {
    pollfd p{listener_.get(), POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) != 1) return false;
    conn_ = base::UniqueFd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    return conn_.valid();
  }

  // The next message on the connection, waiting up to `timeout_ms`.
  std::optional<ipc::ReceivedMessage> recv(int timeout_ms = 2000) {
    pollfd p{conn_.get(), POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) != 1) return std::nullopt;
    auto m = ipc::recv_message(conn_.get());
    if (!m) return std::nullopt;
    return std::move(*m);
  }

  // Reads the Hello and answers with a Welcome (and, for engines, a
  // PolicyConfig naming `policy`).
  void handshake(std::uint32_t client_id, const char* policy = "fcfs", std::uint32_t event_slots = 64) {
    auto hello = recv();
    ASSERT_TRUE(hello.has_value());
    const wire::Hello* h = hello->message()->payload_as_Hello();
    ASSERT_NE(h, nullptr);
    hello_role = h->role();
    hello_name = h->name()->str();
    hello_pid = h->pid();
    if (h->engine() != nullptr) hello_block_size = h->engine()->block_size();
    auto channel = ipc::Channel::create(ipc::ChannelConfig{event_slots, 64});
    ASSERT_TRUE(channel.has_value());
    channel_ = std::make_unique<ipc::Channel>(std::move(*channel));
    auto consumer = channel_->event_consumer();
    auto producer = channel_->directive_producer();
    auto status = channel_->status_writer();
    ASSERT_TRUE(consumer && producer && status);
    event_consumer_.emplace(*consumer);
    directive_producer_.emplace(*producer);
    status_.emplace(*status);
    ipc::WelcomeInfo info{client_id, channel_->segment().bytes().size(), channel_->event_slots(),
                          channel_->directive_slots()};
    info.max_name = 256;
    info.sessions_per_client = welcome_sessions;
    info.tools_per_session = welcome_tools;
    const int fds[] = {channel_->segment_fd(), channel_->event_bell_fd(), channel_->directive_bell_fd()};
    ASSERT_TRUE(ipc::send_message(conn_.get(), ipc::build_welcome(info), fds).has_value());
    if (hello_role == wire::Role::Engine && policy != nullptr) send_policy(policy, {}, {});
  }

  // Limits the next Welcome announces (0: none, as an older daemon).
  std::uint32_t welcome_sessions = 0;
  std::uint32_t welcome_tools = 0;

  void send_policy(const std::string& name, std::vector<std::string> keys, std::vector<double> values) {
    ASSERT_TRUE(ipc::send_message(conn_.get(), ipc::build_policy_config(++epoch_, name, keys, values)).has_value());
  }
  void send(const std::vector<std::uint8_t>& message) {
    ASSERT_TRUE(ipc::send_message(conn_.get(), message).has_value());
  }

  // Reads one whole resync (messages until `more` is false); nullopt if
  // none came. SessionName messages seen on the way are collected in names.
  std::optional<std::map<std::uint64_t, Snap>> resync(int timeout_ms = 2000) {
    std::map<std::uint64_t, Snap> out;
    while (true) {
      auto m = recv(timeout_ms);
      if (!m) return std::nullopt;
      if (const wire::SessionName* n = m->message()->payload_as_SessionName()) {
        names[n->session()] = n->name()->str();
        continue;
      }
      const wire::Resync* r = m->message()->payload_as_Resync();
      if (r == nullptr) continue;
      ++resync_messages;
      if (r->sessions() != nullptr) {
        for (const wire::SessionSnapshot* s : *r->sessions()) {
          out[s->session()] = Snap{s->state(),
                                   s->residency(),
                                   s->round(),
                                   s->blocks_held(),
                                   s->in_tool(),
                                   s->tool_kind(),
                                   s->name() != nullptr ? s->name()->str() : ""};
        }
      }
      if (!r->more()) return out;
    }
  }

  template <class T>
  void push(T record, std::uint64_t session) {
    record.header.session = session;
    record.header.timestamp_ns = now_ns();
    ASSERT_TRUE(directive_producer_->try_push(ipc::encode(record)));
    channel_->directive_doorbell().notify();
  }

  // Publishes `status` on the client's status page.
  void publish(const ipc::EngineStatus& status) { status_->publish(status); }

  // Every record on the event ring, decoded (bad ones fail the test).
  std::vector<ipc::Record> events() {
    std::vector<ipc::Record> out;
    ipc::RecordDecoder decoder(ipc::Direction::kToDaemon);
    ipc::Slot slot;
    while (event_consumer_->try_pop(slot)) {
      ipc::Record r;
      std::string_view problem;
      EXPECT_EQ(decoder.decode(slot, r, &problem), ipc::DecodeStatus::kOk) << problem;
      out.push_back(r);
    }
    return out;
  }

  // The records of type T among events().
  template <class T>
  static std::vector<T> only(const std::vector<ipc::Record>& events) {
    std::vector<T> out;
    for (const ipc::Record& r : events) {
      if (r.type() == T::kType) out.push_back(r.as<T>());
    }
    return out;
  }

  wire::Role hello_role = wire::Role::Unknown;
  std::string hello_name;
  std::int32_t hello_pid = 0;
  std::uint32_t hello_block_size = 0;
  int resync_messages = 0;
  std::map<std::uint64_t, std::string> names;

 private:
  std::string path_;
  base::UniqueFd listener_;
  base::UniqueFd conn_;
  std::unique_ptr<ipc::Channel> channel_;
  std::optional<ipc::RingConsumer> event_consumer_;
  std::optional<ipc::RingProducer> directive_producer_;
  std::optional<ipc::StatusWriter<ipc::EngineStatus>> status_;
  std::uint64_t epoch_ = 0;
};

// Lets the client connect to `daemon` and completes the handshake.
inline void connect(tandem_client* c, FakeDaemon& daemon, std::uint32_t client_id, const char* policy = "fcfs",
                    std::uint32_t event_slots = 64) {
  ASSERT_TRUE(pump_until(c, [&] { return daemon.accept(0); })) << "the client never connected";
  daemon.handshake(client_id, policy, event_slots);
  ASSERT_TRUE(pump_until(c, [&] { return tandem_connected(c) == 1; }))
      << "no Welcome processed: " << tandem_last_error(c);
}

}  // namespace tandem::libclient_testing
