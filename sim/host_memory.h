// Host memory in tandem-sim (docs/sim.md "Host memory"): what tool calls
// and agent sessions hold in the node's memory, and what the host does when
// it runs short.
//
// Every tool call draws a memory peak and a time to peak from its kind's
// distribution (ToolMemTable), seeded by the session, the call and the
// attempt, so every policy of a comparison sees the same demands. A call's
// memory follows its progress (nominal seconds done) in two layers: a working
// set of kResidualShare of its peak from the start, and one burst at a
// uniformly drawn point of the call: a ramp of 0.25–1 s up to the peak, held
// for 1–2 s, then back to the working set. Each admitted session also holds a resident baseline (the agent's
// runtime) until it closes. The node (sim/node.cc) sums them against the
// host's capacity every control tick and applies what the host does:
// memory.high throttling, freezing, OOM kills and reruns; HostPsi turns the
// stalls into PSI as the kernel defines it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "base/result.h"

namespace tandem::sim {

// One kind's demand: the peak is log-normal (median, σ).
struct ToolMemDist {
  double median_mib = 0;
  double sigma = 1.2;
};

struct ToolMemDraw {
  double peak_bytes = 0;
  double start_s = 0;  // progress at which the burst's ramp starts
  double ramp_s = 0;   // how long (progress) the ramp takes: the time to peak is start_s + ramp_s
  double burst_s = 0;  // how long (progress) the peak is held
};

// Memory of a call at `progress_s` nominal seconds done: the working set
// (kResidualShare of the peak), ramping to the peak over the burst's ramp,
// held for the burst, then the working set again.
inline constexpr double kResidualShare = 0.25;
// No call's peak above this by default: the largest tool peak AgentCgroup
// measured was 4,060 MB (pydicom), and its node-level range is 2-4 GB
// (docs/sim.md "Host memory"). The log-normal draws' tail passes it.
inline constexpr double kToolMemCapMib = 4096;
// A drawn peak times its scales, held at `cap_mib` (0: no cap).
inline double capped_peak(double peak_bytes, double cap_mib) {
  return cap_mib > 0 && peak_bytes > cap_mib * 1048576.0 ? cap_mib * 1048576.0 : peak_bytes;
}
double tool_memory_at(const ToolMemDraw& d, double progress_s);
// True while the call's memory grows (it allocates: throttling and reclaim
// stall it).
inline bool tool_memory_growing(const ToolMemDraw& d, double progress_s) {
  return progress_s >= d.start_s && progress_s < d.start_s + d.ramp_s;
}

class ToolMemTable {
 public:
  ToolMemTable();  // the defaults (docs/sim.md gives each one's source)
  const ToolMemDist& dist(std::string_view kind) const;
  // Applies "kind=P95MiB[:sigma],..." ("*" sets the fallback): the value is
  // the 95th percentile of the kind's peak in MiB, as AgentCgroup reports it;
  // σ keeps the kind's own unless given. EINVAL naming the bad entry; on error
  // nothing changes.
  base::Result<void> apply(std::string_view spec);
  // One call's demand: deterministic in (key, kind, nominal time).
  ToolMemDraw draw(std::string_view kind, std::uint64_t key, double nominal_s) const;
  const std::map<std::string, ToolMemDist, std::less<>>& table() const { return table_; }

 private:
  std::map<std::string, ToolMemDist, std::less<>> table_;
  ToolMemDist fallback_;
};

// PSI memory "some" and "full" over the tool tasks, as the kernel defines
// them (Documentation/accounting/psi.rst): "some" is the share of time in
// which at least one task stalls on memory, "full" the share in which every
// non-idle task does at once; avg10 is its exponential average over 10 s
// (over `window_s` when a compressed run stretches the kernel's 10 s).
class HostPsi {
 public:
  // `window_s`: the exponential average's window (the kernel's avg10: 10 s).
  explicit HostPsi(double window_s = 10) : window_s_(window_s) {}
  // `dt_s` seconds passed with `stalled` of `active` tasks stalled.
  void advance(double dt_s, std::size_t stalled, std::size_t active);
  double some_avg10() const { return some_; }
  double full_avg10() const { return full_; }
  double some_total_s() const { return some_total_; }
  double full_total_s() const { return full_total_; }

 private:
  double window_s_;
  double some_ = 0, full_ = 0;
  double some_total_ = 0, full_total_ = 0;
};

// Stable 64-bit mixing (splitmix64's finaliser): draws independent of the
// order in which a policy runs things.
std::uint64_t mix64(std::uint64_t x);

}  // namespace tandem::sim
