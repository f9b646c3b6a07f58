// The cgroup manager on a fake cgroupfs (tests/cpu/fake_cgroupfs.h) as a
// normal user: the subtree made in every hierarchy of pure v2, hybrid and
// pure v1 trees, limits written to the files the serving hierarchy has,
// freeze, usage and pressure parsed from the files, processes, kill and
// removal. The same calls on the kernel's cgroupfs, as root, are
// cgroup_test.cc.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <vector>

#include "cpu/cgroup.h"
#include "tests/cpu/fake_cgroupfs.h"

namespace tandem::cpu {
namespace {

using testing::FakeCgroupfs;

std::unique_ptr<CgroupManager> open_on(const FakeCgroupfs& fs, ManagerOptions o = {}) {
  const ManagerOptions base = fs.options();
  o.mountinfo_path = base.mountinfo_path;
  o.self_cgroup_path = base.self_cgroup_path;
  o.hooks = base.hooks;
  auto m = CgroupManager::open(o);
  EXPECT_TRUE(m) << m.error().message();
  return m ? std::move(*m) : nullptr;
}

std::uint64_t inode(const std::filesystem::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_ino;
}

std::string trimmed(const std::string& s) { return std::string(base::trim(s)); }

TEST(FakeCgroupfs, PureV2TakesEveryControllerAndEnablesThemDownTheTree) {
  FakeCgroupfs fs(FakeCgroupfs::pure_v2());
  auto m = open_on(fs);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->describe(), "v2 cpu,cpuacct,cpuset,memory,pids,freezer " + fs.dir("cgroup").string());
  EXPECT_EQ(m->unsupported(), 0u);
  EXPECT_TRUE(m->has_v2());
  EXPECT_EQ(m->favordynmods(), false);
  // The parent already handed them down: nothing written there.
  EXPECT_EQ(trimmed(FakeCgroupfs::read(fs.own_dir("cgroup") / "cgroup.subtree_control")), "cpuset cpu memory pids");
  // The subtree hands them to its children.
  EXPECT_EQ(fs.read("cgroup", "", "cgroup.subtree_control"), "cpuset cpu memory pids\n");
  EXPECT_EQ(m->root().id, inode(fs.dir("cgroup")));

  auto n = m->create("tools/00ab/3");
  ASSERT_TRUE(n) << n.error().message();
  EXPECT_EQ(n->rel, "tools/00ab/3");
  EXPECT_EQ(n->id, inode(fs.dir("cgroup", "tools/00ab/3")));
  EXPECT_EQ(fs.read("cgroup", "tools", "cgroup.subtree_control"), "cpuset cpu memory pids\n");
  EXPECT_EQ(fs.read("cgroup", "tools/00ab", "cgroup.subtree_control"), "cpuset cpu memory pids\n");
  EXPECT_EQ(fs.read("cgroup", "tools/00ab/3", "cgroup.controllers"), "cpuset cpu memory pids\n");
  EXPECT_TRUE(fs.has("cgroup", "tools/00ab/3", "memory.high"));
  // Again: opened, not made anew.
  auto again = m->create("tools/00ab/3");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->id, n->id);
  auto opened = m->open_node("tools/00ab/3");
  ASSERT_TRUE(opened);
  EXPECT_EQ(opened->id, n->id);
  auto kids = m->children("tools/00ab");
  ASSERT_TRUE(kids);
  EXPECT_EQ(*kids, std::vector<std::string>{"3"});

  for (const char* bad : {"../x", "/abs", "a//b", "a/./b", ""}) {
    auto r = m->create(bad);
    if (std::string_view(bad).empty()) {
      EXPECT_TRUE(r);  // the root itself
      continue;
    }
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code(), EINVAL) << bad;
  }
  auto missing = m->open_node("tools/none");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ENOENT);
}

