// CUresult names, descriptions and errno mapping shared by both backends.
#include "gpu/device.h"

#include <fmt/format.h>

#include <cerrno>

namespace tandem::gpu {
namespace {

struct Known {
  int result;
  std::string_view name;
  std::string_view description;  // cuGetErrorString's wording where known
  int errno_value;
};

constexpr Known kKnown[] = {
    {kCudaSuccess, "CUDA_SUCCESS", "no error", 0},
    {kCudaErrorInvalidValue, "CUDA_ERROR_INVALID_VALUE", "invalid argument", EINVAL},
    {kCudaErrorOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory", ENOMEM},
    {kCudaErrorNotInitialized, "CUDA_ERROR_NOT_INITIALIZED", "initialization error", EIO},
    {kCudaErrorNoDevice, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected", ENODEV},
    {kCudaErrorInvalidDevice, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal", ENODEV},
    {kCudaErrorInvalidContext, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context", EINVAL},
    {kCudaErrorInvalidHandle, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle", EINVAL},
    {kCudaErrorNotFound, "CUDA_ERROR_NOT_FOUND", "named symbol not found", ENOENT},
    {kCudaErrorNotReady, "CUDA_ERROR_NOT_READY", "device not ready", EAGAIN},
    {kCudaErrorIllegalAddress, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered", EFAULT},
    {kCudaErrorContextIsDestroyed, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed", EINVAL},
    {kCudaErrorNotPermitted, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted", EPERM},
    {kCudaErrorNotSupported, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported", ENOTSUP},
    {kCudaErrorInvalidResourceType, "CUDA_ERROR_INVALID_RESOURCE_TYPE", "invalid resource type", EINVAL},
    {kCudaErrorInvalidResourceConfiguration, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
     "invalid resource configuration", EINVAL},
};

const Known* find(int result) {
  for (const Known& k : kKnown) {
    if (k.result == result) return &k;
  }
  return nullptr;
}

}  // namespace

std::string cu_result_name(int result) {
  const Known* k = find(result);
  return k != nullptr ? std::string(k->name) : fmt::format("CUDA_ERROR_{}", result);
}

std::string_view cu_result_description(int result) {
  const Known* k = find(result);
  return k != nullptr ? k->description : "unknown CUDA error";
}

int cu_result_errno(int result) {
  const Known* k = find(result);
  // Anything unnamed (launch failures, ECC, …) is an I/O error to the caller.
  return k != nullptr && k->errno_value != 0 ? k->errno_value : EIO;
}

std::unexpected<base::Error> cu_error(std::string_view call, int result, std::string_view name,
                                      std::string_view description, std::string_view detail) {
  std::string context = fmt::format("{}: {}: {}", call, name, description);
  if (!detail.empty()) context += fmt::format(": {}", detail);
  return base::make_error(cu_result_errno(result), std::move(context));
}

std::unexpected<base::Error> cu_error(std::string_view call, int result, std::string_view detail) {
  return cu_error(call, result, cu_result_name(result), cu_result_description(result), detail);
}

std::unexpected<base::Error> live_streams_error(std::uint64_t ctx, std::size_t live) {
  return base::make_error(EBUSY, fmt::format("cuGreenCtxDestroy: green context {} has {} live stream(s): destroy them "
                                             "first (the driver would leak them, and they would fail with "
                                             "CUDA_ERROR_CONTEXT_IS_DESTROYED)",
                                             ctx, live));
}

}  // namespace tandem::gpu
