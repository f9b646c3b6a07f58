// ipc_bench: what it costs to move a 64-byte record between two processes over
// tandem's shared-memory rings, next to the physical floor and a Unix socket.
//
// Methodology
// -----------
// Every row runs in two processes. The parent creates what the row needs (a
// fresh Channel, a shared control page, a socketpair) and fork()s; the child
// uses the inherited mapping and fds, as a client does with the fds it gets by
// SCM_RIGHTS. The parent, A, plays the client (event producer, directive
// consumer) and does all the timing; the child, B, plays the daemon. A and B
// are pinned to the first two CPUs of sched_getaffinity(), so every hand-off
// crosses cores. With one CPU the run is unpinned, spin loops yield, and the
// output says the latency rows mean little.
//
// Latency rows are ping-pong: A sends, B echoes, and A times each round trip
// with one steady_clock read per iteration (CLOCK_MONOTONIC through the vDSO;
// the output prints what one read costs, since every sample includes one).
// Warm-up iterations are not recorded. Percentiles come from the sorted samples.
// One-way = RTT / 2, which is fair because both directions run the same code.
//   cache-line ping-pong  A writes odd values and B even ones into one
//                         64-byte-aligned line; each spins until it sees the
//                         other's. This is the floor any shared-memory channel
//                         pays.
//   ring, busy-poll       one record A→B on the event ring, echoed B→A on the
//                         directive ring; both sides spin on try_pop(). Each
//                         sender calls notify() after its push, as a real
//                         client does. Nobody arms the doorbell, so notify()
//                         is a fence and a load and never a syscall. The
//                         "no notify()" row leaves the call out, which shows
//                         what the fence costs.
//   sleeping consumer     the same exchange, but each side waits with
//                         Doorbell::wait(spins = 0). It arms and sleeps in
//                         poll() on the eventfd every time, and the sender's
//                         notify() writes the eventfd. This is the wake-up path.
//   unix SOCK_SEQPACKET   64-byte messages with blocking send() and recv().
// Throughput rows stream records A→B until at least 10^8 records (batched;
// 10^7 unbatched, which runs ~20× slower) have gone and at least 2 s have
// passed (10× less with --quick), then send one stop record. A's clock runs from the first push until B reports that it
// took the stop record. Every record carries its sequence number in word 2 and the complement in word 7 (the ring owns
// half of word 0). B checks both, and the run fails if either is wrong, so a lost or torn record cannot hide inside the
// rate.
//
// The ring rows make no syscall on the data path:
// `strace -f -c ipc_bench --only ring` shows only set-up and teardown.
//
// Process hygiene: a child dies with the parent (PR_SET_PDEATHSIG). Any
// error path kills and reaps it (ChildProcess's destructor). Every spin loop
// gives up when the peer sets the abort flag, when the peer has exited, or
// after kStallLimit, so nothing here can hang or leave a process behind.
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/mapping.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "ipc/channel.h"
#include "ipc/doorbell.h"
#include "ipc/spsc_ring.h"

namespace tandem::bench {
namespace {

using base::Result;
using SteadyClock = std::chrono::steady_clock;

// Iteration counts for a full run; --quick divides them by kQuickDivisor.
constexpr std::uint64_t kWarmup = 10'000;
constexpr std::uint64_t kPingPongSamples = 100'000;
constexpr std::uint64_t kDoorbellWarmup = 1'000;
constexpr std::uint64_t kDoorbellSamples = 20'000;
constexpr std::uint64_t kStreamMinRecords = 100'000'000;
// Unbatched streaming runs at a few M records/s; 10^8 would take half a minute.
constexpr std::uint64_t kUnbatchedMinRecords = 10'000'000;
constexpr double kStreamMinSeconds = 2.0;
constexpr std::uint64_t kSocketMinRecords = 1'000'000;
constexpr double kSocketMinSeconds = 1.0;
constexpr std::uint64_t kQuickDivisor = 10;

constexpr std::size_t kBatch = 32;
// The streamer reads the clock once per this many records (a multiple of kBatch).
constexpr std::uint64_t kStreamCheckEvery = 1u << 16;
static_assert(kStreamCheckEvery % kBatch == 0);
constexpr std::size_t kMessageSize = sizeof(ipc::Slot);

// The targets.
constexpr double kTargetFloorRatio = 1.5;
constexpr double kTargetBatchedRate = 50e6;

// A peer that makes no progress for this long is considered dead.
constexpr auto kStallLimit = std::chrono::seconds(20);
constexpr auto kSocketTimeout = std::chrono::seconds(5);
// A sleeping side re-checks that its peer lives this often.
constexpr auto kDoorbellSlice = std::chrono::milliseconds(100);
constexpr auto kJoinTimeout = std::chrono::seconds(30);
// Spins between two looks at the abort flag and the clock (~0.1-0.5 ms).
constexpr std::uint32_t kSpinsPerCheck = 4096;
// How often a spinning parent may ask the kernel whether its child still lives.
constexpr auto kChildCheckInterval = std::chrono::milliseconds(50);

constexpr std::uint64_t kKindData = 0;
constexpr std::uint64_t kKindStop = 1;

// ---------------------------------------------------------------------------
// Command line

struct Options {
  bool quick = false;
  std::string json_path;
  std::string only;  // empty: every row
};

constexpr std::string_view kOnlyNames[] = {"cacheline", "ring", "doorbell", "throughput", "socket"};

void print_usage(std::FILE* to) {
  fmt::print(to,
             "usage: ipc_bench [--quick] [--json FILE] [--only NAME] [--help]\n"
             "\n"
             "Measures tandem's shared-memory rings between two processes pinned to two CPUs,\n"
             "next to a cache-line ping-pong (the floor) and a Unix SOCK_SEQPACKET socket.\n"
             "\n"
             "  --quick      10x fewer iterations (smoke test; numbers are rougher)\n"
             "  --json FILE  also write the results as JSON to FILE\n"
             "  --only NAME  run one measurement: cacheline, ring, doorbell, throughput, socket\n"
             "  --help       show this text\n");
}

// Returns 0 to run, 1 when --help was printed, 2 on a usage error (printed).
int parse_args(int argc, char** argv, Options& options) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto value = [&](std::string_view flag) -> std::optional<std::string> {
      if (i + 1 >= argc) {
        fmt::print(stderr, "ipc_bench: {} needs a value\n", flag);
        return std::nullopt;
      }
      return std::string(argv[++i]);
    };
    if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      return 1;
    } else if (arg == "--quick") {
      options.quick = true;
    } else if (arg == "--json") {
      auto v = value(arg);
      if (!v) return 2;
      if (v->empty()) {
        fmt::print(stderr, "ipc_bench: --json needs a file name\n");
        return 2;
      }
      options.json_path = *v;
    } else if (arg == "--only") {
      auto v = value(arg);
      if (!v) return 2;
      if (std::find(std::begin(kOnlyNames), std::end(kOnlyNames), *v) == std::end(kOnlyNames)) {
        fmt::print(stderr,
                   "ipc_bench: --only: unknown measurement '{}' (cacheline, ring, doorbell, throughput, socket)\n", *v);
        return 2;
      }
      options.only = *v;
    } else {
      fmt::print(stderr, "ipc_bench: unknown argument '{}'\n", arg);
      print_usage(stderr);
      return 2;
    }
  }
  return 0;
}

