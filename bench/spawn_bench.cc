// spawn_bench: how long a tool takes to start, and to come back, when a
// runner launches it through tandem — against a plain fork/exec (issue 6:
// "Tool spawn latency through tandem vs a plain fork/exec").
//
// Variants. Each round spawns /bin/true once per variant, in an order that
// rotates every round, so drift and machine noise hit every variant alike:
//   plain           fork() + execve() + waitpid(): the floor.
//   posix_spawn     glibc's posix_spawn() (clone(CLONE_VM|CLONE_VFORK), no
//                   copy of the parent's page tables) + waitpid(): a reference.
//   cpu::spawn      cpu::spawn() (cpu/spawn.h, what libtandem runs) with no
//   (no cgroup)     placement: clone3(CLONE_PIDFD), the child's signal reset,
//                   setsid(), close_range() and the report pipe, no cgroups.
//   cpu::spawn      the same into one pre-made cgroup beneath this process's
//                   own in every hierarchy (CgroupManager, subtree
//                   tandem-spawnbench-<pid>, cgroup tools/s/1):
//                   clone3(CLONE_INTO_CGROUP) for v2, and one cgroup.procs
//                   write in the child per v1 hierarchy before exec. The
//                   placement mechanism without the daemon.
//   tandem          tandem_tool_spawn() + tandem_tool_wait() through a real
//                   tandemd: ToolPrepare on the socket → tandemd creates the
//                   call's cgroup in every hierarchy and applies its limits →
//                   ToolPlacement with the directory fds → cpu::spawn into
//                   them → TOOL_START; after the exit, usage read from the
//                   cgroup and TOOL_END (on which tandemd removes the cgroup).
//
// Two numbers per spawn, both timed from just before the spawn call
// (CLOCK_MONOTONIC):
//   start → exec    until the child has exec'd. The parent makes an O_CLOEXEC
//                   pipe before the spawn and closes its write end right
//                   after; the child's copy closes at exec, so EOF on the
//                   read end means exec done. For fork() this waits for the
//                   child; posix_spawn, cpu::spawn and tandem_tool_spawn only
//                   return once the child has exec'd, so for them it is the
//                   call plus one read().
//   start → reaped  until /bin/true has exited and been reaped: waitpid(),
//                   cpu::wait_exit(), or tandem_tool_wait() returning (which
//                   also reads the cgroup's usage and sends TOOL_END).
// The tandem handle is driven (tandem_poll) between spawns, outside the
// timed spans, as a runner's event loop would.
//
// Quiet gap. Every spawn is preceded by --gap-ms (50) of sleep, outside
// the timed spans. Moving a task into a cgroup takes the kernel's
// cgroup_threadgroup_rwsem for writing; while that lock's rcu_sync is idle,
// the writer waits for an RCU grace period (milliseconds), and for about one
// grace period after a writer is done the next one goes through quickly. A
// child joining its v1 hierarchies (a write to cgroup.procs each) therefore
// pays a grace period at its first write unless another migration happened
// a moment before (strace: the first write ≈ 8 ms, the other three ≈ 10 µs).
// Back to back, one variant would warm that lock for the next (in the rotation
// tandem follows cpu::spawn-into-a-cgroup), so each variant's numbers would
// depend on its neighbour. The gap makes every spawn an isolated one, as tool
// calls separated by model rounds are; --gap-ms 0 measures a burst instead.
//
// Settling. tandemd removes a call's cgroup when it handles the TOOL_END
// record, which may be at its next tick or inside the next ToolPrepare. By
// default, after each tandem spawn and outside the timed spans, the bench
// waits until the call's cgroup is gone in every hierarchy (polling the
// session's folder every 50 µs), so that removal never lands inside another
// spawn. The time from start until the cgroup was seen gone is printed as an
// informational line. --no-settle goes on at once (removals may then fall
// inside later spawns).
//
// Failures: any spawn error, a /bin/true that does not exit 0, a tandem call
// that ran without a cgroup (libtandem's fail-open), a lost connection, a
// tandemd that does not exit 0 on SIGTERM: exit 1. The numbers are never
// checked (benchmarks are not timed tests). `--quick` (50 spawns per
// variant) is the ctest smoke run.
//
// Privileges: the two cgroup variants need root. Without it the bench says
// so, runs the other three and exits 0.
//
// Hygiene: tandemd runs in a fresh temporary runtime dir with its own cgroup
// subtree, tandem-spawnbench-<pid>-d, dies with the bench
// (PR_SET_PDEATHSIG), and is stopped with SIGTERM at the end or SIGKILLed on
// a failure; a subtree it leaves behind is killed and removed. The bench's
// own subtree is killed and removed on every exit path (SIGINT, SIGTERM and
// SIGHUP included; not SIGKILL). Caveat of CgroupManager on a pure-v2 host
// whose own cgroup holds processes (a login shell's scope): to enable
// controllers it moves those processes into a "daemon" leaf beside the
// subtree, and that leaf stays. On a hybrid host (v2 without controllers, as
// here) nothing is moved.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/result.h"
#include "base/unique_fd.h"
#include "cpu/cgroup.h"
#include "cpu/spawn.h"
#include "tandem/tandem.h"

