// contention_bench: how far live CPU contention on a tool core departs from
// the simulator's processor-sharing model (sim::CpuPool, docs/sim.md "Tools";
// issue 22: "calibrate the CPU model against live runs, and show the fit").
//
// What it does. All tools run on one core (--core, default the machine's
// last CPU); this process stays off it. For each offered load ρ in --loads
// (cores of demand, e.g. 0.5 = the core half busy on average), tool calls
// arrive as a Poisson process for --seconds. Each call draws a CPU demand d
// (0.1, 0.25, 0.5 or 1 core, uniformly) and a nominal wall time Y
// (log-normal, median --median-ms, σ 1, clamped to [5 ms, 4 s]), and runs
// as `tandem-toolburn --cpu-seconds d·Y --wall-seconds Y [--mem-mb d·M]
// --report` (the replay's stand-in tool, testbed/toolburn.h), forked and
// exec'd pinned to the core. The arrival rate is ρ / E[d·Y].
//
// Per call it records the spawn time (before fork), the reap time (the
// child's pidfd readable) and the tool's own wall time from its report, so
//   live wall   = reap − spawn
//   start cost  = live wall − own wall (fork, exec, the runtime's start, and
//                 the wait for the core before the tool's main runs).
// The same calls, with the same spawn times, demands and nominal times, then
// run through sim::CpuPool on one core with equal weights (CFS's share per
// task in one cgroup) twice: processor sharing alone, and with each call's
// start phase (CpuPool::start's start_cpu_s) set to the start CPU this run
// measured: the median over the calls of their CPU beyond d·Y. Nothing is
// fitted.
//
// The table, per load: calls, the core's measured busy share, the tools the
// model had running at each start (mean), live and predicted mean stretch
// (wall / Y) under both models and their ratios, the start cost p50/p90, and
// live / (sharing + start) per demand class. docs/sim.md "Calibration
// against live contention" has what it measured. --json FILE writes every
// call and every level.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/parse.h"
#include "base/stats.h"
#include "sim/cpu_pool.h"

namespace tandem::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;

struct Options {
  std::vector<double> loads{0.25, 0.5, 0.75, 0.9, 1.1, 1.4};
  double seconds = 20;
  double median_ms = 100;
  unsigned mem_mb_per_core = 0;
  int core = -1;
  std::uint64_t seed = 1;
  std::string json;
  std::string toolburn = TOOLBURN_PATH;
  bool quick = false;
};

struct Call {
  double load = 0;
  double demand = 0;
  double nominal_s = 0;
  double spawn_s = 0;  // seconds since the run's start
  double reap_s = 0;
  double own_wall_s = 0;
  double cpu_s = 0;  // user + system of the child
  // The model's view.
  double predicted_s = 0;        // processor sharing alone
  double predicted_start_s = 0;  // with the start phase
  std::size_t running = 0;       // tools running in the model when it started
  bool ok = false;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "contention_bench: %s\n", what.c_str());
  std::exit(1);
}

double parse_number(const char* flag, std::string_view text, double lo, double hi) {
  const auto v = base::parse_double(text);
  if (!v || *v < lo || *v > hi) die(fmt::format("{}: '{}' is not a number in [{}, {}]", flag, text, lo, hi));
  return *v;
}