struct Plan {
  std::uint64_t warmup;
  std::uint64_t samples;
  std::uint64_t doorbell_warmup;
  std::uint64_t doorbell_samples;
  std::uint64_t stream_min_records;
  std::uint64_t unbatched_min_records;
  double stream_min_seconds;
  std::uint64_t socket_min_records;
  double socket_min_seconds;
};

Plan make_plan(bool quick) {
  const std::uint64_t d = quick ? kQuickDivisor : 1;
  return Plan{kWarmup / d,
              kPingPongSamples / d,
              kDoorbellWarmup / d,
              kDoorbellSamples / d,
              kStreamMinRecords / d,
              kUnbatchedMinRecords / d,
              kStreamMinSeconds / static_cast<double>(d),
              kSocketMinRecords / d,
              kSocketMinSeconds / static_cast<double>(d)};
}

// ---------------------------------------------------------------------------
// CPU placement

struct Placement {
  int cpu_a = -1;  // -1: unpinned
  int cpu_b = -1;
  int available = 0;
  bool pinned() const { return cpu_a >= 0; }
};

Result<void> pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof set, &set) != 0) return base::errno_error(fmt::format("pin to CPU {}", cpu));
  return {};
}

Result<Placement> choose_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return base::errno_error("sched_getaffinity");
  Placement p;
  p.available = CPU_COUNT(&set);
  if (p.available < 2) return p;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    if (p.cpu_a < 0) {
      p.cpu_a = cpu;
    } else {
      p.cpu_b = cpu;
      break;
    }
  }
  return p;
}

// ---------------------------------------------------------------------------
// The benchmark's own shared page: the cache-line ping-pong counter and the
// hand-shake between A and B. Not part of tandem's ABI; each field sits in its
// own 128-byte block, as in RingControl, so the hand-shake never shares a line
// with the counter being measured.

struct ControlPage {
  alignas(128) std::uint64_t line;     // cache-line ping-pong counter
  alignas(128) std::uint32_t b_ready;  // B → A: set up and pinned
  alignas(128) std::uint32_t abort;    // either side: stop, the other failed
  alignas(128) std::uint32_t b_done;   // B → A: the results below are written
  std::uint64_t b_records;             // records B consumed
  std::uint64_t b_notifies;            // notify() calls B made
  std::uint64_t b_wakeups;             // wake-ups B's notify() wrote
  std::uint64_t b_sleeps;              // times B slept on a doorbell
};
static_assert(sizeof(ControlPage) <= 4096);

template <class T>
T load_acquire(T& shared) {
  return std::atomic_ref<T>(shared).load(std::memory_order_acquire);
}
template <class T>
void store_release(T& shared, T value) {
  std::atomic_ref<T>(shared).store(value, std::memory_order_release);
}

// Owns the anonymous MAP_SHARED page; fork() shares it with the child.
// Thread-safety: owned by one thread per process; fields go through atomic_ref.
class ControlMapping {
 public:
  static Result<ControlMapping> create() {
    auto m = base::Mapping::map(-1, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS);
    if (!m) return base::propagate(std::move(m.error()), "control page");
    ControlMapping c;
    c.page_ = new (m->data()) ControlPage{};
    c.mapping_ = std::move(*m);
    return c;
  }
  ControlPage* get() const { return page_; }

 private:
  base::Mapping mapping_;
  ControlPage* page_ = nullptr;
};

// ---------------------------------------------------------------------------
// Child processes

// A forked peer. Thread-safety: owned by the parent's one thread. The
// destructor kills and reaps a child that is still there, so no exit path
// leaves one behind.
class ChildProcess {
 public:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  ChildProcess(ChildProcess&& other) noexcept : pid_(std::exchange(other.pid_, -1)), status_(other.status_) {}
  ChildProcess& operator=(ChildProcess&&) = delete;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { kill_and_reap(); }

  // Whether the child has exited (it is reaped if so). Never blocks.
  bool exited() {
    if (pid_ < 0) return true;
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      pid_ = -1;
      status_ = status;
      return true;
    }
    return false;
  }

  // Waits for the child to exit by itself. An error unless it exited with 0;
  // after kJoinTimeout it is killed.
  Result<void> join() {
    if (!exited()) {
      // A pidfd turns "wait, but not forever" into one poll() (Linux ≥ 5.3).
      // Called through syscall(): glibc 2.36's <sys/pidfd.h> lacks extern "C".
      base::UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
      if (pidfd) {
        pollfd p{pidfd.get(), POLLIN, 0};
        int r;
        do {
          r = ::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(kJoinTimeout).count()));
        } while (r < 0 && errno == EINTR);
      } else {
        const auto deadline = SteadyClock::now() + kJoinTimeout;
        while (!exited() && SteadyClock::now() < deadline) {
          timespec nap{0, 1'000'000};
          ::nanosleep(&nap, nullptr);
        }
      }
      if (!exited()) {
        kill_and_reap();
        return base::make_error(ETIMEDOUT, "peer process did not exit; killed it");
      }
    }
    if (WIFEXITED(status_) && WEXITSTATUS(status_) == 0) return {};
    if (WIFSIGNALED(status_)) {
      return base::make_error(ECHILD, fmt::format("peer process died of signal {}", WTERMSIG(status_)));
    }
    return base::make_error(ECHILD, fmt::format("peer process exited with status {}", WEXITSTATUS(status_)));
  }

  void kill_and_reap() {
    if (pid_ < 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    status_ = status;
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;  // -1: reaped
  int status_ = 0;
};

// Forks; the child pins itself to `cpu` (unless -1), runs `body` and _exit()s
// with what it returns. The child writes only to stderr, and _exit() skips the
// stdio buffers it inherited, so output is never duplicated.
template <class Body>
Result<ChildProcess> spawn_child(int cpu, Body&& body) {
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return base::errno_error("fork");
  if (pid == 0) {
    // Die with the parent. If it is already gone, leave now.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(3);
    if (cpu >= 0) {
      auto pinned = pin_to(cpu);
      if (!pinned) {
        fmt::print(stderr, "ipc_bench: peer process: {}\n", pinned.error().message());
        ::_exit(1);
      }
    }
    ::_exit(body());
  }
  return ChildProcess(pid);
}

// ---------------------------------------------------------------------------
// Spinning with a way out

// Spins until a condition holds. The hot loop is the condition and a pause.
// Every kSpinsPerCheck spins it checks the abort flag and the clock (no
// syscall). At most every kChildCheckInterval, the parent also asks the
// kernel whether its child still lives. Thread-safety: one per side.
class Spinner {
 public:
  Spinner(ControlPage* control, ChildProcess* child, bool yield) : control_(control), child_(child), yield_(yield) {}

  template <class Done>
  bool until(Done&& done) {
    std::uint32_t spins = 0;
    std::uint32_t checks = 0;
    while (!done()) {
      if (yield_) {
        ::sched_yield();  // one CPU: let the peer run
      } else {
        ipc::detail::cpu_relax();
      }
      if (++spins == kSpinsPerCheck) {
        spins = 0;
        // One last look: the peer may have delivered and then exited.
        if (!still_ok(checks++)) return done();
      }
    }
    return true;
  }

  // Tells the peer to stop, and returns an error naming `what` and the reason.
  base::Error fail(std::string_view what) const {
    abort_peer();
    return base::Error(why_errno_, fmt::format("{}: {}", what, why_));
  }
  // Whether the peer is still there (abort flag; the parent also asks the
  // kernel). For loops that block instead of spinning.
  bool peer_alive() { return peer_ok(SteadyClock::now(), /*force_child_check=*/true); }

  // Tells the peer to stop (this side failed for a reason of its own).
  void abort_peer() const {
    // SYNC: release pairs with the peer's acquire load in peer_ok().
    store_release(control_->abort, 1u);
  }
  const std::string& why() const { return why_; }

 private:
  [[gnu::noinline]] bool still_ok(std::uint32_t checks) {
    const auto now = SteadyClock::now();
    if (checks == 0) stall_start_ = now;
    if (now - stall_start_ > kStallLimit) return stop(ETIMEDOUT, "the peer made no progress for 20 s");
    return peer_ok(now, false);
  }
  bool peer_ok(SteadyClock::time_point now, bool force_child_check) {
    // SYNC: acquire pairs with the release store in abort_peer() / child_fail().
    if (load_acquire(control_->abort) != 0) return stop(ECANCELED, "the peer process failed");
    if (child_ != nullptr && (force_child_check || now - last_child_check_ > kChildCheckInterval)) {
      last_child_check_ = now;
      if (child_->exited()) return stop(ECHILD, "the peer process exited early");
    }
    return true;
  }
  bool stop(int code, std::string why) {
    why_errno_ = code;
    why_ = std::move(why);
    return false;
  }

  ControlPage* control_;
  ChildProcess* child_;  // nullptr in the child
  bool yield_;
  SteadyClock::time_point stall_start_{};
  SteadyClock::time_point last_child_check_{};
  int why_errno_ = EIO;
  std::string why_ = "unknown";
};

// In the child: report, tell the parent, and return the exit status.
int child_fail(ControlPage* control, std::string_view row, std::string_view message) {
  fmt::print(stderr, "ipc_bench: {} (peer process): {}\n", row, message);
  // SYNC: release pairs with the parent's acquire load in Spinner::peer_ok().
  store_release(control->abort, 1u);
  return 1;
}

// ---------------------------------------------------------------------------
// Results

struct Latency {
  std::uint64_t samples = 0;
  double p50 = 0, p99 = 0, p999 = 0, max = 0;  // round trip, ns
};

Latency summarize(std::vector<std::int64_t>& rtt_ns) {
  std::sort(rtt_ns.begin(), rtt_ns.end());
  Latency l;
  l.samples = rtt_ns.size();
  if (rtt_ns.empty()) return l;
  auto at = [&](double q) {
    auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(rtt_ns.size())));
    rank = std::clamp<std::size_t>(rank, 1, rtt_ns.size());
    return static_cast<double>(rtt_ns[rank - 1]);
  };
  l.p50 = at(0.50);
  l.p99 = at(0.99);
  l.p999 = at(0.999);
  l.max = static_cast<double>(rtt_ns.back());
  return l;
}

