// tandem-toolburn's flags, plan and runner (the model is in toolburn.h).
// Formatting is by hand on purpose: no fmt or JSON library in this binary.
#include "testbed/toolburn.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <ctime>
#include <iterator>
#include <utility>

namespace tandem::testbed {
namespace {

constexpr std::size_t kPageStride = 4096;
// Arithmetic steps between two reads of the thread CPU clock: a few
// microseconds, so the clock (a syscall) is a small part of the burn and an
// overshoot is small (and paid back in the next cycle anyway).
constexpr int kSpinChunk = 4096;

// Keeps the spin's result alive so the compiler cannot drop the arithmetic.
std::atomic<std::uint64_t> g_spin_sink{0};

std::string quoted(std::string_view v) { return "'" + std::string(v) + "'"; }

// Shortest round-trip form, for messages.
std::string number(double x) {
  char buf[32];
  const auto [end, ec] = std::to_chars(std::begin(buf), std::end(buf), x);
  return ec == std::errc() ? std::string(std::begin(buf), end) : std::string("?");
}

// Fixed, 6 decimals, for the report (a double's fixed form fits in 330 chars).
std::string fixed6(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[384];
  const auto [end, ec] = std::to_chars(std::begin(buf), std::end(buf), x, std::chars_format::fixed, 6);
  return ec == std::errc() ? std::string(std::begin(buf), end) : std::string("null");
}

std::expected<double, std::string> parse_nonnegative(std::string_view flag, std::string_view v) {
  double x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || !std::isfinite(x)) {
    return std::unexpected(std::string(flag) + ": " + quoted(v) + " is not a finite number");
  }
  if (x < 0) return std::unexpected(std::string(flag) + ": " + quoted(v) + " is negative");
  return x + 0.0;  // -0 becomes 0
}

timespec to_timespec(double s) {
  timespec ts{};
  const double whole = std::floor(s);
  ts.tv_sec = static_cast<time_t>(whole);
  ts.tv_nsec = std::min(static_cast<long>((s - whole) * 1e9), 999'999'999L);
  return ts;
}

// Shared by the threads of one run_burn(); `plan` is read-only, `stop` atomic.
struct Run {
  const BurnPlan* plan;
  std::atomic<bool> stop{false};  // set when a thread could not be started
};

void run_cycles(Run& run, double cpu_base_s, const CycleHook* hook = nullptr) {
  const BurnPlan& plan = *run.plan;
  const timespec sleep = to_timespec(plan.sleep_per_cycle_s);
  for (std::uint64_t c = 0; c < plan.cycles; ++c) {
    // Relaxed: the flag only ends the loop early; no data travels with it.
    if (run.stop.load(std::memory_order_relaxed)) return;
    if (plan.burn_per_cycle_s > 0) {
      // A cumulative target, so overshoot (and the sleeps' own CPU) is paid back.
      burn_thread_cpu_until(cpu_base_s + static_cast<double>(c + 1) * plan.burn_per_cycle_s);
    }
    if (hook != nullptr && hook->fn != nullptr) hook->fn(hook->ctx, static_cast<double>(c + 1) * hook->cycle_s);
    if (plan.sleep_per_cycle_s > 0) {
      // Relative and fixed: time lost to contention is not made up here.
      timespec left = sleep;
      while (clock_nanosleep(CLOCK_MONOTONIC, 0, &left, &left) == EINTR) {
      }
    }
  }
}

void* worker_main(void* arg) {
  Run& run = *static_cast<Run*>(arg);
  run_cycles(run, thread_cpu_seconds());
  return nullptr;
}

}  // namespace

std::string burn_usage() {
  return R"(usage: tandem-toolburn --cpu-seconds X --wall-seconds Y [flags]

Stands in for an agent's tool process in trace replay: touches M MiB, then
burns X CPU-seconds paced over Y seconds in cycles of P ms (burn, then a fixed
sleep), on ceil(X / Y) threads when X > Y. Under CPU contention the burns take
longer and the run stretches, as the real tool would.

  --cpu-seconds X   CPU time to burn, seconds (required)
  --wall-seconds Y  uncontended wall time, seconds (required)
  --mem-mb M        MiB of memory to touch and hold until exit (default 0)
  --mem-burst S,R,H instead, hold --mem-base-mb B MiB, and from S seconds of progress
                    ramp to M over R seconds, hold M for H seconds, then B again
                    (tandem-sim's shape of a tool call; progress: cycles done)
  --mem-base-mb B   MiB held outside the burst (only with --mem-burst; default 0)
  --period-ms P     cycle length, milliseconds, in (0, 10000] (default 20)
  --report          print {"wall_s","cpu_s","mem_mb","threads","cycles","cgroup"}
                    as one JSON line on stdout at the end
  --help            this text

Exit status: 0 done, 1 runtime failure, 2 bad flags (nothing was done).
)";
}

