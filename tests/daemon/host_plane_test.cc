// daemon::HostPlane in-process on a fake cgroupfs and procfs
// (tests/cpu/fake_cgroupfs.h) as a normal user: tool calls placed with their
// limits in v2, hybrid and v1 trees, the policy's CPU actions on the session
// folder, the memory rules' throttle, freeze and stall kill written to the
// files, usage and pressure read from them, the warm pool, recycling, session
// end and restart. Processes a test lists in a fake cgroup.procs are its own
// children (Sleeper), since the plane signals what it finds there. The same
// plane on the kernel's cgroups, with real tools, is
// tests/integration/tools_test.cc and tool_pool_test.cc (root).
#include "daemon/host_plane.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sched/model.h"
#include "tests/cpu/fake_cgroupfs.h"

namespace tandem::daemon {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::FakeCgroupfs;

constexpr sched::SessionId kSession = 0xab;
const std::string kSessionDir = "tools/00000000000000ab";

std::string call_dir(std::uint32_t call) { return fmt::format("{}/{}", kSessionDir, call); }

std::uint64_t inode(const std::filesystem::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_ino;
}

// A child of the test that waits to be killed: what a test lists in a fake
// cgroup.procs. Killed and reaped at the end if the plane did not kill it.
// Thread-safety: the test's thread.
class Sleeper {
 public:
  Sleeper() : pid_(::fork()) {
    if (pid_ == 0) {
      // As an exec'd tool would, it holds none of the test's fds (the
      // plane's lock on the subtree among them).
      (void)::close_range(3, ~0U, 0);
      ::pause();
      ::_exit(0);
    }
  }
  ~Sleeper() {
    if (pid_ > 0 && !reaped_ && ::kill(pid_, SIGKILL) == 0) (void)::waitpid(pid_, nullptr, 0);
  }
  Sleeper(const Sleeper&) = delete;
  Sleeper& operator=(const Sleeper&) = delete;
  int pid() const { return pid_; }
  // Waits for it; true if SIGKILL ended it.
  bool killed() {
    int status = 0;
    if (::waitpid(pid_, &status, 0) != pid_) return false;
    reaped_ = true;
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  }

 private:
  pid_t pid_;
  bool reaped_ = false;
};

class HostPlaneFake : public ::testing::Test {
 protected:
  void open(std::vector<testing::FakeMount> mounts, HostConfig config = {}) {
    fs_ = std::make_unique<FakeCgroupfs>(std::move(mounts));
    config_ = std::move(config);
    plane_ = open_plane();
    ASSERT_TRUE(plane_);
  }
  std::unique_ptr<HostPlane> open_plane() {
    HostConfig c = config_;
    c.telemetry = "sampling";  // the sampler on the fake procfs; eBPF would need the kernel's cgroups
    HostEnv env;
    env.cgroups = fs_->options();
    env.proc_root = fs_->proc().string();
    auto p = HostPlane::open(c, now_, env);
    EXPECT_TRUE(p) << p.error().message();
    if (!p) return nullptr;
    (*p)->set_notice_sink([this](const ToolNotice& n) { notices_.push_back(n); });
    return std::move(*p);
  }
  base::Result<ToolGrant> prepare(std::uint32_t call, ipc::ToolLimitsInfo limits = {}, bool ahead = false) {
    ToolRequest r;
    r.session = kSession;
    r.call = call;
    r.limits = limits;
    r.ahead = ahead;
    return plane_->prepare_tool(r);
  }
  // One host period later.
  std::optional<sched::CpuView> tick() {
    now_ += milliseconds(300);
    return plane_->host_tick(now_, model_);
  }
  nlohmann::json status() const {
    nlohmann::json j;
    plane_->status(j);
    return j;
  }

