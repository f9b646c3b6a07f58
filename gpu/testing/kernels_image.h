// The kernels of gpu/testing/kernels.cu as a fatbin embedded at build time
// (nvcc -fatbin, then embed_fatbin.cmake). When the build had no nvcc (or
// TANDEM_WITH_CUDA=OFF), kernels_fatbin() is empty and
// kernels_missing_reason() says why, e.g. "built without nvcc".
//
// Thread-safety: immutable data; safe from any thread.
#pragma once

#include <span>
#include <string_view>

namespace tandem::gpu::testing {

// The fatbin (sm_80/sm_90 code and compute_90 PTX by default), 64-byte aligned.
std::span<const unsigned char> kernels_fatbin();
// Empty when kernels_fatbin() holds the kernels, else why it does not.
std::string_view kernels_missing_reason();

}  // namespace tandem::gpu::testing
