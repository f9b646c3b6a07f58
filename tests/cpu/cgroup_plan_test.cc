// The cgroup manager's pure planner (plan_cgroups, CgroupPlan::take_v2) on
// mountinfo and /proc/self/cgroup texts: pure v2, pure v1, hybrid as on the
// development machines, controllers from v2 or v1, a configured root, bad
// subtrees and roots, nothing usable mounted, and hostile or odd lines. No
// I/O and no privilege: these run everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "cpu/cgroup.h"

namespace tandem::cpu {
namespace {

// The development machine's text (Debian 12 VM): v1 controllers, an empty
// cgroup2 at /sys/fs/cgroup/unified, and a memory cgroup of its own.
constexpr const char* kHybridMountinfo =
    "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices\n"
    "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
    "38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
constexpr const char* kHybridSelf =
    "9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:/\n5:devices:/\n4:memory:/process_api/5c1f\n"
    "3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n";

// A systemd host with only cgroup2, tandemd as a service.
constexpr const char* kV2Mountinfo =
    "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "30 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";
constexpr const char* kV2Self = "0::/system.slice/tandemd.service\n";

// v1 alone, cpu and cpuacct co-mounted (CentOS 7, older Ubuntu).
constexpr const char* kV1Mountinfo =
    "25 22 0:22 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,release_agent=/x,name=systemd\n"
    "26 22 0:23 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
    "27 22 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    "28 22 0:25 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n"
    "29 22 0:26 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset,clone_children\n"
    "30 22 0:27 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
constexpr const char* kV1Self =
    "6:pids:/svc\n5:cpuset:/svc\n4:freezer:/svc\n3:memory:/svc\n2:cpu,cpuacct:/svc\n1:name=systemd:/svc\n";

CgroupPlan plan_of(const char* mountinfo, const char* self, const ManagerOptions& o = {}) {
  auto p = plan_cgroups(mountinfo, self, o);
  EXPECT_TRUE(p) << p.error().message();
  return p ? *p : CgroupPlan{};
}

TEST(CgroupPlan, PureV2AsksItsParentAndTakesWhatItEnables) {
  CgroupPlan p = plan_of(kV2Mountinfo, kV2Self);
  ASSERT_EQ(p.hierarchies.size(), 1u);
  const Hierarchy& h = p.hierarchies[0];
  EXPECT_TRUE(h.v2);
  EXPECT_EQ(p.v2, 0);
  EXPECT_EQ(h.mount_point, "/sys/fs/cgroup");
  EXPECT_EQ(h.root, "/system.slice/tandemd.service/tandem");
  EXPECT_EQ(h.path(), "/sys/fs/cgroup/system.slice/tandemd.service/tandem");
  EXPECT_EQ(p.v2_parent(), "/sys/fs/cgroup/system.slice/tandemd.service");
  // Before the parent answers: only what v2 has without controllers.
  EXPECT_EQ(h.controllers, (std::vector<Controller>{Controller::kCpuacct, Controller::kFreezer}));
  EXPECT_EQ(p.v2_ask,
            (std::vector<Controller>{Controller::kCpu, Controller::kCpuset, Controller::kMemory, Controller::kPids}));
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kMemory)], -1);
  EXPECT_FALSE(h.favordynmods);

  // The parent enables cpu, memory and io (not ours), not cpuset or pids.
  p.take_v2({"cpu", "memory", "io"});
  EXPECT_EQ(p.hierarchies[0].controllers, (std::vector<Controller>{Controller::kCpu, Controller::kCpuacct,
                                                                   Controller::kMemory, Controller::kFreezer}));
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kCpu)], 0);
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kMemory)], 0);
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kCpuset)], -1);
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kPids)], -1);
  EXPECT_TRUE(p.v2_ask.empty());
  EXPECT_EQ(p.describe(), "v2 cpu,cpuacct,memory,freezer /sys/fs/cgroup/system.slice/tandemd.service/tandem");
}

