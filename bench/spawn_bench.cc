// spawn_bench: how long a tool takes to start, and to come back, when a
// runner launches it through tandem — against a plain fork/exec and against
// the fastest known placement, clone3(CLONE_INTO_CGROUP) into an existing
// cgroup with no daemon (issue 6; issue 23: the warm pool).
//
// Variants. Each round spawns /bin/true once per variant, in an order that
// rotates every round, so drift and machine noise hit every variant alike:
//   plain           fork() + execve() + waitpid(): the reference.
//   posix_spawn     glibc's posix_spawn() (clone(CLONE_VM|CLONE_VFORK), no
//                   copy of the parent's page tables) + waitpid().
//   cpu::spawn      cpu::spawn() (cpu/spawn.h, what libtandem runs) with no
//   (no cgroup)     placement: clone3(CLONE_PIDFD), the child's signal reset,
//                   setsid(), close_range() and the report pipe, no cgroups.
//   floor           cpu::spawn into one pre-made cgroup of the v2 hierarchy
//                   only: clone3(CLONE_INTO_CGROUP) and nothing else (on a
//                   pure-v2 host this is the whole placement; on a hybrid one
//                   it leaves out the v1 controllers). Skipped without v2.
//   cpu_cg          cpu::spawn into one pre-made cgroup beneath this
//                   process's own in every hierarchy (CgroupManager, subtree
//                   tandem-spawnbench-<pid>, cgroup tools/s/1): the floor plus,
//                   on a hybrid host, one `tasks` write in the child per v1
//                   hierarchy before exec. The mechanism without the daemon.
//   warm            tandem_tool_spawn() + tandem_tool_wait() through a real
//                   tandemd as shipped ([tools] defaults: the warm pool and
//                   placement ahead): the cgroup libtandem asked for when the
//                   session's last call started is here already (its
//                   ToolPlacement with the directory fds read off the socket)
//                   → cpu::spawn into it → TOOL_START, and ToolPrepare for the
//                   next call; after the exit, usage read from the cgroup and
//                   TOOL_END.
//   warm_noahead    the same with [tools] ahead = false: ToolPrepare on the
//                   socket → tandemd hands out a ready cgroup of the session →
//                   ToolPlacement → cpu::spawn … (the round trip on the call).
//   cold            the same through a tandemd with pool_max = 0 and ahead =
//                   false: each call's cgroup is made, with its limits, on its
//                   ToolPrepare.
// The tandemds run side by side, each in its own runtime dir and subtree
// (…-warm, …-warm_noahead, …-cold), each with one runner handle and one
// session.
//
// Phases. Isolated spawns first (--spawns per variant, each after a quiet
// gap), then, on a hybrid host, the v1 joins by themselves (a forked child
// timing its own write to `tasks` and, alternately, to `cgroup.procs` of each
// v1 hierarchy), then bursts (--burst per variant, back to back in blocks of
// kBurstBlock, a quiet gap before each block, variants alternating block by
// block). The table gives p50 and p99 of start → exec for the isolated
// spawns and for the bursts, each p50 with its ratio to plain's and to the
// floor's, and the start → reaped medians. --json FILE writes the same rows:
// {"rows": [{"name", "key", "p50_ms", "p99_ms", "burst_p50_ms", …}]}; the
// names contain "plain", "floor", "warm" and "cold" for those rows.
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
// Quiet gap. Every isolated spawn is preceded by --gap-ms (50) of sleep,
// outside the timed spans. Moving a whole process into a cgroup
// (cgroup.procs) takes the kernel's cgroup_threadgroup_rwsem for writing;
// while that lock's rcu_sync is idle, the writer waits for an RCU grace
// period (milliseconds), and for about one grace period after a writer is
// done the next one goes through quickly. So, back to back, one variant would
// warm that lock for the next and each variant's numbers would depend on its
// neighbour. cpu::spawn's v1 joins write `tasks`, which skips that lock, but
// tandemd's own mkdir/rmdir and other migrations on the host still touch it.
// The gap makes every spawn an isolated one, as tool calls separated by model
// rounds are; the burst phase measures back-to-back calls.
//
// Settling. tandemd removes an ended call's cgroup at its next tick, and the
// warm tandemd refills the session's pool there. By default, after each
// isolated tandem spawn and outside the timed spans, the bench waits until
// the call's cgroup is gone in every hierarchy and, for warm, until a ready
// pool-<n> cgroup is back (polling every 50 µs), so that an isolated call
// meets a refilled pool, as calls separated by model rounds do. Bursts never
// settle. --no-settle goes on at once. The warm tandemd's own count of calls
// served from the pool (ctl status, host.pool.hits / misses) is printed for
// each phase.
//
// Failures: any spawn error, a /bin/true that does not exit 0, a tandem call
// that ran without a cgroup (libtandem's fail-open), a lost connection, a
// tandemd that does not exit 0 on SIGTERM: exit 1. The numbers are never
// checked (benchmarks are not timed tests). `--quick` (50 spawns per
// variant) is the ctest smoke run.
//
// Privileges: the floor, cpu_cg, warm and cold need root. Without it the
// bench says so, runs the other three and exits 0.
//
// Hygiene: each tandemd runs through the tests' harness
// (testbed/daemon_process.h) in a fresh temporary runtime dir with its own
// cgroup subtree, tandem-spawnbench-<pid>-warm / -cold, dies with the bench
// (PR_SET_PDEATHSIG), and is stopped with SIGTERM (SIGKILL after 10 s) at the
// end and on a failure; a subtree it leaves behind is killed and removed. The bench's
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
#include <sys/stat.h>
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

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "base/stats.h"
#include "base/unique_fd.h"
#include "cpu/cgroup.h"
#include "cpu/spawn.h"
#include "ipc/daemon_connection.h"
#include "tandem/tandem.h"
#include "testbed/daemon_process.h"

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
// The burst phase: this many spawns per variant, back to back in blocks of
// kBurstBlock (a quiet gap before each block, none inside it).
constexpr int kDefaultBurst = 500;
constexpr int kQuickBurst = 20;
constexpr int kBurstBlock = 25;
// p99 is printed from this many samples on (≥ 10 above it).
constexpr std::size_t kMinForP99 = 1000;