struct Row {
  std::string key;   // JSON and lookup
  std::string name;  // table label
  std::optional<Latency> rtt{};
  std::optional<double> rate{};  // records/s
  std::uint64_t records = 0;
  double seconds = 0;
  // Doorbell accounting, both sides together.
  std::uint64_t notifies = 0;
  std::uint64_t wakeups_sent = 0;
  std::uint64_t sleeps = 0;
  // Ratios to the reference rows, filled in at the end.
  std::optional<double> latency_ratio{};
  std::optional<double> rate_ratio{};
};

// What every measurement needs to know.
struct Context {
  Plan plan;
  Placement cpus;
  bool yield() const { return !cpus.pinned(); }
};

// Collects one RTT sample per round trip; iterations before `warmup` are
// dropped. One clock read per iteration: the time between consecutive reads.
class RttRecorder {
 public:
  RttRecorder(std::uint64_t warmup, std::uint64_t samples) : warmup_(warmup) { rtt_.reserve(samples); }
  void start() { prev_ = SteadyClock::now(); }
  void lap(std::uint64_t i) {
    const auto now = SteadyClock::now();
    if (i >= warmup_) rtt_.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(now - prev_).count());
    prev_ = now;
  }
  Latency summary() { return summarize(rtt_); }

 private:
  std::uint64_t warmup_;
  std::vector<std::int64_t> rtt_;
  SteadyClock::time_point prev_{};
};

ipc::Slot make_record(std::uint64_t seq, std::uint64_t kind = kKindData) {
  ipc::Slot s{};
  s.words[2] = seq;
  s.words[1] = kind;
  s.words[7] = ~seq;
  return s;
}

// Waits for B's "ready", so that set-up is never inside a timed region.
Result<void> await_ready(Spinner& spin, ControlPage* c, std::string_view row) {
  // SYNC: acquire pairs with B's release store of b_ready.
  if (!spin.until([&] { return load_acquire(c->b_ready) != 0; })) {
    return base::propagate(spin.fail(fmt::format("{}: waiting for the peer", row)));
  }
  return {};
}

// Sleeps on `bell` until `in` has a record, in slices of kDoorbellSlice so a
// dead peer is noticed quickly; the spin budget is 0, so every wait that finds
// the ring empty really sleeps. Returns false (reason in spin.why()) if the
// peer failed, and an error if nothing came within kStallLimit.
Result<bool> sleep_for_record(ipc::Doorbell& bell, ipc::RingConsumer& in, Spinner& spin) {
  const auto deadline = SteadyClock::now() + kStallLimit;
  while (true) {
    auto woke = bell.wait([&] { return in.available() != 0; }, kDoorbellSlice, 0);
    if (!woke) return base::propagate(std::move(woke.error()));
    if (*woke) return true;
    if (!spin.peer_alive()) return false;
    if (SteadyClock::now() > deadline) return base::make_error(ETIMEDOUT, "no record for 20 s");
  }
}

// ---------------------------------------------------------------------------
// Row 1: cache-line ping-pong

Result<Row> run_cacheline(const Context& ctx) {
  constexpr std::string_view kRow = "cache-line ping-pong";
  auto control = ControlMapping::create();
  if (!control) return base::propagate(std::move(control.error()), kRow);
  ControlPage* c = control->get();
  const std::uint64_t total = ctx.plan.warmup + ctx.plan.samples;

  auto child = spawn_child(ctx.cpus.cpu_b, [&]() -> int {
    Spinner spin(c, nullptr, ctx.yield());
    // SYNC: release pairs with A's acquire in await_ready().
    store_release(c->b_ready, 1u);
    for (std::uint64_t i = 0; i < total; ++i) {
      const std::uint64_t odd = 2 * i + 1;
      // SYNC: acquire pairs with A's release store of the odd value.
      if (!spin.until([&] { return load_acquire(c->line) == odd; })) return child_fail(c, kRow, spin.why());
      // SYNC: release pairs with A's acquire load of the even value.
      store_release(c->line, odd + 1);
    }
    return 0;
  });
  if (!child) return base::propagate(std::move(child.error()), kRow);

  Spinner spin(c, &*child, ctx.yield());
  if (auto ready = await_ready(spin, c, kRow); !ready) return base::propagate(std::move(ready.error()));
  RttRecorder rec(ctx.plan.warmup, ctx.plan.samples);
  rec.start();
  for (std::uint64_t i = 0; i < total; ++i) {
    const std::uint64_t even = 2 * i + 2;
    // SYNC: release pairs with B's acquire load of the odd value.
    store_release(c->line, even - 1);
    // SYNC: acquire pairs with B's release store of the even value.
    if (!spin.until([&] { return load_acquire(c->line) == even; })) return base::propagate(spin.fail(kRow));
    rec.lap(i);
  }
  if (auto joined = child->join(); !joined) return base::propagate(std::move(joined.error()), kRow);
  Row row{.key = "cacheline", .name = std::string(kRow)};
  row.rtt = rec.summary();
  return row;
}

