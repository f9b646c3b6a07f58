// The C ABI of tandem_gpu.h: the engine's green-context pool (a tandem_gpu
// handle over gpu::GreenContextPool) and the GPU-plane records an engine
// handle sends (partitions, stage profiles, weight modules) and reads (the
// status page's partition index and offload plan).
//
// Like api.cc: every function is noexcept and catches everything
// (std::bad_alloc → -ENOMEM, anything else → -EIO); messages name the
// function and the field. Thread-safety: tandem_gpu.h's (one thread per
// handle); the open-failure message is thread-local.
#include <dlfcn.h>

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "gpu/cuda_device.h"
#include "gpu/green_pool.h"
#include "gpu/partition.h"
#include "gpu/sim_device.h"
#include "ipc/channel.h"
#include "ipc/records.h"
#include "libclient/c_abi.h"
#include "libclient/client.h"
#include "libclient/gpu_handle.h"
#include "tandem/tandem_gpu.h"

using tandem::client::Client;
using tandem::client::read_sized;
using tandem::client::Role;
using tandem::client::run_guarded;
using tandem::client::write_sized;
namespace gpu = tandem::gpu;
namespace ipc = tandem::ipc;

static_assert(TANDEM_GPU_MAX_STAGES == gpu::kMaxPoolStages);
static_assert(TANDEM_GPU_MAX_PARTITIONS == gpu::kMaxPoolPartitions);
static_assert(TANDEM_GPU_MAX_PARTITIONS == ipc::kMaxGpuPartitions);
static_assert(static_cast<int>(ipc::GpuStage::kDecode) == TANDEM_GPU_STAGE_DECODE);
static_assert(static_cast<int>(ipc::GpuStage::kPrefill) == TANDEM_GPU_STAGE_PREFILL);

