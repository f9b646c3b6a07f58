// CudaHarness: the driver-API launcher for the embedded test kernels
// (cuda_harness.h). Compiled against cuda.h when TANDEM_HAVE_CUDA_H; without
// it open() fails with ENOTSUP.
#include "gpu/testing/cuda_harness.h"

#include <cerrno>

#include "gpu/testing/kernels_image.h"

#ifdef TANDEM_HAVE_CUDA_H

#include <cuda.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <vector>

#include "gpu/cuda_loader.h"

namespace tandem::gpu::testing {
namespace {

// decltype of the header's declarations, so signatures cannot drift; names
// are resolved without the _v2 suffixes (cuGetProcAddress picks by ABI).
struct Driver {
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDriverGetVersion) driver_get_version = nullptr;
  decltype(&::cuDeviceGetCount) device_get_count = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetName) device_get_name = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) primary_ctx_release = nullptr;
  decltype(&::cuCtxSetCurrent) ctx_set_current = nullptr;
  decltype(&::cuCtxSynchronize) ctx_synchronize = nullptr;
  decltype(&::cuCtxPushCurrent) ctx_push_current = nullptr;
  decltype(&::cuCtxPopCurrent) ctx_pop_current = nullptr;
  decltype(&::cuCtxFromGreenCtx) ctx_from_green_ctx = nullptr;
  decltype(&::cuStreamGetCtx_v2) stream_get_ctx = nullptr;
  decltype(&::cuLibraryLoadData) library_load_data = nullptr;
  decltype(&::cuLibraryUnload) library_unload = nullptr;
  decltype(&::cuLibraryGetKernel) library_get_kernel = nullptr;
  decltype(&::cuLaunchKernel) launch_kernel = nullptr;
  decltype(&::cuMemAlloc) mem_alloc = nullptr;
  decltype(&::cuMemFree) mem_free = nullptr;
  decltype(&::cuMemsetD32) memset_d32 = nullptr;
  decltype(&::cuMemcpyDtoH) memcpy_dtoh = nullptr;
  decltype(&::cuMemcpyHtoD) memcpy_htod = nullptr;
  decltype(&::cuStreamCreate) stream_create = nullptr;
  decltype(&::cuStreamDestroy) stream_destroy = nullptr;
  decltype(&::cuStreamSynchronize) stream_synchronize = nullptr;
  decltype(&::cuEventCreate) event_create = nullptr;
  decltype(&::cuEventDestroy) event_destroy = nullptr;
  decltype(&::cuEventRecord) event_record = nullptr;
  decltype(&::cuEventSynchronize) event_synchronize = nullptr;
  decltype(&::cuEventElapsedTime) event_elapsed_time = nullptr;

  std::unexpected<base::Error> error(std::string_view call, CUresult r, std::string_view detail = {}) const {
    return cuda_loader::driver_error(get_error_name, get_error_string, call, r, detail);
  }
};

