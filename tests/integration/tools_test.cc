// Tool processes end to end (issue 6): a runner on libtandem spawns real
// tools (tandem-test-tool) through the real tandemd, which makes their
// cgroups beneath its own cgroup in a subtree named for the test's runtime
// dir. As root only (cgroups); skipped with a message elsewhere.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "tandem/tandem.h"
#include "tests/integration/harness.h"
#include "tests/integration/tool_runner.h"

namespace tandem::it {
namespace {

using namespace std::chrono_literals;

class Tools : public ToolRunnerTest {
 protected:
  Tools() : ToolRunnerTest("tools-test") {}

  void start(const std::string& config = "") {
    daemon_.emplace(dir_.path(), config);
    daemon_->start();
    subtree_ = dir_.path().substr(dir_.path().rfind('/') + 1);
    open_runner();
  }
  // The tool's cgroup path in the v2 hierarchy (from /proc/<pid>/cgroup).
  static std::string v2_cgroup(pid_t pid) {
    std::istringstream in(slurp(fmt::format("/proc/{}/cgroup", pid)));
    for (std::string line; std::getline(in, line);) {
      if (line.starts_with("0::")) return line.substr(3);
    }
    return "";
  }
  bool memory_from_v1() {
    return status()["host"]["cgroups"].get<std::string>().find("v1 memory") != std::string::npos;
  }

  std::string subtree_;
};

TEST_F(Tools, SpawnPlacesTheToolInItsCgroupInEveryHierarchy) {
  start();
  const auto s = open_session("tools-placement");
  const pid_t pid = spawn(s, {"sleep", "30"});
  ASSERT_GT(pid, 0);
  const std::string want = fmt::format("/{}/tools/{:016x}/", subtree_, s);
  // Every hierarchy tandemd uses (v2 and each v1 controller) holds it.
  std::istringstream in(slurp(fmt::format("/proc/{}/cgroup", pid)));
  int placed = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("name=systemd") != std::string::npos || line.find(":devices:") != std::string::npos ||
        line.find(":blkio:") != std::string::npos || line.find(":freezer:") != std::string::npos ||
        line.find(":cpuacct:") != std::string::npos) {  // freezing and CPU accounting come from v2 when it is mounted
      continue;
    }
    EXPECT_NE(line.find(want), std::string::npos) << line;
    ++placed;
  }
  EXPECT_GE(placed, 1);
  auto tools = ctl(daemon_->socket_path(), "tools");
  ASSERT_EQ(tools["sessions"].size(), 1u) << tools.dump();
  EXPECT_EQ(tools["sessions"][0]["name"], "tools-placement");
  EXPECT_EQ(tools["sessions"][0]["calls"][0]["pid"], pid);

  ASSERT_EQ(tandem_tool_kill(runner_, pid), 0);
  auto res = wait(pid);
  EXPECT_EQ(res.exit_code, -SIGKILL);
  EXPECT_EQ(res.reason, TANDEM_TOOL_SIGNALED);
  EXPECT_NE(res.cgroup_id, 0u);
  EXPECT_EQ(tandem_tool_wait(runner_, pid, 0, &res), -ECHILD);
  // TOOL_END: the empty call cgroup goes. What stays is the next call's,
  // asked ahead ([tools] ahead), with no tool in it yet.
  EXPECT_TRUE(eventually([&] {
    auto t = ctl(daemon_->socket_path(), "tools");
    if (t["sessions"].size() != 1) return false;
    const auto& calls = t["sessions"][0]["calls"];
    return calls.size() == 1 && calls[0]["ahead"] == true && calls[0]["pid"] == 0;
  }));
}

