// The warm pool of tool-call cgroups (issue 23, docs/host.md "The warm
// pool") end to end: a runner on libtandem spawns real tools
// (tandem-test-tool) through the real tandemd, whose cgroups sit beneath its
// own cgroup in a subtree named for the test's runtime dir. As root only
// (cgroups); skipped with a message elsewhere. No timing is asserted: each
// test checks where a tool ran, what its cgroup carried and what was left.
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
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "tandem/tandem.h"
#include "tests/integration/harness.h"
#include "tests/integration/tool_runner.h"

namespace tandem::it {
namespace {

using namespace std::chrono_literals;

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// One hierarchy of tandemd's subtree, from `host.cgroups` ("v2 cpuacct,freezer
// /sys/fs/cgroup/unified/x; v1 cpu /sys/fs/cgroup/cpu/x; …").
struct Hier {
  bool v2 = false;
  std::vector<std::string> controllers;
  std::string path;
};

std::vector<Hier> hierarchies(const std::string& described) {
  std::vector<Hier> out;
  std::stringstream list(described);
  for (std::string part; std::getline(list, part, ';');) {
    std::stringstream words(part);
    std::string version;
    std::string controllers;
    Hier h;
    words >> version >> controllers >> h.path;
    h.v2 = version == "v2";
    std::stringstream cs(controllers);
    for (std::string c; std::getline(cs, c, ',');) h.controllers.push_back(c);
    out.push_back(std::move(h));
  }
  return out;
}

class ToolPool : public ToolRunnerTest {
 protected:
  ToolPool() : ToolRunnerTest("tool-pool-test") {}

  std::string subtree() const { return dir_.path().substr(dir_.path().rfind('/') + 1); }
  // tandemd with `extra` appended to a config naming its subtree (so that a
  // restarted one finds the same).
  void start(const std::string& extra = "", const std::string& cgroups_extra = "") {
    daemon_.emplace(dir_.path(), "[cgroups]\nsubtree = \"" + subtree() + "\"\n" + cgroups_extra + extra);
    daemon_->start();
    open_runner();
    hier_ = hierarchies(status()["host"]["cgroups"].get<std::string>());
    ASSERT_FALSE(hier_.empty());
  }
  nlohmann::json pool() { return status()["host"]["pool"]; }
  // Until the session has a ready cgroup (the daemon's tick refills).
  bool pool_ready() {
    return eventually([&] { return pool()["ready"].get<int>() >= 1; });
  }
  // The name of the tool's cgroup (the last part of its v2 path).
  static std::string cgroup_name(pid_t pid) {
    std::istringstream in(slurp(fmt::format("/proc/{}/cgroup", pid)));
    for (std::string line; std::getline(in, line);) {
      if (line.starts_with("0::")) return line.substr(line.rfind('/') + 1);
    }
    return "";
  }
  std::string session_rel(std::uint64_t s) const { return fmt::format("tools/{:016x}", s); }
  // A control file of `rel` in the hierarchy serving `controller` ("" if none does).
  std::string knob(const std::string& controller, const std::string& rel, const std::string& file) const {
    for (const Hier& h : hier_) {
      if (std::ranges::find(h.controllers, controller) == h.controllers.end()) continue;
      return trim(slurp(fmt::format("{}/{}/{}", h.path, rel, file)));
    }
    return "";
  }
  const Hier* serving(const std::string& controller) const {
    for (const Hier& h : hier_) {
      if (std::ranges::find(h.controllers, controller) != h.controllers.end()) return &h;
    }
    return nullptr;
  }
  // The children of `rel` named pool-*, in hierarchy `h`.
  static std::vector<std::string> pool_dirs(const Hier& h, const std::string& rel) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(h.path + "/" + rel, ec)) {
      const std::string n = e.path().filename().string();
      if (e.is_directory() && n.starts_with("pool-")) out.push_back(n);
    }
    return out;
  }

  std::vector<Hier> hier_;
};

