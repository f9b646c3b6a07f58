// GreenContextPool: an engine's pre-built set of SM partitions (docs/architecture.md "GPU plane";
// [gpu_and_ipc] A.2–A.3). ONE split of the device's SMs into
// blocks; every partition's per-stage green context is combined from that
// split's pieces (contexts of different partitions overlap, which the driver
// allows), each with one stream; switching partitions at a forward-pass
// boundary is picking another index.
//
//   stages:      {"prefill", "decode"}            (2–4, by name)
//   partitions:  [0] prefill 116 | decode 16      (decode SMs strictly
//                [1] prefill 108 | decode 24       increasing: the index
//                ...                               contract the daemon uses,
//                [6] prefill  68 | decode 64       ipc::GpuPartitions)
//                [7] all 132 on plain streams     (optional "full device")
//
// Within a partition the stages take consecutive blocks in stage order and
// never share one. A "full device" partition has no green contexts: every
// stage gets a plain stream over all SMs (SGLang's no-partition group); its
// decode SMs are the device's.
//
// The "decode" stage (by name) orders the partitions; a pool without a stage
// named "decode" uses its LAST stage in that role (decode_sms() reports it).
//
// Switching (begin_pass): for every stage, an event is recorded on the old
// partition's stream and the new partition's stream waits on it, so work of
// the previous pass finishes before the next pass's work on the new streams
// starts, without a host synchronize (SGLang synchronizes). The events are
// created once per stage at create() and reused.
//
// Thread-safety: none; one thread (the engine's forward loop) uses a pool.
// The DeviceApi must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/result.h"
#include "gpu/device.h"

namespace tandem::gpu {

inline constexpr std::size_t kMinPoolStages = 2;
inline constexpr std::size_t kMaxPoolStages = 4;
inline constexpr std::size_t kMaxPoolPartitions = 16;  // ipc::kMaxGpuPartitions

// One stage's size in a partition: a number of SMs (0 = "the rest": what the
// other stages leave, rounded down to a feasible count; one stage at most),
// or a fraction of the device in (0, 1] (partition.h rounding).
using StageSize = std::variant<std::uint32_t, double>;

struct PoolPartition {
  std::vector<StageSize> sizes;  // one per stage, in PoolConfig::stages order
  bool full_device = false;      // plain streams over all SMs; `sizes` ignored
};

struct PoolStage {
  std::string name;
  int priority = 0;  // stream priority, lower = higher (clamped by the device)
};

struct PoolConfig {
  std::vector<PoolStage> stages;
  std::vector<PoolPartition> partitions;
};

// Nova/SGLang-style 2-stage pools: stages {"prefill", "decode"} (decode at
// priority -5, prefill 0); one partition per feasible decode count in
// [decode_min, decode_max] that is a multiple of `step` (feasible:
// partition.h feasible_sm_counts), prefill getting the rest; then, if
// `full_device`, one last plain-stream partition. EINVAL naming the numbers
// when no count qualifies or there would be more than kMaxPoolPartitions.
struct TwoStageOptions {
  std::uint32_t decode_min = 16;
  std::uint32_t decode_max = 64;
  std::uint32_t step = 8;
  bool full_device = false;
};
base::Result<PoolConfig> two_stage_config(const SmResource& device, const TwoStageOptions& options);

struct PoolCounters {
  std::uint64_t switches = 0;     // begin_pass calls that changed partition
  std::uint64_t bad_indices = 0;  // begin_pass calls with an index out of range
};

class GreenContextPool {
 public:
  // Builds every partition (see the file comment). Errors: EINVAL for a bad
  // config (naming the stage/partition), EIO when the split or a context's
  // SM count differs from the plan ("partition 2 stage 'decode': wanted 24
  // SMs, got 16"), or the device's error. On failure everything created so
  // far is destroyed, streams before contexts.
  static base::Result<std::unique_ptr<GreenContextPool>> create(DeviceApi& device, PoolConfig config);
  ~GreenContextPool();
  GreenContextPool(const GreenContextPool&) = delete;
  GreenContextPool& operator=(const GreenContextPool&) = delete;

  std::size_t stage_count() const { return stages_.size(); }
  std::size_t partition_count() const { return partitions_.size(); }
  std::string_view stage_name(std::size_t stage) const { return stages_[stage].name; }
  // The index of stage `name`; ENOENT naming it.
  base::Result<std::size_t> stage(std::string_view name) const;
  // The stage that orders partitions ("decode", else the last).
  std::size_t decode_stage() const { return decode_stage_; }
  // Decode SMs per partition, strictly increasing.
  std::vector<std::uint32_t> decode_sms() const;
  // SMs of `stage` in `partition` (asserts both in range).
  std::uint32_t sm_count(std::size_t partition, std::size_t stage) const;
  bool full_device(std::size_t partition) const { return partitions_[partition].full_device; }
  std::uint32_t device_sms() const { return device_sms_; }

  std::size_t active() const { return active_; }
  // The stream of `stage` in the active partition (asserts stage in range).
  StreamId stream(std::size_t stage) const;
  // The stream of `stage` in `partition` (tests, benchmarks).
  StreamId stream(std::size_t partition, std::size_t stage) const;
  // The green context of `stage` in the active partition; 0 (the primary
  // context) on a full-device partition.
  GreenCtxId context(std::size_t stage) const;

  // At a forward-pass boundary: switch to `index`. The same index does
  // nothing. ERANGE (counted in bad_indices) keeps the current partition
  // for an index ≥ partition_count(); a device error while ordering the
  // streams keeps it too.
  base::Result<void> begin_pass(std::size_t index);
  const PoolCounters& counters() const { return counters_; }

 private:
  struct Stage {
    std::string name;
    int priority = 0;
    std::optional<EventId> event;  // recorded on the old stream at a switch
  };
  struct StageSlot {
    std::uint32_t sm_count = 0;
    std::optional<GreenCtxId> ctx;  // absent on a full-device partition
    std::optional<StreamId> stream;
  };
  struct Partition {
    bool full_device = false;
    std::vector<StageSlot> slots;
  };

  explicit GreenContextPool(DeviceApi& device) : device_(device) {}
  base::Result<void> build(PoolConfig config);
  void teardown();

  DeviceApi& device_;
  std::vector<Stage> stages_;
  std::vector<Partition> partitions_;
  std::size_t decode_stage_ = 0;
  std::uint32_t device_sms_ = 0;
  std::size_t active_ = 0;
  PoolCounters counters_;
};

}  // namespace tandem::gpu