  std::unique_ptr<FakeCgroupfs> fs_;  // outlives plane_, whose manager uses its hooks
  HostConfig config_;
  std::vector<ToolNotice> notices_;
  base::Time now_ = base::Time{} + seconds(1000);
  sched::NodeModel model_;
  std::unique_ptr<HostPlane> plane_;
};

ipc::ToolLimitsInfo tight() {
  ipc::ToolLimitsInfo l;
  l.memory_high = 64 << 20;
  l.memory_max = 128 << 20;
  l.cpu_quota_us = 50000;
  l.cpu_period_us = 100000;
  l.pids_max = 100;
  return l;
}

TEST_F(HostPlaneFake, V2PlacesACallWithItsLimits) {
  open(FakeCgroupfs::pure_v2());
  EXPECT_TRUE(fs_->has("cgroup", "engines"));
  EXPECT_TRUE(fs_->has("cgroup", "tools"));
  auto g = prepare(1, tight());
  ASSERT_TRUE(g) << g.error().message();
  EXPECT_EQ(fs_->read("cgroup", call_dir(1), "memory.high"), "67108864");
  EXPECT_EQ(fs_->read("cgroup", call_dir(1), "memory.max"), "134217728");
  EXPECT_EQ(fs_->read("cgroup", call_dir(1), "pids.max"), "100");
  EXPECT_EQ(fs_->read("cgroup", call_dir(1), "cpu.max"), "50000 100000");
  EXPECT_TRUE(g->info.has_v2);
  EXPECT_EQ(g->info.v1_count, 0u);
  ASSERT_EQ(g->fds.size(), 1u);
  EXPECT_EQ(g->info.cgroup_id, inode(fs_->dir("cgroup", call_dir(1))));
  EXPECT_EQ(plane_->tool_cgroups(kSession), 1u);

  const nlohmann::json s = status();
  EXPECT_EQ(s["cgroups"], plane_->cgroups().describe());
  EXPECT_EQ(s["unsupported_limits"], 0);
  EXPECT_EQ(s["telemetry_mode"], "sampling");
  EXPECT_EQ(s["tools_prepared"], 1);
  EXPECT_EQ(s["pool"]["misses"], 1);

  auto twice = prepare(1);
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error().code(), EEXIST);
  ToolRequest none;
  auto zero = plane_->prepare_tool(none);
  ASSERT_FALSE(zero);
  EXPECT_EQ(zero.error().code(), EINVAL);
}

TEST_F(HostPlaneFake, HybridPlacesACallInEveryHierarchy) {
  open(FakeCgroupfs::hybrid("/process_api/abc"));
  auto g = prepare(1, tight());
  ASSERT_TRUE(g) << g.error().message();
  EXPECT_EQ(fs_->read("memory", call_dir(1), "memory.limit_in_bytes"), "67108864");
  EXPECT_EQ(fs_->read("memory", call_dir(1), "memory.oom_control"), "oom_kill_disable 1\nunder_oom 0\noom_kill 0\n");
  EXPECT_EQ(fs_->read("cpu", call_dir(1), "cpu.cfs_quota_us"), "50000");
  EXPECT_EQ(fs_->read("pids", call_dir(1), "pids.max"), "100");
  EXPECT_EQ(g->info.cgroup_id, inode(fs_->dir("unified", call_dir(1))));
  EXPECT_TRUE(g->info.has_v2);
  EXPECT_EQ(g->info.v1_count, 4u);  // cpu, cpuset, memory, pids
  EXPECT_EQ(g->fds.size(), 5u);
  EXPECT_EQ(g->info.cpu_fd, 0);
  EXPECT_EQ(g->info.memory_fd, 2);
  EXPECT_EQ(g->info.cpuacct_fd, -1);  // v2's cpu.stat
  EXPECT_EQ(status()["unsupported_limits"], static_cast<std::uint32_t>(cpu::kNoMemoryLow));
}

TEST_F(HostPlaneFake, ConfiguredCpusetsLandOnEnginesAndTools) {
  HostConfig c;
  c.engine_cpus = "0";
  c.tool_cpus = "1";
  open(FakeCgroupfs::hybrid(), c);
  EXPECT_EQ(fs_->read("cpuset", "engines", "cpuset.cpus"), "0");
  EXPECT_EQ(fs_->read("cpuset", "tools", "cpuset.cpus"), "1");
  auto view = tick();
  ASSERT_TRUE(view);
  EXPECT_EQ(view->tool_cores, 1u);
}

