// SimDevice: a DeviceApi with no GPU behind it, for tests and for machines
// without a driver (DESIGN.md §6). It follows the CUDA 13.0 driver's rules
// for green contexts, as documented in cuda.h, and returns the same CUresult
// names:
//
// - cuDevSmResourceSplitByCount: minCount must be ≤ the SM count
//   (CUDA_ERROR_INVALID_VALUE). It is raised to minSmPartitionSize and
//   rounded up to smCoscheduledAlignment; the split makes
//   min(max_groups, sm_count / group) groups of that size, and what is left
//   over is the remainder. max_groups 0 is CUDA_ERROR_INVALID_VALUE. A
//   minCount that rounds up past the SM count is
//   CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION (assumed: the header does not
//   say). The real driver may make fewer groups than this arithmetic because
//   of GPC structure; the simulated one never does.
// - cuDevResourceGenerateDesc: no pieces is CUDA_ERROR_INVALID_VALUE, a piece
//   this device never produced is CUDA_ERROR_INVALID_VALUE, pieces from two
//   splits (or the same piece twice, assumed) are
//   CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION.
// - Green contexts may overlap (the driver allows it: a partition describes
//   SMs, it does not reserve them), which is how a pool pre-creates every
//   partition it may switch to.
// - Streams belong to their context; a stream id of another device or an
//   already destroyed stream is CUDA_ERROR_INVALID_HANDLE, an unknown context
//   CUDA_ERROR_INVALID_CONTEXT; priorities are clamped to [-5, 0].
// - Destroying a context with live streams is refused (EBUSY; device.h).
//
// Deterministic: ids count up from 1 per kind, and nothing depends on time.
// Thread-safety: all methods lock one mutex; safe from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/device.h"

namespace tandem::gpu {

struct SimDeviceConfig {
  std::string name = "NVIDIA H100 80GB HBM3 (simulated)";
  int ordinal = 0;
  int device_count = 1;
  std::uint32_t sm_count = 132;          // H100 SXM, H200
  std::uint32_t min_partition_size = 8;  // compute capability 9.0+
  std::uint32_t alignment = 8;
  std::uint64_t memory_bytes = 80ull << 30;
  // Host↔device copy bandwidth (pinned memory), bytes per second; PCIe 5.0 x16
  // moves about 50 GB/s each way in practice.
  double h2d_bytes_per_s = 50e9;
  double d2h_bytes_per_s = 50e9;
  // cuCtxGetStreamPriorityRange: greatest (numerically lowest) and least.
  int greatest_priority = -5;
  int least_priority = 0;
};

class SimDevice final : public DeviceApi {
 public:
  // EINVAL naming the field for an inconsistent configuration.
  static base::Result<std::unique_ptr<SimDevice>> create(SimDeviceConfig config = {});

  std::string_view backend() const override { return "sim"; }
  base::Result<int> device_count() override;
  base::Result<DeviceInfo> info() override;
  base::Result<SmResource> sm_resource() override;
  base::Result<std::uint32_t> split_group_count(std::uint32_t min_count) override;
  base::Result<Split> split_by_count(std::uint32_t max_groups, std::uint32_t min_count) override;
  base::Result<GreenCtxId> create_green_context(std::span<const ResourceId> pieces) override;
  base::Result<SmResource> green_context_sm_resource(GreenCtxId ctx) override;
  base::Result<StreamId> create_stream(GreenCtxId ctx, int priority) override;
  base::Result<void> destroy_stream(StreamId stream) override;
  base::Result<void> destroy_green_context(GreenCtxId ctx) override;

  const SimDeviceConfig& config() const { return config_; }
  // Modelled time to copy `bytes` between host and device, in nanoseconds.
  std::uint64_t h2d_copy_ns(std::uint64_t bytes) const;
  std::uint64_t d2h_copy_ns(std::uint64_t bytes) const;

  // Introspection for tests.
  std::size_t live_green_contexts() const;
  std::size_t live_streams() const;
  int stream_priority(StreamId stream) const;  // -1000 if unknown
  // Every successful state-changing call, in order: "split 16x8+4",
  // "ctx 1 = 48 SMs", "stream 1 in ctx 1", "destroy stream 1", "destroy ctx 1".
  std::vector<std::string> calls() const;

 private:
  explicit SimDevice(SimDeviceConfig config) : config_(std::move(config)) {}

  struct Piece {
    std::uint64_t split;
    std::uint32_t sm_count;
  };
  struct Stream {
    GreenCtxId ctx;
    int priority;
  };

  const SimDeviceConfig config_;
  mutable std::mutex mu_;
  std::uint64_t next_split_ = 1;
  std::uint64_t next_resource_ = 1;
  std::uint64_t next_ctx_ = 1;
  std::uint64_t next_stream_ = 1;
  std::map<ResourceId, Piece> pieces_;
  std::map<GreenCtxId, std::uint32_t> contexts_;  // id → SM count
  std::map<StreamId, Stream> streams_;
  std::vector<std::string> calls_;
};

}  // namespace tandem::gpu