namespace {

constexpr std::size_t kMaxStageName = 63;
constexpr std::size_t kModuleNameMax = sizeof(ipc::WeightModule::name) - 1;  // 23 + NUL

// Why the last tandem_gpu_open on this thread failed (tandem_gpu_last_error(NULL)).
thread_local std::string open_error;

// Runs `f` on a live gpu handle; exceptions become -errno with a message.
template <class H, class F>
int guarded_gpu(H* gpu, const char* function, F&& f) noexcept {
  if (gpu == nullptr) return -EINVAL;
  return run_guarded(
      function, [&](int code, std::string message) { return gpu->fail(code, std::move(message)); },
      [&] { return std::forward<F>(f)(*gpu); });
}

// Runs `f` on a live engine client handle.
template <class F>
int guarded_engine(tandem_client* client, const char* function, F&& f) noexcept {
  if (client == nullptr) return -EINVAL;
  Client& c = *client->impl;
  return run_guarded(
      function, [&](int code, std::string message) { return c.fail(code, std::move(message)); },
      [&] {
        if (c.role() != Role::kEngine) return c.fail(EPERM, fmt::format("{}: not an engine handle", function));
        return std::forward<F>(f)(c);
      });
}

// CUDA device ordinals libtandem accepts (a bound, so ordinal + 1 cannot overflow).
constexpr int kMaxOrdinal = 1023;

// The open options, checked, with the pool's config.
struct OpenPlan {
  std::string backend;  // "auto", "cuda", "sim"
  int ordinal = 0;
  std::uint32_t sim_sms = 132;
  std::vector<std::string> stages;
  std::size_t decode_stage = 0;
  std::vector<int> priorities;
  bool generated = false;
  gpu::TwoStageOptions two_stage;
  std::vector<gpu::PoolPartition> partitions;  // explicit ones
};

// EINVAL with a message naming the field, or the plan.
tandem::base::Result<OpenPlan> check_options(const tandem_gpu_options* options) {
  auto bad = [](std::string what) { return tandem::base::make_error(EINVAL, std::move(what)); };
  tandem_gpu_options o{};
  o.sz = sizeof o;
  // Every field is required (there is no older version of the struct); a
  // newer, longer one is read up to ours.
  if (options != nullptr && !read_sized(options, sizeof o, o)) {
    return bad(fmt::format("options->sz {} is too small (at least {})", options->sz, sizeof o));
  }
  OpenPlan plan;
  std::string_view backend = o.backend != nullptr ? std::string_view(o.backend) : std::string_view("auto");
  if (backend != "auto" && backend != "cuda" && backend != "sim") {
    return bad(fmt::format("options->backend '{}' is not \"auto\", \"cuda\" or \"sim\"", backend));
  }
  plan.backend = backend;
  if (o.ordinal < 0 || o.ordinal > kMaxOrdinal) {
    return bad(fmt::format("options->ordinal {} is not in 0..{}", o.ordinal, kMaxOrdinal));
  }
  plan.ordinal = o.ordinal;
  if (o.sim_sms != 0) plan.sim_sms = o.sim_sms;

  if (o.stages == nullptr) {
    if (o.n_stages != 0) return bad(fmt::format("options->stages is NULL with n_stages {}", o.n_stages));
    plan.stages = {"prefill", "decode"};
  } else {
    if (o.n_stages < gpu::kMinPoolStages || o.n_stages > gpu::kMaxPoolStages) {
      return bad(
          fmt::format("options->n_stages {} is outside {}..{}", o.n_stages, gpu::kMinPoolStages, gpu::kMaxPoolStages));
    }
    for (std::uint32_t s = 0; s < o.n_stages; ++s) {
      const char* name = o.stages[s];
      if (name == nullptr) return bad(fmt::format("options->stages[{}] is NULL", s));
      std::size_t n = ::strnlen(name, kMaxStageName + 1);
      if (n == 0 || n > kMaxStageName) {
        return bad(fmt::format("options->stages[{}] must have 1 to {} characters", s, kMaxStageName));
      }
      for (std::uint32_t t = 0; t < s; ++t) {
        if (plan.stages[t] == name) return bad(fmt::format("options->stages[{}] '{}' repeats stages[{}]", s, name, t));
      }
      plan.stages.emplace_back(name);
    }
  }
  plan.decode_stage = plan.stages.size() - 1;
  for (std::size_t s = 0; s < plan.stages.size(); ++s) {
    if (plan.stages[s] == "decode") plan.decode_stage = s;
  }
  for (std::size_t s = 0; s < plan.stages.size(); ++s) {
    plan.priorities.push_back(o.stage_priorities != nullptr ? o.stage_priorities[s] : s == plan.decode_stage ? -5 : 0);
  }
  if (o.full_device > 1) return bad(fmt::format("options->full_device {} is not 0 or 1", o.full_device));

  if (o.partitions == nullptr) {
    if (o.n_partitions != 0)
      return bad(fmt::format("options->partitions is NULL with n_partitions {}", o.n_partitions));
    if (plan.stages.size() != 2) {
      return bad(fmt::format("options->partitions is NULL (a generated pool) but options->n_stages is {}, not 2",
                             plan.stages.size()));
    }
    plan.generated = true;
    plan.two_stage.decode_min = o.decode_min_sms != 0 ? o.decode_min_sms : 16;
    plan.two_stage.decode_max = o.decode_max_sms != 0 ? o.decode_max_sms : 64;
    plan.two_stage.step = o.decode_step_sms != 0 ? o.decode_step_sms : 8;
    plan.two_stage.full_device = o.full_device != 0;
    if (plan.two_stage.decode_min > plan.two_stage.decode_max) {
      return bad(fmt::format("options->decode_min_sms {} is above options->decode_max_sms {}",
                             plan.two_stage.decode_min, plan.two_stage.decode_max));
    }
    return plan;
  }
  const std::uint32_t explicit_max = gpu::kMaxPoolPartitions - (o.full_device != 0 ? 1 : 0);
  if (o.n_partitions == 0 || o.n_partitions > explicit_max) {
    return bad(fmt::format("options->n_partitions {} is outside 1..{}", o.n_partitions, explicit_max));
  }
  for (std::uint32_t p = 0; p < o.n_partitions; ++p) {
    gpu::PoolPartition partition;
    for (std::uint32_t s = 0; s < TANDEM_GPU_MAX_STAGES; ++s) {
      std::uint32_t sms = o.partitions[p].sms[s];
      if (s < plan.stages.size()) {
        partition.sizes.emplace_back(sms);
      } else if (sms != 0) {
        return bad(fmt::format("options->partitions[{}].sms[{}] is {} but there are only {} stages", p, s, sms,
                               plan.stages.size()));
      }
    }
    plan.partitions.push_back(std::move(partition));
  }
  if (o.full_device != 0) {
    gpu::PoolPartition full;
    full.full_device = true;
    plan.partitions.push_back(std::move(full));
  }
  return plan;
}

// Whether libcuda.so.1 loads at all (a driver is installed).
bool cuda_driver_loads() {
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (lib == nullptr) return false;
  dlclose(lib);
  return true;
}

// The device for `plan.backend`. "auto" takes the simulated device only when
// CUDA is not there at all (not built, no libcuda, no device); a driver that
// is there and fails is an error, never a silent switch to a fake device.
tandem::base::Result<std::unique_ptr<gpu::DeviceApi>> open_device(const OpenPlan& plan) {
  auto sim = [&]() -> tandem::base::Result<std::unique_ptr<gpu::DeviceApi>> {
    gpu::SimDeviceConfig config;
    config.ordinal = plan.ordinal;
    config.device_count = plan.ordinal + 1;
    config.sm_count = plan.sim_sms;
    auto dev = gpu::SimDevice::create(config);
    if (!dev) return tandem::base::propagate(std::move(dev.error()), "options->sim_sms");
    return std::unique_ptr<gpu::DeviceApi>(std::move(*dev));
  };
  if (plan.backend == "sim") return sim();
  auto cuda = gpu::open_cuda_device(plan.ordinal);
  if (cuda) return std::move(*cuda);
  const int code = cuda.error().code();
  // ENOTSUP is absence only when no driver loads (a build without cuda.h
  // on a machine without one); with a driver there, an engine must not be
  // handed fake streams.
  const bool absent = code == ENOENT || code == ENODEV || (code == ENOTSUP && !cuda_driver_loads());
  if (plan.backend == "auto" && absent) return sim();
  return tandem::base::make_error(absent ? ENODEV : code,
                                  fmt::format("CUDA device {}: {}", plan.ordinal, cuda.error().message()));
}

tandem::base::Result<gpu::PoolConfig> pool_config(const OpenPlan& plan, gpu::DeviceApi& device) {
  gpu::PoolConfig config;
  for (std::size_t s = 0; s < plan.stages.size(); ++s) {
    config.stages.push_back(gpu::PoolStage{.name = plan.stages[s], .priority = plan.priorities[s]});
  }
  if (!plan.generated) {
    config.partitions = plan.partitions;
    return config;
  }
  auto sm = device.sm_resource();
  if (!sm) return tandem::base::propagate(std::move(sm.error()));
  auto generated = gpu::two_stage_config(*sm, plan.two_stage);
  if (!generated) return tandem::base::propagate(std::move(generated.error()));
  // two_stage_config's sizes are {prefill: the rest, decode: n}; place them
  // by this pool's decode stage.
  for (gpu::PoolPartition& partition : generated->partitions) {
    if (!partition.full_device && plan.decode_stage == 0) std::swap(partition.sizes[0], partition.sizes[1]);
  }
  config.partitions = std::move(generated->partitions);
  return config;
}

ipc::GpuPartitions partitions_record(const gpu::GreenContextPool& pool) {
  ipc::GpuPartitions r;
  std::vector<std::uint32_t> decode = pool.decode_sms();
  r.count = static_cast<std::uint8_t>(decode.size());
  r.device_sms = static_cast<std::uint16_t>(pool.device_sms());
  for (std::size_t i = 0; i < decode.size(); ++i) r.decode_sms[i] = static_cast<std::uint16_t>(decode[i]);
  return r;
}

int open_gpu(tandem_client* client, const tandem_gpu_options* options, tandem_gpu** ret_gpu) {
  const char* fn = "tandem_gpu_open";
  auto fail = [&](int code, const std::string& message) {
    open_error = fmt::format("{}: {}", fn, message);
    if (client != nullptr) client->impl->fail(code, open_error);
    return -code;
  };
  if (ret_gpu == nullptr) return fail(EINVAL, "ret_gpu is NULL");
  if (client != nullptr) {
    Client& c = *client->impl;
    if (c.role() != Role::kEngine) return fail(EPERM, "client is not an engine handle");
    if (c.has_gpu_partitions()) return fail(EBUSY, "client already has an open tandem_gpu (one pool per engine)");
  }
  auto plan = check_options(options);
  if (!plan) return fail(plan.error().code(), plan.error().context());
  auto device = open_device(*plan);
  if (!device) return fail(device.error().code(), device.error().context());
  auto config = pool_config(*plan, **device);
  if (!config) return fail(config.error().code(), config.error().context());
  auto pool = gpu::GreenContextPool::create(**device, std::move(*config));
  if (!pool) return fail(pool.error().code(), pool.error().context());

  auto handle = std::make_unique<tandem_gpu>();
  handle->device_api = std::move(*device);
  handle->pool = std::move(*pool);
  handle->client = client;
  if (client != nullptr) handle->pool_id = client->impl->set_gpu_partitions(partitions_record(*handle->pool));
  open_error.clear();
  *ret_gpu = handle.release();
  return 0;
}

}  // namespace