base::Result<Driver> load_driver() {
  auto opened = cuda_loader::open_libcuda();
  if (!opened) return std::unexpected(std::move(opened.error()));
  const cuda_loader::GetProcAddress get = *opened;
  Driver d;
  std::string missing;
  int version = 0;
  cuda_loader::resolve(get, "cuDriverGetVersion", CUDA_VERSION, &d.driver_get_version, &missing);
  if (d.driver_get_version == nullptr || d.driver_get_version(&version) != CUDA_SUCCESS) {
    return base::make_error(ENOTSUP, "libcuda.so.1: cuDriverGetVersion is unavailable");
  }
  // cuLibraryLoadData and green-context streams: 12.5.
  if (version < 12050) {
    return base::make_error(ENOTSUP, fmt::format("CUDA driver {}.{} is too old: the suite needs 12.5", version / 1000,
                                                 (version % 1000) / 10));
  }
  const int abi = std::min(version, CUDA_VERSION);
  cuda_loader::resolve(get, "cuGetErrorName", abi, &d.get_error_name, &missing);
  cuda_loader::resolve(get, "cuGetErrorString", abi, &d.get_error_string, &missing);
  cuda_loader::resolve(get, "cuInit", abi, &d.init, &missing);
  cuda_loader::resolve(get, "cuDeviceGetCount", abi, &d.device_get_count, &missing);
  cuda_loader::resolve(get, "cuDeviceGet", abi, &d.device_get, &missing);
  cuda_loader::resolve(get, "cuDeviceGetName", abi, &d.device_get_name, &missing);
  cuda_loader::resolve(get, "cuDeviceGetAttribute", abi, &d.device_get_attribute, &missing);
  cuda_loader::resolve(get, "cuDevicePrimaryCtxRetain", abi, &d.primary_ctx_retain, &missing);
  cuda_loader::resolve(get, "cuCtxPushCurrent", abi, &d.ctx_push_current, &missing);
  cuda_loader::resolve(get, "cuCtxPopCurrent", abi, &d.ctx_pop_current, &missing);
  cuda_loader::resolve(get, "cuCtxFromGreenCtx", abi, &d.ctx_from_green_ctx, &missing);
  cuda_loader::resolve(get, "cuStreamGetCtx", abi, &d.stream_get_ctx, &missing);
  cuda_loader::resolve(get, "cuDevicePrimaryCtxRelease", abi, &d.primary_ctx_release, &missing);
  cuda_loader::resolve(get, "cuCtxSetCurrent", abi, &d.ctx_set_current, &missing);
  // From ABI 13000 on, cuGetProcAddress answers "cuCtxSynchronize" with
  // cuCtxSynchronize_v2(CUcontext), which the header does not map the name
  // to: called as the void version it reads a garbage context
  // (CUDA_ERROR_CONTEXT_IS_DESTROYED, seen on an H200 with driver 580.159).
  // Ask for the 12.x entry point, which keeps the void signature.
  cuda_loader::resolve(get, "cuCtxSynchronize", std::min(abi, 12090), &d.ctx_synchronize, &missing);
  cuda_loader::resolve(get, "cuLibraryLoadData", abi, &d.library_load_data, &missing);
  cuda_loader::resolve(get, "cuLibraryUnload", abi, &d.library_unload, &missing);
  cuda_loader::resolve(get, "cuLibraryGetKernel", abi, &d.library_get_kernel, &missing);
  cuda_loader::resolve(get, "cuLaunchKernel", abi, &d.launch_kernel, &missing);
  cuda_loader::resolve(get, "cuMemAlloc", abi, &d.mem_alloc, &missing);
  cuda_loader::resolve(get, "cuMemFree", abi, &d.mem_free, &missing);
  cuda_loader::resolve(get, "cuMemsetD32", abi, &d.memset_d32, &missing);
  cuda_loader::resolve(get, "cuMemcpyDtoH", abi, &d.memcpy_dtoh, &missing);
  cuda_loader::resolve(get, "cuMemcpyHtoD", abi, &d.memcpy_htod, &missing);
  cuda_loader::resolve(get, "cuStreamCreate", abi, &d.stream_create, &missing);
  cuda_loader::resolve(get, "cuStreamDestroy", abi, &d.stream_destroy, &missing);
  cuda_loader::resolve(get, "cuStreamSynchronize", abi, &d.stream_synchronize, &missing);
  cuda_loader::resolve(get, "cuEventCreate", abi, &d.event_create, &missing);
  cuda_loader::resolve(get, "cuEventDestroy", abi, &d.event_destroy, &missing);
  cuda_loader::resolve(get, "cuEventRecord", abi, &d.event_record, &missing);
  cuda_loader::resolve(get, "cuEventSynchronize", abi, &d.event_synchronize, &missing);
  cuda_loader::resolve(get, "cuEventElapsedTime", abi, &d.event_elapsed_time, &missing);
  if (!missing.empty()) return base::make_error(ENOTSUP, fmt::format("libcuda.so.1 lacks {}", missing));
  if (CUresult r = d.init(0); r != CUDA_SUCCESS) return d.error("cuInit", r);
  return d;
}

