// The simulated device: the driver's green-context rules as arithmetic.
#include "gpu/sim_device.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <new>
#include <set>

namespace tandem::gpu {
namespace {

std::uint32_t round_up(std::uint32_t v, std::uint32_t to) { return (v + to - 1) / to * to; }

std::uint64_t copy_ns(std::uint64_t bytes, double bytes_per_s) {
  return static_cast<std::uint64_t>(std::ceil(static_cast<double>(bytes) * 1e9 / bytes_per_s));
}

// Native stream tokens: distinct, non-null, never dereferenced.
constexpr std::uintptr_t kNativeStreamBase = 0x5e0000000000;
constexpr std::uintptr_t kNativeStreamStride = 16;
constexpr std::uintptr_t kNativeContextBase = 0x5c0000000000;  // + 16 · id; id 0: the primary context

// Device allocations are 256-byte aligned, with a 256-byte gap between them
// so an overrun never lands in a neighbour.
constexpr std::uint64_t kAllocAlign = 256;

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
  if (!(config.flops_per_sm_per_s > 0) || !(config.hbm_bytes_per_s > 0) || !(config.bytes_per_sm_per_s > 0)) {
    return base::make_error(EINVAL,
                            fmt::format("sim device: flops_per_sm_per_s {}, hbm_bytes_per_s {} and "
                                        "bytes_per_sm_per_s {} must all be > 0",
                                        config.flops_per_sm_per_s, config.hbm_bytes_per_s, config.bytes_per_sm_per_s));
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
  SmResource res{
      .sm_count = config_.sm_count, .min_partition_size = config_.min_partition_size, .alignment = config_.alignment};
  if (auto n = split_group_count(config_.min_partition_size); n) res.groups = *n;
  return res;
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
  const std::uint32_t smallest = round_up(config_.min_partition_size, config_.alignment);
  if (group == smallest && config_.block_groups > 0) return std::min(config_.block_groups, config_.sm_count / group);
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

// --- Memory.

base::Result<DevicePtr> SimDevice::alloc_device(std::uint64_t bytes) {
  constexpr std::string_view kCall = "cuMemAlloc";
  if (bytes == 0) return cu_error(kCall, kCudaErrorInvalidValue, "bytesize 0");
  std::lock_guard lock(mu_);
  if (bytes > config_.memory_bytes - device_bytes_) {
    return cu_error(kCall, kCudaErrorOutOfMemory,
                    fmt::format("{} bytes requested, {} of {} in use", bytes, device_bytes_, config_.memory_bytes));
  }
  Allocation a{.data = nullptr, .bytes = bytes};
  try {
    // Uninitialised, like cuMemAlloc; pages are committed only when written.
    a.data = std::make_unique_for_overwrite<std::byte[]>(bytes);
  } catch (const std::bad_alloc&) {
    return cu_error(kCall, kCudaErrorOutOfMemory, fmt::format("{} bytes: the host backing failed", bytes));
  }
  DevicePtr ptr = next_address_;
  next_address_ += ((bytes + kAllocAlign - 1) / kAllocAlign + 1) * kAllocAlign;
  allocations_.emplace(ptr, std::move(a));
  device_bytes_ += bytes;
  calls_.push_back(fmt::format("alloc {} = {:#x}", bytes, ptr));
  return ptr;
}

base::Result<void> SimDevice::free_device(DevicePtr ptr) {
  std::lock_guard lock(mu_);
  auto it = allocations_.find(ptr);
  if (it == allocations_.end()) {
    return cu_error("cuMemFree", kCudaErrorInvalidValue, fmt::format("{:#x} is not a live allocation", ptr));
  }
  device_bytes_ -= it->second.bytes;
  allocations_.erase(it);
  calls_.push_back(fmt::format("free {:#x}", ptr));
  return {};
}

base::Result<void*> SimDevice::alloc_pinned_host(std::uint64_t bytes) {
  constexpr std::string_view kCall = "cuMemHostAlloc";
  if (bytes == 0) return cu_error(kCall, kCudaErrorInvalidValue, "bytesize 0");
  std::lock_guard lock(mu_);
  Allocation a{.data = nullptr, .bytes = bytes};
  try {
    a.data = std::make_unique_for_overwrite<std::byte[]>(bytes);
  } catch (const std::bad_alloc&) {
    return cu_error(kCall, kCudaErrorOutOfMemory, fmt::format("{} bytes", bytes));
  }
  void* p = a.data.get();
  pinned_.emplace(p, std::move(a));
  pinned_bytes_ += bytes;
  calls_.push_back(fmt::format("pinned {}", bytes));
  return p;
}

base::Result<void> SimDevice::free_pinned_host(void* ptr) {
  std::lock_guard lock(mu_);
  auto it = pinned_.find(ptr);
  if (it == pinned_.end()) {
    return cu_error("cuMemFreeHost", kCudaErrorInvalidValue, fmt::format("{} is not a live pinned allocation", ptr));
  }
  std::uint64_t bytes = it->second.bytes;
  pinned_bytes_ -= bytes;
  pinned_.erase(it);
  calls_.push_back(fmt::format("free pinned {}", bytes));
  return {};
}

std::map<DevicePtr, SimDevice::Allocation>::const_iterator SimDevice::find_allocation(DevicePtr ptr,
                                                                                      std::uint64_t bytes) const {
  auto it = allocations_.upper_bound(ptr);
  if (it == allocations_.begin()) return allocations_.end();
  --it;
  std::uint64_t offset = ptr - it->first;
  if (offset >= it->second.bytes || bytes > it->second.bytes - offset) return allocations_.end();
  return it;
}

// --- Streams.

base::Result<StreamId> SimDevice::create_plain_stream(int priority) {
  std::lock_guard lock(mu_);
  StreamId id = next_stream_++;
  streams_[id] = Stream{.ctx = 0, .priority = std::clamp(priority, config_.greatest_priority, config_.least_priority)};
  calls_.push_back(fmt::format("plain stream {}", id));
  return id;
}

base::Result<void*> SimDevice::native_stream(StreamId stream) {
  std::lock_guard lock(mu_);
  if (!streams_.contains(stream)) {
    return cu_error("native_stream", kCudaErrorInvalidHandle, fmt::format("stream {}", stream));
  }
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast,performance-no-int-to-ptr): an opaque token
  return reinterpret_cast<void*>(kNativeStreamBase + (stream * kNativeStreamStride));
}

base::Result<void*> SimDevice::native_context(GreenCtxId ctx) {
  std::lock_guard lock(mu_);
  if (ctx != 0 && !contexts_.contains(ctx)) {
    return cu_error("cuCtxFromGreenCtx", kCudaErrorInvalidContext, fmt::format("green context {}", ctx));
  }
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast,performance-no-int-to-ptr): an opaque token
  return reinterpret_cast<void*>(kNativeContextBase + (ctx * kNativeStreamStride));
}

base::Result<StreamId> SimDevice::stream_for_native(void* native) {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): an opaque token
  auto v = reinterpret_cast<std::uintptr_t>(native);
  std::lock_guard lock(mu_);
  if (v > kNativeStreamBase && (v - kNativeStreamBase) % kNativeStreamStride == 0) {
    StreamId id = (v - kNativeStreamBase) / kNativeStreamStride;
    if (streams_.contains(id)) return id;
  }
  return cu_error("stream_for_native", kCudaErrorInvalidHandle, fmt::format("{} is not a live stream", native));
}