TEST_F(Tools, ExitCodeCpuTimeAndPeakMemoryAreMeasured) {
  start();
  const auto s = open_session("tools-usage");
  auto res = wait(spawn(s, {"exit", "3"}));
  EXPECT_EQ(res.exit_code, 3);
  EXPECT_EQ(res.reason, TANDEM_TOOL_EXITED);
  res = wait(spawn(s, {"burn-cpu", "0.5"}));
  EXPECT_EQ(res.exit_code, 0);
  EXPECT_GT(res.cpu_ns, 300'000'000u);
  res = wait(spawn(s, {"burn-mem", "64"}));
  EXPECT_EQ(res.exit_code, 0);
  EXPECT_GT(res.peak_memory_bytes, 60ull << 20);
  // A missing program is an error of the call, naming it.
  const char* argv[] = {"/no/such/tool", nullptr};
  std::int32_t pid = 0;
  EXPECT_EQ(tandem_tool_spawn(runner_, s, "missing", argv, nullptr, nullptr, nullptr, &pid), -ENOENT);
  EXPECT_NE(std::string(tandem_last_error(runner_)).find("/no/such/tool"), std::string::npos);
}

TEST_F(Tools, SessionCloseKillsDaemonisedGrandchildrenAndRemovesTheCgroups) {
  start();
  const auto s = open_session("tools-daemonise");
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  tandem_tool_options o{};
  o.sz = sizeof o;
  o.stdout_fd = out[1];
  const pid_t pid = spawn(s, {"daemonize", "60"}, &o);
  ::close(out[1]);
  auto res = wait(pid);
  EXPECT_EQ(res.exit_code, 0);  // the tool returned; its grandchild lives on, outside the process tree
  char buf[64] = {};
  ASSERT_GT(::read(out[0], buf, sizeof buf - 1), 0);
  ::close(out[0]);
  const pid_t grandchild = std::atoi(buf);
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(alive(grandchild));
  const std::string dir = fmt::format("/sys/fs/cgroup/unified/{}/tools/{:016x}", subtree_, s);
  EXPECT_TRUE(std::filesystem::exists(dir)) << dir;

  ASSERT_EQ(tandem_session_close(runner_, s, TANDEM_CLOSE_NORMAL), 0);
  EXPECT_TRUE(eventually([&] { return !alive(grandchild); })) << "grandchild " << grandchild << " survived";
  EXPECT_TRUE(eventually([&] { return !std::filesystem::exists(dir); })) << dir;
}

TEST_F(Tools, MemoryHighThrottlesABurnerWithoutKillingIt) {
  start("[memory]\nstall_kill_after = \"60s\"\n");
  const auto s = open_session("tools-throttle");
  tandem_tool_options o{};
  o.sz = sizeof o;
  o.memory_high = 64ull << 20;
  const pid_t pid = spawn(s, {"burn-mem", "512", "0"}, &o);  // unthrottled this takes well under a second
  std::this_thread::sleep_for(3s);
  tandem_tool_result res{};
  res.sz = sizeof res;
  EXPECT_EQ(tandem_tool_wait(runner_, pid, 0, &res), -ETIMEDOUT)
      << "the burner finished or died: exit " << res.exit_code << " " << res.message;
  EXPECT_TRUE(alive(pid));
  auto tools = ctl(daemon_->socket_path(), "tools");
  ASSERT_EQ(tools["sessions"].size(), 1u);
  // Held at its limit: it got there, and no further.
  EXPECT_GE(tools["sessions"][0]["memory_bytes"].get<std::uint64_t>(), 32ull << 20) << tools.dump();
  EXPECT_LE(tools["sessions"][0]["memory_bytes"].get<std::uint64_t>(), (64ull + 8) << 20) << tools.dump();
  ASSERT_EQ(tandem_tool_kill(runner_, pid), 0);
  res = wait(pid);
  EXPECT_EQ(res.exit_code, -SIGKILL);
}

