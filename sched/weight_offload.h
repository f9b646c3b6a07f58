// Nova's layer-wise weight offload, the daemon's policy (docs/architecture.md "GPU plane"). Pure:
// no I/O, no clock; one decision per control tick.
//
// An engine streams an offloaded weight module's L layers through K device
// slots (libtandem's LayerStreamer): while layer i computes, the copy stream
// loads a later layer into a free slot. Offloading module m therefore frees
//
//   freed_m = (L − K)/L · bytes_m                  (L − K layers' worth)
//
// of device memory, which the engine adds to its KV pool. The copies of a
// pass are hidden behind compute when the host link is fast enough:
//
//   B ≥ S/T · (L − K)/(L − 2)          S = bytes/L, T = compute of one layer
//
// i.e. the L − K layers that must be loaded during a pass are copied while
// L − 2 layers compute (the first and the last layer of a pass overlap no
// copy of that pass). Below the bound each pass is slower by the copy time
// that cannot be hidden:
//
//   slowdown = (L − K)·S/B − (L − 2)·T          (> 0 only below the bound)
//
// — the same model as gpu/layer_streamer.h's check_bandwidth.
//
// WeightOffloadPolicy decides, per engine, which modules to offload: when the
// projected KV demand reaches `offload_pressure` of the pool it offloads
// modules — hidden ones (no slowdown) first, largest first, then (only with
// `allow_slowdown`) the rest by freed bytes per second of slowdown — until the
// pool with the freed blocks holds the demand below `offload_pressure`. It
// restores them, last offloaded first, once the demand would stay below
// `restore_pressure` without their blocks for `hold` consecutive decisions.
// After any change it waits `hold` decisions for the engine to resize its
// pool (its KV_STATS blocks_total includes the freed blocks from then on)
// before it changes the plan again. docs/sched.md "Weight offload (Nova)"
// argues each rule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"

namespace tandem::sched {

inline constexpr std::uint32_t kMaxOffloadModules = 64;  // bits of the status page's offload_plan

// A weight module an engine can stream (the engine's WEIGHT_MODULE record).
struct WeightModuleSpec {
  std::uint32_t index = 0;       // < kMaxOffloadModules: bit `index` of the plan
  std::uint32_t slots = 0;       // K device slots when offloaded, 2 <= K < L
  std::uint32_t layers = 0;      // L, >= 3
  double layer_compute_s = 0.0;  // T, seconds of compute per layer, finite and > 0
  std::uint64_t bytes = 0;       // the whole module on the device, > 0
  std::string name;

  bool operator==(const WeightModuleSpec&) const = default;
};

// Errors (EINVAL) name the module and the field, e.g.
// "weight module 3 'mlp': slots 1 not in [2, layers 4)".
base::Result<void> validate(const WeightModuleSpec& m);

// What streaming one module costs and frees.
struct StreamCost {
  std::uint64_t freed_bytes = 0;      // floor((L − K)·bytes / L)
  double required_bytes_per_s = 0.0;  // S/T · (L − K)/(L − 2)
  bool hidden = false;                // link_bytes_per_s >= required_bytes_per_s
  double slowdown_s = 0.0;            // per pass: max(0, (L − K)·S/B − (L − 2)·T)
};

// REQUIRES: validate(m) succeeded, link_bytes_per_s finite and > 0.
StreamCost stream_cost(const WeightModuleSpec& m, double link_bytes_per_s);

struct OffloadParams {
  double link_bytes_per_s = 25e9;  // host→device bandwidth (PCIe 4.0 x16, practical)
  double offload_pressure = 1.0;   // projected / pool at which modules are offloaded
  double restore_pressure = 0.8;   // ... below which (without their blocks) they come back
  std::uint32_t hold = 10;         // decisions a restore must be wanted, and a change settles
  bool allow_slowdown = false;     // offload modules whose copies cannot be hidden

  bool operator==(const OffloadParams&) const = default;
};

// Errors (EINVAL) name the field: link_bytes_per_s not finite and > 0,
// offload_pressure not finite and > 0, restore_pressure not in
// (0, offload_pressure), hold 0.
base::Result<void> validate(const OffloadParams& p);

// One decision's inputs.
struct OffloadInput {
  std::uint64_t projected_blocks = 0;  // KV the engine's live sessions are projected to hold
  std::uint32_t blocks_total = 0;      // the pool as reported (with the freed blocks of the plan in force)
  std::uint64_t block_bytes = 0;       // device bytes of one block; 0 = unknown (then nothing changes)
};

// The plan for one engine. Thread-safety: one thread (the control loop).
class WeightOffloadPolicy {
 public:
  // Adds or replaces module m.index (a resync sends them again). A planned
  // module stays planned; its freed bytes follow the new description.
  base::Result<void> set_module(const WeightModuleSpec& m);

  // One decision; true when the plan changed. REQUIRES: validate(p).
  bool decide(const OffloadInput& in, const OffloadParams& p);

  std::uint64_t plan() const { return plan_; }  // bit i: module i offloaded
  // Σ freed bytes of the planned modules.
  std::uint64_t freed_bytes() const;
  // Planned module indices, in the order they were offloaded.
  const std::vector<std::uint32_t>& offloaded() const { return order_; }
  const std::vector<WeightModuleSpec>& modules() const { return modules_; }
  // The module with `index`; nullptr if the engine never described it.
  const WeightModuleSpec* module(std::uint32_t index) const;
  // Pressure at the last decision (projected / blocks_total; 0 before one, or unknown).
  double pressure() const { return pressure_; }

 private:
  std::uint64_t freed_of(std::uint32_t index) const;

  std::vector<WeightModuleSpec> modules_;  // sorted by index
  std::uint64_t plan_ = 0;
  std::vector<std::uint32_t> order_;  // offload order of the set bits
  std::uint32_t settle_ = 0;          // decisions left before the plan may change again
  std::uint32_t restore_streak_ = 0;  // consecutive decisions that wanted a restore
  double pressure_ = 0.0;
};

}  // namespace tandem::sched