TEST_F(HostPlaneFake, CpuActionsSitOnTheSessionFolder) {
  for (bool v2 : {true, false}) {
    SCOPED_TRACE(v2 ? "v2" : "hybrid");
    plane_.reset();
    open(v2 ? FakeCgroupfs::pure_v2() : FakeCgroupfs::hybrid());
    const char* cpu = v2 ? "cgroup" : "cpu";
    // Before the session has a folder: kept, applied with its first call.
    plane_->set_cpu_weight(kSession, 250);
    EXPECT_FALSE(fs_->has(cpu, kSessionDir));
    ASSERT_TRUE(prepare(1));
    EXPECT_EQ(fs_->read(cpu, kSessionDir, v2 ? "cpu.weight" : "cpu.shares"), v2 ? "250" : "2560");
    plane_->set_cpu_quota(kSession, 20000);
    EXPECT_EQ(fs_->read(cpu, kSessionDir, v2 ? "cpu.max" : "cpu.cfs_quota_us"), v2 ? "20000 100000" : "20000");
    plane_->set_cpu_quota(kSession, 0);
    EXPECT_EQ(fs_->read(cpu, kSessionDir, v2 ? "cpu.max" : "cpu.cfs_quota_us"), v2 ? "max 100000" : "-1");
    plane_->set_cpu_weight(kSession, 0);  // out of range: ignored
    EXPECT_EQ(fs_->read(cpu, kSessionDir, v2 ? "cpu.weight" : "cpu.shares"), v2 ? "250" : "2560");
  }
}

