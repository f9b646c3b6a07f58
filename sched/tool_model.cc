// ToolDurationModel: empirical CDF blended with a log-normal prior.
#include "sched/tool_model.h"

#include <algorithm>
#include <cmath>

namespace tandem::sched {

void ToolDurationModel::observe(ToolKind kind, Duration wall) {
  double s = std::max(0.0, base::to_seconds(wall));
  History& h = kinds_[kind];
  h.recent.push_back(s);
  h.sorted.insert(std::upper_bound(h.sorted.begin(), h.sorted.end(), s), s);
  if (h.recent.size() > params_.window) {
    double old = h.recent.front();
    h.recent.pop_front();
    h.sorted.erase(std::lower_bound(h.sorted.begin(), h.sorted.end(), old));
  }
}

double ToolDurationModel::prior_cdf(double x_s) const {
  if (x_s <= 0) return 0;
  double z = (std::log(x_s) - std::log(params_.prior_median_s)) / params_.prior_sigma;
  return 0.5 * std::erfc(-z / std::sqrt(2.0));
}

double ToolDurationModel::empirical_cdf(const History& h, double x_s) const {
  auto it = std::upper_bound(h.sorted.begin(), h.sorted.end(), x_s);
  return static_cast<double>(it - h.sorted.begin()) / static_cast<double>(h.sorted.size());
}

double ToolDurationModel::cdf(ToolKind kind, Duration x) const {
  double xs = base::to_seconds(x);
  auto it = kinds_.find(kind);
  double n = it == kinds_.end() ? 0.0 : static_cast<double>(it->second.sorted.size());
  double k0 = params_.prior_weight;
  double emp = n > 0 ? empirical_cdf(it->second, xs) : 0.0;
  return (n * emp + k0 * prior_cdf(xs)) / (n + k0);
}

double ToolDurationModel::p_return_within(ToolKind kind, Duration elapsed, Duration horizon) const {
  double f_t = cdf(kind, elapsed);
  double survive = 1.0 - f_t;
  if (survive <= 1e-12) return 1.0;
  double p = (cdf(kind, elapsed + horizon) - f_t) / survive;
  return std::clamp(p, 0.0, 1.0);
}

double ToolDurationModel::mean_s(ToolKind kind) const {
  double k0 = params_.prior_weight;
  double prior_mean = params_.prior_median_s * std::exp(params_.prior_sigma * params_.prior_sigma / 2);
  auto it = kinds_.find(kind);
  if (it == kinds_.end() || it->second.sorted.empty()) return prior_mean;
  const auto& s = it->second.sorted;
  double sum = 0;
  for (double v : s) sum += v;
  double n = static_cast<double>(s.size());
  return (sum + k0 * prior_mean) / (n + k0);
}

std::size_t ToolDurationModel::samples(ToolKind kind) const {
  auto it = kinds_.find(kind);
  return it == kinds_.end() ? 0 : it->second.sorted.size();
}

}  // namespace tandem::sched
