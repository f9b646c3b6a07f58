// The cgroup manager (issue 6, docs/architecture.md "Host plane"): tandem's tree of cgroups for
// engines and tool calls, on cgroup v2, v1, or both (hybrid).
//
// Subtree. The manager works only inside its delegated subtree: by default
// `<own>/tandem`, where <own> is the cgroup tandemd runs in, separately in
// each hierarchy it uses; or a configured absolute root. It never creates a
// cgroup, writes a knob or moves a process outside that subtree (the one
// exception, on v2, is moving tandemd itself — when it is the only process
// of <own>, as under systemd's Delegate=yes — into `<own>/daemon`, so that
// <own> may enable controllers for its children: the "no internal processes"
// rule; it never moves another process). Every control file is opened with
// openat() on directory fds held from the start, so a path is resolved once.
//
// Hierarchies. The v2 hierarchy, when mounted, is always used: its cgroup ids
// key eBPF telemetry, and cgroup.kill, cgroup.freeze, cpu.stat and the
// per-cgroup pressure files work there even without controllers. Each
// controller tandem sets (cpu, cpuacct, cpuset, memory, pids, freezer) comes
// from v2 if v2 has it enabled, else from the v1 hierarchy that mounts it.
// Mounts are read from /proc/self/mountinfo (libcgroup 2.0.2, Debian 12's,
// misnames the v2 mount of a hybrid system as "hugetlb" and has no version
// query, so it is not used for this).
//
// Plan, then act. plan_cgroups() is pure: from the texts of mountinfo and
// /proc/self/cgroup and the options it decides the hierarchies, the
// controllers each serves and the subtree's root in each, or fails with the
// reason. Only which controllers v2 hands down needs I/O (the parent's
// cgroup.subtree_control); CgroupManager::open_plan() asks, settles the plan
// with CgroupPlan::take_v2(), and makes and opens the subtree. Tests run the
// planner on texts, and open_plan() on a fake tree (TreeHooks below).
//
// Knobs (Limits) and their v1 equivalents:
//   cpu.weight 1..10000          cpu.shares = weight × 1024 / 100
//   cpu.max "$Q $P"              cpu.cfs_quota_us, cpu.cfs_period_us
//   memory.high                  memory.limit_in_bytes with oom_kill_disable:
//                                allocations stall at the limit instead of
//                                the OOM killer firing (v1 has no throttle)
//   memory.max                   memory.limit_in_bytes (when high is unset)
//   memory.low                   none: reported as unsupported
//   pids.max                     pids.max
//   cpuset.cpus                  cpuset.cpus (and cpuset.mems copied from the
//                                parent, which v1 needs before any task joins)
// Freeze is cgroup.freeze (else freezer.state); kill is cgroup.kill (else
// freeze, SIGKILL every member, thaw, until empty).
//
// Thread-safety: one thread at a time per CgroupManager. The free functions
// on directory fds (read_usage, …) are safe anywhere: libtandem uses them.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "base/unique_fd.h"
#include "cpu/cgroup_dirs.h"
#include "cpu/parse.h"