namespace tandem::bench {
namespace {

using base::Result;

constexpr const char* kProgram = "/bin/true";
constexpr const char* kToolName = "true";
constexpr const char* kSessionName = "spawn-bench";
constexpr int kDefaultSpawns = 2000;
constexpr int kDefaultWarmup = 50;
constexpr int kQuickSpawns = 50;
constexpr int kQuickWarmup = 5;
// Quiet time before each spawn: longer than an RCU grace period here, so
// that no spawn finds the cgroup migration lock warm from the one before.
constexpr int kDefaultGapMs = 50;
// p99 is printed from this many samples on (≥ 10 above it).
constexpr std::size_t kMinForP99 = 1000;

constexpr auto kStartTimeout = std::chrono::seconds(5);
constexpr auto kStopTimeout = std::chrono::seconds(10);
constexpr auto kSettleTimeout = std::chrono::seconds(5);
constexpr std::int64_t kSettlePollNs = 50'000;
constexpr int kToolWaitMs = 10'000;
constexpr int kKillTimeoutMs = 2000;

std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void sleep_ns(std::int64_t ns) {
  if (ns <= 0) return;
  timespec ts{ns / 1'000'000'000, ns % 1'000'000'000};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// Set by SIGINT/SIGTERM/SIGHUP; the loops stop between spawns and unwind,
// so every cgroup and the daemon are cleaned up.
volatile sig_atomic_t g_interrupted = 0;

void on_stop_signal(int /*sig*/) { g_interrupted = 1; }

Result<void> check_interrupted() {
  if (g_interrupted != 0) return base::make_error(EINTR, "interrupted");
  return {};
}

// ---------------------------------------------------------------------------
// Command line

struct Options {
  int spawns = kDefaultSpawns;
  int warmup = kDefaultWarmup;
  bool settle = true;
  bool keep = false;
  int gap_ms = kDefaultGapMs;
  std::vector<std::string> only;  // variant keys; empty: all
};

// The variants' keys (--only), in table order.
constexpr std::array<std::string_view, 5> kVariantKeys = {"plain", "posix_spawn", "cpu_nocg", "cpu_cg", "tandem"};

void print_usage(std::FILE* to) {
  fmt::print(to,
             "usage: spawn_bench [flags]\n"
             "  --spawns N     timed spawns of /bin/true per variant (default {})\n"
             "  --warmup N     untimed spawns per variant first (default {})\n"
             "  --quick        {} spawns and {} warm-up per variant (the ctest smoke run)\n"
             "  --gap-ms N     quiet time before every spawn (default {}; 0: back to back, a burst)\n"
             "  --no-settle    don't wait for tandemd to remove each tandem call's cgroup before going on\n"
             "  --only K,...   run only these variants: plain, posix_spawn, cpu_nocg, cpu_cg, tandem\n"
             "  --keep         keep tandemd's runtime dir (config, tandemd.log) and print its path\n"
             "  --help         show this text\n"
             "Variants: plain fork+execve, posix_spawn, cpu::spawn without a cgroup; as root also\n"
             "cpu::spawn into a pre-made cgroup (cpu_cg) and the full path through a real tandemd (tandem).\n",
             kDefaultSpawns, kDefaultWarmup, kQuickSpawns, kQuickWarmup, kDefaultGapMs);
}

// Returns 0 to run, 1 when --help was printed, 2 on a usage error (printed).
int parse_args(int argc, char** argv, Options& o) {
  std::optional<int> spawns;
  std::optional<int> warmup;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto integer = [&](int lo, int hi, std::optional<int>& out) {
      if (i + 1 >= argc) {
        fmt::print(stderr, "spawn_bench: {} needs a value\n", arg);
        return false;
      }
      const char* v = argv[++i];
      char* end = nullptr;
      errno = 0;
      const long n = std::strtol(v, &end, 10);
      if (end == v || *end != '\0' || errno != 0 || n < lo || n > hi) {
        fmt::print(stderr, "spawn_bench: {} must be an integer in [{}, {}], got '{}'\n", arg, lo, hi, v);
        return false;
      }
      out = static_cast<int>(n);
      return true;
    };
    bool ok = true;
    if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      return 1;
    } else if (arg == "--spawns") {
      ok = integer(1, 1'000'000, spawns);
    } else if (arg == "--warmup") {
      ok = integer(0, 100'000, warmup);
    } else if (arg == "--gap-ms") {
      std::optional<int> g;
      ok = integer(0, 10'000, g);
      if (ok) o.gap_ms = *g;
    } else if (arg == "--only") {
      if (i + 1 >= argc) {
        fmt::print(stderr, "spawn_bench: --only needs a value\n");
        return 2;
      }
      std::stringstream list(argv[++i]);
      for (std::string key; std::getline(list, key, ',');) {
        if (std::ranges::find(kVariantKeys, key) == kVariantKeys.end()) {
          fmt::print(stderr, "spawn_bench: --only: unknown variant '{}'\n", key);
          return 2;
        }
        o.only.push_back(key);
      }
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--no-settle") {
      o.settle = false;
    } else if (arg == "--keep") {
      o.keep = true;
    } else {
      fmt::print(stderr, "spawn_bench: unknown argument '{}'\n", arg);
      print_usage(stderr);
      return 2;
    }
    if (!ok) return 2;
  }
  o.spawns = spawns.value_or(quick ? kQuickSpawns : kDefaultSpawns);
  o.warmup = warmup.value_or(quick ? kQuickWarmup : kDefaultWarmup);
  return 0;
}

// ---------------------------------------------------------------------------
// Resources

// A temporary directory, removed (recursively) at destruction unless kept.
class TempDir {
 public:
  explicit TempDir(bool keep) : keep_(keep) {
    std::string pattern = (std::filesystem::temp_directory_path() / "spawn_bench.XXXXXX").string();
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty() && !keep_) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool keep_;
};

// A subtree of cgroups beneath this process's own, in every hierarchy. Every
// process in it is killed and the whole subtree removed at destruction (or
// by cleanup(), which reports what failed).
class OwnedSubtree {
 public:
  static Result<std::unique_ptr<OwnedSubtree>> open(const std::string& subtree) {
    cpu::ManagerOptions options;
    options.subtree = subtree;
    auto m = cpu::CgroupManager::open(options);
    if (!m) return base::propagate(std::move(m.error()));
    return std::unique_ptr<OwnedSubtree>(new OwnedSubtree(std::move(*m)));
  }
  ~OwnedSubtree() {
    if (auto r = cleanup(); !r) fmt::print(stderr, "spawn_bench: {}\n", r.error().message());
  }
  OwnedSubtree(const OwnedSubtree&) = delete;
  OwnedSubtree& operator=(const OwnedSubtree&) = delete;

  cpu::CgroupManager& manager() { return *manager_; }

  Result<void> cleanup() {
    if (!manager_) return {};
    const std::string where = manager_->describe();
    auto k = manager_->kill(manager_->root(), kKillTimeoutMs);
    auto r = manager_->remove(manager_->root());
    manager_.reset();
    if (!k) return base::propagate(std::move(k.error()), fmt::format("kill the processes of {}", where));
    if (!r) return base::propagate(std::move(r.error()), fmt::format("remove {}", where));
    return {};
  }

 private:
  explicit OwnedSubtree(std::unique_ptr<cpu::CgroupManager> m) : manager_(std::move(m)) {}
  std::unique_ptr<cpu::CgroupManager> manager_;
};

// tandemd as a child. SIGKILLed and reaped at destruction if still running;
// dies with the bench in any case (PR_SET_PDEATHSIG).
class DaemonProcess {
 public:
  DaemonProcess() = default;
  ~DaemonProcess() { kill9(); }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  Result<void> start(const std::vector<std::string>& argv, const std::string& log_path) {
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return base::errno_error("fork");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(125);  // the bench died before prctl
      const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (log < 0) ::_exit(126);
      ::dup2(log, STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    pid_ = pid;
    return {};
  }

  // Whether it has exited (reaps it then).
  bool exited() {
    if (pid_ <= 0) return true;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      status_ = status;
      pid_ = -1;
      return true;
    }
    return false;
  }

  // SIGTERM and wait (SIGKILL after kStopTimeout). Returns the wait status.
  int stop() {
    if (pid_ <= 0) return status_;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + kStopTimeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (exited()) return status_;
      sleep_ns(2'000'000);
    }
    kill9();
    return status_;
  }

  void kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    status_ = status;
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
};

// Sweeps tandemd's subtree if it is still there once tandemd is gone (it
// removes the subtree itself on a clean stop; not when killed). Declared
// before the DaemonProcess so that it runs after the daemon is reaped.
class DaemonSubtreeSweeper {
 public:
  DaemonSubtreeSweeper() = default;
  ~DaemonSubtreeSweeper() { (void)sweep(); }
  DaemonSubtreeSweeper(const DaemonSubtreeSweeper&) = delete;
  DaemonSubtreeSweeper& operator=(const DaemonSubtreeSweeper&) = delete;