int tandem_gpu_open(tandem_client* client, const tandem_gpu_options* options, tandem_gpu** ret_gpu) noexcept {
  try {
    return open_gpu(client, options, ret_gpu);
  } catch (const std::bad_alloc&) {
    return -ENOMEM;
  } catch (...) {
    return -EIO;
  }
}

void tandem_gpu_close(tandem_gpu* gpu) noexcept {
  if (gpu == nullptr) return;
  if (gpu->client != nullptr) gpu->client->impl->clear_gpu_partitions();
  delete gpu;  // the pool (streams, then contexts), then the device
}

const char* tandem_gpu_backend(const tandem_gpu* gpu) noexcept {
  if (gpu == nullptr) return "";
  return gpu->device().backend() == "cuda" ? "cuda" : "sim";
}

const char* tandem_gpu_last_error(const tandem_gpu* gpu) noexcept {
  if (gpu == nullptr) return open_error.c_str();
  return gpu->last_error.c_str();
}

int tandem_gpu_stage(const tandem_gpu* gpu, const char* name, uint32_t* ret_stage) noexcept {
  return guarded_gpu(gpu, "tandem_gpu_stage", [&](const tandem_gpu& g) {
    if (name == nullptr) return g.fail(EINVAL, "tandem_gpu_stage: name is NULL");
    if (ret_stage == nullptr) return g.fail(EINVAL, "tandem_gpu_stage: ret_stage is NULL");
    auto stage = g.pool->stage(name);
    if (!stage) return g.fail(stage.error().code(), fmt::format("tandem_gpu_stage: {}", stage.error().context()));
    *ret_stage = static_cast<uint32_t>(*stage);
    return 0;
  });
}

