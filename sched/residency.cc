// Expected-value residency and the KV shadow price.
#include "sched/residency.h"

#include <algorithm>
#include <limits>

namespace tandem::sched {

double CostModel::recompute_s(std::uint32_t tokens) const {
  double c = tokens;
  return (prefill_us_per_token * c + attention_us_per_pair * c * c / 2) * 1e-6;
}

double CostModel::reload_s(std::uint32_t tokens) const { return (swap_us_per_token * tokens + swap_fixed_us) * 1e-6; }

double kv_price(const EngineView& engine, const PriceParams& params) {
  if (!engine.has_stats || engine.kv.blocks_total == 0) return 0;
  double total = engine.kv.blocks_total;
  double allocated = total - engine.kv.blocks_free;
  double pressure = (allocated + static_cast<double>(engine.queued_blocks)) / total;
  if (pressure <= params.idle_pressure) return 0;
  double ramp = (pressure - params.idle_pressure) / (1.0 - params.idle_pressure);
  return params.full_price * std::min(ramp, 4.0);
}

ResidencyDecision decide_residency(const ResidencyInput& in, const CostModel& cost) {
  const double recompute = cost.recompute_s(in.context_tokens);
  const double reload = cost.reload_s(in.context_tokens);
  const double blocks = in.blocks;
  ResidencyDecision d;
  // The copy crosses the link in about a reload's time, after the backlog;
  // its blocks stay allocated until it is done.
  d.offload_cost = in.offload_allowed ? reload + blocks * (in.link_wait_s + reload) * in.price
                                      : std::numeric_limits<double>::infinity();
  const bool offload = d.offload_cost < recompute;
  const double avoided = offload ? d.offload_cost : recompute;
  const double hold = blocks * in.horizon_s * in.price;
  d.keep_value = in.p_return_within_horizon * avoided - hold;
  // Idle memory (hold = 0) keeps whatever P is: nothing is gained by moving it.
  // A release whose blocks expected back within the horizon (P x blocks)
  // exceed the headroom is not one at the margin: the session would come
  // back to wait for the engine to drain that much room.
  const bool past_headroom = in.p_return_within_horizon * blocks > in.headroom_blocks;
  if (hold == 0 || d.keep_value > 0 || past_headroom) {
    d.residence = Residence::kKeep;
  } else {
    d.residence = offload ? Residence::kOffload : Residence::kDrop;
  }
  return d;
}

}  // namespace tandem::sched
