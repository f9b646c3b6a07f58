// ToolDurationModel: empirical CDF blended with a log-normal prior.
#include "sched/tool_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tandem::sched {

ToolDurationModel::ToolDurationModel(ToolModelParams params)
    : params_(params), log_prior_median_(std::log(params.prior_median_s)), kinds_(params.max_kinds) {}

void ToolDurationModel::observe(ToolKind kind, Duration wall, std::uint32_t owner) {
  double s = std::max(0.0, base::to_seconds(wall));
  kinds_.use(kind, owner).add(s, params_.window);
  if (params_.pool_window > 0) pool_.add(s, params_.pool_window);
}

double ToolDurationModel::lognormal_cdf(double x_s) const {
  if (x_s <= 0) return 0;
  double z = (std::log(x_s) - log_prior_median_) / params_.prior_sigma;
  return 0.5 * std::erfc(-z / std::sqrt(2.0));
}

double ToolDurationModel::prior_cdf(double x_s, bool pooled) const {
  const double n = static_cast<double>(pool_.size());
  if (!pooled || n == 0) return lognormal_cdf(x_s);
  const double k0 = params_.prior_weight;
  return (n * empirical_cdf(pool_, x_s) + k0 * lognormal_cdf(x_s)) / (n + k0);
}

double ToolDurationModel::blended_cdf(const History* h, double x_s, bool pooled) const {
  const double n = h == nullptr ? 0.0 : static_cast<double>(h->size());
  const double k0 = params_.prior_weight;
  const double emp = n > 0 ? empirical_cdf(*h, x_s) : 0.0;
  return (n * emp + k0 * prior_cdf(x_s, pooled)) / (n + k0);
}

double ToolDurationModel::empirical_cdf(const History& h, double x_s) const {
  const std::vector<double>& v = h.sorted();
  auto it = std::upper_bound(v.begin(), v.end(), x_s);
  return static_cast<double>(it - v.begin()) / static_cast<double>(v.size());
}

double ToolDurationModel::cdf(ToolKind kind, Duration x, bool pooled) const {
  return blended_cdf(history(kind), base::to_seconds(x), pooled);
}

double ToolDurationModel::p_return_within(ToolKind kind, Duration elapsed, Duration horizon, bool pooled) const {
  const History* h = history(kind);
  double f_t = blended_cdf(h, base::to_seconds(elapsed), pooled);
  double survive = 1.0 - f_t;
  if (survive <= 1e-12) return 1.0;
  double p = (blended_cdf(h, base::to_seconds(elapsed + horizon), pooled) - f_t) / survive;
  return std::clamp(p, 0.0, 1.0);
}

double ToolDurationModel::mean_s(ToolKind kind, bool pooled) const {
  double k0 = params_.prior_weight;
  double prior_mean = params_.prior_median_s * std::exp(params_.prior_sigma * params_.prior_sigma / 2);
  if (pooled && !pool_.empty()) {
    double sum = 0;
    for (double v : pool_.sorted()) sum += v;
    const double n = static_cast<double>(pool_.size());
    prior_mean = (sum + k0 * prior_mean) / (n + k0);
  }
  const History* h = history(kind);
  if (h == nullptr || h->empty()) return prior_mean;
  const auto& s = h->sorted();
  double sum = 0;
  for (double v : s) sum += v;
  double n = static_cast<double>(s.size());
  return (sum + k0 * prior_mean) / (n + k0);
}

double ToolDurationModel::remaining_s(ToolKind kind, Duration elapsed, double cap_s, bool pooled) const {
  // E[T − t | T > t] = ∫_t^{t+cap} (1 − F(x)) dx / (1 − F(t)), the integral
  // on a geometric grid (the distributions are log-normal-like).
  const double t = std::max(0.0, base::to_seconds(elapsed));
  const History* h = history(kind);
  const double survive = 1.0 - blended_cdf(h, t, pooled);
  if (survive <= 1e-12 || cap_s <= 0) return 0.0;
  constexpr int kSteps = 64;
  const double first = std::max(1e-3, cap_s * 1e-4);
  const double ratio = std::pow(cap_s / first, 1.0 / kSteps);
  double integral = first * (1.0 - blended_cdf(h, t + first / 2, pooled));
  double lo = first;
  for (int i = 0; i < kSteps; ++i) {
    const double hi = lo * ratio;
    integral += (hi - lo) * (1.0 - blended_cdf(h, t + (lo + hi) / 2, pooled));
    lo = hi;
  }
  return std::min(cap_s, integral / survive);
}

std::size_t ToolDurationModel::samples(ToolKind kind) const {
  const History* h = history(kind);
  return h == nullptr ? 0 : h->size();
}

}  // namespace tandem::sched
