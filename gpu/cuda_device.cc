// The CUDA driver backend: libcuda.so.1 through dlopen + cuGetProcAddress,
// compiled only when cuda.h is available (TANDEM_HAVE_CUDA_H).
#include "gpu/cuda_device.h"

#include <cerrno>

#ifdef TANDEM_HAVE_CUDA_H

#include <cuda.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <vector>

#include "gpu/cuda_loader.h"
#include "gpu/partition.h"

namespace tandem::gpu {
namespace {

// The entry points tandem uses; decltype of the header's declarations, so a
// signature can never drift from cuda.h. Names without the _v2 suffixes the
// header's macros add: cuGetProcAddress picks the version from CUDA_VERSION.
struct Driver {
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDriverGetVersion) driver_get_version = nullptr;
  decltype(&::cuDeviceGetCount) device_get_count = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetName) device_get_name = nullptr;
  decltype(&::cuDeviceTotalMem) device_total_mem = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) primary_ctx_release = nullptr;
  decltype(&::cuDeviceGetDevResource) device_get_dev_resource = nullptr;
  decltype(&::cuDevSmResourceSplitByCount) dev_sm_resource_split_by_count = nullptr;
  decltype(&::cuDevResourceGenerateDesc) dev_resource_generate_desc = nullptr;
  decltype(&::cuGreenCtxCreate) green_ctx_create = nullptr;
  decltype(&::cuGreenCtxGetDevResource) green_ctx_get_dev_resource = nullptr;
  decltype(&::cuGreenCtxStreamCreate) green_ctx_stream_create = nullptr;
  decltype(&::cuStreamDestroy) stream_destroy = nullptr;
  decltype(&::cuGreenCtxDestroy) green_ctx_destroy = nullptr;
  decltype(&::cuCtxPushCurrent) ctx_push_current = nullptr;
  decltype(&::cuCtxPopCurrent) ctx_pop_current = nullptr;
  decltype(&::cuCtxFromGreenCtx) ctx_from_green_ctx = nullptr;
  decltype(&::cuMemAlloc) mem_alloc = nullptr;
  decltype(&::cuMemFree) mem_free = nullptr;
  decltype(&::cuMemHostAlloc) mem_host_alloc = nullptr;
  decltype(&::cuMemFreeHost) mem_free_host = nullptr;
  decltype(&::cuStreamCreateWithPriority) stream_create_with_priority = nullptr;
  decltype(&::cuMemcpyHtoDAsync) memcpy_htod_async = nullptr;
  decltype(&::cuEventCreate) event_create = nullptr;
  decltype(&::cuEventDestroy) event_destroy = nullptr;
  decltype(&::cuEventRecord) event_record = nullptr;
  decltype(&::cuStreamWaitEvent) stream_wait_event = nullptr;
  decltype(&::cuEventQuery) event_query = nullptr;
  decltype(&::cuEventSynchronize) event_synchronize = nullptr;
  decltype(&::cuStreamSynchronize) stream_synchronize = nullptr;

  // "<call>: CUDA_ERROR_…: <cuGetErrorString>[: detail]".
  std::unexpected<base::Error> error(std::string_view call, CUresult r, std::string_view detail = {}) const {
    return cuda_loader::driver_error(get_error_name, get_error_string, call, r, detail);
  }
};

// The host→device bandwidth h2d_bytes_per_s() reports: PCIe 4.0 x16 moves
// about 25 GB/s each way from pinned memory. Not measured; conservative for
// PCIe 5.0 hosts (about 50 GB/s), optimistic for narrower links.
constexpr double kDefaultH2dBytesPerS = 25e9;

// Green-context streams (cuGreenCtxStreamCreate) arrived in 12.5.
constexpr int kMinDriverVersion = 12050;