TEST(FakeCgroupfs, HybridUsesV1ControllersAndTheEmptyV2) {
  FakeCgroupfs fs(FakeCgroupfs::hybrid("/process_api/abc"));
  auto m = open_on(fs);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->describe(), fmt::format("v2 cpuacct,freezer {}; v1 cpu {}; v1 cpuset {}; v1 memory {}; v1 pids {}",
                                       fs.dir("unified").string(), fs.dir("cpu").string(), fs.dir("cpuset").string(),
                                       fs.dir("memory").string(), fs.dir("pids").string()));
  EXPECT_NE(fs.dir("memory").string().find("/process_api/abc/tandem"), std::string::npos);
  EXPECT_EQ(m->unsupported(), static_cast<std::uint32_t>(kNoMemoryLow));
  // Nothing to hand down in v2, so nothing written.
  EXPECT_EQ(trimmed(fs.read("unified", "", "cgroup.subtree_control")), "");
  // A v1 cpuset cgroup gets its parent's cpus and mems before anything joins.
  EXPECT_EQ(fs.read("cpuset", "", "cpuset.cpus"), "0-1");
  EXPECT_EQ(fs.read("cpuset", "", "cpuset.mems"), "0");
  auto n = m->create("tools/s/1");
  ASSERT_TRUE(n) << n.error().message();
  EXPECT_EQ(fs.read("cpuset", "tools/s/1", "cpuset.cpus"), "0-1");
  EXPECT_EQ(n->dirs.size(), 5u);
  EXPECT_EQ(n->id, inode(fs.dir("unified", "tools/s/1")));  // the v2 id, which eBPF sees
  // devices, blkio and name=systemd are not tandem's: untouched.
  EXPECT_FALSE(fs.has("devices", ""));
  EXPECT_FALSE(fs.has("systemd", ""));

  const CgroupDirs d = m->dirs(*n);
  EXPECT_EQ(d.v2_dir, n->dirs[0].get());
  ASSERT_EQ(d.v1_dirs.size(), 4u);
  EXPECT_EQ(d.v1_dirs[0], n->dirs[1].get());
  EXPECT_EQ(d.cpuacct, -1);  // from v2's cpu.stat
  EXPECT_EQ(d.v1_dir(d.cpu), n->dirs[1].get());
  EXPECT_EQ(d.v1_dir(d.memory), n->dirs[3].get());
}

TEST(FakeCgroupfs, AParentThatDoesNotHandControllersDownIsAsked) {
  std::vector<testing::FakeMount> mounts = FakeCgroupfs::pure_v2();
  mounts[0].controllers = {"cpu", "memory", "io"};
  mounts[0].enabled = {};
  FakeCgroupfs fs(std::move(mounts));
  auto m = open_on(fs);
  ASSERT_TRUE(m);
  // Asked for what we want and the parent can give (not cpuset, pids or
  // io), and taken from v2 once given.
  EXPECT_EQ(FakeCgroupfs::read(fs.own_dir("cgroup") / "cgroup.subtree_control"), "cpu memory\n");
  EXPECT_EQ(m->describe(), "v2 cpu,cpuacct,memory,freezer " + fs.dir("cgroup").string());
  EXPECT_EQ(m->unsupported(), static_cast<std::uint32_t>(kNoPidsMax | kNoCpus));
  EXPECT_EQ(fs.read("cgroup", "", "cgroup.subtree_control"), "cpu memory\n");
}

TEST(FakeCgroupfs, APlanFromTheHostsTextsRunsOnTheFakeTree) {
  // The planner's output for this machine's texts, pointed at the fake tree.
  FakeCgroupfs fs(FakeCgroupfs::hybrid());
  auto plan = plan_cgroups(
      "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
      "4:memory:/test.slice/own.service\n1:cpu:/test.slice/own.service\n0::/test.slice/own.service\n", {});
  ASSERT_TRUE(plan) << plan.error().message();
  for (Hierarchy& h : plan->hierarchies) {
    h.mount_point = (fs.root() / std::filesystem::path(h.mount_point).filename()).string();
  }
  auto m = CgroupManager::open_plan(std::move(*plan), fs.hooks());
  ASSERT_TRUE(m) << m.error().message();
  EXPECT_EQ((*m)->hierarchies().size(), 3u);
  EXPECT_TRUE(fs.has("memory", "", "memory.limit_in_bytes"));
  EXPECT_TRUE(fs.has("unified", "", "cgroup.freeze"));
  Limits l;
  l.memory_max = 1 << 30;
  auto r = (*m)->apply((*m)->root(), l);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(fs.read("memory", "", "memory.limit_in_bytes"), "1073741824");

  auto empty = CgroupManager::open_plan(CgroupPlan{}, fs.hooks());
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error().code(), ENOENT);
}

TEST(FakeCgroupfs, OpenFailsWithoutTheFilesItNeeds) {
  FakeCgroupfs fs(FakeCgroupfs::pure_v2());
  ManagerOptions o = fs.options();
  o.mountinfo_path = (fs.root() / "no-such-file").string();
  auto m = CgroupManager::open(o);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code(), ENOENT);
  EXPECT_NE(m.error().message().find("cgroups"), std::string::npos) << m.error().message();
  // The v2 parent's cgroup.controllers is gone: reported, not guessed.
  std::filesystem::remove(fs.own_dir("cgroup") / "cgroup.controllers");
  auto broken = CgroupManager::open(fs.options());
  ASSERT_FALSE(broken);
  EXPECT_NE(broken.error().message().find("cgroup.controllers"), std::string::npos) << broken.error().message();
}

