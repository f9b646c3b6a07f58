// DeviceApi: the GPU calls tandem's SM partitioning needs (docs/architecture.md "GPU plane"),
// shaped after the CUDA 13.0 driver's green-context flow
// ([gpu_and_ipc] A.1, A.2):
//
//   sm_resource()            cuDeviceGetDevResource(dev, &r, CU_DEV_RESOURCE_TYPE_SM)
//   split_group_count(m)     cuDevSmResourceSplitByCount(NULL, &nb, &all, NULL, 0, m)
//   split_by_count(n, m)     cuDevSmResourceSplitByCount(groups, &n, &all, &rem, 0, m)
//   create_green_context(p)  cuDevResourceGenerateDesc(&d, pieces, k) +
//                            cuGreenCtxCreate(&g, d, dev, CU_GREEN_CTX_DEFAULT_STREAM)
//   green_context_sm_resource(g)  cuGreenCtxGetDevResource(g, &r, CU_DEV_RESOURCE_TYPE_SM)
//   create_stream(g, prio)   cuGreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, prio)
//   destroy_stream(s)        cuStreamDestroy(s)
//   destroy_green_context(g) cuGreenCtxDestroy(g)
//
// Memory, copies and events (the layer streamer's needs; primary context):
//
//   alloc_device(n)          cuMemAlloc(&p, n)
//   free_device(p)           cuMemFree(p)
//   alloc_pinned_host(n)     cuMemHostAlloc(&h, n, CU_MEMHOSTALLOC_PORTABLE)
//   free_pinned_host(h)      cuMemFreeHost(h)
//   create_plain_stream(pr)  cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, pr)
//   native_stream(s)         the CUstream behind s; stream_for_native(cs) the reverse
//   copy_h2d_async(d,h,n,s)  cuMemcpyHtoDAsync(d, h, n, s)
//   create_event()           cuEventCreate(&e, CU_EVENT_DISABLE_TIMING)
//   destroy_event(e)         cuEventDestroy(e)
//   record_event(e, s)       cuEventRecord(e, s)
//   stream_wait_event(s, e)  cuStreamWaitEvent(s, e, 0)
//   event_done(e)            cuEventQuery(e): CUDA_SUCCESS → true, CUDA_ERROR_NOT_READY → false
//   event_synchronize(e)     cuEventSynchronize(e)
//   stream_synchronize(s)    cuStreamSynchronize(s)
//
// Handles are opaque 64-bit ids, never CUDA types, so the simulated backend
// (sim_device.h) and every caller build without the toolkit. Ids are never
// reused within one DeviceApi object. Errors name the call and the CUresult:
// "cuGreenCtxCreate: CUDA_ERROR_INVALID_VALUE: invalid argument", with an errno
// chosen by cu_result_errno().
//
// One rule is stricter than the driver, in both backends: destroying a green
// context that still has live streams is refused (EBUSY). The driver would
// destroy it and leak the streams, which then fail with
// CUDA_ERROR_CONTEXT_IS_DESTROYED (cuda.h, cuGreenCtxDestroy).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace tandem::gpu {

// CUresult values tandem names (cuda.h, CUDA 13.0). Kept here so the
// simulated backend reports the same codes without including cuda.h.
enum CuResult : int {
  kCudaSuccess = 0,
  kCudaErrorInvalidValue = 1,
  kCudaErrorOutOfMemory = 2,
  kCudaErrorNotInitialized = 3,
  kCudaErrorNoDevice = 100,
  kCudaErrorInvalidDevice = 101,
  kCudaErrorInvalidContext = 201,
  kCudaErrorInvalidHandle = 400,
  kCudaErrorNotFound = 500,
  kCudaErrorNotReady = 600,
  kCudaErrorIllegalAddress = 700,
  kCudaErrorContextIsDestroyed = 709,
  kCudaErrorNotPermitted = 800,
  kCudaErrorNotSupported = 801,
  kCudaErrorInvalidResourceType = 914,
  kCudaErrorInvalidResourceConfiguration = 915,
};

// "CUDA_ERROR_INVALID_VALUE" for the codes above, "CUDA_ERROR_<n>" otherwise.
std::string cu_result_name(int result);
// A one-line description for the codes above ("invalid argument").
std::string_view cu_result_description(int result);
// The errno an Error carries for a CUresult (EINVAL, ENOMEM, ENODEV, …).
int cu_result_errno(int result);
// The error for a failed driver call: "<call>: <name>: <description>[: <detail>]".
std::unexpected<base::Error> cu_error(std::string_view call, int result, std::string_view name,
                                      std::string_view description, std::string_view detail = {});
// Same, with the name and description from the tables above.
std::unexpected<base::Error> cu_error(std::string_view call, int result, std::string_view detail = {});
// EBUSY: cuGreenCtxDestroy refused because `ctx` still has `live` streams.
std::unexpected<base::Error> live_streams_error(std::uint64_t ctx, std::size_t live);

using ResourceId = std::uint64_t;  // an SM resource one split produced
using GreenCtxId = std::uint64_t;
using StreamId = std::uint64_t;
using EventId = std::uint64_t;
using DevicePtr = std::uint64_t;  // a device address (CUdeviceptr); 0 is never valid

