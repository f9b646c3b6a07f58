// The real tandemd against clients that break the protocol: each is refused
// with a clear error, and a well-behaved client connected beside it keeps
// being served (docs/architecture.md "Trust model").
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>

#include <fmt/format.h>

#include <flatbuffers/flatbuffers.h>
#include <gtest/gtest.h>

#include "ipc/records.h"
#include "tests/integration/harness.h"

namespace tandem::it {
namespace {

using namespace std::chrono_literals;

class ProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.start();
    auto g = RawClient::connect(daemon_.socket_path());
    ASSERT_TRUE(g) << g.error().message();
    good_.emplace(std::move(*g));
    auto h = good_->hello(wire::Role::Engine, "good-engine", test_engine_info());
    ASSERT_TRUE(h) << h.error().message();
  }

  // The daemon survived it all and shuts down cleanly (under the sanitizers,
  // that includes no leak).
  void TearDown() override {
    good_.reset();
    EXPECT_EQ(daemon_.stop(), 0) << daemon_.log();
  }

  // The good engine still gets its records taken, and ctl answers.
  void expect_good_client_served() {
    const auto before = ctl(daemon_.socket_path(), "status")["records"]["accepted"].get<std::uint64_t>();
    ipc::KvStats stats;
    stats.blocks_total = 1000;
    stats.blocks_free = 900;
    ASSERT_TRUE(good_->push(record(stats, 0)));
    EXPECT_TRUE(eventually(
        [&] { return ctl(daemon_.socket_path(), "status")["records"]["accepted"].get<std::uint64_t>() > before; }));
    bool listed = false;
    const nlohmann::json engines = ctl(daemon_.socket_path(), "engines");
    for (const auto& e : engines["engines"]) listed |= e["name"] == "good-engine";
    EXPECT_TRUE(listed);
  }

  // Connects, sends `bytes`, and expects an Error with `code` whose message
  // contains `text`, then the connection closed.
  void expect_refused(const std::vector<std::uint8_t>& bytes, int code, const std::string& text) {
    auto c = RawClient::connect(daemon_.socket_path());
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->send(bytes));
    expect_error(*c, code, text);
  }

  static void expect_error(RawClient& c, int code, const std::string& text) {
    auto m = c.recv();
    ASSERT_TRUE(m) << m.error().message();
    ASSERT_EQ(m->message()->payload_type(), wire::Payload::Error);
    const auto* e = m->message()->payload_as_Error();
    EXPECT_EQ(e->code(), code);
    ASSERT_NE(e->message(), nullptr);
    EXPECT_NE(e->message()->str().find(text), std::string::npos) << e->message()->str();
    EXPECT_TRUE(c.closed_by_peer());
  }

  TempDir dir_;
  Daemon daemon_{dir_.path()};
  std::optional<RawClient> good_;
};

std::vector<std::uint8_t> hello_with(std::uint32_t version, std::uint8_t role) {
  flatbuffers::FlatBufferBuilder fbb;
  auto name = fbb.CreateString("bad");
  auto hello = wire::CreateHello(fbb, version, static_cast<wire::Role>(role), name, ::getpid());
  fbb.Finish(wire::CreateMessage(fbb, wire::Payload::Hello, hello.Union()), wire::MessageIdentifier());
  return {fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()};
}

TEST_F(ProtocolTest, WrongProtocolVersionIsRefused) {
  expect_refused(hello_with(99, static_cast<std::uint8_t>(wire::Role::Runner)), EPROTONOSUPPORT,
                 "protocol version 99 is not supported");
  expect_good_client_served();
}

TEST_F(ProtocolTest, UnknownRoleIsRefused) {
  expect_refused(hello_with(ipc::kProtocolVersion, 9), EINVAL, "unknown role 9");
  expect_good_client_served();
}

TEST_F(ProtocolTest, EngineWithoutParametersIsRefused) {
  expect_refused(ipc::build_hello(wire::Role::Engine, "no-params", ::getpid()), EINVAL, "engine parameters");
  expect_good_client_served();
}

TEST_F(ProtocolTest, FirstMessageMustBeHello) {
  expect_refused(ipc::build_ctl_request("status", {}, true), EPROTO, "first message must be Hello");
  expect_good_client_served();
}

TEST_F(ProtocolTest, OversizedMessageIsRefused) {
  auto c = RawClient::connect(daemon_.socket_path());
  ASSERT_TRUE(c);
  std::vector<std::uint8_t> big(ipc::kMaxMessageSize + 4096, 0x41);
  ASSERT_TRUE(c->send_raw(big.data(), big.size()));
  expect_error(*c, EMSGSIZE, "exceeds the limit");
  expect_good_client_served();
}

TEST_F(ProtocolTest, MalformedMessageIsRefused) {
  auto c = RawClient::connect(daemon_.socket_path());
  ASSERT_TRUE(c);
  std::vector<std::uint8_t> junk(200);
  std::mt19937 rng(7);
  for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
  ASSERT_TRUE(c->send_raw(junk.data(), junk.size()));
  expect_error(*c, EBADMSG, "");
  expect_good_client_served();
}

