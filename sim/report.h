// The output of tandem-sim: a human table on stdout, and on request JSON
// (the schema of issue 4, which other tools read), CSV and a gnuplot plot.
#pragma once

#include <map>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "sim/metrics.h"

namespace tandem::sim {

struct Run {
  std::string policy;        // registry name ("tandem", "fcfs", …)
  std::string variant;       // "" for a policy as configured; "-residency" etc. in an ablation
  double rate = 0.0;         // sessions per second offered
  std::size_t sessions = 0;  // sessions in the workload
  Metrics metrics;
  std::vector<double> e2e_s;  // every completed session's E2E, for the CDF
  double wall_s = 0.0;        // host seconds the simulation took
};

// A run that did not complete (a livelocked or deadlocked policy).
struct FailedRun {
  std::string policy;
  std::string variant;
  double rate = 0.0;
  std::string reason;
};

struct Report {
  std::string preset;
  std::string workload;
  std::vector<Run> runs;
  std::vector<FailedRun> failed;
};

// The label a run is shown under: policy + variant.
std::string run_label(const Run& run);

// Human table: one row per run, grouped by rate, columns for the headline
// metrics.
void print_table(std::ostream& os, const Report& report);

// {"preset","workload","runs":[{"policy","rate","sessions","metrics":{...}}]}
// with exactly the metric keys of issue 4 ("e2e_mean_s", …,
// "tool_stretch_mean") plus "variant", "rounds_per_min", "tokens_per_s", "tool_cpu_util",
// "makespan_s", "capped_rounds" and "completed"; runs that did not finish
// are listed under "failed" ({"policy","variant","rate","reason"}) when there
// are any. Errors name the path.
base::Result<void> write_json(const Report& report, const std::string& path);
// The text write_json writes.
std::string report_json(const Report& report);
// One header line, then one line per run: preset, workload, policy, variant,
// rate, sessions and every metric.
base::Result<void> write_csv(const Report& report, const std::string& path);
// Writes "<path>.tmp" and renames it over `path`; on failure the temporary is
// removed and `path` is left as it was. `what` says what is being written
// (it names the error).
base::Result<void> write_file_atomic(const std::string& path, std::string_view data, std::string_view what);
base::Result<std::string> read_file(const std::string& path);

// A PNG with three panels: mean E2E vs rate, goodput (α = 3) vs rate, one
// line per run label; and the E2E CDF of each label at the highest rate.
// Runs gnuplot (gnuplot-nox); the error says so when it is missing or fails.
base::Result<void> write_plot(const Report& report, const std::string& path);
// Runs gnuplot on `script` in a scratch directory holding `files` (name →
// contents); the script must write 'plot.png', which is moved to `path`.
// For other tools' plots (tandem-agents compare).
base::Result<void> render_gnuplot(const std::string& script, const std::map<std::string, std::string>& files,
                                  const std::string& path);
// "x fraction" lines of the empirical CDF of `values` (finite ones, sorted;
// starting at (min, 0)), for gnuplot's `with steps`; "" when none is finite.
std::string cdf_data(std::vector<double> values);

}  // namespace tandem::sim
