// cpu/spawn.h: starting a tool process inside its cgroups, and waiting for it.
//
// The parent side builds a ChildPlan (every pointer and string the child will
// use) before the clone; run_child() is the only code that runs in the child
// and makes async-signal-safe system calls only. The child reports a failed
// step as a fixed-size ChildReport over an O_CLOEXEC pipe, which exec closes
// on success, so one read() tells the parent which of the two happened.
#include "cpu/spawn.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string_view>

namespace tandem::cpu {
namespace {

// struct clone_args of <linux/sched.h>, spelled out so that the code depends
// neither on the installed uapi headers' version nor on their CLONE_* macros
// (which clash with glibc's <sched.h>). Every field is an __aligned_u64.
struct CloneArgs {
  std::uint64_t flags = 0;
  std::uint64_t pidfd = 0;
  std::uint64_t child_tid = 0;
  std::uint64_t parent_tid = 0;
  std::uint64_t exit_signal = 0;
  std::uint64_t stack = 0;
  std::uint64_t stack_size = 0;
  std::uint64_t tls = 0;
  std::uint64_t set_tid = 0;
  std::uint64_t set_tid_size = 0;
  std::uint64_t cgroup = 0;
};
constexpr std::size_t kCloneArgsSizeVer0 = 64;  // CLONE_ARGS_SIZE_VER0 (5.3): up to `tls`
constexpr std::size_t kCloneArgsSizeVer2 = 88;  // CLONE_ARGS_SIZE_VER2 (5.7): up to `cgroup`
static_assert(sizeof(CloneArgs) == kCloneArgsSizeVer2);
constexpr std::uint64_t kClonePidfd = 0x00001000;           // CLONE_PIDFD
constexpr std::uint64_t kCloneIntoCgroup = 0x200000000ULL;  // CLONE_INTO_CGROUP

// The kernel's struct rusage (timevals of __kernel_long_t, which is `long` on
// every ABI tandem builds for), as the raw waitid() fills it.
struct KernelTimeval {
  long sec;
  long usec;
};
struct KernelRusage {
  KernelTimeval utime;
  KernelTimeval stime;
  long maxrss;  // KiB
  long rest[13];
};

// The kernel's sigset_t is _NSIG bits; glibc's NSIG is _NSIG + 1.
constexpr std::size_t kKernelSigsetBytes = (NSIG - 1) / 8;

// The step of the child that failed, sent back with its errno.
enum class Step : std::int32_t { kSetsid, kJoinV2, kJoinV1, kChdir, kStdio, kKeepFd, kExec, kCgroupNs, kIds };
struct ChildReport {
  Step step;
  std::int32_t index;  // which v1 dir, stdio stream, keep fd or exec candidate (-1: none in particular)
  std::int32_t error;  // errno
};

// Everything the child needs, prepared by the parent before the clone. The
// pointers stay valid in the child: its memory is a copy of the parent's.
struct ChildPlan {
  const char* const* argv = nullptr;        // null-terminated
  char* const* envp = nullptr;              // null-terminated
  std::span<const char* const> exec_paths;  // the candidates, tried in order
  const char* cwd = nullptr;                // nullptr: inherit
  bool new_session = false;
  int v2_join_dir = -1;  // ≥ 0: join through its cgroup.procs (the methods without CLONE_INTO_CGROUP)
  std::span<const int> v1_dirs;
  std::array<int, 3> stdio{-1, -1, -1};
  bool close_other_fds = false;
  std::span<const int> keep_fds;
  int report_fd = -1;
  bool new_cgroup_ns = false;
  long uid = -1;  // -1: unchanged
  long gid = -1;
};

std::int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// ---- The child: async-signal-safe calls only, no allocation, no locks. ----

[[noreturn]] void child_fail(int report_fd, Step step, int index, int error) {
  ChildReport report{step, index, error};
  // Shorter than PIPE_BUF into an empty pipe: written whole or not at all. If
  // it is not written the parent sees EOF and wait_exit() reports 127.
  while (::write(report_fd, &report, sizeof report) < 0 && errno == EINTR) {
  }
  ::_exit(127);
}

// Writes "0" (the writing process) into <dir>/<file>; 0 or an errno.
int write_zero(int dir, const char* file) {
  int fd = ::openat(dir, file, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  ssize_t n = 0;
  do {
    n = ::write(fd, "0", 1);
  } while (n < 0 && errno == EINTR);
  int error = n == 1 ? 0 : (n < 0 ? errno : EIO);
  ::close(fd);
  return error;
}

// Joins the v2 cgroup at `dir` (the methods without CLONE_INTO_CGROUP).
int join_cgroup(int dir) { return write_zero(dir, "cgroup.procs"); }

// Joins the v1 cgroup at `dir`. The child is one thread (a clone without
// CLONE_THREAD), so moving that thread through `tasks` moves the whole
// process, and it is the cheaper write: the kernel takes
// cgroup_threadgroup_rwsem only for `pid || threadgroup`
// (cgroup_procs_write_start), so a thread writing "0" to `tasks` skips the
// lock whose write side waits for an RCU grace period when it has been idle.
// Through `cgroup.procs` that wait was the 8-14 ms first join of an isolated
// spawn on a hybrid host (docs/host.md). `cgroup.procs` is the fallback
// where `tasks` is missing.
int join_cgroup_v1(int dir) {
  const int e = write_zero(dir, "tasks");
  return e == ENOENT ? write_zero(dir, "cgroup.procs") : e;
}

// Default dispositions for every signal (SIG_IGN survives exec, and a handler
// of the parent must not run in the child), then an empty mask (the parent
// blocked everything around the clone). Raw system calls: glibc refuses to
// touch its internal signals, and a sanitizer's sigaction interceptor may
// decline to replace its own handlers. A zeroed kernel struct sigaction is
// SIG_DFL with no flags and an empty mask whatever the architecture's layout.
void reset_signals() {
  const std::array<unsigned long, 16> zero{};
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    ::syscall(SYS_rt_sigaction, sig, zero.data(), nullptr, kKernelSigsetBytes);
  }
  ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, zero.data(), nullptr, kKernelSigsetBytes);
}

[[noreturn]] void run_child(const ChildPlan& plan) {
  reset_signals();
  const int report = plan.report_fd;
  if (plan.new_session && ::setsid() < 0) child_fail(report, Step::kSetsid, -1, errno);
  if (plan.v2_join_dir >= 0) {
    if (int e = join_cgroup(plan.v2_join_dir); e != 0) child_fail(report, Step::kJoinV2, -1, e);
  }
  for (std::size_t i = 0; i < plan.v1_dirs.size(); ++i) {
    if (int e = join_cgroup_v1(plan.v1_dirs[i]); e != 0) child_fail(report, Step::kJoinV1, static_cast<int>(i), e);
  }
  // The namespace's root is the cgroup the child is in now: its own.
  if (plan.new_cgroup_ns && ::syscall(SYS_unshare, CLONE_NEWCGROUP) != 0) {
    child_fail(report, Step::kCgroupNs, -1, errno);
  }
  if (plan.cwd != nullptr && ::chdir(plan.cwd) < 0) child_fail(report, Step::kChdir, -1, errno);

  // stdio: first move every source in 0..2 that is not its own target out of
  // the way, so that no dup2() overwrites a source a later one still needs.
  std::array<int, 3> stdio = plan.stdio;
  for (int i = 0; i < 3; ++i) {
    int src = stdio[i];
    if (src >= 0 && src < 3 && src != i) {
      stdio[i] = ::fcntl(src, F_DUPFD_CLOEXEC, 3);
      if (stdio[i] < 0) child_fail(report, Step::kStdio, i, errno);
    }
  }
  for (int i = 0; i < 3; ++i) {
    int src = stdio[i];
    if (src < 0) continue;
    // dup2() onto itself keeps FD_CLOEXEC, so clear it instead.
    int r = src == i ? ::fcntl(i, F_SETFD, 0) : ::dup2(src, i);
    if (r < 0) child_fail(report, Step::kStdio, i, errno);
  }

  // CLOSE_RANGE_CLOEXEC rather than closing: the report pipe must survive
  // until exec. Before 5.11 the call fails and fds stay as they are.
  if (plan.close_other_fds) ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  for (std::size_t i = 0; i < plan.keep_fds.size(); ++i) {
    if (::fcntl(plan.keep_fds[i], F_SETFD, 0) < 0) child_fail(report, Step::kKeepFd, static_cast<int>(i), errno);
  }

  // The ids last: everything above may need the runner's privilege.
  if (plan.gid >= 0 || plan.uid >= 0) {
    if (::syscall(SYS_setgroups, 0, nullptr) != 0) child_fail(report, Step::kIds, 0, errno);
    if (plan.gid >= 0 && ::syscall(SYS_setresgid, plan.gid, plan.gid, plan.gid) != 0) {
      child_fail(report, Step::kIds, 1, errno);
    }
    if (plan.uid >= 0 && ::syscall(SYS_setresuid, plan.uid, plan.uid, plan.uid) != 0) {
      child_fail(report, Step::kIds, 2, errno);
    }
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) child_fail(report, Step::kIds, 3, errno);
  }

