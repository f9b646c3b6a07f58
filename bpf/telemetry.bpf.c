/* tandem's eBPF telemetry (issue 6, docs/architecture.md "Host plane", docs/telemetry.md): the
 * kernel side of bpf::Telemetry in eBPF mode.
 *
 * What it measures, only for tasks whose cgroup-v2 cgroup is in `tracked`
 * (cgroup id → group; the daemon maintains it, a group is e.g. a session):
 *   - on-CPU time per group: at every switch-out, the growth of the task's
 *     se.sum_exec_runtime since the last one. That is the same quantity the
 *     kernel charges to the cgroup's cpu.stat usage_usec, so the two agree.
 *   - run-queue delay per group: from the moment a task becomes runnable
 *     (wakeup, wakeup_new, or preempted while runnable) to its next
 *     switch-in; a sum, a count and a log2 histogram in microseconds.
 *   - process lifecycle: fork (into a tracked cgroup), exec, exit (when the
 *     last thread of the process exits) as records in the ring buffer, and
 *     their counts; processes only — threads are charged CPU but not counted.
 *   - live processes per tracked cgroup: +1 when a process forks into it,
 *     migrates into it (cgroup_attach_task) or execs in it uncounted, −1 when
 *     it exits or migrates out. `procs` (tgid → cgroup) remembers where each
 *     was counted so every +1 has exactly one −1. User space seeds the
 *     processes already present when it tracks a cgroup.
 *   - lineage: every process forked in a tracked cgroup, and every process
 *     forked by one of those, wherever it went since (another cgroup, a
 *     double fork, a new session), maps tgid → group until it exits. A
 *     session's end kills its lineage as well as its cgroups' members, so a
 *     tool that left its cgroup dies with its session too. The fork hook
 *     looks the parent up for every fork on the node (one hash lookup); the
 *     exit hook deletes (one hash delete).
 *
 * Per-task state (last sum_exec_runtime, enqueue time) lives in TASK_STORAGE,
 * created only for tasks seen in tracked cgroups and dropped when such a task
 * is seen outside them; the kernel frees it with the task. Counters are
 * per-CPU (PERCPU_HASH), so the hot path takes no lock and user space sums
 * the CPUs at each control tick. Entries of `counters` and `live` are created
 * by user space at track() and only looked up here, so an untrack racing an
 * event never resurrects a deleted entry.
 *
 * Attach points are all tp_btf (BTF-typed raw tracepoints: no tracefs, no
 * kprobes). Every kernel field is read through CO-RE, so one object loads on
 * any kernel with BTF that has these tracepoints and task storage (≥ 5.11).
 */
#include "vmlinux.h"

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "telemetry_abi.h"

/* Macros vmlinux.h cannot carry. */
#define TASK_RUNNING 0
#define SIGNAL_GROUP_EXIT 0x00000004

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The sizes below are defaults; user space sets them from Options before load. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 16384);
  __type(key, __u64);   /* cgroup id (cgroup v2, kernfs node id) */
  __type(value, __u64); /* group */
} tracked SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
  __uint(max_entries, 4096);
  __type(key, __u64); /* group */
  __type(value, struct TandemBpfCounters);
} counters SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
  __uint(max_entries, 16384);
  __type(key, __u64); /* cgroup id */
  __type(value, struct TandemBpfLive);
} live SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 65536);
  __type(key, __u32); /* tgid */
  __type(value, struct TandemBpfProc);
} procs SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 65536);
  __type(key, __u32);   /* tgid */
  __type(value, __u64); /* group */
} lineage SEC(".maps");

struct TaskState {
  __u64 last_runtime; /* se.sum_exec_runtime when last charged */
  __u64 enqueued_ns;  /* became runnable at; 0 = not waiting */
  __u32 baseline;     /* last_runtime is valid */
  __u32 pad;
};

struct {
  __uint(type, BPF_MAP_TYPE_TASK_STORAGE);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __type(key, int);
  __type(value, struct TaskState);
} task_state SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 20);
} events SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct TandemBpfHealth);
} health SEC(".maps");

