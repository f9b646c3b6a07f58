// tandem-toolburn: the stand-in for an agent's tool process (pytest, git,
// Read, ...) when agent traces are replayed. A trace records, per tool call,
// the CPU time X it used, its wall time Y and its memory M; the replayer runs
//
//   tandem-toolburn --cpu-seconds X --wall-seconds Y [--mem-mb M] [--mem-burst S,R,H --mem-base-mb B]
//                   [--period-ms P] [--report]
//
// instead, so that the CPU and memory contention the tool puts on the host is
// real while, uncontended, it takes the wall time the trace says.
//
// The model. M MiB of anonymous memory are touched first (one write per 4 KiB
// page) and stay mapped until exit. With --mem-burst S,R,H the memory follows
// tandem-sim's shape of a tool call instead (docs/sim.md "Host memory"): B MiB
// from the start; from S seconds of progress a ramp of R seconds to M; M held
// for H seconds; then B again (the rest given back with MADV_DONTNEED).
// Progress is counted in cycles done × Y/n, so a starved tool reaches its
// burst later, as in the simulator. The main thread moves the memory at the
// end of each of its cycles. Then T threads (1 if X <= Y, else
// ceil(X / Y), at most 64: one thread burns at most one core) each run
// n = max(1, round(Y / P)) cycles of
//
//   burn X / (n*T) seconds of the thread's own CPU time, then
//   sleep a fixed Y/n - X/(n*T) (skipped when <= 0).
//
// The sleeps are fixed, relative durations on purpose: a real tool that is
// starved of CPU does not catch up by waiting less for its disk or its
// children, it just takes longer. So under contention the burns stretch in
// wall time and the tool stretches with them, while uncontended the run takes
// about Y seconds and X CPU-seconds. A thread burns until its CPU clock reaches
// (c+1) * X/(n*T) at the end of cycle c, counted from the start of the run, so
// an overshoot in one cycle is paid back in the next and, on the main thread,
// the CPU spent touching the memory is part of the budget.
//
// parse_burn_flags() and plan_burn() are pure; TouchedMemory and run_burn()
// do the work.
// Nothing here throws or depends on more than the standard library and
// pthreads: the binary is exec'd thousands of times per replay.
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::testbed {

inline constexpr unsigned kMaxBurnThreads = 64;
inline constexpr std::uint64_t kMaxBurnMemMb = 1048576;  // 1 TiB: beyond that the flag is a mistake
inline constexpr double kMaxBurnPeriodMs = 10000;
inline constexpr double kMaxBurnCycles = 1e9;  // bounds round(Y / P) so it fits any counter

// The command line. --cpu-seconds and --wall-seconds are required (unless
// --help): a replayer that forgets one has a bug worth hearing about.
// --mem-burst S,R,H: seconds of the call's progress.
struct MemBurst {
  double start_s = 0;
  double ramp_s = 0;
  double hold_s = 0;
};

struct BurnOptions {
  double cpu_s = 0;               // --cpu-seconds X
  double wall_s = 0;              // --wall-seconds Y
  std::uint64_t mem_mb = 0;       // --mem-mb M (the peak, with --mem-burst)
  std::optional<MemBurst> burst;  // --mem-burst S,R,H; none: M from start to exit
  std::uint64_t mem_base_mb = 0;  // --mem-base-mb B: held outside the burst (only with --mem-burst)
  double period_s = 0.020;        // --period-ms P, in seconds
  bool report = false;            // --report: one JSON line on stdout at the end
  bool help = false;              // --help / -h
};

// "--flag value" or "--flag=value". Each value is checked on its own here
// (finite, not negative, in range); relations between flags are plan_burn()'s.
// The error names the flag and the value.
[[nodiscard]] std::expected<BurnOptions, std::string> parse_burn_flags(std::span<const std::string_view> args);
std::string burn_usage();

struct BurnPlan {
  unsigned threads = 1;
  std::uint64_t cycles = 1;
  double burn_per_cycle_s = 0;   // thread CPU time each thread burns per cycle
  double sleep_per_cycle_s = 0;  // fixed sleep after each burn; 0: none
};

// The threads and cycles of the model above. Errors: X > 0 with Y == 0,
// more than kMaxBurnThreads threads, more than kMaxBurnCycles cycles.
[[nodiscard]] std::expected<BurnPlan, std::string> plan_burn(const BurnOptions& options);

// M MiB of anonymous private memory, made resident by one write per 4 KiB
// page, unmapped when the owner goes (main holds it until exit). Move-only;
// a move leaves the source empty. Not thread-safe: one owner at a time.
class TouchedMemory {
 public:
  TouchedMemory() = default;
  // Maps mem_mb MiB and makes the first `resident_mb` of them resident
  // (default: all). mem_mb == 0 maps nothing. Errors name --mem-mb and why
  // mmap failed.
  [[nodiscard]] static std::expected<TouchedMemory, std::string> create(std::uint64_t mem_mb);
  [[nodiscard]] static std::expected<TouchedMemory, std::string> create(std::uint64_t mem_mb,
                                                                        std::uint64_t resident_mb);
  // Makes the first `bytes` (at most size()) resident: touches the pages not
  // yet touched, or gives back (MADV_DONTNEED) those past `bytes`.
  void hold(std::size_t bytes);
  [[nodiscard]] std::size_t resident() const { return resident_; }
  TouchedMemory(TouchedMemory&& other) noexcept;
  TouchedMemory& operator=(TouchedMemory&& other) noexcept;
  TouchedMemory(const TouchedMemory&) = delete;
  TouchedMemory& operator=(const TouchedMemory&) = delete;
  ~TouchedMemory();

  [[nodiscard]] const void* data() const { return addr_; }
  [[nodiscard]] std::size_t size() const { return bytes_; }

 private:
  void reset();

  void* addr_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t resident_ = 0;  // page-rounded bytes touched and not given back
};

// What a call holds at `progress_s` seconds of progress: `base_bytes`
// outside the burst, rising linearly to `peak_bytes` over its ramp, the peak
// for its hold. Without a burst, the peak throughout.
std::size_t burst_bytes_at(const std::optional<MemBurst>& burst, std::size_t base_bytes, std::size_t peak_bytes,
                           double progress_s);

// Runs the plan on plan.threads threads (the calling thread is one of them)
// and returns when all are done. `caller_cpu_base_s` is the calling thread's
// CPU clock (thread_cpu_seconds()) when the tool started: what it spent since
// (touching the memory) counts toward its share. The error (a thread that
// could not be started) says so; the threads already started stop early.
// With `at_cycle_end.fn`, the calling thread calls it after each of its
// cycles with the progress so far (cycles done × the cycle's uncontended
// length).
struct CycleHook {
  double cycle_s = 0;  // uncontended length of one cycle
  void (*fn)(void* ctx, double progress_s) = nullptr;
  void* ctx = nullptr;
};
[[nodiscard]] std::expected<void, std::string> run_burn(const BurnPlan& plan, double caller_cpu_base_s,
                                                        const CycleHook& at_cycle_end = {});

// Spins on arithmetic until the calling thread's CPU clock
// (CLOCK_THREAD_CPUTIME_ID) reads at least `target_s`.
void burn_thread_cpu_until(double target_s);
double thread_cpu_seconds();
// User + system time of the whole process (getrusage RUSAGE_SELF).
double process_cpu_seconds();

// What --report prints.
struct BurnReport {
  double wall_s = 0;
  double cpu_s = 0;
  std::uint64_t mem_mb = 0;
  unsigned threads = 0;
  std::uint64_t cycles = 0;
  std::vector<std::string> cgroup;  // the lines of /proc/self/cgroup
};

// `s` as a JSON string literal, quotes included.
std::string json_quote(std::string_view s);
// One line of JSON, no trailing newline.
std::string burn_report_json(const BurnReport& report);

// The lines of `text`, without their '\n'; no empty last line.
std::vector<std::string> split_lines(std::string_view text);
// The lines of the file at `path`; empty if it cannot be read.
std::vector<std::string> read_lines(const std::string& path);

}  // namespace tandem::testbed
