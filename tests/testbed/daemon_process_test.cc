// testbed/daemon_process.h: the harness that runs the real tandemd for the
// tests and benchmarks. TempDir's ownership; a start that waits for the
// socket (a new one after a kill), a clean stop, and each way a start or a
// stop fails named; the destructor's stop and clean-up; the cgroup sweep (as
// root). Daemons here run with cgroups off and a metrics port of their own.
#include "testbed/daemon_process.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/unique_fd.h"
#include "cpu/cgroup.h"

namespace tandem::testbed {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr const char* kQuietConfig = "[cgroups]\nmode = \"off\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n";

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool accepts(const std::string& path) {
  base::UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  return ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
}

// Whether `pid` names a process (a zombie included): after a reap it must not.
bool exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

DaemonOptions quiet_options() {
  DaemonOptions o;
  o.tandemd = TANDEMD_PATH;
  o.temp_prefix = "tandem-harness-";
  o.config = kQuietConfig;
  return o;
}

std::unique_ptr<DaemonProcess> must_create(DaemonOptions o) {
  auto d = DaemonProcess::create(std::move(o));
  EXPECT_TRUE(d.has_value()) << d.error().message();
  return d ? std::move(*d) : nullptr;
}

TEST(TempDir, IsRemovedWithItsContentsUnlessKept) {
  std::string path;
  {
    auto d = TempDir::make("tandem-harness-");
    ASSERT_TRUE(d.has_value()) << d.error().message();
    path = d->path();
    EXPECT_TRUE(fs::path(path).filename().string().starts_with("tandem-harness-")) << path;
    ASSERT_TRUE(fs::is_directory(path));
    fs::create_directories(path + "/a/b");
    std::ofstream(path + "/a/b/f") << "x";
  }
  EXPECT_FALSE(fs::exists(path));
  {
    auto d = TempDir::make("tandem-harness-");
    ASSERT_TRUE(d.has_value());
    d->keep();
    path = d->path();
  }
  EXPECT_TRUE(fs::is_directory(path));
  fs::remove_all(path);
}

TEST(TempDir, MovingHandsItOverAndMovingOverALiveOneRemovesThatOne) {
  auto a = TempDir::make("tandem-harness-");
  auto b = TempDir::make("tandem-harness-");
  ASSERT_TRUE(a.has_value() && b.has_value());
  const std::string pa = a->path();
  const std::string pb = b->path();
  {
    TempDir moved(std::move(*a));
    EXPECT_EQ(moved.path(), pa);
    EXPECT_TRUE(a->path().empty());
    *b = std::move(moved);  // over a live one: b's old directory goes
    EXPECT_FALSE(fs::exists(pb));
    EXPECT_TRUE(fs::is_directory(pa));
  }  // `moved` owns nothing any more
  EXPECT_TRUE(fs::is_directory(pa));
  TempDir& self = *b;
  *b = std::move(self);  // a self-move keeps it
  EXPECT_EQ(b->path(), pa);
  EXPECT_TRUE(fs::is_directory(pa));
  b = TempDir();
  EXPECT_FALSE(fs::exists(pa));
}

TEST(ChildProcess, RunsWithItsOutputInFilesAndItsEnvironmentAndReportsTheStatus) {
  auto dir = TempDir::make("tandem-harness-");
  ASSERT_TRUE(dir.has_value());
  const std::string out = dir->path() + "/out";
  const std::string err = dir->path() + "/err";
  ChildProcess c;
  const std::vector<std::string> argv = {"/bin/sh", "-c", "echo out; echo err >&2; echo \"$X $HOME\"; exit 3"};
  const std::vector<std::string> env = {"X=from-the-harness", "HOME=/elsewhere"};
  auto started = c.start(argv, out, err, env);
  ASSERT_TRUE(started.has_value()) << started.error().message();
  auto status = c.wait(0, 10s);
  ASSERT_TRUE(status.has_value()) << status.error().message();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << describe_wait_status(*status);
  EXPECT_EQ(slurp(out), "out\nfrom-the-harness /elsewhere\n");
  EXPECT_EQ(slurp(err), "err\n");
  EXPECT_EQ(c.pid(), -1);
  EXPECT_GT(c.last_pid(), 0);
  EXPECT_FALSE(c.wait(0, 10ms).has_value()) << "nothing runs any more";

  auto missing = c.start(std::vector<std::string>{"/nonexistent/tandem/tool"}, out, err);
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code(), ENOENT);
  EXPECT_NE(missing.error().message().find("exec /nonexistent/tandem/tool"), std::string::npos);
}