constexpr auto kStartTimeout = std::chrono::seconds(5);
constexpr auto kStopTimeout = std::chrono::seconds(10);
constexpr auto kSettleTimeout = std::chrono::seconds(5);
constexpr std::int64_t kSettlePollNs = 50'000;
constexpr std::int64_t kSettleCtlPollNs = 1'000'000;  // asking tandemd's status costs a connection
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
  int burst = kDefaultBurst;      // spawns per variant in the burst phase (0: none)
  std::vector<std::string> only;  // variant keys; empty: all
  std::string json_path;          // --json: the rows as JSON
};

// The variants' keys (--only), in table order.
constexpr std::array<std::string_view, 8> kVariantKeys = {"plain",  "posix_spawn", "cpu_nocg",     "floor",
                                                          "cpu_cg", "warm",        "warm_noahead", "cold"};

void print_usage(std::FILE* to) {
  fmt::print(
      to,
      "usage: spawn_bench [flags]\n"
      "  --spawns N     timed spawns of /bin/true per variant (default {})\n"
      "  --warmup N     untimed spawns per variant first (default {})\n"
      "  --quick        {} spawns and {} warm-up per variant (the ctest smoke run)\n"
      "  --gap-ms N     quiet time before every isolated spawn (default {}; 0: back to back)\n"
      "  --burst N      then N spawns per variant back to back, in blocks of {} (default {}; 0: none)\n"
      "  --no-settle    don't wait for tandemd to remove each call's cgroup (and refill its pool)\n"
      "  --only K,...   run only these variants: plain, posix_spawn, cpu_nocg, floor, cpu_cg, warm,\n"
      "                 warm_noahead, cold\n"
      "  --json FILE    also write the rows as JSON: {{\"rows\": [{{\"name\", \"p50_ms\", \"p99_ms\", "
      "\"burst_p50_ms\", ...}}]}}\n"
      "  --keep         keep tandemd's runtime dirs (config, tandemd.log) and print their path\n"
      "  --help         show this text\n"
      "Variants: plain fork+execve, posix_spawn, cpu::spawn without a cgroup; as root also the floor\n"
      "(clone3(CLONE_INTO_CGROUP) into a pre-made v2 cgroup, no daemon), cpu::spawn into a pre-made cgroup\n"
      "in every hierarchy (cpu_cg: the floor plus the v1 joins of a hybrid host), and real tandemds: as shipped\n"
      "(warm: the warm pool and placement ahead), without placement ahead (warm_noahead), and with neither\n"
      "(cold).\n",
      kDefaultSpawns, kDefaultWarmup, kQuickSpawns, kQuickWarmup, kDefaultGapMs, kBurstBlock, kDefaultBurst);
}

// Returns 0 to run, 1 when --help was printed, 2 on a usage error (printed).
int parse_args(int argc, char** argv, Options& o) {
  std::optional<int> spawns;
  std::optional<int> warmup;
  std::optional<int> burst;
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
    } else if (arg == "--burst") {
      ok = integer(0, 1'000'000, burst);
    } else if (arg == "--json") {
      if (i + 1 >= argc) {
        fmt::print(stderr, "spawn_bench: --json needs a file\n");
        return 2;
      }
      o.json_path = argv[++i];
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
  o.burst = burst.value_or(quick ? kQuickBurst : kDefaultBurst);
  return 0;
}

// ---------------------------------------------------------------------------
// Resources

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

