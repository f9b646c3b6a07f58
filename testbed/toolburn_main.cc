// tandem-toolburn: replays one tool call of an agent trace as real CPU and
// memory load (the model is in testbed/toolburn.h). Bad flags exit 2 having
// done nothing; a runtime failure (the mapping, a thread) exits 1. With
// --report it prints one JSON line on stdout at the end.
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "testbed/toolburn.h"

namespace {

int fail(int status, const std::string& message) {
  std::fprintf(stderr, "tandem-toolburn: %s\n", message.c_str());
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  namespace tb = tandem::testbed;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  const auto options = tb::parse_burn_flags(args);
  if (!options) return fail(2, options.error());
  if (options->help) {
    std::fputs(tb::burn_usage().c_str(), stdout);
    return 0;
  }
  const auto plan = tb::plan_burn(*options);
  if (!plan) return fail(2, plan.error());

  // The main thread's CPU from here on (touching the memory) is part of its share.
  const double cpu_base_s = tb::thread_cpu_seconds();
  // Mapped until exit; with --mem-burst only the base is resident at first.
  auto memory = tb::TouchedMemory::create(options->mem_mb, options->burst ? options->mem_base_mb : options->mem_mb);
  if (!memory) return fail(1, memory.error());
  struct Shape {
    const tb::BurnOptions* options;
    tb::TouchedMemory* memory;
  } shape{&*options, &*memory};
  tb::CycleHook hook;
  if (options->burst && options->mem_mb > 0) {
    hook.cycle_s = options->wall_s / static_cast<double>(plan->cycles);
    hook.ctx = &shape;
    hook.fn = [](void* ctx, double progress_s) {
      const auto& s = *static_cast<Shape*>(ctx);
      s.memory->hold(tb::burst_bytes_at(s.options->burst, static_cast<std::size_t>(s.options->mem_base_mb) << 20,
                                        static_cast<std::size_t>(s.options->mem_mb) << 20, progress_s));
    };
  }
  if (auto r = tb::run_burn(*plan, cpu_base_s, hook); !r) return fail(1, r.error());

  if (options->report) {
    tb::BurnReport report;
    report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report.cpu_s = tb::process_cpu_seconds();
    report.mem_mb = options->mem_mb;
    report.threads = plan->threads;
    report.cycles = plan->cycles;
    report.cgroup = tb::read_lines("/proc/self/cgroup");
    const std::string line = tb::burn_report_json(report) + "\n";
    if (std::fputs(line.c_str(), stdout) < 0 || std::fflush(stdout) != 0) return fail(1, "cannot write the report");
  }
  return 0;
}