TEST(ChildProcess, AWaitPastItsTimeoutKillsAndTheDestructorToo) {
  ChildProcess c;
  const std::vector<std::string> sleeper = {"/bin/sh", "-c", "exec sleep 30"};
  ASSERT_TRUE(c.start(sleeper, "/dev/null", "/dev/null").has_value());
  const pid_t pid = c.pid();
  auto r = c.wait(0, 100ms);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ETIMEDOUT);
  ASSERT_TRUE(c.wait_status().has_value());
  EXPECT_TRUE(WIFSIGNALED(*c.wait_status()) && WTERMSIG(*c.wait_status()) == SIGKILL);
  EXPECT_FALSE(exists(pid));
  pid_t second = -1;
  {
    ChildProcess d;
    ASSERT_TRUE(d.start(sleeper, "/dev/null", "/dev/null").has_value());
    second = d.pid();
    EXPECT_FALSE(d.exited());
  }
  EXPECT_FALSE(exists(second)) << "killed and reaped at destruction";
}

TEST(DaemonProcess, StartsWaitsForTheSocketAndStopsCleanly) {
  auto d = must_create(quiet_options());
  ASSERT_NE(d, nullptr);
  const std::string dir = d->runtime_dir();
  EXPECT_EQ(slurp(d->config_path()), kQuietConfig);
  EXPECT_EQ(d->socket_path(), dir + "/tandemd.sock");
  EXPECT_EQ(d->pid(), -1);
  EXPECT_FALSE(d->wait_status().has_value());

  auto started = d->start();
  ASSERT_TRUE(started.has_value()) << started.error().message() << "\n" << d->log();
  const pid_t pid = d->pid();
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(exists(pid));
  EXPECT_TRUE(accepts(d->socket_path()));
  EXPECT_NE(slurp(fmt::format("/proc/{}/cmdline", pid)).find(dir + "/tandemd.toml"), std::string::npos);
  EXPECT_FALSE(d->exited());
  auto again = d->start();
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error().code(), EBUSY);

  auto stopped = d->stop();
  EXPECT_TRUE(stopped.has_value()) << stopped.error().message();
  ASSERT_TRUE(d->wait_status().has_value());
  EXPECT_EQ(*d->wait_status(), 0);
  EXPECT_EQ(d->pid(), -1);
  EXPECT_FALSE(exists(pid)) << "reaped";
  EXPECT_FALSE(accepts(d->socket_path()));
  EXPECT_NE(d->log().find("listening on " + dir + "/tandemd.sock"), std::string::npos) << d->log();
  EXPECT_NE(d->log().find("SIGTERM received"), std::string::npos) << d->log();
  d.reset();
  EXPECT_FALSE(fs::exists(dir)) << "its temporary runtime dir goes with it";
}

TEST(DaemonProcess, RestartsAfterAKillInTheSameDir) {
  auto d = must_create(quiet_options());
  ASSERT_NE(d, nullptr);
  ASSERT_TRUE(d->start().has_value()) << d->log();
  const pid_t first = d->pid();
  d->kill();
  EXPECT_EQ(d->pid(), -1);
  ASSERT_TRUE(d->wait_status().has_value());
  EXPECT_TRUE(WIFSIGNALED(*d->wait_status()) && WTERMSIG(*d->wait_status()) == SIGKILL);
  EXPECT_FALSE(exists(first));
  EXPECT_TRUE(fs::exists(d->socket_path())) << "a killed tandemd leaves its socket file";
  auto stop_dead = d->stop();
  ASSERT_FALSE(stop_dead.has_value());
  EXPECT_NE(stop_dead.error().message().find("was killed by signal 9"), std::string::npos)
      << stop_dead.error().message();

  auto again = d->start();
  ASSERT_TRUE(again.has_value()) << again.error().message() << "\n" << d->log();
  EXPECT_NE(d->pid(), first);
  EXPECT_TRUE(accepts(d->socket_path()));
  EXPECT_TRUE(d->stop().has_value()) << d->log();
}

TEST(DaemonProcess, ATandemdThatExitsAtStartIsAnErrorNamingItsStatus) {
  DaemonOptions o = quiet_options();
  o.config = "[limits]\nmax_clients = 0\n";
  auto d = must_create(std::move(o));
  ASSERT_NE(d, nullptr);
  auto r = d->start();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ECHILD);
  EXPECT_NE(r.error().message().find("exited with status 2 at start"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find(d->log_path()), std::string::npos) << r.error().message();
  EXPECT_NE(d->log().find("limits.max_clients"), std::string::npos) << d->log();
  EXPECT_EQ(d->pid(), -1);
}

