// CudaHarness: runs the kernels of gpu/testing/kernels.cu on a real GPU for
// the real-GPU suite (tests/gpu/real_gpu_test.cc) and the GPU benchmark
// (bench/gpu_bench.cc). Like gpu/cuda_device.cc it links nothing from CUDA:
// libcuda.so.1 is dlopen'd and every entry point comes from cuGetProcAddress
// at the ABI of the cuda.h it was compiled against. The embedded fatbin is
// loaded with cuLibraryLoadData (context-independent loading): a CUkernel
// launched with cuLaunchKernel runs in the context of the stream it is
// launched on, so the same kernel launches on plain streams and on
// green-context streams (gpu::DeviceApi::native_stream()).
//
// open() retains the device's primary context and makes it current in the
// calling thread (cuDevicePrimaryCtxRetain + cuCtxSetCurrent); memory,
// streams and timing events live in it. The destructor destroys what is
// still alive (streams, events, memory, the library) and releases the
// primary context; it never throws or aborts.
//
// Without cuda.h at build time, or without nvcc (no kernels), open() fails
// with ENOTSUP naming which; without a driver or device it fails with the
// open_cuda_device-style error (ENOENT "dlopen libcuda.so.1: …", ENODEV, …).
// Callers skip on any open() failure and print the message.
//
// Thread-safety: none. Use one object from one thread at a time; a thread
// other than the opening one calls make_current() first.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "base/result.h"
#include "gpu/device.h"

namespace tandem::gpu::testing {

struct Dim3 {
  std::uint32_t x = 1;
  std::uint32_t y = 1;
  std::uint32_t z = 1;
};

class CudaHarness {
 public:
  // Device `ordinal`'s primary context, current in this thread, with the
  // embedded kernels loaded. See the file comment for the errors.
  static base::Result<std::unique_ptr<CudaHarness>> open(int ordinal = 0);
  ~CudaHarness();
  CudaHarness(const CudaHarness&) = delete;
  CudaHarness& operator=(const CudaHarness&) = delete;

  const std::string& device_name() const { return name_; }
  std::uint32_t sm_count() const { return sm_count_; }
  int compute_capability() const { return cc_; }          // 90 for 9.0
  int driver_version() const { return driver_; }          // 13000 for 13.0
  std::uint32_t clock_khz() const { return clock_khz_; }  // CU_DEVICE_ATTRIBUTE_CLOCK_RATE

  // Makes the primary context current in the calling thread.
  base::Result<void> make_current();

  // Launches kernels.cu's `kernel` (its extern "C" name, e.g. "tandem_empty")
  // on `stream` (a CUstream: from create_stream() or DeviceApi::native_stream();
  // nullptr is the primary context's legacy stream). `args` holds a pointer
  // to each parameter's value, in order (cuLaunchKernel's kernelParams).
  base::Result<void> launch(std::string_view kernel, Dim3 grid, Dim3 block, void* stream, std::span<void* const> args);

  // Device memory in the primary context. The copies and memset are
  // synchronous: they wait for all work in the context (and its green
  // contexts) before or after, as needed, and are finished on return.
  base::Result<DevicePtr> alloc(std::uint64_t bytes);
  base::Result<void> free(DevicePtr ptr);
  base::Result<void> memset_d32(DevicePtr ptr, std::uint32_t value, std::uint64_t count);
  base::Result<void> copy_to_host(void* dst, DevicePtr src, std::uint64_t bytes);
  base::Result<void> copy_to_device(DevicePtr dst, const void* src, std::uint64_t bytes);

  // A non-blocking stream over all SMs (cuStreamCreate, CU_STREAM_NON_BLOCKING).
  base::Result<void*> create_stream();
  base::Result<void> destroy_stream(void* stream);
  base::Result<void> stream_synchronize(void* stream);
  // Waits for all work in the primary context and its green contexts.
  base::Result<void> synchronize();

  // Events with timing (CU_EVENT_DEFAULT), for cuEventElapsedTime.
  base::Result<void*> create_timing_event();
  base::Result<void> destroy_event(void* event);
  base::Result<void> record(void* event, void* stream);
  // Milliseconds from `start` to `end`; waits for `end` first.
  base::Result<float> elapsed_ms(void* start, void* end);

  // What this object still holds (tests check teardown with these).
  std::size_t live_allocations() const;
  std::size_t live_streams() const;
  std::size_t live_events() const;

 private:
  struct State;
  explicit CudaHarness(std::unique_ptr<State> state);

  std::unique_ptr<State> s_;
  std::string name_;
  std::uint32_t sm_count_ = 0;
  int cc_ = 0;
  int driver_ = 0;
  std::uint32_t clock_khz_ = 0;
};

}  // namespace tandem::gpu::testing
