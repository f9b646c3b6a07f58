// tandemd's Server in-process (tests/daemon/inprocess.h): hostile clients
// and what the daemon must never do because of them — crash, lock others
// out, forge its log, or be fooled about who owns a session (issue 18).
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "base/ids.h"
#include "base/text.h"
#include "daemon/log.h"
#include "daemon/runtime_dir.h"
#include "tests/daemon/inprocess.h"

namespace tandem::testing {
namespace {

using nlohmann::json;

const std::string kBadName("agent-\xff\xfe", 8);

// Every ctl command a reader or an admin can send, with its arguments.
const std::vector<std::pair<std::string, std::vector<std::string>>>& every_ctl_command() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kCommands = {
      {"status", {}},
      {"engines", {}},
      {"sessions", {}},
      {"tools", {}},
      {"gpu", {}},
      {"metrics", {}},
      {"events", {}},
      {"events", {"0"}},
      {"policy", {}},
      {"policy", {"get"}},
      {"policy", {"set", kBadName, "1"}},
      {"policy", {"set", "window_max", kBadName}},
      {"session-evict", {kBadName}},
      {"session-kill", {kBadName}},
      {"drain", {}},
      {"undrain", {}},
      {kBadName, {}},
  };
  return kCommands;
}

TEST(ServerInProcess, NonUtf8NamesGetThroughNoCtlCommand) {
  CapturedLog log;
  InProcessDaemon d;
  ASSERT_TRUE(d.ok()) << d.error();
  // A runner opens a session with a name that is not UTF-8, every way it can.
  auto runner = d.connect();
  ASSERT_TRUE(runner.hello(wire::Role::Runner, "runner"));
  const std::uint64_t bad = base::session_id(kBadName);
  ASSERT_TRUE(runner.push(ipc::SessionOpen{}, bad));
  ASSERT_TRUE(runner.send(ipc::build_session_name(bad, kBadName)));
  ipc::SessionSnapshotInfo snap;
  snap.session = bad;
  snap.name = kBadName;
  snap.state = 1;
  ASSERT_TRUE(runner.send(ipc::build_resync(std::span(&snap, 1), false)));
  // An engine and a ctl client that call themselves that.
  auto engine = d.connect();
  EXPECT_FALSE(engine.hello(wire::Role::Engine, kBadName, test_engine_info()));
  EXPECT_EQ(engine.error_code(), EINVAL);
  auto reader = d.connect();
  EXPECT_FALSE(reader.hello(wire::Role::CtlRead, kBadName));
  // Every ctl command, from an admin (root), answers; every answer is valid
  // UTF-8 and, when it succeeds, valid JSON.
  auto admin = d.connect();
  ASSERT_TRUE(admin.hello(wire::Role::CtlAdmin, "admin"));
  const json sessions = json::parse(admin.ctl("sessions").second);
  ASSERT_EQ(sessions["sessions"].size(), 1u);
  EXPECT_EQ(sessions["sessions"][0]["name"], "");  // the name was refused, the session stays
  for (const auto& [command, args] : every_ctl_command()) {
    auto [status, body] = admin.ctl(command, args);
    ASSERT_NE(status, -1) << command << ": no answer (is the daemon alive?)";
    EXPECT_TRUE(base::valid_utf8(body)) << command;
    if (status == 0 && command != "metrics") {
      EXPECT_TRUE(json::accept(body)) << command << ": " << body;
    }
  }
  EXPECT_GE(d.server().stats().names_refused, 3u);
  EXPECT_EQ(d.server().stats().internal_errors, 0u);
  // The runner was told, per request, and stays connected.
  auto errors = runner.take_errors();
  EXPECT_FALSE(errors.empty());
  for (const auto& e : errors) {
    EXPECT_FALSE(e.fatal) << e.message;
    EXPECT_TRUE(base::valid_utf8(e.message));
  }
  EXPECT_FALSE(runner.closed());
}

// Host effects whose answers carry strings that are not UTF-8 (a path, a
// name from elsewhere): the JSON answers must still render.
class BadStringEffects final : public daemon::HostEffects {
 public:
  void set_cpu_weight(sched::SessionId, std::uint32_t) override {}
  void set_cpu_quota(sched::SessionId, std::uint32_t) override {}
  void kill_tools(sched::SessionId, ipc::ToolExitReason) override {}
  void set_sm_partition(sched::EngineId, std::uint32_t) override {}
  void session_gone(sched::SessionId) override {}
  void status(json& out) const override { out = {{"cgroups", kBadName}, {"telemetry_mode", kBadName}}; }
  void tools(json& out) const override {
    out = json::array(
        {{{"session", "00000000000000ff"}, {"orphan", false}, {"calls", json::array()}, {"note", kBadName}}});
  }
};

TEST(ServerInProcess, JsonAnswersAreTotalWhateverTheyCarry) {
  BadStringEffects effects;
  InProcessDaemon d("", &effects);
  ASSERT_TRUE(d.ok()) << d.error();
  auto reader = d.connect();
  ASSERT_TRUE(reader.hello(wire::Role::CtlRead, "reader"));
  for (const char* command : {"status", "tools"}) {
    auto [status, body] = reader.ctl(command);
    EXPECT_EQ(status, 0) << command << ": " << body;
    EXPECT_TRUE(base::valid_utf8(body));
    EXPECT_TRUE(json::accept(body)) << body;
  }
  EXPECT_EQ(d.server().stats().internal_errors, 0u);
}

// Host effects that throw where they answer tandemctl: a bug the loop must
// survive, answer and count.
class ThrowingEffects final : public daemon::HostEffects {
 public:
  void set_cpu_weight(sched::SessionId, std::uint32_t) override {}
  void set_cpu_quota(sched::SessionId, std::uint32_t) override {}
  void kill_tools(sched::SessionId, ipc::ToolExitReason) override {}
  void set_sm_partition(sched::EngineId, std::uint32_t) override {}
  void session_gone(sched::SessionId) override {}
  void tools(json& /*out*/) const override { throw std::runtime_error("a bug in the host plane"); }
};

TEST(ServerInProcess, AnExceptionInAHandlerIsAnsweredCountedAndSurvived) {
  CapturedLog log;
  ThrowingEffects effects;
  InProcessDaemon d("", &effects);
  ASSERT_TRUE(d.ok()) << d.error();
  auto reader = d.connect();
  ASSERT_TRUE(reader.hello(wire::Role::CtlRead, "reader"));
  auto [status, body] = reader.ctl("tools");
  EXPECT_EQ(status, EIO) << body;
  EXPECT_EQ(d.server().stats().internal_errors, 1u);
  // Still serving, the same connection and new ones.
  EXPECT_EQ(reader.ctl("status").first, 0);
  auto other = d.connect();
  ASSERT_TRUE(other.hello(wire::Role::CtlRead, "other"));
  EXPECT_EQ(other.ctl("sessions").first, 0);
  EXPECT_NE(log.text().find("a bug in the host plane"), std::string::npos) << log.text();
}

// The daemon decides by the clock it is given: on a VirtualClock a test
// moves time itself and runs the timer's work with tick_now(), so timeouts
// are checked to the second with no sleeping, however slow the machine.
TEST(ServerInProcess, TimeoutsFollowTheInjectedClock) {
  using namespace std::chrono_literals;
  base::VirtualClock clock(base::from_ns(1'000'000'000'000));
  InProcessDaemon d("[limits]\nctl_idle_timeout_s = 30\n", nullptr, "", &clock);
  ASSERT_TRUE(d.ok()) << d.error();
  auto silent = d.connect();  // never says Hello: 5 s allowed
  auto idle = d.connect();
  ASSERT_TRUE(idle.hello(wire::Role::CtlRead, "idle"));
  clock.advance(4s);
  d.server().tick_now();
  EXPECT_FALSE(silent.closed()) << "4 s without Hello";
  clock.advance(2s);
  d.server().tick_now();
  EXPECT_TRUE(silent.closed()) << "6 s without Hello";
  EXPECT_FALSE(idle.closed()) << "a ctl client idle for 6 of its 30 s";
  clock.advance(24s);
  d.server().tick_now();
  EXPECT_FALSE(idle.closed()) << "idle for exactly 30 s";
  clock.advance(1s);
  d.server().tick_now();
  EXPECT_TRUE(idle.closed()) << "idle for 31 s";
  EXPECT_EQ(d.server().stats().ctl_idle_closed, 1u);
}

TEST(ServerInProcess, ALogInjectionNameForgesNoLine) {
  CapturedLog log;
  {
    InProcessDaemon d;
    ASSERT_TRUE(d.ok()) << d.error();
    const std::string evil = "x\n<0>pwned";
    auto a = d.connect();
    EXPECT_FALSE(a.hello(wire::Role::Runner, evil));
    auto runner = d.connect();
    ASSERT_TRUE(runner.hello(wire::Role::Runner, "runner"));
    ASSERT_TRUE(runner.send(ipc::build_session_name(base::session_id(evil), evil)));
    auto reader = d.connect();
    ASSERT_TRUE(reader.hello(wire::Role::CtlRead, "reader"));
    (void)reader.ctl(evil);
    (void)reader.ctl("session-kill", {evil});
    spdlog::warn("a message with a client's text in it: {}", evil);  // the formatter's own guarantee
  }
  const auto lines = log.lines();
  ASSERT_FALSE(lines.empty());
  for (const std::string& line : lines) {
    ASSERT_GE(line.size(), 3u) << line;
    EXPECT_EQ(line[0], '<') << line;
    EXPECT_TRUE(line[1] >= '2' && line[1] <= '7') << line;  // no emergency or alert line
    EXPECT_EQ(line[2], '>') << line;
    EXPECT_FALSE(line.starts_with("<0>")) << line;
  }
  EXPECT_NE(log.text().find("x\\n<0>pwned"), std::string::npos) << log.text();
}

// The runtime dir: nothing another user planted there — or could plant —
// is followed, created, or chmod'ed, and a dir another user controls is
// refused with a clear message.
class RuntimeDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tandem-rd-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  std::string root_;
};