base::Result<Driver> load_driver() {
  auto opened = cuda_loader::open_libcuda();
  if (!opened) return std::unexpected(std::move(opened.error()));
  const cuda_loader::GetProcAddress get = *opened;
  Driver d;
  std::string missing;
  // The driver's version first: it picks the ABI to ask for (no newer than the
  // header's, no newer than the driver's), and it best explains missing symbols.
  int version = 0;
  if (!cuda_loader::resolve(get, "cuDriverGetVersion", CUDA_VERSION, &d.driver_get_version, &missing) ||
      d.driver_get_version(&version) != CUDA_SUCCESS) {
    return base::make_error(ENOTSUP, "libcuda.so.1: cuDriverGetVersion is unavailable");
  }
  if (version < kMinDriverVersion) {
    return base::make_error(ENOTSUP, fmt::format("CUDA driver {}.{} is too old: green-context streams need 12.5",
                                                 version / 1000, (version % 1000) / 10));
  }
  const int abi = std::min(version, CUDA_VERSION);
  cuda_loader::resolve(get, "cuGetErrorName", abi, &d.get_error_name, &missing);
  cuda_loader::resolve(get, "cuGetErrorString", abi, &d.get_error_string, &missing);
  cuda_loader::resolve(get, "cuInit", abi, &d.init, &missing);
  cuda_loader::resolve(get, "cuDeviceGetCount", abi, &d.device_get_count, &missing);
  cuda_loader::resolve(get, "cuDeviceGet", abi, &d.device_get, &missing);
  cuda_loader::resolve(get, "cuDeviceGetName", abi, &d.device_get_name, &missing);
  cuda_loader::resolve(get, "cuDeviceTotalMem", abi, &d.device_total_mem, &missing);
  cuda_loader::resolve(get, "cuDeviceGetAttribute", abi, &d.device_get_attribute, &missing);
  cuda_loader::resolve(get, "cuDevicePrimaryCtxRetain", abi, &d.primary_ctx_retain, &missing);
  cuda_loader::resolve(get, "cuDevicePrimaryCtxRelease", abi, &d.primary_ctx_release, &missing);
  cuda_loader::resolve(get, "cuDeviceGetDevResource", abi, &d.device_get_dev_resource, &missing);
  cuda_loader::resolve(get, "cuDevSmResourceSplitByCount", abi, &d.dev_sm_resource_split_by_count, &missing);
  cuda_loader::resolve(get, "cuDevResourceGenerateDesc", abi, &d.dev_resource_generate_desc, &missing);
  cuda_loader::resolve(get, "cuGreenCtxCreate", abi, &d.green_ctx_create, &missing);
  cuda_loader::resolve(get, "cuGreenCtxGetDevResource", abi, &d.green_ctx_get_dev_resource, &missing);
  cuda_loader::resolve(get, "cuGreenCtxStreamCreate", abi, &d.green_ctx_stream_create, &missing);
  cuda_loader::resolve(get, "cuStreamDestroy", abi, &d.stream_destroy, &missing);
  cuda_loader::resolve(get, "cuGreenCtxDestroy", abi, &d.green_ctx_destroy, &missing);
  cuda_loader::resolve(get, "cuCtxPushCurrent", abi, &d.ctx_push_current, &missing);
  cuda_loader::resolve(get, "cuCtxPopCurrent", abi, &d.ctx_pop_current, &missing);
  cuda_loader::resolve(get, "cuCtxFromGreenCtx", abi, &d.ctx_from_green_ctx, &missing);
  cuda_loader::resolve(get, "cuMemAlloc", abi, &d.mem_alloc, &missing);
  cuda_loader::resolve(get, "cuMemFree", abi, &d.mem_free, &missing);
  cuda_loader::resolve(get, "cuMemHostAlloc", abi, &d.mem_host_alloc, &missing);
  cuda_loader::resolve(get, "cuMemFreeHost", abi, &d.mem_free_host, &missing);
  cuda_loader::resolve(get, "cuStreamCreateWithPriority", abi, &d.stream_create_with_priority, &missing);
  cuda_loader::resolve(get, "cuMemcpyHtoDAsync", abi, &d.memcpy_htod_async, &missing);
  cuda_loader::resolve(get, "cuEventCreate", abi, &d.event_create, &missing);
  cuda_loader::resolve(get, "cuEventDestroy", abi, &d.event_destroy, &missing);
  cuda_loader::resolve(get, "cuEventRecord", abi, &d.event_record, &missing);
  cuda_loader::resolve(get, "cuStreamWaitEvent", abi, &d.stream_wait_event, &missing);
  cuda_loader::resolve(get, "cuEventQuery", abi, &d.event_query, &missing);
  cuda_loader::resolve(get, "cuEventSynchronize", abi, &d.event_synchronize, &missing);
  cuda_loader::resolve(get, "cuStreamSynchronize", abi, &d.stream_synchronize, &missing);
  if (!missing.empty()) return base::make_error(ENOTSUP, fmt::format("libcuda.so.1 lacks {}", missing));
  if (CUresult r = d.init(0); r != CUDA_SUCCESS) return d.error("cuInit", r);
  return d;
}