// One load per process; a failure is remembered.
const base::Result<Driver>& driver() {
  static const base::Result<Driver> kDriver = load_driver();
  return kDriver;
}

// The "sz"-free view of a CUstream/CUevent as the header's void*.
CUstream as_stream(void* s) { return static_cast<CUstream>(s); }
CUevent as_event(void* e) { return static_cast<CUevent>(e); }

}  // namespace

struct CudaHarness::State {
  const Driver* d = nullptr;
  CUdevice dev = 0;
  CUcontext primary = nullptr;
  CUlibrary library = nullptr;
  std::map<std::string, CUkernel, std::less<>> kernels;
  std::set<CUdeviceptr> allocations;
  std::set<CUstream> streams;
  std::set<CUevent> events;
  // CUDA records an event only on a stream of its own context, and the
  // header leaves open whether a green-context stream's is the primary: a
  // timing event the driver refuses on such a stream is recorded as a twin
  // made in the green context (first use), and elapsed_ms() reads the one
  // recorded last.
  std::map<CUevent, std::map<CUcontext, CUevent>> twins;
  std::map<CUevent, CUevent> last;
};

CudaHarness::CudaHarness(std::unique_ptr<State> state) : s_(std::move(state)) {}

CudaHarness::~CudaHarness() {
  if (!s_) return;
  const Driver& d = *s_->d;
  (void)d.ctx_set_current(s_->primary);
  (void)d.ctx_synchronize();
  for (CUstream st : s_->streams) (void)d.stream_destroy(st);
  for (auto& [home, twins] : s_->twins) {
    for (auto& [ctx, ev] : twins) (void)d.event_destroy(ev);
  }
  for (CUevent ev : s_->events) (void)d.event_destroy(ev);
  for (CUdeviceptr p : s_->allocations) (void)d.mem_free(p);
  if (s_->library != nullptr) (void)d.library_unload(s_->library);
  (void)d.primary_ctx_release(s_->dev);
}