TEST(FakeCgroupfs, LimitsLandInV2Files) {
  FakeCgroupfs fs(FakeCgroupfs::pure_v2());
  auto m = open_on(fs);
  ASSERT_TRUE(m);
  auto n = m->create("tools/s/1");
  ASSERT_TRUE(n);
  Limits l;
  l.cpu_weight = 400;
  l.cpu_max = CpuMax{50000, 100000};
  l.memory_high = 64 << 20;
  l.memory_max = kUnlimited;
  l.memory_low = 8 << 20;
  l.pids_max = 100;
  l.cpus = "1";
  auto r = m->apply(*n, l);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(*r, 0u);
  EXPECT_EQ(fs.read("cgroup", "tools/s/1", "cpu.weight"), "400");
  EXPECT_EQ(fs.read("cgroup", "tools/s/1", "cpu.max"), "50000 100000");
  EXPECT_EQ(fs.read("cgroup", "tools/s/1", "memory.high"), "67108864");
  EXPECT_EQ(fs.read("cgroup", "tools/s/1", "memory.max"), "max");
  EXPECT_EQ(fs.read("cgroup", "tools/s/1", "memory.low"), "8388608");
  EXPECT_EQ(fs.read("cgroup", "tools/s/1", "pids.max"), "100");
  EXPECT_EQ(fs.read("cgroup", "tools/s/1", "cpuset.cpus"), "1");
  // Unlimited quota.
  Limits u;
  u.cpu_max = CpuMax{std::nullopt, 200000};
  ASSERT_TRUE(m->apply(*n, u));
  EXPECT_EQ(fs.read("cgroup", "tools/s/1", "cpu.max"), "max 200000");
  // A bad value writes nothing.
  Limits bad;
  bad.pids_max = 7;
  bad.cpu_weight = 0;
  EXPECT_FALSE(m->apply(*n, bad));
  EXPECT_EQ(fs.read("cgroup", "tools/s/1", "pids.max"), "100");
}

TEST(FakeCgroupfs, LimitsLandInV1FilesAndMemoryLowIsReportedUnsupported) {
  FakeCgroupfs fs(FakeCgroupfs::hybrid());
  auto m = open_on(fs);
  ASSERT_TRUE(m);
  auto n = m->create("tools/s/1");
  ASSERT_TRUE(n);
  Limits l;
  l.cpu_weight = 400;
  l.cpu_max = CpuMax{50000, 100000};
  l.memory_high = 64 << 20;
  l.memory_max = 128 << 20;
  l.memory_low = 8 << 20;
  l.pids_max = 100;
  l.cpus = "0";
  auto r = m->apply(*n, l);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(*r, static_cast<std::uint32_t>(kNoMemoryLow));
  EXPECT_EQ(fs.read("cpu", "tools/s/1", "cpu.shares"), "4096");
  EXPECT_EQ(fs.read("cpu", "tools/s/1", "cpu.cfs_period_us"), "100000");
  EXPECT_EQ(fs.read("cpu", "tools/s/1", "cpu.cfs_quota_us"), "50000");
  // v1's one limit: the high one, with the OOM killer off (allocations stall).
  EXPECT_EQ(fs.read("memory", "tools/s/1", "memory.limit_in_bytes"), "67108864");
  EXPECT_EQ(fs.read("memory", "tools/s/1", "memory.oom_control"), "oom_kill_disable 1\nunder_oom 0\noom_kill 0\n");
  EXPECT_EQ(fs.read("pids", "tools/s/1", "pids.max"), "100");
  EXPECT_EQ(fs.read("cpuset", "tools/s/1", "cpuset.cpus"), "0");
  EXPECT_FALSE(fs.has("unified", "tools/s/1", "memory.high"));
  // Only a max limit: the OOM killer acts at it.
  Limits max_only;
  max_only.memory_high = kUnlimited;
  max_only.memory_max = 128 << 20;
  ASSERT_TRUE(m->apply(*n, max_only));
  EXPECT_EQ(fs.read("memory", "tools/s/1", "memory.limit_in_bytes"), "134217728");
  EXPECT_EQ(fs.read("memory", "tools/s/1", "memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n");
  Limits none;
  none.memory_max = kUnlimited;
  ASSERT_TRUE(m->apply(*n, none));
  EXPECT_EQ(fs.read("memory", "tools/s/1", "memory.limit_in_bytes"), "-1");
  // An unlimited quota: -1.
  Limits q;
  q.cpu_max = CpuMax{std::nullopt, 100000};
  ASSERT_TRUE(m->apply(*n, q));
  EXPECT_EQ(fs.read("cpu", "tools/s/1", "cpu.cfs_quota_us"), "-1");
}

TEST(FakeCgroupfs, AControllerNoHierarchyServesIsSkippedAndReported) {
  std::vector<testing::FakeMount> mounts = FakeCgroupfs::pure_v2();
  mounts[0].controllers = {"memory"};
  mounts[0].enabled = {"memory"};
  FakeCgroupfs fs(std::move(mounts));
  auto m = open_on(fs);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->unsupported(), static_cast<std::uint32_t>(kNoCpuWeight | kNoCpuMax | kNoPidsMax | kNoCpus));
  auto n = m->create("x");
  ASSERT_TRUE(n);
  Limits l;
  l.cpu_weight = 200;
  l.memory_high = 1 << 20;
  auto r = m->apply(*n, l);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(*r, static_cast<std::uint32_t>(kNoCpuWeight));
  EXPECT_FALSE(fs.has("cgroup", "x", "cpu.weight"));
  EXPECT_EQ(fs.read("cgroup", "x", "memory.high"), "1048576");
}