TEST_F(Tools, MemoryMaxOomKillIsReportedAsSuch) {
  start();
  const auto s = open_session("tools-oom");
  tandem_tool_options o{};
  o.sz = sizeof o;
  o.memory_max = 64ull << 20;
  auto res = wait(spawn(s, {"burn-mem", "512", "0"}, &o));
  EXPECT_EQ(res.exit_code, -SIGKILL);
  EXPECT_EQ(res.reason, TANDEM_TOOL_OOM_KILLED) << res.message;
  EXPECT_LE(res.peak_memory_bytes, (64ull + 1) << 20);
}

TEST_F(Tools, OverTheToolsBudgetLowPriorityToolsAreFrozenNotKilled) {
  start("[memory]\ntools_budget = \"64M\"\nstall_kill_after = \"60s\"\n");
  const auto s = open_session("tools-budget");
  tandem_tool_options o{};
  o.sz = sizeof o;
  o.low_priority = 1;
  const pid_t pid = spawn(s, {"burn-mem", "96", "60"}, &o);  // holds 96 MiB: over the 64 MiB budget
  nlohmann::json tools;
  EXPECT_TRUE(eventually(
      [&] {
        tools = ctl(daemon_->socket_path(), "tools");
        return tools["sessions"].size() == 1 && tools["sessions"][0]["calls"][0].value("frozen", false);
      },
      10s))
      << tools.dump() << daemon_->log();
  EXPECT_TRUE(tools["sessions"][0]["calls"][0].value("throttled", false)) << tools.dump();
  EXPECT_EQ(status()["host"]["memory_pressure"], "critical");
  EXPECT_TRUE(alive(pid));  // degraded, not killed
  // Closing the session kills it, frozen as it is, and removes its cgroups.
  ASSERT_EQ(tandem_session_close(runner_, s, TANDEM_CLOSE_NORMAL), 0);
  EXPECT_TRUE(eventually([&] { return !alive(pid); })) << "a frozen tool survived its session";
  EXPECT_TRUE(eventually([&] { return ctl(daemon_->socket_path(), "tools")["sessions"].empty(); }));
}

TEST_F(Tools, AToolStalledAtItsLimitIsKilledWithAReason) {
  start("[memory]\nstall_kill_after = \"500ms\"\n");
  if (!memory_from_v1()) GTEST_SKIP() << "v2 memory.high throttles without stalling; the stall rule is v1's";
  const auto s = open_session("tools-stall");
  tandem_tool_options o{};
  o.sz = sizeof o;
  o.memory_high = 32ull << 20;
  auto res = wait(spawn(s, {"burn-mem", "512", "0"}, &o));
  EXPECT_EQ(res.exit_code, -SIGKILL);
  EXPECT_EQ(res.reason, TANDEM_TOOL_KILLED_MEMORY);
  EXPECT_NE(std::string(res.message).find("stalled at its memory limit"), std::string::npos) << res.message;
}

TEST_F(Tools, AnOperatorKillsASessionWithTandemctl) {
  start();
  const auto s = open_session("tools-ctl-kill");
  const pid_t pid = spawn(s, {"sleep", "30"});
  auto admin = RawClient::connect(daemon_->socket_path());
  ASSERT_TRUE(admin);
  ASSERT_TRUE(admin->hello(wire::Role::CtlAdmin, "it-admin"));
  const std::string args[] = {"tools-ctl-kill"};
  auto r = admin->ctl("session-kill", args);
  ASSERT_TRUE(r) << r.error().message();
  auto res = wait(pid);
  EXPECT_EQ(res.exit_code, -SIGKILL);
  EXPECT_EQ(res.reason, TANDEM_TOOL_KILLED_SESSION) << res.message;
  const std::string none[] = {"no-such-session"};
  auto missing = admin->ctl("session-kill", none);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ENOENT);
  // ctl_read may look, not kill.
  auto reader = RawClient::connect(daemon_->socket_path());
  ASSERT_TRUE(reader->hello(wire::Role::CtlRead, "it-reader"));
  auto denied = reader->ctl("session-kill", args);
  ASSERT_FALSE(denied);
  EXPECT_EQ(denied.error().code(), EPERM);
}