TEST_F(ProtocolTest, CtlRequestFromAnEngineIsAnError) {
  auto c = RawClient::connect(daemon_.socket_path());
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->hello(wire::Role::Engine, "nosy-engine", test_engine_info()));
  auto r = c->ctl("status");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EPERM);
  expect_good_client_served();
}

TEST_F(ProtocolTest, UnknownCtlCommandNamesTheKnownOnes) {
  auto c = RawClient::connect(daemon_.socket_path());
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->hello(wire::Role::CtlRead, "ctl"));
  auto r = c->ctl("frobnicate");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EINVAL);
  EXPECT_NE(r.error().message().find("known: status"), std::string::npos);
}

TEST_F(ProtocolTest, UnauthorisedUidIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // nobody: no role but ctl_read (open to anyone by default).
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    auto c = RawClient::connect(daemon_.socket_path());
    if (!c) ::_exit(11);
    auto h = c->hello(wire::Role::Engine, "intruder", test_engine_info());
    if (h) ::_exit(12);  // welcomed: wrong
    if (h.error().code() != EACCES) ::_exit(13);
    if (h.error().message().find("uid 65534") == std::string::npos) ::_exit(14);
    auto r = RawClient::connect(daemon_.socket_path());
    if (!r || !r->hello(wire::Role::CtlRead, "reader")) ::_exit(15);  // ctl_read is allowed
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10 setuid, 11 connect, 12 welcomed, 13 wrong code, 14 message, 15 ctl_read";
  expect_good_client_served();
}

TEST_F(ProtocolTest, ClientDeathReleasesItsStateWithinOneSecond) {
  // A child runner opens sessions and is killed with SIGKILL.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto c = RawClient::connect(daemon_.socket_path());
    if (!c || !c->hello(wire::Role::Runner, "doomed-runner")) ::_exit(1);
    for (std::uint64_t s = 1; s <= 10; ++s) c->push(record(ipc::SessionOpen{}, 0x1000 + s));
    ::pause();
    ::_exit(0);
  }
  ASSERT_TRUE(eventually([&] { return ctl(daemon_.socket_path(), "status")["sessions"]["total"] == 10; }));
  ASSERT_EQ(ctl(daemon_.socket_path(), "status")["clients"]["runner"], 1);
  ::kill(child, SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  int status;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(eventually(
      [&] {
        auto s = ctl(daemon_.socket_path(), "status");
        return s["sessions"]["total"] == 0 && s["clients"]["runner"] == 0;
      },
      1s));
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 1s);
  expect_good_client_served();
}

TEST_F(ProtocolTest, GarbageRecordsAreRejectedAndLoggedOnce) {
  auto c = RawClient::connect(daemon_.socket_path());
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->hello(wire::Role::Runner, "scribbler"));
  std::mt19937_64 rng(11);
  for (int i = 0; i < 200; ++i) {
    ipc::Slot slot;
    for (auto& w : slot.words) w = rng();
    ASSERT_TRUE(c->push(slot));
  }
  ASSERT_TRUE(eventually([&] { return ctl(daemon_.socket_path(), "status")["records"]["rejected"] == 200; }));
  const std::string log = daemon_.log();
  std::size_t lines = 0;
  for (std::size_t p = log.find("\"scribbler\"): rejected a record"); p != std::string::npos;
       p = log.find("\"scribbler\"): rejected a record", p + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u) << log;
  expect_good_client_served();
}

TEST_F(ProtocolTest, ScribbledRingGetsTheClientDropped) {
  auto c = RawClient::connect(daemon_.socket_path());
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->hello(wire::Role::Runner, "vandal"));
  // Overwrite everything after the header: ring indices, slots, the status page.
  auto bytes = c->channel().segment().bytes();
  std::mt19937_64 rng(13);
  for (std::size_t i = sizeof(ipc::SegmentHeader); i + 8 <= bytes.size(); i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(bytes.data() + i, &v, sizeof v);
  }
  ::eventfd_write(c->channel().event_bell_fd(), 1);
  EXPECT_TRUE(c->closed_by_peer(3s));
  EXPECT_NE(daemon_.log().find("\"vandal\", pid"), std::string::npos);
  EXPECT_NE(daemon_.log().find("dropped"), std::string::npos) << daemon_.log();
  EXPECT_EQ(ctl(daemon_.socket_path(), "status")["clients_dropped"], 1);
  expect_good_client_served();
}

TEST_F(ProtocolTest, RunnerCannotTouchAnotherRunnersSessions) {
  auto a = RawClient::connect(daemon_.socket_path());
  auto b = RawClient::connect(daemon_.socket_path());
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->hello(wire::Role::Runner, "alice"));
  ASSERT_TRUE(b->hello(wire::Role::Runner, "bob"));
  ASSERT_TRUE(a->push(record(ipc::SessionOpen{}, 0xa11ce)));
  ASSERT_TRUE(eventually([&] { return ctl(daemon_.socket_path(), "status")["sessions"]["total"] == 1; }));
  ASSERT_TRUE(b->push(record(ipc::SessionClose{}, 0xa11ce)));
  ASSERT_TRUE(eventually([&] { return ctl(daemon_.socket_path(), "status")["records"]["rejected"] == 1; }));
  const auto sessions = ctl(daemon_.socket_path(), "sessions")["sessions"];
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0]["state"], "waiting");
  EXPECT_EQ(sessions[0]["owner"], a->client_id());
}