  // execvpe's rules: a candidate that does not exist (or whose directory is
  // gone or unreachable) moves on, so does EACCES but it is remembered;
  // anything else is final.
  int eacces_index = -1;
  int last_error = ENOENT;
  for (std::size_t i = 0; i < plan.exec_paths.size(); ++i) {
    ::execve(plan.exec_paths[i], const_cast<char* const*>(plan.argv), plan.envp);
    last_error = errno;
    switch (last_error) {
      case EACCES:
        if (eacces_index < 0) eacces_index = static_cast<int>(i);
        break;
      case ENOENT:
      case ENOTDIR:
      case ESTALE:
      case ENODEV:
      case ETIMEDOUT:
        break;
      default:
        child_fail(report, Step::kExec, static_cast<int>(i), last_error);
    }
  }
  if (eacces_index >= 0) child_fail(report, Step::kExec, eacces_index, EACCES);
  child_fail(report, Step::kExec, -1, last_error);
}

// ---- The parent. ----

// What to add to an error placing a process into a cgroup.
std::string_view placement_hint(int error, bool v2) {
  switch (error) {
    case EACCES:
    case EPERM:
      return " (needs write access to cgroup.procs of the cgroup and of the common ancestor with the runner's "
             "cgroup: the runner must be root or inside the delegated subtree)";
    case EBUSY:
      return v2 ? " (the cgroup has controllers in cgroup.subtree_control; processes may only join leaves)" : "";
    case ENODEV:
      return " (the cgroup has been removed)";
    case ENOENT:
      return " (no cgroup.procs there: not a cgroup directory)";
    case EBADF:
      return v2 ? " (not a cgroup2 directory fd)" : "";
    default:
      return "";
  }
}