TEST(CgroupPlan, HybridAsOnTheDevelopmentMachine) {
  CgroupPlan p = plan_of(kHybridMountinfo, kHybridSelf);
  EXPECT_EQ(p.describe(),
            "v2 cpuacct,freezer /sys/fs/cgroup/unified/tandem; v1 cpu /sys/fs/cgroup/cpu/tandem; "
            "v1 cpuset /sys/fs/cgroup/cpuset/tandem; v1 memory /sys/fs/cgroup/memory/process_api/5c1f/tandem; "
            "v1 pids /sys/fs/cgroup/pids/tandem");
  EXPECT_EQ(p.v2, 0);
  EXPECT_EQ(p.v2_parent(), "/sys/fs/cgroup/unified");
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kCpuacct)], 0);  // cpu.stat of v2, not v1's cpuacct
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kFreezer)], 0);
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kCpu)], 1);
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kMemory)], 3);
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kPids)], 4);
  // The empty v2 enables nothing: the plan stands.
  const std::string before = p.describe();
  p.take_v2({});
  EXPECT_EQ(p.describe(), before);
}

TEST(CgroupPlan, ControllersV2EnablesLeaveTheirV1Hierarchies) {
  CgroupPlan p = plan_of(kHybridMountinfo, kHybridSelf);
  p.take_v2({"memory", "cpu"});
  EXPECT_EQ(p.describe(),
            "v2 cpu,cpuacct,memory,freezer /sys/fs/cgroup/unified/tandem; v1 cpuset /sys/fs/cgroup/cpuset/tandem; "
            "v1 pids /sys/fs/cgroup/pids/tandem");
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kMemory)], 0);
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kCpuset)], 1);
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kPids)], 2);
  EXPECT_EQ(p.v2, 0);
}

TEST(CgroupPlan, PureV1CoMountedCpuAndCpuacct) {
  CgroupPlan p = plan_of(kV1Mountinfo, kV1Self);
  EXPECT_EQ(p.v2, -1);
  EXPECT_EQ(p.v2_parent(), "");
  EXPECT_TRUE(p.v2_ask.empty());
  EXPECT_EQ(p.describe(),
            "v1 cpu,cpuacct /sys/fs/cgroup/cpu,cpuacct/svc/tandem; v1 memory /sys/fs/cgroup/memory/svc/tandem; "
            "v1 freezer /sys/fs/cgroup/freezer/svc/tandem; v1 cpuset /sys/fs/cgroup/cpuset/svc/tandem; "
            "v1 pids /sys/fs/cgroup/pids/svc/tandem");
  for (std::size_t i = 0; i < kControllers; ++i) EXPECT_GE(p.serving[i], 0) << name(static_cast<Controller>(i));
  const std::string before = p.describe();
  p.take_v2({"memory"});  // no v2: nothing to take
  EXPECT_EQ(p.describe(), before);
}

TEST(CgroupPlan, UnwantedControllersAreNeitherAskedForNorTaken) {
  ManagerOptions o;
  o.want[static_cast<std::size_t>(Controller::kMemory)] = false;
  o.want[static_cast<std::size_t>(Controller::kFreezer)] = false;
  CgroupPlan p = plan_of(kHybridMountinfo, kHybridSelf, o);
  EXPECT_EQ(p.hierarchies[0].controllers, std::vector<Controller>{Controller::kCpuacct});
  EXPECT_EQ(p.v2_ask, (std::vector<Controller>{Controller::kCpu, Controller::kCpuset, Controller::kPids}));
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kMemory)], -1);
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kFreezer)], -1);  // not from v1 either
  p.take_v2({"memory"});
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kMemory)], -1);
  for (const Hierarchy& h : p.hierarchies) {
    EXPECT_EQ(std::count(h.controllers.begin(), h.controllers.end(), Controller::kMemory), 0) << h.mount_point;
  }
}

TEST(CgroupPlan, AConfiguredRootIsTheSameEverywhere) {
  ManagerOptions o;
  o.root = "/tandem.slice";
  CgroupPlan p = plan_of(kHybridMountinfo, kHybridSelf, o);
  ASSERT_EQ(p.hierarchies.size(), 5u);
  for (const Hierarchy& h : p.hierarchies) EXPECT_EQ(h.root, "/tandem.slice") << h.mount_point;
  EXPECT_EQ(p.v2_parent(), "/sys/fs/cgroup/unified");
  o.root = "/a/b";
  p = plan_of(kV2Mountinfo, kV2Self, o);
  EXPECT_EQ(p.v2_parent(), "/sys/fs/cgroup/a");
}

