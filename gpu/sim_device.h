// SimDevice: a DeviceApi with no GPU behind it, for tests and for machines
// without a driver (docs/architecture.md "GPU plane"). It follows the CUDA 13.0 driver's rules
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
//   of GPC structure (an H200: 15 of 8, not 16); the simulated one does at
//   the smallest size when SimDeviceConfig::block_groups says so.
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
// Memory, copies and events, with a virtual-time model (docs/gpu.md, "Memory,
// copies and events"):
//
// - A virtual clock in nanoseconds (now_ns(), advance()); nothing reads wall
//   time. Every stream (green-context or plain) is a FIFO timeline: an op
//   issued at virtual time t starts at max(t, the stream's tail, the
//   completion of every event the stream was told to wait on before it) and
//   ends start + duration. record_event captures the stream's tail at that
//   point; an event never recorded counts as complete (like CUDA).
//   event_done compares with now_ns(); event_synchronize and
//   stream_synchronize advance the clock to the completion time.
// - Host→device copies take h2d_copy_ns(bytes) and all share ONE copy engine:
//   they serialise across streams in issue order. Device memory is backed by
//   host memory and the copy really moves the bytes — when it is issued (the
//   model orders time, it does not defer data; read_device() shows what the
//   device would hold once the copy completes). A copy destination may point
//   inside an allocation; one that overruns it is CUDA_ERROR_INVALID_VALUE.
//   Allocations count against memory_bytes (beyond it:
//   CUDA_ERROR_OUT_OF_MEMORY); addresses are never reused.
// - Kernels: launch_kernel(stream, work) enqueues a kernel whose duration is
//   the roofline kernel_ns(work, SMs of the stream's green context; a plain
//   stream gets all SMs). Kernels on different streams overlap freely; SM
//   and bandwidth contention between concurrent kernels is NOT modelled
//   beyond each kernel's own SM count.
//
// Deterministic: ids count up from 1 per kind, and nothing depends on wall time.
// Thread-safety: all methods lock one mutex; safe from any thread.
#pragma once

#include <cstddef>
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
  // Groups a split at the smallest size makes, as a real driver counts them
  // (GPC structure); 0: sm_count / size. An H200 made 15 (of 8 SMs, and 12
  // remaining). Splits at larger sizes use the arithmetic.
  std::uint32_t block_groups = 0;
  std::uint64_t memory_bytes = 80ull << 30;
  // Host↔device copy bandwidth (pinned memory), bytes per second; PCIe 5.0 x16
  // moves about 50 GB/s each way in practice.
  double h2d_bytes_per_s = 50e9;
  double d2h_bytes_per_s = 50e9;
  // cuCtxGetStreamPriorityRange: greatest (numerically lowest) and least.
  int greatest_priority = -5;
  int least_priority = 0;
  // The kernel roofline (kernel_ns). H100 SXM: ~989 TFLOP/s dense BF16 over
  // 132 SMs (NVIDIA H100 datasheet) ≈ 7.49 TFLOP/s per SM; HBM3 ~3.35 TB/s.
  // Assumption (not a datasheet number): one SM can pull at most
  // hbm_bytes_per_s / 44, so about a third of the SMs (44 of 132) saturate
  // HBM and a smaller partition is bandwidth-limited in proportion.
  double flops_per_sm_per_s = 989e12 / 132;
  double hbm_bytes_per_s = 3.35e12;
  double bytes_per_sm_per_s = 3.35e12 / 44;
};

// What one kernel does, for the roofline.
struct KernelWork {
  double flops = 0;
  double bytes = 0;  // HBM traffic
};

// One modelled operation on the device's timeline (SimDevice::ops()).
struct SimOp {
  enum class Kind { kCopyH2D, kKernel };
  Kind kind;
  StreamId stream;
  std::uint64_t start_ns;
  std::uint64_t end_ns;
  DevicePtr dst = 0;  // copies
  std::uint64_t bytes = 0;
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

  base::Result<DevicePtr> alloc_device(std::uint64_t bytes) override;
  base::Result<void> free_device(DevicePtr ptr) override;
  base::Result<void*> alloc_pinned_host(std::uint64_t bytes) override;
  base::Result<void> free_pinned_host(void* ptr) override;
  base::Result<StreamId> create_plain_stream(int priority) override;
  base::Result<void*> native_stream(StreamId stream) override;
  base::Result<StreamId> stream_for_native(void* native) override;
  base::Result<void*> native_context(GreenCtxId ctx) override;
  base::Result<void> copy_h2d_async(DevicePtr dst, const void* src, std::uint64_t bytes, StreamId stream) override;
  base::Result<EventId> create_event() override;
  base::Result<void> destroy_event(EventId event) override;
  base::Result<void> record_event(EventId event, StreamId stream) override;
  base::Result<void> stream_wait_event(StreamId stream, EventId event) override;
  base::Result<bool> event_done(EventId event) override;
  base::Result<void> event_synchronize(EventId event) override;
  base::Result<void> stream_synchronize(StreamId stream) override;
  double h2d_bytes_per_s() const override { return config_.h2d_bytes_per_s; }