std::vector<double> parse_loads(const char* flag, std::string_view text) {
  std::vector<double> out;
  for (std::string_view item : base::split(text, ',')) {
    const auto v = base::parse_double(item);
    if (!v || *v <= 0 || *v > 16) die(fmt::format("{}: '{}' is not a load in (0, 16] cores", flag, item));
    out.push_back(*v);
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf(
          "contention_bench [--loads 0.25,0.5,...] [--seconds S] [--median-ms M] [--mem-mb-per-core M]\n"
          "                 [--core N] [--seed N] [--json FILE] [--toolburn PATH] [--quick]\n"
          "Poisson tool calls (tandem-toolburn) on one pinned core at each offered load, live wall\n"
          "time against sim::CpuPool's prediction for the same calls, with and without the calls'\n"
          "start phase (their CPU beyond d*Y, measured in the run).\n");
      std::exit(0);
    } else if (a == "--loads") {
      o.loads = parse_loads("--loads", value());
    } else if (a == "--seconds") {
      o.seconds = parse_number("--seconds", value(), 1, 3600);
    } else if (a == "--median-ms") {
      o.median_ms = parse_number("--median-ms", value(), 5, 4000);
    } else if (a == "--mem-mb-per-core") {
      o.mem_mb_per_core = static_cast<unsigned>(parse_number("--mem-mb-per-core", value(), 0, 4096));
    } else if (a == "--core") {
      o.core = static_cast<int>(parse_number("--core", value(), 0, CPU_SETSIZE - 1));
    } else if (a == "--seed") {
      o.seed = static_cast<std::uint64_t>(parse_number("--seed", value(), 0, 1e15));
    } else if (a == "--json") {
      o.json = value();
    } else if (a == "--toolburn") {
      o.toolburn = value();
    } else if (a == "--quick") {
      o.quick = true;
    } else {
      die("unknown flag " + a + " (--help)");
    }
  }
  if (o.quick) {
    o.loads = {0.5, 1.2};
    o.seconds = 2;
  }
  return o;
}

double now_s(SteadyClock::time_point origin) {
  return std::chrono::duration<double>(SteadyClock::now() - origin).count();
}

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

struct Child {
  pid_t pid = -1;
  int pidfd = -1;
  int out = -1;  // read end of the child's stdout
  std::size_t call = 0;
};

// Forks and execs the tool pinned to `core`; its stdout is a pipe.
Child spawn(const Options& o, const Call& c, std::size_t index, int core) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) die(fmt::format("pipe2: {}", std::strerror(errno)));
  const std::string cpu = fmt::format("{:.6f}", c.demand * c.nominal_s);
  const std::string wall = fmt::format("{:.6f}", c.nominal_s);
  const std::string mem = std::to_string(static_cast<unsigned>(std::lround(c.demand * o.mem_mb_per_core)));
  std::vector<const char*> args{o.toolburn.c_str(), "--cpu-seconds", cpu.c_str(),
                                "--wall-seconds",   wall.c_str(),    "--report"};
  if (o.mem_mb_per_core > 0) {
    args.push_back("--mem-mb");
    args.push_back(mem.c_str());
  }
  args.push_back(nullptr);
  const pid_t bench = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) die(fmt::format("fork: {}", std::strerror(errno)));
  if (pid == 0) {
    // The tool dies with the bench (killed, or stopped by a signal), so none
    // is left burning the core.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != bench) ::_exit(126);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    if (::sched_setaffinity(0, sizeof(set), &set) != 0) ::_exit(126);
    if (::dup2(pipefd[1], STDOUT_FILENO) < 0) ::_exit(126);
    ::execv(args[0], const_cast<char* const*>(args.data()));
    ::_exit(127);
  }
  ::close(pipefd[1]);
  Child ch;
  ch.pid = pid;
  ch.pidfd = pidfd_open(pid);
  if (ch.pidfd < 0) die(fmt::format("pidfd_open: {}", std::strerror(errno)));
  ch.out = pipefd[0];
  ch.call = index;
  return ch;
}

// Reaps a child whose pidfd is readable: its rusage, its report.
void reap(Child& ch, Call& c, SteadyClock::time_point origin) {
  c.reap_s = now_s(origin);
  int status = 0;
  rusage ru{};
  if (::wait4(ch.pid, &status, 0, &ru) != ch.pid) die(fmt::format("wait4: {}", std::strerror(errno)));
  c.cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
            static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  std::string text;
  std::array<char, 1024> buf{};
  for (;;) {
    const ssize_t n = ::read(ch.out, buf.data(), buf.size());
    if (n <= 0) break;
    text.append(buf.data(), static_cast<std::size_t>(n));
  }
  ::close(ch.out);
  ::close(ch.pidfd);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "contention_bench: a tool exited with status %d (%s)\n", status, text.c_str());
    return;
  }
  const auto report = nlohmann::json::parse(text, nullptr, false);
  if (report.is_discarded() || !report.contains("wall_s")) {
    std::fprintf(stderr, "contention_bench: a tool's report is not JSON: %s\n", text.c_str());
    return;
  }
  c.own_wall_s = report["wall_s"].get<double>();
  c.ok = true;
}