TEST_F(Tools, ARestartedDaemonAdoptsClaimedSessionsAndReapsTheRest) {
  start("[cgroups]\nadopt_grace = \"2s\"\nsubtree = \"" + dir_.path().substr(dir_.path().rfind('/') + 1) + "\"\n");
  const auto kept = open_session("tools-kept");
  const pid_t kept_pid = spawn(kept, {"sleep", "60"});
  // A second runner, in a child process, leaves a tool behind when it dies
  // (as a crashed runner would) after the daemon went down.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    tandem_options o{};
    o.sz = sizeof o;
    o.runtime_dir = dir_.path().c_str();
    tandem_client* r = nullptr;
    if (tandem_runner_open(&o, &r) != 0) ::_exit(1);
    for (int i = 0; i < 500 && tandem_connected(r) != 1; ++i) {
      (void)tandem_poll(r, 10, 0, nullptr);
    }
    std::uint64_t s = 0;
    if (tandem_session_open(r, "tools-orphan", nullptr, &s) != 0) ::_exit(2);
    const char* argv[] = {TEST_TOOL_PATH, "sleep", "60", nullptr};
    std::int32_t pid = 0;
    if (tandem_tool_spawn(r, s, "orphan", argv, nullptr, nullptr, nullptr, &pid) != 0) ::_exit(3);
    (void)!::write(ready[1], &pid, sizeof pid);
    char c = 0;
    (void)!::read(go[0], &c, 1);
    ::_exit(0);  // no tandem_close: the tool is left behind
  }
  std::int32_t orphan_pid = 0;
  ASSERT_EQ(::read(ready[0], &orphan_pid, sizeof orphan_pid), static_cast<ssize_t>(sizeof orphan_pid));
  daemon_->kill9();
  ASSERT_EQ(::write(go[1], "x", 1), 1);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  daemon_->start();
  // Our runner reconnects and resyncs its session: adopted, tool untouched.
  EXPECT_TRUE(eventually(
      [&] {
        tandem_directive d[4];
        (void)tandem_poll(runner_, 10, 4, d);
        return status()["host"].value("sessions_adopted", 0) >= 1;
      },
      10s))
      << daemon_->log();
  EXPECT_TRUE(eventually([&] { return !alive(orphan_pid); }, 10s)) << "the unclaimed session's tool survived";
  EXPECT_TRUE(alive(kept_pid));
  EXPECT_GE(status()["host"]["sessions_reaped"].get<int>(), 1);
  ASSERT_EQ(tandem_tool_kill(runner_, kept_pid), 0);
  (void)wait(kept_pid);
  for (int fd : {ready[0], ready[1], go[0], go[1]}) ::close(fd);
}

TEST_F(Tools, TelemetrySeesExecsAndStatusNamesTheMode) {
  start();
  auto st = status();
  const std::string mode = st["host"]["telemetry_mode"];
  EXPECT_TRUE(mode == "ebpf" || mode == "sampling") << st.dump();
  const auto s = open_session("tools-telemetry");
  for (int i = 0; i < 5; ++i) (void)wait(spawn(s, {"exit", "0"}));
  if (mode == "ebpf") {
    EXPECT_TRUE(eventually([&] { return status()["host"]["execs_seen"].get<int>() >= 5; }))
        << status().dump() << daemon_->log();
  }
}

TEST_F(Tools, ForcedSamplingIsSaid) {
  start("[telemetry]\nmode = \"sampling\"\n");
  EXPECT_EQ(status()["host"]["telemetry_mode"], "sampling");
}