TEST(DaemonProcess, AMissingBinaryIsAnErrorNamingIt) {
  DaemonOptions o = quiet_options();
  o.tandemd = "/nonexistent/tandem/tandemd";
  auto d = must_create(std::move(o));
  ASSERT_NE(d, nullptr);
  auto r = d->start();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ENOENT);
  EXPECT_NE(r.error().message().find("exec /nonexistent/tandem/tandemd"), std::string::npos) << r.error().message();
  EXPECT_EQ(d->pid(), -1);

  DaemonOptions none;
  auto bad = DaemonProcess::create(std::move(none));
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code(), EINVAL);
}

TEST(DaemonProcess, ASocketThatNeverComesUpTimesOutAndLeavesNothingRunning) {
  DaemonOptions o = quiet_options();
  o.start_timeout = 300ms;
  auto d = must_create(std::move(o));
  ASSERT_NE(d, nullptr);
  // The wrapper never runs tandemd: `sh -c 'exec sleep 30' sh tandemd …`.
  const std::vector<std::string> wrapper = {"/bin/sh", "-c", "exec sleep 30", "sh"};
  auto r = d->start(wrapper);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ETIMEDOUT);
  EXPECT_NE(r.error().message().find("did not accept within 300 ms"), std::string::npos) << r.error().message();
  EXPECT_EQ(d->pid(), -1);
  ASSERT_TRUE(d->wait_status().has_value());
  EXPECT_TRUE(WIFSIGNALED(*d->wait_status())) << "killed, and reaped";
}

TEST(DaemonProcess, AnInterruptedStartGivesUpAtOnce) {
  DaemonOptions o = quiet_options();
  o.interrupted = [] { return true; };
  auto d = must_create(std::move(o));
  ASSERT_NE(d, nullptr);
  auto r = d->start(std::vector<std::string>{"/bin/sh", "-c", "exec sleep 30", "sh"});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), EINTR);
  EXPECT_EQ(d->pid(), -1);
}

// A stand-in daemon that listens where tandemd would and ignores SIGTERM:
// stop() must SIGKILL it after the timeout and say so. The environment
// option reaches it too.
TEST(DaemonProcess, OneThatIgnoresSigtermIsKilledAfterTheTimeout) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "needs /usr/bin/python3 for the stand-in daemon";
  DaemonOptions o = quiet_options();
  o.stop_timeout = 300ms;
  o.env = {"TANDEM_HARNESS_TEST=stand-in"};
  auto d = must_create(std::move(o));
  ASSERT_NE(d, nullptr);
  const std::string script =
      "import os, signal, socket, sys, time\n"
      "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
      "d = sys.argv[sys.argv.index('--runtime-dir') + 1]\n"
      "open(d + '/env', 'w').write(os.environ.get('TANDEM_HARNESS_TEST', ''))\n"
      "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
      "s.bind(d + '/tandemd.sock')\n"
      "s.listen()\n"
      "time.sleep(60)\n";
  auto started = d->start(std::vector<std::string>{"/usr/bin/python3", "-c", script});
  ASSERT_TRUE(started.has_value()) << started.error().message() << "\n" << d->log();
  EXPECT_EQ(slurp(d->runtime_dir() + "/env"), "stand-in");
  const pid_t pid = d->pid();
  auto r = d->stop();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ETIMEDOUT);
  EXPECT_NE(r.error().message().find(fmt::format("tandemd (pid {}) did not exit within 300 ms of SIGTERM", pid)),
            std::string::npos)
      << r.error().message();
  ASSERT_TRUE(d->wait_status().has_value());
  EXPECT_TRUE(WIFSIGNALED(*d->wait_status()) && WTERMSIG(*d->wait_status()) == SIGKILL);
  EXPECT_FALSE(exists(pid));
}

TEST(DaemonProcess, TheDestructorStopsItAndKeepsTheDirOnlyWhenAsked) {
  for (const bool keep : {false, true}) {
    DaemonOptions o = quiet_options();
    o.keep_dir = keep;
    auto d = must_create(std::move(o));
    ASSERT_NE(d, nullptr);
    ASSERT_TRUE(d->start().has_value()) << d->log();
    const pid_t pid = d->pid();
    const std::string dir = d->runtime_dir();
    d.reset();
    EXPECT_FALSE(exists(pid)) << "stopped and reaped";
    EXPECT_EQ(fs::exists(dir), keep) << dir;
    if (keep) {
      EXPECT_NE(slurp(dir + "/tandemd.log").find("SIGTERM received"), std::string::npos) << "stopped with SIGTERM";
      fs::remove_all(dir);
    }
  }
}