std::uint32_t SimDevice::stream_sm_count(const Stream& s) const {
  if (s.ctx == 0) return config_.sm_count;
  auto it = contexts_.find(s.ctx);
  return it == contexts_.end() ? config_.sm_count : it->second;
}

// --- Copies, kernels and events.

base::Result<void> SimDevice::copy_h2d_async(DevicePtr dst, const void* src, std::uint64_t bytes, StreamId stream) {
  constexpr std::string_view kCall = "cuMemcpyHtoDAsync";
  std::lock_guard lock(mu_);
  auto s = streams_.find(stream);
  if (s == streams_.end()) return cu_error(kCall, kCudaErrorInvalidHandle, fmt::format("stream {}", stream));
  if (bytes == 0) return {};
  if (src == nullptr) return cu_error(kCall, kCudaErrorInvalidValue, "srcHost is NULL");
  auto a = find_allocation(dst, bytes);
  if (a == allocations_.end()) {
    return cu_error(kCall, kCudaErrorInvalidValue,
                    fmt::format("{} bytes at {:#x} are not inside one live allocation", bytes, dst));
  }
  std::memcpy(a->second.data.get() + (dst - a->first), src, bytes);
  std::uint64_t start = std::max({now_ns_, s->second.tail_ns, copy_engine_tail_ns_});
  std::uint64_t end = start + h2d_copy_ns(bytes);
  s->second.tail_ns = end;
  copy_engine_tail_ns_ = end;
  ops_.push_back(SimOp{
      .kind = SimOp::Kind::kCopyH2D, .stream = stream, .start_ns = start, .end_ns = end, .dst = dst, .bytes = bytes});
  return {};
}

