// The cgroup manager on this machine's real hierarchies (as root; skipped
// elsewhere), inside a subtree named for the test process beneath its own
// cgroup, removed at the end of every test; and the mountinfo and
// oom_control parsers on kernel texts.
#include "cpu/cgroup.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <thread>

#include <fmt/format.h>

#include "base/parse.h"

namespace tandem::cpu {
namespace {

TEST(Mountinfo, HybridAndPureV2) {
  auto m = parse_mountinfo(
      "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
      "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n"
      "41 31 0:38 /sub /sys/fs/cgroup/uni\\040fied rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n");
  ASSERT_TRUE(m) << m.error().message();
  ASSERT_EQ(m->size(), 3u);
  EXPECT_FALSE((*m)[0].v2);
  EXPECT_EQ((*m)[0].mount_point, "/sys/fs/cgroup/cpu,cpuacct");
  EXPECT_EQ((*m)[0].controllers, (std::vector<std::string>{"cpu", "cpuacct"}));
  EXPECT_EQ((*m)[1].controllers, (std::vector<std::string>{"name=systemd"}));
  EXPECT_TRUE((*m)[2].v2);
  EXPECT_EQ((*m)[2].mount_point, "/sys/fs/cgroup/uni fied");
  EXPECT_EQ((*m)[2].root, "/sub");
  EXPECT_FALSE(parse_mountinfo("31 23 0:28 / /x rw - cgroup2\n"));  // no source after the type
  EXPECT_FALSE((*m)[2].favordynmods);
  EXPECT_FALSE((*m)[0].favordynmods);
}

// favordynmods is a super option (after the "-"), on v2 and v1 alike; it is
// no controller, and a mount option of the same name does not count.
TEST(Mountinfo, Favordynmods) {
  auto m = parse_mountinfo(
      "41 31 0:38 / /sys/fs/cgroup rw,favordynmods - cgroup2 cgroup2 rw,nsdelegate,favordynmods,memory_recursiveprot\n"
      "42 31 0:39 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,favordynmods,pids\n"
      "43 31 0:40 / /sys/fs/cgroup/cpu rw,favordynmods - cgroup cgroup rw,cpu\n");
  ASSERT_TRUE(m) << m.error().message();
  ASSERT_EQ(m->size(), 3u);
  EXPECT_TRUE((*m)[0].favordynmods);
  EXPECT_TRUE((*m)[1].favordynmods);
  EXPECT_EQ((*m)[1].controllers, std::vector<std::string>{"pids"});
  EXPECT_FALSE((*m)[2].favordynmods);
}

TEST(OomControl, ParsesAndRejects) {
  auto o = parse_oom_control("oom_kill_disable 1\nunder_oom 1\noom_kill 3\n");
  ASSERT_TRUE(o);
  EXPECT_TRUE(o->oom_kill_disable);
  EXPECT_TRUE(o->under_oom);
  EXPECT_EQ(o->oom_kill, 3u);
  EXPECT_FALSE(parse_oom_control("under_oom yes\n"));
  EXPECT_FALSE(parse_pids("12\nx\n"));
  EXPECT_EQ(*parse_pids("12\n7\n"), (std::vector<int>{12, 7}));
}

TEST(Limits, ValidateNamesTheField) {
  Limits l;
  l.cpu_weight = 0;
  auto r = validate(l);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().context().find("cpu_weight"), std::string::npos);
  l = {};
  l.cpus = "0-3; rm -rf";
  EXPECT_FALSE(validate(l));
  l = {};
  l.cpu_max = CpuMax{10, 100000};  // below the kernel's 1 ms
  EXPECT_FALSE(validate(l));
}

// A manager over a throwaway subtree; removes everything on destruction.
class CgroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to create cgroups";
    ManagerOptions o;
    o.subtree = fmt::format("tandem-cgtest-{}", ::getpid());
    auto m = CgroupManager::open(o);
    ASSERT_TRUE(m) << m.error().message();
    mgr_ = std::move(*m);
  }
  void TearDown() override {
    if (!mgr_) return;
    (void)mgr_->kill(mgr_->root(), 2000);
    auto r = mgr_->remove(mgr_->root());
    EXPECT_TRUE(r) << r.error().message();
    for (const auto& h : mgr_->hierarchies()) EXPECT_NE(::access(h.path().c_str(), F_OK), 0) << h.path();
  }

  // A child that joins `node` (every hierarchy) and then runs `body`.
  template <class Body>
  pid_t start_in(const Node& node, Body body) {
    const CgroupDirs p = mgr_->dirs(node);
    pid_t pid = ::fork();
    if (pid == 0) {
      if (p.v2_dir >= 0 && !write_file(p.v2_dir, "cgroup.procs", "0")) ::_exit(120);
      for (int d : p.v1_dirs) {
        if (!write_file(d, "cgroup.procs", "0")) ::_exit(121);
      }
      body();
      ::_exit(0);
    }
    return pid;
  }

  std::unique_ptr<CgroupManager> mgr_;
};