namespace tandem::cpu {

inline constexpr std::uint64_t kUnlimited = UINT64_MAX;

// What to set on a cgroup; unset fields are left as they are.
struct Limits {
  std::optional<std::uint32_t> cpu_weight;   // 1..10000, the v2 scale (100 = default)
  std::optional<CpuMax> cpu_max;             // quota_us nullopt = unlimited
  std::optional<std::uint64_t> memory_high;  // bytes, kUnlimited = "max"
  std::optional<std::uint64_t> memory_max;
  std::optional<std::uint64_t> memory_low;
  std::optional<std::uint64_t> pids_max;  // kUnlimited = "max"
  std::optional<std::string> cpus;        // cpuset list, "0-3,6"
};
// EINVAL naming the field when a value is out of the kernel's range.
base::Result<void> validate(const Limits& limits);

// The knobs a hierarchy setup cannot apply (bit per Limits field).
enum Unsupported : std::uint32_t {
  kNoCpuWeight = 1u << 0,
  kNoCpuMax = 1u << 1,
  kNoMemoryHigh = 1u << 2,
  kNoMemoryMax = 1u << 3,
  kNoMemoryLow = 1u << 4,
  kNoPidsMax = 1u << 5,
  kNoCpus = 1u << 6,
};

// Controllers tandem may use.
enum class Controller : std::uint8_t { kCpu, kCpuacct, kCpuset, kMemory, kPids, kFreezer };
inline constexpr std::size_t kControllers = 6;
std::string_view name(Controller c);

// One mounted hierarchy the manager uses.
struct Hierarchy {
  bool v2 = false;
  std::string mount_point;              // "/sys/fs/cgroup/memory"
  std::vector<Controller> controllers;  // those tandem takes from this hierarchy
  std::string root;                     // the subtree's path within the hierarchy ("/x/tandem")
  bool favordynmods = false;            // mounted with favordynmods (parse.h CgroupMount)
  std::string path() const;             // mount_point + root
};

// One cgroup of the tree, in every hierarchy the manager uses: a directory
// fd per hierarchy (parallel to CgroupManager::hierarchies(); O_PATH).
struct Node {
  std::string rel;  // path beneath the subtree's root ("tools/00ab…/3"); "" = the root
  std::vector<base::UniqueFd> dirs;
  std::uint64_t id = 0;  // the v2 cgroup id (else the first hierarchy's)
};

// Accounting of a cgroup and its descendants.
struct Usage {
  std::optional<std::uint64_t> cpu_ns;        // cpu.stat usage_usec × 1000, or cpuacct.usage
  std::optional<std::uint64_t> memory_bytes;  // memory.current / memory.usage_in_bytes
  std::optional<std::uint64_t> memory_peak;   // memory.peak / memory.max_usage_in_bytes
  std::uint64_t oom_kills = 0;                // memory.events oom_kill / memory.oom_control oom_kill
  std::uint64_t memory_high_events = 0;       // v2: times throttled at memory.high
  bool memory_stalled = false;                // v1: a task waits at the limit (under_oom)
  std::uint64_t nr_throttled = 0;             // cpu.max periods throttled
  std::uint64_t throttled_us = 0;
};

// Seams that let the manager run on a plain directory tree standing in for
// cgroupfs: the fake-cgroupfs test tier (tests/cpu/fake_cgroupfs.h,
// docs/host.md "Tests"). On cgroupfs the kernel makes a cgroup's control
// files at mkdir, drops them at rmdir, and names the cgroup by its kernfs id;
// on a plain file system a test's hooks stand in for that. tandemd leaves
// every hook empty, and the manager then does exactly what it did without
// them.
// Thread-safety: called on the thread that uses the manager.
struct TreeHooks {
  // After each mkdir of the manager (`dir`: O_PATH fd of the new directory
  // in hierarchy `h`), before it reads or writes a file there.
  std::function<base::Result<void>(const Hierarchy& h, int dir)> made;
  // Right before each rmdir of the manager.
  std::function<void(const std::string& path)> removing;
  // The id of the cgroup at `dir`; empty: cgroup_id().
  std::function<base::Result<std::uint64_t>(int dir)> id;
  // Each write of the manager to a control file; empty: write_file(). Many
  // cgroupfs files take a command and show a state (cgroup.subtree_control
  // takes "+cpu" and shows "cpu"; memory.oom_control takes "1" and shows
  // three counters), and every write replaces what was there: a plain file
  // does neither, so a fake tree's hook does what the kernel would.
  std::function<base::Result<void>(int dir, const char* name, std::string_view value)> write;
};

struct ManagerOptions {
  // The subtree, beneath tandemd's own cgroup in each hierarchy; relative, no "..".
  std::string subtree = "tandem";
  // Instead: an absolute path within every hierarchy ("/tandem.slice"); must exist or be creatable.
  std::string root;
  // Controllers to take (all by default).
  bool want[kControllers] = {true, true, true, true, true, true};
  // Files to read (tests point these at fixtures).
  std::string mountinfo_path = "/proc/self/mountinfo";
  std::string self_cgroup_path = "/proc/self/cgroup";
  // Fake-tree seams (tests only).
  TreeHooks hooks;
};

// What the manager uses, as plan_cgroups() decides it from text. Thread-safety:
// a value type.
struct CgroupPlan {
  std::vector<Hierarchy> hierarchies;  // the v2 one first when mounted, then v1 ones in mountinfo order
  std::array<int, kControllers> serving = {-1, -1, -1, -1, -1, -1};  // hierarchy index per Controller, or -1
  int v2 = -1;                                                       // index of the v2 hierarchy (0), or -1
  // v2: the controllers (of cpu, cpuset, memory, pids, as wanted) the
  // subtree's parent is asked to enable for its children. Until take_v2()
  // answers, they come from v1 where v1 mounts them.
  std::vector<Controller> v2_ask;