TEST(FakeCgroupfs, FreezeWritesV2OrV1Files) {
  {
    FakeCgroupfs fs(FakeCgroupfs::hybrid());
    auto m = open_on(fs);
    ASSERT_TRUE(m);
    auto n = m->create("a");
    ASSERT_TRUE(n);
    ASSERT_TRUE(m->freeze(*n, true));
    EXPECT_EQ(fs.read("unified", "a", "cgroup.freeze"), "1");
    EXPECT_FALSE(fs.has("freezer", ""));  // v1's freezer is not used beside v2
    ASSERT_TRUE(m->freeze(*n, false));
    EXPECT_EQ(fs.read("unified", "a", "cgroup.freeze"), "0");
  }
  {
    FakeCgroupfs fs(FakeCgroupfs::pure_v1());
    auto m = open_on(fs);
    ASSERT_TRUE(m);
    auto n = m->create("a");
    ASSERT_TRUE(n);
    ASSERT_TRUE(m->freeze(*n, true));
    EXPECT_EQ(fs.read("freezer", "a", "freezer.state"), "FROZEN");
    ASSERT_TRUE(m->freeze(*n, false));
    EXPECT_EQ(fs.read("freezer", "a", "freezer.state"), "THAWED");
  }
  {
    ManagerOptions o;
    o.want[static_cast<std::size_t>(Controller::kFreezer)] = false;
    FakeCgroupfs fs(FakeCgroupfs::pure_v1());
    auto m = open_on(fs, o);
    ASSERT_TRUE(m);
    auto r = m->freeze(m->root(), true);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), ENOTSUP);
  }
}

