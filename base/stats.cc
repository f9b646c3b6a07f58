// Order statistics (base/stats.h).
#include "base/stats.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace tandem::base {

double percentile_sorted(std::span<const double> sorted, double p) {
  if (sorted.empty()) return 0.0;
  if (!(p > 0.0)) return sorted.front();  // also catches a NaN p
  if (p >= 100.0) return sorted.back();
  const double h = static_cast<double>(sorted.size() - 1) * p / 100.0;
  const auto lo = static_cast<std::size_t>(std::floor(h));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = h - static_cast<double>(lo);
  if (frac == 0.0 || hi == lo) return sorted[lo];
  return sorted[lo] + frac * (sorted[hi] - sorted[lo]);
}

std::vector<double> sorted_finite(std::span<const double> values) {
  std::vector<double> out;
  out.reserve(values.size());
  // NaN has no place in a strict weak order; std::sort on it is undefined.
  for (double v : values) {
    if (!std::isnan(v)) out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

double percentile(std::span<const double> values, double p) { return percentile_sorted(sorted_finite(values), p); }

double median(std::span<const double> values) { return percentile(values, 50.0); }

Summary summarize(std::span<const double> values) {
  const std::vector<double> sorted = sorted_finite(values);
  Summary s;
  s.count = sorted.size();
  if (sorted.empty()) return s;
  s.p50 = percentile_sorted(sorted, 50.0);
  s.p90 = percentile_sorted(sorted, 90.0);
  s.p99 = percentile_sorted(sorted, 99.0);
  s.min = sorted.front();
  s.max = sorted.back();
  double sum = 0;
  for (double v : sorted) sum += v;
  s.mean = sum / static_cast<double>(sorted.size());
  return s;
}

Summary summarize_ns_as_us(std::span<const std::int64_t> ns) {
  std::vector<double> us;
  us.reserve(ns.size());
  for (const std::int64_t v : ns) us.push_back(static_cast<double>(v) / 1e3);
  return summarize(us);
}

}  // namespace tandem::base
