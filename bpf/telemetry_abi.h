/* The only structs shared between telemetry.bpf.c (the kernel side) and
 * telemetry.cc (user space): map values and ring-buffer records. C, so both
 * compilers read the same text; fixed-width fields, explicit padding, and the
 * sizes are static_assert'ed from C++ (telemetry.cc). Changing a layout means
 * changing both sides in one commit; the skeleton is rebuilt with the library.
 */
#pragma once

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

/* Log2 buckets of run-queue delay in microseconds: [0,1), [1,2), [2,4), …;
 * the last bucket is open-ended. Equal to tandem::bpf::kRunqBuckets. */
#define TANDEM_RUNQ_BUCKETS 24

/* TandemBpfEvent.kind; the order of tandem::bpf::ProcEvent::Kind. */
enum TandemBpfEventKind {
  kTandemEventFork = 0,
  kTandemEventExec = 1,
  kTandemEventExit = 2,
};

/* One process lifecycle record in the ring buffer (56 bytes). */
struct TandemBpfEvent {
  __u64 cgroup_id;    /* cgroup v2 id the process is in */
  __u64 group;        /* what the tracked map maps cgroup_id to */
  __u64 timestamp_ns; /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
  __s32 pid;          /* the process (thread-group id) */
  __s32 ppid;         /* its parent process (real_parent's tgid) */
  __s32 exit_code;    /* kExit: wait status (exit(3) → 0x300, SIGKILL → 9); else -1 */
  __u8 kind;          /* enum TandemBpfEventKind */
  __u8 pad[3];
  char comm[16];
};

/* Per-group counters: the value of the PERCPU_HASH `counters`, one copy per
 * CPU, summed by user space (248 bytes). */
struct TandemBpfCounters {
  __u64 on_cpu_ns;     /* Σ se.sum_exec_runtime deltas charged at switch-out */
  __u64 runq_delay_ns; /* Σ (switch-in − enqueue) */
  __u64 runq_waits;
  __u64 runq_hist[TANDEM_RUNQ_BUCKETS];
  __u64 forks; /* processes, not threads */
  __u64 execs;
  __u64 exits;
  __u64 reserved;
};

/* Per-cgroup live-process delta: the value of the PERCPU_HASH `live`. Kept per
 * cgroup (not per group) so untracking one cgroup drops exactly its share. */
struct TandemBpfLive {
  __s64 delta; /* +1 per process that entered, −1 per process that left */
};

/* A process counted live: the value of the HASH `procs`, keyed by tgid. */
struct TandemBpfProc {
  __u64 cgroup_id;
};

/* Error counters: the value of the PERCPU_ARRAY `health` (one slot). */
struct TandemBpfHealth {
  __u64 events_dropped; /* ring buffer full */
  __u64 procs_full;     /* `procs` full: a process not counted live */
  __u64 storage_failed; /* task storage unavailable: a slice not charged */
  __u64 reserved;
};