// ---------------------------------------------------------------------------
// Rows 2-3: ring ping-pong, busy-polling; row 4: the same through the doorbell

enum class Wait { kBusyPoll, kDoorbell };

Result<Row> run_ring_pingpong(const Context& ctx, Wait wait, bool notify) {
  const std::string row_name = wait == Wait::kDoorbell ? "ring, sleeping consumer (doorbell)"
                               : notify                ? "ring, busy-poll"
                                                       : "ring, busy-poll, no notify()";
  const std::string_view row = row_name;
  const bool sleep = wait == Wait::kDoorbell;
  const std::uint64_t warmup = sleep ? ctx.plan.doorbell_warmup : ctx.plan.warmup;
  const std::uint64_t samples = sleep ? ctx.plan.doorbell_samples : ctx.plan.samples;
  const std::uint64_t total = warmup + samples;

  auto channel = ipc::Channel::create(ipc::ChannelConfig{}, "ipc-bench");
  if (!channel) return base::propagate(std::move(channel.error()), row);
  auto control = ControlMapping::create();
  if (!control) return base::propagate(std::move(control.error()), row);
  ControlPage* c = control->get();

  // B: event consumer, directive producer. It echoes every record back.
  auto child = spawn_child(ctx.cpus.cpu_b, [&]() -> int {
    auto events = channel->event_consumer();
    if (!events) return child_fail(c, row, events.error().message());
    auto directives = channel->directive_producer();
    if (!directives) return child_fail(c, row, directives.error().message());
    ipc::RingConsumer in = *events;
    ipc::RingProducer out = *directives;
    ipc::Doorbell in_bell = channel->event_doorbell();
    ipc::Doorbell out_bell = channel->directive_doorbell();
    Spinner spin(c, nullptr, ctx.yield());
    std::uint64_t notifies = 0;
    ipc::Slot record{};
    // SYNC: release pairs with A's acquire in await_ready().
    store_release(c->b_ready, 1u);
    for (std::uint64_t i = 0; i < total; ++i) {
      if (sleep) {
        auto woke = sleep_for_record(in_bell, in, spin);
        if (!woke) return child_fail(c, row, woke.error().message());
        if (!*woke) return child_fail(c, row, spin.why());
        if (!in.try_pop(record)) return child_fail(c, row, "woken with work, but the ring was empty");
      } else if (!spin.until([&] { return in.try_pop(record); })) {
        return child_fail(c, row, spin.why());
      }
      if (record.words[2] != i || record.words[7] != ~i) {
        return child_fail(c, row, fmt::format("expected record {}, got {}", i, record.words[2]));
      }
      if (!spin.until([&] { return out.try_push(record); })) return child_fail(c, row, spin.why());
      if (notify) {
        out_bell.notify();
        ++notifies;
      }
    }
    c->b_records = total;
    c->b_notifies = notifies;
    c->b_wakeups = out_bell.wakeups_sent();
    c->b_sleeps = in_bell.sleeps();
    // SYNC: release publishes the counters above; pairs with A's acquire after join().
    store_release(c->b_done, 1u);
    return 0;
  });
  if (!child) return base::propagate(std::move(child.error()), row);

  // A: event producer, directive consumer. It times each round trip.
  auto events = channel->event_producer();
  if (!events) return base::propagate(std::move(events.error()), row);
  auto directives = channel->directive_consumer();
  if (!directives) return base::propagate(std::move(directives.error()), row);
  ipc::RingProducer out = *events;
  ipc::RingConsumer in = *directives;
  ipc::Doorbell out_bell = channel->event_doorbell();
  ipc::Doorbell in_bell = channel->directive_doorbell();
  Spinner spin(c, &*child, ctx.yield());
  if (auto ready = await_ready(spin, c, row); !ready) return base::propagate(std::move(ready.error()));

  std::uint64_t notifies = 0;
  ipc::Slot back{};
  RttRecorder rec(warmup, samples);
  rec.start();
  for (std::uint64_t i = 0; i < total; ++i) {
    const ipc::Slot record = make_record(i);
    if (!spin.until([&] { return out.try_push(record); })) return base::propagate(spin.fail(row));
    if (notify) {
      out_bell.notify();
      ++notifies;
    }
    if (sleep) {
      auto woke = sleep_for_record(in_bell, in, spin);
      if (!woke || !*woke || !in.try_pop(back)) {
        spin.abort_peer();
        if (!woke) return base::propagate(std::move(woke.error()), row);
        if (!*woke) return base::propagate(spin.fail(row));
        return base::make_error(EPROTO, fmt::format("{}: woken with work, but the ring was empty", row));
      }
    } else if (!spin.until([&] { return in.try_pop(back); })) {
      return base::propagate(spin.fail(row));
    }
    if (back.words[2] != i || back.words[7] != ~i) {
      spin.abort_peer();
      return base::make_error(EPROTO, fmt::format("{}: expected echo {}, got {}", row, i, back.words[2]));
    }
    rec.lap(i);
  }
  if (auto joined = child->join(); !joined) return base::propagate(std::move(joined.error()), row);
  if (load_acquire(c->b_done) != 1) return base::make_error(EPROTO, fmt::format("{}: peer reported nothing", row));

  Row result{.key = sleep ? "doorbell" : (notify ? "ring" : "ring_no_notify"), .name = row_name};
  result.rtt = rec.summary();
  result.records = 2 * total;
  result.notifies = notifies + c->b_notifies;
  result.wakeups_sent = out_bell.wakeups_sent() + c->b_wakeups;
  result.sleeps = in_bell.sleeps() + c->b_sleeps;
  return result;
}

// ---------------------------------------------------------------------------
// Rows 5-6: ring throughput, batched and unbatched