// A pooled cgroup is made ahead with [tools]' limits, and gets the runner's
// tighter ones when it is handed out.
TEST_F(ToolPool, AHandedOutCgroupAlreadyCarriesItsLimits) {
  start("[tools]\nmemory_max = \"256M\"\npids_max = 100\ncpu_max_percent = 50\nahead = false\n");
  const auto s = open_session("pool-limits");
  EXPECT_EQ(wait(spawn(s, {"exit", "0"})).exit_code, 0);  // the session's first call: cold
  EXPECT_EQ(pool()["misses"], 1);
  ASSERT_TRUE(pool_ready()) << status().dump();

  const pid_t pid = spawn(s, {"sleep", "30"});
  ASSERT_GT(pid, 0);
  EXPECT_EQ(pool()["hits"], 1) << status().dump();
  const std::string name = cgroup_name(pid);
  ASSERT_TRUE(name.starts_with("pool-")) << name;
  const std::string rel = session_rel(s) + "/" + name;
  const Hier* pids = serving("pids");
  if (pids != nullptr) {
    EXPECT_EQ(knob("pids", rel, "pids.max"), "100");
  }
  if (const Hier* mem = serving("memory")) {
    EXPECT_EQ(knob("memory", rel, mem->v2 ? "memory.max" : "memory.limit_in_bytes"), std::to_string(256ull << 20));
  }
  if (const Hier* cpu = serving("cpu")) {
    if (cpu->v2) {
      EXPECT_EQ(knob("cpu", rel, "cpu.max"), "50000 100000");
    } else {
      EXPECT_EQ(knob("cpu", rel, "cpu.cfs_quota_us"), "50000");
    }
  }
  // It is its session's: beneath the folder that carries the policy's cpu.weight.
  EXPECT_NE(slurp(fmt::format("/proc/{}/cgroup", pid)).find(session_rel(s) + "/pool-"), std::string::npos);
  ASSERT_EQ(tandem_tool_kill(runner_, pid), 0);
  (void)wait(pid);

  // A runner's tighter limit is written on the pooled cgroup as it goes out.
  ASSERT_TRUE(pool_ready()) << status().dump();
  tandem_tool_options o{};
  o.sz = sizeof o;
  o.memory_max = 64ull << 20;
  o.pids_max = 50;
  const pid_t tight = spawn(s, {"sleep", "30"}, &o);
  EXPECT_EQ(pool()["hits"], 2) << status().dump();
  const std::string tight_rel = session_rel(s) + "/" + cgroup_name(tight);
  ASSERT_TRUE(cgroup_name(tight).starts_with("pool-"));
  if (pids != nullptr) {
    EXPECT_EQ(knob("pids", tight_rel, "pids.max"), "50");
  }
  if (const Hier* mem = serving("memory")) {
    EXPECT_EQ(knob("memory", tight_rel, mem->v2 ? "memory.max" : "memory.limit_in_bytes"), std::to_string(64ull << 20));
  }
  ASSERT_EQ(tandem_tool_kill(runner_, tight), 0);
  (void)wait(tight);
}

