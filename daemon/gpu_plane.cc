// The daemon's GPU plane: records in, per-engine partition and offload
// decisions out (see gpu_plane.h).
#include "daemon/gpu_plane.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include <fmt/format.h>

namespace tandem::daemon {
namespace {

constexpr std::string_view kStageNames[] = {"decode", "prefill"};

}  // namespace

void GpuPlane::configure(const GpuConfig& config) {
  const bool rechoose = config.grow_hold != config_.grow_hold;
  config_ = config;
  if (!rechoose) return;
  for (auto& [id, e] : engines_) {
    if (!e.has_pool()) continue;
    // The pool was accepted before, so it is accepted again.
    if (auto c = sched::PartitionChooser::create(e.decode_sms, config_.grow_hold)) e.chooser = std::move(*c);
  }
}

base::Result<bool> GpuPlane::on_record(sched::EngineId engine, const ipc::Record& record) {
  EngineGpu& e = engines_[engine];
  switch (record.type()) {
    case ipc::RecordType::kGpuPartitions:
      return on_partitions(e, record.as<ipc::GpuPartitions>());
    case ipc::RecordType::kStageProfile:
      if (auto r = on_profile_row(e, record.as<ipc::StageProfileRow>()); !r)
        return base::propagate(std::move(r.error()));
      return false;
    case ipc::RecordType::kWeightModule: {
      const auto w = record.as<ipc::WeightModule>();
      sched::WeightModuleSpec m;
      m.index = w.index;
      m.slots = w.slots;
      m.layers = w.layers;
      m.layer_compute_s = static_cast<double>(w.layer_compute_us) * 1e-6;
      m.bytes = w.bytes;
      m.name.assign(w.name, strnlen(w.name, sizeof w.name));
      if (auto r = e.offload.set_module(m); !r) return base::propagate(std::move(r.error()), "WEIGHT_MODULE");
      return false;
    }
    default:
      return base::make_error(EINVAL,
                              fmt::format("GPU plane: {} is not a GPU record", ipc::record_type_name(record.type())));
  }
}

base::Result<bool> GpuPlane::on_partitions(EngineGpu& e, const ipc::GpuPartitions& r) {
  std::vector<std::uint32_t> decode(r.decode_sms, r.decode_sms + r.count);
  // The same pool again (a resync) changes nothing.
  if (e.has_pool() && r.pool_id == e.pool_id && decode == e.decode_sms && r.device_sms == e.device_sms) return false;
  auto chooser = sched::PartitionChooser::create(decode, config_.grow_hold);
  if (!chooser) return base::propagate(std::move(chooser.error()), "GPU_PARTITIONS");
  e.device_sms = r.device_sms;
  e.pool_id = r.pool_id;
  e.decode_sms = std::move(decode);
  e.chooser = std::move(*chooser);
  e.published = false;
  e.published_index = 0;
  return true;
}

base::Result<void> GpuPlane::on_profile_row(EngineGpu& e, const ipc::StageProfileRow& r) {
  const std::size_t stage = r.stage;  // the decoder checked it names a GpuStage
  EngineGpu::Partial& p = e.partial[stage];
  if (r.row == 0) {
    p.rows.clear();
    p.row_count = r.row_count;
  } else if (p.rows.size() != r.row || p.row_count != r.row_count) {
    const std::string expected =
        p.row_count == 0 ? std::string("row 0 first") : fmt::format("row {} of {}", p.rows.size(), p.row_count);
    p = {};
    return base::make_error(EINVAL, fmt::format("STAGE_PROFILE {}: row {} of {}, expected {}", kStageNames[stage],
                                                r.row, r.row_count, expected));
  }
  p.rows.push_back({r.sm_count, r.latency_s, r.throughput});
  if (p.rows.size() < p.row_count) return {};
  auto profile = sched::StageProfile::create(kStageNames[stage], std::move(p.rows));
  p = {};
  if (!profile) return base::propagate(std::move(profile.error()), "STAGE_PROFILE");
  if (stage == static_cast<std::size_t>(ipc::GpuStage::kDecode)) e.sm_op = sched::sm_op(sched::pareto_front(*profile));
  e.profiles[stage] = std::move(*profile);
  return {};
}

void GpuPlane::on_kv_stats(sched::EngineId engine, const ipc::KvStats& stats) {
  engines_[engine].block_bytes = stats.block_bytes;
}

void GpuPlane::engine_gone(sched::EngineId engine) { engines_.erase(engine); }

const EngineGpu* GpuPlane::engine(sched::EngineId id) const {
  auto it = engines_.find(id);
  return it == engines_.end() ? nullptr : &it->second;
}

sched::SmDecParams GpuPlane::sm_params(const EngineGpu& e) const {
  sched::SmDecParams p;
  p.total = e.device_sms;
  // No rounding: the chooser maps SM_dec onto the pool's own partitions
  // (the smallest with at least SM_dec decode SMs), whatever their spacing.
  // Rounding to a grid first would skip partitions off the grid (a pool of
  // 16 and 132 SMs, or 12, 20, 28 with the split's remainder).
  p.granularity = 1;
  p.sm_min = std::min(config_.sm_min, e.device_sms);
  p.alpha = config_.alpha;
  return p;
}

std::uint32_t GpuPlane::sm_op_of(const EngineGpu& e) {
  if (e.sm_op != 0) return e.sm_op;
  return e.decode_sms.empty() ? 0 : e.decode_sms.back();
}

sched::OffloadParams GpuPlane::offload_params() const {
  sched::OffloadParams p;
  p.link_bytes_per_s = config_.link_bytes_per_s;
  p.offload_pressure = config_.offload_pressure;
  p.restore_pressure = config_.restore_pressure;
  p.hold = config_.hold;
  p.allow_slowdown = config_.allow_slowdown;
  return p;
}

std::map<sched::EngineId, std::uint64_t> GpuPlane::projected_blocks(const sched::SessionTable& sessions) {
  std::map<sched::EngineId, std::uint64_t> out;
  for (const sched::Session* s : sessions.in_state(sched::SessionState::kReasoning)) {
    if (s->engine == sched::kNoEngine) continue;
    out[s->engine] += s->round_in_flight ? std::max(s->projected_blocks, s->blocks_held) : s->blocks_held;
  }
  for (const sched::Session* s : sessions.in_state(sched::SessionState::kActing)) {
    if (s->engine != sched::kNoEngine) out[s->engine] += s->blocks_held;
  }
  return out;
}

void GpuPlane::tick(const sched::NodeModel& model, std::vector<GpuChange>& out) {
  const bool any_modules =
      std::ranges::any_of(engines_, [](const auto& kv) { return !kv.second.offload.modules().empty(); });
  std::map<sched::EngineId, std::uint64_t> projected;
  if (any_modules) projected = projected_blocks(model.sessions());
  const sched::OffloadParams offload = offload_params();

  for (auto& [id, e] : engines_) {
    const sched::EngineView* view = model.engine(id);
    GpuChange change;
    change.engine = id;
    if (e.has_pool()) {
      const sched::SmDecParams p = sm_params(e);
      // N_pend: the engine's waiting sequences. Partly prefilled requests
      // are running sequences in KV_STATS and are not counted.
      e.n_pend = view != nullptr && view->has_stats ? view->kv.waiting_seqs : 0;
      e.sm_dec = sched::validate(p) ? sched::sm_dec(sm_op_of(e), e.n_pend, p) : e.device_sms;
      const auto index = static_cast<std::uint32_t>(e.chooser->choose(e.sm_dec));
      if (!e.published || index != e.published_index) {
        e.published = true;
        e.published_index = index;
        change.sm = true;
        change.sm_partition = index;
        change.decode_sms = e.decode_sms[index];
        change.sm_dec = e.sm_dec;
        change.n_pend = e.n_pend;
      }
    }
    if (!e.offload.modules().empty()) {
      auto it = projected.find(id);
      e.projected_blocks = it == projected.end() ? 0 : it->second;
      sched::OffloadInput in;
      in.projected_blocks = e.projected_blocks;
      in.blocks_total = view != nullptr && view->has_stats ? view->kv.blocks_total : 0;
      in.block_bytes = e.block_bytes;
      if (e.offload.decide(in, offload)) {
        change.offload = true;
        change.offload_plan = e.offload.plan();
        change.freed_bytes = e.offload.freed_bytes();
        change.pressure = e.offload.pressure();
      }
    }
    if (change.sm || change.offload) out.push_back(change);
  }
}

}  // namespace tandem::daemon