/* Reader wakeups (Options::wakeup_interval). A wakeup is an irq_work and a
 * self-IPI here plus a trip through the daemon's loop there; in a fork storm
 * one per record costs more than everything else in this file. So a record
 * wakes the reader only if `wakeup_interval_ns` passed since the last wakeup
 * (a lone event is prompt) or `wakeup_bytes` wait (the ring stays far from
 * full); the tail of a burst waits for the daemon's drain at its tick.
 * wakeup_interval_ns = 0: libbpf's default, a wakeup whenever the reader has
 * caught up. Load-time constants, and one racy global: a lost update costs
 * at most an extra wakeup. */
const volatile __u64 wakeup_interval_ns = 0;
const volatile __u64 wakeup_bytes = 1 << 18;
__u64 last_wakeup_ns = 0;

/* The task's cgroup on the default (v2) hierarchy. Reads here are direct
 * CO-RE loads (tp_btf arguments are BTF pointers the verifier lets us walk,
 * faulting loads made safe), not bpf_probe_read_kernel() calls: this runs
 * on every context switch. */
static __always_inline __u64 task_cgroup_id(struct task_struct *task) {
  return task->cgroups->dfl_cgrp->kn->id;
}

/* Whether the task may have task storage at all: most tasks have none, and
 * this one load spares them a helper call per switch. */
static __always_inline bool may_have_storage(struct task_struct *task) {
  if (bpf_core_field_exists(task->bpf_storage)) return task->bpf_storage != NULL;
  return true;
}

static __always_inline struct TandemBpfHealth *health_slot(void) {
  __u32 zero = 0;
  return bpf_map_lookup_elem(&health, &zero);
}

/* task_struct::state became __state in 5.14. */
struct task_struct___pre514 {
  long state;
} __attribute__((preserve_access_index));

static __always_inline long task_run_state(struct task_struct *task) {
  if (bpf_core_field_exists(task->__state)) return task->__state;
  return ((struct task_struct___pre514 *)task)->state;
}

static __always_inline __u32 log2_u32(__u32 v) {
  __u32 r = (v > 0xFFFF) << 4;
  v >>= r;
  __u32 shift = (v > 0xFF) << 3;
  v >>= shift;
  r |= shift;
  shift = (v > 0xF) << 2;
  v >>= shift;
  r |= shift;
  shift = (v > 0x3) << 1;
  v >>= shift;
  r |= shift;
  return r | (v >> 1);
}

/* Bucket of a delay: 0 for [0, 1 µs), k for [2^(k−1), 2^k) µs, the last one open. */
static __always_inline __u32 runq_bucket(__u64 delay_ns) {
  __u64 us = delay_ns / 1000;
  if (us == 0) return 0;
  __u32 hi = us >> 32;
  __u32 b = 1 + (hi ? 32 + log2_u32(hi) : log2_u32((__u32)us));
  return b < TANDEM_RUNQ_BUCKETS ? b : TANDEM_RUNQ_BUCKETS - 1;
}

/* Counts process `tgid` live in `cgid` unless it already is (anywhere). */
static __always_inline void count_live(__u32 tgid, __u64 cgid) {
  struct TandemBpfLive *l = bpf_map_lookup_elem(&live, &cgid);
  if (!l) return; /* untracked meanwhile */
  struct TandemBpfProc proc = {.cgroup_id = cgid};
  long err = bpf_map_update_elem(&procs, &tgid, &proc, BPF_NOEXIST);
  if (err == 0) {
    l->delta++;
  } else if (err != -17 /* EEXIST: already counted */) {
    struct TandemBpfHealth *h = health_slot();
    if (h) h->procs_full++;
  }
}

/* Uncounts process `tgid` wherever it was counted. */
static __always_inline void uncount_live(__u32 tgid) {
  struct TandemBpfProc *proc = bpf_map_lookup_elem(&procs, &tgid);
  if (!proc) return;
  __u64 was = proc->cgroup_id;
  /* Only the caller whose delete succeeds decrements: two threads of one
   * process exiting together may both get here. */
  if (bpf_map_delete_elem(&procs, &tgid) != 0) return;
  struct TandemBpfLive *l = bpf_map_lookup_elem(&live, &was);
  if (l) l->delta--;
}