// Many calls at once, one leaving a daemonised process behind in its
// cgroup: every call gets a cgroup of its own holding only itself, and
// every ready cgroup is empty.
TEST_F(ToolPool, NoCgroupIsHandedOutTwiceAndEachStartsEmpty) {
  start("[tools]\npool_per_session = 4\n");
  const auto s = open_session("pool-unique");
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  tandem_tool_options o{};
  o.sz = sizeof o;
  o.stdout_fd = out[1];
  const pid_t first = spawn(s, {"daemonize", "60"}, &o);
  ::close(out[1]);
  EXPECT_EQ(wait(first).exit_code, 0);
  char buf[64] = {};
  ASSERT_GT(::read(out[0], buf, sizeof buf - 1), 0);
  ::close(out[0]);
  const pid_t lingering = std::atoi(buf);
  ASSERT_GT(lingering, 0);
  const std::string lingering_cg = cgroup_name(lingering);
  ASSERT_TRUE(pool_ready()) << status().dump();

  std::vector<pid_t> pids;
  pids.reserve(8);
  for (int i = 0; i < 8; ++i) pids.push_back(spawn(s, {"sleep", "30"}));
  std::set<std::string> names;
  const Hier& first_h = hier_.front();
  for (pid_t pid : pids) {
    ASSERT_GT(pid, 0);
    const std::string name = cgroup_name(pid);
    EXPECT_NE(name, lingering_cg);
    EXPECT_TRUE(names.insert(name).second) << "cgroup " << name << " handed out twice";
    // Only the call itself is in it.
    EXPECT_EQ(trim(slurp(fmt::format("{}/{}/{}/cgroup.procs", first_h.path, session_rel(s), name))),
              std::to_string(pid));
  }
  const auto p = pool();
  // The pool served some, and every one of the 9 calls was counted as a hit
  // or a miss. Whether the 8 calls ran it dry depends on how fast it refills
  // between them (under ASan it can keep up), so that is not asked here:
  // AnEmptyPoolFallsBackToTheColdPathAndCountsIt checks the cold path and its
  // count on a pool held empty (pool_max = 0).
  EXPECT_GE(p["hits"].get<int>(), 1) << p.dump();
  EXPECT_GE(p["hits"].get<int>() + p["misses"].get<int>(), 9) << p.dump();
  // Ready cgroups (those no call holds) hold no process.
  for (const Hier& h : hier_) {
    for (const std::string& n : pool_dirs(h, session_rel(s))) {
      if (names.contains(n)) continue;
      EXPECT_EQ(trim(slurp(fmt::format("{}/{}/{}/cgroup.procs", h.path, session_rel(s), n))), "") << h.path << " " << n;
    }
  }
  for (pid_t pid : pids) {
    ASSERT_EQ(tandem_tool_kill(runner_, pid), 0);
    (void)wait(pid);
  }
  ASSERT_EQ(tandem_session_close(runner_, s, TANDEM_CLOSE_NORMAL), 0);
  EXPECT_TRUE(eventually([&] { return !alive(lingering); })) << "the daemonised process outlived its session";
  for (const Hier& h : hier_) {
    EXPECT_TRUE(eventually([&] { return !std::filesystem::exists(h.path + "/" + session_rel(s)); }))
        << h.path << "/" << session_rel(s);
  }
}

// With no pool (pool_max = 0) every call makes its cgroup, counted as a
// miss, named for its call and limited as before.
TEST_F(ToolPool, AnEmptyPoolFallsBackToTheColdPathAndCountsIt) {
  start("[tools]\npool_max = 0\npids_max = 77\nahead = false\n");
  const auto s = open_session("pool-cold");
  for (int i = 0; i < 3; ++i) {
    const pid_t pid = spawn(s, {"sleep", "30"});
    ASSERT_GT(pid, 0);
    const std::string name = cgroup_name(pid);
    EXPECT_FALSE(name.starts_with("pool-")) << name;
    if (serving("pids") != nullptr) {
      EXPECT_EQ(knob("pids", session_rel(s) + "/" + name, "pids.max"), "77");
    }
    ASSERT_EQ(tandem_tool_kill(runner_, pid), 0);
    (void)wait(pid);
  }
  std::this_thread::sleep_for(300ms);  // more than one host period: a pool would have been made by now
  const auto st = status();
  EXPECT_EQ(st["host"]["pool"]["misses"], 3) << st.dump();
  EXPECT_EQ(st["host"]["pool"]["hits"], 0);
  EXPECT_EQ(st["host"]["pool"]["ready"], 0);
  EXPECT_EQ(st["host"]["tools_prepared"], 3);
  for (const Hier& h : hier_) EXPECT_TRUE(pool_dirs(h, session_rel(s)).empty()) << h.path;
  // And the metrics say so.
  auto c = RawClient::connect(daemon_->socket_path());
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->hello(wire::Role::CtlRead, "it-ctl"));
  auto text = c->ctl("metrics");
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_NE(text->find("tandem_tool_pool_misses_total 3"), std::string::npos) << *text;
}

