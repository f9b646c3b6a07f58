// Metrics of one simulated run: pure arithmetic over session records and
// run-wide counters (definitions in metrics.h).
//
// Every output is finite: a ratio whose denominator is zero (no makespan, no
// prompt tokens, no engines, no tool calls) is 0, and a non-finite result from
// hostile inputs (NaN times from a caller bug in a release build) is replaced
// by 0 rather than leaking into the JSON other tools read.
#include "sim/metrics.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <initializer_list>
#include <limits>

namespace tandem::sim {
namespace {

// A session whose E2E equals N · T_ideal meets the SLO. finish − arrival is
// rounded, so "equal" is taken within a relative 1e-9: a session exactly on
// the bound must not be lost to the last bit of a subtraction.
constexpr double kSloTolerance = 1e-9;

double mean(std::span<const double> values) {
  if (values.empty()) return 0.0;
  double sum = 0.0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

// num / den, or 0 when the ratio is not defined.
double ratio(double num, double den) { return den > 0.0 ? num / den : 0.0; }

double finite_or_zero(double v) { return std::isfinite(v) ? v : 0.0; }

}  // namespace

Metrics compute_metrics(std::span<const SessionRecord> sessions, const RunCounters& counters) {
  Metrics m;
  if (sessions.empty()) return m;

  const std::size_t n = sessions.size();
  std::vector<double> e2e;
  e2e.reserve(n);
  std::vector<double> ttft;
  double slowdown_sum = 0.0;
  std::size_t met[3] = {0, 0, 0};
  double first_arrival = std::numeric_limits<double>::infinity();
  double last_finish = -std::numeric_limits<double>::infinity();
  std::uint64_t rounds = 0;

  for (const SessionRecord& s : sessions) {
    assert(s.finish_s >= s.arrival_s);
    assert(s.ideal_s > 0.0);
    double d = s.finish_s - s.arrival_s;
    e2e.push_back(d);
    if (s.ideal_s > 0.0) {
      slowdown_sum += d / s.ideal_s;
      for (int a = 1; a <= 3; ++a) {
        if (d <= a * s.ideal_s * (1.0 + kSloTolerance)) ++met[a - 1];
      }
    }
    first_arrival = std::min(first_arrival, s.arrival_s);
    last_finish = std::max(last_finish, s.finish_s);
    rounds += s.rounds;
    ttft.insert(ttft.end(), s.ttft_s.begin(), s.ttft_s.end());
  }

  m.sessions = n;
  m.e2e_mean_s = mean(e2e);
  std::vector<double> e2e_sorted = base::sorted_finite(e2e);
  m.e2e_p50_s = base::percentile_sorted(e2e_sorted, 50.0);
  m.e2e_p90_s = base::percentile_sorted(e2e_sorted, 90.0);
  m.e2e_p99_s = base::percentile_sorted(e2e_sorted, 99.0);
  m.slowdown_mean = slowdown_sum / static_cast<double>(n);

  // The one span every rate is taken over; ≤ 0 (a single instantaneous
  // session) leaves the rates at 0 rather than infinite.
  double makespan = last_finish - first_arrival;
  if (!(makespan > 0.0)) makespan = 0.0;
  m.makespan_s = makespan;
  m.goodput_a1 = ratio(static_cast<double>(met[0]), makespan);
  m.goodput_a2 = ratio(static_cast<double>(met[1]), makespan);
  m.goodput_a3 = ratio(static_cast<double>(met[2]), makespan);
  m.throughput_sps = ratio(static_cast<double>(n), makespan);
  m.rounds_per_min = ratio(static_cast<double>(rounds), makespan) * 60.0;
  m.tokens_per_s = ratio(static_cast<double>(counters.computed_tokens), makespan);

  m.ttft_mean_s = mean(ttft);
  m.ttft_p99_s = percentile(ttft, 99.0);

  m.kv_hit_rate = ratio(static_cast<double>(counters.reused_tokens), static_cast<double>(counters.prompt_tokens));
  m.recomputed_tokens = counters.recomputed_tokens;
  m.resume_recomputed_tokens = counters.resume_recomputed_tokens;
  m.preemptions = counters.preemptions;
  m.swaps = counters.swaps;
  m.pinned_block_seconds = counters.pinned_block_seconds;
  m.kv_waste_block_s = counters.pinned_block_seconds + counters.kv_waste_block_seconds;
  m.host_peak_blocks = counters.host_peak_blocks;
  m.gpu_busy = ratio(counters.gpu_busy_s, static_cast<double>(counters.engines) * makespan);
  m.tool_cpu_util = ratio(counters.tool_cpu_core_s, static_cast<double>(counters.tool_cores) * makespan);
  // No tool call with a nominal time: nothing was stretched, and 0 (not 1)
  // marks "no data" in the table and the JSON.
  m.tool_stretch_mean = counters.tool_stretch_calls > 0
                            ? counters.tool_stretch_sum / static_cast<double>(counters.tool_stretch_calls)
                            : 0.0;
  m.capped_rounds = counters.capped_rounds;
  m.host_memory = counters.host_memory;
  m.oom_kills = counters.oom_kills;
  m.oom_kills_over_host = counters.oom_kills_over_host;
  m.oom_kills_over_room = counters.oom_kills_over_room;
  m.memory_kills = counters.memory_kills;
  m.rerun_tool_s = counters.rerun_tool_s;
  m.frozen_s = counters.frozen_s;
  m.throttled_s = counters.throttled_s;
  m.stranded_block_s = counters.stranded_block_s;
  m.host_mem_peak_gib = counters.host_mem_peak_bytes / 1073741824.0;
  m.mem_psi_some_pct = 100.0 * ratio(counters.mem_psi_some_s, makespan);
  m.mem_psi_full_pct = 100.0 * ratio(counters.mem_psi_full_s, makespan);
  m.nodes = counters.nodes;
  m.moved_sessions = counters.moved_sessions;
  m.session_moves = counters.session_moves;

  for (double* v :
       {&m.e2e_mean_s,       &m.e2e_p50_s,   &m.e2e_p90_s,     &m.e2e_p99_s,         &m.slowdown_mean,
        &m.goodput_a1,       &m.goodput_a2,  &m.goodput_a3,    &m.throughput_sps,    &m.rounds_per_min,
        &m.tokens_per_s,     &m.ttft_mean_s, &m.ttft_p99_s,    &m.kv_hit_rate,       &m.pinned_block_seconds,
        &m.kv_waste_block_s, &m.gpu_busy,    &m.tool_cpu_util, &m.tool_stretch_mean, &m.makespan_s}) {
    *v = finite_or_zero(*v);
  }
  return m;
}

}  // namespace tandem::sim
