// Nova's weight-offload policy: module validation, the streaming cost model
// and the per-engine plan (see weight_offload.h for the rules and why).
#include "sched/weight_offload.h"

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cmath>

#include <fmt/format.h>

namespace tandem::sched {

base::Result<void> validate(const WeightModuleSpec& m) {
  auto bad = [&](std::string_view what) {
    return base::make_error(EINVAL, fmt::format("weight module {} '{}': {}", m.index, m.name, what));
  };
  if (m.index >= kMaxOffloadModules) return bad(fmt::format("index {} not below {}", m.index, kMaxOffloadModules));
  if (m.layers < 3) return bad(fmt::format("layers {} below 3", m.layers));
  if (m.slots < 2 || m.slots >= m.layers) return bad(fmt::format("slots {} not in [2, layers {})", m.slots, m.layers));
  if (!(m.layer_compute_s > 0.0) || !std::isfinite(m.layer_compute_s)) {
    return bad(fmt::format("layer_compute_s {} not finite and > 0", m.layer_compute_s));
  }
  if (m.bytes == 0) return bad("bytes 0");
  return {};
}

StreamCost stream_cost(const WeightModuleSpec& m, double link_bytes_per_s) {
  assert(validate(m).has_value() && link_bytes_per_s > 0.0);
  const std::uint64_t l = m.layers;
  const std::uint64_t streamed = l - m.slots;  // L − K layers loaded per pass
  StreamCost c;
  // floor(bytes · (L − K) / L) without overflowing 64 bits.
  c.freed_bytes = m.bytes / l * streamed + m.bytes % l * streamed / l;
  const double layer_bytes = static_cast<double>(m.bytes) / static_cast<double>(l);  // S
  const double t = m.layer_compute_s;
  const double n = static_cast<double>(streamed);
  const double overlap = static_cast<double>(l - 2);
  c.required_bytes_per_s = layer_bytes / t * n / overlap;
  // The copy time of the streamed layers beyond what L − 2 layers of compute hide.
  c.slowdown_s = std::max(0.0, n * layer_bytes / link_bytes_per_s - overlap * t);
  c.hidden = c.slowdown_s == 0.0;
  return c;
}

base::Result<void> validate(const OffloadParams& p) {
  auto bad = [](std::string_view field, std::string_view what) {
    return base::make_error(EINVAL, fmt::format("weight offload: {} {}", field, what));
  };
  if (!(p.link_bytes_per_s > 0.0) || !std::isfinite(p.link_bytes_per_s)) {
    return bad("link_bytes_per_s", fmt::format("{} not finite and > 0", p.link_bytes_per_s));
  }
  if (!(p.offload_pressure > 0.0) || !std::isfinite(p.offload_pressure)) {
    return bad("offload_pressure", fmt::format("{} not finite and > 0", p.offload_pressure));
  }
  if (!(p.restore_pressure > 0.0) || !(p.restore_pressure < p.offload_pressure)) {
    return bad("restore_pressure",
               fmt::format("{} not in (0, offload_pressure {})", p.restore_pressure, p.offload_pressure));
  }
  if (p.hold == 0) return bad("hold", "0");
  return {};
}

base::Result<void> WeightOffloadPolicy::set_module(const WeightModuleSpec& m) {
  if (auto ok = validate(m); !ok) return ok;
  auto it = std::ranges::lower_bound(modules_, m.index, {}, &WeightModuleSpec::index);
  if (it != modules_.end() && it->index == m.index) {
    *it = m;
  } else {
    modules_.insert(it, m);
  }
  return {};
}

const WeightModuleSpec* WeightOffloadPolicy::module(std::uint32_t index) const {
  auto it = std::ranges::lower_bound(modules_, index, {}, &WeightModuleSpec::index);
  return it != modules_.end() && it->index == index ? &*it : nullptr;
}

std::uint64_t WeightOffloadPolicy::freed_of(std::uint32_t index) const {
  const WeightModuleSpec* m = module(index);
  // Freed bytes do not depend on the link; any positive bandwidth will do.
  return m == nullptr ? 0 : stream_cost(*m, 1.0).freed_bytes;
}

std::uint64_t WeightOffloadPolicy::freed_bytes() const {
  std::uint64_t sum = 0;
  for (std::uint32_t i : order_) sum += freed_of(i);
  return sum;
}

bool WeightOffloadPolicy::decide(const OffloadInput& in, const OffloadParams& p) {
  assert(validate(p).has_value());
  if (in.blocks_total == 0) {
    pressure_ = 0.0;
    restore_streak_ = 0;
    return false;
  }
  pressure_ = static_cast<double>(in.projected_blocks) / static_cast<double>(in.blocks_total);
  if (settle_ > 0) {
    --settle_;  // the engine is still resizing its pool to the last plan
    return false;
  }
  if (in.block_bytes == 0) {  // blocks and bytes cannot be compared: leave the plan as it is
    restore_streak_ = 0;
    return false;
  }
  const double bb = static_cast<double>(in.block_bytes);
  const double projected = static_cast<double>(in.projected_blocks);
  std::uint64_t freed = freed_bytes();
  // The pool the engine would have without any offload: its reported pool
  // holds the freed blocks of the plan in force.
  const double freed_blocks_now = std::floor(static_cast<double>(freed) / bb);
  const double base = std::max(0.0, static_cast<double>(in.blocks_total) - freed_blocks_now);
  auto capacity = [&](std::uint64_t freed_bytes) { return base + std::floor(static_cast<double>(freed_bytes) / bb); };

  if (pressure_ >= p.offload_pressure) {
    restore_streak_ = 0;
    struct Candidate {
      std::uint32_t index;
      StreamCost cost;
    };
    std::vector<Candidate> hidden;
    std::vector<Candidate> slowing;
    for (const WeightModuleSpec& m : modules_) {
      if ((plan_ >> m.index & 1u) != 0) continue;
      const StreamCost c = stream_cost(m, p.link_bytes_per_s);
      if (c.freed_bytes == 0) continue;
      if (c.hidden) {
        hidden.push_back({m.index, c});
      } else if (p.allow_slowdown) {
        slowing.push_back({m.index, c});
      }
    }
    // Hidden ones cost nothing: the largest first, so the fewest modules are
    // streamed. Slowing ones by freed bytes per second of slowdown. Ties by
    // index, so the order is deterministic.
    std::ranges::sort(hidden, [](const Candidate& a, const Candidate& b) {
      if (a.cost.freed_bytes != b.cost.freed_bytes) return a.cost.freed_bytes > b.cost.freed_bytes;
      return a.index < b.index;
    });
    auto per_second = [](const Candidate& c) { return static_cast<double>(c.cost.freed_bytes) / c.cost.slowdown_s; };
    std::ranges::sort(slowing, [&](const Candidate& a, const Candidate& b) {
      if (per_second(a) != per_second(b)) return per_second(a) > per_second(b);
      return a.index < b.index;
    });
    hidden.insert(hidden.end(), slowing.begin(), slowing.end());
    bool changed = false;
    for (const Candidate& c : hidden) {
      if (projected < p.offload_pressure * capacity(freed)) break;  // the demand fits now
      plan_ |= std::uint64_t{1} << c.index;
      order_.push_back(c.index);
      freed += c.cost.freed_bytes;
      changed = true;
    }
    if (changed) settle_ = p.hold;
    return changed;
  }

  // Restore: the longest run of the most recently offloaded modules whose
  // blocks the pool can lose and still stay below restore_pressure.
  std::size_t restorable = 0;
  std::uint64_t left = freed;
  while (restorable < order_.size()) {
    const std::uint64_t without = left - freed_of(order_[order_.size() - 1 - restorable]);
    if (!(projected < p.restore_pressure * capacity(without))) break;
    left = without;
    ++restorable;
  }
  if (restorable == 0) {
    restore_streak_ = 0;
    return false;
  }
  if (++restore_streak_ < p.hold) return false;
  for (std::size_t i = 0; i < restorable; ++i) {
    plan_ &= ~(std::uint64_t{1} << order_.back());
    order_.pop_back();
  }
  restore_streak_ = 0;
  settle_ = p.hold;
  return true;
}

}  // namespace tandem::sched