Result<Row> run_stream(const Context& ctx, bool batched, bool notify) {
  const std::string row_name = (batched ? fmt::format("ring, batched throughput ({}/batch)", kBatch)
                                        : std::string("ring, unbatched throughput")) +
                               (notify ? "" : ", no notify()");
  const std::string_view row = row_name;
  auto channel = ipc::Channel::create(ipc::ChannelConfig{}, "ipc-bench");
  if (!channel) return base::propagate(std::move(channel.error()), row);
  auto control = ControlMapping::create();
  if (!control) return base::propagate(std::move(control.error()), row);
  ControlPage* c = control->get();

  // B: consumes and checks every record until the stop record.
  auto child = spawn_child(ctx.cpus.cpu_b, [&]() -> int {
    auto events = channel->event_consumer();
    if (!events) return child_fail(c, row, events.error().message());
    ipc::RingConsumer in = *events;
    Spinner spin(c, nullptr, ctx.yield());
    std::array<ipc::Slot, kBatch> buf{};
    std::uint64_t expected = 0;
    // SYNC: release pairs with A's acquire in await_ready().
    store_release(c->b_ready, 1u);
    while (true) {
      std::size_t n = 0;
      bool got = batched ? spin.until([&] { return (n = in.pop_batch(buf)) != 0; })
                         : spin.until([&] { return (n = in.try_pop(buf[0]) ? 1 : 0) != 0; });
      if (!got) return child_fail(c, row, spin.why());
      for (std::size_t k = 0; k < n; ++k) {
        const ipc::Slot& r = buf[k];
        if (r.words[2] != expected || r.words[7] != ~expected) {
          return child_fail(c, row,
                            fmt::format("sequence error: expected record {}, got {} (check word {:#x})", expected,
                                        r.words[2], r.words[7]));
        }
        if (r.words[1] == kKindStop) {
          if (k + 1 != n) return child_fail(c, row, "records after the stop record");
          c->b_records = expected;
          // SYNC: release publishes b_records; pairs with A's acquire spin on b_done.
          store_release(c->b_done, 1u);
          return 0;
        }
        ++expected;
      }
    }
  });
  if (!child) return base::propagate(std::move(child.error()), row);

  // A: streams until both minimums are met.
  auto events = channel->event_producer();
  if (!events) return base::propagate(std::move(events.error()), row);
  ipc::RingProducer out = *events;
  ipc::Doorbell bell = channel->event_doorbell();
  Spinner spin(c, &*child, ctx.yield());
  if (auto ready = await_ready(spin, c, row); !ready) return base::propagate(std::move(ready.error()));

  std::array<ipc::Slot, kBatch> batch{};
  std::uint64_t seq = 0;
  std::uint64_t notifies = 0;
  const auto start = SteadyClock::now();
  const auto min_time = std::chrono::duration<double>(ctx.plan.stream_min_seconds);
  const std::uint64_t min_records = batched ? ctx.plan.stream_min_records : ctx.plan.unbatched_min_records;
  while (true) {
    if (batched) {
      for (std::size_t k = 0; k < kBatch; ++k) {
        batch[k].words[2] = seq + k;
        batch[k].words[7] = ~(seq + k);
      }
      std::span<const ipc::Slot> left(batch);
      while (!left.empty()) {
        std::size_t n = 0;
        if (!spin.until([&] { return (n = out.push_batch(left)) != 0; })) return base::propagate(spin.fail(row));
        left = left.subspan(n);
      }
      seq += kBatch;
    } else {
      const ipc::Slot record = make_record(seq);
      if (!spin.until([&] { return out.try_push(record); })) return base::propagate(spin.fail(row));
      ++seq;
    }
    // What a real client does after publishing: ring if the consumer sleeps.
    if (notify) {
      bell.notify();
      ++notifies;
    }
    if (seq % kStreamCheckEvery == 0 && seq >= min_records && SteadyClock::now() - start >= min_time) {
      break;
    }
  }
  const ipc::Slot stop = make_record(seq, kKindStop);
  if (!spin.until([&] { return out.try_push(stop); })) return base::propagate(spin.fail(row));
  if (notify) {
    bell.notify();
    ++notifies;
  }
  // SYNC: acquire pairs with B's release store of b_done (after b_records).
  if (!spin.until([&] { return load_acquire(c->b_done) != 0; })) return base::propagate(spin.fail(row));
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  if (auto joined = child->join(); !joined) return base::propagate(std::move(joined.error()), row);
  if (c->b_records != seq) {
    return base::make_error(EPROTO, fmt::format("{}: sent {} records, peer counted {}", row, seq, c->b_records));
  }

  Row result{.key = fmt::format("throughput_{}{}", batched ? "batched" : "unbatched", notify ? "" : "_no_notify"),
             .name = row_name};
  result.rate = static_cast<double>(seq) / seconds;
  result.records = seq;
  result.seconds = seconds;
  result.notifies = notifies;
  result.wakeups_sent = bell.wakeups_sent();
  return result;
}

// ---------------------------------------------------------------------------
// Row 7: unix SOCK_SEQPACKET

Result<void> send_message(int fd, const ipc::Slot& message) {
  while (true) {
    ssize_t n = ::send(fd, message.words, kMessageSize, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(kMessageSize)) return {};
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return base::errno_error("send");
    return base::make_error(EPROTO, fmt::format("send: short write of {} bytes", n));
  }
}

Result<void> recv_message(int fd, ipc::Slot& message) {
  while (true) {
    ssize_t n = ::recv(fd, message.words, kMessageSize, 0);
    if (n == static_cast<ssize_t>(kMessageSize)) return {};
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return base::errno_error("recv");
    if (n == 0) return base::make_error(EPIPE, "recv: the peer closed the socket");
    return base::make_error(EPROTO, fmt::format("recv: {}-byte message, expected {}", n, kMessageSize));
  }
}

// A connected SOCK_SEQPACKET pair whose blocking calls give up after
// kSocketTimeout, so a stuck peer is an error, not a hang.
Result<std::pair<base::UniqueFd, base::UniqueFd>> make_socketpair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return base::errno_error("socketpair");
  std::pair<base::UniqueFd, base::UniqueFd> fds{base::UniqueFd(sv[0]), base::UniqueFd(sv[1])};
  const timeval tv{std::chrono::duration_cast<std::chrono::seconds>(kSocketTimeout).count(), 0};
  for (int fd : sv) {
    if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
      return base::errno_error("setsockopt SO_RCVTIMEO/SO_SNDTIMEO");
    }
  }
  return fds;
}

Result<Latency> socket_pingpong(const Context& ctx, std::string_view row) {
  auto pair = make_socketpair();
  if (!pair) return base::propagate(std::move(pair.error()), row);
  auto& [mine, theirs] = *pair;
  const std::uint64_t total = ctx.plan.warmup + ctx.plan.samples;
  auto child = spawn_child(ctx.cpus.cpu_b, [&]() -> int {
    mine.reset();  // so the parent sees EOF if we die
    ipc::Slot m{};
    for (std::uint64_t i = 0; i < total; ++i) {
      if (auto r = recv_message(theirs.get(), m); !r) {
        fmt::print(stderr, "ipc_bench: {} (peer process): {}\n", row, r.error().message());
        return 1;
      }
      if (m.words[2] != i) {
        fmt::print(stderr, "ipc_bench: {} (peer process): expected message {}, got {}\n", row, i, m.words[2]);
        return 1;
      }
      if (auto r = send_message(theirs.get(), m); !r) {
        fmt::print(stderr, "ipc_bench: {} (peer process): {}\n", row, r.error().message());
        return 1;
      }
    }
    return 0;
  });
  if (!child) return base::propagate(std::move(child.error()), row);
  theirs.reset();

  RttRecorder rec(ctx.plan.warmup, ctx.plan.samples);
  ipc::Slot back{};
  rec.start();
  for (std::uint64_t i = 0; i < total; ++i) {
    if (auto r = send_message(mine.get(), make_record(i)); !r) return base::propagate(std::move(r.error()), row);
    if (auto r = recv_message(mine.get(), back); !r) return base::propagate(std::move(r.error()), row);
    if (back.words[2] != i)
      return base::make_error(EPROTO, fmt::format("{}: expected echo {}, got {}", row, i, back.words[2]));
    rec.lap(i);
  }
  if (auto joined = child->join(); !joined) return base::propagate(std::move(joined.error()), row);
  return rec.summary();
}