  // `paths`: the subtree's directory in each hierarchy.
  void arm(std::string subtree, std::vector<std::string> paths) {
    subtree_ = std::move(subtree);
    paths_ = std::move(paths);
  }

  // Whether any of the subtree's directories exists.
  bool left_behind() const {
    std::error_code ec;
    return std::ranges::any_of(paths_, [&](const std::string& p) { return std::filesystem::exists(p, ec); });
  }

  // Kills and removes what is left; returns whether something was.
  Result<bool> sweep() {
    if (subtree_.empty() || !left_behind()) return false;
    auto s = OwnedSubtree::open(subtree_);
    subtree_.clear();
    if (!s) return base::propagate(std::move(s.error()), "sweep tandemd's cgroup subtree");
    if (auto r = (*s)->cleanup(); !r) return base::propagate(std::move(r.error()), "sweep tandemd's cgroup subtree");
    return true;
  }

 private:
  std::string subtree_;
  std::vector<std::string> paths_;
};

struct ClientCloser {
  void operator()(tandem_client* c) const { tandem_close(c); }
};
using ClientHandle = std::unique_ptr<tandem_client, ClientCloser>;

// ---------------------------------------------------------------------------
// Measuring

// One spawn, from just before the spawn call.
struct Sample {
  std::int64_t start_ns = 0;   // CLOCK_MONOTONIC just before the spawn call
  std::int64_t exec_ns = 0;    // start → the child has exec'd
  std::int64_t reaped_ns = 0;  // start → exited and reaped
};

// The pipe that tells when a child has exec'd: both ends O_CLOEXEC.
struct ExecPipe {
  base::UniqueFd read_end;
  base::UniqueFd write_end;

