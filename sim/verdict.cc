// The goal check of issue 4 on a report.
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
// Values within 0.1 % are a tie: goodput and throughput divide by the
// makespan, which one session finishing a fraction of a second later moves.
constexpr double kTie = 1e-3;
bool at_most(double a, double b) { return a <= b * (1 + kTie); }

}  // namespace

Verdict judge(const Report& report, std::string_view ours) {
  Verdict v;
  v.ours = std::string(ours);
  // rate → policy → run (finished runs); rate → failed policies.
  std::map<double, std::map<std::string, const Run*>> by_rate;
  std::map<double, std::vector<std::string>> failed;
  for (const Run& r : report.runs) {
    if (r.variant.empty()) by_rate[r.rate][r.policy] = &r;
  }
  for (const FailedRun& f : report.failed) {
    if (f.variant.empty()) failed[f.rate].push_back(f.policy);
  }
  v.lowest_everywhere = v.goodput_everywhere = v.throughput_everywhere = true;
  for (const auto& [rate, runs] : by_rate) {
    auto it = runs.find(v.ours);
    if (it == runs.end()) continue;
    const Metrics& m = it->second->metrics;
    VerdictPoint p;
    p.rate = rate;
    p.ours_e2e = m.e2e_mean_s;
    p.ours_goodput = m.goodput_a3;
    p.ours_throughput = m.throughput_sps;
    p.best_other_e2e = kInf;
    p.best_throughput = m.throughput_sps;
    for (const auto& [policy, run] : runs) {
      if (policy == v.ours) continue;
      const Metrics& o = run->metrics;
      if (o.e2e_mean_s < p.best_other_e2e) {
        p.best_other_e2e = o.e2e_mean_s;
        p.best_other = policy;
        p.best_other_slowdown = o.slowdown_mean;
      }
      p.best_other_goodput = std::max(p.best_other_goodput, o.goodput_a3);
      p.best_throughput = std::max(p.best_throughput, o.throughput_sps);
    }
    if (p.best_other.empty() && failed.contains(rate)) p.best_other_slowdown = kInf;
    p.e2e_ratio = p.ours_e2e > 0 ? p.best_other_e2e / p.ours_e2e : 0;
    p.lowest_e2e = at_most(p.ours_e2e, p.best_other_e2e);
    p.goodput_ok = at_most(p.best_other_goodput, p.ours_goodput);
    p.throughput_ok = p.ours_throughput >= kThroughputShare * p.best_throughput;
    v.lowest_everywhere = v.lowest_everywhere && p.lowest_e2e;
    v.goodput_everywhere = v.goodput_everywhere && p.goodput_ok;
    v.throughput_everywhere = v.throughput_everywhere && p.throughput_ok;
    if (!v.knee_rate && p.best_other_slowdown > kKneeSlowdown) {
      v.knee_rate = rate;
      v.knee_ratio = p.e2e_ratio;
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
  os << fmt::format("\n{} against the best other policy at each rate (ablation variants excluded)\n", v.ours);
  os << fmt::format("{:>8}  {:>10}  {:<14} {:>10}  {:>7}  {:>9}  {:>9}  {:>9}\n", "rate", "e2e mean", "best other",
                    "its e2e", "ratio", "gp3 ours", "gp3 best", "thr/best");
  for (const VerdictPoint& p : v.points) {
    const std::string other = p.best_other.empty() ? "(none finished)" : p.best_other;
    os << fmt::format("{:>8.4g}  {:>10.1f}  {:<14} {:>10.1f}  {:>6.2f}x  {:>9.4g}  {:>9.4g}  {:>9.3f}{}\n", p.rate,
                      p.ours_e2e, other, p.best_other_e2e, p.e2e_ratio, p.ours_goodput, p.best_other_goodput,
                      p.best_throughput > 0 ? p.ours_throughput / p.best_throughput : 0.0,
                      p.lowest_e2e && p.goodput_ok && p.throughput_ok ? "" : "  <- short of the goal");
  }
  auto yes = [](bool b) { return b ? "yes" : "NO"; };
  os << "(values within 0.1 % count as equal)\n";
  os << fmt::format(
      "lowest mean E2E at every rate: {}; goodput (a=3) >= every other: {}; throughput >= 0.97x best: {}\n",
      yes(v.lowest_everywhere), yes(v.goodput_everywhere), yes(v.throughput_everywhere));
  if (v.knee_rate) {
    os << fmt::format("knee (best other's mean slowdown first > 3) at rate {:.4g}: {:.2f}x lower mean E2E ({})\n",
                      *v.knee_rate, v.knee_ratio, v.knee_met ? "meets the 1.5x goal" : "SHORT of the 1.5x goal");
  } else {
    os << "knee not reached: every rate has an other policy with mean slowdown <= 3 (sweep higher)\n";
  }
}

}  // namespace tandem::sim