static __always_inline void emit(__u8 kind, struct task_struct *task, __u64 cgid, __u64 group, __s32 exit_code) {
  struct TandemBpfEvent *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
  if (!e) {
    struct TandemBpfHealth *h = health_slot();
    if (h) h->events_dropped++;
    return;
  }
  e->cgroup_id = cgid;
  e->group = group;
  e->timestamp_ns = bpf_ktime_get_ns();
  e->pid = task->tgid;
  e->ppid = task->real_parent->tgid;
  e->exit_code = exit_code;
  e->kind = kind;
  e->pad[0] = e->pad[1] = e->pad[2] = 0;
  __builtin_memcpy(e->comm, task->comm, sizeof(e->comm)); /* NUL-padded by the kernel */
  __u64 flags = 0;
  if (wakeup_interval_ns) {
    if (e->timestamp_ns - last_wakeup_ns >= wakeup_interval_ns ||
        bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes) {
      last_wakeup_ns = e->timestamp_ns;
      flags = BPF_RB_FORCE_WAKEUP;
    } else {
      flags = BPF_RB_NO_WAKEUP;
    }
  }
  bpf_ringbuf_submit(e, flags);
}

/* Task storage with a charging baseline of "now" for a task entering a
 * tracked cgroup; an existing baseline is kept. */
