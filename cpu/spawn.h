// Starting a tool process directly inside its cgroups, and waiting for it
// (issue 6, docs/architecture.md "Host plane").
//
// The daemon creates a tool call's cgroup(s) and hands the runner directory
// fds; spawn() starts the command so that it never runs outside them:
//   - cgroup v2: clone3(CLONE_PIDFD | CLONE_INTO_CGROUP) puts the child into
//     `v2_dir` atomically, before its first instruction.
//   - cgroup v1: the child writes "0" into <dir>/tasks (else cgroup.procs) of
//     every v1 directory before exec, so the command's first instruction
//     already runs there (v1 has no clone-time placement). `tasks` moves only
//     the writing thread, which is the whole child, and spares the global
//     cgroup_threadgroup_rwsem that a cgroup.procs write takes (spawn.cc).
// Fallbacks, used only when the kernel lacks a feature (never to paper over a
// refusal): a kernel without CLONE_INTO_CGROUP (before 5.7: clone3 answers
// EINVAL for the unknown flag, or E2BIG for the longer struct) gets plain
// clone3(CLONE_PIDFD) and the child joins `v2_dir` through its cgroup.procs
// before exec; a kernel or seccomp filter without clone3 (ENOSYS, as container
// runtimes answer) gets fork() + pidfd_open() and the same join. Refusals of
// the placement itself (EACCES/EPERM, EBUSY, ENODEV, EOPNOTSUPP, EAGAIN from
// pids.max) are reported, not retried: writing cgroup.procs is subject to the
// same checks, so a fallback could only hide the cause.
//
// Permissions: placing a process into a cgroup (either way) needs write access
// to the target's cgroup.procs and to the cgroup.procs of the common ancestor
// of the runner's cgroup and the target (the delegation rules of
// cgroup-v2.rst). The runner must therefore be root or live inside the
// delegated subtree; EACCES/EPERM errors say so.
//
// The child between clone and exec is a copy of a possibly multi-threaded
// process, so it only makes async-signal-safe system calls on data prepared
// before the clone (argv/envp arrays, the PATH candidates, the cwd): it resets
// signal dispositions and the mask, calls setsid(), joins the cgroups,
// enters a cgroup namespace of its own if asked, chdir()s, arranges stdio
// and fds, drops to the asked uid/gid (raw system calls: glibc's setxid
// would try to reach threads that do not exist in the child), and execs. A failure in any step is sent
// back over a CLOEXEC pipe (step + errno), so spawn() reports it synchronously
// and reaps the child; success is the pipe closing at exec.
//
// The caller must leave the child to wait_exit(): a SIGCHLD disposition of
// SIG_IGN or a waitpid(-1) elsewhere in the process would reap it first.
// Linked into libtandem.so: no globals with constructors, no logging.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "base/unique_fd.h"
#include "cpu/cgroup_dirs.h"

