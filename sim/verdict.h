// The goal, checked on a report: at every load point `tandem` has the
// lowest mean E2E of all policies, goodput (α = 3) at least as high as every
// other policy, and throughput at least 0.97× the best; and at the knee — the
// first rate where the best other policy's mean slowdown exceeds 3 — its
// mean E2E is at least 1.5× lower than that policy's. Ablation variants are
// not competitors. A run that failed (a policy that livelocked) counts as
// infinitely slow with no goodput. Values within 0.1 % count as equal.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "sim/report.h"

namespace tandem::sim {

struct VerdictPoint {
  double rate = 0;
  double ours_e2e = 0;
  std::string best_other;     // lowest mean E2E among the others ("" if none finished)
  double best_other_e2e = 0;  // +inf if none finished
  double best_other_slowdown = 0;
  double e2e_ratio = 0;  // best other / ours (> 1: we are faster)
  double ours_goodput = 0;
  double best_other_goodput = 0;  // α = 3
  double ours_throughput = 0;
  double best_throughput = 0;  // of all policies, ours included
  bool lowest_e2e = false;
  bool goodput_ok = false;
  bool throughput_ok = false;
};

struct Verdict {
  std::string ours;
  std::vector<VerdictPoint> points;  // by rate; only rates where `ours` finished
  std::optional<double> knee_rate;   // first rate where the best other's slowdown > 3
  double knee_ratio = 0;             // best other / ours at the knee
  bool lowest_everywhere = false;
  bool goodput_everywhere = false;
  bool throughput_everywhere = false;
  bool knee_met = false;  // ratio ≥ 1.5 at the knee (false when no knee was reached)
};

Verdict judge(const Report& report, std::string_view ours = "tandem");
void print_verdict(std::ostream& os, const Verdict& v);

}  // namespace tandem::sim