// Sandboxing is never lost silently (issue 18): without a cgroup nothing
// starts, unless the caller allows it, and then the result says so.
TEST_F(Tools, WithoutCgroupsNothingStartsUnlessAllowed) {
  start("[cgroups]\nmode = \"off\"\n");
  EXPECT_EQ(status()["host"]["cgroups"], "off");
  const auto s = open_session("tools-unplaced");
  const std::string marker = dir_.path() + "/ran";
  const char* argv[] = {"/bin/touch", marker.c_str(), nullptr};
  std::int32_t pid = 0;
  EXPECT_EQ(tandem_tool_spawn(runner_, s, "touch", argv, nullptr, nullptr, nullptr, &pid), -ENOTSUP);
  EXPECT_NE(std::string(tandem_last_error(runner_)).find("could not be placed in a cgroup"), std::string::npos)
      << tandem_last_error(runner_);
  EXPECT_FALSE(std::filesystem::exists(marker));
  tandem_tool_options o{};
  o.sz = sizeof o;
  o.flags = TANDEM_TOOL_ALLOW_UNPLACED;
  pid = spawn(s, {"exit", "0"}, &o);
  tandem_tool_info info{};
  info.sz = sizeof info;
  ASSERT_EQ(tandem_tool_info_get(runner_, pid, &info), 0);
  EXPECT_EQ(info.cgroup_id, 0u);
  EXPECT_NE(info.flags & TANDEM_TOOL_UNPLACED, 0u);
  auto res = wait(pid);
  EXPECT_EQ(res.exit_code, 0);
  EXPECT_EQ(res.cgroup_id, 0u);
  EXPECT_NE(res.flags & TANDEM_TOOL_UNPLACED, 0u);
  tandem_client_stats st{};
  st.sz = sizeof st;
  ASSERT_EQ(tandem_get_stats(runner_, &st), 0);
  EXPECT_EQ(st.tools_unplaced, 1u);
  EXPECT_EQ(st.tools_spawned, 1u);
}

// A tool started while tandemd was down runs unplaced (the runner allowed
// it); once the runner resyncs, tandemd knows its pid, and `session kill`
// kills it — it never reports a live process as dead.
TEST_F(Tools, SessionKillNeverReportsALiveProcessDead) {
  start();
  daemon_->kill9();
  const auto s = open_session("tools-killed-unplaced");
  tandem_tool_options o{};
  o.sz = sizeof o;
  o.flags = TANDEM_TOOL_ALLOW_UNPLACED;
  const pid_t pid = spawn(s, {"sleep", "60"}, &o);
  ASSERT_GT(pid, 0);
  tandem_tool_info info{};
  info.sz = sizeof info;
  ASSERT_EQ(tandem_tool_info_get(runner_, pid, &info), 0);
  ASSERT_EQ(info.cgroup_id, 0u) << "the daemon was down: the tool cannot have a cgroup";
  daemon_->start();
  ASSERT_TRUE(eventually([&] {
    (void)tandem_poll(runner_, 10, 0, nullptr);
    return tandem_connected(runner_) == 1 && status()["sessions"]["total"] == 1;
  })) << daemon_->log();
  auto admin = RawClient::connect(daemon_->socket_path());
  ASSERT_TRUE(admin);
  ASSERT_TRUE(admin->hello(wire::Role::CtlAdmin, "it-admin"));
  const std::string args[] = {"tools-killed-unplaced"};
  auto r = admin->ctl("session-kill", args);
  // Either it is dead and said so, or it lives and the answer says which
  // processes survived: never "killed" over a live process.
  if (r) {
    EXPECT_TRUE(eventually([&] { return !alive(pid); }, 1s)) << "session-kill said killed; pid " << pid << " lives";
  } else {
    EXPECT_EQ(r.error().code(), EBUSY);
    EXPECT_NE(r.error().message().find(std::to_string(pid)), std::string::npos) << r.error().message();
  }
  EXPECT_FALSE(alive(pid)) << "tandemd knew the tool's pid from the runner's resync and should have killed it";
  (void)tandem_tool_kill(runner_, pid);
  (void)wait(pid);
}

