// Host telemetry for tool processes (issue 6, docs/architecture.md "Host plane", docs/telemetry.md):
// per-group on-CPU time, run-queue delay and process lifecycle, where a group
// (e.g. a session) is a set of tracked cgroup-v2 cgroups.
//
// Two implementations behind one interface:
//   - eBPF (Mode::kEbpf): CO-RE programs on tp_btf attach points
//     (sched_process_fork/exec/exit, sched_switch, sched_wakeup[_new],
//     cgroup_attach_task) filtered by a map of tracked cgroup ids; lifecycle
//     events through a ring buffer whose epoll fd the daemon polls, per-CPU
//     counters read at each control tick. Exact: every fork, exec and exit of
//     a process in a tracked cgroup, on-CPU time equal to the cgroup's own
//     accounting.
//   - sampling (Mode::kSampling): reads cgroup.procs, cpu.stat and
//     /proc/<pid>/task/<tid>/schedstat at each sample(). Needs no privilege;
//     misses processes that live between two samples and sees no exec.
// open_telemetry() probes what the kernel and our privileges allow and picks;
// describe() says which mode runs and, for the sampler, why (`tandemctl status`).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/clock.h"
#include "base/result.h"

namespace tandem::bpf {

// Log2 buckets of run-queue delay in µs: [0,1), [1,2), [2,4), … [2^22, ∞).
inline constexpr std::size_t kRunqBuckets = 24;

// The bucket of a run-queue delay (the kernel side computes the same).
std::size_t runq_bucket(std::uint64_t delay_ns);

// Cumulative since the group's first cgroup was tracked (all but live_processes).
struct GroupStats {
  std::uint64_t on_cpu_ns = 0;
  std::uint64_t runq_delay_ns = 0;  // sum
  std::uint64_t runq_waits = 0;     // count
  std::array<std::uint64_t, kRunqBuckets> runq_hist{};
  std::uint64_t forks = 0, execs = 0, exits = 0;  // processes (not threads)
  // eBPF: processes currently in the group's tracked cgroups (counted at
  // fork/migration in, exit/migration out, seeded at track()); sampler: the
  // length of their cgroup.procs at the last sample().
  std::uint64_t live_processes = 0;
};

struct ProcEvent {
  enum class Kind : std::uint8_t { kFork, kExec, kExit } kind;
  std::int32_t pid;        // the process (thread-group id)
  std::int32_t ppid;       // its parent; 0 when unknown
  std::int32_t exit_code;  // kExit: wait status (exit(3) → 0x300, SIGKILL → 9); -1 otherwise or unknown
  std::uint64_t cgroup_id, group;
  std::uint64_t timestamp_ns;  // CLOCK_MONOTONIC
  char comm[16];               // NUL-terminated
};

enum class Mode : std::uint8_t { kEbpf, kSampling };

struct Options {
  bool force_sampling = false;          // the config switch: never try eBPF
  std::size_t ringbuf_bytes = 1 << 20;  // rounded up to a power of two ≥ 4 KiB
  // eBPF: how often at most a record makes event_fd() readable. A record
  // arriving later than this after the last wakeup wakes the reader at once;
  // records closer together ride along, and the last of a burst waits for
  // the next drain_events() — so the daemon drains at every tick as well as
  // on readiness. Also wakes whenever a quarter of the ring buffer is used.
  // Zero: a wakeup per record whenever the reader has caught up (in a fork
  // storm, ~4x the kernel-side cost and a daemon wakeup per event).
  std::chrono::nanoseconds wakeup_interval = std::chrono::milliseconds(10);
  // Capacities of the kernel maps (eBPF); track() fails with ENOSPC beyond them.
  std::size_t max_cgroups = 16384;
  std::size_t max_groups = 4096;
  std::size_t max_processes = 65536;  // live processes in tracked cgroups
  // eBPF: count the kernel time spent in the programs (bpf_run_ns()) by
  // enabling BPF run-time statistics while open. Costs two clock reads per
  // program run (benchmarks, diagnostics).
  bool measure_run_time = false;
  // Kernel paths (tests and unusual mounts): procfs, and the kernel's BTF.
  std::string proc_root = "/proc";
  std::string btf_path = "/sys/kernel/btf/vmlinux";
  // libbpf's messages (warnings and info; debug is dropped), one line each,
  // while the telemetry is open (libbpf has one process-wide logger: the
  // most recently opened eBPF telemetry's). Null: dropped. Called on the
  // thread that uses the telemetry.
  std::function<void(std::string_view)> log;
  // Event timestamps of the sampler; null: CLOCK_MONOTONIC. Not owned.
  const base::Clock* clock = nullptr;
};

// Thread-safety: one thread (the daemon loop) uses an instance. Two eBPF
// instances in one process are independent (each loads its own programs).
class Telemetry {
 public:
  virtual ~Telemetry() = default;
  virtual Mode mode() const = 0;
  // "ebpf (tp_btf, ringbuf, task storage)" or "sampling (cgroupfs+/proc): <why eBPF is off>".
  virtual std::string_view describe() const = 0;
  // Starts accounting cgroup `cgroup_id` (v2 id) into `group`. `dirfd`: an fd
  // of the cgroup's directory (the one with cgroup.procs; the sampler reads
  // it; may be the v2 dir or, on pure v1, a v1 dir), dup'd if kept. Processes
  // already inside count as live but not as forks. Tracking an id again with
  // the same group is a no-op; with another group, EEXIST. ENOSPC when full.
  virtual base::Result<void> track(std::uint64_t cgroup_id, std::uint64_t group, int dirfd) = 0;
  // Stops accounting the cgroup; what it contributed to its group stays until
  // forget_group (its live processes leave live_processes). Unknown ids: no-op.
  virtual void untrack(std::uint64_t cgroup_id) = 0;
  // Drops the group's stats, untracking any of its cgroups still tracked.
  virtual void forget_group(std::uint64_t group) = 0;
  // The group's lineage: every live process born in one of its tracked
  // cgroups or to such a process, wherever it is now (eBPF follows each
  // fork; a process that moved to another cgroup or double-forked stays in
  // it until it exits). The sampler does not follow forks: empty.
  virtual std::vector<std::int32_t> lineage(std::uint64_t /*group*/) { return {}; }
  // Whether `pid` is in the group's lineage now (so a pidfd opened on it
  // after lineage() is of that process, not of one that reused its pid).
  virtual bool in_lineage(std::int32_t /*pid*/, std::uint64_t /*group*/) { return false; }
  // Readable when events wait (the ring buffer's epoll fd; see
  // Options::wakeup_interval for when exactly); -1 for sampling.
  virtual int event_fd() const = 0;
  // Hands every waiting event to `sink`; returns how many. The sampler
  // synthesises kFork/kExit from pid-set diffs at sample().
  virtual std::size_t drain_events(const std::function<void(const ProcEvent&)>& sink) = 0;
  // Called once per control tick (~10-100 ms): refreshes and returns the
  // per-group cumulative stats of every group tracked and not forgotten.
  virtual const std::unordered_map<std::uint64_t, GroupStats>& sample() = 0;
  // Since open — eBPF: records the kernel could not queue (ring buffer full)
  // plus processes it could not count (process map full); sampling: events
  // dropped because 65,536 waited undrained.
  virtual std::uint64_t lost_events() { return 0; }
  // eBPF with Options::measure_run_time: kernel time spent in the programs
  // since open, in ns; 0 otherwise.
  virtual std::uint64_t bpf_run_ns() { return 0; }
};

// Probes features (kernel BTF, a cgroup v2 hierarchy, bpf() permitted, ring
// buffer and task storage maps, tp_btf load and attach) and returns eBPF
// telemetry or, with the reason in describe(), the sampler. Fails only when
// neither can be had.
base::Result<std::unique_ptr<Telemetry>> open_telemetry(const Options& options);
// The fallback, directly (tests).
base::Result<std::unique_ptr<Telemetry>> open_sampler();
base::Result<std::unique_ptr<Telemetry>> open_sampler(const Options& options, std::string_view why = "forced");

// The id of the cgroup whose directory `dirfd` is: its kernfs node id, from
// name_to_handle_at (on v2, the id BPF sees). EOPNOTSUPP for a directory
// that is not on cgroupfs.
base::Result<std::uint64_t> cgroup_id_of(int dirfd);

}  // namespace tandem::bpf