bool has_nul(std::string_view s) { return s.find('\0') != std::string_view::npos; }

// The PATH the command's lookup uses: from `env` if given, else from environ.
std::string search_path(const std::vector<std::string>& env, bool inherit) {
  constexpr std::string_view kKey = "PATH=";
  if (!env.empty() || !inherit) {
    for (const auto& kv : env) {
      if (kv.starts_with(kKey)) return kv.substr(kKey.size());
    }
  } else if (const char* p = std::getenv("PATH"); p != nullptr) {  // NOLINT(concurrency-mt-unsafe)
    return p;
  }
  return "/bin:/usr/bin";  // glibc's execvp default (confstr(_CS_PATH))
}

// execvpe's candidates for `name`: itself if it has a '/', else <dir>/<name>
// for each PATH entry (an empty entry is the working directory).
std::vector<std::string> exec_candidates(const std::string& name, const std::string& path) {
  if (name.find('/') != std::string::npos) return {name};
  std::vector<std::string> out;
  std::string_view rest = path;
  for (;;) {
    std::size_t colon = rest.find(':');
    std::string_view dir = rest.substr(0, colon);
    out.push_back(dir.empty() ? name : fmt::format("{}/{}", dir, name));
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return out;
}

base::Result<void> validate_spec(const SpawnSpec& spec) {
  if (spec.argv.empty()) return base::make_error(EINVAL, "bad spawn spec: empty argv");
  if (spec.argv[0].empty()) return base::make_error(EINVAL, "bad spawn spec: empty argv[0]");
  for (std::size_t i = 0; i < spec.argv.size(); ++i) {
    if (has_nul(spec.argv[i]))
      return base::make_error(EINVAL, fmt::format("bad spawn spec: argv[{}] contains a NUL byte", i));
  }
  for (std::size_t i = 0; i < spec.env.size(); ++i) {
    if (has_nul(spec.env[i]))
      return base::make_error(EINVAL, fmt::format("bad spawn spec: env[{}] contains a NUL byte", i));
  }
  if (has_nul(spec.cwd)) return base::make_error(EINVAL, "bad spawn spec: cwd contains a NUL byte");
  if (has_nul(spec.bwrap)) return base::make_error(EINVAL, "bad spawn spec: bwrap contains a NUL byte");
  if (spec.bwrap.empty() && !spec.bwrap_args.empty()) {
    return base::make_error(EINVAL, "bad spawn spec: bwrap_args given without bwrap");
  }
  for (std::size_t i = 0; i < spec.bwrap_args.size(); ++i) {
    if (has_nul(spec.bwrap_args[i])) {
      return base::make_error(EINVAL, fmt::format("bad spawn spec: bwrap_args[{}] contains a NUL byte", i));
    }
  }
  for (int fd : spec.keep_fds) {
    if (fd < 3) return base::make_error(EINVAL, fmt::format("bad spawn spec: keep_fds holds {} (must be ≥ 3)", fd));
  }
  return {};
}

// Reaps a child that is known to be exiting (or was just killed).
void reap(int pidfd) {
  siginfo_t info{};
  while (::waitid(P_PIDFD, static_cast<id_t>(pidfd), &info, WEXITED) < 0 && errno == EINTR) {
  }
}

// What a ChildReport says, as an error.
std::unexpected<base::Error> report_error(const ChildReport& r, const SpawnSpec& spec, const ChildPlan& plan,
                                          bool searched, const std::string& path) {
  const std::string& name = spec.bwrap.empty() ? spec.argv[0] : spec.bwrap;
  switch (r.step) {
    case Step::kSetsid:
      return base::make_error(r.error, "setsid");
    case Step::kJoinV2:
      return base::make_error(r.error, fmt::format("join v2 cgroup{}", placement_hint(r.error, true)));
    case Step::kJoinV1:
      return base::make_error(r.error, fmt::format("join v1 cgroup {}{}", r.index, placement_hint(r.error, false)));
    case Step::kChdir:
      return base::make_error(r.error, fmt::format("chdir {}", spec.cwd));
    case Step::kStdio:
      return base::make_error(r.error, fmt::format("set up fd {} (stdio)", r.index));
    case Step::kCgroupNs:
      return base::make_error(r.error, fmt::format("enter a cgroup namespace of its own{}",
                                                   r.error == EPERM ? " (needs CAP_SYS_ADMIN)" : ""));
    case Step::kIds: {
      static constexpr const char* kWhat[] = {"drop supplementary groups", "set gid", "set uid", "set no_new_privs"};
      const bool known = r.index >= 0 && r.index < 4;
      return base::make_error(r.error, fmt::format("{} to {}:{}{}", known ? kWhat[r.index] : "change ids",
                                                   spec.uid ? static_cast<long>(*spec.uid) : -1L,
                                                   spec.gid ? static_cast<long>(*spec.gid) : -1L,
                                                   r.error == EPERM ? " (needs CAP_SETUID and CAP_SETGID)" : ""));
    }
    case Step::kKeepFd: {
      bool known = r.index >= 0 && static_cast<std::size_t>(r.index) < spec.keep_fds.size();
      return base::make_error(r.error, fmt::format("keep fd {}", known ? spec.keep_fds[r.index] : -1));
    }
    case Step::kExec: {
      std::string what = r.index >= 0 && static_cast<std::size_t>(r.index) < plan.exec_paths.size()
                             ? std::string(plan.exec_paths[r.index])
                             : name;
      if (searched) return base::make_error(r.error, fmt::format("execve {} (searched PATH={})", what, path));
      return base::make_error(r.error, fmt::format("execve {}", what));
    }
  }
  return base::make_error(EIO, "the spawned child reported an unknown step");
}

}  // namespace

