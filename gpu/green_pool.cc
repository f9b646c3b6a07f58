// GreenContextPool: one split, every partition pre-created, switch by index.
// Thread-safety: see green_pool.h (none).
#include "gpu/green_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <set>

#include "gpu/partition.h"

namespace tandem::gpu {
namespace {

// The plan of one (non-full-device) partition: sizes resolved, "the rest"
// rounded down to the largest count the split can give alongside the others.
base::Result<PartitionPlan> plan_partition(const SmResource& device, const std::vector<PoolStage>& stages,
                                           const PoolPartition& partition, std::size_t index) {
  auto context = [&](base::Error e) { return base::propagate(std::move(e), fmt::format("partition {}", index)); };
  if (partition.sizes.size() != stages.size()) {
    return base::make_error(
        EINVAL, fmt::format("partition {}: {} sizes for {} stages", index, partition.sizes.size(), stages.size()));
  }
  std::vector<StageRequest> requests;
  std::optional<std::size_t> rest;
  std::uint32_t others = 0;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const StageSize& size = partition.sizes[s];
    requests.push_back(StageRequest{.stage = stages[s].name, .size = size});
    if (const auto* sms = std::get_if<std::uint32_t>(&size); sms && *sms == 0) {
      if (rest) {
        return base::make_error(EINVAL, fmt::format("partition {}: stages '{}' and '{}' both ask for the rest", index,
                                                    stages[*rest].name, stages[s].name));
      }
      rest = s;
      continue;
    }
    if (const auto* fraction = std::get_if<double>(&size)) {
      auto r = sms_for_fraction(device, stages[s].name, *fraction);
      if (!r) return context(std::move(r.error()));
      others += *r;
    } else {
      others += std::get<std::uint32_t>(size);
    }
  }
  if (!rest) {
    auto plan = plan_partitions(device, requests);
    if (!plan) return context(std::move(plan.error()));
    return plan;
  }
  if (others >= device.sm_count) {
    return base::make_error(
        EINVAL, fmt::format("partition {}: stage '{}' gets the rest, but the others take {} of {} SMs", index,
                            stages[*rest].name, others, device.sm_count));
  }
  std::uint32_t left = device.sm_count - others;
  std::vector<std::uint32_t> feasible = feasible_sm_counts(device);
  // Largest first; a count can still fail when it needs the remainder another
  // stage already has, so try the next one down. If none plans, the first
  // try's error says what is wrong with the other stages.
  std::optional<base::Error> first_error;
  for (auto it = feasible.rbegin(); it != feasible.rend(); ++it) {
    if (*it > left) continue;
    requests[*rest].size = *it;
    auto plan = plan_partitions(device, requests);
    if (plan) return plan;
    if (!first_error) first_error = std::move(plan.error());
  }
  if (first_error) return context(std::move(*first_error));
  return base::make_error(EINVAL, fmt::format("partition {}: no feasible count for stage '{}' in the {} SMs left",
                                              index, stages[*rest].name, left));
}

}  // namespace

base::Result<PoolConfig> two_stage_config(const SmResource& device, const TwoStageOptions& options) {
  if (options.step == 0) return base::make_error(EINVAL, "two-stage pool: step is 0");
  if (options.decode_min > options.decode_max) {
    return base::make_error(EINVAL, fmt::format("two-stage pool: decode_min {} is above decode_max {}",
                                                options.decode_min, options.decode_max));
  }
  PoolConfig config;
  config.stages = {PoolStage{.name = "prefill", .priority = 0}, PoolStage{.name = "decode", .priority = -5}};
  for (std::uint32_t sms : feasible_sm_counts(device)) {
    if (sms < options.decode_min || sms > options.decode_max || sms % options.step != 0) continue;
    if (sms >= device.sm_count) continue;  // prefill needs some
    config.partitions.push_back(PoolPartition{.sizes = {std::uint32_t{0}, sms}});
  }
  if (config.partitions.empty()) {
    return base::make_error(EINVAL,
                            fmt::format("two-stage pool: no feasible decode SM count in [{}, {}] that is a multiple of "
                                        "{} on a {}-SM device",
                                        options.decode_min, options.decode_max, options.step, device.sm_count));
  }
  if (options.full_device) {
    PoolPartition full;
    full.full_device = true;
    config.partitions.push_back(std::move(full));
  }
  if (config.partitions.size() > kMaxPoolPartitions) {
    return base::make_error(EINVAL, fmt::format("two-stage pool: decode SMs [{}, {}] by {} make {} partitions, at most "
                                                "{} are allowed",
                                                options.decode_min, options.decode_max, options.step,
                                                config.partitions.size(), kMaxPoolPartitions));
  }
  return config;
}