  static Result<ExecPipe> make() {
    std::array<int, 2> fds{};
    if (::pipe2(fds.data(), O_CLOEXEC) != 0) return base::errno_error("pipe2");
    return ExecPipe{base::UniqueFd(fds[0]), base::UniqueFd(fds[1])};
  }

  // Closes our write end and waits for EOF: every other copy closed at an
  // exec (or an exit). Returns the time EOF was seen.
  Result<std::int64_t> wait_exec() {
    write_end.reset();
    char c = 0;
    for (;;) {
      const ssize_t n = ::read(read_end.get(), &c, 1);
      if (n == 0) return now_ns();
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return base::errno_error("read the exec pipe");
      return base::make_error(EPROTO, "the exec pipe carried data");
    }
  }
};

Result<void> check_wait_status(int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  if (WIFEXITED(status)) return base::make_error(EIO, fmt::format("{} exited with {}", kProgram, WEXITSTATUS(status)));
  return base::make_error(EIO, fmt::format("{} was killed by signal {}", kProgram, WTERMSIG(status)));
}

Result<int> wait_pid(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return base::errno_error(fmt::format("waitpid {}", pid));
  }
  return status;
}

// The argv/envp of every variant.
struct Command {
  std::array<char*, 2> argv{const_cast<char*>(kProgram), nullptr};
};

Result<Sample> spawn_plain(const Command& cmd) {
  auto pipe = ExecPipe::make();
  if (!pipe) return base::propagate(std::move(pipe.error()));
  const std::int64_t t0 = now_ns();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execve(cmd.argv[0], cmd.argv.data(), environ);
    ::_exit(127);
  }
  if (pid < 0) return base::errno_error("fork");
  auto t1 = pipe->wait_exec();
  if (!t1) return base::propagate(std::move(t1.error()));
  auto status = wait_pid(pid);
  const std::int64_t t2 = now_ns();
  if (!status) return base::propagate(std::move(status.error()));
  if (auto ok = check_wait_status(*status); !ok) return base::propagate(std::move(ok.error()));
  return Sample{t0, *t1 - t0, t2 - t0};
}

Result<Sample> spawn_posix(const Command& cmd) {
  auto pipe = ExecPipe::make();
  if (!pipe) return base::propagate(std::move(pipe.error()));
  pid_t pid = -1;
  const std::int64_t t0 = now_ns();
  const int rc = ::posix_spawn(&pid, cmd.argv[0], nullptr, nullptr, cmd.argv.data(), environ);
  if (rc != 0) return base::make_error(rc, fmt::format("posix_spawn {}", kProgram));
  auto t1 = pipe->wait_exec();
  if (!t1) return base::propagate(std::move(t1.error()));
  auto status = wait_pid(pid);
  const std::int64_t t2 = now_ns();
  if (!status) return base::propagate(std::move(status.error()));
  if (auto ok = check_wait_status(*status); !ok) return base::propagate(std::move(ok.error()));
  return Sample{t0, *t1 - t0, t2 - t0};
}

Result<Sample> spawn_cpu(const cpu::SpawnSpec& spec, const cpu::Placement& where,
                         std::optional<cpu::SpawnMethod>& method) {
  auto pipe = ExecPipe::make();
  if (!pipe) return base::propagate(std::move(pipe.error()));
  const std::int64_t t0 = now_ns();
  auto spawned = cpu::spawn(spec, where);
  if (!spawned) return base::propagate(std::move(spawned.error()), "cpu::spawn");
  auto t1 = pipe->wait_exec();
  if (!t1) return base::propagate(std::move(t1.error()));
  auto status = cpu::wait_exit(spawned->pidfd.get(), kToolWaitMs);
  const std::int64_t t2 = now_ns();
  if (!status) return base::propagate(std::move(status.error()), "cpu::wait_exit");
  if (status->exit_code != 0) {
    return base::make_error(EIO, fmt::format("{} ended with {} (cpu::spawn)", kProgram, status->exit_code));
  }
  method = spawned->method;
  return Sample{t0, *t1 - t0, t2 - t0};
}

// The tandem side: a runner handle, its session, and where tandemd puts the
// session's tool cgroups (for settling).
struct TandemRunner {
  tandem_client* client = nullptr;
  std::uint64_t session = 0;
  std::vector<std::string> session_dirs;  // tools/<session> in each hierarchy
};