TEST_F(CgroupTest, SubtreeSitsBeneathOurOwnCgroupInEveryHierarchy) {
  auto self = parse_proc_cgroup(*read_file(AT_FDCWD, "/proc/self/cgroup"));
  ASSERT_TRUE(self);
  for (const auto& h : mgr_->hierarchies()) {
    bool found = false;
    for (const auto& m : *self) {
      const std::string own = m.path == "/" ? "" : m.path;
      if (h.root == own + fmt::format("/tandem-cgtest-{}", ::getpid())) found = true;
    }
    EXPECT_TRUE(found) << h.root;
  }
  EXPECT_FALSE(mgr_->describe().empty());
  EXPECT_NE(mgr_->root().id, 0u);
}

TEST_F(CgroupTest, CreateIsIdempotentAndRejectsEscapes) {
  auto a = mgr_->create("tools/s1/1");
  ASSERT_TRUE(a) << a.error().message();
  auto b = mgr_->create("tools/s1/1");
  ASSERT_TRUE(b);
  EXPECT_EQ(a->id, b->id);
  EXPECT_EQ(*mgr_->children("tools"), (std::vector<std::string>{"s1"}));
  for (const char* bad : {"../x", "tools/../../x", "/abs", "a//b", "a/./b"}) {
    auto r = mgr_->create(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code(), EINVAL);
  }
  auto missing = mgr_->open_node("tools/none");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ENOENT);
}

TEST_F(CgroupTest, ProcessesKillAndRemoveCoverDaemonisedGrandchildren) {
  auto node = mgr_->create("tools/s2/7");
  ASSERT_TRUE(node) << node.error().message();
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  pid_t child = start_in(*node, [&] {
    // Daemonise a grandchild: it leaves the process tree, not the cgroup.
    if (::fork() == 0) {
      ::setsid();
      if (::fork() == 0) {
        char c = 'x';
        (void)!::write(pipefd[1], &c, 1);
        ::pause();
      }
      ::_exit(0);
    }
    ::pause();
  });
  char c = 0;
  ASSERT_EQ(::read(pipefd[0], &c, 1), 1);
  auto procs = mgr_->processes(*node);
  ASSERT_TRUE(procs);
  EXPECT_GE(procs->size(), 2u);  // the child and the grandchild (the middle one may linger as a zombie)

  // remove() refuses while processes live.
  auto busy = mgr_->remove(*node);
  ASSERT_FALSE(busy);
  EXPECT_EQ(busy.error().code(), EBUSY);

  auto session = mgr_->open_node("tools/s2");
  ASSERT_TRUE(session);
  auto k = mgr_->kill(*session, 5000);
  ASSERT_TRUE(k) << k.error().message();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(mgr_->processes(*session)->empty());
  ASSERT_TRUE(mgr_->remove(*session));
  EXPECT_TRUE(mgr_->children("tools")->empty());
  ::close(pipefd[0]);
  ::close(pipefd[1]);
}