base::Result<void> SimDevice::launch_kernel(StreamId stream, KernelWork work) {
  constexpr std::string_view kCall = "cuLaunchKernel";
  if (!std::isfinite(work.flops) || !std::isfinite(work.bytes) || work.flops < 0 || work.bytes < 0) {
    return cu_error(kCall, kCudaErrorInvalidValue, fmt::format("work of {} flops, {} bytes", work.flops, work.bytes));
  }
  std::lock_guard lock(mu_);
  auto s = streams_.find(stream);
  if (s == streams_.end()) return cu_error(kCall, kCudaErrorInvalidHandle, fmt::format("stream {}", stream));
  std::uint64_t start = std::max(now_ns_, s->second.tail_ns);
  std::uint64_t end = start + kernel_ns(work, stream_sm_count(s->second));
  s->second.tail_ns = end;
  ops_.push_back(SimOp{.kind = SimOp::Kind::kKernel, .stream = stream, .start_ns = start, .end_ns = end});
  return {};
}

base::Result<EventId> SimDevice::create_event() {
  std::lock_guard lock(mu_);
  EventId id = next_event_++;
  events_[id] = Event{};
  calls_.push_back(fmt::format("event {}", id));
  return id;
}

base::Result<void> SimDevice::destroy_event(EventId event) {
  std::lock_guard lock(mu_);
  if (events_.erase(event) == 0) {
    return cu_error("cuEventDestroy", kCudaErrorInvalidHandle, fmt::format("event {}", event));
  }
  calls_.push_back(fmt::format("destroy event {}", event));
  return {};
}

base::Result<void> SimDevice::record_event(EventId event, StreamId stream) {
  constexpr std::string_view kCall = "cuEventRecord";
  std::lock_guard lock(mu_);
  auto e = events_.find(event);
  if (e == events_.end()) return cu_error(kCall, kCudaErrorInvalidHandle, fmt::format("event {}", event));
  auto s = streams_.find(stream);
  if (s == streams_.end()) return cu_error(kCall, kCudaErrorInvalidHandle, fmt::format("stream {}", stream));
  e->second = Event{.recorded = true, .complete_ns = s->second.tail_ns};
  return {};
}

base::Result<void> SimDevice::stream_wait_event(StreamId stream, EventId event) {
  constexpr std::string_view kCall = "cuStreamWaitEvent";
  std::lock_guard lock(mu_);
  auto s = streams_.find(stream);
  if (s == streams_.end()) return cu_error(kCall, kCudaErrorInvalidHandle, fmt::format("stream {}", stream));
  auto e = events_.find(event);
  if (e == events_.end()) return cu_error(kCall, kCudaErrorInvalidHandle, fmt::format("event {}", event));
  // Work enqueued after this point starts no earlier than the event.
  s->second.tail_ns = std::max(s->second.tail_ns, e->second.complete_ns);
  return {};
}