Result<Sample> spawn_tandem(TandemRunner& r) {
  auto pipe = ExecPipe::make();
  if (!pipe) return base::propagate(std::move(pipe.error()));
  const std::array<const char*, 2> argv{kProgram, nullptr};
  std::int32_t pid = 0;
  const std::int64_t t0 = now_ns();
  const int rc = tandem_tool_spawn(r.client, r.session, kToolName, argv.data(), nullptr, nullptr, nullptr, &pid);
  if (rc != 0) return base::make_error(-rc, tandem_last_error(r.client));
  auto t1 = pipe->wait_exec();
  if (!t1) return base::propagate(std::move(t1.error()));
  tandem_tool_result res{};
  res.sz = sizeof res;
  const int wrc = tandem_tool_wait(r.client, pid, kToolWaitMs, &res);
  const std::int64_t t2 = now_ns();
  if (wrc != 0) return base::make_error(-wrc, tandem_last_error(r.client));
  // Fail-open would start it without a cgroup; that is not the path measured.
  if (res.cgroup_id == 0) {
    return base::make_error(
        EIO, fmt::format("the tool ran without a cgroup (tandemd unreachable?): {}", tandem_last_error(r.client)));
  }
  if (res.exit_code != 0 || res.reason != TANDEM_TOOL_EXITED) {
    return base::make_error(EIO, fmt::format("{} ended with {} (reason {}): {}", kProgram, res.exit_code, res.reason,
                                             static_cast<const char*>(res.message)));
  }
  return Sample{t0, *t1 - t0, t2 - t0};
}

// Whether `dir` has a subdirectory (a cgroup child). A missing dir has none.
bool has_child_dir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return false;
  bool found = false;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_type == DT_DIR && std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      found = true;
      break;
    }
  }
  ::closedir(d);
  return found;
}

// Waits until tandemd has removed every call cgroup of the session, in every
// hierarchy; returns when that was seen.
Result<std::int64_t> settle(const TandemRunner& r) {
  const std::int64_t deadline = now_ns() + std::chrono::nanoseconds(kSettleTimeout).count();
  for (;;) {
    if (std::ranges::none_of(r.session_dirs, has_child_dir)) return now_ns();
    if (now_ns() > deadline) {
      return base::make_error(ETIMEDOUT, fmt::format("tandemd did not remove the call cgroup within {} s",
                                                     std::chrono::seconds(kSettleTimeout).count()));
    }
    sleep_ns(kSettlePollNs);
  }
}

// ---------------------------------------------------------------------------
// Statistics and output

struct Stats {
  std::size_t n = 0;
  double median_us = 0;
  double p90_us = 0;
  double p99_us = 0;
  double max_us = 0;
};

// Nearest-rank percentiles.
Stats stats_of(std::vector<std::int64_t> v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) return s;
  std::ranges::sort(v);
  auto at = [&](double p) {
    const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size())));
    return static_cast<double>(v[std::clamp<std::size_t>(rank, 1, v.size()) - 1]) / 1e3;
  };
  s.median_us = v.size() % 2 == 1
                    ? static_cast<double>(v[v.size() / 2]) / 1e3
                    : static_cast<double>(v[v.size() / 2 - 1] + v[v.size() / 2]) / 2e3;  // mean of the middle two
  s.p90_us = at(0.90);
  s.p99_us = at(0.99);
  s.max_us = static_cast<double>(v.back()) / 1e3;
  return s;
}

