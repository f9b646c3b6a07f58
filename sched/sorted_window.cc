#include "sched/sorted_window.h"

#include <algorithm>

namespace tandem::sched {

void SortedWindow::add(double x, std::size_t window) {
  std::vector<double>& v = sorted_;
  recent_.push_back(x);
  if (recent_.size() <= window) {
    v.insert(std::upper_bound(v.begin(), v.end(), x), x);
    return;
  }
  // A full window: the oldest sample makes way for `x`. Replacing it in
  // place moves only the values between the two (a third of the window on
  // average, none when they are equal), not the whole tail twice as an
  // erase and an insert would; equal values are interchangeable, so the
  // copy of `old` nearest to where `x` goes is the one replaced.
  const double old = recent_.front();
  recent_.pop_front();
  if (old == x) return;
  const auto at = std::upper_bound(v.begin(), v.end(), x);  // where `x` goes
  if (old < x) {
    const auto last_old = std::upper_bound(v.begin(), at, old) - 1;
    std::move(last_old + 1, at, last_old);
    *(at - 1) = x;
  } else {
    const auto first_old = std::lower_bound(at, v.end(), old);
    std::move_backward(at, first_old, first_old + 1);
    *at = x;
  }
}

}  // namespace tandem::sched