Result<Sample> spawn_cpu(const cpu::SpawnSpec& spec, const cpu::CgroupDirs& where,
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

// The tandem side: a tandemd of its own (runtime dir, cgroup subtree), a
// runner handle, its session, and where tandemd puts the session's tool
// cgroups (for settling). Members are destroyed runner → tandemd (which
// sweeps its subtree when it is left behind).
struct TandemSide {
  std::string label;  // "warm", "warm_noahead" or "cold"
  std::string runtime_dir;
  std::string log_path;
  std::unique_ptr<testbed::DaemonProcess> daemon;
  ClientHandle runner;
  tandem_client* client = nullptr;
  std::uint64_t session = 0;
  std::vector<std::string> session_dirs;  // tools/<session> in each hierarchy, v2 (when there is one) first
  bool wait_for_pool = false;             // settling also waits until a ready cgroup is back
};

Result<Sample> spawn_tandem(TandemSide& r, std::uint64_t& cgroup_id) {
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
  cgroup_id = res.cgroup_id;
  return Sample{t0, *t1 - t0, t2 - t0};
}

// The subdirectories (child cgroups) of `dir`; none for a missing dir.
std::vector<std::string> child_dirs(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_type == DT_DIR && std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      out.emplace_back(e->d_name);
    }
  }
  ::closedir(d);
  return out;
}

// tandemd's `status` (ctl), or null if it cannot say.
nlohmann::json ctl_status(const TandemSide& side) {
  auto c = ipc::DaemonConnection::connect(side.runtime_dir + "/tandemd.sock");
  if (!c || !c->hello(wire::Role::CtlRead, "spawn-bench-ctl", std::nullopt, std::chrono::milliseconds(3000))) {
    return nullptr;
  }
  auto body = c->ctl("status");
  if (!body) return nullptr;
  return nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
}

// host.<group>.<key> of a status, if it is a number.
std::optional<std::uint64_t> host_number(const nlohmann::json& status, const char* group, const char* key) {
  if (!status.is_object() || !status.contains("host") || !status["host"].is_object()) return std::nullopt;
  const nlohmann::json& host = status["host"];
  if (!host.contains(group) || !host[group].is_object() || !host[group].contains(key)) return std::nullopt;
  const nlohmann::json& v = host[group][key];
  if (!v.is_number()) return std::nullopt;
  return v.get<std::uint64_t>();
}

