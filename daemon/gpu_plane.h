// GpuPlane: tandemd's GPU plane (docs/architecture.md "GPU plane") — per engine, the KV
// accounting mirror's projected demand, Nova's SM-partition choice and
// Nova's weight-offload plan.
//
// Engines describe their GPU side with three records (ipc/records.h):
// GPU_PARTITIONS (the green-context pool libtandem built: decode SMs of each
// partition), STAGE_PROFILE rows (a stage's latency/throughput against SM
// count; taken when the last row arrives) and WEIGHT_MODULE (a module the
// engine can stream through K slots). The server routes them here, and
// KV_STATS for its block_bytes. Each control tick the plane decides, per
// engine:
//
//   - the partition index to publish (EngineStatus::sm_partition):
//       SM_op   the knee of the decode profile's Pareto front
//               (sched::sm_op), or without a profile the pool's largest
//               decode partition — see docs/daemon.md "GPU plane";
//       N_pend  the engine's waiting sequences (KV_STATS waiting_seqs);
//       SM_dec  = sched::sm_dec(SM_op, N_pend, {device SMs, granularity 1,
//               [gpu] sm_min, alpha}), the index from
//               sched::PartitionChooser (hysteresis: [gpu] grow_hold);
//   - the weight-offload plan (EngineStatus::offload_plan and
//     offload_freed_bytes) from sched::WeightOffloadPolicy, fed the
//     engine's projected KV demand (projected_blocks()), its pool and its
//     block size.
//
// tick() reports what changed; the server publishes it on the status page,
// logs it and counts it. Nothing here does I/O.
//
// Thread-safety: one thread (the daemon's loop).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "daemon/config.h"
#include "ipc/records.h"
#include "sched/model.h"
#include "sched/sm_partition.h"
#include "sched/weight_offload.h"

namespace tandem::daemon {

// What the GPU plane chose for one engine, as the server last published it
// on the engine's status page (and tandemctl shows it).
struct GpuChoice {
  std::uint32_t sm_partition = 0;
  bool sm_partition_set = false;
  std::uint64_t offload_plan = 0;         // the weight-offload plan (bit i: module i)
  std::uint64_t offload_freed_bytes = 0;  // device bytes that plan frees
};

// What one tick changed for one engine.
struct GpuChange {
  sched::EngineId engine = sched::kNoEngine;
  bool sm = false;  // a new partition index to publish
  std::uint32_t sm_partition = 0;
  std::uint32_t decode_sms = 0;  // of that partition
  std::uint32_t sm_dec = 0;      // what Nova's formula asked for
  std::uint32_t n_pend = 0;
  bool offload = false;  // a new offload plan to publish
  std::uint64_t offload_plan = 0;
  std::uint64_t freed_bytes = 0;
  double pressure = 0.0;  // projected / pool when the plan changed
};

// The plane's state for one engine. Thread-safety: as GpuPlane.
struct EngineGpu {
  // The green-context pool (GPU_PARTITIONS); none before it arrives.
  std::uint32_t device_sms = 0;
  std::uint32_t pool_id = 0;  // the engine's id for this pool (GPU_PARTITIONS)
  std::vector<std::uint32_t> decode_sms;
  std::optional<sched::PartitionChooser> chooser;
  bool published = false;  // an index was chosen for this pool
  std::uint32_t published_index = 0;
  std::uint32_t sm_dec = 0;  // at the last tick
  std::uint32_t n_pend = 0;  // at the last tick
  // Profiles by ipc::GpuStage, and the rows of one still arriving.
  std::array<std::optional<sched::StageProfile>, 2> profiles;
  struct Partial {
    std::uint32_t row_count = 0;
    std::vector<sched::ProfileRow> rows;
  };
  std::array<Partial, 2> partial;
  std::uint32_t sm_op = 0;  // from the decode profile; 0 = none (the fallback applies)
  // Weight offload.
  sched::WeightOffloadPolicy offload;
  std::uint64_t block_bytes = 0;       // KV_STATS; 0 = unknown
  std::uint64_t projected_blocks = 0;  // at the last tick that planned offload

  bool has_pool() const { return chooser.has_value(); }
};

// Thread-safety: one thread.
class GpuPlane {
 public:
  explicit GpuPlane(const GpuConfig& config) : config_(config) {}

  // A new [gpu] section (reload, validated). A changed grow_hold restarts
  // every engine's chooser; its next decision applies at once and is
  // published only if it differs.
  void configure(const GpuConfig& config);
  const GpuConfig& config() const { return config_; }

  // GPU_PARTITIONS, STAGE_PROFILE or WEIGHT_MODULE from `engine`, validated
  // by the decoder. Returns whether the engine's partition pool changed (the
  // index published for the old one no longer applies). Errors (EINVAL,
  // nothing changes, except that a broken profile is discarded): a profile
  // row out of order ("STAGE_PROFILE decode: row 2 of 4, expected row 1"),
  // a profile that sched::StageProfile refuses, a record of another type.
  base::Result<bool> on_record(sched::EngineId engine, const ipc::Record& record);
  // KV_STATS: the engine's block size (the rest the NodeModel keeps).
  void on_kv_stats(sched::EngineId engine, const ipc::KvStats& stats);
  void engine_gone(sched::EngineId engine);

  // One control decision for every engine with a pool or weight modules;
  // appends what changed to `out`.
  void tick(const sched::NodeModel& model, std::vector<GpuChange>& out);

  const EngineGpu* engine(sched::EngineId id) const;
  const std::map<sched::EngineId, EngineGpu>& engines() const { return engines_; }

  // The KV blocks each engine's live sessions are projected to hold: a
  // running round (an admitted session's round in flight) its ROUND_SUBMIT
  // projected_blocks (or what it holds already, if more); a session between
  // rounds or in a tool call the blocks it still holds (kept or pinned).
  // Waiting sessions (not admitted) and paused ones (KV dropped or on the
  // host) count nothing. One walk over the reasoning and acting sessions.
  static std::map<sched::EngineId, std::uint64_t> projected_blocks(const sched::SessionTable& sessions);

  // The SM_dec parameters for an engine's pool (granularity 1: the chooser
  // maps SM_dec onto the pool's partitions, whatever their spacing).
  sched::SmDecParams sm_params(const EngineGpu& e) const;
  // SM_op for an engine: the decode profile's knee, else the largest partition.
  static std::uint32_t sm_op_of(const EngineGpu& e);

  sched::OffloadParams offload_params() const;

 private:
  base::Result<bool> on_partitions(EngineGpu& e, const ipc::GpuPartitions& r);
  base::Result<void> on_profile_row(EngineGpu& e, const ipc::StageProfileRow& r);

  GpuConfig config_;
  std::map<sched::EngineId, EngineGpu> engines_;
};

}  // namespace tandem::daemon
