// DeviceApi: the GPU calls tandem's SM partitioning needs (DESIGN.md §6),
// shaped after the CUDA 13.0 driver's green-context flow
// (research/gpu_and_ipc.md A.1, A.2):
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
  kCudaErrorContextIsDestroyed = 709,
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

// CUdevSmResource: the SM count of a resource, and the device's partitioning
// granularity (minSmPartitionSize, smCoscheduledAlignment; 8 and 8 on Hopper).
struct SmResource {
  std::uint32_t sm_count = 0;
  std::uint32_t min_partition_size = 0;
  std::uint32_t alignment = 0;
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
};

}  // namespace tandem::gpu