std::expected<BurnOptions, std::string> parse_burn_flags(std::span<const std::string_view> args) {
  BurnOptions o;
  bool have_cpu = false;
  bool have_wall = false;
  bool have_base = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (!a.starts_with("--") && a != "-h") return std::unexpected("unexpected argument " + quoted(a));
    std::string_view flag = a;
    std::string_view value;
    bool has_value = false;
    if (const auto eq = a.find('='); eq != std::string_view::npos) {
      flag = a.substr(0, eq);
      value = a.substr(eq + 1);
      has_value = true;
    }
    if (flag == "--help" || flag == "-h" || flag == "--report") {
      if (has_value) return std::unexpected(std::string(flag) + " takes no value (got " + quoted(a) + ")");
      (flag == "--report" ? o.report : o.help) = true;
      continue;
    }
    static constexpr std::string_view kValued[] = {"--cpu-seconds", "--wall-seconds", "--mem-mb",
                                                   "--mem-base-mb", "--mem-burst",    "--period-ms"};
    if (std::find(std::begin(kValued), std::end(kValued), flag) == std::end(kValued)) {
      return std::unexpected("unknown flag " + quoted(flag) + " (see --help)");
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return std::unexpected(std::string(flag) + " needs a value");
      value = args[++i];
    }
    if (flag == "--cpu-seconds" || flag == "--wall-seconds") {
      auto v = parse_nonnegative(flag, value);
      if (!v) return std::unexpected(v.error());
      (flag == "--cpu-seconds" ? o.cpu_s : o.wall_s) = *v;
      (flag == "--cpu-seconds" ? have_cpu : have_wall) = true;
    } else if (flag == "--mem-mb" || flag == "--mem-base-mb") {
      std::uint64_t m = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), m);
      if (value.empty() || ec != std::errc() || end != value.data() + value.size() || m > kMaxBurnMemMb) {
        return std::unexpected(std::string(flag) + ": " + quoted(value) + " is not a whole number of MiB in [0, " +
                               std::to_string(kMaxBurnMemMb) + "]");
      }
      (flag == "--mem-mb" ? o.mem_mb : o.mem_base_mb) = m;
      if (flag == "--mem-base-mb") have_base = true;
    } else if (flag == "--mem-burst") {
      double parts[3] = {};
      std::string_view rest = value;
      for (int k = 0; k < 3; ++k) {
        const auto comma = rest.find(',');
        if ((k < 2) != (comma != std::string_view::npos)) {
          return std::unexpected("--mem-burst: " + quoted(value) + " is not START,RAMP,HOLD (three numbers)");
        }
        auto v = parse_nonnegative("--mem-burst", rest.substr(0, comma));
        if (!v) return std::unexpected(v.error());
        parts[k] = *v;
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      }
      o.burst = MemBurst{parts[0], parts[1], parts[2]};
    } else {  // --period-ms
      auto v = parse_nonnegative(flag, value);
      if (!v) return std::unexpected(v.error());
      if (!(*v > 0) || *v > kMaxBurnPeriodMs) {
        return std::unexpected("--period-ms: " + quoted(value) + " is not in (0, " + number(kMaxBurnPeriodMs) + "]");
      }
      o.period_s = *v / 1000.0;
    }
  }
  if (o.help) return o;
  if (!have_cpu) return std::unexpected("--cpu-seconds is required (see --help)");
  if (!have_wall) return std::unexpected("--wall-seconds is required (see --help)");
  if (have_base && !o.burst) return std::unexpected("--mem-base-mb needs --mem-burst (without it --mem-mb is held)");
  return o;
}

