// The goal, checked on a report: at every load point `tandem` has the
// lowest mean E2E of all policies, goodput (α = 3) at least as high as every
// other policy, and throughput at least 0.97× the best; and at the knee — the
// first rate where the best other policy's mean slowdown exceeds 3 — its
// mean E2E is at least 1.5× lower than that policy's. Ablation variants are
// not competitors.
//
// Over several seeds every quantity is the mean over the seeds (each seed a
// different draw of sessions and arrivals, the same for every policy), with
// a 95 % interval (Student's t). A policy that failed at some seed (a
// livelock) counts at that rate as infinitely slow with no goodput; if
// `tandem` failed at some seed, every check at that rate fails.
//
// What counts as equal:
//   * values within 0.1 % (goodput and throughput divide by the makespan,
//     which one session finishing a fraction of a second later moves);
//   * at light load — the best other policy's mean slowdown at most 1.5,
//     where every policy runs sessions close to alone — also a difference
//     whose paired 95 % interval (per seed, tandem minus the other) contains
//     0: the seeds cannot tell the two apart. Above light load tandem must
//     be lower on the mean.
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
  std::size_t seeds = 0;  // seeds at which `ours` finished
  bool ours_failed = false;
  Stat ours_e2e;
  std::string best_other;  // lowest mean E2E among the others ("" if none finished)
  Stat best_other_e2e;     // mean +inf if none finished
  double best_other_slowdown = 0;
  double e2e_ratio = 0;  // best other's mean / ours (> 1: we are faster)
  Stat seed_ratio;       // per seed: best other / ours (paired)
  Stat e2e_diff;         // per seed: ours − best other (paired), seconds
  bool light = false;    // best other's mean slowdown ≤ 1.5
  Stat ours_goodput;
  double best_other_goodput = 0;  // α = 3, the highest mean among the others
  Stat ours_throughput;
  double best_throughput = 0;  // highest mean of all policies, ours included
  bool lowest_e2e = false;
  bool e2e_tie_by_interval = false;  // lowest_e2e only through the light-load interval rule
  bool goodput_ok = false;
  bool throughput_ok = false;
};

struct Verdict {
  std::string ours;
  std::size_t seeds = 0;             // distinct seeds in the report
  std::vector<VerdictPoint> points;  // by rate, every rate `ours` ran at
  std::optional<double> knee_rate;   // first rate where the best other's mean slowdown > 3
  double knee_ratio = 0;             // best other / ours (means) at the knee
  Stat knee_seed_ratio;              // per-seed ratio at the knee
  bool lowest_everywhere = false;
  bool goodput_everywhere = false;
  bool throughput_everywhere = false;
  bool knee_met = false;  // ratio ≥ 1.5 at the knee (false when no knee was reached)
};

Verdict judge(const Report& report, std::string_view ours = "tandem");
void print_verdict(std::ostream& os, const Verdict& v);

}  // namespace tandem::sim
