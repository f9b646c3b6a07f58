// The real tandemd across the process boundary: what only a forked daemon
// can show. A uid the config does not allow is refused by SO_PEERCRED from
// another process, a client killed with SIGKILL leaves no state behind, and
// accept() out of fds backs off. A well-behaved client connected beside them
// keeps being served. The protocol's refusals themselves (bad Hello,
// oversized and malformed messages, garbage records, a scribbled ring,
// sessions of another runner) run in-process and stepped:
// tests/daemon/protocol_test.cc.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <sstream>

#include <fmt/format.h>

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

  TempDir dir_;
  Daemon daemon_{dir_.path()};
  std::optional<RawClient> good_;
};

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

// A session that ctl has shown closed stays closed across a kill -9: the
// ownership journal holds its close before the answer leaves. ctl pumps the
// rings before it answers, so the runner's SESSION_CLOSE (below the ring's
// wake-up watermark) is taken in the same loop iteration; the journal used to
// be written only at the iteration's end, after the answer, and a daemon
// killed in between brought the session back from its engine's snapshot.
TEST(OwnershipJournal, ASessionCtlShowedClosedStaysClosedAfterKill9) {
  TempDir dir;
  Daemon daemon{dir.path()};
  daemon.start();
  const std::uint64_t id = 0xC105ED;
  auto runner = RawClient::connect(daemon.socket_path());
  auto engine = RawClient::connect(daemon.socket_path());
  ASSERT_TRUE(runner && engine);
  ASSERT_TRUE(runner->hello(wire::Role::Runner, "runner"));
  ASSERT_TRUE(engine->hello(wire::Role::Engine, "engine", test_engine_info()));
  ASSERT_TRUE(runner->push(record(ipc::SessionOpen{}, id)));
  auto state = [&]() -> std::string {
    const nlohmann::json listed = ctl(daemon.socket_path(), "sessions");
    for (const auto& s : listed["sessions"]) {
      if (s["id"] == fmt::format("{:#018x}", id)) return s["state"];
    }
    return "";
  };
  ipc::RoundSubmit submit;
  submit.prompt_tokens = 100;
  submit.projected_blocks = 8;
  ASSERT_TRUE(engine->push(record(submit, id)));
  ASSERT_TRUE(eventually([&] { return state() == "reasoning"; })) << daemon.log();
  ipc::RoundEnd end;
  end.header.flags = ipc::kRoundEndToolFollows;
  end.output_tokens = 10;
  end.blocks_held = 8;
  ASSERT_TRUE(engine->push(record(end, id)));
  ASSERT_TRUE(eventually([&] { return state() == "acting"; })) << daemon.log();
  ASSERT_TRUE(runner->push(record(ipc::SessionClose{}, id)));
  ASSERT_TRUE(eventually([&] { return state().empty(); }));
  daemon.kill9();
  daemon.start();
  auto engine2 = RawClient::connect(daemon.socket_path());
  ASSERT_TRUE(engine2);
  ASSERT_TRUE(engine2->hello(wire::Role::Engine, "engine", test_engine_info()));
  ipc::SessionSnapshotInfo snap;
  snap.session = id;
  snap.state = 2;  // acting
  snap.residency = 1;
  snap.blocks_held = 8;
  ASSERT_TRUE(engine2->send(ipc::build_resync(std::span(&snap, 1), false)));
  // The resync is answered (a refusal, and a CLOSE on the engine's ring)
  // before ctl's request on a later connection is read.
  ASSERT_TRUE(eventually([&] { return ctl(daemon.socket_path(), "status")["resync_refused"].get<int>() >= 1; }))
      << ctl(daemon.socket_path(), "status").dump() << daemon.log();
  EXPECT_EQ(state(), "") << "a session ctl showed closed came back after a restart";
  EXPECT_EQ(daemon.stop(), 0) << daemon.log();
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