base::Result<std::unique_ptr<GreenContextPool>> GreenContextPool::create(DeviceApi& device, PoolConfig config) {
  std::unique_ptr<GreenContextPool> pool(new GreenContextPool(device));
  if (auto ok = pool->build(std::move(config)); !ok) {
    pool->teardown();
    return base::propagate(std::move(ok.error()));
  }
  return pool;
}

GreenContextPool::~GreenContextPool() { teardown(); }

base::Result<void> GreenContextPool::build(PoolConfig config) {
  // ---- validate the config (nothing created yet)
  if (config.stages.size() < kMinPoolStages || config.stages.size() > kMaxPoolStages) {
    return base::make_error(EINVAL, fmt::format("pool: {} stages, {} to {} are allowed", config.stages.size(),
                                                kMinPoolStages, kMaxPoolStages));
  }
  std::set<std::string, std::less<>> names;
  for (const PoolStage& stage : config.stages) {
    if (stage.name.empty()) return base::make_error(EINVAL, "pool: a stage has an empty name");
    if (!names.insert(stage.name).second) {
      return base::make_error(EINVAL, fmt::format("pool: stage '{}' is named twice", stage.name));
    }
  }
  if (config.partitions.empty() || config.partitions.size() > kMaxPoolPartitions) {
    return base::make_error(
        EINVAL, fmt::format("pool: {} partitions, 1 to {} are allowed", config.partitions.size(), kMaxPoolPartitions));
  }
  decode_stage_ = config.stages.size() - 1;
  for (std::size_t s = 0; s < config.stages.size(); ++s) {
    if (config.stages[s].name == "decode") decode_stage_ = s;
  }

  auto sm = device_.sm_resource();
  if (!sm) return base::propagate(std::move(sm.error()));
  device_sms_ = sm->sm_count;

  std::vector<std::optional<PartitionPlan>> plans;
  const PartitionPlan* any_plan = nullptr;
  for (std::size_t p = 0; p < config.partitions.size(); ++p) {
    if (config.partitions[p].full_device) {
      plans.emplace_back();
      continue;
    }
    auto plan = plan_partition(*sm, config.stages, config.partitions[p], p);
    if (!plan) return base::propagate(std::move(plan.error()));
    plans.emplace_back(std::move(*plan));
  }
  std::uint32_t previous = 0;
  for (std::size_t p = 0; p < plans.size(); ++p) {
    std::uint32_t decode = plans[p] ? plans[p]->stages[decode_stage_].sm_count : sm->sm_count;
    if (p > 0 && decode <= previous) {
      return base::make_error(EINVAL, fmt::format("pool: partition {} gives stage '{}' {} SMs, not more than partition "
                                                  "{}'s {} (partitions are ordered by it, strictly increasing)",
                                                  p, config.stages[decode_stage_].name, decode, p - 1, previous));
    }
    previous = decode;
    if (plans[p] && !any_plan) any_plan = &*plans[p];
  }

  for (const PoolStage& stage : config.stages) {
    Stage& added = stages_.emplace_back();
    added.name = stage.name;
    added.priority = stage.priority;
  }

  // ---- the one split (plans of one device all describe the same split)
  Split split;
  if (any_plan) {
    auto r = device_.split_by_count(any_plan->group_count, any_plan->group_sm_count);
    if (!r) return base::propagate(std::move(r.error()));
    split = std::move(*r);
    if (auto ok = check_split(*any_plan, split); !ok) return base::propagate(std::move(ok.error()));
  }

  // ---- every partition: a context per stage (verified), then its stream
  for (std::size_t p = 0; p < plans.size(); ++p) {
    Partition& partition = partitions_.emplace_back();
    partition.full_device = !plans[p].has_value();
    for (std::size_t s = 0; s < stages_.size(); ++s) {
      partition.slots.emplace_back();
      StageSlot& slot = partition.slots.back();
      if (!plans[p]) {
        slot.sm_count = sm->sm_count;
        auto stream = device_.create_plain_stream(stages_[s].priority);
        if (!stream) return base::propagate(std::move(stream.error()));
        slot.stream = *stream;
        continue;
      }
      const StagePartition& part = plans[p]->stages[s];
      slot.sm_count = part.sm_count;
      std::vector<ResourceId> pieces = pieces_for(part, split);
      auto ctx = device_.create_green_context(pieces);
      if (!ctx) return base::propagate(std::move(ctx.error()));
      slot.ctx = *ctx;
      auto got = device_.green_context_sm_resource(*ctx);
      if (!got) return base::propagate(std::move(got.error()));
      if (got->sm_count != part.sm_count) {
        return base::make_error(EIO, fmt::format("partition {} stage '{}': wanted {} SMs, the green context got {}", p,
                                                 stages_[s].name, part.sm_count, got->sm_count));
      }
      auto stream = device_.create_stream(*ctx, stages_[s].priority);
      if (!stream) return base::propagate(std::move(stream.error()));
      slot.stream = *stream;
    }
  }
  for (Stage& stage : stages_) {
    auto event = device_.create_event();
    if (!event) return base::propagate(std::move(event.error()));
    stage.event = *event;
  }
  // Until told otherwise, the most decode SMs (the full device when there is
  // one): what the engine would have without tandem, or closest to it.
  active_ = partitions_.size() - 1;
  return {};
}