int tandem_gpu_context(tandem_gpu* gpu, uint32_t stage, void** ret_context) noexcept {
  return guarded_gpu(gpu, "tandem_gpu_context", [&](tandem_gpu& g) {
    if (ret_context == nullptr) return g.fail(EINVAL, "tandem_gpu_context: ret_context is NULL");
    if (stage >= g.pool->stage_count()) {
      return g.fail(EINVAL, fmt::format("tandem_gpu_context: stage {} is out of range (the pool has {} stages)", stage,
                                        g.pool->stage_count()));
    }
    auto native = g.device().native_context(g.pool->context(stage));
    if (!native) {
      return g.fail(native.error().code(), fmt::format("tandem_gpu_context: {}", native.error().context()));
    }
    *ret_context = *native;
    return 0;
  });
}

int tandem_gpu_stream(tandem_gpu* gpu, uint32_t stage, void** ret_stream) noexcept {
  return guarded_gpu(gpu, "tandem_gpu_stream", [&](tandem_gpu& g) {
    if (ret_stream == nullptr) return g.fail(EINVAL, "tandem_gpu_stream: ret_stream is NULL");
    if (stage >= g.pool->stage_count()) {
      return g.fail(EINVAL, fmt::format("tandem_gpu_stream: stage {} is out of range (the pool has {} stages)", stage,
                                        g.pool->stage_count()));
    }
    auto native = g.device().native_stream(g.pool->stream(stage));
    if (!native) return g.fail(native.error().code(), fmt::format("tandem_gpu_stream: {}", native.error().context()));
    *ret_stream = *native;
    return 0;
  });
}

