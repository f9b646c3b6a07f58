// SortedWindow: the newest samples of a stream, kept sorted, for empirical
// CDFs and order statistics over a bounded window (the tool-duration model's
// histories, Continuum's dynamic TTL).
//
// Thread-safety: one thread.
#pragma once

#include <cstddef>
#include <deque>
#include <vector>

namespace tandem::sched {

class SortedWindow {
 public:
  // Adds `x`; past `window` samples the oldest makes way for it.
  void add(double x, std::size_t window);

  const std::vector<double>& sorted() const { return sorted_; }  // ascending
  std::size_t size() const { return sorted_.size(); }
  bool empty() const { return sorted_.empty(); }

 private:
  std::deque<double> recent_;   // arrival order, oldest first
  std::vector<double> sorted_;  // the same samples, ascending
};

}  // namespace tandem::sched