TEST(CgroupPlan, BadSubtreesAndRootsAreRefusedWithTheirName) {
  for (const char* bad : {"..", "a/../b", "/abs", "a//b", ".", "a/./b", "a/"}) {
    ManagerOptions o;
    o.subtree = bad;
    auto p = plan_cgroups(kV2Mountinfo, kV2Self, o);
    ASSERT_FALSE(p) << bad;
    EXPECT_EQ(p.error().code(), EINVAL) << bad;
    EXPECT_NE(p.error().message().find("subtree"), std::string::npos) << p.error().message();
  }
  ManagerOptions empty;
  empty.subtree = "";
  auto e = plan_cgroups(kV2Mountinfo, kV2Self, empty);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code(), EINVAL);
  EXPECT_NE(e.error().message().find("subtree is empty"), std::string::npos) << e.error().message();

  for (const char* bad : {"relative", "/a/../b", "/a/..", "/a//b", "/a/./b"}) {
    ManagerOptions o;
    o.root = bad;
    auto p = plan_cgroups(kV2Mountinfo, kV2Self, o);
    ASSERT_FALSE(p) << bad;
    EXPECT_EQ(p.error().code(), EINVAL) << bad;
    EXPECT_NE(p.error().message().find("root"), std::string::npos) << p.error().message();
  }
  // A subtree too long for one directory name.
  ManagerOptions longer;
  longer.subtree = std::string(256, 'x');
  EXPECT_FALSE(plan_cgroups(kV2Mountinfo, kV2Self, longer));
}