TEST(FakeCgroupfs, UsageAndPressureAreParsedFromTheFiles) {
  {
    FakeCgroupfs fs(FakeCgroupfs::pure_v2());
    auto m = open_on(fs);
    ASSERT_TRUE(m);
    auto n = m->create("c");
    ASSERT_TRUE(n);
    fs.write("cgroup", "c", "cpu.stat",
             "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 9\nnr_throttled 4\nthrottled_usec 700\n");
    fs.write("cgroup", "c", "memory.current", "4096\n");
    fs.write("cgroup", "c", "memory.peak", "8192\n");
    fs.write("cgroup", "c", "memory.events", "low 0\nhigh 3\nmax 1\noom 1\noom_kill 2\n");
    auto u = m->usage(*n);
    ASSERT_TRUE(u) << u.error().message();
    EXPECT_EQ(u->cpu_ns, 1'500'000u);
    EXPECT_EQ(u->memory_bytes, 4096u);
    EXPECT_EQ(u->memory_peak, 8192u);
    EXPECT_EQ(u->oom_kills, 2u);
    EXPECT_EQ(u->memory_high_events, 3u);
    EXPECT_EQ(u->nr_throttled, 4u);
    EXPECT_EQ(u->throttled_us, 700u);
    fs.write("cgroup", "c", "cpu.pressure",
             "some avg10=12.50 avg60=1.00 avg300=0.10 total=5000\nfull avg10=2.00 avg60=0.00 avg300=0.00 total=9\n");
    auto p = m->pressure(*n, "cpu");
    ASSERT_TRUE(p) << p.error().message();
    EXPECT_DOUBLE_EQ(p->some.avg10, 12.5);
    EXPECT_EQ(p->some.total_us, 5000u);
    ASSERT_TRUE(p->full);
    EXPECT_DOUBLE_EQ(p->full->avg10, 2.0);
    auto bad = m->pressure(*n, "disk");
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.error().code(), EINVAL);
    // A file the kernel would never write: an error naming it, not a guess.
    fs.write("cgroup", "c", "memory.events", "oom_kill lots\n");
    auto broken = m->usage(*n);
    ASSERT_FALSE(broken);
    EXPECT_NE(broken.error().message().find("memory.events"), std::string::npos) << broken.error().message();
  }
  {
    FakeCgroupfs fs(FakeCgroupfs::hybrid());
    auto m = open_on(fs);
    ASSERT_TRUE(m);
    auto n = m->create("c");
    ASSERT_TRUE(n);
    fs.write("unified", "c", "cpu.stat", "usage_usec 2000\nuser_usec 1000\nsystem_usec 1000\n");
    fs.write("cpu", "c", "cpu.stat", "nr_periods 10\nnr_throttled 4\nthrottled_time 5000000\n");
    fs.write("memory", "c", "memory.usage_in_bytes", "1000\n");
    fs.write("memory", "c", "memory.max_usage_in_bytes", "3000\n");
    fs.write("memory", "c", "memory.oom_control", "oom_kill_disable 1\nunder_oom 1\noom_kill 1\n");
    auto u = m->usage(*n);
    ASSERT_TRUE(u) << u.error().message();
    EXPECT_EQ(u->cpu_ns, 2'000'000u);  // v2's cpu.stat: cpuacct is v2's here
    EXPECT_EQ(u->nr_throttled, 4u);
    EXPECT_EQ(u->throttled_us, 5000u);
    EXPECT_EQ(u->memory_bytes, 1000u);
    EXPECT_EQ(u->memory_peak, 3000u);
    EXPECT_TRUE(u->memory_stalled);
    EXPECT_EQ(u->oom_kills, 1u);
    fs.write("unified", "c", "memory.pressure", "some avg10=3.00 avg60=0.00 avg300=0.00 total=1\n");
    auto p = m->pressure(*n, "memory");
    ASSERT_TRUE(p) << p.error().message();
    EXPECT_DOUBLE_EQ(p->some.avg10, 3.0);
    EXPECT_FALSE(p->full);
  }
  {
    FakeCgroupfs fs(FakeCgroupfs::pure_v1());
    auto m = open_on(fs);
    ASSERT_TRUE(m);
    fs.write("cpu,cpuacct", "", "cpuacct.usage", "123456789\n");
    auto u = m->usage(m->root());
    ASSERT_TRUE(u) << u.error().message();
    EXPECT_EQ(u->cpu_ns, 123456789u);
    auto p = m->pressure(m->root(), "cpu");
    ASSERT_FALSE(p);
    EXPECT_EQ(p.error().code(), ENOTSUP);
  }
}

TEST(FakeCgroupfs, ProcessesAreTheUnionOfEveryHierarchyAndDescendant) {
  FakeCgroupfs fs(FakeCgroupfs::hybrid());
  auto m = open_on(fs);
  ASSERT_TRUE(m);
  auto s = m->create("tools/s");
  auto c = m->create("tools/s/1");
  ASSERT_TRUE(s && c);
  fs.set_procs("unified", "tools/s/1", {40, 12});
  fs.set_procs("memory", "tools/s", {12, 7});  // joined only some hierarchies
  auto p = m->processes(*s);
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(*p, (std::vector<int>{7, 12, 40}));
  auto leaf = m->processes(*c);
  ASSERT_TRUE(leaf);
  EXPECT_EQ(*leaf, (std::vector<int>{12, 40}));
  fs.set_procs("unified", "tools/s/1", {});
  fs.write("unified", "tools/s/1", "cgroup.procs", "12\nnot-a-pid\n");
  EXPECT_FALSE(m->processes(*c));
}