// A runner blocked in tool_wait(-1) across a kill -9 and restart of tandemd:
// the wait reconnects and resyncs, the session is claimed back (and its
// owner is alive, as the journal says), and the tool runs to its real exit.
TEST_F(Tools, ToolWaitSurvivesADaemonRestartAndReportsTheRealExit) {
  start("[cgroups]\nadopt_grace = \"1s\"\nsubtree = \"" + dir_.path().substr(dir_.path().rfind('/') + 1) + "\"\n");
  const auto s = open_session("tools-wait-restart");
  const char* argv[] = {"/bin/sh", "-c", "sleep 3; exit 7", nullptr};
  std::int32_t pid = 0;
  ASSERT_EQ(tandem_tool_spawn(runner_, s, "sh", argv, nullptr, nullptr, nullptr, &pid), 0)
      << tandem_last_error(runner_);
  daemon_->kill9();
  daemon_->start();
  tandem_tool_result res{};
  res.sz = sizeof res;
  ASSERT_EQ(tandem_tool_wait(runner_, pid, -1, &res), 0) << tandem_last_error(runner_);
  EXPECT_EQ(res.exit_code, 7) << res.message;
  EXPECT_EQ(res.reason, TANDEM_TOOL_EXITED) << res.message;
  EXPECT_NE(res.cgroup_id, 0u);
  EXPECT_NE(res.flags & TANDEM_TOOL_DAEMON_LOST, 0u);
  EXPECT_EQ(tandem_connected(runner_), 1);
  EXPECT_EQ(status()["host"]["sessions_reaped"], 0) << daemon_->log();
}

// A tool's cgroup is its root (a cgroup namespace of its own), and it runs
// as the uid and gid the runner asks for.
TEST_F(Tools, ToolsRunInACgroupNamespaceOfTheirOwnAsTheUidAsked) {
  start();
  const auto s = open_session("tools-ns-uid");
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  tandem_tool_options o{};
  o.sz = sizeof o;
  o.stdout_fd = out[1];
  o.uid = 65534;
  o.gid = 65534;
  const char* argv[] = {"/bin/sh", "-c", "cat /proc/self/cgroup; echo uid=$(id -u) gid=$(id -g)", nullptr};
  std::int32_t pid = 0;
  ASSERT_EQ(tandem_tool_spawn(runner_, s, "sh", argv, nullptr, nullptr, &o, &pid), 0) << tandem_last_error(runner_);
  ::close(out[1]);
  tandem_tool_info info{};
  info.sz = sizeof info;
  ASSERT_EQ(tandem_tool_info_get(runner_, pid, &info), 0);
  EXPECT_EQ(info.uid, 65534u);
  const auto res = wait(pid);
  EXPECT_EQ(res.exit_code, 0) << res.message;
  EXPECT_NE(res.flags & TANDEM_TOOL_CGROUP_NS, 0u);
  EXPECT_NE(res.flags & TANDEM_TOOL_UID_CHANGED, 0u);
  EXPECT_NE(res.cgroup_id, 0u);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  ::close(out[0]);
  EXPECT_NE(text.find("uid=65534 gid=65534"), std::string::npos) << text;
  std::istringstream lines(text);
  int cgroup_lines = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("uid=")) continue;
    ++cgroup_lines;
    EXPECT_TRUE(line.ends_with(":/")) << "outside its cgroup namespace's root: " << line;
  }
  EXPECT_GT(cgroup_lines, 0);
}

