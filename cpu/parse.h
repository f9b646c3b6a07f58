// Pure parsers for what cgroupfs and procfs say about CPU and memory
// (issue 6, docs/architecture.md "Host plane"): PSI, cpu.stat, memory.events, cpu.max, and a
// process's cgroup membership. Each takes the file's text and reads nothing
// else; errors (EINVAL) name the file kind and the offending text. Reading the
// files (by held directory fd) lives with the cgroup manager.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace tandem::cpu {

// One line of a pressure file: "some avg10=0.12 avg60=0.05 avg300=0.01 total=123".
struct PsiLine {
  double avg10 = 0.0;  // percent of wall time stalled, last 10 s
  double avg60 = 0.0;
  double avg300 = 0.0;
  std::uint64_t total_us = 0;  // cumulative stall time
};

// /proc/pressure/{cpu,memory,io} or a cgroup's {cpu,memory,io}.pressure.
// `full` is absent where the kernel does not report it (node cpu before 5.13).
struct Psi {
  PsiLine some;
  std::optional<PsiLine> full;
};
base::Result<Psi> parse_psi(std::string_view text);

// cpu.stat. cgroup v2 reports microseconds (usage_usec, user_usec,
// system_usec, nr_periods, nr_throttled, throttled_usec); v1's cpu.stat has
// only the throttling fields, in nanoseconds (throttled_time), and usage comes
// from cpuacct.usage (parse_cpuacct_usage). Keys a kernel lacks stay 0;
// unknown keys are ignored (newer kernels add some).
struct CpuStat {
  std::uint64_t usage_us = 0;
  std::uint64_t user_us = 0;
  std::uint64_t system_us = 0;
  std::uint64_t nr_periods = 0;
  std::uint64_t nr_throttled = 0;
  std::uint64_t throttled_us = 0;
};
base::Result<CpuStat> parse_cpu_stat(std::string_view text);
// cpuacct.usage (v1): nanoseconds of CPU time, one number.
base::Result<std::uint64_t> parse_cpuacct_usage_ns(std::string_view text);

// memory.events (v2): how often the cgroup hit memory.low/high/max, OOMs.
struct MemoryEvents {
  std::uint64_t low = 0;
  std::uint64_t high = 0;  // throttled by memory.high
  std::uint64_t max = 0;   // reached memory.max
  std::uint64_t oom = 0;
  std::uint64_t oom_kill = 0;
};
base::Result<MemoryEvents> parse_memory_events(std::string_view text);

// cpu.max (v2): "$MAX $PERIOD", MAX being "max" for no limit.
struct CpuMax {
  std::optional<std::uint64_t> quota_us;  // nullopt: unlimited
  std::uint64_t period_us = 100000;
  friend bool operator==(const CpuMax&, const CpuMax&) = default;
};
base::Result<CpuMax> parse_cpu_max(std::string_view text);
// What to write to cpu.max; quota and period must be ≥ 1000 µs (the kernel's
// minimum), period ≤ 1 s: EINVAL otherwise.
base::Result<std::string> format_cpu_max(const CpuMax& value);

// /proc/<pid>/cgroup: "hierarchy-ID:controller-list:path" per line. The v2
// hierarchy is ID 0 with an empty controller list; v1 named hierarchies show
// "name=systemd".
struct CgroupMembership {
  unsigned hierarchy = 0;
  std::vector<std::string> controllers;
  std::string path;  // absolute within its hierarchy
};
base::Result<std::vector<CgroupMembership>> parse_proc_cgroup(std::string_view text);

// memory.oom_control (v1): "oom_kill_disable 0\nunder_oom 0\noom_kill 0".
struct OomControl {
  bool oom_kill_disable = false;
  bool under_oom = false;      // a task waits at memory.limit_in_bytes (only with oom_kill_disable)
  std::uint64_t oom_kill = 0;  // processes the OOM killer ended in this cgroup (kernel ≥ 4.13)
};
base::Result<OomControl> parse_oom_control(std::string_view text);

// cgroup.procs: one pid per line.
base::Result<std::vector<int>> parse_pids(std::string_view text);

// One cgroup filesystem mounted in this mount namespace (from
// /proc/self/mountinfo). A v1 mount lists its controllers ("cpu", "cpuacct";
// a named hierarchy shows "name=systemd"); a v2 mount has none listed here
// (they are in its cgroup.controllers).
struct CgroupMount {
  bool v2 = false;
  std::string mount_point;  // "/sys/fs/cgroup/cpu"
  std::string root;         // the hierarchy path the mount shows ("/" unless bind-mounted or namespaced)
  std::vector<std::string> controllers;
  // The super option "favordynmods" (Linux ≥ 6.0 mount option, or the
  // cgroup_favordynmods= boot parameter): cgroup_threadgroup_rwsem stays in
  // its slow-reader mode, so migrations never wait for an RCU grace period.
  bool favordynmods = false;
};
// Every cgroup and cgroup2 mount, in file order; other filesystems are skipped.
base::Result<std::vector<CgroupMount>> parse_mountinfo(std::string_view text);

}  // namespace tandem::cpu