struct StreamResult {
  std::uint64_t records;
  double seconds;
};

Result<StreamResult> socket_stream(const Context& ctx, std::string_view row) {
  auto pair = make_socketpair();
  if (!pair) return base::propagate(std::move(pair.error()), row);
  auto& [mine, theirs] = *pair;
  auto child = spawn_child(ctx.cpus.cpu_b, [&]() -> int {
    mine.reset();
    ipc::Slot m{};
    for (std::uint64_t expected = 0;; ++expected) {
      if (auto r = recv_message(theirs.get(), m); !r) {
        fmt::print(stderr, "ipc_bench: {} (peer process): {}\n", row, r.error().message());
        return 1;
      }
      if (m.words[2] != expected || m.words[7] != ~expected) {
        fmt::print(stderr, "ipc_bench: {} (peer process): sequence error: expected {}, got {}\n", row, expected,
                   m.words[2]);
        return 1;
      }
      if (m.words[1] == kKindStop) break;
    }
    // The acknowledgement: everything up to the stop record was received.
    if (auto r = send_message(theirs.get(), m); !r) {
      fmt::print(stderr, "ipc_bench: {} (peer process): {}\n", row, r.error().message());
      return 1;
    }
    return 0;
  });
  if (!child) return base::propagate(std::move(child.error()), row);
  theirs.reset();

  const auto start = SteadyClock::now();
  const auto min_time = std::chrono::duration<double>(ctx.plan.socket_min_seconds);
  std::uint64_t seq = 0;
  while (true) {
    if (auto r = send_message(mine.get(), make_record(seq)); !r) return base::propagate(std::move(r.error()), row);
    ++seq;
    if (seq % 4096 == 0 && seq >= ctx.plan.socket_min_records && SteadyClock::now() - start >= min_time) break;
  }
  if (auto r = send_message(mine.get(), make_record(seq, kKindStop)); !r) {
    return base::propagate(std::move(r.error()), row);
  }
  ipc::Slot ack{};
  if (auto r = recv_message(mine.get(), ack); !r) return base::propagate(std::move(r.error()), row);
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  if (ack.words[2] != seq) return base::make_error(EPROTO, fmt::format("{}: bad acknowledgement", row));
  if (auto joined = child->join(); !joined) return base::propagate(std::move(joined.error()), row);
  return StreamResult{seq, seconds};
}

Result<Row> run_socket(const Context& ctx) {
  constexpr std::string_view kRow = "unix SOCK_SEQPACKET";
  auto latency = socket_pingpong(ctx, kRow);
  if (!latency) return base::propagate(std::move(latency.error()));
  auto stream = socket_stream(ctx, kRow);
  if (!stream) return base::propagate(std::move(stream.error()));
  Row row{.key = "socket", .name = std::string(kRow)};
  row.rtt = *latency;
  row.rate = static_cast<double>(stream->records) / stream->seconds;
  row.records = stream->records;
  row.seconds = stream->seconds;
  return row;
}

// ---------------------------------------------------------------------------
// Output

// Cost of one steady_clock read, which every latency sample includes once.
double clock_read_ns() {
  constexpr int kReads = 100'000;
  const auto start = SteadyClock::now();
  SteadyClock::time_point last{};
  for (int i = 0; i < kReads; ++i) last = SteadyClock::now();
  return std::chrono::duration<double, std::nano>(last - start).count() / kReads;
}

