// Order statistics of samples, the one definition every part of tandem uses:
// the simulator's and the live runs' metrics (sim/metrics.h), the benchmarks'
// medians and tails, and the tests that check distributions.
//
// percentile() is numpy's default ("linear"): the value at fractional rank
// (n − 1) · p / 100, interpolated between the two closest samples. NaN
// samples are ignored (they have no place in an order); an empty set gives 0.
// median() is percentile(50): the mean of the two middle samples when n is
// even.
//
// Thread-safety: pure functions.
#pragma once

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

}  // namespace tandem::base