TEST(CgroupPlan, NothingUsableMountedIsENOENT) {
  const char* none = "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n";
  for (auto [mi, self] : std::initializer_list<std::pair<const char*, const char*>>{
           {none, kV2Self},
           {"", ""},
           // Only a named v1 hierarchy: nothing tandem uses.
           {"40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n", "1:name=systemd:/\n"},
           // v2 mounted but this process is not in it (another namespace's view).
           {kV2Mountinfo, "1:name=systemd:/\n"},
           // A bind mount of /other, while we run in /mine.
           {"30 22 0:26 /other /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "0::/mine\n"},
           // /other/x is not below the mount's root /other/xy.
           {"30 22 0:26 /other/xy /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "0::/other/x\n"},
       }) {
    auto p = plan_cgroups(mi, self, {});
    ASSERT_FALSE(p) << mi;
    EXPECT_EQ(p.error().code(), ENOENT) << mi;
    EXPECT_NE(p.error().message().find("no cgroup hierarchy"), std::string::npos) << p.error().message();
  }
}

TEST(CgroupPlan, MountRootsShiftOurPath) {
  // A namespaced or bind-mounted v2 showing /sub: our /sub/x is /x on disk.
  CgroupPlan p = plan_of("30 22 0:26 /sub /mnt/cg rw - cgroup2 cgroup2 rw\n", "0::/sub/x\n");
  EXPECT_EQ(p.hierarchies[0].root, "/x/tandem");
  EXPECT_EQ(p.v2_parent(), "/mnt/cg/x");
  // Exactly the mount's root: we are at its top.
  p = plan_of("30 22 0:26 /sub /mnt/cg rw - cgroup2 cgroup2 rw\n", "0::/sub\n");
  EXPECT_EQ(p.hierarchies[0].root, "/tandem");
  EXPECT_EQ(p.v2_parent(), "/mnt/cg");
  EXPECT_EQ(p.hierarchies[0].path(), "/mnt/cg/tandem");
}

TEST(CgroupPlan, TheFirstUsableMountOfAHierarchyWins) {
  // v2 mounted twice, the first showing a subtree we are outside of.
  CgroupPlan p = plan_of(
      "30 22 0:26 /elsewhere /a rw - cgroup2 cgroup2 rw\n"
      "31 22 0:26 / /b rw - cgroup2 cgroup2 rw\n"
      "32 22 0:26 / /c rw - cgroup2 cgroup2 rw\n",
      "0::/me\n");
  ASSERT_EQ(p.hierarchies.size(), 1u);
  EXPECT_EQ(p.hierarchies[0].mount_point, "/b");
  // memory in two v1 mounts (not possible in a kernel; hostile text): once.
  p = plan_of(
      "35 31 0:32 / /m1 rw - cgroup cgroup rw,memory\n"
      "36 31 0:32 / /m2 rw - cgroup cgroup rw,memory\n",
      "4:memory:/\n");
  ASSERT_EQ(p.hierarchies.size(), 1u);
  EXPECT_EQ(p.hierarchies[0].mount_point, "/m1");
}

TEST(CgroupPlan, EscapedAndOddMountinfoLines) {
  // \040 is a space in a mount point; favordynmods is carried; super options
  // may be missing (v2 still counts; a v1 mount then has no controllers).
  CgroupPlan p = plan_of(
      "41 31 0:38 / /sys/fs/cgroup/uni\\040fied rw - cgroup2 cgroup2 rw,favordynmods\n"
      "42 31 0:39 / /sys/fs/cgroup/pi\\134ds rw shared:3 master:1 - cgroup cgroup rw,pids\n"
      "43 31 0:40 / /sys/fs/cgroup/bare rw - cgroup cgroup\n",
      "2:pids:/\n1::/\n0::/\n");
  ASSERT_EQ(p.hierarchies.size(), 2u);
  EXPECT_EQ(p.hierarchies[0].mount_point, "/sys/fs/cgroup/uni fied");
  EXPECT_TRUE(p.hierarchies[0].favordynmods);
  EXPECT_EQ(p.hierarchies[1].mount_point, "/sys/fs/cgroup/pi\\ds");
  EXPECT_EQ(p.hierarchies[1].controllers, std::vector<Controller>{Controller::kPids});
  p = plan_of("41 31 0:38 / /cg rw - cgroup2 cgroup2\n", "0::/\n");
  EXPECT_EQ(p.hierarchies[0].root, "/tandem");
  EXPECT_EQ(p.v2_parent(), "/cg");

  // Lines the parser cannot read fail the whole text, naming it.
  for (const char* bad :
       {"31 23 0:28 / /x rw - cgroup2\n",                         // no source after the type
        "31 23 0:28 / /x rw cgroup2 cgroup2 rw\n",                // no " - "
        "31 23\n", "garbage\n", "22 1 254:1 / / rw - ext4\n"}) {  // a malformed line of another file system
    auto r = plan_cgroups(bad, kV2Self, {});
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code(), EINVAL) << bad;
    EXPECT_NE(r.error().message().find("mountinfo"), std::string::npos) << r.error().message();
  }
  for (const char* bad : {"nonsense\n", "x::/\n", "0::relative\n", "0::\n"}) {
    auto r = plan_cgroups(kV2Mountinfo, bad, {});
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code(), EINVAL) << bad;
    EXPECT_NE(r.error().message().find("cgroup"), std::string::npos) << r.error().message();
  }
  // A path with ':' in it is one path.
  p = plan_of(kV2Mountinfo, "0::/odd:name\n");
  EXPECT_EQ(p.hierarchies[0].root, "/odd:name/tandem");
  // Our own path must not walk out of the subtree either.
  auto escape = plan_cgroups(kV2Mountinfo, "0::/a/../../etc\n", {});
  ASSERT_FALSE(escape);
  EXPECT_EQ(escape.error().code(), EINVAL);
}

TEST(CgroupPlan, TakeV2IsIdempotentAndKeepsV2First) {
  CgroupPlan p = plan_of(kHybridMountinfo, kHybridSelf);
  p.take_v2({"pids"});
  const std::string once = p.describe();
  p.take_v2({"pids", "memory"});  // already answered: v2_ask is empty
  EXPECT_EQ(p.describe(), once);
  EXPECT_EQ(p.v2, 0);
  EXPECT_TRUE(p.hierarchies[0].v2);
  EXPECT_EQ(p.serving[static_cast<std::size_t>(Controller::kPids)], 0);
}

}  // namespace
}  // namespace tandem::cpu