// The pool follows a session's call rate: one call keeps it small, a quick
// run of calls lifts the target, and a session idle for pool_idle keeps
// none. (Grows: within a tick of the run; shrinks: over seconds.)
TEST_F(ToolPool, ThePoolGrowsWithTheCallRateAndEmptiesWhenIdle) {
  start("[tools]\npool_idle = \"1s\"\npool_per_session = 8\nahead = false\n");
  const auto s = open_session("pool-adapt");
  EXPECT_EQ(wait(spawn(s, {"exit", "0"})).exit_code, 0);
  ASSERT_TRUE(pool_ready()) << status().dump();
  EXPECT_LE(pool()["ready"].get<int>(), 2) << "one call in a second asks for ceil(2 x 0.5) + 1";
  for (int i = 0; i < 20; ++i) EXPECT_EQ(wait(spawn(s, {"exit", "0"})).exit_code, 0);
  EXPECT_TRUE(eventually([&] { return pool()["ready"].get<int>() >= 3; })) << status().dump();
  EXPECT_LE(pool()["ready"].get<int>(), 8);  // pool_per_session
  // Idle: the ready cgroups go, in every hierarchy.
  EXPECT_TRUE(eventually([&] { return pool()["ready"] == 0 && pool()["target"] == 0; }, 10s)) << status().dump();
  EXPECT_GE(pool()["dropped"].get<int>(), 3);
  for (const Hier& h : hier_) EXPECT_TRUE(pool_dirs(h, session_rel(s)).empty()) << h.path;
}

// Placement ahead ([tools] ahead, on by default): once a session's tool call
// starts, libtandem asks for its next call's cgroup; the next call with the
// same limits starts in that one, which carries them, without a round trip.
// A call with other limits asks the ordinary way and leaves it for later;
// the session's close removes it.
TEST_F(ToolPool, TheNextCallStartsInTheCgroupAskedAhead) {
  start("[tools]\npids_max = 77\n");
  const auto s = open_session("pool-ahead");
  EXPECT_EQ(wait(spawn(s, {"exit", "0"})).exit_code, 0);
  ASSERT_TRUE(eventually([&] { return status()["host"]["ahead"]["held"] == 1; })) << status().dump();
  std::uint64_t ahead_id = 0;
  const auto tools = ctl(daemon_->socket_path(), "tools");
  for (const auto& c : tools["sessions"][0]["calls"]) {
    if (c["ahead"] == true) {
      EXPECT_EQ(c["pid"], 0);
      ahead_id = c["cgroup_id"].get<std::uint64_t>();
    }
  }
  ASSERT_NE(ahead_id, 0u) << tools.dump();

  const pid_t pid = spawn(s, {"sleep", "30"});
  ASSERT_GT(pid, 0);
  tandem_tool_info info{};
  info.sz = sizeof info;
  ASSERT_EQ(tandem_tool_info_get(runner_, pid, &info), 0);
  EXPECT_EQ(info.cgroup_id, ahead_id);
  if (serving("pids") != nullptr) {
    EXPECT_EQ(knob("pids", session_rel(s) + "/" + cgroup_name(pid), "pids.max"), "77");
  }
  tandem_client_stats st{};
  st.sz = sizeof st;
  ASSERT_EQ(tandem_get_stats(runner_, &st), 0);
  EXPECT_EQ(st.tools_placed_ahead, 1u);
  // The next one is asked as this one starts.
  EXPECT_TRUE(eventually([&] {
    const auto a = status()["host"]["ahead"];
    return a["held"] == 1 && a["prepared"] == 2;
  })) << status().dump();

  tandem_tool_options tighter{};
  tighter.sz = sizeof tighter;
  tighter.pids_max = 50;
  const pid_t other = spawn(s, {"sleep", "30"}, &tighter);
  ASSERT_GT(other, 0);
  ASSERT_EQ(tandem_tool_info_get(runner_, other, &info), 0);
  EXPECT_NE(info.cgroup_id, ahead_id);
  if (serving("pids") != nullptr) {
    EXPECT_EQ(knob("pids", session_rel(s) + "/" + cgroup_name(other), "pids.max"), "50");
  }
  ASSERT_EQ(tandem_get_stats(runner_, &st), 0);
  EXPECT_EQ(st.tools_placed_ahead, 1u);
  EXPECT_EQ(status()["host"]["ahead"]["held"], 1) << "kept for a later call with its limits";

  ASSERT_EQ(tandem_session_close(runner_, s, TANDEM_CLOSE_NORMAL), 0);
  for (const Hier& h : hier_) {
    EXPECT_TRUE(eventually([&] { return !std::filesystem::exists(h.path + "/" + session_rel(s)); })) << h.path;
  }
  EXPECT_EQ(status()["host"]["ahead"]["held"], 0);
}