base::Result<Spawned> spawn(const SpawnSpec& spec, const CgroupDirs& placement) {
  if (auto ok = validate_spec(spec); !ok) return base::propagate(std::move(ok.error()));

  // argv: the command, or bwrap <bwrap_args...> -- <command>. The pointers
  // point into `spec`, which outlives the clone.
  std::vector<const char*> argv;
  if (!spec.bwrap.empty()) {
    argv.push_back(spec.bwrap.c_str());
    for (const auto& a : spec.bwrap_args) argv.push_back(a.c_str());
    argv.push_back("--");
  }
  for (const auto& a : spec.argv) argv.push_back(a.c_str());
  argv.push_back(nullptr);

  std::vector<char*> env_storage;
  char* const* envp = environ;
  if (!spec.env.empty() || !spec.inherit_env) {
    // execve() takes char* const*, but does not write through it.
    for (const auto& kv : spec.env) env_storage.push_back(const_cast<char*>(kv.c_str()));
    env_storage.push_back(nullptr);
    envp = env_storage.data();
  }

  const std::string& exec_name = spec.bwrap.empty() ? spec.argv[0] : spec.bwrap;
  const bool searched = exec_name.find('/') == std::string::npos;
  const std::string path = searched ? search_path(spec.env, spec.inherit_env) : std::string();
  const std::vector<std::string> candidates = exec_candidates(exec_name, path);
  std::vector<const char*> candidate_ptrs;
  candidate_ptrs.reserve(candidates.size());
  for (const auto& c : candidates) candidate_ptrs.push_back(c.c_str());

  std::array<int, 2> pipe_fds{};
  if (::pipe2(pipe_fds.data(), O_CLOEXEC) < 0) return base::errno_error("spawn: pipe2");
  base::UniqueFd report_rd(pipe_fds[0]);
  base::UniqueFd report_wr(pipe_fds[1]);
  if (report_wr.get() < 3) {
    // A caller with a closed stdio got the pipe there; the child's stdio
    // setup would overwrite it.
    int moved = ::fcntl(report_wr.get(), F_DUPFD_CLOEXEC, 3);
    if (moved < 0) return base::errno_error("spawn: move the report pipe above stdio");
    report_wr.reset(moved);
  }

  ChildPlan plan;
  plan.argv = argv.data();
  plan.envp = envp;
  plan.exec_paths = candidate_ptrs;
  plan.cwd = spec.cwd.empty() ? nullptr : spec.cwd.c_str();
  plan.new_session = spec.new_session;
  plan.v1_dirs = placement.v1_dirs;
  plan.stdio = {spec.stdin_fd, spec.stdout_fd, spec.stderr_fd};
  plan.close_other_fds = spec.close_other_fds;
  plan.keep_fds = spec.keep_fds;
  plan.report_fd = report_wr.get();
  plan.new_cgroup_ns = spec.new_cgroup_ns;
  plan.uid = spec.uid ? static_cast<long>(*spec.uid) : -1;
  plan.gid = spec.gid ? static_cast<long>(*spec.gid) : (spec.uid ? static_cast<long>(*spec.uid) : -1);

  SpawnMethod method = spec.method;
  if (placement.v2_dir < 0 && method == SpawnMethod::kClone3IntoCgroup) method = SpawnMethod::kClone3;

  // All signals blocked in this thread across the clone: the child must not
  // run one of our handlers before it has reset them (it unblocks after).
  sigset_t all;
  sigset_t old;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);

  Spawned out;
  out.started_ns = monotonic_ns();
  int pidfd = -1;
  pid_t pid = -1;
  int clone_error = 0;
  for (;;) {
    if (method == SpawnMethod::kFork) {
      plan.v2_join_dir = placement.v2_dir;
      pid = ::fork();
      if (pid == 0) run_child(plan);
      if (pid < 0) clone_error = errno;
      break;
    }
    CloneArgs args;
    args.flags = kClonePidfd;
    args.pidfd = reinterpret_cast<std::uintptr_t>(&pidfd);
    args.exit_signal = SIGCHLD;
    std::size_t size = kCloneArgsSizeVer0;
    plan.v2_join_dir = placement.v2_dir;
    if (method == SpawnMethod::kClone3IntoCgroup) {
      args.flags |= kCloneIntoCgroup;
      args.cgroup = static_cast<std::uint64_t>(placement.v2_dir);
      size = kCloneArgsSizeVer2;
      plan.v2_join_dir = -1;
    }
    long r = ::syscall(SYS_clone3, &args, size);
    if (r == 0) run_child(plan);
    if (r > 0) {
      pid = static_cast<pid_t>(r);
      break;
    }
    clone_error = errno;
    // Fall back only where the kernel lacks the feature (see spawn.h).
    if (clone_error == ENOSYS) {
      method = SpawnMethod::kFork;
      continue;
    }
    if (method == SpawnMethod::kClone3IntoCgroup && (clone_error == EINVAL || clone_error == E2BIG)) {
      method = SpawnMethod::kClone3;
      continue;
    }
    break;
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  report_wr.reset();  // the child's copy is the only one left; exec closes it

  if (pid < 0) {
    if (method == SpawnMethod::kFork) return base::make_error(clone_error, "fork");
    if (method == SpawnMethod::kClone3IntoCgroup) {
      return base::make_error(clone_error, fmt::format("clone3 into v2 cgroup{}", placement_hint(clone_error, true)));
    }
    return base::make_error(clone_error, "clone3");
  }
  if (method == SpawnMethod::kFork) {
    // Our unreaped child: its pid cannot be reused before we wait for it.
    pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) {
      auto error = base::errno_error("pidfd_open (Linux ≥ 5.3)");
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
      return error;
    }
  }
  out.pid = pid;
  out.pidfd.reset(pidfd);
  out.method = method;

  ChildReport report{};
  ssize_t n = 0;
  do {
    n = ::read(report_rd.get(), &report, sizeof report);
  } while (n < 0 && errno == EINTR);
  if (n == 0) return out;  // exec closed the pipe
  if (n == static_cast<ssize_t>(sizeof report)) {
    reap(out.pidfd.get());
    return report_error(report, spec, plan, searched, path);
  }
  auto error = n < 0 ? base::errno_error("read the spawned child's report")
                     : base::make_error(EIO, "short report from the spawned child");
  ::syscall(SYS_pidfd_send_signal, out.pidfd.get(), SIGKILL, nullptr, 0);
  reap(out.pidfd.get());
  return error;
}