  const SimDeviceConfig& config() const { return config_; }
  // Modelled time to copy `bytes` between host and device, in nanoseconds
  // (rounded up).
  std::uint64_t h2d_copy_ns(std::uint64_t bytes) const;
  std::uint64_t d2h_copy_ns(std::uint64_t bytes) const;
  // The roofline: max(flops / (sm_count · flops_per_sm_per_s),
  // bytes / min(hbm_bytes_per_s, sm_count · bytes_per_sm_per_s)), in ns
  // rounded up; 0 SMs or negative work is 0.
  std::uint64_t kernel_ns(KernelWork work, std::uint32_t sm_count) const;

  // The virtual clock.
  std::uint64_t now_ns() const;
  void advance(std::uint64_t ns);
  // Enqueues a modelled kernel on `stream` (CUDA_ERROR_INVALID_HANDLE for an
  // unknown stream; negative or non-finite work is CUDA_ERROR_INVALID_VALUE).
  base::Result<void> launch_kernel(StreamId stream, KernelWork work);
  // When everything enqueued on `stream` so far completes (its tail).
  base::Result<std::uint64_t> stream_tail_ns(StreamId stream) const;
  // When a recorded event completes (0 if never recorded).
  base::Result<std::uint64_t> event_time_ns(EventId event) const;

  // Introspection for tests.
  std::size_t live_green_contexts() const;
  std::size_t live_streams() const;  // both kinds
  std::size_t live_events() const;
  std::size_t live_device_allocations() const;
  std::uint64_t device_bytes_in_use() const;
  std::size_t live_pinned_allocations() const;
  std::uint64_t pinned_bytes_in_use() const;
  int stream_priority(StreamId stream) const;  // -1000 if unknown
  // The bytes at [ptr, ptr + bytes) of one allocation; EINVAL naming the
  // address when the range is not inside a live allocation.
  base::Result<std::vector<std::byte>> read_device(DevicePtr ptr, std::uint64_t bytes) const;
  // Every copy and kernel issued so far, in issue order.
  std::vector<SimOp> ops() const;
  // Every successful state-changing call, in order: "split 16x8+4",
  // "ctx 1 = 48 SMs", "stream 1 in ctx 1", "plain stream 2", "destroy stream 1",
  // "destroy ctx 1", "alloc 4096 = 0x7f0000000000", "free 0x7f0000000000",
  // "pinned 4096", "free pinned 4096", "event 1", "destroy event 1". Copies,
  // records, waits and kernels are in ops(), not here.
  std::vector<std::string> calls() const;

 private:
  explicit SimDevice(SimDeviceConfig config) : config_(std::move(config)) {}

  struct Piece {
    std::uint64_t split;
    std::uint32_t sm_count;
  };
  struct Stream {
    GreenCtxId ctx;  // 0: a plain stream (all SMs)
    int priority;
    std::uint64_t tail_ns = 0;  // when the last op enqueued completes
  };
  struct Event {
    bool recorded = false;
    std::uint64_t complete_ns = 0;
  };
  struct Allocation {
    std::unique_ptr<std::byte[]> data;
    std::uint64_t bytes;
  };

  // The live allocation holding [ptr, ptr + bytes), or end().
  std::map<DevicePtr, Allocation>::const_iterator find_allocation(DevicePtr ptr, std::uint64_t bytes) const;
  std::uint32_t stream_sm_count(const Stream& s) const;

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
  std::uint64_t now_ns_ = 0;
  std::uint64_t copy_engine_tail_ns_ = 0;  // the one H2D copy engine
  std::uint64_t next_event_ = 1;
  std::map<EventId, Event> events_;
  DevicePtr next_address_ = 0x7f0000000000;  // like a real device VA; 256-byte aligned
  std::uint64_t device_bytes_ = 0;
  std::map<DevicePtr, Allocation> allocations_;
  std::map<void*, Allocation> pinned_;
  std::uint64_t pinned_bytes_ = 0;
  std::vector<SimOp> ops_;
};

}  // namespace tandem::gpu