std::expected<BurnPlan, std::string> plan_burn(const BurnOptions& options) {
  const double x = options.cpu_s;
  const double y = options.wall_s;
  const double p = options.period_s;
  // parse_burn_flags() checks these; options built in code get the same answer.
  if (!std::isfinite(x) || x < 0) {
    return std::unexpected("--cpu-seconds: " + number(x) + " is not a finite number >= 0");
  }
  if (!std::isfinite(y) || y < 0) {
    return std::unexpected("--wall-seconds: " + number(y) + " is not a finite number >= 0");
  }
  if (!(p > 0) || p * 1000.0 > kMaxBurnPeriodMs) {
    return std::unexpected("--period-ms: " + number(p * 1000.0) + " is not in (0, " + number(kMaxBurnPeriodMs) + "]");
  }
  if (options.burst && options.mem_base_mb > options.mem_mb) {
    return std::unexpected("--mem-base-mb " + std::to_string(options.mem_base_mb) + " is above the peak --mem-mb " +
                           std::to_string(options.mem_mb));
  }
  if (x > 0 && y == 0) {
    return std::unexpected("--wall-seconds: 0 cannot hold --cpu-seconds " + number(x) + " (give the tool some time)");
  }
  // One thread burns at most one core: X > Y needs ceil(X / Y) of them.
  const double threads = x <= y ? 1.0 : std::ceil(x / y);
  if (threads > kMaxBurnThreads) {
    return std::unexpected("--cpu-seconds " + number(x) + " in --wall-seconds " + number(y) + " needs " +
                           number(threads) + " threads, more than " + std::to_string(kMaxBurnThreads));
  }
  const double cycles = std::max(1.0, std::round(y / p));
  if (!(cycles <= kMaxBurnCycles)) {
    return std::unexpected("--wall-seconds " + number(y) + " with --period-ms " + number(p * 1000.0) + " makes " +
                           number(cycles) + " cycles, more than " + number(kMaxBurnCycles));
  }
  BurnPlan plan;
  plan.threads = static_cast<unsigned>(threads);
  plan.cycles = static_cast<std::uint64_t>(cycles);
  plan.burn_per_cycle_s = x / (cycles * threads);
  plan.sleep_per_cycle_s = std::max(0.0, y / cycles - plan.burn_per_cycle_s);
  return plan;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double process_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto seconds = [](const timeval& tv) {
    return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6;
  };
  return seconds(ru.ru_utime) + seconds(ru.ru_stime);
}

void burn_thread_cpu_until(double target_s) {
  std::uint64_t x = 0x9e3779b97f4a7c15ULL ^ static_cast<std::uint64_t>(target_s * 1e9);
  while (thread_cpu_seconds() < target_s) {
    for (int i = 0; i < kSpinChunk; ++i) {  // xorshift64 and a multiply: nothing to fold away
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      x *= 0x2545f4914f6cdd1dULL;
    }
  }
  // Relaxed: only keeps `x` observable; nobody reads it.
  g_spin_sink.store(x, std::memory_order_relaxed);
}

std::size_t burst_bytes_at(const std::optional<MemBurst>& burst, std::size_t base_bytes, std::size_t peak_bytes,
                           double progress_s) {
  if (!burst) return peak_bytes;
  const double base = static_cast<double>(std::min(base_bytes, peak_bytes));
  const double peak = static_cast<double>(peak_bytes);
  const double into = progress_s - burst->start_s;
  if (into < 0 || into >= burst->ramp_s + burst->hold_s) return static_cast<std::size_t>(base);
  if (into >= burst->ramp_s) return peak_bytes;
  return static_cast<std::size_t>(base + (peak - base) * into / burst->ramp_s);
}

std::expected<TouchedMemory, std::string> TouchedMemory::create(std::uint64_t mem_mb) { return create(mem_mb, mem_mb); }

std::expected<TouchedMemory, std::string> TouchedMemory::create(std::uint64_t mem_mb, std::uint64_t resident_mb) {
  TouchedMemory m;
  if (mem_mb == 0) return m;
  if (mem_mb > kMaxBurnMemMb) {
    return std::unexpected("--mem-mb: " + std::to_string(mem_mb) + " is above " + std::to_string(kMaxBurnMemMb));
  }
  const std::size_t bytes = static_cast<std::size_t>(mem_mb) << 20;
  void* addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (addr == MAP_FAILED) {
    return std::unexpected("--mem-mb " + std::to_string(mem_mb) + ": mmap of " + std::to_string(bytes) +
                           " bytes failed: " + std::strerror(errno));
  }
  m.addr_ = addr;
  m.bytes_ = bytes;
  // Huge pages where the kernel has them (THP "madvise" or "always"): the
  // memory is as real, and touching it costs a fraction of the CPU of 4 KiB
  // faults, which matters for tools that last milliseconds in a compressed
  // replay. Refused: 4 KiB pages, nothing else changes.
  (void)madvise(addr, bytes, MADV_HUGEPAGE);
  m.hold(static_cast<std::size_t>(std::min(resident_mb, mem_mb)) << 20);
  return m;
}