void GreenContextPool::teardown() {
  // Work still queued ends first (cuGreenCtxDestroy with kernels in flight
  // is not documented as safe), then streams before their context (a
  // context with live streams refuses to go, device.h); errors cannot be
  // acted on here, so they are ignored.
  for (Partition& partition : partitions_) {
    for (StageSlot& slot : partition.slots) {
      if (slot.stream) (void)device_.stream_synchronize(*slot.stream);
    }
  }
  for (Partition& partition : partitions_) {
    for (StageSlot& slot : partition.slots) {
      if (slot.stream) (void)device_.destroy_stream(*slot.stream);
      if (slot.ctx) (void)device_.destroy_green_context(*slot.ctx);
      slot.stream.reset();
      slot.ctx.reset();
    }
  }
  partitions_.clear();
  for (Stage& stage : stages_) {
    if (stage.event) (void)device_.destroy_event(*stage.event);
    stage.event.reset();
  }
}

base::Result<std::size_t> GreenContextPool::stage(std::string_view name) const {
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    if (stages_[s].name == name) return s;
  }
  return base::make_error(ENOENT, fmt::format("no stage '{}' in the pool", name));
}

std::vector<std::uint32_t> GreenContextPool::decode_sms() const {
  std::vector<std::uint32_t> out;
  out.reserve(partitions_.size());
  for (const Partition& partition : partitions_) out.push_back(partition.slots[decode_stage_].sm_count);
  return out;
}

std::uint32_t GreenContextPool::sm_count(std::size_t partition, std::size_t stage) const {
  assert(partition < partitions_.size() && stage < stages_.size());
  return partitions_[partition].slots[stage].sm_count;
}

StreamId GreenContextPool::stream(std::size_t stage) const { return stream(active_, stage); }

StreamId GreenContextPool::stream(std::size_t partition, std::size_t stage) const {
  assert(partition < partitions_.size() && stage < stages_.size());
  return *partitions_[partition].slots[stage].stream;
}

GreenCtxId GreenContextPool::context(std::size_t stage) const {
  assert(stage < stages_.size());
  return partitions_[active_].slots[stage].ctx.value_or(0);
}

base::Result<void> GreenContextPool::begin_pass(std::size_t index) {
  if (index >= partitions_.size()) {
    ++counters_.bad_indices;
    return base::make_error(ERANGE, fmt::format("partition index {} is out of range: the pool has {} partitions", index,
                                                partitions_.size()));
  }
  if (index == active_) return {};
  // Every stage's new stream waits for what its old stream has queued: the
  // previous pass's work stays ordered before the next pass's, no host sync.
  // A failure part-way leaves extra waits queued, which are harmless.
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    StreamId from = stream(active_, s);
    StreamId to = stream(index, s);
    if (auto ok = device_.record_event(*stages_[s].event, from); !ok) return base::propagate(std::move(ok.error()));
    if (auto ok = device_.stream_wait_event(to, *stages_[s].event); !ok) {
      return base::propagate(std::move(ok.error()));
    }
  }
  active_ = index;
  ++counters_.switches;
  return {};
}

}  // namespace tandem::gpu