static __always_inline void start_charging(struct task_struct *task) {
  struct TaskState *st = bpf_task_storage_get(&task_state, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
  if (!st) {
    struct TandemBpfHealth *h = health_slot();
    if (h) h->storage_failed++;
    return;
  }
  if (!st->baseline) {
    st->last_runtime = task->se.sum_exec_runtime;
    st->baseline = 1;
  }
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child) {
  /* The child's cgroup, not the parent's: with CLONE_INTO_CGROUP they differ,
   * and the cgroup is final by the time this tracepoint fires. */
  __u64 cgid = task_cgroup_id(child);
  __u64 *group = bpf_map_lookup_elem(&tracked, &cgid);
  if (child->pid == child->tgid) {
    /* A process: of a group's lineage if born in its cgroup or to one. */
    __u32 tgid = child->tgid;
    if (group) {
      bpf_map_update_elem(&lineage, &tgid, group, BPF_ANY);
    } else {
      __u32 ptgid = parent->tgid;
      __u64 *pg = bpf_map_lookup_elem(&lineage, &ptgid);
      if (pg) {
        __u64 inherited = *pg;
        bpf_map_update_elem(&lineage, &tgid, &inherited, BPF_ANY);
      }
    }
  }
  if (!group) return 0;
  __u64 g = *group;
  start_charging(child); /* sum_exec_runtime is 0: charged from birth */
  if (child->pid != child->tgid) return 0; /* a thread */
  count_live(child->tgid, cgid);
  struct TandemBpfCounters *c = bpf_map_lookup_elem(&counters, &g);
  if (c) c->forks++;
  emit(kTandemEventFork, child, cgid, g, -1);
  return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *task, pid_t old_pid, struct linux_binprm *bprm) {
  __u64 cgid = task_cgroup_id(task);
  __u64 *group = bpf_map_lookup_elem(&tracked, &cgid);
  if (!group) return 0;
  __u64 g = *group;
  /* A process can be here uncounted if it raced the seeding at track(). */
  count_live(task->tgid, cgid);
  struct TandemBpfCounters *c = bpf_map_lookup_elem(&counters, &g);
  if (c) c->execs++;
  emit(kTandemEventExec, task, cgid, g, -1);
  return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *task) {
  /* Fires per thread; the process ends with its last thread, the one that
   * brought signal->live to 0 (do_exit decrements it before this point). */
  if (task->signal->live.counter != 0) return 0;
  __u32 exiting = task->tgid;
  bpf_map_delete_elem(&lineage, &exiting); /* wherever it ended, it leaves its lineage */
  /* Processes are counted live only in tracked cgroups (untrack() drops the
   * entries of its cgroup's processes), so an untracked one ends here. */
  __u64 cgid = task_cgroup_id(task);
  __u64 *group = bpf_map_lookup_elem(&tracked, &cgid);
  if (!group) return 0;
  __u64 g = *group;
  uncount_live(task->tgid);
  struct TandemBpfCounters *c = bpf_map_lookup_elem(&counters, &g);
  if (c) c->exits++;
  /* What wait() will report (wait_task_zombie). */
  __s32 code = (task->signal->flags & SIGNAL_GROUP_EXIT) ? task->signal->group_exit_code : task->exit_code;
  emit(kTandemEventExit, task, cgid, g, code);
  return 0;
}

/* A write to cgroup.procs (or cgroup.threads) moved `task` (the leader when
 * `threadgroup`) into `dst`; this fires after the move. */
SEC("tp_btf/cgroup_attach_task")
int BPF_PROG(on_attach, struct cgroup *dst, const char *path, struct task_struct *task, bool threadgroup) {
  /* Moves within a v1 hierarchy leave the v2 cgroup as it is. */
  if (task->cgroups->dfl_cgrp != dst) return 0;
  __u64 cgid = dst->kn->id;
  __u64 *group = bpf_map_lookup_elem(&tracked, &cgid);
  if (group) start_charging(task); /* the other threads: at their first switch-out */
  if (task->pid != task->tgid) return 0;
  __u32 tgid = task->tgid;
  if (group) bpf_map_update_elem(&lineage, &tgid, group, BPF_ANY); /* joined after the fork */
  struct TandemBpfProc *proc = bpf_map_lookup_elem(&procs, &tgid);
  if (proc && proc->cgroup_id == cgid) return 0;
  uncount_live(tgid);
  if (group) count_live(tgid, cgid);
  return 0;
}

static __always_inline void mark_runnable(struct task_struct *task) {
  if (!may_have_storage(task)) return;
  struct TaskState *st = bpf_task_storage_get(&task_state, task, 0, 0);
  if (st) st->enqueued_ns = bpf_ktime_get_ns();
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(on_wakeup, struct task_struct *task) {
  mark_runnable(task);
  return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(on_wakeup_new, struct task_struct *task) {
  mark_runnable(task);
  return 0;
}

static __always_inline void switch_out(bool preempt, struct task_struct *prev, __u64 now) {
  __u64 cgid = task_cgroup_id(prev);
  __u64 *group = bpf_map_lookup_elem(&tracked, &cgid);
  if (!group) {
    /* Left tracking: drop its state, so its later switches stop here. */
    if (may_have_storage(prev)) bpf_task_storage_delete(&task_state, prev);
    return;
  }
  __u64 g = *group;
  struct TaskState *st = bpf_task_storage_get(&task_state, prev, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
  if (!st) {
    struct TandemBpfHealth *h = health_slot();
    if (h) h->storage_failed++;
    return;
  }
  /* The scheduler has updated prev's runtime by now (put_prev_task or the
   * dequeue of a blocking task ran update_curr). */
  __u64 sum = prev->se.sum_exec_runtime;
  __u64 delta;
  if (st->baseline) {
    delta = sum - st->last_runtime;
  } else {
    /* First sight of a task that was in the cgroup before it was tracked:
     * charge this slice (prev_sum_exec_runtime is its start, for the fair
     * class) and everything from here on. */
    delta = sum - prev->se.prev_sum_exec_runtime;
    st->baseline = 1;
  }
  st->last_runtime = sum;
  /* Preempted (or yielding) tasks stay on the run queue: their wait starts now. */
  st->enqueued_ns = (preempt || task_run_state(prev) == TASK_RUNNING) ? now : 0;
  struct TandemBpfCounters *c = bpf_map_lookup_elem(&counters, &g);
  if (c && (__s64)delta > 0) c->on_cpu_ns += delta;
}

static __always_inline void switch_in(struct task_struct *next, __u64 now) {
  if (!may_have_storage(next)) return;
  struct TaskState *st = bpf_task_storage_get(&task_state, next, 0, 0);
  if (!st || st->enqueued_ns == 0) return;
  __u64 delay = now - st->enqueued_ns;
  st->enqueued_ns = 0;
  if ((__s64)delay < 0) return;
  __u64 cgid = task_cgroup_id(next);
  __u64 *group = bpf_map_lookup_elem(&tracked, &cgid);
  if (!group) return;
  __u64 g = *group;
  struct TandemBpfCounters *c = bpf_map_lookup_elem(&counters, &g);
  if (!c) return;
  c->runq_delay_ns += delay;
  c->runq_waits++;
  __u32 b = runq_bucket(delay);
  if (b < TANDEM_RUNQ_BUCKETS) c->runq_hist[b]++;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next) {
  __u64 now = bpf_ktime_get_ns();
  /* pid 0 is the idle task: never in a tracked cgroup. */
  if (prev->pid != 0) switch_out(preempt, prev, now);
  if (next->pid != 0) switch_in(next, now);
  return 0;
}
