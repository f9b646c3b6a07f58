// The protocol's refusals, in-process (tests/daemon/inprocess.h): clients
// that break the protocol are each refused with a clear error, and a
// well-behaved engine connected beside them keeps being served
// (docs/architecture.md "Trust model"). Stepped, with no sleeps and no fork:
// the forked daemon keeps only what needs the process boundary
// (tests/integration/protocol_test.cc: SO_PEERCRED across processes, a
// client's death, accept() out of fds).
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <flatbuffers/flatbuffers.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ipc/records.h"
#include "tests/daemon/inprocess.h"

namespace tandem::testing {
namespace {

using nlohmann::json;

std::vector<std::uint8_t> hello_with(std::uint32_t version, std::uint8_t role) {
  flatbuffers::FlatBufferBuilder fbb;
  auto name = fbb.CreateString("bad");
  auto hello = wire::CreateHello(fbb, version, static_cast<wire::Role>(role), name, ::getpid());
  fbb.Finish(wire::CreateMessage(fbb, wire::Payload::Hello, hello.Union()), wire::MessageIdentifier());
  return {fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()};
}

class ProtocolInProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(d_.ok()) << d_.error();
    good_ = std::make_unique<InProcessClient>(d_.connect());
    ASSERT_TRUE(good_->hello(wire::Role::Engine, "good-engine", test_engine_info())) << good_->error();
    reader_ = std::make_unique<InProcessClient>(d_.connect());
    ASSERT_TRUE(reader_->hello(wire::Role::CtlRead, "reader")) << reader_->error();
  }

  json ctl(const std::string& command) {
    auto [status, body] = reader_->ctl(command);
    EXPECT_EQ(status, 0) << command << ": " << body;
    return json::parse(body, nullptr, /*allow_exceptions=*/false);
  }
  std::uint64_t status_count(const char* group, const char* key) {
    const json s = ctl("status");
    return s[group][key].get<std::uint64_t>();
  }

  // The good engine still gets its records taken, and ctl answers.
  void expect_good_client_served() {
    const auto before = status_count("records", "accepted");
    ipc::KvStats stats;
    stats.blocks_total = 1000;
    stats.blocks_free = 900;
    ASSERT_TRUE(good_->push(stats, 0));
    ASSERT_NE(::eventfd_write(good_->channel()->event_bell_fd(), 1), -1);
    EXPECT_TRUE(d_.until([&] { return status_count("records", "accepted") > before; }));
    const json engines = ctl("engines");
    bool listed = false;
    for (const auto& e : engines["engines"]) listed |= e["name"] == "good-engine";
    EXPECT_TRUE(listed) << engines.dump();
    EXPECT_FALSE(good_->eof());
  }

