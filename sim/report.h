// The output of tandem-sim: a human table on stdout, and on request JSON
// (the schema of issue 4, which other tools read), CSV and a gnuplot plot.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <span>
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
  std::uint64_t seed = 1;    // the workload's seed (sessions drawn, arrivals)
  std::size_t sessions = 0;  // sessions in the workload
  Metrics metrics;
  std::vector<double> e2e_s;  // every completed session's E2E, for the CDF
  double wall_s = 0.0;        // host seconds the simulation took
  // A cluster run (sim/cluster.h): its router and node count; the rate is
  // per node. Empty and 0 for a node alone.
  std::string router;
  std::uint32_t nodes = 0;
};

// A run that did not complete (a livelocked or deadlocked policy).
struct FailedRun {
  std::string policy;
  std::string variant;
  double rate = 0.0;
  std::uint64_t seed = 1;
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

// Mean and 95 % confidence interval of one value over seeds: Student's t
// with n − 1 degrees of freedom. The half-width is 0 with fewer than two
// values (one seed says nothing about the spread).
struct Stat {
  double mean = 0.0;
  double half = 0.0;  // half-width of the 95 % interval
  std::size_t n = 0;
  double lo() const { return mean - half; }
  double hi() const { return mean + half; }
};
Stat stat_of(std::span<const double> values);
// The two-sided 95 % quantile of Student's t with `dof` degrees of freedom
// (1.96 beyond 30).
double t95(std::size_t dof);

// A metric of `m` by its JSON key ("e2e_mean_s", …); 0 for an unknown key.
double metric_value(const Metrics& m, std::string_view key);
// The JSON keys of the metrics, in schema order.
std::vector<std::string_view> metric_keys(bool host_memory = false, bool cluster = false);
// Whether any run of the report modelled host memory (its metrics carry it).
bool models_host_memory(const Report& report);
// Whether any run of the report is a cluster's (its metrics carry "nodes",
// "moved_sessions" and "session_moves").
bool models_cluster(const Report& report);

// One label (policy + variant) at one rate, over the seeds it ran with.
struct Summary {
  std::string policy;
  std::string variant;
  double rate = 0.0;
  std::size_t sessions = 0;
  std::vector<const Run*> runs;       // finished, by seed ascending
  std::vector<std::uint64_t> failed;  // seeds that did not finish
  // Over the finished seeds.
  Stat stat(std::string_view key) const;
};
// By rate ascending, labels in the order they first appear.
std::vector<Summary> summarize(const Report& report);
// The distinct seeds of the report's runs and failures.
std::size_t seed_count(const Report& report);

// Human table: one row per run, grouped by rate, columns for the headline
// metrics; with several seeds, one row per label and rate instead, each
// headline metric as mean ± the half-width of its 95 % interval.
void print_table(std::ostream& os, const Report& report);
// The cluster table (print_table ends with it when the report has cluster
// runs): per policy, node count, router and rate per node, the mean over
// seeds of E2E mean and p90, goodput, KV hit rate, recomputed tokens and
// moved sessions.
void print_cluster_table(std::ostream& os, const Report& report);

// {"preset","workload","runs":[{"policy","rate","seed","sessions","metrics":{...}}]}
// with exactly the metric keys of issue 4 ("e2e_mean_s", …,
// "tool_stretch_mean") plus "variant", "rounds_per_min", "tokens_per_s", "tool_cpu_util",
// "makespan_s", "capped_rounds" and "completed"; runs that did not finish
// are listed under "failed" ({"policy","variant","rate","seed","reason"})
// when there are any; "summary" holds one entry per label and rate
// ({"policy","variant","rate","seeds","failed","mean":{...},"ci95":{...}}:
// every metric's mean over the finished seeds and the half-width of its
// 95 % interval). Errors name the path.
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