// One load per process; a failure is remembered (a driver does not appear
// while a process runs).
const base::Result<Driver>& driver() {
  static const base::Result<Driver> kDriver = load_driver();
  return kDriver;
}

class CudaDevice final : public DeviceApi {
 public:
  CudaDevice(const Driver& d, int ordinal, CUdevice dev, CUcontext primary, CUdevResource all)
      : d_(d), ordinal_(ordinal), dev_(dev), primary_(primary), all_(all) {}
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  ~CudaDevice() override {
    std::lock_guard lock(mu_);
    // The primary context is pushed, not set: the caller's current context
    // is back when this returns. Streams before their contexts
    // (cuGreenCtxDestroy does not destroy them), events before the contexts
    // they were made in, memory, and all of it before the primary context
    // goes.
    const bool pushed = d_.ctx_push_current(primary_) == CUDA_SUCCESS;
    for (auto& [id, s] : streams_) (void)d_.stream_destroy(s.stream);
    for (auto& [id, e] : events_) {
      for (auto& [ctx, ev] : e.per_ctx) (void)d_.event_destroy(ev);
    }
    for (auto& [id, g] : contexts_) (void)d_.green_ctx_destroy(g);
    for (auto& [ptr, bytes] : device_memory_) (void)d_.mem_free(ptr);
    for (auto& [ptr, bytes] : pinned_) (void)d_.mem_free_host(ptr);
    if (pushed) {
      CUcontext popped = nullptr;
      (void)d_.ctx_pop_current(&popped);
    }
    (void)d_.primary_ctx_release(dev_);
  }

  std::string_view backend() const override { return "cuda"; }

  base::Result<int> device_count() override {
    int n = 0;
    if (CUresult r = d_.device_get_count(&n); r != CUDA_SUCCESS) return d_.error("cuDeviceGetCount", r);
    return n;
  }

