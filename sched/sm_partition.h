// Nova's SM partitioning between stages, the pure part (docs/architecture.md "GPU plane").
//
// Nova (arXiv 2509.21301) splits one GPU's SMs between stages and moves SMs
// from decode to prefill as prefill work piles up:
//
//   SM_dec = max(SM_min, SM_op − α·(N_pend − 1))
//
// where SM_op is decode's operating point, read off the Pareto front of a
// profile of decode latency and throughput against SM count. This file holds
// that arithmetic and nothing else:
//
//   StageProfile       rows (sm_count, latency_s, throughput) for one stage,
//                      supplied by the engine or measured, validated on entry;
//   pareto_front()     the rows no other row beats on both latency (lower)
//                      and throughput per SM (higher);
//   sm_op()            the knee of that front: the row maximising
//                      throughput per SM per second of latency;
//   sm_dec()           the formula above, rounded up to the partition
//                      granularity and clamped to [SM_min, total];
//   PartitionChooser   maps SM_dec onto the partitions a green-context pool
//                      offers and returns the index to publish, with a
//                      hold-down on moves towards more decode SMs.
//
// Only the formula above was available to us, not the paper's text, so the
// front's axes, the knee rule, N_pend's clamp, the defaults and the
// hysteresis are tandem's choices; each is argued where it is defined and in
// docs/sched.md "SM partitioning (Nova)". The daemon's GPU plane
// (daemon/gpu_plane.h) runs it per engine and publishes the index on the
// engine's status page.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"

namespace tandem::sched {

// One measurement of a stage at one SM count.
struct ProfileRow {
  std::uint32_t sm_count = 0;
  double latency_s = 0.0;   // one step (decode: time per output token), seconds
  double throughput = 0.0;  // work per second at this SM count (decode: tokens/s)

  // Work per second per SM: what an SM given to this stage buys.
  double per_sm() const { return throughput / static_cast<double>(sm_count); }
  bool operator==(const ProfileRow&) const = default;
};

// A validated profile: at least one row; sm_count > 0 and strictly
// increasing; latency finite and > 0; throughput finite and >= 0.
// Thread-safety: a value type.
class StageProfile {
 public:
  // Errors (EINVAL) name the stage and the offending row (0-based), e.g.
  // "profile 'decode' row 2: sm_count 16 not above row 1's 16".
  static base::Result<StageProfile> create(std::string_view stage, std::vector<ProfileRow> rows);

  const std::string& stage() const { return stage_; }
  std::span<const ProfileRow> rows() const { return rows_; }

 private:
  StageProfile(std::string stage, std::vector<ProfileRow> rows) : stage_(std::move(stage)), rows_(std::move(rows)) {}
  std::string stage_;
  std::vector<ProfileRow> rows_;
};

// The rows not dominated in (lower latency_s, higher per_sm()): row a
// dominates b when a.latency_s <= b.latency_s and a.per_sm() >= b.per_sm()
// with one of them strict. Identical rows cannot occur (sm counts differ), so
// the front is never empty. Sorted by sm_count ascending — along it latency
// falls and throughput per SM falls.
std::vector<ProfileRow> pareto_front(const StageProfile& profile);

// Nova's operating point SM_op: the row of `front` with the best
// latency-throughput trade-off, scored as
//
//   score = per_sm() / latency_s = throughput / (sm_count · latency_s)
//
// — throughput each SM buys per second of step latency. The score is free of
// units and of normalisation constants (it compares rows by ratios, so a
// 1% latency gain counts as 1% however narrow the front's latency range),
// and its maximum over any profile lies on the Pareto front: a row that
// dominates another scores strictly higher. For decode, where throughput =
// batch / latency, maximising it minimises sm_count · latency², i.e. more SMs
// pay while doubling them cuts latency by more than 1/√2. Ties go to the
// lower latency (more SMs).
// REQUIRES: `front` non-empty (any rows work; pass pareto_front()'s).
std::uint32_t sm_op(std::span<const ProfileRow> front);

// The device side of SM_dec and the formula's constants.
struct SmDecParams {
  std::uint32_t total = 132;      // SMs on the device (H100 SXM / H200: 132)
  std::uint32_t granularity = 8;  // partition alignment (Hopper: 8; [gpu_and_ipc] A.1)
  std::uint32_t sm_min = 16;      // decode floor (SGLang PD-mux keeps decode >= 16; A.3)
  double alpha = 8.0;             // SMs moved to prefill per extra pending prefill
};

// Errors (EINVAL) name the field: total 0, granularity 0, sm_min 0 or above
// total, alpha negative or not finite.
base::Result<void> validate(const SmDecParams& p);

// SM_dec = max(SM_min, SM_op − α·(max(N_pend, 1) − 1)), then rounded up to a
// multiple of granularity and clamped to [round_up(SM_min), total] (total
// itself is allowed even when it is not a multiple: it is "no partition").
// n_pend counts prefill requests pending on the engine (the daemon passes
// KV_STATS waiting_seqs); 0 is treated as 1 — with nothing pending decode keeps SM_op,
// since the knee is where more SMs stop paying.
// REQUIRES: validate(p) succeeded.
std::uint32_t sm_dec(std::uint32_t sm_op, std::uint32_t n_pend, const SmDecParams& p);

// Picks which of an engine's pre-built partitions to publish.
//
// The pool offers partitions by index, each with its decode SM count
// (strictly increasing). choose(SM_dec) targets the smallest partition with
// at least SM_dec decode SMs, or the largest if none has enough.
//
// Hysteresis: a switch drains in-flight work (SGLang synchronizes both
// streams before it changes partition; [gpu_and_ipc] A.3), so flapping
// costs. Moves to fewer decode SMs — prefill needs them now — apply at once;
// moves to more decode SMs apply only once `grow_hold` consecutive decisions
// have all wanted more than the current partition, and then go to the
// smallest of those wanted (the most conservative). grow_hold = 1 disables
// the hysteresis. The first decision applies at once.
//
// Thread-safety: one thread (the daemon's control loop).
class PartitionChooser {
 public:
  // Errors (EINVAL): an empty pool, a zero or non-increasing count (naming
  // the index), grow_hold 0.
  static base::Result<PartitionChooser> create(std::vector<std::uint32_t> decode_sms, std::uint32_t grow_hold = 2);

  // The index the target alone would pick (no hysteresis, no state).
  std::size_t target(std::uint32_t sm_dec) const;
  // The index to publish after this decision.
  std::size_t choose(std::uint32_t sm_dec);

  // The published index; none before the first choose().
  bool has_current() const { return has_current_; }
  std::size_t current() const { return current_; }
  std::span<const std::uint32_t> decode_sms() const { return decode_sms_; }

 private:
  PartitionChooser(std::vector<std::uint32_t> decode_sms, std::uint32_t grow_hold)
      : decode_sms_(std::move(decode_sms)), grow_hold_(grow_hold) {}

  std::vector<std::uint32_t> decode_sms_;
  std::uint32_t grow_hold_;
  bool has_current_ = false;
  std::size_t current_ = 0;
  std::uint32_t grow_streak_ = 0;    // consecutive decisions wanting > current_
  std::size_t grow_min_target_ = 0;  // smallest index wanted during the streak
};

}  // namespace tandem::sched
