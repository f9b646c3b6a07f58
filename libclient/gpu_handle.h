// struct tandem_gpu: what a tandem_gpu handle (tandem/tandem_gpu.h) holds,
// for libtandem's GPU C ABI (gpu_api.cc) and the layer streamer's C ABI.
// Internal to libtandem; never installed.
//
// Thread-safety: none; a handle is used by one thread at a time (tandem_gpu.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "gpu/device.h"
#include "gpu/green_pool.h"
#include "tandem/tandem_gpu.h"

struct tandem_gpu {
  // The device this handle opened ("sim" or "cuda"); outlives `pool`.
  std::unique_ptr<tandem::gpu::DeviceApi> device_api;
  // Every partition's contexts and streams; destroyed before `device_api`.
  std::unique_ptr<tandem::gpu::GreenContextPool> pool;
  // The engine handle the pool reports to and follows; may be null. Must
  // outlive this handle.
  tandem_client* client = nullptr;
  // The id the client gave this pool in GPU_PARTITIONS: begin_pass follows
  // a published index only when the status page says it is for this pool.
  std::uint32_t pool_id = 0;
  // Message for the last failed call on this handle (tandem_gpu_last_error);
  // mutable so that calls on a const handle can explain their failures.
  mutable std::string last_error;

  tandem::gpu::DeviceApi& device() { return *device_api; }
  const tandem::gpu::DeviceApi& device() const { return *device_api; }

  // Sets last_error and returns -err (for `return h->fail(EINVAL, "...")`).
  int fail(int err, std::string message) const {
    last_error = std::move(message);
    return -err;
  }

  ~tandem_gpu() {
    pool.reset();  // streams and contexts before the device
    device_api.reset();
  }
};
