// Expected-value KV residency: tandem's addition 1 (docs/architecture.md "Policies").
//
// While a session's tool runs, its KV is worth keeping only while the work it
// saves outweighs what it costs the sessions that want the memory:
//
//   keep  iff  P(tool returns within h | running for t) × C_avoided  >  blocks × h × price(KV)
//
// C_avoided is what keeping spares compared with the best alternative, the
// cheaper of:
//   offload  — reload at resume + the GPU memory its blocks keep while the
//              copy waits for and crosses the link (blocks × (backlog + copy
//              time) × GPU price);
//   release  — the full recompute.
// When keeping loses, the cheaper alternative is taken. Offload needs host
// memory for the copy (the caller decides: tandem.h, host_prices). With idle
// memory the price is 0 and every session keeps; a tool expected to run long
// under pressure has P ≈ 0 and goes to host memory or is dropped. This one
// expression subsumes Continuum's TTL (keep while P is high) and
// ThunderAgent's decay (P falls as the tool runs on), and chooses among
// MARS-API's preserve / swap / discard.
//
// Units are GPU-seconds. Costs come from the calibrated step-time model
// ([calibration] §0, h100-llama3-8b): recomputing c tokens costs
// b·c + a_pf·c²/2; reloading costs swap_per_token·c + swap_fixed.
#pragma once

#include <cstdint>
#include <limits>

#include "sched/model.h"

namespace tandem::sched {

struct CostModel {
  double prefill_us_per_token = 20.0;     // b ([calibration] §0, llama3-8b)
  double attention_us_per_pair = 1.3e-3;  // a_pf
  double swap_us_per_token = 3.3;         // 128 KiB/token at 40 GB/s
  double swap_fixed_us = 30.0;

  // Seconds of GPU time to recompute a context of `tokens` from scratch.
  double recompute_s(std::uint32_t tokens) const;
  // Seconds to bring it back from host memory.
  double reload_s(std::uint32_t tokens) const;
};

struct PriceParams {
  // Pool pressure (allocated + queued demand, over total) below which KV is
  // free: idle memory is worth nothing to anyone else. The same threshold
  // prices host memory by its use.
  double idle_pressure = 0.7;
  // Price at pressure 1, in GPU-seconds per block-second. The default is what
  // one 16-token block costs to recompute (16 × 20 µs): holding a block for a
  // second on a full pool displaces about that much work.
  double full_price = 16 * 20e-6;
};

// The shadow price of one KV block for one second on `engine`: 0 at or below
// idle pressure, rising linearly to full_price at pressure 1 and beyond
// (capped at 4× full_price).
double kv_price(const EngineView& engine, const PriceParams& params);

enum class Residence : std::uint8_t { kKeep, kOffload, kDrop };

struct ResidencyInput {
  double p_return_within_horizon = 0;  // ToolDurationModel::p_return_within(kind, elapsed, h)
  double horizon_s = 1.0;              // h: how far ahead this decision looks
  std::uint32_t context_tokens = 0;
  std::uint32_t blocks = 0;
  double price = 0;             // kv_price() of the session's engine
  bool offload_allowed = true;  // host memory and a copy path exist, and the copy may take room there
  double link_wait_s = 0;       // copies already queued on the engine's link
  // The room the pool keeps free for sessions to come and go in, in blocks
  // (tandem: (1 - resume_pressure) x the engine's pool). The price is a
  // block's at the margin; a release larger than the headroom is not at the
  // margin: back from its tool, the session waits for the engine to drain
  // that much room, which the price does not see. So the KV is kept while
  // the blocks expected back within the horizon, P x blocks, exceed it.
  // Infinite: no such rule.
  double headroom_blocks = std::numeric_limits<double>::infinity();
};

struct ResidencyDecision {
  Residence residence = Residence::kKeep;
  double keep_value = 0;    // P × C_avoided − hold, GPU-seconds (> 0 iff kept)
  double offload_cost = 0;  // GPU-seconds; +inf when offload is not possible
};

ResidencyDecision decide_residency(const ResidencyInput& in, const CostModel& cost);

}  // namespace tandem::sched