base::Result<std::unique_ptr<CudaHarness>> CudaHarness::open(int ordinal) {
  const std::span<const unsigned char> image = kernels_fatbin();
  if (image.empty()) {
    return base::make_error(ENOTSUP, fmt::format("CudaHarness: no test kernels: {}", kernels_missing_reason()));
  }
  const base::Result<Driver>& loaded = driver();
  if (!loaded) return base::propagate(loaded.error(), "CudaHarness");
  const Driver& d = *loaded;

  auto state = std::make_unique<State>();
  state->d = &d;
  int count = 0;
  if (CUresult r = d.device_get_count(&count); r != CUDA_SUCCESS) {
    return base::propagate(d.error("cuDeviceGetCount", r).error(), "CudaHarness");
  }
  if (ordinal < 0 || ordinal >= count) {
    return base::propagate(
        cu_error("cuDeviceGet", kCudaErrorInvalidDevice, fmt::format("ordinal {}, {} device(s)", ordinal, count))
            .error(),
        "CudaHarness");
  }
  if (CUresult r = d.device_get(&state->dev, ordinal); r != CUDA_SUCCESS) {
    return base::propagate(d.error("cuDeviceGet", r).error(), "CudaHarness");
  }
  if (CUresult r = d.primary_ctx_retain(&state->primary, state->dev); r != CUDA_SUCCESS) {
    return base::propagate(d.error("cuDevicePrimaryCtxRetain", r).error(), "CudaHarness");
  }
  // From here the destructor releases what was taken.
  std::unique_ptr<CudaHarness> h(new CudaHarness(std::move(state)));
  State& s = *h->s_;
  if (CUresult r = d.ctx_set_current(s.primary); r != CUDA_SUCCESS) {
    return base::propagate(d.error("cuCtxSetCurrent", r).error(), "CudaHarness");
  }

  std::array<char, 256> name{};
  if (CUresult r = d.device_get_name(name.data(), static_cast<int>(name.size()), s.dev); r != CUDA_SUCCESS) {
    return base::propagate(d.error("cuDeviceGetName", r).error(), "CudaHarness");
  }
  h->name_ = name.data();
  int sms = 0;
  int major = 0;
  int minor = 0;
  int clock = 0;
  for (auto [attr, out] : {std::pair{CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &sms},
                           std::pair{CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &major},
                           std::pair{CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &minor},
                           std::pair{CU_DEVICE_ATTRIBUTE_CLOCK_RATE, &clock}}) {
    if (CUresult r = d.device_get_attribute(out, attr, s.dev); r != CUDA_SUCCESS) {
      return base::propagate(
          d.error("cuDeviceGetAttribute", r, fmt::format("attribute {}", static_cast<int>(attr))).error(),
          "CudaHarness");
    }
  }
  h->sm_count_ = static_cast<std::uint32_t>(sms);
  h->cc_ = major * 10 + minor;
  h->clock_khz_ = static_cast<std::uint32_t>(clock);
  (void)d.driver_get_version(&h->driver_);

  if (CUresult r = d.library_load_data(&s.library, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
      r != CUDA_SUCCESS) {
    s.library = nullptr;
    return base::propagate(
        d.error("cuLibraryLoadData", r,
                fmt::format("{}-byte fatbin on compute capability {}.{} (rebuild with TANDEM_CUDA_ARCHS naming it)",
                            image.size(), major, minor))
            .error(),
        "CudaHarness");
  }
  for (const char* k : {"tandem_record_smid", "tandem_empty", "tandem_consume_layer", "tandem_triad", "tandem_fma"}) {
    CUkernel kernel = nullptr;
    if (CUresult r = d.library_get_kernel(&kernel, s.library, k); r != CUDA_SUCCESS) {
      return base::propagate(d.error("cuLibraryGetKernel", r, k).error(), "CudaHarness");
    }
    s.kernels.emplace(k, kernel);
  }
  return h;
}

base::Result<void> CudaHarness::make_current() {
  if (CUresult r = s_->d->ctx_set_current(s_->primary); r != CUDA_SUCCESS) {
    return s_->d->error("cuCtxSetCurrent", r);
  }
  return {};
}

base::Result<void> CudaHarness::launch(std::string_view kernel, Dim3 grid, Dim3 block, void* stream,
                                       std::span<void* const> args) {
  auto it = s_->kernels.find(kernel);
  if (it == s_->kernels.end()) {
    return cu_error("cuLaunchKernel", kCudaErrorNotFound, fmt::format("no kernel '{}' in kernels.cu", kernel));
  }
  // cuLaunchKernel takes void** but only reads the array.
  void** params = const_cast<void**>(args.data());  // NOLINT(cppcoreguidelines-pro-type-const-cast)
  // A CUkernel passed as a CUfunction runs in the stream's context (cuda.h).
  auto f = reinterpret_cast<CUfunction>(it->second);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  if (CUresult r = s_->d->launch_kernel(f, grid.x, grid.y, grid.z, block.x, block.y, block.z, 0, as_stream(stream),
                                        args.empty() ? nullptr : params, nullptr);
      r != CUDA_SUCCESS) {
    return s_->d->error(
        "cuLaunchKernel", r,
        fmt::format("{} <<<({},{},{}), ({},{},{})>>>", kernel, grid.x, grid.y, grid.z, block.x, block.y, block.z));
  }
  return {};
}

base::Result<DevicePtr> CudaHarness::alloc(std::uint64_t bytes) {
  // The primary context, whatever another party left current in this thread.
  if (auto c = make_current(); !c) return base::propagate(std::move(c.error()));
  CUdeviceptr p = 0;
  if (CUresult r = s_->d->mem_alloc(&p, bytes); r != CUDA_SUCCESS) {
    return s_->d->error("cuMemAlloc", r, fmt::format("{} bytes", bytes));
  }
  s_->allocations.insert(p);
  return static_cast<DevicePtr>(p);
}

base::Result<void> CudaHarness::free(DevicePtr ptr) {
  // The primary context, whatever another party left current in this thread.
  if (auto c = make_current(); !c) return base::propagate(std::move(c.error()));
  auto it = s_->allocations.find(static_cast<CUdeviceptr>(ptr));
  if (it == s_->allocations.end()) {
    return cu_error("cuMemFree", kCudaErrorInvalidValue, fmt::format("{:#x} was not allocated here", ptr));
  }
  if (CUresult r = s_->d->mem_free(*it); r != CUDA_SUCCESS) return s_->d->error("cuMemFree", r);
  s_->allocations.erase(it);
  return {};
}

base::Result<void> CudaHarness::memset_d32(DevicePtr ptr, std::uint32_t value, std::uint64_t count) {
  // The primary context, whatever another party left current in this thread.
  if (auto c = make_current(); !c) return base::propagate(std::move(c.error()));
  if (CUresult r = s_->d->memset_d32(static_cast<CUdeviceptr>(ptr), value, count); r != CUDA_SUCCESS) {
    return s_->d->error("cuMemsetD32", r, fmt::format("{} words at {:#x}", count, ptr));
  }
  // cuMemsetD32 runs on the legacy stream, which non-blocking streams do
  // not wait for: finish it before anything is launched after it.
  return synchronize();
}

base::Result<void> CudaHarness::copy_to_host(void* dst, DevicePtr src, std::uint64_t bytes) {
  // The primary context, whatever another party left current in this thread.
  if (auto c = make_current(); !c) return base::propagate(std::move(c.error()));
  // The legacy stream does not wait for non-blocking streams' kernels.
  if (auto done = synchronize(); !done) return done;
  if (CUresult r = s_->d->memcpy_dtoh(dst, static_cast<CUdeviceptr>(src), bytes); r != CUDA_SUCCESS) {
    return s_->d->error("cuMemcpyDtoH", r, fmt::format("{} bytes from {:#x}", bytes, src));
  }
  return {};
}

base::Result<void> CudaHarness::copy_to_device(DevicePtr dst, const void* src, std::uint64_t bytes) {
  // The primary context, whatever another party left current in this thread.
  if (auto c = make_current(); !c) return base::propagate(std::move(c.error()));
  if (CUresult r = s_->d->memcpy_htod(static_cast<CUdeviceptr>(dst), src, bytes); r != CUDA_SUCCESS) {
    return s_->d->error("cuMemcpyHtoD", r, fmt::format("{} bytes to {:#x}", bytes, dst));
  }
  // From pageable memory the call may return before the DMA lands.
  return synchronize();
}

base::Result<void*> CudaHarness::create_stream() {
  CUstream st = nullptr;
  if (CUresult r = s_->d->stream_create(&st, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS) {
    return s_->d->error("cuStreamCreate", r);
  }
  s_->streams.insert(st);
  return static_cast<void*>(st);
}

base::Result<void> CudaHarness::destroy_stream(void* stream) {
  auto it = s_->streams.find(as_stream(stream));
  if (it == s_->streams.end()) {
    return cu_error("cuStreamDestroy", kCudaErrorInvalidHandle, "stream was not created by this harness");
  }
  if (CUresult r = s_->d->stream_destroy(*it); r != CUDA_SUCCESS) return s_->d->error("cuStreamDestroy", r);
  s_->streams.erase(it);
  return {};
}

base::Result<void> CudaHarness::stream_synchronize(void* stream) {
  if (CUresult r = s_->d->stream_synchronize(as_stream(stream)); r != CUDA_SUCCESS) {
    return s_->d->error("cuStreamSynchronize", r);
  }
  return {};
}

base::Result<void> CudaHarness::synchronize() {
  // The primary context, whatever another party left current in this thread.
  if (auto c = make_current(); !c) return base::propagate(std::move(c.error()));
  if (CUresult r = s_->d->ctx_synchronize(); r != CUDA_SUCCESS) return s_->d->error("cuCtxSynchronize", r);
  return {};
}

base::Result<void*> CudaHarness::create_timing_event() {
  CUevent ev = nullptr;
  if (CUresult r = s_->d->event_create(&ev, CU_EVENT_DEFAULT); r != CUDA_SUCCESS) {
    return s_->d->error("cuEventCreate", r);
  }
  s_->events.insert(ev);
  return static_cast<void*>(ev);
}

base::Result<void> CudaHarness::destroy_event(void* event) {
  auto it = s_->events.find(as_event(event));
  if (it == s_->events.end()) {
    return cu_error("cuEventDestroy", kCudaErrorInvalidHandle, "event was not created by this harness");
  }
  if (auto t = s_->twins.find(*it); t != s_->twins.end()) {
    for (auto& [ctx, ev] : t->second) (void)s_->d->event_destroy(ev);
    s_->twins.erase(t);
  }
  s_->last.erase(*it);
  if (CUresult r = s_->d->event_destroy(*it); r != CUDA_SUCCESS) return s_->d->error("cuEventDestroy", r);
  s_->events.erase(it);
  return {};
}

base::Result<void> CudaHarness::record(void* event, void* stream) {
  const Driver& d = *s_->d;
  CUevent home = as_event(event);
  if (!s_->events.contains(home)) {
    return cu_error("cuEventRecord", kCudaErrorInvalidHandle, "event was not created by this harness");
  }
  // The home event first; a driver that refuses it on a green-context
  // stream (CUDA_ERROR_INVALID_HANDLE) gets a twin made in that context.
  CUresult first = d.event_record(home, as_stream(stream));
  if (first == CUDA_SUCCESS) {
    s_->last[home] = home;
    return {};
  }
  if (first != CUDA_ERROR_INVALID_HANDLE) return d.error("cuEventRecord", first);
  CUcontext ctx = nullptr;
  CUgreenCtx green = nullptr;
  if (CUresult r = d.stream_get_ctx(as_stream(stream), &ctx, &green); r != CUDA_SUCCESS) {
    return d.error("cuStreamGetCtx", r);
  }
  if (green == nullptr) return d.error("cuEventRecord", first, "not a green-context stream");
  if (CUresult r = d.ctx_from_green_ctx(&ctx, green); r != CUDA_SUCCESS) return d.error("cuCtxFromGreenCtx", r);
  CUevent ev = home;
  {
    auto& twins = s_->twins[home];
    auto found = twins.find(ctx);
    if (found == twins.end()) {
      if (CUresult r = d.ctx_push_current(ctx); r != CUDA_SUCCESS) return d.error("cuCtxPushCurrent", r);
      CUevent twin = nullptr;
      CUresult made = d.event_create(&twin, CU_EVENT_DEFAULT);
      CUcontext popped = nullptr;
      (void)d.ctx_pop_current(&popped);
      if (made != CUDA_SUCCESS) return d.error("cuEventCreate", made, "in the stream's green context");
      found = twins.emplace(ctx, twin).first;
    }
    ev = found->second;
  }
  if (CUresult r = d.event_record(ev, as_stream(stream)); r != CUDA_SUCCESS) return d.error("cuEventRecord", r);
  s_->last[home] = ev;
  return {};
}

base::Result<float> CudaHarness::elapsed_ms(void* start, void* end) {
  const auto recorded = [&](void* e) {
    auto it = s_->last.find(as_event(e));
    return it != s_->last.end() ? it->second : as_event(e);
  };
  CUevent a = recorded(start);
  CUevent b = recorded(end);
  if (CUresult r = s_->d->event_synchronize(b); r != CUDA_SUCCESS) return s_->d->error("cuEventSynchronize", r);
  float ms = 0;
  if (CUresult r = s_->d->event_elapsed_time(&ms, a, b); r != CUDA_SUCCESS) {
    return s_->d->error("cuEventElapsedTime", r);
  }
  return ms;
}

std::size_t CudaHarness::live_allocations() const { return s_->allocations.size(); }
std::size_t CudaHarness::live_streams() const { return s_->streams.size(); }
std::size_t CudaHarness::live_events() const { return s_->events.size(); }

}  // namespace tandem::gpu::testing

#else  // !TANDEM_HAVE_CUDA_H

namespace tandem::gpu::testing {

struct CudaHarness::State {};

CudaHarness::CudaHarness(std::unique_ptr<State> state) : s_(std::move(state)) {}
CudaHarness::~CudaHarness() = default;

base::Result<std::unique_ptr<CudaHarness>> CudaHarness::open(int /*ordinal*/) {
  return base::make_error(ENOTSUP,
                          "CudaHarness: built without CUDA headers (cuda.h not found at configure time, or "
                          "TANDEM_WITH_CUDA=OFF)");
}

// Unreachable: no object is ever made without cuda.h.
base::Result<void> CudaHarness::make_current() { return base::make_error(ENOTSUP, "built without CUDA headers"); }
base::Result<void> CudaHarness::launch(std::string_view, Dim3, Dim3, void*, std::span<void* const>) {
  return base::make_error(ENOTSUP, "built without CUDA headers");
}
base::Result<DevicePtr> CudaHarness::alloc(std::uint64_t) {
  return base::make_error(ENOTSUP, "built without CUDA headers");
}
base::Result<void> CudaHarness::free(DevicePtr) { return base::make_error(ENOTSUP, "built without CUDA headers"); }
base::Result<void> CudaHarness::memset_d32(DevicePtr, std::uint32_t, std::uint64_t) {
  return base::make_error(ENOTSUP, "built without CUDA headers");
}
base::Result<void> CudaHarness::copy_to_host(void*, DevicePtr, std::uint64_t) {
  return base::make_error(ENOTSUP, "built without CUDA headers");
}
base::Result<void> CudaHarness::copy_to_device(DevicePtr, const void*, std::uint64_t) {
  return base::make_error(ENOTSUP, "built without CUDA headers");
}
base::Result<void*> CudaHarness::create_stream() { return base::make_error(ENOTSUP, "built without CUDA headers"); }
base::Result<void> CudaHarness::destroy_stream(void*) {
  return base::make_error(ENOTSUP, "built without CUDA headers");
}
base::Result<void> CudaHarness::stream_synchronize(void*) {
  return base::make_error(ENOTSUP, "built without CUDA headers");
}
base::Result<void> CudaHarness::synchronize() { return base::make_error(ENOTSUP, "built without CUDA headers"); }
base::Result<void*> CudaHarness::create_timing_event() {
  return base::make_error(ENOTSUP, "built without CUDA headers");
}
base::Result<void> CudaHarness::destroy_event(void*) { return base::make_error(ENOTSUP, "built without CUDA headers"); }
base::Result<void> CudaHarness::record(void*, void*) { return base::make_error(ENOTSUP, "built without CUDA headers"); }
base::Result<float> CudaHarness::elapsed_ms(void*, void*) {
  return base::make_error(ENOTSUP, "built without CUDA headers");
}
std::size_t CudaHarness::live_allocations() const { return 0; }
std::size_t CudaHarness::live_streams() const { return 0; }
std::size_t CudaHarness::live_events() const { return 0; }

}  // namespace tandem::gpu::testing

#endif  // TANDEM_HAVE_CUDA_H