// With [tools] ahead = false nothing is asked ahead.
TEST_F(ToolPool, PlacementAheadOffAsksEachCallWhenItStarts) {
  start("[tools]\nahead = false\n");
  const auto s = open_session("pool-no-ahead");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(wait(spawn(s, {"exit", "0"})).exit_code, 0);
  const auto st = status();
  EXPECT_EQ(st["host"]["ahead"]["enabled"], false);
  EXPECT_EQ(st["host"]["ahead"]["prepared"], 0);
  EXPECT_EQ(st["host"]["tools_prepared"], 3);
  tandem_client_stats cs{};
  cs.sz = sizeof cs;
  ASSERT_EQ(tandem_get_stats(runner_, &cs), 0);
  EXPECT_EQ(cs.tools_placed_ahead, 0u);
}

// A tool from a pooled cgroup that moves itself out still dies with its
// session: it is tracked by its cgroup id from the moment it is handed out.
TEST_F(ToolPool, AToolThatEscapesAPooledCgroupDiesWithItsSession) {
  start();
  if (status()["host"]["telemetry_mode"] != "ebpf") GTEST_SKIP() << "needs eBPF telemetry for the fork tree";
  const Hier* v2 = nullptr;
  for (const Hier& h : hier_) {
    if (h.v2) v2 = &h;
  }
  ASSERT_NE(v2, nullptr);
  const std::string escape = v2->path + "/escape";
  ASSERT_EQ(::mkdir(escape.c_str(), 0755), 0) << escape << ": " << std::strerror(errno);
  const auto s = open_session("pool-escape");
  EXPECT_EQ(wait(spawn(s, {"exit", "0"})).exit_code, 0);
  ASSERT_TRUE(pool_ready()) << status().dump();
  const int hits = pool()["hits"].get<int>();
  const std::string pidfile = dir_.path() + "/escaped.pid";
  const std::string script = "sh -c 'echo $$ > " + escape + "/cgroup.procs && echo $$ > " + pidfile + ".tmp && mv " +
                             pidfile + ".tmp " + pidfile + " && exec sleep 1000' & exec sleep 1000";
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  std::int32_t pid = 0;
  ASSERT_EQ(tandem_tool_spawn(runner_, s, "sh", argv, nullptr, nullptr, nullptr, &pid), 0)
      << tandem_last_error(runner_);
  EXPECT_EQ(pool()["hits"].get<int>(), hits + 1) << "the escaping tool did not get a pooled cgroup";
  pid_t escaped = 0;
  ASSERT_TRUE(eventually([&] {
    std::ifstream in(pidfile);
    return static_cast<bool>(in >> escaped) && escaped > 0;
  })) << "the child did not get out";
  ASSERT_NE(slurp(fmt::format("/proc/{}/cgroup", escaped)).find("/escape"), std::string::npos);
  const int killed = status()["host"].value("lineage_killed", 0);
  ASSERT_EQ(tandem_session_close(runner_, s, TANDEM_CLOSE_NORMAL), 0);
  (void)tandem_poll(runner_, 0, 0, nullptr);
  EXPECT_TRUE(eventually([&] { return !alive(escaped); }, 3s)) << "pid " << escaped << " outlived its session";
  EXPECT_GT(status()["host"].value("lineage_killed", 0), killed);
  if (alive(escaped)) ::kill(escaped, SIGKILL);
  (void)::rmdir(escape.c_str());
}