  base::Result<DeviceInfo> info() override {
    std::lock_guard lock(mu_);
    std::array<char, 256> name{};
    if (CUresult r = d_.device_get_name(name.data(), static_cast<int>(name.size()), dev_); r != CUDA_SUCCESS) {
      return d_.error("cuDeviceGetName", r);
    }
    size_t bytes = 0;
    if (CUresult r = d_.device_total_mem(&bytes, dev_); r != CUDA_SUCCESS) return d_.error("cuDeviceTotalMem", r);
    int sms = 0;
    if (CUresult r = d_.device_get_attribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev_); r != CUDA_SUCCESS) {
      return d_.error("cuDeviceGetAttribute", r, "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT");
    }
    return DeviceInfo{.ordinal = ordinal_,
                      .name = std::string(name.data()),
                      .sm_count = static_cast<std::uint32_t>(sms),
                      .total_memory = bytes};
  }

  base::Result<SmResource> sm_resource() override {
    SmResource res = to_sm(all_);
    // How many groups of the smallest size the driver really makes (GPCs).
    if (res.sm_count > 0 && res.min_partition_size > 0) {
      if (auto n = split_group_count(block_size(res)); n) res.groups = *n;
    }
    return res;
  }

  base::Result<std::uint32_t> split_group_count(std::uint32_t min_count) override {
    std::lock_guard lock(mu_);
    unsigned int nb = 0;
    if (CUresult r = d_.dev_sm_resource_split_by_count(nullptr, &nb, &all_, nullptr, 0, min_count); r != CUDA_SUCCESS) {
      return d_.error("cuDevSmResourceSplitByCount", r, fmt::format("query, minCount {}", min_count));
    }
    return nb;
  }

  base::Result<Split> split_by_count(std::uint32_t max_groups, std::uint32_t min_count) override {
    // A NULL result array would turn the call into a query.
    if (max_groups == 0) {
      return cu_error("cuDevSmResourceSplitByCount", kCudaErrorInvalidValue, "nbGroups is 0 with a result array");
    }
    std::lock_guard lock(mu_);
    std::vector<CUdevResource> groups(max_groups);
    CUdevResource rem{};
    unsigned int nb = max_groups;
    if (CUresult r = d_.dev_sm_resource_split_by_count(groups.data(), &nb, &all_, &rem, 0, min_count);
        r != CUDA_SUCCESS) {
      return d_.error("cuDevSmResourceSplitByCount", r, fmt::format("{} groups, minCount {}", max_groups, min_count));
    }
    Split out;
    for (unsigned int i = 0; i < nb && i < max_groups; ++i) {
      ResourceId id = next_resource_++;
      pieces_[id] = groups[i];
      out.groups.push_back(id);
      out.group_sm_count = groups[i].sm.smCount;
    }
    if (rem.type == CU_DEV_RESOURCE_TYPE_SM && rem.sm.smCount > 0) {
      ResourceId id = next_resource_++;
      pieces_[id] = rem;
      out.remaining = id;
      out.remaining_sm_count = rem.sm.smCount;
    }
    return out;
  }

  base::Result<GreenCtxId> create_green_context(std::span<const ResourceId> pieces) override {
    std::lock_guard lock(mu_);
    std::vector<CUdevResource> res;
    for (ResourceId id : pieces) {
      auto it = pieces_.find(id);
      if (it == pieces_.end()) {
        return cu_error("cuDevResourceGenerateDesc", kCudaErrorInvalidValue,
                        fmt::format("resource {} was not made by a split", id));
      }
      res.push_back(it->second);
    }
    CUdevResourceDesc desc = nullptr;
    if (CUresult r = d_.dev_resource_generate_desc(&desc, res.data(), static_cast<unsigned int>(res.size()));
        r != CUDA_SUCCESS) {
      return d_.error("cuDevResourceGenerateDesc", r, fmt::format("{} resources", res.size()));
    }
    CUgreenCtx g = nullptr;
    if (CUresult r = d_.green_ctx_create(&g, desc, dev_, CU_GREEN_CTX_DEFAULT_STREAM); r != CUDA_SUCCESS) {
      return d_.error("cuGreenCtxCreate", r);
    }
    GreenCtxId id = next_ctx_++;
    contexts_[id] = g;
    return id;
  }

  base::Result<SmResource> green_context_sm_resource(GreenCtxId ctx) override {
    std::lock_guard lock(mu_);
    auto it = contexts_.find(ctx);
    if (it == contexts_.end()) {
      return cu_error("cuGreenCtxGetDevResource", kCudaErrorInvalidContext, fmt::format("green context {}", ctx));
    }
    CUdevResource got{};
    if (CUresult r = d_.green_ctx_get_dev_resource(it->second, &got, CU_DEV_RESOURCE_TYPE_SM); r != CUDA_SUCCESS) {
      return d_.error("cuGreenCtxGetDevResource", r);
    }
    return to_sm(got);
  }

  base::Result<StreamId> create_stream(GreenCtxId ctx, int priority) override {
    std::lock_guard lock(mu_);
    auto it = contexts_.find(ctx);
    if (it == contexts_.end()) {
      return cu_error("cuGreenCtxStreamCreate", kCudaErrorInvalidContext, fmt::format("green context {}", ctx));
    }
    CUstream s = nullptr;
    // CU_STREAM_NON_BLOCKING is required by cuGreenCtxStreamCreate.
    if (CUresult r = d_.green_ctx_stream_create(&s, it->second, CU_STREAM_NON_BLOCKING, priority); r != CUDA_SUCCESS) {
      return d_.error("cuGreenCtxStreamCreate", r, fmt::format("priority {}", priority));
    }
    StreamId id = next_stream_++;
    streams_[id] = Stream{.stream = s, .ctx = ctx};
    return id;
  }

  base::Result<void> destroy_stream(StreamId stream) override {
    std::lock_guard lock(mu_);
    auto it = streams_.find(stream);
    if (it == streams_.end()) {
      return cu_error("cuStreamDestroy", kCudaErrorInvalidHandle, fmt::format("stream {}", stream));
    }
    if (CUresult r = d_.stream_destroy(it->second.stream); r != CUDA_SUCCESS) return d_.error("cuStreamDestroy", r);
    streams_.erase(it);
    return {};
  }

  base::Result<void> destroy_green_context(GreenCtxId ctx) override {
    std::lock_guard lock(mu_);
    auto it = contexts_.find(ctx);
    if (it == contexts_.end()) {
      return cu_error("cuGreenCtxDestroy", kCudaErrorInvalidContext, fmt::format("green context {}", ctx));
    }
    auto live = static_cast<std::size_t>(
        std::ranges::count_if(streams_, [ctx](const auto& kv) { return kv.second.ctx == ctx; }));
    if (live > 0) return live_streams_error(ctx, live);
    // Events made in this context for its streams go with it; an event last
    // recorded here falls back to its primary-context CUevent.
    for (auto& [id, e] : events_) {
      auto ev = e.per_ctx.find(ctx);
      if (ev == e.per_ctx.end()) continue;
      (void)d_.event_destroy(ev->second);
      e.per_ctx.erase(ev);
      if (e.last == ctx) e.last = 0;
    }
    if (CUresult r = d_.green_ctx_destroy(it->second); r != CUDA_SUCCESS) return d_.error("cuGreenCtxDestroy", r);
    contexts_.erase(it);
    return {};
  }

  // --- Memory, plain streams, copies and events (primary context).

  base::Result<DevicePtr> alloc_device(std::uint64_t bytes) override {
    std::lock_guard lock(mu_);
    Current current(d_, primary_);
    if (!current) return base::propagate(current.error());
    CUdeviceptr p = 0;
    if (CUresult r = d_.mem_alloc(&p, bytes); r != CUDA_SUCCESS) {
      return d_.error("cuMemAlloc", r, fmt::format("{} bytes", bytes));
    }
    device_memory_[p] = bytes;
    return static_cast<DevicePtr>(p);
  }

  base::Result<void> free_device(DevicePtr ptr) override {
    std::lock_guard lock(mu_);
    auto it = device_memory_.find(static_cast<CUdeviceptr>(ptr));
    if (it == device_memory_.end()) {
      return cu_error("cuMemFree", kCudaErrorInvalidValue, fmt::format("{:#x} is not a live allocation", ptr));
    }
    Current current(d_, primary_);
    if (!current) return base::propagate(current.error());
    if (CUresult r = d_.mem_free(it->first); r != CUDA_SUCCESS) return d_.error("cuMemFree", r);
    device_memory_.erase(it);
    return {};
  }

  base::Result<void*> alloc_pinned_host(std::uint64_t bytes) override {
    std::lock_guard lock(mu_);
    Current current(d_, primary_);
    if (!current) return base::propagate(current.error());
    void* p = nullptr;
    if (CUresult r = d_.mem_host_alloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE); r != CUDA_SUCCESS) {
      return d_.error("cuMemHostAlloc", r, fmt::format("{} bytes", bytes));
    }
    pinned_[p] = bytes;
    return p;
  }

  base::Result<void> free_pinned_host(void* ptr) override {
    std::lock_guard lock(mu_);
    auto it = pinned_.find(ptr);
    if (it == pinned_.end()) {
      return cu_error("cuMemFreeHost", kCudaErrorInvalidValue, fmt::format("{} is not a live pinned allocation", ptr));
    }
    Current current(d_, primary_);
    if (!current) return base::propagate(current.error());
    if (CUresult r = d_.mem_free_host(ptr); r != CUDA_SUCCESS) return d_.error("cuMemFreeHost", r);
    pinned_.erase(it);
    return {};
  }

  base::Result<StreamId> create_plain_stream(int priority) override {
    std::lock_guard lock(mu_);
    Current current(d_, primary_);
    if (!current) return base::propagate(current.error());
    CUstream s = nullptr;
    // The driver clamps the priority to cuCtxGetStreamPriorityRange.
    if (CUresult r = d_.stream_create_with_priority(&s, CU_STREAM_NON_BLOCKING, priority); r != CUDA_SUCCESS) {
      return d_.error("cuStreamCreateWithPriority", r, fmt::format("priority {}", priority));
    }
    StreamId id = next_stream_++;
    streams_[id] = Stream{.stream = s, .ctx = 0};
    return id;
  }

  base::Result<void*> native_context(GreenCtxId ctx) override {
    std::lock_guard lock(mu_);
    if (ctx == 0) return static_cast<void*>(primary_);
    auto it = contexts_.find(ctx);
    if (it == contexts_.end()) {
      return cu_error("cuCtxFromGreenCtx", kCudaErrorInvalidContext, fmt::format("green context {}", ctx));
    }
    CUcontext c = nullptr;
    if (CUresult r = d_.ctx_from_green_ctx(&c, it->second); r != CUDA_SUCCESS) {
      return d_.error("cuCtxFromGreenCtx", r, fmt::format("green context {}", ctx));
    }
    return static_cast<void*>(c);
  }

  base::Result<void*> native_stream(StreamId stream) override {
    std::lock_guard lock(mu_);
    auto s = find_stream("native_stream", stream);
    if (!s) return base::propagate(std::move(s.error()));
    return static_cast<void*>(*s);
  }

  base::Result<StreamId> stream_for_native(void* native) override {
    std::lock_guard lock(mu_);
    for (const auto& [id, s] : streams_) {
      if (static_cast<void*>(s.stream) == native) return id;
    }
    return cu_error("stream_for_native", kCudaErrorInvalidHandle, fmt::format("{} is not a live stream", native));
  }

  base::Result<void> copy_h2d_async(DevicePtr dst, const void* src, std::uint64_t bytes, StreamId stream) override {
    std::lock_guard lock(mu_);
    auto s = find_stream("cuMemcpyHtoDAsync", stream);
    if (!s) return base::propagate(std::move(s.error()));
    Current current(d_, primary_);
    if (!current) return base::propagate(current.error());
    if (CUresult r = d_.memcpy_htod_async(static_cast<CUdeviceptr>(dst), src, bytes, *s); r != CUDA_SUCCESS) {
      return d_.error("cuMemcpyHtoDAsync", r, fmt::format("{} bytes to {:#x} on stream {}", bytes, dst, stream));
    }
    return {};
  }

  // CUDA wants an event and the stream it is recorded on in the same
  // context (cuEventRecord: CUDA_ERROR_INVALID_HANDLE otherwise), and the
  // header leaves open whether a green-context stream's context is the
  // primary (cuStreamGetCtx_v2 says so) or the green context's own. An
  // EventId therefore starts as a primary-context CUevent and, on a driver
  // that refuses it on a green-context stream, gets one twin per green
  // context it is recorded in (made there on first use: cuCtxFromGreenCtx +
  // push); a wait, query or synchronize uses the one recorded last.
  // cuStreamWaitEvent takes events of other contexts, so waits need nothing
  // extra.
  base::Result<EventId> create_event() override {
    std::lock_guard lock(mu_);
    auto e = new_cu_event(0);
    if (!e) return base::propagate(std::move(e.error()));
    EventId id = next_event_++;
    events_[id] = Event{.per_ctx = {{0, *e}}, .last = 0};
    return id;
  }

  base::Result<void> destroy_event(EventId event) override {
    std::lock_guard lock(mu_);
    auto it = events_.find(event);
    if (it == events_.end()) {
      return cu_error("cuEventDestroy", kCudaErrorInvalidHandle, fmt::format("event {}", event));
    }
    for (auto& [ctx, ev] : it->second.per_ctx) {
      if (CUresult r = d_.event_destroy(ev); r != CUDA_SUCCESS) return d_.error("cuEventDestroy", r);
      ev = nullptr;
    }
    events_.erase(it);
    return {};
  }

  base::Result<void> record_event(EventId event, StreamId stream) override {
    std::lock_guard lock(mu_);
    auto eit = events_.find(event);
    if (eit == events_.end()) return cu_error("cuEventRecord", kCudaErrorInvalidHandle, fmt::format("event {}", event));
    auto sit = streams_.find(stream);
    if (sit == streams_.end()) {
      return cu_error("cuEventRecord", kCudaErrorInvalidHandle, fmt::format("stream {}", stream));
    }
    Event& e = eit->second;
    const CUstream cs = sit->second.stream;
    GreenCtxId ctx = sit->second.ctx;
    // Whether the driver takes a primary-context event on a green-context
    // stream (cuStreamGetCtx_v2 calls the primary the stream's context) is
    // learnt once: the first refusal (CUDA_ERROR_INVALID_HANDLE) switches
    // this device to twins made in the green context.
    if (ctx != 0 && primary_events_on_green_ != Tristate::kNo) {
      CUresult r = d_.event_record(e.per_ctx.at(0), cs);
      if (r == CUDA_SUCCESS) {
        primary_events_on_green_ = Tristate::kYes;
        e.last = 0;
        return {};
      }
      if (r != CUDA_ERROR_INVALID_HANDLE || primary_events_on_green_ == Tristate::kYes) {
        return d_.error("cuEventRecord", r, fmt::format("event {} on stream {}", event, stream));
      }
      primary_events_on_green_ = Tristate::kNo;
    }
    if (ctx != 0 && primary_events_on_green_ == Tristate::kYes) ctx = 0;
    auto found = e.per_ctx.find(ctx);
    if (found == e.per_ctx.end()) {
      auto made = new_cu_event(ctx);
      if (!made) return base::propagate(std::move(made.error()));
      found = e.per_ctx.emplace(ctx, *made).first;
    }
    if (CUresult r = d_.event_record(found->second, cs); r != CUDA_SUCCESS) {
      return d_.error("cuEventRecord", r, fmt::format("event {} on stream {}", event, stream));
    }
    e.last = ctx;
    return {};
  }

  base::Result<void> stream_wait_event(StreamId stream, EventId event) override {
    std::lock_guard lock(mu_);
    auto s = find_stream("cuStreamWaitEvent", stream);
    if (!s) return base::propagate(std::move(s.error()));
    auto e = find_event("cuStreamWaitEvent", event);
    if (!e) return base::propagate(std::move(e.error()));
    if (CUresult r = d_.stream_wait_event(*s, *e, CU_EVENT_WAIT_DEFAULT); r != CUDA_SUCCESS) {
      return d_.error("cuStreamWaitEvent", r, fmt::format("stream {} on event {}", stream, event));
    }
    return {};
  }

  base::Result<bool> event_done(EventId event) override {
    CUevent e = nullptr;
    {
      std::lock_guard lock(mu_);
      auto found = find_event("cuEventQuery", event);
      if (!found) return base::propagate(std::move(found.error()));
      e = *found;
    }
    CUresult r = d_.event_query(e);
    if (r == CUDA_SUCCESS) return true;
    if (r == CUDA_ERROR_NOT_READY) return false;
    return d_.error("cuEventQuery", r, fmt::format("event {}", event));
  }

  // The two waits run outside the lock, so other threads keep using the
  // device meanwhile; destroying the event or stream during the wait is the
  // caller's race, as with the driver.
  base::Result<void> event_synchronize(EventId event) override {
    CUevent e = nullptr;
    {
      std::lock_guard lock(mu_);
      auto found = find_event("cuEventSynchronize", event);
      if (!found) return base::propagate(std::move(found.error()));
      e = *found;
    }
    if (CUresult r = d_.event_synchronize(e); r != CUDA_SUCCESS) {
      return d_.error("cuEventSynchronize", r, fmt::format("event {}", event));
    }
    return {};
  }

  base::Result<void> stream_synchronize(StreamId stream) override {
    CUstream s = nullptr;
    {
      std::lock_guard lock(mu_);
      auto found = find_stream("cuStreamSynchronize", stream);
      if (!found) return base::propagate(std::move(found.error()));
      s = *found;
    }
    if (CUresult r = d_.stream_synchronize(s); r != CUDA_SUCCESS) {
      return d_.error("cuStreamSynchronize", r, fmt::format("stream {}", stream));
    }
    return {};
  }

  double h2d_bytes_per_s() const override { return kDefaultH2dBytesPerS; }

 private:
  struct Stream {
    CUstream stream;
    GreenCtxId ctx;  // 0: a plain stream in the primary context
  };

  // Pushes a context current in the calling thread for one scope and pops it
  // after, so the engine's own current context survives every call (the
  // memory, stream and event calls need a current context).
  class Current {
   public:
    Current(const Driver& d, CUcontext ctx) : d_(d) {
      if (CUresult r = d_.ctx_push_current(ctx); r != CUDA_SUCCESS) {
        error_ = d_.error("cuCtxPushCurrent", r).error();
      }
    }
    ~Current() {
      if (error_) return;
      CUcontext popped = nullptr;
      (void)d_.ctx_pop_current(&popped);
    }
    Current(const Current&) = delete;
    Current& operator=(const Current&) = delete;
    explicit operator bool() const { return !error_; }
    base::Error error() const { return *error_; }

   private:
    const Driver& d_;
    std::optional<base::Error> error_;
  };

  enum class Tristate : std::uint8_t { kUnknown, kYes, kNo };

  struct Event {
    std::map<GreenCtxId, CUevent> per_ctx;  // 0: the primary context
    GreenCtxId last = 0;                    // the context it was last recorded in
  };

  // A CUevent in green context `ctx` (0: the primary). mu_ is held.
  base::Result<CUevent> new_cu_event(GreenCtxId ctx) {
    CUcontext c = primary_;
    if (ctx != 0) {
      auto g = contexts_.find(ctx);
      if (g == contexts_.end()) {
        return cu_error("cuCtxFromGreenCtx", kCudaErrorInvalidContext, fmt::format("green context {}", ctx));
      }
      if (CUresult r = d_.ctx_from_green_ctx(&c, g->second); r != CUDA_SUCCESS) {
        return d_.error("cuCtxFromGreenCtx", r, fmt::format("green context {}", ctx));
      }
    }
    Current current(d_, c);
    if (!current) return base::propagate(current.error());
    CUevent e = nullptr;
    if (CUresult r = d_.event_create(&e, CU_EVENT_DISABLE_TIMING); r != CUDA_SUCCESS) {
      return d_.error("cuEventCreate", r, ctx != 0 ? fmt::format("in green context {}", ctx) : "");
    }
    return e;
  }

  base::Result<CUstream> find_stream(std::string_view call, StreamId stream) const {
    auto it = streams_.find(stream);
    if (it == streams_.end()) return cu_error(call, kCudaErrorInvalidHandle, fmt::format("stream {}", stream));
    return it->second.stream;
  }

  // The CUevent an EventId was last recorded as (waits, queries, syncs).
  base::Result<CUevent> find_event(std::string_view call, EventId event) const {
    auto it = events_.find(event);
    if (it == events_.end()) return cu_error(call, kCudaErrorInvalidHandle, fmt::format("event {}", event));
    return it->second.per_ctx.at(it->second.last);
  }

  static SmResource to_sm(const CUdevResource& r) {
    return SmResource{.sm_count = r.sm.smCount,
                      .min_partition_size = r.sm.minSmPartitionSize,
                      .alignment = r.sm.smCoscheduledAlignment};
  }

  const Driver& d_;
  const int ordinal_;
  const CUdevice dev_;
  const CUcontext primary_;  // retained by open_cuda_device, released by the destructor
  CUdevResource all_;        // the device's SM resource; the input of every split
  std::mutex mu_;
  std::uint64_t next_resource_ = 1;
  std::uint64_t next_ctx_ = 1;
  std::uint64_t next_stream_ = 1;
  std::map<ResourceId, CUdevResource> pieces_;
  std::map<GreenCtxId, CUgreenCtx> contexts_;
  std::map<StreamId, Stream> streams_;
  std::uint64_t next_event_ = 1;
  std::map<EventId, Event> events_;
  Tristate primary_events_on_green_ = Tristate::kUnknown;
  std::map<CUdeviceptr, std::uint64_t> device_memory_;  // base → bytes
  std::map<void*, std::uint64_t> pinned_;
};

}  // namespace