TEST(FakeCgroupfs, KillOfAnEmptyCgroupIsImmediateAndWritesNothing) {
  FakeCgroupfs fs(FakeCgroupfs::pure_v2());
  auto m = open_on(fs);
  ASSERT_TRUE(m);
  auto n = m->create("a");
  ASSERT_TRUE(n);
  auto r = m->kill(*n, 1000);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(fs.read("cgroup", "a", "cgroup.kill"), "");
}

// A member is sent SIGKILL (and on v2 cgroup.kill is written); a fake
// cgroup.procs keeps listing it, so kill() gives up with EBUSY after its wait.
TEST(FakeCgroupfs, KillSignalsEveryMemberAndReportsTheOnesLeft) {
  for (bool v2 : {true, false}) {
    FakeCgroupfs fs(v2 ? FakeCgroupfs::pure_v2() : FakeCgroupfs::pure_v1());
    auto m = open_on(fs);
    ASSERT_TRUE(m);
    auto n = m->create("a/b");
    ASSERT_TRUE(n);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::pause();
      ::_exit(0);
    }
    // Never left behind, whatever fails below.
    struct Reaper {
      pid_t pid;
      ~Reaper() {
        if (pid > 0 && ::kill(pid, SIGKILL) == 0) (void)::waitpid(pid, nullptr, 0);
      }
    } reaper{child};
    fs.set_procs(v2 ? "cgroup" : "memory", "a/b", {child});
    auto parent = m->open_node("a");
    ASSERT_TRUE(parent);
    auto r = m->kill(*parent, 20);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), EBUSY);
    EXPECT_NE(r.error().message().find("1 processes left"), std::string::npos) << r.error().message();
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    reaper.pid = 0;
    ASSERT_TRUE(WIFSIGNALED(status));
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
    if (v2) {
      EXPECT_EQ(fs.read("cgroup", "a", "cgroup.kill"), "1");
    } else {
      // v1: frozen around the kill, thawed after.
      EXPECT_EQ(fs.read("freezer", "a", "freezer.state"), "THAWED");
    }
    fs.set_procs(v2 ? "cgroup" : "memory", "a/b", {});
    EXPECT_TRUE(m->kill(*parent, 20));
  }
}

TEST(FakeCgroupfs, RemoveTakesTheTreeBottomUpInEveryHierarchy) {
  FakeCgroupfs fs(FakeCgroupfs::hybrid());
  auto m = open_on(fs);
  ASSERT_TRUE(m);
  auto s = m->create("tools/s");
  auto c1 = m->create("tools/s/1");
  auto c2 = m->create("tools/s/2");
  ASSERT_TRUE(s && c1 && c2);
  // A busy leaf keeps its folder (the kernel says EBUSY; the fake ENOTEMPTY).
  fs.set_procs("memory", "tools/s/2", {4242});
  auto busy = m->remove(*s);
  ASSERT_FALSE(busy);
  EXPECT_TRUE(fs.has("memory", "tools/s/2", "cgroup.procs"));
  fs.set_procs("memory", "tools/s/2", {});
  auto r = m->remove(*s);
  ASSERT_TRUE(r) << r.error().message();
  for (const char* mount : {"unified", "cpu", "cpuset", "memory", "pids"}) {
    EXPECT_FALSE(fs.has(mount, "tools/s")) << mount;
    EXPECT_TRUE(fs.has(mount, "tools")) << mount;
  }
  EXPECT_TRUE(m->remove(*s));  // gone already: fine
}

TEST(FakeCgroupfs, RemoveLeafRemovesAnEmptyLeafAndLeavesAFolderWhole) {
  FakeCgroupfs fs(FakeCgroupfs::pure_v2());
  auto m = open_on(fs);
  ASSERT_TRUE(m);
  auto s = m->create("tools/s");
  auto c = m->create("tools/s/1");
  ASSERT_TRUE(s && c);
  auto folder = m->remove_leaf(*s);
  ASSERT_FALSE(folder);
  EXPECT_TRUE(fs.has("cgroup", "tools/s", "cpu.weight"));  // its files untouched
  fs.set_procs("cgroup", "tools/s/1", {4242});
  EXPECT_FALSE(m->remove_leaf(*c));
  EXPECT_TRUE(fs.has("cgroup", "tools/s/1", "memory.high"));
  fs.set_procs("cgroup", "tools/s/1", {});
  ASSERT_TRUE(m->remove_leaf(*c));
  EXPECT_FALSE(fs.has("cgroup", "tools/s/1"));
  auto root = m->remove_leaf(m->root());
  ASSERT_FALSE(root);
  EXPECT_EQ(root.error().code(), EINVAL);
}

}  // namespace
}  // namespace tandem::cpu