// The name of the child of `dir` whose cgroup id is `id` ("" if none: gone).
std::string child_with_id(const std::string& dir, std::uint64_t id) {
  for (const std::string& name : child_dirs(dir)) {
    base::UniqueFd fd(::open(fmt::format("{}/{}", dir, name).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!fd) continue;
    auto got = cpu::cgroup_id(fd.get());
    if (got && *got == id) return name;
  }
  return "";
}

// Waits until tandemd has removed the call's cgroup (`id`) in every
// hierarchy and, with a pool, has a ready one again (its status says so: a
// cgroup held ahead for the next call looks like a ready one on disk);
// returns when that was seen.
Result<std::int64_t> settle(const TandemSide& r, std::uint64_t id) {
  const std::int64_t deadline = now_ns() + std::chrono::nanoseconds(kSettleTimeout).count();
  const std::string name = r.session_dirs.empty() ? "" : child_with_id(r.session_dirs.front(), id);
  for (;;) {
    const bool gone = name.empty() || std::ranges::none_of(r.session_dirs, [&](const std::string& d) {
                        return std::filesystem::exists(fmt::format("{}/{}", d, name));
                      });
    const bool ready = !r.wait_for_pool || (gone && host_number(ctl_status(r), "pool", "ready").value_or(0) >= 1);
    if (gone && ready) return now_ns();
    if (now_ns() > deadline) {
      return base::make_error(ETIMEDOUT, fmt::format("{}: tandemd did not remove the call cgroup{} within {} s",
                                                     r.label, r.wait_for_pool ? " and refill its pool" : "",
                                                     std::chrono::seconds(kSettleTimeout).count()));
    }
    sleep_ns(gone ? kSettleCtlPollNs : kSettlePollNs);
  }
}

// ---------------------------------------------------------------------------
// Statistics and output

// One way of spawning, and what it measured.
struct Variant {
  std::string key;  // for --only
  std::string name;
  std::function<Result<Sample>()> spawn;
  // Run after each spawn, outside the timed span (tandem: the runner's poll,
  // and settling); `timed` is false in the warm-up, `burst` true in the burst
  // phase (no settling there).
  std::function<Result<void>(const Sample&, bool timed, bool burst)> after;
  std::vector<std::int64_t> exec_ns;
  std::vector<std::int64_t> reaped_ns;
  std::vector<std::int64_t> burst_exec_ns;
  std::vector<std::int64_t> burst_reaped_ns;
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

std::string ratio(double v, const std::optional<double>& base) {
  return base && *base > 0 && v > 0 ? fmt::format("{:.2f}x", v / *base) : "-";
}

// The table: start → exec of isolated spawns (p50, p99) and of bursts, each
// p50 with its ratio to plain fork/exec's and to the floor's; start → reaped
// medians last.
void print_table(const std::vector<Variant>& variants) {
  if (variants.empty()) return;
  const Variant* plain = find_variant(variants, "plain");
  const Variant* floor = find_variant(variants, "floor");
  auto median_of = [](const Variant* v, bool burst) -> std::optional<double> {
    if (v == nullptr) return std::nullopt;
    const auto& samples = burst ? v->burst_exec_ns : v->exec_ns;
    if (samples.empty()) return std::nullopt;
    return base::summarize_ns_as_us(samples).p50;
  };
  const auto plain_iso = median_of(plain, false);
  const auto floor_iso = median_of(floor, false);
  const auto plain_burst = median_of(plain, true);
  const auto floor_burst = median_of(floor, true);
  fmt::print("\n{:<32} {:>5} | {:^42} | {:^42} | {:^17}\n", "start → exec (µs)", "", "isolated", "burst", "reaped p50");
  fmt::print("{:<32} {:>5} | {:>9} {:>9} {:>10} {:>10} | {:>9} {:>9} {:>10} {:>10} | {:>8} {:>8}\n", "variant", "n",
             "p50", "p99", "÷ plain", "÷ floor", "p50", "p99", "÷ plain", "÷ floor", "isolated", "burst");
  for (const Variant& v : variants) {
    const base::Summary e = base::summarize_ns_as_us(v.exec_ns);
    const base::Summary b = base::summarize_ns_as_us(v.burst_exec_ns);
    const base::Summary r = base::summarize_ns_as_us(v.reaped_ns);
    const base::Summary br = base::summarize_ns_as_us(v.burst_reaped_ns);
    auto num = [](const base::Summary& s, double x) {
      return s.count == 0 ? std::string("-") : fmt::format("{:.1f}", x);
    };
    fmt::print("{:<32} {:>5} | {:>9} {:>9} {:>10} {:>10} | {:>9} {:>9} {:>10} {:>10} | {:>8} {:>8}\n", v.name, e.count,
               num(e, e.p50), num(e, e.p99), ratio(e.p50, plain_iso), ratio(e.p50, floor_iso), num(b, b.p50),
               num(b, b.p99), ratio(b.p50, plain_burst), ratio(b.p50, floor_burst), num(r, r.p50), num(br, br.p50));
  }
}

// The rows as JSON (milliseconds); null where a phase did not run.
std::string rows_json(const std::vector<Variant>& variants) {
  const Variant* plain = find_variant(variants, "plain");
  const Variant* floor = find_variant(variants, "floor");
  auto ms = [](const std::vector<std::int64_t>& v, double base::Summary::*field) {
    return v.empty() ? std::string("null") : fmt::format("{:.4f}", base::summarize_ns_as_us(v).*field / 1e3);
  };
  auto rel = [](const std::vector<std::int64_t>& v, const Variant* ref, bool burst) {
    if (ref == nullptr || v.empty()) return std::string("null");
    const auto& b = burst ? ref->burst_exec_ns : ref->exec_ns;
    if (b.empty()) return std::string("null");
    const double d = base::summarize_ns_as_us(b).p50;
    return d > 0 ? fmt::format("{:.3f}", base::summarize_ns_as_us(v).p50 / d) : std::string("null");
  };
  std::string out = "{\"rows\": [\n";
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const Variant& v = variants[i];
    out += fmt::format(
        "  {{\"name\": \"{}\", \"key\": \"{}\", \"n\": {}, \"p50_ms\": {}, \"p99_ms\": {}, \"burst_n\": {}, "
        "\"burst_p50_ms\": {}, \"burst_p99_ms\": {}, \"reaped_p50_ms\": {}, \"vs_plain\": {}, \"vs_floor\": {}, "
        "\"burst_vs_plain\": {}, \"burst_vs_floor\": {}}}{}\n",
        v.name, v.key, v.exec_ns.size(), ms(v.exec_ns, &base::Summary::p50), ms(v.exec_ns, &base::Summary::p99),
        v.burst_exec_ns.size(), ms(v.burst_exec_ns, &base::Summary::p50), ms(v.burst_exec_ns, &base::Summary::p99),
        ms(v.reaped_ns, &base::Summary::p50), rel(v.exec_ns, plain, false), rel(v.exec_ns, floor, false),
        rel(v.burst_exec_ns, plain, true), rel(v.burst_exec_ns, floor, true), i + 1 < variants.size() ? "," : "");
  }
  return out + "]}\n";
}

std::string loadavg() {
  std::string l = read_text("/proc/loadavg");
  const auto cut = l.find(' ', l.find(' ', l.find(' ') + 1) + 1);  // the 1, 5 and 15 minute averages
  return cut == std::string::npos ? l : l.substr(0, cut);
}

// ---------------------------------------------------------------------------
// The run

Result<void> wait_connected(tandem_client* c, testbed::DaemonProcess& daemon) {
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  for (;;) {
    (void)tandem_poll(c, 0, 0, nullptr);  // drives the connection and the handshake
    if (tandem_connected(c) == 1) return {};
    if (auto i = check_interrupted(); !i) return i;
    if (daemon.exited()) {
      return base::make_error(ECHILD,
                              fmt::format("tandemd {} at start", testbed::describe_wait_status(*daemon.wait_status())));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return base::make_error(
          ETIMEDOUT, fmt::format("no connection to tandemd within {} s", std::chrono::seconds(kStartTimeout).count()));
    }
    sleep_ns(5'000'000);
  }
}

// Starts a tandemd in `side.runtime_dir` with `tools_toml` as its [tools]
// table, in the cgroup subtree `subtree` beneath our own, and opens a runner
// and its session. `hierarchies`: our own subtree's, to find tandemd's.
Result<void> start_tandem(TandemSide& side, const std::string& subtree, const std::string& tools_toml,
                          const std::vector<cpu::Hierarchy>& hierarchies, const std::string& own_subtree) {
  testbed::DaemonOptions options;
  options.tandemd = TANDEMD_PATH;
  options.runtime_dir = side.runtime_dir;
  options.config = fmt::format("[cgroups]\nmode = \"on\"\nsubtree = \"{}\"\n\n[tools]\n{}", subtree, tools_toml);
  options.cgroup_subtree = subtree;
  options.start_timeout = kStartTimeout;
  options.stop_timeout = kStopTimeout;
  options.interrupted = [] { return g_interrupted != 0; };
  auto made = testbed::DaemonProcess::create(std::move(options));
  if (!made) return base::propagate(std::move(made.error()));
  side.daemon = std::move(*made);
  side.log_path = side.daemon->log_path();
  std::vector<std::string> paths;
  for (const cpu::Hierarchy& h : hierarchies) {
    // Our subtree's path with its last part (own_subtree) replaced by tandemd's.
    const std::string p = h.path();
    paths.push_back(p.substr(0, p.size() - own_subtree.size()) + subtree);
  }
  if (auto r = side.daemon->start(); !r) return r;
  tandem_options opts{};
  opts.sz = sizeof opts;
  opts.runtime_dir = side.runtime_dir.c_str();
  opts.name = "spawn-bench";
  opts.reconnect_min_ms = 10;
  tandem_client* c = nullptr;
  if (const int rc = tandem_runner_open(&opts, &c); rc != 0) {
    return base::make_error(-rc, fmt::format("tandem_runner_open: {}", std::strerror(-rc)));
  }
  side.runner.reset(c);
  side.client = c;
  if (auto r = wait_connected(c, *side.daemon); !r) return r;
  if (tandem_session_open(c, kSessionName, nullptr, &side.session) != 0) {
    return base::make_error(EIO, fmt::format("tandem_session_open: {}", tandem_last_error(c)));
  }
  for (const std::string& p : paths) {
    if (!std::filesystem::is_directory(p)) {
      return base::make_error(ENOENT,
                              fmt::format("tandemd's cgroup subtree is not at {} (where this bench expects it)", p));
    }
    side.session_dirs.push_back(fmt::format("{}/tools/{:016x}", p, side.session));
  }
  return {};
}

// Closes the session and stops tandemd, checking each step.
Result<void> stop_tandem(TandemSide& side) {
  if (!side.daemon) return {};
  if (side.client != nullptr && tandem_session_close(side.client, side.session, TANDEM_CLOSE_NORMAL) != 0) {
    return base::make_error(EIO,
                            fmt::format("{}: tandem_session_close: {}", side.label, tandem_last_error(side.client)));
  }
  side.runner.reset();
  side.client = nullptr;
  if (auto r = side.daemon->stop(); !r) return base::propagate(std::move(r.error()), side.label);
  auto left = side.daemon->sweep_cgroups();
  if (!left) return base::propagate(std::move(left.error()));
  if (*left) fmt::print("warning: {} tandemd left its cgroup subtree behind; removing it\n", side.label);
  return {};
}

// The v1 joins by themselves (a hybrid host): a forked child writes "0" into
// `file` ("tasks" or "cgroup.procs") of each v1 directory of `dirs`, timing
// each write; the times come back over a pipe (µs as int64, one per dir).
Result<std::vector<std::int64_t>> time_v1_joins(const std::vector<int>& dirs, const char* file) {
  std::array<int, 2> fds{};
  if (::pipe2(fds.data(), O_CLOEXEC) != 0) return base::errno_error("pipe2");
  base::UniqueFd rd(fds[0]);
  base::UniqueFd wr(fds[1]);
  std::array<std::int64_t, 16> ns{};
  const std::size_t n = std::min(dirs.size(), ns.size());
  const pid_t pid = ::fork();
  if (pid < 0) return base::errno_error("fork");
  if (pid == 0) {
    // Async-signal-safe calls only.
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t t0 = now_ns();
      const int fd = ::openat(dirs[i], file, O_WRONLY | O_CLOEXEC);
      if (fd < 0 || ::write(fd, "0", 1) != 1) ::_exit(1);
      ::close(fd);
      ns[i] = now_ns() - t0;
    }
    const auto bytes = static_cast<ssize_t>(n * sizeof ns[0]);
    ::_exit(::write(wr.get(), ns.data(), static_cast<std::size_t>(bytes)) == bytes ? 0 : 2);
  }
  wr.reset();
  const ssize_t got = ::read(rd.get(), ns.data(), n * sizeof ns[0]);
  auto status = wait_pid(pid);
  if (!status) return base::propagate(std::move(status.error()));
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0 || got != static_cast<ssize_t>(n * sizeof ns[0])) {
    return base::make_error(EIO, fmt::format("the child joining through {} failed", file));
  }
  return std::vector<std::int64_t>(ns.begin(), ns.begin() + static_cast<std::ptrdiff_t>(n));
}