std::string read_clocksource() {
  std::ifstream in("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string s;
  if (!(in >> s)) return "unknown";
  return s;
}

std::string format_ns(double ns) {
  if (ns < 1'000) return fmt::format("{:.1f} ns", ns);
  if (ns < 1'000'000) return fmt::format("{:.2f} µs", ns / 1e3);
  return fmt::format("{:.2f} ms", ns / 1e6);
}

std::string format_rate(double per_second) {
  if (per_second >= 1e6) return fmt::format("{:.1f} M", per_second / 1e6);
  return fmt::format("{:.1f} k", per_second / 1e3);
}

std::string format_ratio(double x) {
  if (x >= 10) return fmt::format("{:.1f}×", x);
  if (x >= 0.1) return fmt::format("{:.2f}×", x);
  return fmt::format("{:.3f}×", x);
}

// Columns in a terminal: UTF-8 continuation bytes take no room.
std::size_t display_width(std::string_view s) {
  std::size_t w = 0;
  for (unsigned char ch : s) w += (ch & 0xC0) != 0x80;
  return w;
}

const Row* find_row(const std::vector<Row>& rows, std::string_view key) {
  for (const Row& r : rows) {
    if (r.key == key) return &r;
  }
  return nullptr;
}

// Latency ratios are to the busy-poll ring's one-way p50 and throughput ratios
// to the unbatched ring (the same try_push/try_pop API, streaming).
void compute_ratios(std::vector<Row>& rows) {
  const Row* ring = find_row(rows, "ring");
  const Row* unbatched = find_row(rows, "throughput_unbatched");
  const double ring_p50 = ring != nullptr ? ring->rtt->p50 : 0;
  const double ring_rate = unbatched != nullptr ? *unbatched->rate : 0;
  for (Row& r : rows) {
    if (r.rtt && ring_p50 > 0) r.latency_ratio = r.rtt->p50 / ring_p50;
    if (r.rate && ring_rate > 0) r.rate_ratio = *r.rate / ring_rate;
  }
}

void print_table(const std::vector<Row>& rows) {
  const std::vector<std::string> header = {
      "mechanism", "one-way p50", "one-way p99", "RTT p50", "RTT p99", "throughput (records/s)", "ratio to ring"};
  std::vector<std::vector<std::string>> cells;
  for (const Row& r : rows) {
    std::vector<std::string> line;
    line.push_back(r.name);
    if (r.rtt) {
      line.push_back(format_ns(r.rtt->p50 / 2));
      line.push_back(format_ns(r.rtt->p99 / 2));
      line.push_back(format_ns(r.rtt->p50));
      line.push_back(format_ns(r.rtt->p99));
    } else {
      line.insert(line.end(), 4, "—");
    }
    line.push_back(r.rate ? format_rate(*r.rate) : "—");
    std::string ratio;
    if (r.latency_ratio) ratio += format_ratio(*r.latency_ratio) + " lat";
    if (r.rate_ratio) ratio += (ratio.empty() ? "" : ", ") + format_ratio(*r.rate_ratio) + " thr";
    if (r.key == "ring" || r.key == "throughput_unbatched") ratio += " (ref)";
    line.push_back(ratio.empty() ? "—" : ratio);
    cells.push_back(std::move(line));
  }
  std::vector<std::size_t> width(header.size());
  for (std::size_t i = 0; i < header.size(); ++i) width[i] = display_width(header[i]);
  for (const auto& line : cells) {
    for (std::size_t i = 0; i < line.size(); ++i) width[i] = std::max(width[i], display_width(line[i]));
  }
  auto print_line = [&](const std::vector<std::string>& line) {
    std::string out = "|";
    for (std::size_t i = 0; i < line.size(); ++i) {
      const std::size_t pad = width[i] - display_width(line[i]);
      // Left-align the label, right-align the numbers.
      out += i == 0 ? fmt::format(" {}{} |", line[i], std::string(pad, ' '))
                    : fmt::format(" {}{} |", std::string(pad, ' '), line[i]);
    }
    fmt::print("{}\n", out);
  };
  print_line(header);
  // Markdown: numbers right-aligned.
  std::string rule = "|";
  for (std::size_t i = 0; i < header.size(); ++i) {
    rule += i == 0 ? std::string(width[i] + 2, '-') + "|" : std::string(width[i] + 1, '-') + ":|";
  }
  fmt::print("{}\n", rule);
  for (const auto& line : cells) print_line(line);
}

struct Checks {
  std::optional<double> floor_ratio;
  std::optional<double> batched_rate;
  std::optional<std::uint64_t> busy_notifies;
  std::optional<std::uint64_t> busy_wakeups;
};

Checks compute_checks(const std::vector<Row>& rows) {
  Checks k;
  const Row* floor = find_row(rows, "cacheline");
  const Row* ring = find_row(rows, "ring");
  const Row* batched = find_row(rows, "throughput_batched");
  if (floor != nullptr && ring != nullptr) k.floor_ratio = ring->rtt->p50 / floor->rtt->p50;
  if (batched != nullptr) k.batched_rate = batched->rate;
  for (const Row& r : rows) {
    if (r.key == "ring" || r.key == "throughput_batched" || r.key == "throughput_unbatched") {
      k.busy_notifies = k.busy_notifies.value_or(0) + r.notifies;
      k.busy_wakeups = k.busy_wakeups.value_or(0) + r.wakeups_sent;
    }
  }
  return k;
}

void print_summary(const std::vector<Row>& rows, const Checks& k, bool pinned) {
  const Row* floor = find_row(rows, "cacheline");
  const Row* ring = find_row(rows, "ring");
  const Row* bare = find_row(rows, "ring_no_notify");
  const Row* bell = find_row(rows, "doorbell");
  const Row* sock = find_row(rows, "socket");
  const Row* batched = find_row(rows, "throughput_batched");
  const Row* unbatched = find_row(rows, "throughput_unbatched");
  // On one CPU the peers take turns, so the latency targets say nothing.
  auto verdict = [&](bool ok) { return !pinned ? "n/a (one CPU, unpinned)" : ok ? "PASS" : "MISS"; };

  fmt::print(
      "\nratio to ring: one-way p50 ÷ \"ring, busy-poll\" one-way p50 (lat); "
      "throughput ÷ \"ring, unbatched throughput\" (thr)\n");
  fmt::print("\nchecks against the issue's targets:\n");
  if (k.floor_ratio) {
    fmt::print("  ring one-way p50 = {} = {:.2f}× cache-line floor ({}); target ≤ {:.1f}×: {}\n",
               format_ns(ring->rtt->p50 / 2), *k.floor_ratio, format_ns(floor->rtt->p50 / 2), kTargetFloorRatio,
               verdict(*k.floor_ratio <= kTargetFloorRatio));
  } else {
    fmt::print("  ring one-way p50 vs cache-line floor: not run (run without --only)\n");
  }
  if (k.batched_rate) {
    fmt::print(
        "  batched throughput = {} records/s ({} records in {:.2f} s, every sequence number checked); "
        "target ≥ {:.0f} M/s: {}\n",
        format_rate(*k.batched_rate), batched->records, batched->seconds, kTargetBatchedRate / 1e6,
        verdict(*k.batched_rate >= kTargetBatchedRate));
  } else {
    fmt::print("  batched throughput: not run\n");
  }
  if (k.busy_notifies) {
    fmt::print(
        "  doorbell wake-ups sent in the busy-poll and streaming phases: {} of {} notify() calls; "
        "expected 0, the consumer never slept so notify() made no syscall: {}\n",
        *k.busy_wakeups, *k.busy_notifies, *k.busy_wakeups == 0 ? "PASS" : "FAIL");
  }

  fmt::print("\nalso:\n");
  if (ring != nullptr && bare != nullptr) {
    fmt::print("  notify() on the awake path (fence + load): ring RTT p50 {} with it, {} without\n",
               format_ns(ring->rtt->p50), format_ns(bare->rtt->p50));
  }
  for (std::string_view kind : {"batched", "unbatched"}) {
    const Row* with = find_row(rows, fmt::format("throughput_{}", kind));
    const Row* without = find_row(rows, fmt::format("throughput_{}_no_notify", kind));
    if (with != nullptr && without != nullptr) {
      fmt::print("  notify() per {} in the {} stream: {} records/s with it, {} without ({:.2f}×)\n",
                 kind == "batched" ? "batch" : "push", kind, format_rate(*with->rate), format_rate(*without->rate),
                 *without->rate / *with->rate);
    }
  }
  if (ring != nullptr && floor != nullptr && bare != nullptr) {
    fmt::print("  bare ring (no notify) one-way p50 = {:.2f}× cache-line floor\n", bare->rtt->p50 / floor->rtt->p50);
  }
  if (bell != nullptr) {
    fmt::print("  sleeping consumer: RTT p50 {}, {} wake-ups written and {} sleeps over {} round trips",
               format_ns(bell->rtt->p50), bell->wakeups_sent, bell->sleeps, bell->records / 2);
    if (ring != nullptr) fmt::print("; {:.0f}× the busy-poll ring", bell->rtt->p50 / ring->rtt->p50);
    fmt::print("\n");
  }
  if (sock != nullptr) {
    if (ring != nullptr) {
      fmt::print("  socket one-way p50 = {:.0f}× ring\n", sock->rtt->p50 / ring->rtt->p50);
    }
    if (unbatched != nullptr) {
      fmt::print("  ring unbatched throughput = {:.0f}× socket", *unbatched->rate / *sock->rate);
      if (batched != nullptr) fmt::print(", batched = {:.0f}× socket", *batched->rate / *sock->rate);
      fmt::print("\n");
    }
  }
}

std::string json_number(std::optional<double> v) { return v ? fmt::format("{:.1f}", *v) : "null"; }
std::string json_ratio(std::optional<double> v) { return v ? fmt::format("{:.4f}", *v) : "null"; }

std::string to_json(const Options& options, const Placement& cpus, double clock_ns, const std::vector<Row>& rows,
                    const Checks& k) {
  std::string out = "{\n";
  out += fmt::format("  \"quick\": {},\n", options.quick);
  out += fmt::format("  \"cpus\": {{\"pinned\": {}, \"a\": {}, \"b\": {}, \"available\": {}}},\n", cpus.pinned(),
                     cpus.cpu_a, cpus.cpu_b, cpus.available);
  out += fmt::format("  \"clock_read_ns\": {:.1f},\n", clock_ns);
  out += "  \"rows\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    auto half = [&](double Latency::*field) -> std::optional<double> {
      if (!r.rtt) return std::nullopt;
      return (*r.rtt).*field / 2;
    };
    auto full = [&](double Latency::*field) -> std::optional<double> {
      if (!r.rtt) return std::nullopt;
      return (*r.rtt).*field;
    };
    out += fmt::format(
        "    {{\"key\": \"{}\", \"name\": \"{}\", \"samples\": {}, \"one_way_p50_ns\": {}, \"one_way_p99_ns\": {}, "
        "\"rtt_p50_ns\": {}, \"rtt_p99_ns\": {}, \"rtt_p999_ns\": {}, \"rtt_max_ns\": {}, "
        "\"throughput_records_per_s\": {}, \"records\": {}, \"seconds\": {:.3f}, "
        "\"notifies\": {}, \"wakeups_sent\": {}, \"sleeps\": {}, "
        "\"latency_ratio_to_ring\": {}, \"throughput_ratio_to_ring\": {}}}{}\n",
        r.key, r.name, r.rtt ? r.rtt->samples : 0, json_number(half(&Latency::p50)), json_number(half(&Latency::p99)),
        json_number(full(&Latency::p50)), json_number(full(&Latency::p99)), json_number(full(&Latency::p999)),
        json_number(full(&Latency::max)), json_number(r.rate), r.records, r.seconds, r.notifies, r.wakeups_sent,
        r.sleeps, json_ratio(r.latency_ratio), json_ratio(r.rate_ratio), i + 1 < rows.size() ? "," : "");
  }
  out += "  ],\n";
  out += "  \"checks\": {\n";
  out += fmt::format("    \"ring_over_floor\": {}, \"ring_over_floor_target\": {:.1f},\n", json_ratio(k.floor_ratio),
                     kTargetFloorRatio);
  out += fmt::format("    \"batched_records_per_s\": {}, \"batched_target\": {:.0f},\n", json_number(k.batched_rate),
                     kTargetBatchedRate);
  out += fmt::format("    \"busy_notifies\": {}, \"busy_wakeups_sent\": {}\n",
                     k.busy_notifies ? fmt::format("{}", *k.busy_notifies) : "null",
                     k.busy_wakeups ? fmt::format("{}", *k.busy_wakeups) : "null");
  out += "  }\n}\n";
  return out;
}