// tandemd killed (-9) while it fills a session's pool leaves pooled cgroups
// behind; the next one removes them at start, and its stop leaves nothing.
TEST_F(ToolPool, NothingLeaksAfterAKill9MidRefill) {
  start("[tools]\npool_per_session = 64\npool_max = 256\n");
  const auto s = open_session("pool-kill9");
  // A quick run of calls lifts the session's rate, and so its target, far
  // above what one tick makes.
  for (int i = 0; i < 30; ++i) EXPECT_EQ(wait(spawn(s, {"exit", "0"})).exit_code, 0);
  ASSERT_TRUE(eventually([&] { return pool()["ready"].get<int>() >= 1; }));
  daemon_->kill9();
  std::size_t left = 0;
  for (const Hier& h : hier_) left += pool_dirs(h, session_rel(s)).size();
  ASSERT_GT(left, 0u) << "nothing was left to clean up: the test proves nothing";

  daemon_->start();
  // Our runner reconnects and resyncs; its session is adopted and the old
  // pooled cgroups are gone.
  ASSERT_TRUE(eventually([&] {
    (void)tandem_poll(runner_, 10, 0, nullptr);
    return tandem_connected(runner_) == 1 && status()["sessions"]["total"] == 1;
  })) << daemon_->log();
  for (const Hier& h : hier_) EXPECT_TRUE(pool_dirs(h, session_rel(s)).empty()) << h.path;
  // The new run's own pool, made once the session calls again, goes with the session.
  EXPECT_EQ(wait(spawn(s, {"exit", "0"})).exit_code, 0);
  ASSERT_TRUE(pool_ready()) << status().dump();
  ASSERT_EQ(tandem_session_close(runner_, s, TANDEM_CLOSE_NORMAL), 0);
  for (const Hier& h : hier_) {
    EXPECT_TRUE(eventually([&] { return !std::filesystem::exists(h.path + "/" + session_rel(s)); })) << h.path;
  }
  EXPECT_TRUE(eventually([&] { return status()["host"]["pool"]["ready"] == 0; }));
  // Stopping leaves no cgroup at all.
  tandem_close(runner_);
  runner_ = nullptr;
  EXPECT_EQ(daemon_->stop(), 0);
  for (const Hier& h : hier_) EXPECT_FALSE(std::filesystem::exists(h.path)) << h.path << " left behind";
}

// A daemon stopped while a session has ready cgroups removes them, also
// from a folder it keeps for the next tandemd because a tool still runs
// there; and with nothing running it leaves no cgroup at all.
TEST_F(ToolPool, DaemonStopRemovesReadyCgroups) {
  start("", "on_restart = \"reap\"\n");
  const auto s = open_session("pool-stop");
  EXPECT_EQ(wait(spawn(s, {"exit", "0"})).exit_code, 0);
  ASSERT_TRUE(pool_ready()) << status().dump();
  const pid_t running = spawn(s, {"sleep", "30"});
  ASSERT_GT(running, 0);
  ASSERT_TRUE(pool_ready()) << status().dump();
  EXPECT_EQ(daemon_->stop(), 0);
  // Kept for adoption: the folder, and the cgroup the tool runs in; no ready one.
  const std::string running_cg = cgroup_name(running);
  for (const Hier& h : hier_) {
    ASSERT_TRUE(std::filesystem::exists(h.path + "/" + session_rel(s))) << h.path;
    for (const std::string& n : pool_dirs(h, session_rel(s))) EXPECT_EQ(n, running_cg) << h.path << " kept " << n;
  }
  ASSERT_EQ(tandem_tool_kill(runner_, running), 0);
  (void)wait(running, 5000);
  tandem_close(runner_);
  runner_ = nullptr;
  daemon_->start();  // on_restart = "reap": removes what is left (the tool's empty cgroup, the folder) at once
  EXPECT_TRUE(eventually([&] { return status()["host"]["sessions"] == 0; })) << status().dump();
  EXPECT_EQ(daemon_->stop(), 0);
  for (const Hier& h : hier_) EXPECT_FALSE(std::filesystem::exists(h.path)) << h.path << " left behind";
}

}  // namespace
}  // namespace tandem::it