// The warm pool's counters from tandemd (ctl status: host.pool.hits and
// .misses), and libtandem's count of calls placed ahead; nullopt if tandemd
// cannot say.
struct PoolCounts {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t ahead = 0;  // tandem_client_stats.tools_placed_ahead
};
std::optional<PoolCounts> pool_counts(const TandemSide& side) {
  if (side.client == nullptr) return std::nullopt;
  const nlohmann::json status = ctl_status(side);
  const auto hits = host_number(status, "pool", "hits");
  const auto misses = host_number(status, "pool", "misses");
  tandem_client_stats st{};
  st.sz = sizeof st;
  if (!hits || !misses || tandem_get_stats(side.client, &st) != 0) return std::nullopt;
  return PoolCounts{*hits, *misses, st.tools_placed_ahead};
}

int run(const Options& o) {
  const bool root = ::geteuid() == 0;
  fmt::print(
      "spawn_bench: {}, {} timed isolated spawns per variant after {} warm-up ({} ms quiet before each{}), then {} "
      "per variant in bursts of {}; variants alternate\n",
      kProgram, o.spawns, o.warmup, o.gap_ms, !root ? "" : (o.settle ? ", tandem calls settled" : ", not settled"),
      o.burst, kBurstBlock);
  print_machine();
  if (!root) {
    fmt::print(
        "not root: the floor, cpu::spawn into a cgroup and tandem need root (they create cgroups beneath this "
        "process's own); running plain, posix_spawn and cpu::spawn without a cgroup only\n");
  }
  std::fflush(stdout);

  // Declared in this order so that destruction goes: runner handles →
  // tandemds → sweeps of their subtrees → our cgroup nodes → our subtree →
  // the runtime dir.
  auto dir = testbed::TempDir::make("spawn_bench.");
  if (dir && o.keep) dir->keep();
  std::unique_ptr<OwnedSubtree> cgroups;
  std::optional<cpu::Node> node;
  TandemSide warm;
  TandemSide noahead;
  TandemSide cold;
  warm.label = "warm";
  noahead.label = "warm_noahead";
  cold.label = "cold";
  const std::array<TandemSide*, 3> sides{&warm, &noahead, &cold};

  auto fail = [&](const std::string& why) {
    std::fflush(stdout);
    fmt::print(stderr, "spawn_bench: {}\n", why);
    for (const TandemSide* side : sides) {
      if (!side->log_path.empty()) {
        fmt::print(stderr, "--- {} tandemd.log (tail) ---\n{}--------------------------\n", side->label,
                   tail_lines(read_text(side->log_path), 20));
      }
    }
    return 1;
  };

  auto selected = [&](std::string_view key) {
    return o.only.empty() || std::ranges::find(o.only, key) != o.only.end();
  };
  const std::string subtree = fmt::format("tandem-spawnbench-{}", ::getpid());
  cpu::CgroupDirs placement;
  cpu::CgroupDirs floor_placement;
  if (root) {
    // The mechanism's cgroup: tools/s/1 beneath our own, in every hierarchy.
    auto s = OwnedSubtree::open(subtree);
    if (!s) return fail(s.error().message());
    cgroups = std::move(*s);
    auto n = cgroups->manager().create("tools/s/1");
    if (!n) return fail(fmt::format("create tools/s/1: {}", n.error().message()));
    node = std::move(*n);
    placement = cgroups->manager().dirs(*node);
    floor_placement.v2_dir = placement.v2_dir;  // v2 only: clone3(CLONE_INTO_CGROUP) and nothing else
    fmt::print("cgroups (bench, pre-made tools/s/1): {}\n", cgroups->manager().describe());
    if (auto f = cgroups->manager().favordynmods()) fmt::print("cgroup2 favordynmods: {}\n", *f ? "yes" : "no");
    if (placement.v2_dir < 0) fmt::print("no cgroup v2 here: the floor row is skipped\n");
  }
  for (auto [side, tools] : {std::pair{&warm, ""}, std::pair{&noahead, "ahead = false\n"},
                             std::pair{&cold, "pool_max = 0\nahead = false\n"}}) {
    const std::string& key = side->label;
    if (!root || !selected(key)) continue;
    if (!dir) return fail(dir.error().message());
    side->runtime_dir = fmt::format("{}/{}", dir->path(), key);
    side->wait_for_pool = side != &cold;
    if (auto r =
            start_tandem(*side, fmt::format("{}-{}", subtree, key), tools, cgroups->manager().hierarchies(), subtree);
        !r) {
      return fail(fmt::format("{}: {}", key, r.error().message()));
    }
    const std::string host = line_after(read_text(side->log_path), "host: cgroups ");
    fmt::print("cgroups (tandemd, {}): {}\n", key, host.empty() ? "(not in its log)" : host);
  }
  if (o.keep && dir) fmt::print("runtime dirs: {}/{{warm,warm_noahead,cold}}\n", dir->path());

  const Command cmd;
  cpu::SpawnSpec spec;  // libtandem's defaults: a new session, other fds closed, environ inherited
  spec.argv = {kProgram};
  const cpu::CgroupDirs no_placement;
  std::optional<cpu::SpawnMethod> bare_method;
  std::optional<cpu::SpawnMethod> floor_method;
  std::optional<cpu::SpawnMethod> placed_method;
  // The pooled tandemds' counters (warm, warm_noahead) before the timed
  // spawns, between the phases, and after.
  std::array<std::optional<PoolCounts>, 2> pool_start;
  std::array<std::optional<PoolCounts>, 2> pool_mid;
  std::array<std::optional<PoolCounts>, 2> pool_end;
  const auto count_pools = [&](std::array<std::optional<PoolCounts>, 2>& into) {
    for (std::size_t i = 0; i < into.size(); ++i) into[i] = pool_counts(*sides[i]);
  };

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
  variants.reserve(kVariantKeys.size());  // the pointers below point into it
  add("plain", "plain fork+execve", [&] { return spawn_plain(cmd); });
  add("posix_spawn", "posix_spawn", [&] { return spawn_posix(cmd); });
  add("cpu_nocg", "cpu::spawn, no cgroup", [&] { return spawn_cpu(spec, no_placement, bare_method); });
  std::uint64_t last_id = 0;
  if (root) {
    if (floor_placement.v2_dir >= 0) {
      add("floor", "floor: clone3 into v2 cgroup", [&] { return spawn_cpu(spec, floor_placement, floor_method); });
    }
    add("cpu_cg", "cpu::spawn, cgroup + v1 joins", [&] { return spawn_cpu(spec, placement, placed_method); });
    for (auto [side, name] :
         {std::pair{&warm, "tandem, warm pool + ahead"}, std::pair{&noahead, "tandem, warm pool, no ahead"},
          std::pair{&cold, "tandem, cold (no pool)"}}) {
      TandemSide* t = side;
      Variant* v = add(t->label, name, [t, &last_id] { return spawn_tandem(*t, last_id); });
      if (v == nullptr) continue;
      v->after = [&o, t, &last_id](const Sample&, bool /*timed*/, bool burst) -> Result<void> {
        (void)tandem_poll(t->client, 0, 0, nullptr);  // the runner's event loop, between calls
        if (!o.settle || burst) return {};
        auto gone = settle(*t, last_id);
        if (!gone) return base::propagate(std::move(gone.error()));
        return {};
      };
    }
  }
  std::fflush(stdout);

  // Isolated: every variant once per round, starting one further each round.
  const std::int64_t began = now_ns();
  const int rounds = o.warmup + o.spawns;
  for (int round = 0; round < rounds; ++round) {
    const bool timed = round >= o.warmup;
    if (round == o.warmup) count_pools(pool_start);
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
        if (auto a = v.after(*s, timed, false); !a) {
          return fail(fmt::format("{}: after spawn {} of {}: {}", v.name, round + 1, rounds, a.error().message()));
        }
      }
    }
  }
  // Bursts: blocks of kBurstBlock back-to-back spawns of one variant, a
  // quiet gap before each block, the variants alternating block by block.
  count_pools(pool_mid);
  // The v1 joins alone, per hierarchy, through tasks (what cpu::spawn does)
  // and through cgroup.procs (what it did), alternating, each after the gap.
  std::vector<std::string> v1_names;
  std::array<std::vector<std::vector<std::int64_t>>, 2> joins;  // [tasks, procs][hierarchy][sample]
  if (root && !placement.v1_dirs.empty() && selected("cpu_cg")) {
    for (const cpu::Hierarchy& h : cgroups->manager().hierarchies()) {
      if (h.v2) continue;
      std::string cs;
      for (cpu::Controller c : h.controllers) cs += fmt::format("{}{}", cs.empty() ? "" : ",", cpu::name(c));
      v1_names.push_back(cs);
    }
    for (auto& j : joins) j.resize(placement.v1_dirs.size());
    const int n = std::min(o.spawns, 200);
    for (int i = 0; i < 2 * n; ++i) {
      if (g_interrupted != 0) return fail("interrupted");
      sleep_ns(std::int64_t{o.gap_ms} * 1'000'000);
      const std::size_t which = static_cast<std::size_t>(i % 2);
      auto t = time_v1_joins(placement.v1_dirs, which == 0 ? "tasks" : "cgroup.procs");
      if (!t) return fail(fmt::format("v1 joins: {}", t.error().message()));
      for (std::size_t k = 0; k < t->size(); ++k) joins[which][k].push_back((*t)[k]);
    }
  }
  const int blocks = (o.burst + kBurstBlock - 1) / kBurstBlock;
  for (int block = 0; block < blocks; ++block) {
    for (std::size_t k = 0; k < variants.size(); ++k) {
      Variant& v = variants[(static_cast<std::size_t>(block) + k) % variants.size()];
      sleep_ns(std::int64_t{std::max(o.gap_ms, kDefaultGapMs)} * 1'000'000);
      const int n = std::min(kBurstBlock, o.burst - block * kBurstBlock);
      for (int i = 0; i < n; ++i) {
        if (g_interrupted != 0) return fail("interrupted");
        auto s = v.spawn();
        if (!s) return fail(fmt::format("{}: burst spawn: {}", v.name, s.error().message()));
        v.burst_exec_ns.push_back(s->exec_ns);
        v.burst_reaped_ns.push_back(s->reaped_ns);
        if (v.after) {
          if (auto a = v.after(*s, true, true); !a) return fail(fmt::format("{}: {}", v.name, a.error().message()));
        }
      }
    }
  }
  const double took_s = static_cast<double>(now_ns() - began) / 1e9;
  count_pools(pool_end);

  // The tandem handles stayed connected, and every call had its cgroup.
  for (const TandemSide* side : sides) {
    if (side->client == nullptr) continue;
    tandem_client_stats st{};
    st.sz = sizeof st;
    if (tandem_get_stats(side->client, &st) != 0) return fail("tandem_get_stats failed");
    const std::uint64_t expected = static_cast<std::uint64_t>(rounds) + static_cast<std::uint64_t>(o.burst);
    if (st.tools_spawned != expected || st.tools_unplaced != 0 || st.disconnects != 0 || st.records_dropped != 0 ||
        tandem_connected(side->client) != 1) {
      return fail(fmt::format(
          "{}: libtandem: {} tools spawned (expected {}), {} without a cgroup, {} disconnects, {} records dropped",
          side->label, st.tools_spawned, expected, st.tools_unplaced, st.disconnects, st.records_dropped));
    }
  }

  print_table(variants);
  fmt::print("\n");
  if (!v1_names.empty()) {
    fmt::print("v1 joins before exec, by themselves (a forked child, {} ms quiet before each), µs:\n", o.gap_ms);
    fmt::print("  {:<16} {:>9} {:>9}   {:>14} {:>9}\n", "hierarchy", "tasks p50", "p99", "cgroup.procs p50", "p99");
    for (std::size_t k = 0; k < v1_names.size() && k < joins[0].size(); ++k) {
      const base::Summary t = base::summarize_ns_as_us(joins[0][k]);
      const base::Summary p = base::summarize_ns_as_us(joins[1][k]);
      fmt::print("  {:<16} {:>9.1f} {:>9.1f}   {:>14.1f} {:>9.1f}\n", v1_names[k], t.p50, t.p99, p.p50, p.p99);
    }
    fmt::print("\n");
  }
  if (bare_method) fmt::print("cpu::spawn without a cgroup used {}\n", method_name(*bare_method));
  if (floor_method) fmt::print("the floor used {}\n", method_name(*floor_method));
  if (placed_method) fmt::print("cpu::spawn into the cgroup used {}\n", method_name(*placed_method));
  for (std::size_t i = 0; i < pool_start.size(); ++i) {
    const auto &a = pool_start[i], &m = pool_mid[i], &e = pool_end[i];
    if (!a || !m || !e) continue;
    fmt::print(
        "{}: tandemd's pool served {} of {} timed isolated ToolPrepares and {} of {} in the bursts (ctl status); "
        "{} and {} calls started in a cgroup placed ahead\n",
        sides[i]->label, m->hits - a->hits, m->hits - a->hits + m->misses - a->misses, e->hits - m->hits,
        e->hits - m->hits + e->misses - m->misses, m->ahead - a->ahead, e->ahead - m->ahead);
  }
  fmt::print("{} spawns in {:.1f} s; load average now {}\n", (rounds + o.burst) * static_cast<int>(variants.size()),
             took_s, loadavg());
  std::fflush(stdout);
  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    out << rows_json(variants);
    if (!out) return fail(fmt::format("write {}", o.json_path));
    fmt::print("rows written to {}\n", o.json_path);
  }

  // Tear down, checking each step.
  for (TandemSide* side : sides) {
    if (side->runtime_dir.empty()) continue;
    if (auto r = stop_tandem(*side); !r) return fail(r.error().message());
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