// ---------------------------------------------------------------------------

int run(const Options& options) {
  // Open the JSON file first, so a bad path fails before a minute of measuring.
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> json(nullptr, &std::fclose);
  if (!options.json_path.empty()) {
    json.reset(std::fopen(options.json_path.c_str(), "we"));
    if (!json) {
      fmt::print(stderr, "ipc_bench: {}\n", base::Error(errno, "open " + options.json_path).message());
      return 1;
    }
  }

  auto cpus = choose_cpus();
  if (!cpus) {
    fmt::print(stderr, "ipc_bench: {}\n", cpus.error().message());
    return 1;
  }
  if (cpus->pinned()) {
    if (auto pinned = pin_to(cpus->cpu_a); !pinned) {
      fmt::print(stderr, "ipc_bench: {}\n", pinned.error().message());
      return 1;
    }
  }
  const Context ctx{make_plan(options.quick), *cpus};
  const double clock_ns = clock_read_ns();

  fmt::print("ipc_bench: two processes, 64-byte records{}\n", options.quick ? " (--quick: 10× fewer iterations)" : "");
  if (cpus->pinned()) {
    fmt::print(
        "  pinned: A (client side, does the timing) on CPU {}, B (daemon side) on CPU {}: "
        "the first two of {} CPUs in sched_getaffinity\n",
        cpus->cpu_a, cpus->cpu_b, cpus->available);
  } else {
    fmt::print(
        "  only {} CPU available: running unpinned and yielding in spin loops; "
        "latencies measure the scheduler, not the ring\n",
        cpus->available);
  }
  fmt::print("  clock: steady_clock via {}, {:.1f} ns per read (one read is inside every RTT sample)\n",
             read_clocksource(), clock_ns);
  fmt::print(
      "  samples: {} round trips per ping-pong row after {} warm-up ({} after {} for the doorbell row); "
      "streams ≥ {} records ({} unbatched) and ≥ {:.1f} s\n\n",
      ctx.plan.samples, ctx.plan.warmup, ctx.plan.doorbell_samples, ctx.plan.doorbell_warmup,
      ctx.plan.stream_min_records, ctx.plan.unbatched_min_records, ctx.plan.stream_min_seconds);

  auto want = [&](std::string_view name) { return options.only.empty() || options.only == name; };
  std::vector<Row> rows;
  struct Job {
    std::string_view group;
    std::string_view label;
    std::function<Result<Row>()> fn;
  };
  const std::vector<Job> jobs = {
      {"cacheline", "cache-line ping-pong", [&] { return run_cacheline(ctx); }},
      {"ring", "ring busy-poll ping-pong", [&] { return run_ring_pingpong(ctx, Wait::kBusyPoll, true); }},
      {"ring", "ring busy-poll ping-pong without notify()",
       [&] { return run_ring_pingpong(ctx, Wait::kBusyPoll, false); }},
      {"doorbell", "ring ping-pong through the doorbell",
       [&] { return run_ring_pingpong(ctx, Wait::kDoorbell, true); }},
      {"throughput", "ring batched stream", [&] { return run_stream(ctx, true, true); }},
      {"throughput", "ring batched stream without notify()", [&] { return run_stream(ctx, true, false); }},
      {"throughput", "ring unbatched stream", [&] { return run_stream(ctx, false, true); }},
      {"throughput", "ring unbatched stream without notify()", [&] { return run_stream(ctx, false, false); }},
      {"socket", "unix socket ping-pong and stream", [&] { return run_socket(ctx); }},
  };
  for (const Job& job : jobs) {
    if (!want(job.group)) continue;
    fmt::print(stderr, "running: {}\n", job.label);
    auto row = job.fn();
    if (!row) {
      fmt::print(stderr, "ipc_bench: {}\n", row.error().message());
      return 1;
    }
    rows.push_back(std::move(*row));
  }

  compute_ratios(rows);
  const Checks checks = compute_checks(rows);
  print_table(rows);
  print_summary(rows, checks, cpus->pinned());

  // A wake-up on the busy path is a doorbell bug, not noise: fail the run.
  const bool wakeups_ok = !checks.busy_wakeups || *checks.busy_wakeups == 0;
  if (json) {
    const std::string text = to_json(options, *cpus, clock_ns, rows, checks);
    if (std::fwrite(text.data(), 1, text.size(), json.get()) != text.size() || std::fflush(json.get()) != 0) {
      fmt::print(stderr, "ipc_bench: {}\n", base::Error(errno, "write " + options.json_path).message());
      return 1;
    }
  }
  return wakeups_ok ? 0 : 1;
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  tandem::bench::Options options;
  switch (tandem::bench::parse_args(argc, argv, options)) {
    case 0:
      return tandem::bench::run(options);
    case 1:
      return 0;
    default:
      return 2;
  }
}
