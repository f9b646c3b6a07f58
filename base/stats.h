// Order statistics of samples, the one definition every part of tandem uses:
// the simulator's and the live runs' metrics (sim/metrics.h), the benchmarks'
// medians and tails, and the tests that check distributions.
//
// percentile() is numpy's default ("linear"): the value at fractional rank
// (n − 1) · p / 100, interpolated between the two closest samples. NaN
// samples are ignored (they have no place in an order); an empty set gives 0.
// median() is percentile(50): the mean of the two middle samples when n is
// even. summarize() takes the usual set of them at once (p50, p90, p99, min,
// max, mean), and summarize_ns_as_us() does so for nanosecond samples (the
// benchmarks' latencies), reporting microseconds.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tandem::base {

// p in [0, 100]; `values` is copied and sorted.
double percentile(std::span<const double> values, double p);
double median(std::span<const double> values);

// The same on samples already sorted ascending and free of NaN, for callers
// that take several percentiles of one set.
double percentile_sorted(std::span<const double> sorted, double p);
// `values` without NaN, sorted ascending.
std::vector<double> sorted_finite(std::span<const double> values);

// The order statistics and mean of one set of samples, in the samples' unit.
// NaN samples are left out of all of them (and of count); an empty set gives
// all zeros.
struct Summary {
  std::size_t count = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double min = 0;
  double max = 0;
  double mean = 0;
};
Summary summarize(std::span<const double> values);
// Nanosecond samples summarised in microseconds (each sample / 1000).
Summary summarize_ns_as_us(std::span<const std::int64_t> ns);

}  // namespace tandem::base
