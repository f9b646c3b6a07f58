// SM partition planning (docs/architecture.md "GPU plane"; [gpu_and_ipc] A.2): pure
// arithmetic from a device's SM resource and the SMs each stage wants to the
// ONE split a GreenContextPool executes and the pieces each stage's green
// context combines.
//
// The split cuts the device into groups of the smallest size a split allows,
// the block: minSmPartitionSize rounded up to smCoscheduledAlignment (8 on
// Hopper). Arithmetic says 132 SMs make 16 groups of 8 and a remainder of 4,
// but the driver counts by GPC: an H200 (132 SMs) makes 15 groups of 8 and a
// remainder of 12, so the plan follows SmResource::groups, the driver's count.
// Resources of one split may be combined, so a stage can get k blocks (k·8 SMs)
// or k blocks plus the remainder (k·8 + 12 there): 48 = 6 blocks, 92 = 10
// blocks + 12.
// Only one stage can take the remainder, and the header warns that it "does
// not have the same functional or performance guarantees" as the groups.
// Stages take consecutive blocks in the order requested.
//
// Thread-safety: free functions on values; safe anywhere.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/result.h"
#include "gpu/device.h"

namespace tandem::gpu {

struct StageRequest {
  std::string stage;  // "decode", "prefill"
  // A number of SMs, or a fraction of the device's SMs in (0, 1], which is
  // rounded to the nearest feasible count (ties to the smaller).
  std::variant<std::uint32_t, double> size;
};

struct StagePartition {
  std::string stage;
  std::uint32_t sm_count = 0;
  std::uint32_t first_group = 0;  // index into Split::groups
  std::uint32_t group_count = 0;
  bool uses_remainder = false;  // Split::remaining is one of the pieces
  bool operator==(const StagePartition&) const = default;
};

struct PartitionPlan {
  // The split to run: split_by_count(group_count, group_sm_count); a device
  // that splits differently (fewer groups) fails check_split().
  std::uint32_t group_sm_count = 0;
  std::uint32_t group_count = 0;
  std::uint32_t remaining_sm_count = 0;
  std::vector<StagePartition> stages;
  std::uint32_t unused_sm_count = 0;  // SMs no stage got
};

// The block: the smallest group a split of `device` makes.
std::uint32_t block_size(const SmResource& device);

// Every SM count one stage can get, ascending: k blocks (k ≥ 1, at least the
// minimum partition) and, when the split leaves a remainder, k blocks plus it.
// 132/8/8 with the arithmetic's 16 groups gives 8, 12, 16, 20, …, 128, 132;
// with an H200's 15 groups, 8, 12, 16, 20, …, 120, 124 (= 14·8 + 12), 132.
std::vector<std::uint32_t> feasible_sm_counts(const SmResource& device);

// `fraction` of the device as the nearest feasible count; EINVAL naming the
// stage when the fraction is outside (0, 1].
base::Result<std::uint32_t> sms_for_fraction(const SmResource& device, std::string_view stage, double fraction);

// The plan for `stages`; EINVAL naming the stage and the numbers when a count
// is below the minimum partition, not expressible from the split's pieces,
// a second stage wants the remainder, a name repeats, or the stages need more
// SMs, or more groups, than the device has.
base::Result<PartitionPlan> plan_partitions(const SmResource& device, std::span<const StageRequest> stages);

// EIO unless `split` is what `plan` expects (group count, sizes, remainder).
base::Result<void> check_split(const PartitionPlan& plan, const Split& split);

// The resources of `split` that make up `stage`'s green context.
std::vector<ResourceId> pieces_for(const StagePartition& stage, const Split& split);

}  // namespace tandem::gpu