// One way of spawning, and what it measured.
struct Variant {
  std::string key;  // for --only
  std::string name;
  std::function<Result<Sample>()> spawn;
  // Run after each spawn, outside the timed span (tandem: settling); `timed`
  // is false in the warm-up.
  std::function<Result<void>(const Sample&, bool timed)> after;
  std::vector<std::int64_t> exec_ns;
  std::vector<std::int64_t> reaped_ns;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The last line of `text` containing `needle`, after it ("" if none).
std::string line_after(const std::string& text, std::string_view needle) {
  const auto at = text.rfind(needle);
  if (at == std::string::npos) return "";
  const auto begin = at + needle.size();
  const auto end = text.find('\n', begin);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

std::string tail_lines(const std::string& text, std::size_t lines) {
  std::size_t pos = text.size();
  for (std::size_t i = 0; i <= lines && pos > 0; ++i) {
    pos = text.rfind('\n', pos - 1);
    if (pos == std::string::npos) return text;
  }
  return text.substr(pos + 1);
}

std::string loadavg();

void print_machine() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int nproc = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : -1;
  utsname u{};
  ::uname(&u);
  const std::string model = line_after(read_text("/proc/cpuinfo"), "model name\t: ");
  fmt::print("machine: nproc {} ({} online){}; {} {} {} {}; load average {}\n", nproc, ::sysconf(_SC_NPROCESSORS_ONLN),
             model.empty() ? "" : ", " + model, static_cast<const char*>(u.sysname),
             static_cast<const char*>(u.release), static_cast<const char*>(u.version),
             static_cast<const char*>(u.machine), loadavg());
}

std::string method_name(cpu::SpawnMethod m) {
  switch (m) {
    case cpu::SpawnMethod::kClone3IntoCgroup:
      return "clone3(CLONE_INTO_CGROUP)";
    case cpu::SpawnMethod::kClone3:
      return "clone3";
    case cpu::SpawnMethod::kFork:
      return "fork";
  }
  return "?";
}

const Variant* find_variant(const std::vector<Variant>& variants, std::string_view key) {
  auto it = std::ranges::find(variants, key, &Variant::key);
  return it == variants.end() ? nullptr : &*it;
}

// The table: both spans per variant, with the ratio of medians to plain's.
void print_table(const std::vector<Variant>& variants) {
  if (variants.empty()) return;
  const bool p99 = variants.front().exec_ns.size() >= kMinForP99;
  const Variant* plain = find_variant(variants, "plain");
  auto cell = [&](const Stats& s, const std::optional<Stats>& base) {
    std::string out = fmt::format(" {:9.1f} {:9.1f}", s.median_us, s.p90_us);
    if (p99) out += fmt::format(" {:9.1f}", s.p99_us);
    out += base && base->median_us > 0 ? fmt::format(" {:7.2f}x", s.median_us / base->median_us)
                                       : fmt::format(" {:>8}", "-");
    return out;
  };
  const int width = p99 ? 39 : 29;
  fmt::print("\n{:<22} {:>6}  {:^{}}  {:^{}}\n", "", "", "start → exec (µs)", width, "start → exit reaped (µs)", width);
  const std::string head =
      fmt::format(" {:>9} {:>9}{} {:>8}", "median", "p90", p99 ? fmt::format(" {:>9}", "p99") : "", "÷ plain");
  fmt::print("{:<22} {:>6} {} {}\n", "variant", "n", head, head);
  std::optional<Stats> plain_exec;
  std::optional<Stats> plain_reaped;
  if (plain != nullptr) {
    plain_exec = stats_of(plain->exec_ns);
    plain_reaped = stats_of(plain->reaped_ns);
  }
  for (const Variant& v : variants) {
    const Stats e = stats_of(v.exec_ns);
    const Stats r = stats_of(v.reaped_ns);
    fmt::print("{:<22} {:>6}{} {}\n", v.name, e.n, cell(e, plain_exec), cell(r, plain_reaped));
  }
}

std::string loadavg() {
  std::string l = read_text("/proc/loadavg");
  const auto cut = l.find(' ', l.find(' ', l.find(' ') + 1) + 1);  // the 1, 5 and 15 minute averages
  return cut == std::string::npos ? l : l.substr(0, cut);
}

// ---------------------------------------------------------------------------
// The run

Result<void> wait_connected(tandem_client* c, DaemonProcess& daemon) {
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  for (;;) {
    (void)tandem_poll(c, 0, 0, nullptr);  // drives the connection and the handshake
    if (tandem_connected(c) == 1) return {};
    if (auto i = check_interrupted(); !i) return i;
    if (daemon.exited()) return base::make_error(ECHILD, "tandemd exited at start");
    if (std::chrono::steady_clock::now() > deadline) {
      return base::make_error(
          ETIMEDOUT, fmt::format("no connection to tandemd within {} s", std::chrono::seconds(kStartTimeout).count()));
    }
    sleep_ns(5'000'000);
  }
}

int run(const Options& o) {
  const bool root = ::geteuid() == 0;
  fmt::print(
      "spawn_bench: {}, {} timed spawns per variant after {} warm-up, variants alternating every round, {} ms quiet "
      "before each spawn{}\n",
      kProgram, o.spawns, o.warmup, o.gap_ms, !root ? "" : (o.settle ? ", tandem calls settled" : ", not settled"));
  print_machine();
  if (!root) {
    fmt::print(
        "not root: cpu::spawn into a cgroup and tandem need root (they create cgroups beneath this process's "
        "own); running plain, posix_spawn and cpu::spawn without a cgroup only\n");
  }
  std::fflush(stdout);

  // Declared in this order so that destruction goes: runner handle →
  // tandemd → sweep of tandemd's subtree → our cgroup node → our subtree →
  // the runtime dir.
  TempDir dir(o.keep);
  std::unique_ptr<OwnedSubtree> cgroups;
  std::optional<cpu::Node> node;
  DaemonSubtreeSweeper sweeper;
  DaemonProcess daemon;
  ClientHandle runner;
  TandemRunner tr;
  std::string log_path;

  auto fail = [&](const std::string& why) {
    std::fflush(stdout);
    fmt::print(stderr, "spawn_bench: {}\n", why);
    if (!log_path.empty()) {
      fmt::print(stderr, "--- tandemd.log (tail) ---\n{}--------------------------\n",
                 tail_lines(read_text(log_path), 20));
    }
    return 1;
  };

  auto selected = [&](std::string_view key) {
    return o.only.empty() || std::ranges::find(o.only, key) != o.only.end();
  };
  const bool with_tandem = root && selected("tandem");
  const std::string subtree = fmt::format("tandem-spawnbench-{}", ::getpid());
  cpu::Placement placement;
  if (root) {
    // The mechanism's cgroup: tools/s/1 beneath our own, in every hierarchy.
    auto s = OwnedSubtree::open(subtree);
    if (!s) return fail(s.error().message());
    cgroups = std::move(*s);
    auto n = cgroups->manager().create("tools/s/1");
    if (!n) return fail(fmt::format("create tools/s/1: {}", n.error().message()));
    node = std::move(*n);
    const cpu::PlacementFds fds = cgroups->manager().placement(*node);
    placement.v2_dir = fds.v2_dir;
    placement.v1_dirs = fds.v1_dirs;
    fmt::print("cgroups (bench, pre-made tools/s/1): {}\n", cgroups->manager().describe());
  }
  if (with_tandem) {
    // tandemd, in a runtime dir and a cgroup subtree of its own.
    if (dir.path().empty()) return fail(fmt::format("mkdtemp: {}", std::strerror(errno)));
    if (o.keep) fmt::print("runtime dir: {}\n", dir.path());
    const std::string config = dir.path() + "/tandemd.toml";
    log_path = dir.path() + "/tandemd.log";
    const std::string daemon_subtree = subtree + "-d";
    std::ofstream(config) << fmt::format("[cgroups]\nmode = \"on\"\nsubtree = \"{}\"\n", daemon_subtree);
    std::vector<std::string> daemon_paths;
    for (const cpu::Hierarchy& h : cgroups->manager().hierarchies()) daemon_paths.push_back(h.path() + "-d");
    sweeper.arm(daemon_subtree, daemon_paths);
    if (auto r = daemon.start({TANDEMD_PATH, "--config", config, "--runtime-dir", dir.path()}, log_path); !r) {
      return fail(fmt::format("start tandemd: {}", r.error().message()));
    }
    const std::string sock = dir.path() + "/tandemd.sock";
    const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
    while (!std::filesystem::exists(sock)) {
      if (daemon.exited()) return fail("tandemd exited at start");
      if (g_interrupted != 0) return fail("interrupted");
      if (std::chrono::steady_clock::now() > deadline) return fail("tandemd's socket did not appear");
      sleep_ns(5'000'000);
    }
    tandem_options opts{};
    opts.sz = sizeof opts;
    opts.runtime_dir = dir.path().c_str();
    opts.name = "spawn-bench";
    opts.reconnect_min_ms = 10;
    tandem_client* c = nullptr;
    if (const int rc = tandem_runner_open(&opts, &c); rc != 0) {
      return fail(fmt::format("tandem_runner_open: {}", std::strerror(-rc)));
    }
    runner.reset(c);
    tr.client = runner.get();
    if (auto r = wait_connected(tr.client, daemon); !r) return fail(r.error().message());
    if (tandem_session_open(tr.client, kSessionName, nullptr, &tr.session) != 0) {
      return fail(fmt::format("tandem_session_open: {}", tandem_last_error(tr.client)));
    }
    for (const std::string& p : daemon_paths) {
      if (!std::filesystem::is_directory(p)) {
        return fail(fmt::format("tandemd's cgroup subtree is not at {} (where this bench expects it)", p));
      }
      tr.session_dirs.push_back(fmt::format("{}/tools/{:016x}", p, tr.session));
    }
    const std::string host = line_after(read_text(log_path), "host: cgroups ");
    fmt::print("cgroups (tandemd): {}\n", host.empty() ? "(not in its log)" : host);
  }

  const Command cmd;
  cpu::SpawnSpec spec;  // libtandem's defaults: a new session, other fds closed, environ inherited
  spec.argv = {kProgram};
  const cpu::Placement no_placement;
  std::optional<cpu::SpawnMethod> bare_method;
  std::optional<cpu::SpawnMethod> placed_method;
  std::vector<std::int64_t> removed_ns;  // start → the call's cgroup seen gone (settling)

  std::vector<Variant> variants;
  auto add = [&](std::string key, std::string name, std::function<Result<Sample>()> spawn) -> Variant* {
    if (!selected(key)) return nullptr;
    Variant& v = variants.emplace_back();
    v.key = std::move(key);
    v.name = std::move(name);
    v.spawn = std::move(spawn);
    v.exec_ns.reserve(static_cast<std::size_t>(o.spawns));
    v.reaped_ns.reserve(static_cast<std::size_t>(o.spawns));
    return &v;
  };
  variants.reserve(5);  // `t` below points into it
  add("plain", "plain fork+execve", [&] { return spawn_plain(cmd); });
  add("posix_spawn", "posix_spawn", [&] { return spawn_posix(cmd); });
  add("cpu_nocg", "cpu::spawn, no cgroup", [&] { return spawn_cpu(spec, no_placement, bare_method); });
  if (root) {
    add("cpu_cg", "cpu::spawn, cgroup", [&] { return spawn_cpu(spec, placement, placed_method); });
    Variant* t = add("tandem", "tandem spawn+wait", [&] { return spawn_tandem(tr); });
    removed_ns.reserve(static_cast<std::size_t>(o.spawns));
    if (t != nullptr)
      t->after = [&](const Sample& s, bool timed) -> Result<void> {
        (void)tandem_poll(tr.client, 0, 0, nullptr);  // the runner's event loop, between calls
        if (!o.settle) return {};
        auto gone = settle(tr);
        if (!gone) return base::propagate(std::move(gone.error()));
        if (timed) removed_ns.push_back(*gone - s.start_ns);
        return {};
      };
  }
  std::fflush(stdout);

  // Rounds: every variant once, starting one further each round.
  const std::int64_t began = now_ns();
  const int rounds = o.warmup + o.spawns;
  for (int round = 0; round < rounds; ++round) {
    const bool timed = round >= o.warmup;
    for (std::size_t k = 0; k < variants.size(); ++k) {
      if (g_interrupted != 0) return fail("interrupted");
      Variant& v = variants[(static_cast<std::size_t>(round) + k) % variants.size()];
      sleep_ns(std::int64_t{o.gap_ms} * 1'000'000);
      auto s = v.spawn();
      if (!s) return fail(fmt::format("{}: spawn {} of {}: {}", v.name, round + 1, rounds, s.error().message()));
      if (timed) {
        v.exec_ns.push_back(s->exec_ns);
        v.reaped_ns.push_back(s->reaped_ns);
      }
      if (v.after) {
        if (auto a = v.after(*s, timed); !a) {
          return fail(fmt::format("{}: after spawn {} of {}: {}", v.name, round + 1, rounds, a.error().message()));
        }
      }
    }
  }
  const double took_s = static_cast<double>(now_ns() - began) / 1e9;

  // The tandem handle stayed connected, and every call had its cgroup.
  if (with_tandem) {
    tandem_client_stats st{};
    st.sz = sizeof st;
    if (tandem_get_stats(tr.client, &st) != 0) return fail("tandem_get_stats failed");
    if (st.tools_spawned != static_cast<std::uint64_t>(rounds) || st.tools_unplaced != 0 || st.disconnects != 0 ||
        st.records_dropped != 0 || tandem_connected(tr.client) != 1) {
      return fail(fmt::format(
          "libtandem: {} tools spawned (expected {}), {} without a cgroup, {} disconnects, {} records dropped",
          st.tools_spawned, rounds, st.tools_unplaced, st.disconnects, st.records_dropped));
    }
  }

  print_table(variants);
  fmt::print("\n");
  if (bare_method) fmt::print("cpu::spawn without a cgroup used {}\n", method_name(*bare_method));
  if (placed_method) fmt::print("cpu::spawn into the cgroup used {}\n", method_name(*placed_method));
  const Variant* plain = find_variant(variants, "plain");
  const Variant* tandem = find_variant(variants, "tandem");
  if (plain != nullptr && tandem != nullptr) {
    const Stats pe = stats_of(plain->exec_ns);
    const Stats pr = stats_of(plain->reaped_ns);
    const Stats te = stats_of(tandem->exec_ns);
    const Stats tre = stats_of(tandem->reaped_ns);
    fmt::print(
        "tandem / plain, medians: start → exec {:.2f}x ({:.1f} / {:.1f} µs), start → reaped {:.2f}x ({:.1f} / "
        "{:.1f} µs)\n",
        te.median_us / pe.median_us, te.median_us, pe.median_us, tre.median_us / pr.median_us, tre.median_us,
        pr.median_us);
  }
  if (tandem != nullptr && o.settle) {
    const Stats rm = stats_of(removed_ns);
    fmt::print(
        "tandem, informational: start → tandemd had removed the call's cgroup (polled every {} µs): median {:.1f} "
        "µs, p90 {:.1f} µs{}, max {:.1f} µs\n",
        kSettlePollNs / 1000, rm.median_us, rm.p90_us,
        rm.n >= kMinForP99 ? fmt::format(", p99 {:.1f} µs", rm.p99_us) : "", rm.max_us);
  }
  fmt::print("{} spawns in {:.1f} s; load average now {}\n", rounds * static_cast<int>(variants.size()), took_s,
             loadavg());
  std::fflush(stdout);

  // Tear down, checking each step.
  if (with_tandem) {
    if (tandem_session_close(tr.client, tr.session, TANDEM_CLOSE_NORMAL) != 0) {
      return fail(fmt::format("tandem_session_close: {}", tandem_last_error(tr.client)));
    }
    runner.reset();
    tr.client = nullptr;
    const int status = daemon.stop();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return fail(fmt::format("tandemd did not exit cleanly on SIGTERM (wait status {:#x})", status));
    }
    if (sweeper.left_behind()) {
      fmt::print("warning: tandemd left its cgroup subtree behind; removing it\n");
    }
    if (auto r = sweeper.sweep(); !r) return fail(r.error().message());
  }
  if (root) {
    node.reset();
    if (auto r = cgroups->cleanup(); !r) return fail(r.error().message());
  }
  return 0;
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  tandem::bench::Options o;
  if (const int rc = tandem::bench::parse_args(argc, argv, o); rc != 0) return rc == 1 ? 0 : 2;
  // No SA_RESTART: a blocking call returns EINTR and the loop sees the flag.
  struct sigaction sa {};
  sa.sa_handler = tandem::bench::on_stop_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);
  try {
    return tandem::bench::run(o);
  } catch (const std::exception& e) {
    // (bad_alloc, a filesystem error): the daemon and the cgroups are
    // already cleaned up by the unwinding.
    std::fprintf(stderr, "spawn_bench: %s\n", e.what());
    return 1;
  }
}