// remove_leaf(): one rmdir per hierarchy. A busy cgroup, or one with a child
// cgroup, is left whole in every hierarchy; an empty leaf goes from all.
TEST_F(CgroupTest, RemoveLeafLeavesABusyCgroupWholeAndRemovesAnEmptyOne) {
  auto node = mgr_->create("tools/s3/1");
  ASSERT_TRUE(node) << node.error().message();
  auto exists_everywhere = [&](const std::string& rel) {
    return std::ranges::all_of(mgr_->hierarchies(),
                               [&](const Hierarchy& h) { return ::access((h.path() + "/" + rel).c_str(), F_OK) == 0; });
  };
  auto gone_everywhere = [&](const std::string& rel) {
    return std::ranges::none_of(
        mgr_->hierarchies(), [&](const Hierarchy& h) { return ::access((h.path() + "/" + rel).c_str(), F_OK) == 0; });
  };
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t child = start_in(*node, [&] {
    char c = 'x';
    (void)!::write(pipefd[1], &c, 1);
    ::pause();
  });
  char c = 0;
  ASSERT_EQ(::read(pipefd[0], &c, 1), 1);
  auto busy = mgr_->remove_leaf(*node);
  ASSERT_FALSE(busy);
  EXPECT_EQ(busy.error().code(), EBUSY);
  EXPECT_TRUE(exists_everywhere("tools/s3/1"));

  ASSERT_TRUE(mgr_->kill(*node, 5000));
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  // A child cgroup: refused, nothing removed.
  ASSERT_TRUE(mgr_->create("tools/s3/1/sub"));
  EXPECT_FALSE(mgr_->remove_leaf(*node));
  EXPECT_TRUE(exists_everywhere("tools/s3/1/sub"));
  auto sub = mgr_->open_node("tools/s3/1/sub");
  ASSERT_TRUE(sub);
  ASSERT_TRUE(mgr_->remove_leaf(*sub));
  EXPECT_TRUE(gone_everywhere("tools/s3/1/sub"));
  // Empty now: gone from every hierarchy, and a second call is fine.
  ASSERT_TRUE(mgr_->remove_leaf(*node));
  EXPECT_TRUE(gone_everywhere("tools/s3/1"));
  EXPECT_TRUE(mgr_->remove_leaf(*node));
  EXPECT_FALSE(mgr_->remove_leaf(mgr_->root()));  // never the subtree's root
  ::close(pipefd[0]);
  ::close(pipefd[1]);
}

TEST_F(CgroupTest, LimitsLandInTheServingHierarchy) {
  auto node = mgr_->create("tools/s3/1");
  ASSERT_TRUE(node);
  Limits l;
  l.cpu_weight = 200;
  l.cpu_max = CpuMax{50000, 100000};
  l.pids_max = 64;
  l.memory_max = 256ull << 20;
  l.memory_low = 1 << 20;
  auto r = mgr_->apply(*node, l);
  ASSERT_TRUE(r) << r.error().message();
  const int cpu = mgr_->serving(Controller::kCpu);
  if (cpu >= 0) {
    const int d = node->dirs[static_cast<std::size_t>(cpu)].get();
    if (mgr_->hierarchies()[static_cast<std::size_t>(cpu)].v2) {
      EXPECT_EQ(base::trim(*read_file(d, "cpu.weight")), "200");
      EXPECT_EQ(base::trim(*read_file(d, "cpu.max")), "50000 100000");
    } else {
      EXPECT_EQ(base::trim(*read_file(d, "cpu.shares")), "2048");
      EXPECT_EQ(base::trim(*read_file(d, "cpu.cfs_quota_us")), "50000");
    }
  }
  const int mem = mgr_->serving(Controller::kMemory);
  if (mem >= 0 && !mgr_->hierarchies()[static_cast<std::size_t>(mem)].v2) {
    EXPECT_TRUE(*r & kNoMemoryLow);  // v1 has no memory.low
    EXPECT_EQ(base::trim(*read_file(node->dirs[static_cast<std::size_t>(mem)].get(), "memory.limit_in_bytes")),
              std::to_string(256ull << 20));
  }
  // Unlimited again.
  l = {};
  l.cpu_max = CpuMax{std::nullopt, 100000};
  l.pids_max = kUnlimited;
  ASSERT_TRUE(mgr_->apply(*node, l));
  Limits bad;
  bad.cpu_weight = 20000;
  EXPECT_FALSE(mgr_->apply(*node, bad));
}