// Runs one load level's calls live; their spawn times are set on the way.
void run_live(const Options& o, std::vector<Call>& calls, std::size_t first, int core, SteadyClock::time_point origin,
              const std::vector<double>& arrivals) {
  std::vector<Child> children;
  std::size_t next = 0;
  const double t0 = now_s(origin);
  while (next < arrivals.size() || !children.empty()) {
    const double now = now_s(origin);
    if (next < arrivals.size() && now >= t0 + arrivals[next]) {
      Call& c = calls[first + next];
      c.spawn_s = now_s(origin);
      children.push_back(spawn(o, c, first + next, core));
      ++next;
      continue;
    }
    int timeout_ms = 100;
    if (next < arrivals.size()) {
      timeout_ms = std::max(0, static_cast<int>(std::ceil((t0 + arrivals[next] - now) * 1000)));
    }
    std::vector<pollfd> fds;
    fds.reserve(children.size());
    for (const Child& ch : children) fds.push_back({ch.pidfd, POLLIN, 0});
    const int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) die(fmt::format("poll: {}", std::strerror(errno)));
    for (std::size_t i = fds.size(); i-- > 0;) {
      if ((fds[i].revents & POLLIN) == 0) continue;
      reap(children[i], calls[children[i].call], origin);
      children.erase(children.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
}

// The same calls through the model: one core, equal weights (CFS's share per
// task in one cgroup). With start_cpu_s > 0 each call first runs a start
// phase of that much CPU at one full core (sim::CpuPool::start), then
// its body, d cores for Y seconds. Returns each call's predicted wall.
std::vector<double> predict(const std::vector<Call>& calls, std::size_t first, std::size_t count, double start_cpu_s,
                            std::vector<std::size_t>* running) {
  sim::CpuPool pool(1.0);
  const auto at = [](double s) { return base::from_ns(static_cast<std::int64_t>(std::llround(s * 1e9))); };
  std::vector<std::size_t> order(count);
  for (std::size_t i = 0; i < count; ++i) order[i] = first + i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return calls[a].spawn_s < calls[b].spawn_s; });
  std::vector<double> wall(calls.size(), 0);
  const auto finish = [&](double until) {
    while (auto next = pool.next_completion()) {
      const double t = base::to_seconds(next->time_since_epoch());
      if (t > until) break;
      for (std::uint64_t id : pool.complete(*next)) wall[id] = t - calls[id].spawn_s;
    }
  };
  for (std::size_t id : order) {
    const Call& c = calls[id];
    finish(c.spawn_s);
    if (running != nullptr) (*running)[id] = pool.running();
    pool.start(id, id, c.demand, c.nominal_s, at(c.spawn_s), start_cpu_s);
  }
  finish(1e18);
  return wall;
}

int pick_core(const Options& o) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) die(fmt::format("sched_getaffinity: {}", std::strerror(errno)));
  if (o.core >= 0) {
    if (!CPU_ISSET(o.core, &set)) die(fmt::format("--core {}: not a CPU this process may use", o.core));
    return o.core;
  }
  int last = -1;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (CPU_ISSET(i, &set)) last = i;
  }
  return last;
}

// This process (and its threads) off the tool core, when there is another.
void leave_core(int core) {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return;
  if (CPU_COUNT(&set) < 2) {
    std::fprintf(stderr, "contention_bench: one CPU only; the bench shares the tool core\n");
    return;
  }
  CPU_CLR(core, &set);
  (void)::sched_setaffinity(0, sizeof(set), &set);
}