base::Result<bool> SimDevice::event_done(EventId event) {
  std::lock_guard lock(mu_);
  auto e = events_.find(event);
  if (e == events_.end()) return cu_error("cuEventQuery", kCudaErrorInvalidHandle, fmt::format("event {}", event));
  return e->second.complete_ns <= now_ns_;
}

base::Result<void> SimDevice::event_synchronize(EventId event) {
  std::lock_guard lock(mu_);
  auto e = events_.find(event);
  if (e == events_.end()) {
    return cu_error("cuEventSynchronize", kCudaErrorInvalidHandle, fmt::format("event {}", event));
  }
  now_ns_ = std::max(now_ns_, e->second.complete_ns);
  return {};
}

base::Result<void> SimDevice::stream_synchronize(StreamId stream) {
  std::lock_guard lock(mu_);
  auto s = streams_.find(stream);
  if (s == streams_.end()) {
    return cu_error("cuStreamSynchronize", kCudaErrorInvalidHandle, fmt::format("stream {}", stream));
  }
  now_ns_ = std::max(now_ns_, s->second.tail_ns);
  return {};
}

std::uint64_t SimDevice::now_ns() const {
  std::lock_guard lock(mu_);
  return now_ns_;
}

void SimDevice::advance(std::uint64_t ns) {
  std::lock_guard lock(mu_);
  now_ns_ += ns;
}

base::Result<std::uint64_t> SimDevice::stream_tail_ns(StreamId stream) const {
  std::lock_guard lock(mu_);
  auto s = streams_.find(stream);
  if (s == streams_.end()) return cu_error("stream_tail_ns", kCudaErrorInvalidHandle, fmt::format("stream {}", stream));
  return s->second.tail_ns;
}

base::Result<std::uint64_t> SimDevice::event_time_ns(EventId event) const {
  std::lock_guard lock(mu_);
  auto e = events_.find(event);
  if (e == events_.end()) return cu_error("event_time_ns", kCudaErrorInvalidHandle, fmt::format("event {}", event));
  return e->second.complete_ns;
}

std::uint64_t SimDevice::kernel_ns(KernelWork work, std::uint32_t sm_count) const {
  if (sm_count == 0 || !(work.flops > 0 || work.bytes > 0)) return 0;
  double sms = sm_count;
  // In ns directly (work · 1e9 / rate), so round numbers stay exact.
  double compute_ns = std::max(work.flops, 0.0) * 1e9 / (sms * config_.flops_per_sm_per_s);
  double memory_ns =
      std::max(work.bytes, 0.0) * 1e9 / std::min(config_.hbm_bytes_per_s, sms * config_.bytes_per_sm_per_s);
  return static_cast<std::uint64_t>(std::ceil(std::max(compute_ns, memory_ns)));
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

std::size_t SimDevice::live_events() const {
  std::lock_guard lock(mu_);
  return events_.size();
}

std::size_t SimDevice::live_device_allocations() const {
  std::lock_guard lock(mu_);
  return allocations_.size();
}

std::uint64_t SimDevice::device_bytes_in_use() const {
  std::lock_guard lock(mu_);
  return device_bytes_;
}

std::size_t SimDevice::live_pinned_allocations() const {
  std::lock_guard lock(mu_);
  return pinned_.size();
}

std::uint64_t SimDevice::pinned_bytes_in_use() const {
  std::lock_guard lock(mu_);
  return pinned_bytes_;
}

base::Result<std::vector<std::byte>> SimDevice::read_device(DevicePtr ptr, std::uint64_t bytes) const {
  std::lock_guard lock(mu_);
  auto a = find_allocation(ptr, bytes);
  if (a == allocations_.end()) {
    return base::make_error(
        EINVAL, fmt::format("read_device: {} bytes at {:#x} are not inside one live allocation", bytes, ptr));
  }
  const std::byte* p = a->second.data.get() + (ptr - a->first);
  return std::vector<std::byte>(p, p + bytes);
}

std::vector<SimOp> SimDevice::ops() const {
  std::lock_guard lock(mu_);
  return ops_;
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