TEST_F(RuntimeDirTest, APlantedLockSymlinkIsNotFollowed) {
  const std::string dir = root_ + "/run";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const std::string victim = root_ + "/victim";  // does not exist: following the link would create it
  ASSERT_EQ(::symlink(victim.c_str(), (dir + "/tandemd.lock").c_str()), 0);
  InProcessDaemon d("", nullptr, dir);
  EXPECT_FALSE(d.ok());
  EXPECT_NE(d.error().find("symbolic link"), std::string::npos) << d.error();
  EXPECT_FALSE(std::filesystem::exists(victim)) << "tandemd followed the planted link";
}

TEST_F(RuntimeDirTest, APlantedSocketSymlinkIsReplacedNotFollowed) {
  const std::string dir = root_ + "/run";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const std::string victim = root_ + "/victim";
  { std::ofstream(victim) << "precious"; }
  ASSERT_EQ(::chmod(victim.c_str(), 0600), 0);
  ASSERT_EQ(::symlink(victim.c_str(), (dir + "/tandemd.sock").c_str()), 0);
  ASSERT_EQ(::symlink(victim.c_str(), (dir + "/owners.new").c_str()), 0);
  {
    InProcessDaemon d("", nullptr, dir);
    ASSERT_TRUE(d.ok()) << d.error();
    struct stat st {};
    ASSERT_EQ(::lstat((dir + "/tandemd.sock").c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    auto reader = d.connect();
    EXPECT_TRUE(reader.hello(wire::Role::CtlRead, "reader"));
  }
  struct stat vs {};
  ASSERT_EQ(::stat(victim.c_str(), &vs), 0);
  EXPECT_EQ(vs.st_mode & 07777, 0600u) << "the victim was chmod'ed";
  std::ifstream in(victim);
  std::string text;
  in >> text;
  EXPECT_EQ(text, "precious");
}

TEST_F(RuntimeDirTest, APlantedJournalSymlinkIsRefused) {
  const std::string dir = root_ + "/run";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const std::string victim = root_ + "/victim";
  ASSERT_EQ(::symlink(victim.c_str(), (dir + "/owners").c_str()), 0);
  InProcessDaemon d("", nullptr, dir);
  EXPECT_FALSE(d.ok());
  EXPECT_FALSE(std::filesystem::exists(victim));
}

TEST_F(RuntimeDirTest, ADirAnotherUserControlsIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  const std::string theirs = root_ + "/theirs";
  ASSERT_EQ(::mkdir(theirs.c_str(), 0755), 0);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  {
    InProcessDaemon d("", nullptr, theirs);
    EXPECT_FALSE(d.ok());
    EXPECT_NE(d.error().find("uid 65534"), std::string::npos) << d.error();
    EXPECT_NE(d.error().find("another user"), std::string::npos) << d.error();
  }
  // Beneath a directory they can write to: refused too (they could swap it).
  const std::string under = theirs + "/run";
  ASSERT_EQ(::mkdir(under.c_str(), 0700), 0);
  {
    InProcessDaemon d("", nullptr, under);
    EXPECT_FALSE(d.ok());
  }
  // World-writable (no sticky bit), though ours: refused.
  const std::string open_dir = root_ + "/open";
  ASSERT_EQ(::mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open_dir.c_str(), 0777), 0);
  {
    InProcessDaemon d("", nullptr, open_dir);
    EXPECT_FALSE(d.ok());
    EXPECT_NE(d.error().find("writable by group or others"), std::string::npos) << d.error();
  }
  // Ours, 0755, beneath /tmp (root's, sticky): fine; and created if missing.
  {
    InProcessDaemon d("", nullptr, root_ + "/fresh/run");
    EXPECT_TRUE(d.ok()) << d.error();
  }
}

TEST(RuntimeDirRule, OwnersAndModes) {
  EXPECT_EQ(daemon::dir_problem(0, 040755, 0, false), nullptr);
  EXPECT_EQ(daemon::dir_problem(0, 041777, 0, false), nullptr);  // /tmp
  EXPECT_NE(daemon::dir_problem(0, 040777, 0, false), nullptr);
  EXPECT_NE(daemon::dir_problem(1000, 040755, 0, false), nullptr);
  EXPECT_EQ(daemon::dir_problem(1000, 040755, 1000, false), nullptr);
  EXPECT_EQ(daemon::dir_problem(0, 040750, 0, true), nullptr);  // systemd's RuntimeDirectoryMode
  EXPECT_NE(daemon::dir_problem(0, 041777, 0, true), nullptr);  // sticky is not enough for the dir itself
  EXPECT_NE(daemon::dir_problem(0, 040755, 1000, true), nullptr);
}

}  // namespace
}  // namespace tandem::testing