bool cuda_backend_built() { return true; }

base::Result<std::unique_ptr<DeviceApi>> open_cuda_device(int ordinal) {
  const base::Result<Driver>& loaded = driver();
  if (!loaded) return base::propagate(loaded.error(), "open_cuda_device");
  const Driver& d = *loaded;

  int count = 0;
  if (CUresult r = d.device_get_count(&count); r != CUDA_SUCCESS) {
    return base::propagate(d.error("cuDeviceGetCount", r).error(), "open_cuda_device");
  }
  if (ordinal < 0 || ordinal >= count) {
    return base::propagate(
        cu_error("cuDeviceGet", kCudaErrorInvalidDevice, fmt::format("ordinal {}, {} device(s)", ordinal, count))
            .error(),
        "open_cuda_device");
  }
  CUdevice dev = 0;
  if (CUresult r = d.device_get(&dev, ordinal); r != CUDA_SUCCESS) {
    return base::propagate(d.error("cuDeviceGet", r).error(), "open_cuda_device");
  }
  CUcontext primary = nullptr;
  if (CUresult r = d.primary_ctx_retain(&primary, dev); r != CUDA_SUCCESS) {
    return base::propagate(d.error("cuDevicePrimaryCtxRetain", r).error(), "open_cuda_device");
  }
  CUdevResource all{};
  if (CUresult r = d.device_get_dev_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM); r != CUDA_SUCCESS) {
    (void)d.primary_ctx_release(dev);
    return base::propagate(d.error("cuDeviceGetDevResource", r, "CU_DEV_RESOURCE_TYPE_SM").error(), "open_cuda_device");
  }
  return std::unique_ptr<DeviceApi>(std::make_unique<CudaDevice>(d, ordinal, dev, primary, all));
}

}  // namespace tandem::gpu

#else  // !TANDEM_HAVE_CUDA_H

namespace tandem::gpu {

bool cuda_backend_built() { return false; }

base::Result<std::unique_ptr<DeviceApi>> open_cuda_device(int /*ordinal*/) {
  return base::make_error(ENOTSUP,
                          "open_cuda_device: built without CUDA headers (cuda.h not found at configure "
                          "time, or TANDEM_WITH_CUDA=OFF)");
}

}  // namespace tandem::gpu

#endif  // TANDEM_HAVE_CUDA_H
