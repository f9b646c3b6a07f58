// The goal check of issues 4 and 20 on a report (the rules are in verdict.h).
#include "sim/verdict.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include <fmt/format.h>

namespace tandem::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kKneeSlowdown = 3.0;
constexpr double kKneeRatio = 1.5;
constexpr double kThroughputShare = 0.97;
constexpr double kLightSlowdown = 1.5;
// Values within 0.1 % are a tie: goodput and throughput divide by the
// makespan, which one session finishing a fraction of a second later moves.
constexpr double kTie = 1e-3;
bool at_most(double a, double b) { return a <= b * (1 + kTie); }
// The paired interval cannot tell the two apart.
bool interval_tie(const Stat& diff) { return diff.n >= 2 && std::fabs(diff.mean) <= diff.half; }

// One policy at one rate: its runs by seed, and whether any seed failed.
struct Entry {
  std::map<std::uint64_t, const Metrics*> by_seed;
  bool failed = false;
  double mean(double Metrics::*field) const {
    if (failed || by_seed.empty()) return field == &Metrics::goodput_a3 || field == &Metrics::throughput_sps ? 0 : kInf;
    double sum = 0;
    for (const auto& [seed, m] : by_seed) sum += m->*field;
    return sum / static_cast<double>(by_seed.size());
  }
};

Stat stat_over(const Entry& e, double Metrics::*field) {
  std::vector<double> v;
  v.reserve(e.by_seed.size());
  for (const auto& [seed, m] : e.by_seed) v.push_back(m->*field);
  return stat_of(v);
}

// Per seed where both finished: f(a, b).
template <class F>
Stat paired(const Entry& a, const Entry& b, F f) {
  std::vector<double> v;
  for (const auto& [seed, m] : a.by_seed) {
    auto it = b.by_seed.find(seed);
    if (it != b.by_seed.end()) v.push_back(f(*m, *it->second));
  }
  return stat_of(v);
}

}  // namespace

Verdict judge(const Report& report, std::string_view ours) {
  Verdict v;
  v.ours = std::string(ours);
  v.seeds = seed_count(report);
  std::map<double, std::map<std::string, Entry>> by_rate;
  for (const Run& r : report.runs) {
    if (r.variant.empty()) by_rate[r.rate][r.policy].by_seed[r.seed] = &r.metrics;
  }
  for (const FailedRun& f : report.failed) {
    if (f.variant.empty()) by_rate[f.rate][f.policy].failed = true;
  }
  v.lowest_everywhere = v.goodput_everywhere = v.throughput_everywhere = true;
  for (const auto& [rate, entries] : by_rate) {
    auto it = entries.find(v.ours);
    if (it == entries.end()) continue;
    const Entry& us = it->second;
    VerdictPoint p;
    p.rate = rate;
    p.seeds = us.by_seed.size();
    p.ours_failed = us.failed || us.by_seed.empty();
    p.ours_e2e = stat_over(us, &Metrics::e2e_mean_s);
    p.ours_goodput = stat_over(us, &Metrics::goodput_a3);
    p.ours_throughput = stat_over(us, &Metrics::throughput_sps);
    if (p.ours_failed) p.ours_e2e.mean = kInf;
    p.best_other_e2e.mean = kInf;
    p.best_throughput = us.mean(&Metrics::throughput_sps);
    const Entry* best = nullptr;
    const Entry* best_goodput = nullptr;
    bool any_other = false;
    for (const auto& [policy, e] : entries) {
      if (policy == v.ours) continue;
      any_other = true;
      const double e2e = e.mean(&Metrics::e2e_mean_s);
      if (e2e < p.best_other_e2e.mean) {
        best = &e;
        p.best_other = policy;
        p.best_other_e2e = stat_over(e, &Metrics::e2e_mean_s);
        p.best_other_slowdown = e.mean(&Metrics::slowdown_mean);
      }
      const double gp = e.mean(&Metrics::goodput_a3);
      if (best_goodput == nullptr || gp > p.best_other_goodput) {
        best_goodput = &e;
        p.best_other_goodput = gp;
      }
      p.best_throughput = std::max(p.best_throughput, e.mean(&Metrics::throughput_sps));
    }
    if (best == nullptr && any_other) p.best_other_slowdown = kInf;  // every other policy failed
    p.light = p.best_other_slowdown <= kLightSlowdown;
    if (!p.ours_failed) {
      p.e2e_ratio = p.ours_e2e.mean > 0 ? p.best_other_e2e.mean / p.ours_e2e.mean : 0;
      if (best != nullptr) {
        p.seed_ratio = paired(us, *best, [](const Metrics& a, const Metrics& b) {
          return a.e2e_mean_s > 0 ? b.e2e_mean_s / a.e2e_mean_s : 0.0;
        });
        p.e2e_diff = paired(us, *best, [](const Metrics& a, const Metrics& b) { return a.e2e_mean_s - b.e2e_mean_s; });
      }
      const bool strict = at_most(p.ours_e2e.mean, p.best_other_e2e.mean);
      p.e2e_tie_by_interval = !strict && p.light && interval_tie(p.e2e_diff);
      p.lowest_e2e = strict || p.e2e_tie_by_interval;
      bool gp_tie = false;
      if (best_goodput != nullptr && p.light) {
        gp_tie = interval_tie(
            paired(us, *best_goodput, [](const Metrics& a, const Metrics& b) { return a.goodput_a3 - b.goodput_a3; }));
      }
      p.goodput_ok = at_most(p.best_other_goodput, p.ours_goodput.mean) || gp_tie;
      p.throughput_ok = p.ours_throughput.mean >= kThroughputShare * p.best_throughput;
    }
    v.lowest_everywhere = v.lowest_everywhere && p.lowest_e2e;
    v.goodput_everywhere = v.goodput_everywhere && p.goodput_ok;
    v.throughput_everywhere = v.throughput_everywhere && p.throughput_ok;
    if (!v.knee_rate && p.best_other_slowdown > kKneeSlowdown) {
      v.knee_rate = rate;
      v.knee_ratio = p.e2e_ratio;
      v.knee_seed_ratio = p.seed_ratio;
    }
    v.points.push_back(p);
  }
  if (v.points.empty()) v.lowest_everywhere = v.goodput_everywhere = v.throughput_everywhere = false;
  v.knee_met = v.knee_rate.has_value() && v.knee_ratio >= kKneeRatio;
  return v;
}