  // The v2 subtree's parent on disk ("/sys/fs/cgroup/system.slice/x"); "" without v2.
  std::string v2_parent() const;
  // Settles the plan with what the v2 parent enables for its children
  // (controller names, as its cgroup.subtree_control lists them): each asked
  // controller it enables moves to v2 from its v1 hierarchy, and a v1
  // hierarchy left with none is dropped. Clears v2_ask.
  void take_v2(const std::set<std::string>& enabled);
  // As CgroupManager::describe().
  std::string describe() const;
};

// The pure planner: no I/O. `mountinfo` and `self_cgroup` are the texts of
// /proc/self/mountinfo and /proc/self/cgroup. The v2 hierarchy, if mounted and
// this process is inside what it shows, serves cpuacct (cpu.stat) and freezer
// (cgroup.freeze); each other wanted controller comes from the first v1
// mount that has it (until take_v2()). A mount that does not show this
// process's cgroup is skipped. EINVAL for a bad subtree or root, or a text
// that does not parse; ENOENT when no hierarchy is left.
base::Result<CgroupPlan> plan_cgroups(std::string_view mountinfo, std::string_view self_cgroup,
                                      const ManagerOptions& options);
// plan_cgroups() over the texts of the files `options` names (its
// mountinfo_path and self_cgroup_path); their read errors as they are.
base::Result<CgroupPlan> plan_cgroups(const ManagerOptions& options);

class CgroupManager {
 public:
  // Discovers the hierarchies (reads options' mountinfo and self-cgroup
  // files, plan_cgroups()) and opens the plan (open_plan()). ENOENT when no
  // cgroup hierarchy is mounted; EACCES when the subtree cannot be created
  // (not root, not delegated).
  static base::Result<std::unique_ptr<CgroupManager>> open(const ManagerOptions& options);
  // Carries out `plan`: on v2 asks the subtree's parent for the controllers
  // of plan.v2_ask (moving tandemd into <own>/daemon if it is the only
  // process there; see the top) and settles the plan with the answer; then
  // creates the subtree's root in each hierarchy (mkdir -p), enables the v2
  // controllers for its children, and opens it.
  static base::Result<std::unique_ptr<CgroupManager>> open_plan(CgroupPlan plan, TreeHooks hooks = {});
  ~CgroupManager();
  CgroupManager(const CgroupManager&) = delete;
  CgroupManager& operator=(const CgroupManager&) = delete;

  const std::vector<Hierarchy>& hierarchies() const { return hierarchies_; }
  // The hierarchy index that serves `c`, or -1.
  int serving(Controller c) const { return serving_[static_cast<std::size_t>(c)]; }
  // Which Limits fields this setup cannot apply (Unsupported bits).
  std::uint32_t unsupported() const;
  bool has_v2() const { return v2_ >= 0; }
  // Whether the v2 hierarchy is mounted with favordynmods; nullopt without v2.
  // Reported, never changed: remounting is the host's decision.
  std::optional<bool> favordynmods() const {
    if (v2_ < 0) return std::nullopt;
    return hierarchies_[static_cast<std::size_t>(v2_)].favordynmods;
  }
  // One line: "v2 /sys/fs/cgroup/unified/tandem; v1 cpu,cpuacct /sys/fs/cgroup/cpu/tandem; …".
  std::string describe() const;
  const Node& root() const { return root_; }