base::Result<ExitStatus> wait_exit(int pidfd, int timeout_ms) {
  const std::int64_t deadline = timeout_ms > 0 ? monotonic_ns() + std::int64_t{timeout_ms} * 1'000'000 : 0;
  for (;;) {
    int poll_ms = timeout_ms;
    if (timeout_ms > 0) {
      std::int64_t left = deadline - monotonic_ns();
      poll_ms = left <= 0 ? 0 : static_cast<int>((left + 999'999) / 1'000'000);
    }
    pollfd p{pidfd, POLLIN, 0};
    int r = ::poll(&p, 1, poll_ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return base::errno_error("wait_exit: poll pidfd");
    }
    if (r > 0) {
      if ((p.revents & POLLNVAL) != 0) return base::make_error(EBADF, "wait_exit: poll pidfd");
      siginfo_t info{};
      KernelRusage ru{};
      // The raw system call: glibc's waitid() has no rusage argument.
      if (::syscall(SYS_waitid, P_PIDFD, pidfd, &info, WEXITED | WNOHANG, &ru) < 0) {
        if (errno == EINTR) continue;
        return base::errno_error("wait_exit: waitid");
      }
      if (info.si_pid != 0) {
        ExitStatus st;
        st.ended_ns = monotonic_ns();
        st.exit_code = info.si_code == CLD_EXITED ? info.si_status : -info.si_status;
        auto to_ns = [](const KernelTimeval& tv) {
          return static_cast<std::uint64_t>(tv.sec) * 1'000'000'000 + static_cast<std::uint64_t>(tv.usec) * 1'000;
        };
        st.cpu_ns = to_ns(ru.utime) + to_ns(ru.stime);
        st.max_rss_bytes = static_cast<std::uint64_t>(ru.maxrss) * 1024;
        return st;
      }
      // Readable but nothing to reap yet: not possible for an exited child,
      // but harmless; wait again within the same deadline.
    }
    if (timeout_ms == 0 || (timeout_ms > 0 && monotonic_ns() >= deadline)) {
      return base::make_error(ETIMEDOUT, "wait_exit: the process has not exited");
    }
  }
}

bool may_create_cgroup_namespace() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  std::array<__user_cap_data_struct, 2> data{};
  if (::syscall(SYS_capget, &header, data.data()) != 0) return false;
  return (data[CAP_SYS_ADMIN / 32].effective & (1u << (CAP_SYS_ADMIN % 32))) != 0;
}

base::Result<void> send_signal(int pidfd, int sig) {
  if (::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0) < 0) {
    return base::errno_error(fmt::format("send signal {} through pidfd", sig));
  }
  return {};
}

}  // namespace tandem::cpu