int tandem_gpu_begin_pass(tandem_gpu* gpu, uint32_t* ret_partition) noexcept {
  return guarded_gpu(gpu, "tandem_gpu_begin_pass", [&](tandem_gpu& g) {
    if (g.client != nullptr) {
      // Fail-open: not connected, or the daemon has not chosen for this
      // pool yet (no kStatusSmPartitionSet, or an index chosen for a pool
      // this engine had before) → keep the current partition.
      std::optional<ipc::EngineStatus> status = g.client->impl->engine_status();
      if (status && (status->flags & ipc::kStatusSmPartitionSet) != 0 && status->sm_partition_pool == g.pool_id) {
        if (auto ok = g.pool->begin_pass(status->sm_partition); !ok) {
          return g.fail(ok.error().code(), fmt::format("tandem_gpu_begin_pass: the daemon's {}", ok.error().context()));
        }
      }
    }
    if (ret_partition != nullptr) *ret_partition = static_cast<uint32_t>(g.pool->active());
    return 0;
  });
}

int tandem_gpu_set_partition(tandem_gpu* gpu, uint32_t partition) noexcept {
  return guarded_gpu(gpu, "tandem_gpu_set_partition", [&](tandem_gpu& g) {
    if (auto ok = g.pool->begin_pass(partition); !ok) {
      return g.fail(ok.error().code(), fmt::format("tandem_gpu_set_partition: {}", ok.error().context()));
    }
    return 0;
  });
}

int tandem_gpu_info_get(const tandem_gpu* gpu, tandem_gpu_info* ret_info) noexcept {
  return guarded_gpu(gpu, "tandem_gpu_info_get", [&](const tandem_gpu& g) {
    if (ret_info == nullptr) return g.fail(EINVAL, "tandem_gpu_info_get: ret_info is NULL");
    if (ret_info->sz < sizeof(tandem_gpu_info)) {
      return g.fail(EINVAL, fmt::format("tandem_gpu_info_get: ret_info->sz {} is too small (at least {})", ret_info->sz,
                                        sizeof(tandem_gpu_info)));
    }
    // info() is a const query on the device; the DeviceApi interface is not const.
    auto info = const_cast<tandem_gpu&>(g).device().info();
    if (!info) return g.fail(info.error().code(), fmt::format("tandem_gpu_info_get: {}", info.error().context()));
    tandem_gpu_info out{};
    out.sz = sizeof out;
    std::snprintf(out.device_name, sizeof out.device_name, "%s", info->name.c_str());
    out.ordinal = info->ordinal;
    out.device_sms = g.pool->device_sms();
    out.total_memory = info->total_memory;
    out.n_stages = static_cast<uint32_t>(g.pool->stage_count());
    out.n_partitions = static_cast<uint32_t>(g.pool->partition_count());
    out.active_partition = static_cast<uint32_t>(g.pool->active());
    out.switches = g.pool->counters().switches;
    out.bad_indices = g.pool->counters().bad_indices;
    std::vector<std::uint32_t> decode = g.pool->decode_sms();
    for (std::size_t i = 0; i < decode.size(); ++i) out.decode_sms[i] = decode[i];
    write_sized(ret_info, out);
    return 0;
  });
}

int tandem_gpu_partition_sms(const tandem_gpu* gpu, uint32_t partition, uint32_t stage, uint32_t* ret_sms) noexcept {
  return guarded_gpu(gpu, "tandem_gpu_partition_sms", [&](const tandem_gpu& g) {
    if (ret_sms == nullptr) return g.fail(EINVAL, "tandem_gpu_partition_sms: ret_sms is NULL");
    if (partition >= g.pool->partition_count()) {
      return g.fail(EINVAL, fmt::format("tandem_gpu_partition_sms: partition {} is out of range (the pool has {})",
                                        partition, g.pool->partition_count()));
    }
    if (stage >= g.pool->stage_count()) {
      return g.fail(EINVAL, fmt::format("tandem_gpu_partition_sms: stage {} is out of range (the pool has {})", stage,
                                        g.pool->stage_count()));
    }
    *ret_sms = g.pool->sm_count(partition, stage);
    return 0;
  });
}

// ---- engine records ------------------------------------------------------------