  // A new connection sends `bytes` (raw, as they are) and gets an Error with
  // `code` whose message contains `text`, then the connection is closed.
  void expect_refused(const std::vector<std::uint8_t>& bytes, int code, const std::string& text) {
    InProcessClient c = d_.connect();
    ASSERT_EQ(::send(c.fd(), bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
    expect_error(c, code, text);
  }
  static void expect_error(InProcessClient& c, int code, const std::string& text) {
    EXPECT_TRUE(c.closed()) << "the connection stays open";
    EXPECT_EQ(c.error_code(), code) << c.error();
    EXPECT_NE(c.error().find(text), std::string::npos) << c.error();
  }

  InProcessDaemon d_;
  std::unique_ptr<InProcessClient> good_;
  std::unique_ptr<InProcessClient> reader_;
};

TEST_F(ProtocolInProcess, WrongProtocolVersionIsRefused) {
  expect_refused(hello_with(99, static_cast<std::uint8_t>(wire::Role::Runner)), EPROTONOSUPPORT,
                 "protocol version 99 is not supported");
  expect_good_client_served();
}

TEST_F(ProtocolInProcess, UnknownRoleIsRefused) {
  expect_refused(hello_with(ipc::kProtocolVersion, 9), EINVAL, "unknown role 9");
  expect_good_client_served();
}

TEST_F(ProtocolInProcess, EngineWithoutParametersIsRefused) {
  expect_refused(ipc::build_hello(wire::Role::Engine, "no-params", ::getpid()), EINVAL, "engine parameters");
  expect_good_client_served();
}

TEST_F(ProtocolInProcess, FirstMessageMustBeHello) {
  expect_refused(ipc::build_ctl_request("status", {}, true), EPROTO, "first message must be Hello");
  expect_good_client_served();
}

TEST_F(ProtocolInProcess, OversizedMessageIsRefused) {
  expect_refused(std::vector<std::uint8_t>(ipc::kMaxMessageSize + 4096, 0x41), EMSGSIZE, "exceeds the limit");
  expect_good_client_served();
}

TEST_F(ProtocolInProcess, MalformedMessageIsRefused) {
  std::vector<std::uint8_t> junk(200);
  std::mt19937 rng(7);
  for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
  expect_refused(junk, EBADMSG, "");
  expect_good_client_served();
}

TEST_F(ProtocolInProcess, CtlRequestFromAnEngineIsAnError) {
  InProcessClient c = d_.connect();
  ASSERT_TRUE(c.hello(wire::Role::Engine, "nosy-engine", test_engine_info()));
  auto [status, body] = c.ctl("status");
  EXPECT_EQ(status, EPERM) << body;
  expect_good_client_served();
}

TEST_F(ProtocolInProcess, UnknownCtlCommandNamesTheKnownOnes) {
  InProcessClient c = d_.connect();
  ASSERT_TRUE(c.hello(wire::Role::CtlRead, "ctl"));
  auto [status, body] = c.ctl("frobnicate");
  EXPECT_EQ(status, EINVAL) << body;
  EXPECT_NE(body.find("known: status"), std::string::npos) << body;
  EXPECT_FALSE(c.eof()) << "an error answers the request; the connection stays";
}

TEST_F(ProtocolInProcess, AnUnauthorisedUidIsRefusedARoleButMayRead) {
  // nobody (SO_PEERCRED as the daemon sees it): no role but ctl_read, which
  // is open to anyone by default. The forked test does the same across a
  // real process boundary.
  const ucred nobody{::getpid(), 65534, 65534};
  InProcessClient c = d_.connect(nobody);
  EXPECT_FALSE(c.hello(wire::Role::Engine, "intruder", test_engine_info()));
  EXPECT_EQ(c.error_code(), EACCES) << c.error();
  EXPECT_NE(c.error().find("uid 65534"), std::string::npos) << c.error();
  InProcessClient r = d_.connect(nobody);
  EXPECT_TRUE(r.hello(wire::Role::CtlRead, "reader")) << r.error();
  expect_good_client_served();
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

TEST_F(ProtocolInProcess, GarbageRecordsAreRejectedAndLoggedOnce) {
  CapturedLog log;
  InProcessClient c = d_.connect();
  ASSERT_TRUE(c.hello(wire::Role::Runner, "scribbler"));
  std::mt19937_64 rng(11);
  for (int i = 0; i < 200; ++i) {
    ipc::Slot slot;
    for (auto& w : slot.words) w = rng();
    ASSERT_TRUE(c.push(slot));
  }
  ASSERT_NE(::eventfd_write(c.channel()->event_bell_fd(), 1), -1);
  EXPECT_TRUE(d_.until([&] { return status_count("records", "rejected") == 200; }));
  EXPECT_EQ(count(log.text(), "\"scribbler\"): rejected a record"), 1u) << log.text();
  expect_good_client_served();
}

TEST_F(ProtocolInProcess, AScribbledRingGetsTheClientDropped) {
  CapturedLog log;
  InProcessClient c = d_.connect();
  ASSERT_TRUE(c.hello(wire::Role::Runner, "vandal"));
  // Overwrite everything after the header: ring indices, slots, the status page.
  auto bytes = c.channel()->segment().bytes();
  std::mt19937_64 rng(13);
  for (std::size_t i = sizeof(ipc::SegmentHeader); i + 8 <= bytes.size(); i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(bytes.data() + i, &v, sizeof v);
  }
  ASSERT_NE(::eventfd_write(c.channel()->event_bell_fd(), 1), -1);
  EXPECT_TRUE(c.closed());
  EXPECT_NE(log.text().find("\"vandal\", pid"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("dropped"), std::string::npos) << log.text();
  EXPECT_EQ(ctl("status")["clients_dropped"], 1);
  expect_good_client_served();
}

TEST_F(ProtocolInProcess, ARunnerCannotTouchAnotherRunnersSessions) {
  InProcessClient a = d_.connect();
  InProcessClient b = d_.connect();
  ASSERT_TRUE(a.hello(wire::Role::Runner, "alice"));
  ASSERT_TRUE(b.hello(wire::Role::Runner, "bob"));
  ASSERT_TRUE(a.push(ipc::SessionOpen{}, 0xa11ce));
  ASSERT_NE(::eventfd_write(a.channel()->event_bell_fd(), 1), -1);
  ASSERT_TRUE(d_.until([&] { return status_count("sessions", "total") == 1; }));
  ASSERT_TRUE(b.push(ipc::SessionClose{}, 0xa11ce));
  ASSERT_NE(::eventfd_write(b.channel()->event_bell_fd(), 1), -1);
  ASSERT_TRUE(d_.until([&] { return status_count("records", "rejected") == 1; }));
  const json sessions = ctl("sessions")["sessions"];
  ASSERT_EQ(sessions.size(), 1u);
  // Still open: waiting, or admitted by a control tick in between.
  EXPECT_TRUE(sessions[0]["state"] == "waiting" || sessions[0]["state"] == "reasoning") << sessions.dump();
  EXPECT_EQ(sessions[0]["owner"], a.id());
}

// A runner opens a session and its agent sends the first round at once: the
// two records travel on different rings, so the engine's may come first. The
// runner's SESSION_OPEN then takes the session over; another runner's is
// still refused.
TEST_F(ProtocolInProcess, ARunnerTakesOverASessionItsEngineOpenedFirst) {
  constexpr std::uint64_t kSession = 0x5e55;
  ipc::RoundSubmit round;
  round.prompt_tokens = 100;
  round.projected_blocks = 8;
  ASSERT_TRUE(good_->push(round, kSession));
  ASSERT_NE(::eventfd_write(good_->channel()->event_bell_fd(), 1), -1);
  ASSERT_TRUE(d_.until([&] { return status_count("sessions", "total") == 1; }));
  InProcessClient a = d_.connect();
  InProcessClient b = d_.connect();
  ASSERT_TRUE(a.hello(wire::Role::Runner, "agent"));
  ASSERT_TRUE(b.hello(wire::Role::Runner, "other"));
  const auto accepted = status_count("records", "accepted");
  ASSERT_TRUE(a.push(ipc::SessionOpen{}, kSession));
  ASSERT_NE(::eventfd_write(a.channel()->event_bell_fd(), 1), -1);
  ASSERT_TRUE(d_.until([&] { return status_count("records", "accepted") == accepted + 1; }));
  json sessions = ctl("sessions")["sessions"];
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0]["owner"], a.id());
  EXPECT_EQ(status_count("records", "rejected"), 0u);

  ASSERT_TRUE(b.push(ipc::SessionOpen{}, kSession));
  ASSERT_NE(::eventfd_write(b.channel()->event_bell_fd(), 1), -1);
  ASSERT_TRUE(d_.until([&] { return status_count("records", "rejected") == 1; }));
  sessions = ctl("sessions")["sessions"];
  EXPECT_EQ(sessions[0]["owner"], a.id());
  EXPECT_EQ(status_count("sessions", "total"), 1u);
}

}  // namespace
}  // namespace tandem::testing
