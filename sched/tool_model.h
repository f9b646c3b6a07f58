// ToolDurationModel: how long a tool call of a given kind is likely to run.
//
// Per tool kind, an empirical distribution of observed wall times (the last
// kWindow samples) blended with a log-normal prior, so a kind seen a few times
// is not trusted blindly and an unseen kind still gets an answer:
//
//   F(x) = (n · F_empirical(x) + k0 · F_prior(x)) / (n + k0)
//
// with k0 = prior_weight pseudo-samples. The prior is a log-normal whose
// median and spread are parameters (defaults from the dev traces: median
// 0.08 s, heavy tail) — or, when a query asks for the pooled prior, what
// this node has seen of every kind (its last pool_window calls), itself
// blended with that log-normal:
//
//   F_prior(x) = (N · F_pool(x) + k0 · F_lognormal(x)) / (N + k0)
//
// so a kind never seen before (a human's think time, a test suite of
// minutes) starts from the node's own experience of its tools rather than
// from a median measured on someone else's traces. The question every
// residency rule asks is the
// conditional one — a tool that has already run for t, will it return within
// h? —
//
//   P(T ≤ t + h | T > t) = (F(t + h) − F(t)) / (1 − F(t))
//
// which subsumes Continuum's fixed TTL and ThunderAgent's decay: both are
// special cases of acting on this probability.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sched/kind_table.h"
#include "sched/sorted_window.h"
#include "sched/types.h"

namespace tandem::sched {

struct ToolModelParams {
  double prior_median_s = 0.08;    // traces/README.md: p50 tool time 0.08 s
  double prior_sigma = 2.0;        // log-space spread: p90 ≈ 1 s, p99 ≈ 8.4 s
  double prior_weight = 4.0;       // pseudo-samples the prior is worth
  std::size_t window = 256;        // samples kept per kind
  std::size_t pool_window = 1024;  // calls of every kind kept for the pooled prior
  // Kinds with a history of their own (sched/kind_table.h: at the bound, the
  // quarter of the largest owner's kinds not observed for longest forget
  // their histories and are answered from the prior again until seen anew;
  // their calls stay in the pool). A node runs tens of tool kinds; 1,024
  // full histories are about 5 MiB.
  std::size_t max_kinds = kMaxToolKinds;
};

// Thread-safety: one thread.
class ToolDurationModel {
 public:
  explicit ToolDurationModel(ToolModelParams params = {});

  // `owner`: the principal that reported the call (sched/kind_table.h).
  void observe(ToolKind kind, Duration wall, std::uint32_t owner = 0);

  // F(x): probability that a call of `kind` finishes within `x`. `pooled`:
  // the prior is the node's pool (above), else the log-normal alone.
  double cdf(ToolKind kind, Duration x, bool pooled = false) const;
  // P(T ≤ elapsed + horizon | T > elapsed). Past every observed sample the
  // prior's heavy tail decides, so an overdue call is judged unlikely to
  // return soon. 1 only when the model leaves no probability mass at all.
  double p_return_within(ToolKind kind, Duration elapsed, Duration horizon, bool pooled = false) const;
  // Mean of the blended distribution (seconds).
  double mean_s(ToolKind kind, bool pooled = false) const;
  // E[T − elapsed | T > elapsed] (seconds), at most `cap_s`: how much longer
  // a call that has run `elapsed` is expected to take.
  double remaining_s(ToolKind kind, Duration elapsed, double cap_s, bool pooled = false) const;
  std::size_t samples(ToolKind kind) const;
  // Kinds with a history of their own (at most max_kinds), in all and of
  // one owner.
  std::size_t kinds() const { return kinds_.size(); }
  std::size_t kinds_of(std::uint32_t owner) const { return kinds_.owned_by(owner); }

 private:
  using History = SortedWindow;                                              // seconds, the window's newest
  const History* history(ToolKind kind) const { return kinds_.find(kind); }  // nullptr: no call of `kind` seen
  double lognormal_cdf(double x_s) const;
  double prior_cdf(double x_s, bool pooled) const;  // the pool blended with the log-normal, or the latter alone
  double empirical_cdf(const History& h, double x_s) const;
  double blended_cdf(const History* h, double x_s, bool pooled) const;

  ToolModelParams params_;
  // log(params_.prior_median_s), taken once: the residency decision asks
  // for the CDF a thousand times a second.
  double log_prior_median_;
  KindTable<History> kinds_;
  History pool_;
};

}  // namespace tandem::sched