int tandem_gpu_profile(tandem_client* client, int stage, const tandem_profile_row* rows, uint32_t count) noexcept {
  return guarded_engine(client, "tandem_gpu_profile", [&](Client& c) {
    auto bad = [&](const std::string& what) { return c.fail(EINVAL, fmt::format("tandem_gpu_profile: {}", what)); };
    if (stage != TANDEM_GPU_STAGE_DECODE && stage != TANDEM_GPU_STAGE_PREFILL) {
      return bad(fmt::format("stage {} is not TANDEM_GPU_STAGE_DECODE (0) or TANDEM_GPU_STAGE_PREFILL (1)", stage));
    }
    if (rows == nullptr) return bad("rows is NULL");
    if (count == 0 || count > ipc::kMaxProfileRows) {
      return bad(fmt::format("count {} is outside 1..{}", count, ipc::kMaxProfileRows));
    }
    std::vector<ipc::StageProfileRow> out;
    for (std::uint32_t i = 0; i < count; ++i) {
      const tandem_profile_row& r = rows[i];
      if (r.sm_count == 0) return bad(fmt::format("rows[{}].sm_count is 0", i));
      if (r.reserved != 0) return bad(fmt::format("rows[{}].reserved must be 0", i));
      if (i > 0 && r.sm_count <= rows[i - 1].sm_count) {
        return bad(fmt::format("rows[{}].sm_count {} is not above rows[{}].sm_count {}", i, r.sm_count, i - 1,
                               rows[i - 1].sm_count));
      }
      if (!std::isfinite(r.latency_s) || r.latency_s <= 0) {
        return bad(fmt::format("rows[{}].latency_s {} is not finite and > 0", i, r.latency_s));
      }
      if (!std::isfinite(r.throughput) || r.throughput < 0) {
        return bad(fmt::format("rows[{}].throughput {} is not finite and >= 0", i, r.throughput));
      }
      ipc::StageProfileRow row;
      row.sm_count = r.sm_count;
      row.latency_s = r.latency_s;
      row.throughput = r.throughput;
      out.push_back(row);
    }
    c.set_gpu_profile(static_cast<ipc::GpuStage>(stage), std::move(out));
    return 0;
  });
}

int tandem_weight_module(tandem_client* client, const tandem_weight_module_info* module) noexcept {
  return guarded_engine(client, "tandem_weight_module", [&](Client& c) {
    auto bad = [&](const std::string& what) { return c.fail(EINVAL, fmt::format("tandem_weight_module: {}", what)); };
    if (module == nullptr) return bad("module is NULL");
    tandem_weight_module_info m{};
    if (!read_sized(module, sizeof m, m)) return bad("module->sz is too small");
    if (m.index >= ipc::kMaxWeightModules) {
      return bad(fmt::format("module->index {} is not below {}", m.index, ipc::kMaxWeightModules));
    }
    if (m.layers < 3 || m.layers > UINT16_MAX)
      return bad(fmt::format("module->layers {} is outside 3..65535", m.layers));
    const std::uint32_t max_slots = std::min<std::uint32_t>(m.layers - 1, UINT8_MAX);
    if (m.slots < 2 || m.slots > max_slots) {
      return bad(fmt::format("module->slots {} is outside 2..{} (fewer than layers, at most 255)", m.slots, max_slots));
    }
    if (m.layer_compute_us == 0) return bad("module->layer_compute_us is 0");
    if (m.bytes == 0) return bad("module->bytes is 0");
    if (m.name == nullptr) return bad("module->name is NULL");
    const std::size_t n = ::strnlen(m.name, kModuleNameMax + 1);
    if (n == 0 || n > kModuleNameMax) {
      return bad(fmt::format("module->name must have 1 to {} characters", kModuleNameMax));
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (m.name[i] < 0x20 || m.name[i] > 0x7e) {
        return bad(fmt::format("module->name has a non-printable byte 0x{:02x} at {}",
                               static_cast<unsigned char>(m.name[i]), i));
      }
    }
    ipc::WeightModule r;
    r.index = static_cast<std::uint8_t>(m.index);
    r.slots = static_cast<std::uint8_t>(m.slots);
    r.layers = static_cast<std::uint16_t>(m.layers);
    r.layer_compute_us = m.layer_compute_us;
    r.bytes = m.bytes;
    std::memcpy(r.name, m.name, n);
    c.set_weight_module(r);
    return 0;
  });
}

int tandem_offload_plan(tandem_client* client, uint64_t* ret_plan, uint64_t* ret_freed_bytes) noexcept {
  return guarded_engine(client, "tandem_offload_plan", [&](Client& c) {
    std::optional<ipc::EngineStatus> status = c.engine_status();
    if (ret_plan != nullptr) *ret_plan = status ? status->offload_plan : 0;
    if (ret_freed_bytes != nullptr) *ret_freed_bytes = status ? status->offload_freed_bytes : 0;
    return 0;
  });
}
