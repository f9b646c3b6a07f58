// Loading the CUDA driver at run time, shared by the CUDA backend
// (cuda_device.cc) and the test kernels' launcher (testing/cuda_harness.cc):
// dlopen("libcuda.so.1") and cuGetProcAddress, entry points resolved by
// name and ABI version, and errors named the way cu_error() names them.
// Include only where cuda.h is available (TANDEM_HAVE_CUDA_H).
//
// Thread-safety: free functions; safe anywhere.
#pragma once

#include <cuda.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <cerrno>
#include <string>
#include <string_view>

#include "base/result.h"
#include "gpu/device.h"

namespace tandem::gpu::cuda_loader {

using GetProcAddress = decltype(&::cuGetProcAddress);

// cuGetProcAddress from libcuda.so.1, opened RTLD_LOCAL (the driver's
// symbols stay out of the global namespace) and never closed. ENOENT
// without a driver; ENOTSUP for one older than 12.0.
inline base::Result<GetProcAddress> open_libcuda() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return base::make_error(ENOENT, fmt::format("dlopen libcuda.so.1: {}", why != nullptr ? why : "unknown error"));
  }
  void* sym = dlsym(lib, "cuGetProcAddress_v2");
  if (sym == nullptr) {
    return base::make_error(ENOTSUP, "libcuda.so.1 has no cuGetProcAddress_v2 (driver older than 12.0)");
  }
  return reinterpret_cast<GetProcAddress>(sym);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
}

// Resolves `symbol` (its name without the _v2 suffixes the header's macros
// add: the ABI version picks) into *out; on failure appends it to *missing.
template <class Fn>
bool resolve(GetProcAddress get, const char* symbol, int abi, Fn* out, std::string* missing) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  if (get(symbol, &p, abi, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
      status != CU_GET_PROC_ADDRESS_SUCCESS || p == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += symbol;
    return false;
  }
  *out = reinterpret_cast<Fn>(p);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast): dlsym's contract
  return true;
}

// "<call>: CUDA_ERROR_…: <cuGetErrorString>[: detail]", with the driver's
// own name and text where it gives them (either function may be null).
inline std::unexpected<base::Error> driver_error(decltype(&::cuGetErrorName) get_error_name,
                                                 decltype(&::cuGetErrorString) get_error_string, std::string_view call,
                                                 CUresult r, std::string_view detail = {}) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (get_error_name == nullptr || get_error_name(r, &name) != CUDA_SUCCESS) name = nullptr;
  if (get_error_string == nullptr || get_error_string(r, &text) != CUDA_SUCCESS) text = nullptr;
  std::string n = name != nullptr ? std::string(name) : cu_result_name(r);
  std::string_view t = text != nullptr ? std::string_view(text) : cu_result_description(r);
  return cu_error(call, r, n, t, detail);
}

}  // namespace tandem::gpu::cuda_loader