int main_impl(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (::access(o.toolburn.c_str(), X_OK) != 0) die(fmt::format("--toolburn {}: not executable", o.toolburn));
  const int core = pick_core(o);
  leave_core(core);

  const std::array<double, 4> demands{0.1, 0.25, 0.5, 1.0};
  const double sigma = 1.0;
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<std::size_t> pick(0, demands.size() - 1);
  std::normal_distribution<double> normal(0.0, 1.0);
  // E[d·Y]: d and Y independent; Y's clamp is ignored (it moves E[Y] < 1 %).
  double mean_demand = 0;
  for (double d : demands) mean_demand += d / static_cast<double>(demands.size());
  const double mean_y = o.median_ms / 1000.0 * std::exp(sigma * sigma / 2);

  std::vector<Call> calls;
  std::vector<std::pair<std::size_t, std::size_t>> levels;  // first, count
  const auto origin = SteadyClock::now();
  std::printf("tool core %d, %zu loads × %.0f s, Y median %.0f ms, memory %u MiB per core of demand\n", core,
              o.loads.size(), o.seconds, o.median_ms, o.mem_mb_per_core);
  for (double load : o.loads) {
    const double rate = load / (mean_demand * mean_y);
    std::exponential_distribution<double> gap(rate);
    std::vector<double> arrivals;
    for (double t = gap(rng); t < o.seconds; t += gap(rng)) arrivals.push_back(t);
    const std::size_t first = calls.size();
    for (std::size_t i = 0; i < arrivals.size(); ++i) {
      Call c;
      c.load = load;
      c.demand = demands[pick(rng)];
      c.nominal_s = std::clamp(o.median_ms / 1000.0 * std::exp(sigma * normal(rng)), 0.005, 4.0);
      calls.push_back(c);
    }
    run_live(o, calls, first, core, origin, arrivals);
    levels.emplace_back(first, arrivals.size());
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the core settles between levels
  }

  // The start phase's CPU is measured, not fitted: the median over every
  // call of its CPU beyond d·Y (fork, exec, the runtime, the report).
  std::vector<double> extra;
  for (const Call& c : calls) {
    if (c.ok) extra.push_back(c.cpu_s - c.demand * c.nominal_s);
  }
  const double start_cpu = extra.empty() ? 0 : std::max(0.0, base::median(extra));
  std::vector<std::size_t> running(calls.size(), 0);
  for (const auto& [first, count] : levels) {
    const auto plain = predict(calls, first, count, 0, &running);
    const auto started = predict(calls, first, count, start_cpu, nullptr);
    for (std::size_t i = first; i < first + count; ++i) {
      calls[i].predicted_s = plain[i];
      calls[i].predicted_start_s = started[i];
      calls[i].running = running[i];
    }
  }
  std::printf("\nstart phase: %.1f ms of CPU per call (median CPU beyond d·Y, measured)\n", start_cpu * 1000);
  std::printf("stretch = wall / Y, means over the calls; ratio = live / model; by demand: live / (PS+start)\n");
  std::printf("\n%5s %5s %5s %6s | %6s %6s %6s | %6s %6s | %7s %7s | %5s %5s %5s %5s\n", "load", "calls", "busy", "N",
              "live", "PS", "PS+st", "ratio", "ratio", "start50", "start90", "d.1", "d.25", "d.5", "d1");
  std::printf("%5s %5s %5s %6s | %6s %6s %6s | %6s %6s | %7s %7s |\n", "", "", "", "", "", "", "", "PS", "PS+st", "ms",
              "ms");
  nlohmann::json jlevels = nlohmann::json::array();
  for (const auto& [first, count] : levels) {
    std::vector<double> live, ps, pst, start;
    double cpu = 0, n = 0, t_min = 1e18, t_max = 0;
    std::array<double, 4> by_live{}, by_model{};
    for (std::size_t i = first; i < first + count; ++i) {
      const Call& c = calls[i];
      if (!c.ok) continue;
      const double wall = c.reap_s - c.spawn_s;
      live.push_back(wall / c.nominal_s);
      ps.push_back(c.predicted_s / c.nominal_s);
      pst.push_back(c.predicted_start_s / c.nominal_s);
      start.push_back((wall - c.own_wall_s) * 1000);
      for (std::size_t k = 0; k < demands.size(); ++k) {
        if (c.demand != demands[k]) continue;
        by_live[k] += wall;
        by_model[k] += c.predicted_start_s;
      }
      cpu += c.cpu_s;
      n += static_cast<double>(c.running);
      t_min = std::min(t_min, c.spawn_s);
      t_max = std::max(t_max, c.reap_s);
    }
    if (live.empty()) continue;
    const double busy = cpu / std::max(1e-9, t_max - t_min);
    const double load = calls[first].load;
    const double live_mean = base::summarize(live).mean;
    const double ps_mean = base::summarize(ps).mean;
    const double pst_mean = base::summarize(pst).mean;
    const base::Summary start_ms = base::summarize(start);
    std::printf("%5.2f %5zu %4.0f%% %6.2f | %6.2f %6.2f %6.2f | %5.2f× %5.2f× | %7.1f %7.1f |", load, live.size(),
                busy * 100, n / static_cast<double>(live.size()), live_mean, ps_mean, pst_mean, live_mean / ps_mean,
                live_mean / pst_mean, start_ms.p50, start_ms.p90);
    nlohmann::json by_demand = nlohmann::json::object();
    for (std::size_t k = 0; k < demands.size(); ++k) {
      const double r = by_model[k] > 0 ? by_live[k] / by_model[k] : 0;
      std::printf(" %5.2f", r);
      by_demand[fmt::format("{}", demands[k])] = r;
    }
    std::printf("\n");
    jlevels.push_back({{"load", load},
                       {"calls", live.size()},
                       {"busy", busy},
                       {"model_running_mean", n / static_cast<double>(live.size())},
                       {"live_stretch_mean", live_mean},
                       {"ps_stretch_mean", ps_mean},
                       {"ps_start_stretch_mean", pst_mean},
                       {"start_ms_p50", start_ms.p50},
                       {"start_ms_p90", start_ms.p90},
                       {"live_over_ps_start_by_demand", by_demand}});
  }
  if (!o.json.empty()) {
    nlohmann::json jcalls = nlohmann::json::array();
    for (const Call& c : calls) {
      if (!c.ok) continue;
      jcalls.push_back({{"load", c.load},
                        {"demand", c.demand},
                        {"nominal_s", c.nominal_s},
                        {"live_s", c.reap_s - c.spawn_s},
                        {"own_wall_s", c.own_wall_s},
                        {"cpu_s", c.cpu_s},
                        {"ps_s", c.predicted_s},
                        {"ps_start_s", c.predicted_start_s},
                        {"running", c.running}});
    }
    nlohmann::json out = {{"core", core},
                          {"seconds", o.seconds},
                          {"median_ms", o.median_ms},
                          {"mem_mb_per_core", o.mem_mb_per_core},
                          {"seed", o.seed},
                          {"start_cpu_s", start_cpu},
                          {"levels", jlevels},
                          {"calls", jcalls}};
    std::ofstream(o.json) << out.dump(1) << "\n";
  }
  std::size_t failed = 0;
  for (const Call& c : calls) failed += c.ok ? 0 : 1;
  if (failed > 0) {
    std::fprintf(stderr, "contention_bench: %zu tool calls failed\n", failed);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  try {
    return tandem::bench::main_impl(argc, argv);
  } catch (const std::exception& e) {  // bad_alloc, a JSON writer's error: the tools die with the bench
    std::fprintf(stderr, "contention_bench: %s\n", e.what());
    return 1;
  }
}