void print_verdict(std::ostream& os, const Verdict& v) {
  if (v.points.empty()) {
    os << "\nno run of '" << v.ours << "' to judge\n";
    return;
  }
  const bool seeds = v.seeds > 1;
  os << fmt::format("\n{} against the best other policy at each rate (ablation variants excluded{})\n", v.ours,
                    seeds ? fmt::format("; means over {} seeds, ratio interval per seed", v.seeds) : "");
  os << fmt::format("{:>8}  {:>10}  {:<14} {:>10}  {:>7}  {:>15}  {:>9}  {:>9}  {:>9}\n", "rate", "e2e mean",
                    "best other", "its e2e", "ratio", seeds ? "ratio 95% CI" : "", "gp3 ours", "gp3 best", "thr/best");
  for (const VerdictPoint& p : v.points) {
    const std::string other = p.best_other.empty() ? "(none finished)" : p.best_other;
    const std::string ci =
        seeds && p.seed_ratio.n >= 2 ? fmt::format("{:.2f}-{:.2f}", p.seed_ratio.lo(), p.seed_ratio.hi()) : "";
    std::string note;
    if (p.ours_failed) {
      note = "  <- FAILED";
    } else if (!(p.lowest_e2e && p.goodput_ok && p.throughput_ok)) {
      note = "  <- short of the goal";
    } else if (p.e2e_tie_by_interval) {
      note = "  (tie within the interval, light load)";
    }
    os << fmt::format("{:>8.4g}  {:>10.1f}  {:<14} {:>10.1f}  {:>6.2f}x  {:>15}  {:>9.4g}  {:>9.4g}  {:>9.3f}{}\n",
                      p.rate, p.ours_e2e.mean, other, p.best_other_e2e.mean, p.e2e_ratio, ci, p.ours_goodput.mean,
                      p.best_other_goodput, p.best_throughput > 0 ? p.ours_throughput.mean / p.best_throughput : 0.0,
                      note);
  }
  auto yes = [](bool b) { return b ? "yes" : "NO"; };
  os << "(values within 0.1 % count as equal; at light load, best other's slowdown <= 1.5, so does a paired 95 % "
        "interval containing 0)\n";
  os << fmt::format(
      "lowest mean E2E at every rate: {}; goodput (a=3) >= every other: {}; throughput >= 0.97x best: {}\n",
      yes(v.lowest_everywhere), yes(v.goodput_everywhere), yes(v.throughput_everywhere));
  if (v.knee_rate) {
    const std::string ci = v.knee_seed_ratio.n >= 2 ? fmt::format(" (per-seed ratio {:.2f}-{:.2f})",
                                                                  v.knee_seed_ratio.lo(), v.knee_seed_ratio.hi())
                                                    : "";
    os << fmt::format("knee (best other's mean slowdown first > 3) at rate {:.4g}: {:.2f}x lower mean E2E{} ({})\n",
                      *v.knee_rate, v.knee_ratio, ci, v.knee_met ? "meets the 1.5x goal" : "SHORT of the 1.5x goal");
  } else {
    os << "knee not reached: every rate has an other policy with mean slowdown <= 3 (sweep higher)\n";
  }
}

}  // namespace tandem::sim