  // Creates `rel` (and its missing parents) in every hierarchy, or opens it
  // if it exists. `rel` is relative, '/'-separated, no "." or ".." or empty
  // parts: EINVAL otherwise.
  base::Result<Node> create(std::string_view rel);
  // Opens an existing `rel`; ENOENT if it is missing in any hierarchy.
  base::Result<Node> open_node(std::string_view rel) const;
  // The names of `rel`'s child cgroups (in the first hierarchy).
  base::Result<std::vector<std::string>> children(std::string_view rel) const;

  // Applies `limits`; fields this setup cannot apply are skipped and
  // returned as Unsupported bits.
  base::Result<std::uint32_t> apply(const Node& node, const Limits& limits) const;
  base::Result<void> freeze(const Node& node, bool frozen) const;
  // Every process of `node` and its descendants, sorted.
  base::Result<std::vector<int>> processes(const Node& node) const;
  // SIGKILLs every process of `node` and its descendants and waits up to
  // `timeout_ms` until none is left; EBUSY if some remain (uninterruptible
  // sleep), after which calling again continues the job.
  base::Result<void> kill(const Node& node, int timeout_ms) const;
  // Removes `node` and its descendants, bottom-up, in every hierarchy; EBUSY
  // if a cgroup still has processes (kill first). A missing cgroup is fine.
  base::Result<void> remove(const Node& node) const;
  // Removes `node` alone: one rmdir per hierarchy, v2 first, no walk and no
  // process listing. EBUSY (processes left) or ENOTEMPTY (child cgroups)
  // from the first hierarchy leaves it whole; remove() is then the careful
  // way. For cgroups that are leaves and normally empty: an ended call's,
  // a ready one of the pool.
  base::Result<void> remove_leaf(const Node& node) const;
  base::Result<Usage> usage(const Node& node) const;
  // cpu.pressure / memory.pressure of `node` (v2 only: ENOTSUP without v2).
  base::Result<Psi> pressure(const Node& node, std::string_view resource) const;
  // `node`'s directories (borrowed from it): where a spawner starts a
  // process in it, where usage() reads it from, what ToolPlacement carries
  // (cpu/cgroup_dirs.h).
  CgroupDirs dirs(const Node& node) const;

 private:
  CgroupManager() = default;
  base::Result<void> init(CgroupPlan plan);
  base::Result<void> enable_v2_controllers(int dirfd) const;
  // A cgroup this manager just made in `h` (beneath `parent`): the made
  // hook, then, on a v1 cpuset, the parent's cpus and mems.
  base::Result<void> made(const Hierarchy& h, int parent, int dir) const;
  // rmdir(2), after the removing hook; -1 with errno on failure.
  int remove_dir(const std::string& path) const;
  // The id hook, else cgroup_id().
  base::Result<std::uint64_t> id_of(int dir) const;
  // The write hook, else write_file().
  base::Result<void> write(int dir, const char* name, std::string_view value) const;

  std::vector<Hierarchy> hierarchies_;
  std::array<int, kControllers> serving_ = {-1, -1, -1, -1, -1, -1};
  int v2_ = -1;
  Node root_;
  TreeHooks hooks_;
};

// ---- reading and writing a cgroup by directory fd (any thread) --------------

// Reads a control file of the cgroup at `dirfd` (≤ 64 KiB).
base::Result<std::string> read_file(int dirfd, const char* name);
// Writes `value` to a control file in one write(2).
base::Result<void> write_file(int dirfd, const char* name, std::string_view value);
// The cgroup id of the directory (name_to_handle_at; v2 ids are what eBPF sees).
base::Result<std::uint64_t> cgroup_id(int dirfd);
// Usage of one cgroup. What libtandem reads after a tool exits.
base::Result<Usage> read_usage(const CgroupDirs& dirs);

}  // namespace tandem::cpu