TEST_F(CgroupTest, FreezeStopsAndThawResumes) {
  if (mgr_->serving(Controller::kFreezer) < 0) GTEST_SKIP() << "no freezer on this machine";
  auto node = mgr_->create("tools/s4/1");
  ASSERT_TRUE(node);
  pid_t child = start_in(*node, [] {
    for (;;) {
    }
  });
  auto cpu_ns = [&] { return mgr_->usage(*node)->cpu_ns.value_or(0); };
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(mgr_->freeze(*node, true));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the freeze settle
  const auto frozen_at = cpu_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(cpu_ns() - frozen_at, 20'000'000u);  // a frozen burner runs (almost) nothing
  ASSERT_TRUE(mgr_->freeze(*node, false));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_GT(cpu_ns() - frozen_at, 20'000'000u);
  ASSERT_TRUE(mgr_->kill(*node, 5000));
  ::waitpid(child, nullptr, 0);
}

// Burns CPU on core 0 for `ms` of wall time.
void burn_on_cpu0(int ms) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  (void)::sched_setaffinity(0, sizeof set, &set);
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  volatile std::uint64_t x = 0;
  while (std::chrono::steady_clock::now() < end) x = x + 1;
}

TEST_F(CgroupTest, CpuMaxCapsABurner) {
  if (mgr_->serving(Controller::kCpu) < 0) GTEST_SKIP() << "no cpu controller";
  auto node = mgr_->create("tools/quota/1");
  ASSERT_TRUE(node);
  Limits l;
  l.cpu_max = CpuMax{20000, 100000};  // a fifth of a core
  ASSERT_TRUE(mgr_->apply(*node, l));
  const auto start = std::chrono::steady_clock::now();
  pid_t child = start_in(*node, [] { burn_on_cpu0(1500); });
  ::waitpid(child, nullptr, 0);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto u = mgr_->usage(*node);
  ASSERT_TRUE(u && u->cpu_ns);
  const double share = static_cast<double>(*u->cpu_ns) / 1e9 / wall;
  EXPECT_LT(share, 0.3) << "cpu.max 20% let it use " << share * 100 << " %";
  EXPECT_GT(share, 0.05);
  EXPECT_GT(u->nr_throttled, 0u);
}

TEST_F(CgroupTest, CpuWeightsSplitACoreAsConfigured) {
  if (mgr_->serving(Controller::kCpu) < 0) GTEST_SKIP() << "no cpu controller";
  auto light = mgr_->create("tools/weights/light");
  auto heavy = mgr_->create("tools/weights/heavy");
  ASSERT_TRUE(light && heavy);
  Limits l;
  l.cpu_weight = 100;
  ASSERT_TRUE(mgr_->apply(*light, l));
  l.cpu_weight = 400;
  ASSERT_TRUE(mgr_->apply(*heavy, l));
  // Both burn on core 0 at once: it is split by weight, 1:4.
  pid_t a = start_in(*light, [] { burn_on_cpu0(2000); });
  pid_t b = start_in(*heavy, [] { burn_on_cpu0(2000); });
  ::waitpid(a, nullptr, 0);
  ::waitpid(b, nullptr, 0);
  const double lo = static_cast<double>(mgr_->usage(*light)->cpu_ns.value_or(0));
  const double hi = static_cast<double>(mgr_->usage(*heavy)->cpu_ns.value_or(0));
  ASSERT_GT(lo, 0.0);
  const double ratio = hi / lo;
  EXPECT_GT(ratio, 2.5) << "weights 400:100 gave " << ratio;
  EXPECT_LT(ratio, 6.5) << "weights 400:100 gave " << ratio;
}

TEST_F(CgroupTest, UsageCountsTheCgroupsCpu) {
  auto node = mgr_->create("tools/s5/1");
  ASSERT_TRUE(node);
  pid_t child = start_in(*node, [] {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < end) {
    }
  });
  ::waitpid(child, nullptr, 0);
  auto u = mgr_->usage(*node);
  ASSERT_TRUE(u) << u.error().message();
  ASSERT_TRUE(u->cpu_ns);
  EXPECT_GT(*u->cpu_ns, 100'000'000u);
  if (mgr_->has_v2()) {
    auto p = mgr_->pressure(*node, "cpu");
    EXPECT_TRUE(p) << p.error().message();
  }
}

}  // namespace
}  // namespace tandem::cpu