// A tool's child that moves itself out of the tool's cgroup (root can, on a
// hierarchy without nsdelegate) still dies with the session: the eBPF fork
// tree follows it.
TEST_F(Tools, SessionEndKillsProcessesThatLeftTheirCgroup) {
  start();
  if (status()["host"]["telemetry_mode"] != "ebpf") GTEST_SKIP() << "needs eBPF telemetry for the fork tree";
  // The v2 directory of the daemon's subtree, from `host.cgroups`.
  const std::string cgroups = status()["host"]["cgroups"];
  const auto v2 = cgroups.find("v2 ");
  ASSERT_NE(v2, std::string::npos) << cgroups;
  const auto path_at = cgroups.find(' ', v2 + 3) + 1;
  const std::string subtree = cgroups.substr(path_at, cgroups.find(';', path_at) - path_at);
  const std::string escape = subtree + "/escape";
  ASSERT_EQ(::mkdir(escape.c_str(), 0755), 0) << escape << ": " << std::strerror(errno);
  const std::string pidfile = dir_.path() + "/escaped.pid";
  const std::string script = "sh -c 'echo $$ > " + escape + "/cgroup.procs && echo $$ > " + pidfile + ".tmp && mv " +
                             pidfile + ".tmp " + pidfile + " && exec sleep 1000' & exec sleep 1000";
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  const auto s = open_session("tools-escape");
  std::int32_t pid = 0;
  ASSERT_EQ(tandem_tool_spawn(runner_, s, "sh", argv, nullptr, nullptr, nullptr, &pid), 0)
      << tandem_last_error(runner_);
  pid_t escaped = 0;
  ASSERT_TRUE(eventually([&] {
    std::ifstream in(pidfile);
    return static_cast<bool>(in >> escaped) && escaped > 0;
  })) << "the child did not get out";
  ASSERT_NE(slurp(fmt::format("/proc/{}/cgroup", escaped)).find("/escape"), std::string::npos);
  ASSERT_EQ(tandem_session_close(runner_, s, TANDEM_CLOSE_NORMAL), 0);
  (void)tandem_poll(runner_, 0, 0, nullptr);
  EXPECT_TRUE(eventually([&] { return !alive(escaped); }, 3s)) << "pid " << escaped << " outlived its session";
  EXPECT_GE(status()["host"].value("lineage_killed", 0), 1);
  if (alive(escaped)) ::kill(escaped, SIGKILL);
  (void)::rmdir(escape.c_str());
}

// nobody holds 300 ctl connections; an engine still registers and a tool
// still gets its cgroup.
TEST_F(Tools, HeldReaderConnectionsOfAnotherUidLockNoOneOut) {
  start();
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  int ready[2];
  int release[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(release), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    std::vector<RawClient> held;
    int welcomed = 0;
    for (int i = 0; i < 300; ++i) {
      auto c = RawClient::connect(daemon_->socket_path());
      if (!c) continue;
      if (c->hello(wire::Role::CtlRead, "hog", std::nullopt, std::chrono::milliseconds(2000))) ++welcomed;
      held.push_back(std::move(*c));
    }
    (void)!::write(ready[1], &welcomed, sizeof welcomed);
    char c = 0;
    (void)!::read(release[0], &c, 1);
    ::_exit(0);
  }
  int welcomed = -1;
  ASSERT_EQ(::read(ready[0], &welcomed, sizeof welcomed), static_cast<ssize_t>(sizeof welcomed));
  EXPECT_LE(welcomed, 64) << "limits.clients_per_uid";
  auto engine = RawClient::connect(daemon_->socket_path());
  ASSERT_TRUE(engine);
  EXPECT_TRUE(engine->hello(wire::Role::Engine, "engine", test_engine_info()));
  const auto s = open_session("tools-under-siege");
  const auto res = wait(spawn(s, {"exit", "0"}));
  EXPECT_NE(res.cgroup_id, 0u) << "the tool did not get its cgroup";
  EXPECT_EQ(res.flags & TANDEM_TOOL_UNPLACED, 0u);
  EXPECT_EQ(status()["clients"]["engine"], 1);
  ASSERT_EQ(::write(release[1], "x", 1), 1);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  for (int fd : {ready[0], ready[1], release[0], release[1]}) ::close(fd);
}

}  // namespace
}  // namespace tandem::it