// CUdevSmResource: the SM count of a resource, and the device's partitioning
// granularity (minSmPartitionSize, smCoscheduledAlignment; 8 and 8 on Hopper).
struct SmResource {
  std::uint32_t sm_count = 0;
  std::uint32_t min_partition_size = 0;
  std::uint32_t alignment = 0;
  // Groups of the smallest size (partition.h's block) one split makes, as the
  // driver counts them (cuDevSmResourceSplitByCount's query); 0: unknown,
  // taken as sm_count / block. The GPC structure can make it fewer: an H200
  // (132 SMs) splits into 15 groups of 8 and 12 remaining, not 16 and 4.
  std::uint32_t groups = 0;
  bool operator==(const SmResource&) const = default;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;                // cuDeviceGetName
  std::uint32_t sm_count = 0;      // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
  std::uint64_t total_memory = 0;  // cuDeviceTotalMem, bytes
};

// The outcome of one cuDevSmResourceSplitByCount call. Resources from the same
// split (groups and the remainder) may be combined into one green context;
// resources from different splits may not.
struct Split {
  std::vector<ResourceId> groups;       // disjoint, all group_sm_count SMs
  std::uint32_t group_sm_count = 0;     // minCount rounded up to the granularity
  std::optional<ResourceId> remaining;  // absent when no SMs are left over
  std::uint32_t remaining_sm_count = 0;
};

// Thread-safety: each backend says; both shipped ones lock internally.
class DeviceApi {
 public:
  virtual ~DeviceApi() = default;

  // "sim" or "cuda".
  virtual std::string_view backend() const = 0;
  // Devices visible to this backend (cuDeviceGetCount).
  virtual base::Result<int> device_count() = 0;
  // The device this object drives.
  virtual base::Result<DeviceInfo> info() = 0;
  // The device's whole SM resource.
  virtual base::Result<SmResource> sm_resource() = 0;
  // How many groups a split of the device's SMs with `min_count` would make.
  virtual base::Result<std::uint32_t> split_group_count(std::uint32_t min_count) = 0;
  // Splits the device's SMs into at most `max_groups` groups of `min_count`
  // (rounded up and aligned); the SMs left over become the remainder.
  virtual base::Result<Split> split_by_count(std::uint32_t max_groups, std::uint32_t min_count) = 0;
  // A green context over `pieces` (all from one split) with its default stream.
  virtual base::Result<GreenCtxId> create_green_context(std::span<const ResourceId> pieces) = 0;
  // What the green context really got.
  virtual base::Result<SmResource> green_context_sm_resource(GreenCtxId ctx) = 0;
  // A non-blocking stream in `ctx`; `priority` is clamped to the device's
  // range (lower = higher priority, e.g. [-5, 0]).
  virtual base::Result<StreamId> create_stream(GreenCtxId ctx, int priority) = 0;
  virtual base::Result<void> destroy_stream(StreamId stream) = 0;
  // EBUSY while the context has live streams (see the file comment).
  virtual base::Result<void> destroy_green_context(GreenCtxId ctx) = 0;

  // --- Memory (primary context). Freeing an unknown pointer is
  // CUDA_ERROR_INVALID_VALUE and changes nothing.
  virtual base::Result<DevicePtr> alloc_device(std::uint64_t bytes) = 0;   // cuMemAlloc
  virtual base::Result<void> free_device(DevicePtr ptr) = 0;               // cuMemFree
  virtual base::Result<void*> alloc_pinned_host(std::uint64_t bytes) = 0;  // cuMemHostAlloc(PORTABLE)
  virtual base::Result<void> free_pinned_host(void* ptr) = 0;              // cuMemFreeHost

  // --- Streams outside any green context (all SMs; copy streams), created
  // in the primary context; `priority` is clamped like create_stream's.
  // destroy_stream() destroys either kind.
  virtual base::Result<StreamId> create_plain_stream(int priority) = 0;  // cuStreamCreateWithPriority
  // The CUstream behind an id, for the engine's own kernel launches. The sim
  // returns a distinct non-null token per stream (never dereference it).
  virtual base::Result<void*> native_stream(StreamId stream) = 0;
  // The reverse: the id of a live stream of this device whose native handle
  // is `native` (CUDA_ERROR_INVALID_HANDLE otherwise).
  virtual base::Result<StreamId> stream_for_native(void* native) = 0;
  // The CUcontext of green context `ctx` (cuCtxFromGreenCtx; 0: the primary
  // context), for runtime-API code that must make a partition current
  // (cuCtxPushCurrent) to create its own streams or run library calls in
  // it. The sim returns a distinct non-null token per context.
  virtual base::Result<void*> native_context(GreenCtxId ctx) = 0;

  // --- Copies and ordering. `dst` may point inside an allocation; `src`
  // should be pinned (alloc_pinned_host) for the copy to be asynchronous.
  virtual base::Result<void> copy_h2d_async(DevicePtr dst, const void* src, std::uint64_t bytes,
                                            StreamId stream) = 0;                    // cuMemcpyHtoDAsync
  virtual base::Result<EventId> create_event() = 0;                                  // cuEventCreate(DISABLE_TIMING)
  virtual base::Result<void> destroy_event(EventId event) = 0;                       // cuEventDestroy
  virtual base::Result<void> record_event(EventId event, StreamId stream) = 0;       // cuEventRecord
  virtual base::Result<void> stream_wait_event(StreamId stream, EventId event) = 0;  // cuStreamWaitEvent
  // true when the work the event captured is complete (an event never
  // recorded counts as complete, like CUDA).
  virtual base::Result<bool> event_done(EventId event) = 0;  // cuEventQuery
  virtual base::Result<void> event_synchronize(EventId event) = 0;
  virtual base::Result<void> stream_synchronize(StreamId stream) = 0;
  // The host→device copy bandwidth this backend assumes, bytes per second
  // (the sim: its configuration; CUDA: see cuda_device.h).
  virtual double h2d_bytes_per_s() const = 0;
};

}  // namespace tandem::gpu
