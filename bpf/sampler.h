// The fallback telemetry: sampling cgroupfs and /proc (docs/telemetry.md).
//
// At each sample(), per tracked cgroup: cgroup.procs gives the live processes
// (and, diffed against the last sample, synthetic fork and exit events);
// cpu.stat usage_usec (v2), else cpuacct.usage (v1 with cpuacct), gives exact
// on-CPU time; /proc/<pid>/task/<tid>/schedstat gives each thread's run-queue
// wait and number of waits, and its on-CPU time where the cgroup has no usage
// file. Per-thread last values make the counters cumulative.
//
// Limits, by construction: a process that starts and ends between two
// samples is never seen (no fork, no exit, its waits lost); a thread's last
// waits before it exits are lost; there are no exec events; the histogram
// files each sample's waits of a thread under their mean; a migration into
// the cgroup reads as a fork; a pid reused between two samples is caught only
// when its counters went backwards.
//
// The parsers are pure and tested on strings; the sampler reads files by
// held directory fds (the cgroup's, given to track(), and procfs's).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "bpf/telemetry.h"

namespace tandem::bpf {

// cgroup.procs / cgroup.threads: one decimal pid per line.
base::Result<std::vector<std::int32_t>> parse_pid_list(std::string_view text);

// /proc/<pid>/task/<tid>/schedstat: "<on-cpu ns> <run-queue wait ns> <timeslices>".
struct SchedStat {
  std::uint64_t run_ns = 0;
  std::uint64_t wait_ns = 0;
  std::uint64_t timeslices = 0;  // times it was switched in, i.e. waits that ended
};
base::Result<SchedStat> parse_schedstat(std::string_view text);

// The fields of /proc/<pid>/stat the sampler uses. comm may hold spaces and
// parentheses: it runs from the first '(' to the last ')'.
struct ProcStat {
  std::string comm;
  std::int32_t ppid = 0;
};
base::Result<ProcStat> parse_proc_stat(std::string_view text);

// usage_usec of a cgroup-v2 cpu.stat, in ns. ENOENT when the key is absent.
base::Result<std::uint64_t> parse_cpu_stat_usage_ns(std::string_view text);

// Reads the whole file `path` (relative to `dirfd`) into `out`, replacing
// what it held: one open (O_CLOEXEC), reads until EOF.
base::Result<void> read_file_at(int dirfd, const char* path, std::string& out);

// The sampler; `why` goes into describe() ("sampling (cgroupfs+/proc): <why>").
base::Result<std::unique_ptr<Telemetry>> make_sampler(const Options& options, std::string_view why);

}  // namespace tandem::bpf