TEST(DaemonProcess, ACallersRuntimeDirIsMadeAndLeftInPlace) {
  auto parent = TempDir::make("tandem-harness-");
  ASSERT_TRUE(parent.has_value());
  const std::string dir = parent->path() + "/run";
  DaemonOptions o = quiet_options();
  o.runtime_dir = dir;
  auto d = must_create(std::move(o));
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->runtime_dir(), dir);
  ASSERT_TRUE(d->start().has_value()) << d->log();
  EXPECT_TRUE(d->stop().has_value());
  d.reset();
  EXPECT_TRUE(fs::is_directory(dir)) << "not the harness's to remove";
}

// What a tandemd killed with SIGKILL leaves in its subtree goes; nothing
// outside it is touched.
TEST(DaemonProcess, SweepRemovesWhatIsLeftOfTheSubtree) {
  DaemonOptions o = quiet_options();
  o.cgroup_subtree = fmt::format("tandem-harness-sweep-{}", ::getpid());
  auto d = must_create(o);
  ASSERT_NE(d, nullptr);
  if (::geteuid() != 0) {
    auto r = d->sweep_cgroups();
    ASSERT_TRUE(r.has_value()) << r.error().message();
    EXPECT_FALSE(*r) << "without root there is nothing to sweep";
    GTEST_SKIP() << "needs root to create cgroups";
  }
  cpu::ManagerOptions mo;
  mo.subtree = o.cgroup_subtree;
  {
    auto m = cpu::CgroupManager::open(mo);
    ASSERT_TRUE(m.has_value()) << m.error().message();
    ASSERT_TRUE((*m)->create("tools/left-behind").has_value());
  }
  auto r = d->sweep_cgroups();
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_TRUE(*r) << "a child cgroup was left";
  r = d->sweep_cgroups();
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_FALSE(*r) << "nothing left the second time";
  auto m = cpu::CgroupManager::open(mo);  // (makes the subtree again: looks, then removes it)
  ASSERT_TRUE(m.has_value()) << m.error().message();
  auto children = (*m)->children("");
  ASSERT_TRUE(children.has_value());
  EXPECT_TRUE(children->empty());
  EXPECT_TRUE((*m)->remove((*m)->root()).has_value());
}

// What a bench killed by a signal left: a subtree named after its pid, gone.
// The stale one is swept; one whose pid runs, and any other name, stay.
TEST(DaemonProcess, StaleSubtreesOfDeadPidsAreSwept) {
  EXPECT_FALSE(sweep_stale_subtrees("").has_value());
  EXPECT_FALSE(sweep_stale_subtrees("a/b-").has_value());
  EXPECT_FALSE(sweep_stale_subtrees("..").has_value());
  const std::string prefix = fmt::format("tandem-harness-stale-{}-", ::getpid());
  if (::geteuid() != 0) {
    auto r = sweep_stale_subtrees(prefix);
    ASSERT_TRUE(r.has_value()) << r.error().message();
    EXPECT_TRUE(r->empty()) << "without root there is nothing to sweep";
    GTEST_SKIP() << "needs root to create cgroups";
  }
  // A pid that ran and is gone: a child reaped at once.
  const pid_t dead = ::fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  // One that runs: a child that waits to be killed.
  const pid_t live = ::fork();
  ASSERT_GE(live, 0);
  if (live == 0) {
    ::pause();
    ::_exit(0);
  }
  const std::string stale = prefix + std::to_string(dead);
  const std::string running = prefix + std::to_string(live);
  const std::string other = prefix + "x" + std::to_string(dead);
  for (const std::string& name : {stale, running, other}) {
    cpu::ManagerOptions mo;
    mo.subtree = name;
    auto m = cpu::CgroupManager::open(mo);
    ASSERT_TRUE(m.has_value()) << m.error().message();
    ASSERT_TRUE((*m)->create("tools/left-behind").has_value());
  }
  auto r = sweep_stale_subtrees(prefix);
  ::kill(live, SIGKILL);
  ::waitpid(live, nullptr, 0);
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(*r, std::vector<std::string>{stale});
  // Each is looked at (open makes a subtree that is gone: an empty one means
  // it was swept), then removed.
  for (const std::string& name : {stale, running, other}) {
    cpu::ManagerOptions mo;
    mo.subtree = name;
    auto m = cpu::CgroupManager::open(mo);
    ASSERT_TRUE(m.has_value()) << m.error().message();
    auto children = (*m)->children("");
    ASSERT_TRUE(children.has_value());
    EXPECT_EQ(children->empty(), name == stale) << name;
    EXPECT_TRUE((*m)->remove((*m)->root()).has_value()) << name;
  }
}

}  // namespace
}  // namespace tandem::testbed