TEST_F(HostPlaneFake, MemoryRulesThrottleAndFreezeThenUndo) {
  for (bool v2 : {true, false}) {
    SCOPED_TRACE(v2 ? "v2" : "hybrid");
    plane_.reset();
    open(v2 ? FakeCgroupfs::pure_v2() : FakeCgroupfs::hybrid());
    const char* mem = v2 ? "cgroup" : "memory";
    const char* freezer = v2 ? "cgroup" : "unified";
    ASSERT_TRUE(prepare(1));
    ipc::ToolLimitsInfo low;
    low.low_priority = true;
    ASSERT_TRUE(prepare(2, low));
    fs_->write(mem, call_dir(1), v2 ? "memory.current" : "memory.usage_in_bytes", "104857600\n");  // 100 MiB
    fs_->write(mem, call_dir(2), v2 ? "memory.current" : "memory.usage_in_bytes", "52428800\n");   // 50 MiB
    fs_->set_node_pressure("memory", 50.0);  // over pressure_critical (40)
    ASSERT_TRUE(tick());
    // Held at their size plus 16 MiB; the low-priority one also frozen.
    const char* high = v2 ? "memory.high" : "memory.limit_in_bytes";
    EXPECT_EQ(fs_->read(mem, call_dir(1), high), std::to_string((100 + 16) << 20));
    EXPECT_EQ(fs_->read(mem, call_dir(2), high), std::to_string((50 + 16) << 20));
    if (!v2) {
      EXPECT_EQ(fs_->read(mem, call_dir(1), "memory.oom_control"), "oom_kill_disable 1\nunder_oom 0\noom_kill 0\n");
    }
    EXPECT_EQ(fs_->read(freezer, call_dir(1), "cgroup.freeze"), "0\n");  // never written
    EXPECT_EQ(fs_->read(freezer, call_dir(2), "cgroup.freeze"), "1");
    nlohmann::json s = status();
    EXPECT_EQ(s["memory_pressure"], "critical");
    EXPECT_DOUBLE_EQ(s["memory_psi_some_avg10"].get<double>(), 50.0);
    EXPECT_EQ(s["throttles"], 2);
    EXPECT_EQ(s["freezes"], 1);
    EXPECT_EQ(s["tools_memory_bytes"], 150 << 20);

    // Below half of pressure_high: both undone, the calls' own limits back.
    fs_->set_node_pressure("memory", 1.0);
    ASSERT_TRUE(tick());
    EXPECT_EQ(fs_->read(mem, call_dir(1), high), v2 ? "max" : "-1");
    if (v2) {
      EXPECT_EQ(fs_->read(mem, call_dir(1), "memory.max"), "max");
    } else {
      EXPECT_EQ(fs_->read(mem, call_dir(1), "memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n");
    }
    EXPECT_EQ(fs_->read(freezer, call_dir(2), "cgroup.freeze"), "0");
    EXPECT_EQ(status()["memory_pressure"], "normal");
    EXPECT_TRUE(notices_.empty());
  }
}

TEST_F(HostPlaneFake, ALowPriorityClassIsFrozenAtCritical) {
  open(FakeCgroupfs::pure_v2());
  // The policy's view: the session is of priority class 2 (batch).
  ASSERT_TRUE(model_.observe(sched::SessionOpened{kSession, 2}, now_));
  ASSERT_TRUE(prepare(1));
  fs_->set_node_pressure("memory", 20.0);  // high: throttled, not frozen
  ASSERT_TRUE(tick());
  EXPECT_EQ(fs_->read("cgroup", call_dir(1), "memory.high"), std::to_string(16 << 20));
  EXPECT_EQ(fs_->read("cgroup", call_dir(1), "cgroup.freeze"), "0\n");
  fs_->set_node_pressure("memory", 45.0);  // critical
  ASSERT_TRUE(tick());
  EXPECT_EQ(fs_->read("cgroup", call_dir(1), "cgroup.freeze"), "1");
  // Killed frozen: thawed first, so that it can die.
  plane_->kill_tools(kSession, ipc::ToolExitReason::kKilledPolicy);
  EXPECT_EQ(fs_->read("cgroup", call_dir(1), "cgroup.freeze"), "0");
}

TEST_F(HostPlaneFake, AToolStalledAtItsLimitIsKilledAndItsRunnerTold) {
  HostConfig c;
  c.stall_kill_after = seconds(1);
  open(FakeCgroupfs::hybrid(), c);
  ASSERT_TRUE(prepare(1, tight()));
  ASSERT_TRUE(prepare(2, tight()));
  fs_->write("memory", call_dir(1), "memory.oom_control", "oom_kill_disable 1\nunder_oom 1\noom_kill 0\n");
  ASSERT_TRUE(tick());  // stalled from now
  EXPECT_TRUE(notices_.empty());
  now_ += milliseconds(800);
  ASSERT_TRUE(tick());  // 1.1 s: killed (no process in the fake cgroup: nothing left to wait for)
  ASSERT_EQ(notices_.size(), 1u);
  EXPECT_EQ(notices_[0].session, kSession);
  EXPECT_EQ(notices_[0].call, 1u);
  EXPECT_EQ(notices_[0].reason, ipc::ToolExitReason::kKilledMemory);
  EXPECT_NE(notices_[0].message.find("stalled at its memory limit"), std::string::npos) << notices_[0].message;
  EXPECT_EQ(status()["tools_killed"], 1);
}

TEST_F(HostPlaneFake, KillToolsSignalsTheRunningCallsAndTellsTheRunnerFirst) {
  open(FakeCgroupfs::pure_v2());
  ASSERT_TRUE(prepare(1));
  ASSERT_TRUE(prepare(2));
  ASSERT_TRUE(prepare(3));
  plane_->tool_ended(kSession, 3);  // ended: not killed
  Sleeper tool;
  fs_->set_procs("cgroup", call_dir(2), {tool.pid()});
  plane_->kill_tools(kSession, ipc::ToolExitReason::kKilledPolicy);
  ASSERT_EQ(notices_.size(), 2u);
  EXPECT_EQ(notices_[0].call, 1u);
  EXPECT_EQ(notices_[1].call, 2u);
  for (const ToolNotice& n : notices_) {
    EXPECT_EQ(n.reason, ipc::ToolExitReason::kKilledPolicy);
    EXPECT_EQ(n.message, "the scheduling policy ended it");
  }
  EXPECT_TRUE(tool.killed());
  EXPECT_EQ(fs_->read("cgroup", call_dir(2), "cgroup.kill"), "1");
  EXPECT_EQ(fs_->read("cgroup", call_dir(1), "cgroup.kill"), "");  // empty: nothing to do
  EXPECT_EQ(status()["tools_killed"], 2);
  EXPECT_TRUE(fs_->has("cgroup", call_dir(1)));                    // killing is not removing
  plane_->kill_tools(0x1234, ipc::ToolExitReason::kKilledPolicy);  // no such session: nothing
  EXPECT_EQ(notices_.size(), 2u);
}

TEST_F(HostPlaneFake, SessionEndRemovesItsFolderInEveryHierarchy) {
  open(FakeCgroupfs::hybrid());
  ASSERT_TRUE(prepare(1));
  ASSERT_TRUE(prepare(2));
  ASSERT_TRUE(tick());  // the warm pool fills the session's folder
  EXPECT_GT(plane_->pool_ready(), 0u);
  plane_->session_gone(kSession);
  for (const char* mount : {"unified", "cpu", "cpuset", "memory", "pids"}) {
    EXPECT_FALSE(fs_->has(mount, kSessionDir)) << mount;
    EXPECT_TRUE(fs_->has(mount, "tools")) << mount;
  }
  EXPECT_EQ(plane_->sessions(), 0u);
  EXPECT_EQ(plane_->pool_ready(), 0u);
  EXPECT_EQ(plane_->pending_removals(), 0u);
  EXPECT_TRUE(plane_->survivors(kSession).empty());
}

TEST_F(HostPlaneFake, ASessionWhoseProcessesSurviveIsRetriedEachTick) {
  open(FakeCgroupfs::pure_v2());
  ASSERT_TRUE(prepare(1));
  Sleeper tool;
  fs_->set_procs("cgroup", call_dir(1), {tool.pid()});
  plane_->tool_started(kSession, 1, tool.pid());
  plane_->session_gone(kSession);
  ASSERT_EQ(notices_.size(), 1u);
  EXPECT_EQ(notices_[0].reason, ipc::ToolExitReason::kKilledSession);
  EXPECT_TRUE(tool.killed());
  // The fake still lists it: kept for the next tick, reported as a survivor.
  EXPECT_EQ(plane_->pending_removals(), 1u);
  EXPECT_EQ(plane_->survivors(kSession), std::vector<std::int32_t>{tool.pid()});
  EXPECT_TRUE(fs_->has("cgroup", call_dir(1)));
  fs_->set_procs("cgroup", call_dir(1), {});
  ASSERT_TRUE(tick());
  EXPECT_EQ(plane_->pending_removals(), 0u);
  EXPECT_FALSE(fs_->has("cgroup", kSessionDir));
  EXPECT_TRUE(plane_->survivors(kSession).empty());
}

TEST_F(HostPlaneFake, UsageAndPressureComeFromTheFiles) {
  for (bool v2 : {true, false}) {
    SCOPED_TRACE(v2 ? "v2" : "v1");
    plane_.reset();
    open(v2 ? FakeCgroupfs::pure_v2() : FakeCgroupfs::pure_v1());
    ASSERT_TRUE(prepare(1));
    if (v2) {
      fs_->write("cgroup", call_dir(1), "cpu.stat", "usage_usec 2000000\nuser_usec 0\nsystem_usec 0\n");
      fs_->write("cgroup", call_dir(1), "memory.current", "5242880\n");
      fs_->write("cgroup", "tools", "cpu.pressure", "some avg10=7.50 avg60=0.00 avg300=0.00 total=1\n");
    } else {
      fs_->write("cpu,cpuacct", call_dir(1), "cpuacct.usage", "2000000000\n");
      fs_->write("memory", call_dir(1), "memory.usage_in_bytes", "5242880\n");
      fs_->set_node_pressure("cpu", 7.5);  // no per-cgroup pressure on v1: the node's
    }
    fs_->set_node_pressure("memory", 3.0);
    auto view = tick();
    ASSERT_TRUE(view);
    EXPECT_DOUBLE_EQ(view->psi_some_avg10, 7.5);
    const nlohmann::json s = status();
    EXPECT_EQ(s["tools_memory_bytes"], 5 << 20);
    EXPECT_DOUBLE_EQ(s["tools_cpu_seconds"].get<double>(), 2.0);
    EXPECT_DOUBLE_EQ(s["memory_psi_some_avg10"].get<double>(), 3.0);
    EXPECT_DOUBLE_EQ(s["cpu_psi_some_avg10"].get<double>(), 7.5);
    EXPECT_EQ(s["memory_pressure"], "normal");
    nlohmann::json tools;
    plane_->tools(tools);
    ASSERT_EQ(tools.size(), 1u);
    EXPECT_EQ(tools[0]["session"], "00000000000000ab");
    ASSERT_EQ(tools[0]["calls"].size(), 1u);
    EXPECT_EQ(tools[0]["calls"][0]["memory_bytes"], 5 << 20);
  }
}

// What the policy sees of the host's memory (sched::HostMemoryView, the
// input of tandem's host_admission): the [memory] budget as capacity, the
// tools' memory, node memory PSI, OOM and rule kills, and the 95th
// percentile of ended calls' peaks.
TEST_F(HostPlaneFake, TheHostMemoryViewComesFromTheToolsCgroups) {
  for (bool v2 : {true, false}) {
    SCOPED_TRACE(v2 ? "v2" : "v1");
    plane_.reset();
    HostConfig config;
    config.tools_budget = 1ull << 30;
    open(v2 ? FakeCgroupfs::pure_v2() : FakeCgroupfs::pure_v1(), config);
    EXPECT_FALSE(plane_->host_memory()) << "nothing sampled yet";
    ASSERT_TRUE(prepare(1));
    ASSERT_TRUE(prepare(2));
    const char* mem = v2 ? "cgroup" : "memory";
    if (v2) {
      fs_->write(mem, call_dir(1), "memory.current", "104857600\n");  // 100 MiB
      fs_->write(mem, call_dir(1), "memory.peak", "314572800\n");     // 300 MiB
      fs_->write(mem, call_dir(1), "memory.events", "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n");
      fs_->write(mem, call_dir(2), "memory.current", "52428800\n");  // 50 MiB
    } else {
      fs_->write(mem, call_dir(1), "memory.usage_in_bytes", "104857600\n");
      fs_->write(mem, call_dir(1), "memory.max_usage_in_bytes", "314572800\n");
      fs_->write(mem, call_dir(1), "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n");
      fs_->write(mem, call_dir(2), "memory.usage_in_bytes", "52428800\n");
    }
    fs_->set_node_pressure("memory", 3.0);
    ASSERT_TRUE(tick());
    auto m = plane_->host_memory();
    ASSERT_TRUE(m);
    EXPECT_EQ(m->capacity_bytes, 1ull << 30);
    EXPECT_EQ(m->used_bytes, 150ull << 20);
    EXPECT_DOUBLE_EQ(m->psi_some_avg10, 3.0);
    EXPECT_EQ(m->kills, 1u) << "call 1's OOM kill";
    EXPECT_EQ(m->tool_peak_p95_bytes, 0u) << "no call has ended";

    // Call 1 ends; its cgroup goes at the next tick, and its peak joins the recent peaks.
    plane_->tool_ended(kSession, 1);
    ASSERT_TRUE(tick());
    m = plane_->host_memory();
    ASSERT_TRUE(m);
    EXPECT_EQ(m->tool_peak_p95_bytes, 300ull << 20);
    EXPECT_EQ(m->used_bytes, 50ull << 20);
    EXPECT_EQ(m->kills, 1u) << "counted once";
    EXPECT_EQ(status()["memory_kills"], 1);
    EXPECT_EQ(status()["tool_peak_p95_bytes"], 300 << 20);
  }
}

// On v1 a throttled tool waits at its limit (under_oom), which PSI does not
// count: the plane sums that wait over calls, each sample charged the time
// since the one before (status tools_memory_stalled_seconds).
TEST_F(HostPlaneFake, TimeAtTheMemoryLimitIsSummedOverCalls) {
  open(FakeCgroupfs::pure_v1());
  ASSERT_TRUE(prepare(1));
  ASSERT_TRUE(prepare(2));
  fs_->write("memory", call_dir(1), "memory.usage_in_bytes", "1048576\n");
  fs_->write("memory", call_dir(2), "memory.usage_in_bytes", "1048576\n");
  fs_->write("memory", call_dir(1), "memory.oom_control", "oom_kill_disable 1\nunder_oom 0\noom_kill 0\n");
  fs_->write("memory", call_dir(2), "memory.oom_control", "oom_kill_disable 1\nunder_oom 0\noom_kill 0\n");
  ASSERT_TRUE(tick());
  EXPECT_DOUBLE_EQ(status()["tools_memory_stalled_seconds"].get<double>(), 0.0) << "nothing waits";
  fs_->write("memory", call_dir(1), "memory.oom_control", "oom_kill_disable 1\nunder_oom 1\noom_kill 0\n");
  ASSERT_TRUE(tick());  // 300 ms later: call 1 waits
  EXPECT_NEAR(status()["tools_memory_stalled_seconds"].get<double>(), 0.3, 1e-9);
  fs_->write("memory", call_dir(2), "memory.oom_control", "oom_kill_disable 1\nunder_oom 1\noom_kill 0\n");
  ASSERT_TRUE(tick());  // both wait
  EXPECT_NEAR(status()["tools_memory_stalled_seconds"].get<double>(), 0.9, 1e-9);
  fs_->write("memory", call_dir(1), "memory.oom_control", "oom_kill_disable 1\nunder_oom 0\noom_kill 0\n");
  fs_->write("memory", call_dir(2), "memory.oom_control", "oom_kill_disable 1\nunder_oom 0\noom_kill 0\n");
  ASSERT_TRUE(tick());
  EXPECT_NEAR(status()["tools_memory_stalled_seconds"].get<double>(), 0.9, 1e-9) << "no wait, no charge";
}

TEST_F(HostPlaneFake, WithoutABudgetTheHostMemoryViewHasNoCapacity) {
  open(FakeCgroupfs::pure_v2());
  ASSERT_TRUE(prepare(1));
  fs_->write("cgroup", call_dir(1), "memory.current", "1048576\n");
  ASSERT_TRUE(tick());
  auto m = plane_->host_memory();
  ASSERT_TRUE(m);
  EXPECT_EQ(m->capacity_bytes, 0u) << "no [memory] tools_budget: policies must not gate on it";
  EXPECT_EQ(m->used_bytes, 1u << 20);
}

TEST_F(HostPlaneFake, TheWarmPoolHandsOutReadyCgroupsWithTheToolsLimits) {
  open(FakeCgroupfs::pure_v2());
  ASSERT_TRUE(prepare(1));  // cold: nothing ready yet
  ASSERT_TRUE(tick());
  ASSERT_GT(plane_->pool_ready(), 0u);
  EXPECT_TRUE(fs_->has("cgroup", kSessionDir + "/pool-1"));
  EXPECT_EQ(fs_->read("cgroup", kSessionDir + "/pool-1", "pids.max"), "4096");  // [tools] pids_max
  EXPECT_EQ(fs_->read("cgroup", kSessionDir + "/pool-1", "memory.high"), "max");
  const std::size_t ready = plane_->pool_ready();
  ipc::ToolLimitsInfo tighter;
  tighter.memory_high = 32 << 20;
  auto g = prepare(2, tighter);
  ASSERT_TRUE(g) << g.error().message();
  EXPECT_EQ(plane_->pool_hits(), 1u);
  EXPECT_EQ(plane_->pool_misses(), 1u);
  EXPECT_EQ(plane_->pool_ready(), ready - 1);
  // The one handed out is a pool directory, with the runner's limit added.
  bool found = false;
  for (std::uint64_t n = 1; n <= ready; ++n) {
    const std::string rel = fmt::format("{}/pool-{}", kSessionDir, n);
    if (!fs_->has("cgroup", rel) || inode(fs_->dir("cgroup", rel)) != g->info.cgroup_id) continue;
    found = true;
    EXPECT_EQ(fs_->read("cgroup", rel, "memory.high"), std::to_string(32 << 20));
  }
  EXPECT_TRUE(found);
  EXPECT_FALSE(fs_->has("cgroup", call_dir(2)));
}

TEST_F(HostPlaneFake, EndedCallsAreRemovedOnceEmpty) {
  HostConfig c;
  c.pool_max = 0;  // no pool: only the calls' own cgroups
  open(FakeCgroupfs::hybrid(), c);
  ASSERT_TRUE(prepare(1));
  ASSERT_TRUE(prepare(2));
  Sleeper leftover;  // a daemonised process of call 2, still in its cgroup
  fs_->set_procs("memory", call_dir(2), {leftover.pid()});
  plane_->tool_ended(kSession, 1);
  plane_->tool_ended(kSession, 2);
  ASSERT_TRUE(tick());
  for (const char* mount : {"unified", "cpu", "cpuset", "memory", "pids"}) {
    EXPECT_FALSE(fs_->has(mount, call_dir(1))) << mount;
  }
  EXPECT_TRUE(fs_->has("memory", call_dir(2)));
  EXPECT_EQ(plane_->tool_cgroups(kSession), 1u);
  fs_->set_procs("memory", call_dir(2), {});
  ASSERT_TRUE(tick());
  EXPECT_FALSE(fs_->has("memory", call_dir(2)));
  EXPECT_EQ(plane_->tool_cgroups(kSession), 0u);
}

// A placement ahead (the session's next call, asked early) is a call cgroup
// like any other, but outside tools_per_session's count until TOOL_START
// names it; a stop removes it when no tool started in it.
TEST_F(HostPlaneFake, APlacementAheadCountsOnceItsToolStartsAndGoesAtStopIfUnused) {
  open(FakeCgroupfs::pure_v2());
  ASSERT_TRUE(prepare(1));
  plane_->tool_started(kSession, 1, 100);
  EXPECT_FALSE(plane_->tool_ahead(kSession));
  auto g = prepare(2, tight(), /*ahead=*/true);
  ASSERT_TRUE(g) << g.error().message();
  EXPECT_EQ(fs_->read("cgroup", call_dir(2), "pids.max"), "100");
  EXPECT_TRUE(plane_->tool_ahead(kSession));
  EXPECT_EQ(plane_->tool_cgroups(kSession), 1u) << "the ahead call is not counted yet";
  nlohmann::json s = status();
  EXPECT_EQ(s["ahead"]["held"], 1);
  EXPECT_EQ(s["ahead"]["prepared"], 1);
  EXPECT_EQ(s["tool_cgroups"], 2);

  plane_->tool_started(kSession, 2, 101);
  EXPECT_FALSE(plane_->tool_ahead(kSession));
  EXPECT_EQ(plane_->tool_cgroups(kSession), 2u);
  EXPECT_EQ(status()["ahead"]["held"], 0);

  // A TOOL_END for an ahead call no tool started in ends it too.
  ASSERT_TRUE(prepare(3, {}, true));
  EXPECT_TRUE(plane_->tool_ahead(kSession));
  plane_->tool_ended(kSession, 3);
  EXPECT_FALSE(plane_->tool_ahead(kSession));
  ASSERT_TRUE(tick());
  EXPECT_FALSE(fs_->has("cgroup", call_dir(3)));

  // At stop: an unused ahead cgroup goes; the calls with tools stay for adoption.
  ASSERT_TRUE(prepare(4, {}, true));
  Sleeper tool;
  fs_->set_procs("cgroup", call_dir(1), {tool.pid()});
  plane_.reset();
  EXPECT_FALSE(fs_->has("cgroup", call_dir(4)));
  EXPECT_TRUE(fs_->has("cgroup", call_dir(1)));
}

TEST_F(HostPlaneFake, OneTandemdPerSubtree) {
  open(FakeCgroupfs::pure_v2());
  HostEnv env;
  env.cgroups = fs_->options();
  env.proc_root = fs_->proc().string();
  HostConfig c;
  c.telemetry = "sampling";
  auto second = HostPlane::open(c, now_, env);
  ASSERT_FALSE(second);
  EXPECT_NE(second.error().message().find("in use by another tandemd"), std::string::npos) << second.error().message();
}

TEST_F(HostPlaneFake, StopLeavesRunningToolsForTheNextTandemdToAdoptOrReap) {
  open(FakeCgroupfs::pure_v2());
  ASSERT_TRUE(prepare(1));
  ASSERT_TRUE(prepare(2));
  ASSERT_TRUE(tick());
  Sleeper tool;
  fs_->set_procs("cgroup", call_dir(1), {tool.pid()});
  plane_.reset();  // stop: the ready cgroups go, the running call stays
  EXPECT_TRUE(fs_->has("cgroup", call_dir(1)));
  EXPECT_FALSE(fs_->has("cgroup", kSessionDir + "/pool-1"));

  // adopt: kept for its runner.
  plane_ = open_plane();
  ASSERT_TRUE(plane_);
  EXPECT_EQ(plane_->sessions(), 1u);
  EXPECT_EQ(plane_->tool_cgroups(kSession), 2u);
  EXPECT_EQ(status()["orphans"], 1);
  plane_.reset();

  // reap: killed, and removed once the fake lets go of it.
  config_.on_restart = "reap";
  plane_ = open_plane();
  ASSERT_TRUE(plane_);
  EXPECT_EQ(plane_->sessions(), 0u);
  EXPECT_TRUE(tool.killed());
  EXPECT_EQ(status()["sessions_reaped"], 1);
  EXPECT_EQ(plane_->pending_removals(), 1u);
  fs_->set_procs("cgroup", call_dir(1), {});
  ASSERT_TRUE(tick());
  EXPECT_EQ(plane_->pending_removals(), 0u);
  EXPECT_FALSE(fs_->has("cgroup", kSessionDir));
}

}  // namespace
}  // namespace tandem::daemon