// A runner opens a session and its agent sends the first round at once: the
// two records travel on different rings, so the engine's may come first. The
// runner's SESSION_OPEN then takes the session over; another runner's is
// still refused.
TEST_F(ProtocolTest, RunnerTakesOverASessionItsEngineOpenedFirst) {
  constexpr std::uint64_t kSession = 0x5e55;
  ipc::RoundSubmit round;
  round.prompt_tokens = 100;
  round.projected_blocks = 8;
  ASSERT_TRUE(good_->push(record(round, kSession)));
  ASSERT_TRUE(eventually([&] { return ctl(daemon_.socket_path(), "status")["sessions"]["total"] == 1; }));
  auto a = RawClient::connect(daemon_.socket_path());
  auto b = RawClient::connect(daemon_.socket_path());
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->hello(wire::Role::Runner, "agent"));
  ASSERT_TRUE(b->hello(wire::Role::Runner, "other"));
  const auto accepted = ctl(daemon_.socket_path(), "status")["records"]["accepted"].get<std::uint64_t>();
  ASSERT_TRUE(a->push(record(ipc::SessionOpen{}, kSession)));
  ASSERT_TRUE(eventually([&] {
    return ctl(daemon_.socket_path(), "status")["records"]["accepted"].get<std::uint64_t>() == accepted + 1;
  }));
  auto sessions = ctl(daemon_.socket_path(), "sessions")["sessions"];
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0]["owner"], a->client_id());
  EXPECT_EQ(ctl(daemon_.socket_path(), "status")["records"]["rejected"], 0);

  ASSERT_TRUE(b->push(record(ipc::SessionOpen{}, kSession)));
  ASSERT_TRUE(eventually([&] { return ctl(daemon_.socket_path(), "status")["records"]["rejected"] == 1; }));
  sessions = ctl(daemon_.socket_path(), "sessions")["sessions"];
  EXPECT_EQ(sessions[0]["owner"], a->client_id());
  EXPECT_EQ(ctl(daemon_.socket_path(), "status")["sessions"]["total"], 1);
}

// Out of fds, accept() fails at once every time: tandemd pauses accepting
// (connections wait in the backlog) instead of spinning, logs it once per
// interval instead of per failure, and accepts again when fds come back.
TEST(AcceptBackoff, OutOfFdsPausesAcceptingAndLogsOnce) {
  if (::access("/usr/bin/prlimit", X_OK) != 0) GTEST_SKIP() << "needs /usr/bin/prlimit to start tandemd with few fds";
  TempDir dir;
  Daemon daemon(dir.path(), "[cgroups]\nmode = \"off\"\n[nvml]\nenabled = \"off\"\n");
  daemon.start({"/usr/bin/prlimit", "--nofile=48:48", "--"});
  // A few control ticks and a ctl answer first: the paths the daemon runs
  // while out of fds have all run once. (The sanitizer build's UBSan checks
  // a virtual call's type the first time it sees it with a pipe, and a
  // process with no fd left cannot make one.)
  ASSERT_TRUE(eventually([&] { return ctl(daemon.socket_path(), "status").value("ticks", 0) >= 3; }, 5s))
      << daemon.log();
  // Each client costs tandemd two fds (socket, pidfd): connect until it
  // cannot take more.
  std::vector<RawClient> held;
  for (int i = 0; i < 40; ++i) {
    auto c = RawClient::connect(daemon.socket_path());
    if (!c) break;
    held.push_back(std::move(*c));
  }
  ASSERT_TRUE(eventually([&] { return daemon.log().find("accept on") != std::string::npos; }, 5s))
      << "tandemd never ran out of fds:\n"
      << daemon.log();
  auto cpu = [&] {
    std::ifstream in(fmt::format("/proc/{}/stat", daemon.pid()));
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    std::uint64_t ticks = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14 || i == 15) ticks += std::stoull(field);  // utime, stime
    }
    return static_cast<double>(ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  };
  const double before = cpu();
  ::usleep(2'000'000);
  const double spent = cpu() - before;
  EXPECT_LT(spent, 0.5) << "tandemd spun on accept() for " << spent << " s of CPU in 2 s";
  std::size_t lines = 0;
  for (std::size_t at = 0; (at = daemon.log().find("accept on", at)) != std::string::npos; ++at) ++lines;
  EXPECT_LE(lines, 2u) << daemon.log();
  // Fds come back: the waiting connections are taken, a reader is served.
  held.clear();
  ASSERT_TRUE(eventually(
      [&] {
        auto c = RawClient::connect(daemon.socket_path());
        return c && c->hello(wire::Role::CtlRead, "after", std::nullopt, 500ms).has_value();
      },
      5s))
      << daemon.log();
  EXPECT_EQ(daemon.stop(), 0) << daemon.log();
}

}  // namespace
}  // namespace tandem::it
