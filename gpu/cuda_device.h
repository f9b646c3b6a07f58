// The CUDA driver backend of DeviceApi (docs/architecture.md "GPU plane"). libcuda.so.1 is
// loaded with dlopen at run time, never linked, so every tandem binary runs
// on machines without a driver; the entry points are resolved with
// cuGetProcAddress at the ABI of the cuda.h the backend was compiled against
// (CUDA 13.0). When cuda.h was not found at configure time (or
// TANDEM_WITH_CUDA=OFF), open_cuda_device() always fails with ENOTSUP
// "built without CUDA headers".
//
// Opening a device runs cuInit, cuDeviceGet and cuDevicePrimaryCtxRetain (the
// header advises keeping the primary context alive while green contexts come
// and go) and reads the device's SM resource; the DeviceApi calls then map
// one to one onto the green-context calls listed in device.h. The object's
// destructor destroys the streams and green contexts still alive, in that
// order, then the rest listed below, then releases the primary context.
// libcuda stays loaded for the life of the process (unloading a driver
// library is not worth its risks).
//
// Memory, plain streams, copies and events (device.h) run in the primary
// context, which the backend makes current in the calling thread
// (cuCtxSetCurrent) before cuMemAlloc, cuMemFree, cuMemHostAlloc,
// cuMemFreeHost, cuStreamCreateWithPriority, cuMemcpyHtoDAsync and
// cuEventCreate; it stays current afterwards, so a caller that keeps another
// context current in that thread must restore it. The destructor destroys, in order: streams, green
// contexts, events, device memory, pinned memory, and releases the primary
// context. h2d_bytes_per_s() is a documented default, not a measurement:
// 25 GB/s, what PCIe 4.0 x16 moves from pinned memory (PCIe 5.0 hosts do
// about twice that). event_synchronize and stream_synchronize wait without
// holding the lock.
//
// Thread-safety: every method locks one mutex; the driver calls run under it.
#pragma once

#include <memory>

#include "gpu/device.h"

namespace tandem::gpu {

// Whether this build compiled the real backend (cuda.h was available).
bool cuda_backend_built();

// The device with CUDA ordinal `ordinal`. Errors name the reason: built
// without CUDA headers (ENOTSUP), libcuda.so.1 absent (ENOENT, with dlerror's
// text), a driver older than 12.5 (ENOTSUP), or the failing driver call.
base::Result<std::unique_ptr<DeviceApi>> open_cuda_device(int ordinal);

}  // namespace tandem::gpu