namespace tandem::cpu {

// How the child is created, best first. spawn() moves down the list when the
// kernel lacks the preferred one; Spawned::method says what was used.
enum class SpawnMethod : std::uint8_t {
  kClone3IntoCgroup,  // clone3(CLONE_PIDFD | CLONE_INTO_CGROUP): in v2_dir from its first instruction
  kClone3,            // clone3(CLONE_PIDFD); the child joins v2_dir through cgroup.procs before exec
  kFork,              // fork() + pidfd_open(); the child joins v2_dir through cgroup.procs before exec
};

struct SpawnSpec {
  // argv[0] is resolved via the PATH of `env` (of environ when `env` is empty;
  // "/bin:/usr/bin" without one) if it has no '/', with execvpe's rules: each
  // candidate is tried in order, ENOENT/ENOTDIR/EACCES move on, EACCES is
  // reported if nothing ran. Unlike execvpe there is no /bin/sh retry on
  // ENOEXEC: a script needs its "#!" line.
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "K=V"; empty → inherit environ
  bool inherit_env = true;       // with an empty `env`: false runs the command with no environment at all
  std::string cwd;               // empty → inherit
  // Non-empty: the path of bubblewrap; the command runs as
  // `bwrap <bwrap_args...> -- argv...` (bwrap then resolves argv[0] itself,
  // inside its sandbox). The placement applies to bwrap and so to everything
  // it starts.
  std::string bwrap;
  std::vector<std::string> bwrap_args;
  bool new_session = true;  // setsid() in the child so a terminal's signals don't reach it
  // The command's stdio; not owned; -1 inherits the caller's.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  // With close_other_fds, every fd ≥ 3 is closed at exec (close_range with
  // CLOSE_RANGE_CLOEXEC, Linux ≥ 5.11; older kernels leave fds as they are)
  // except those in keep_fds, which the command inherits (not owned, ≥ 3;
  // e.g. a bwrap --args/--sync-fd).
  bool close_other_fds = true;
  std::vector<int> keep_fds;
  SpawnMethod method = SpawnMethod::kClone3IntoCgroup;  // the preferred method
  // After joining its cgroups the child enters a cgroup namespace of its
  // own (unshare(CLONE_NEWCGROUP)): its cgroup is then its root in
  // /proc/self/cgroup and in any cgroup2 mount it makes, and it cannot move
  // to a cgroup outside it. Needs CAP_SYS_ADMIN (may_create_cgroup_namespace).
  bool new_cgroup_ns = false;
  // Run as these ids: after everything that needs privilege (cgroup joins,
  // the namespace, chdir, stdio), the child drops its supplementary groups
  // and sets real, effective and saved gid, then uid; with either set, it
  // also sets no_new_privs (no setuid binary gives privilege back). Needs
  // CAP_SETGID / CAP_SETUID. A gid without a uid changes only the group.
  std::optional<uid_t> uid;
  std::optional<gid_t> gid;
};

// Whether this process may give a child a cgroup namespace of its own
// (CAP_SYS_ADMIN in its user namespace's effective set).
bool may_create_cgroup_namespace();

struct Spawned {
  pid_t pid = -1;
  base::UniqueFd pidfd;                                 // O_CLOEXEC; readable (POLLIN) once the process has exited
  std::int64_t started_ns = 0;                          // CLOCK_MONOTONIC, just before the clone
  SpawnMethod method = SpawnMethod::kClone3IntoCgroup;  // how it was created (kClone3 when there was no v2_dir)
};

// Starts the process inside `placement` (its v2 directory and its v1 ones;
// the fds are borrowed and must stay open for the duration of the call; an
// empty CgroupDirs: where the caller is) and returns once it has exec'd.
// Errors (exec failure, cgroup join failure, bad spec) are reported
// synchronously with the child's errno and the step that failed
// ("join v1 cgroup 2: EACCES", "execve /no/such: ENOENT"); the child is reaped
// in that case. EINVAL for an empty argv or argv[0], a string with a NUL byte,
// bwrap_args without bwrap, or a keep_fd below 3.
// Thread-safety: safe to call from several threads at once (the signal mask is
// changed only for the calling thread, around the clone), though a child
// cloned by one call holds the other's report pipe until it execs, so calls
// may wait for each other's exec; PATH is read with getenv() when `env` is
// empty (not safe against a concurrent setenv()). A child that blocks before
// exec (e.g. placed into a frozen cgroup) blocks the call.
base::Result<Spawned> spawn(const SpawnSpec& spec, const CgroupDirs& placement);

struct ExitStatus {
  std::int32_t exit_code = 0;  // ≥ 0 exit status, < 0 minus the signal (the waitpid convention of tandem_tool_end)
  std::int64_t ended_ns = 0;   // CLOCK_MONOTONIC when the wait saw the exit
  std::uint64_t cpu_ns = 0;    // user+system of the process and its waited-for children
  std::uint64_t max_rss_bytes = 0;  // peak RSS of the process or of one of its waited-for children
};

// Waits for the process behind `pidfd`, which must be a child of this process
// (poll on the pidfd, then waitid(P_PIDFD, ..., WEXITED) with the raw
// syscall's rusage argument). timeout_ms < 0: forever; 0: don't block.
// ETIMEDOUT when it has not exited in time (nothing is reaped). EINTR is
// retried. ECHILD once it has been reaped (by this or anything else).
// Thread-safety: one waiter per pidfd.
base::Result<ExitStatus> wait_exit(int pidfd, int timeout_ms);

// Sends `sig` to the process behind `pidfd` (pidfd_send_signal: no pid-reuse
// race). ESRCH once it has been reaped.
base::Result<void> send_signal(int pidfd, int sig);

}  // namespace tandem::cpu