void TouchedMemory::hold(std::size_t bytes) {
  const std::size_t want = (std::min(bytes, bytes_) + kPageStride - 1) / kPageStride * kPageStride;
  char* base = static_cast<char*>(addr_);
  if (want > resident_) {
    // One write per page makes it resident (a read would map the shared zero page).
    volatile char* p = base;
    for (std::size_t off = resident_; off < want; off += kPageStride) p[off] = 1;
  } else if (want < resident_) {
    (void)madvise(base + want, resident_ - want, MADV_DONTNEED);
  }
  resident_ = std::min(want, bytes_);
}

TouchedMemory::TouchedMemory(TouchedMemory&& other) noexcept
    : addr_(std::exchange(other.addr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      resident_(std::exchange(other.resident_, 0)) {}

TouchedMemory& TouchedMemory::operator=(TouchedMemory&& other) noexcept {
  if (this != &other) {
    reset();
    addr_ = std::exchange(other.addr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    resident_ = std::exchange(other.resident_, 0);
  }
  return *this;
}

TouchedMemory::~TouchedMemory() { reset(); }

void TouchedMemory::reset() {
  if (addr_ != nullptr) munmap(addr_, bytes_);
  addr_ = nullptr;
  bytes_ = 0;
  resident_ = 0;
}

std::expected<void, std::string> run_burn(const BurnPlan& plan, double caller_cpu_base_s,
                                          const CycleHook& at_cycle_end) {
  if (plan.threads < 1 || plan.threads > kMaxBurnThreads) {
    return std::unexpected("run_burn: " + std::to_string(plan.threads) + " threads is not in [1, " +
                           std::to_string(kMaxBurnThreads) + "]");
  }

  // Default timer slack (50 us) would add to every sleep; threads inherit this.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);

  Run run{.plan = &plan};
  pthread_t workers[kMaxBurnThreads];
  unsigned started = 0;
  int err = 0;
  for (; started + 1 < plan.threads; ++started) {
    err = pthread_create(&workers[started], nullptr, worker_main, &run);
    if (err != 0) {
      // Relaxed, pairs with the load in run_cycles(): the joins below order the rest.
      run.stop.store(true, std::memory_order_relaxed);
      break;
    }
  }
  if (err == 0) run_cycles(run, caller_cpu_base_s, &at_cycle_end);
  for (unsigned i = 0; i < started; ++i) pthread_join(workers[i], nullptr);
  if (err != 0) {
    return std::unexpected("cannot start burn thread " + std::to_string(started + 2) + " of " +
                           std::to_string(plan.threads) + ": " + std::strerror(err));
  }
  return {};
}

std::string json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (u < 0x20) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\u00";
      out += kHex[u >> 4];
      out += kHex[u & 0xf];
    } else {
      out += ch;
    }
  }
  out += '"';
  return out;
}

std::string burn_report_json(const BurnReport& report) {
  std::string out = "{\"wall_s\":" + fixed6(report.wall_s) + ",\"cpu_s\":" + fixed6(report.cpu_s) +
                    ",\"mem_mb\":" + std::to_string(report.mem_mb) + ",\"threads\":" + std::to_string(report.threads) +
                    ",\"cycles\":" + std::to_string(report.cycles) + ",\"cgroup\":[";
  for (std::size_t i = 0; i < report.cgroup.size(); ++i) {
    if (i > 0) out += ',';
    out += json_quote(report.cgroup[i]);
  }
  out += "]}";
  return out;
}

std::vector<std::string> split_lines(std::string_view text) {
  std::vector<std::string> lines;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    lines.emplace_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return lines;
}

std::vector<std::string> read_lines(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      text.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fd);
  return split_lines(text);
}

}  // namespace tandem::testbed
