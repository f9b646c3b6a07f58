// The simulated device: the driver's green-context rules as arithmetic.
#include "gpu/sim_device.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <set>

namespace tandem::gpu {
namespace {

std::uint32_t round_up(std::uint32_t v, std::uint32_t to) { return (v + to - 1) / to * to; }

std::uint64_t copy_ns(std::uint64_t bytes, double bytes_per_s) {
  return static_cast<std::uint64_t>(std::ceil(static_cast<double>(bytes) * 1e9 / bytes_per_s));
}

}  // namespace

base::Result<std::unique_ptr<SimDevice>> SimDevice::create(SimDeviceConfig config) {
  if (config.sm_count == 0) return base::make_error(EINVAL, "sim device: sm_count must be > 0");
  if (config.alignment == 0) return base::make_error(EINVAL, "sim device: alignment must be > 0");
  if (config.min_partition_size == 0 || config.min_partition_size > config.sm_count) {
    return base::make_error(EINVAL, fmt::format("sim device: min_partition_size {} must be in 1..{}",
                                                config.min_partition_size, config.sm_count));
  }
  if (config.device_count < 1 || config.ordinal < 0 || config.ordinal >= config.device_count) {
    return base::make_error(
        EINVAL, fmt::format("sim device: ordinal {} outside 0..{}", config.ordinal, config.device_count - 1));
  }
  if (!(config.h2d_bytes_per_s > 0) || !(config.d2h_bytes_per_s > 0)) {
    return base::make_error(EINVAL, "sim device: copy bandwidths must be > 0");
  }
  if (config.greatest_priority > config.least_priority) {
    return base::make_error(EINVAL, "sim device: greatest_priority must be <= least_priority");
  }
  return std::unique_ptr<SimDevice>(new SimDevice(std::move(config)));
}

base::Result<int> SimDevice::device_count() { return config_.device_count; }

base::Result<DeviceInfo> SimDevice::info() {
  return DeviceInfo{.ordinal = config_.ordinal,
                    .name = config_.name,
                    .sm_count = config_.sm_count,
                    .total_memory = config_.memory_bytes};
}

base::Result<SmResource> SimDevice::sm_resource() {
  return SmResource{
      .sm_count = config_.sm_count, .min_partition_size = config_.min_partition_size, .alignment = config_.alignment};
}

base::Result<std::uint32_t> SimDevice::split_group_count(std::uint32_t min_count) {
  constexpr std::string_view kCall = "cuDevSmResourceSplitByCount";
  if (min_count > config_.sm_count) {
    return cu_error(kCall, kCudaErrorInvalidValue,
                    fmt::format("minCount {} exceeds the resource's {} SMs", min_count, config_.sm_count));
  }
  std::uint32_t group = round_up(std::max(min_count, config_.min_partition_size), config_.alignment);
  if (group > config_.sm_count) {
    return cu_error(kCall, kCudaErrorInvalidResourceConfiguration,
                    fmt::format("minCount {} rounds up to {} SMs, more than the resource's {}", min_count, group,
                                config_.sm_count));
  }
  return config_.sm_count / group;
}

base::Result<Split> SimDevice::split_by_count(std::uint32_t max_groups, std::uint32_t min_count) {
  if (max_groups == 0) {
    return cu_error("cuDevSmResourceSplitByCount", kCudaErrorInvalidValue, "nbGroups is 0 with a result array");
  }
  auto possible = split_group_count(min_count);
  if (!possible) return base::propagate(std::move(possible.error()));
  std::uint32_t group = round_up(std::max(min_count, config_.min_partition_size), config_.alignment);
  std::uint32_t n = std::min(max_groups, *possible);

  std::lock_guard lock(mu_);
  std::uint64_t split = next_split_++;
  Split out;
  out.group_sm_count = group;
  for (std::uint32_t i = 0; i < n; ++i) {
    ResourceId id = next_resource_++;
    pieces_[id] = Piece{.split = split, .sm_count = group};
    out.groups.push_back(id);
  }
  out.remaining_sm_count = config_.sm_count - (n * group);
  if (out.remaining_sm_count > 0) {
    ResourceId id = next_resource_++;
    pieces_[id] = Piece{.split = split, .sm_count = out.remaining_sm_count};
    out.remaining = id;
  }
  calls_.push_back(fmt::format("split {}x{}+{}", n, group, out.remaining_sm_count));
  return out;
}

base::Result<GreenCtxId> SimDevice::create_green_context(std::span<const ResourceId> pieces) {
  constexpr std::string_view kCall = "cuDevResourceGenerateDesc";
  if (pieces.empty()) return cu_error(kCall, kCudaErrorInvalidValue, "no resources");
  std::lock_guard lock(mu_);
  std::uint32_t sms = 0;
  std::optional<std::uint64_t> split;
  std::set<ResourceId> seen;
  for (ResourceId id : pieces) {
    auto it = pieces_.find(id);
    if (it == pieces_.end()) {
      return cu_error(kCall, kCudaErrorInvalidValue, fmt::format("resource {} was not made by a split", id));
    }
    if (split && *split != it->second.split) {
      return cu_error(kCall, kCudaErrorInvalidResourceConfiguration,
                      fmt::format("resource {} comes from another split than resource {}", id, pieces.front()));
    }
    if (!seen.insert(id).second) {
      return cu_error(kCall, kCudaErrorInvalidResourceConfiguration, fmt::format("resource {} given twice", id));
    }
    split = it->second.split;
    sms += it->second.sm_count;
  }
  GreenCtxId ctx = next_ctx_++;
  contexts_[ctx] = sms;
  calls_.push_back(fmt::format("ctx {} = {} SMs", ctx, sms));
  return ctx;
}

base::Result<SmResource> SimDevice::green_context_sm_resource(GreenCtxId ctx) {
  std::lock_guard lock(mu_);
  auto it = contexts_.find(ctx);
  if (it == contexts_.end()) {
    return cu_error("cuGreenCtxGetDevResource", kCudaErrorInvalidContext, fmt::format("green context {}", ctx));
  }
  return SmResource{
      .sm_count = it->second, .min_partition_size = config_.min_partition_size, .alignment = config_.alignment};
}

base::Result<StreamId> SimDevice::create_stream(GreenCtxId ctx, int priority) {
  std::lock_guard lock(mu_);
  if (!contexts_.contains(ctx)) {
    return cu_error("cuGreenCtxStreamCreate", kCudaErrorInvalidContext, fmt::format("green context {}", ctx));
  }
  StreamId id = next_stream_++;
  streams_[id] =
      Stream{.ctx = ctx, .priority = std::clamp(priority, config_.greatest_priority, config_.least_priority)};
  calls_.push_back(fmt::format("stream {} in ctx {}", id, ctx));
  return id;
}

base::Result<void> SimDevice::destroy_stream(StreamId stream) {
  std::lock_guard lock(mu_);
  if (streams_.erase(stream) == 0) {
    return cu_error("cuStreamDestroy", kCudaErrorInvalidHandle, fmt::format("stream {}", stream));
  }
  calls_.push_back(fmt::format("destroy stream {}", stream));
  return {};
}

base::Result<void> SimDevice::destroy_green_context(GreenCtxId ctx) {
  std::lock_guard lock(mu_);
  if (!contexts_.contains(ctx)) {
    return cu_error("cuGreenCtxDestroy", kCudaErrorInvalidContext, fmt::format("green context {}", ctx));
  }
  auto live =
      static_cast<std::size_t>(std::ranges::count_if(streams_, [ctx](const auto& kv) { return kv.second.ctx == ctx; }));
  if (live > 0) return live_streams_error(ctx, live);
  contexts_.erase(ctx);
  calls_.push_back(fmt::format("destroy ctx {}", ctx));
  return {};
}

std::uint64_t SimDevice::h2d_copy_ns(std::uint64_t bytes) const { return copy_ns(bytes, config_.h2d_bytes_per_s); }
std::uint64_t SimDevice::d2h_copy_ns(std::uint64_t bytes) const { return copy_ns(bytes, config_.d2h_bytes_per_s); }

std::size_t SimDevice::live_green_contexts() const {
  std::lock_guard lock(mu_);
  return contexts_.size();
}

std::size_t SimDevice::live_streams() const {
  std::lock_guard lock(mu_);
  return streams_.size();
}

int SimDevice::stream_priority(StreamId stream) const {
  std::lock_guard lock(mu_);
  auto it = streams_.find(stream);
  return it == streams_.end() ? -1000 : it->second.priority;
}

std::vector<std::string> SimDevice::calls() const {
  std::lock_guard lock(mu_);
  return calls_;
}

}  // namespace tandem::gpu
