// SM partition planning: the arithmetic behind one split and its combinations.
#include "gpu/partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <set>

namespace tandem::gpu {
namespace {

base::Result<void> validate_device(const SmResource& d) {
  if (d.sm_count == 0 || d.alignment == 0 || d.min_partition_size == 0 || d.min_partition_size > d.sm_count) {
    return base::make_error(EINVAL, fmt::format("device SM resource {} SMs, minimum {}, alignment {} is not usable",
                                                d.sm_count, d.min_partition_size, d.alignment));
  }
  return {};
}

// Groups of the block one split makes: the driver's count when known.
std::uint32_t groups_of(const SmResource& d) {
  const std::uint32_t most = d.sm_count / block_size(d);
  return d.groups > 0 ? std::min(d.groups, most) : most;
}

std::uint32_t remainder_of(const SmResource& d) { return d.sm_count - (groups_of(d) * block_size(d)); }

// "48 or 56" / "8": the feasible counts either side of `sms`.
std::string nearest(const SmResource& d, std::uint32_t sms) {
  std::vector<std::uint32_t> all = feasible_sm_counts(d);
  auto hi = std::ranges::lower_bound(all, sms);
  std::vector<std::uint32_t> near;
  if (hi != all.begin()) near.push_back(*(hi - 1));
  if (hi != all.end()) near.push_back(*hi);
  if (near.size() == 2) return fmt::format("{} or {}", near[0], near[1]);
  return near.empty() ? std::string("none") : fmt::format("{}", near[0]);
}

}  // namespace

std::uint32_t block_size(const SmResource& device) {
  if (device.alignment == 0) return device.min_partition_size;
  std::uint32_t m = std::max(device.min_partition_size, device.alignment);
  return (m + device.alignment - 1) / device.alignment * device.alignment;
}

std::vector<std::uint32_t> feasible_sm_counts(const SmResource& device) {
  std::vector<std::uint32_t> out;
  if (!validate_device(device)) return out;
  std::uint32_t b = block_size(device);
  std::uint32_t rem = remainder_of(device);
  for (std::uint32_t k = 0; k <= groups_of(device); ++k) {
    if (k > 0 && k * b >= device.min_partition_size) out.push_back(k * b);
    if (rem > 0 && k * b + rem >= device.min_partition_size) out.push_back((k * b) + rem);
  }
  std::ranges::sort(out);
  return out;
}

base::Result<std::uint32_t> sms_for_fraction(const SmResource& device, std::string_view stage, double fraction) {
  if (auto ok = validate_device(device); !ok) return base::propagate(std::move(ok.error()));
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return base::make_error(EINVAL, fmt::format("stage '{}': fraction {} is outside (0, 1]", stage, fraction));
  }
  double target = fraction * device.sm_count;
  std::vector<std::uint32_t> all = feasible_sm_counts(device);
  std::uint32_t best = all.front();
  for (std::uint32_t c : all) {
    if (std::abs(c - target) < std::abs(best - target)) best = c;
  }
  return best;
}

base::Result<PartitionPlan> plan_partitions(const SmResource& device, std::span<const StageRequest> stages) {
  if (auto ok = validate_device(device); !ok) return base::propagate(std::move(ok.error()));
  if (stages.empty()) return base::make_error(EINVAL, "no stages to partition");
  PartitionPlan plan;
  plan.group_sm_count = block_size(device);
  plan.group_count = groups_of(device);
  plan.remaining_sm_count = remainder_of(device);
  const std::uint32_t b = plan.group_sm_count;
  const std::uint32_t rem = plan.remaining_sm_count;

  std::set<std::string, std::less<>> names;
  std::string remainder_owner;
  std::uint32_t next_group = 0;
  std::uint32_t total = 0;
  std::string breakdown;
  for (const StageRequest& req : stages) {
    if (!names.insert(req.stage).second) {
      return base::make_error(EINVAL, fmt::format("stage '{}' is requested twice", req.stage));
    }
    std::uint32_t sms = 0;
    if (const auto* fraction = std::get_if<double>(&req.size)) {
      auto r = sms_for_fraction(device, req.stage, *fraction);
      if (!r) return base::propagate(std::move(r.error()));
      sms = *r;
    } else {
      sms = std::get<std::uint32_t>(req.size);
    }
    if (sms < device.min_partition_size) {
      return base::make_error(EINVAL, fmt::format("stage '{}': {} SMs is below the device's minimum partition of {}",
                                                  req.stage, sms, device.min_partition_size));
    }
    StagePartition part{.stage = req.stage, .sm_count = sms};
    if (sms % b == 0) {
      part.group_count = sms / b;
    } else if (rem > 0 && sms >= rem && (sms - rem) % b == 0) {
      if (!remainder_owner.empty()) {
        return base::make_error(
            EINVAL, fmt::format("stage '{}': {} SMs needs the split's {}-SM remainder, which stage '{}' already has",
                                req.stage, sms, rem, remainder_owner));
      }
      remainder_owner = req.stage;
      part.group_count = (sms - rem) / b;
      part.uses_remainder = true;
    } else {
      std::string how = rem > 0 ? fmt::format("a multiple of {} SMs, optionally plus the {}-SM remainder", b, rem)
                                : fmt::format("a multiple of {} SMs", b);
      return base::make_error(EINVAL, fmt::format("stage '{}': {} SMs is not {} (nearest feasible: {})", req.stage, sms,
                                                  how, nearest(device, sms)));
    }
    part.first_group = next_group;
    next_group += part.group_count;
    total += sms;
    if (!breakdown.empty()) breakdown += " + ";
    breakdown += fmt::format("{} {}", req.stage, sms);
    plan.stages.push_back(std::move(part));
  }
  if (total > device.sm_count) {
    return base::make_error(
        EINVAL, fmt::format("stages need {} SMs ({}), the device has {}", total, breakdown, device.sm_count));
  }
  if (next_group > plan.group_count) {
    return base::make_error(EINVAL, fmt::format("stages need {} groups of {} SMs ({}), a split of the device makes {} "
                                                "(and {} SMs remaining)",
                                                next_group, b, breakdown, plan.group_count, rem));
  }
  plan.unused_sm_count = device.sm_count - total;
  return plan;
}

base::Result<void> check_split(const PartitionPlan& plan, const Split& split) {
  if (split.groups.size() != plan.group_count || split.group_sm_count != plan.group_sm_count ||
      split.remaining_sm_count != plan.remaining_sm_count) {
    return base::make_error(EIO, fmt::format("split made {} groups of {} SMs + {} remaining, the plan expects {} of {} "
                                             "+ {}",
                                             split.groups.size(), split.group_sm_count, split.remaining_sm_count,
                                             plan.group_count, plan.group_sm_count, plan.remaining_sm_count));
  }
  return {};
}

std::vector<ResourceId> pieces_for(const StagePartition& stage, const Split& split) {
  std::vector<ResourceId> out;
  for (std::uint32_t i = 0; i < stage.group_count && stage.first_group + i < split.groups.size(); ++i) {
    out.push_back(split.groups[stage.first_group + i]);
  }
  if (stage.uses_remainder && split.remaining) out.push_back(*split.remaining);
  return out;
}

}  // namespace tandem::gpu
