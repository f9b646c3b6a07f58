// NVML through dlopen (gpu/nvml.h). The declarations below are NVIDIA's, from
// nvml.h of NVML API 13 (github.com/NVIDIA/go-nvml, gen/nvml/nvml.h): the
// structs keep their field order and types exactly, the static_asserts pin
// their sizes on LP64, and only the versioned entry points tandem calls are
// resolved. Thread-safety: see gpu/nvml.h.
#include "gpu/nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <type_traits>

#include <fmt/format.h>

namespace tandem::gpu {
namespace {

// ---- from nvml.h ------------------------------------------------------------

// nvml.h's names, in tandem's spelling (the layouts are what matter):
// NvmlReturn is nvmlReturn_t, NvmlDevice nvmlDevice_t, NvmlUtilization
// nvmlUtilization_t, NvmlMemoryV1 nvmlMemory_t, NvmlMemoryV2 nvmlMemory_v2_t,
// NvmlProcessInfo nvmlProcessInfo_t (= nvmlProcessInfo_v2_t; its
// usedGpuMemory, gpuInstanceId, computeInstanceId in snake case).
using NvmlReturn = int;  // enum nvmlReturn_enum
struct NvmlDeviceSt;
using NvmlDevice = NvmlDeviceSt*;

struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};

struct NvmlMemoryV1 {  // v1: used includes reserved
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

struct NvmlMemoryV2 {
  unsigned int version;  // nvmlMemory_v2
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};

struct NvmlProcessInfo {  // nvmlProcessInfo_v2_t, what the _v3 query fills
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

static_assert(sizeof(NvmlUtilization) == 8);
static_assert(sizeof(NvmlMemoryV1) == 24);
static_assert(sizeof(NvmlMemoryV2) == 40);
static_assert(sizeof(NvmlProcessInfo) == 24);

// NVML_STRUCT_VERSION(Memory, 2): the struct's size with the version in the top byte.
constexpr unsigned int kMemoryV2Version = static_cast<unsigned int>(sizeof(NvmlMemoryV2)) | (2u << 24);
static_assert(kMemoryV2Version == 0x02000028);

constexpr int kClockSm = 1;           // NVML_CLOCK_SM
constexpr int kClockMem = 2;          // NVML_CLOCK_MEM
constexpr int kTemperatureGpu = 0;    // NVML_TEMPERATURE_GPU
constexpr unsigned kNameBuffer = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kUuidBuffer = 96;  // NVML_DEVICE_UUID_V2_BUFFER_SIZE
constexpr unsigned long long kValueNotAvailable = static_cast<unsigned long long>(-1);  // NVML_VALUE_NOT_AVAILABLE

// NvmlReturn names, by value (nvml.h).
constexpr std::pair<int, std::string_view> kResultNames[] = {
    {0, "NVML_SUCCESS"},
    {1, "NVML_ERROR_UNINITIALIZED"},
    {2, "NVML_ERROR_INVALID_ARGUMENT"},
    {3, "NVML_ERROR_NOT_SUPPORTED"},
    {4, "NVML_ERROR_NO_PERMISSION"},
    {5, "NVML_ERROR_ALREADY_INITIALIZED"},
    {6, "NVML_ERROR_NOT_FOUND"},
    {7, "NVML_ERROR_INSUFFICIENT_SIZE"},
    {8, "NVML_ERROR_INSUFFICIENT_POWER"},
    {9, "NVML_ERROR_DRIVER_NOT_LOADED"},
    {10, "NVML_ERROR_TIMEOUT"},
    {11, "NVML_ERROR_IRQ_ISSUE"},
    {12, "NVML_ERROR_LIBRARY_NOT_FOUND"},
    {13, "NVML_ERROR_FUNCTION_NOT_FOUND"},
    {14, "NVML_ERROR_CORRUPTED_INFOROM"},
    {15, "NVML_ERROR_GPU_IS_LOST"},
    {16, "NVML_ERROR_RESET_REQUIRED"},
    {17, "NVML_ERROR_OPERATING_SYSTEM"},
    {18, "NVML_ERROR_LIB_RM_VERSION_MISMATCH"},
    {19, "NVML_ERROR_IN_USE"},
    {20, "NVML_ERROR_MEMORY"},
    {21, "NVML_ERROR_NO_DATA"},
    {22, "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED"},
    {23, "NVML_ERROR_INSUFFICIENT_RESOURCES"},
    {24, "NVML_ERROR_FREQ_NOT_SUPPORTED"},
    {25, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH"},
    {26, "NVML_ERROR_DEPRECATED"},
    {27, "NVML_ERROR_NOT_READY"},
    {28, "NVML_ERROR_GPU_NOT_FOUND"},
    {29, "NVML_ERROR_INVALID_STATE"},
    {30, "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED"},
    {999, "NVML_ERROR_UNKNOWN"},
};

template <class Fn>
Fn symbol(void* handle, const char* name) {
  // dlsym's contract: an object pointer that is really a function's address.
  return reinterpret_cast<Fn>(dlsym(handle, name));  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
}

// A C string buffer NVML filled, up to its NUL.
std::string from_buffer(const char* buf, std::size_t size) { return std::string(buf, strnlen(buf, size)); }

}  // namespace

// The entry points, resolved at open. Required ones are never null.
struct NvmlLibrary::Api {
  NvmlReturn (*init_v2)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*device_get_count_v2)(unsigned int*) = nullptr;
  NvmlReturn (*device_get_handle_by_index_v2)(unsigned int, NvmlDevice*) = nullptr;
  // Optional: a missing one costs its field.
  NvmlReturn (*device_get_name)(NvmlDevice, char*, unsigned int) = nullptr;
  NvmlReturn (*device_get_uuid)(NvmlDevice, char*, unsigned int) = nullptr;
  NvmlReturn (*device_get_utilization_rates)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*device_get_memory_info_v2)(NvmlDevice, NvmlMemoryV2*) = nullptr;
  NvmlReturn (*device_get_memory_info)(NvmlDevice, NvmlMemoryV1*) = nullptr;
  NvmlReturn (*device_get_clock_info)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*device_get_compute_running_processes_v3)(NvmlDevice, unsigned int*, NvmlProcessInfo*) = nullptr;
  NvmlReturn (*device_get_power_usage)(NvmlDevice, unsigned int*) = nullptr;
  NvmlReturn (*device_get_temperature)(NvmlDevice, int, unsigned int*) = nullptr;
};

std::string nvml_result_name(int result) {
  for (const auto& [value, name] : kResultNames) {
    if (value == result) return std::string(name);
  }
  return fmt::format("NVML_ERROR_{}", result);
}

int nvml_errno(int result) {
  switch (result) {
    case 0:
      return 0;
    case 2:   // INVALID_ARGUMENT
    case 25:  // ARGUMENT_VERSION_MISMATCH
      return EINVAL;
    case 3:   // NOT_SUPPORTED
    case 26:  // DEPRECATED
      return ENOTSUP;
    case 4:   // NO_PERMISSION
    case 17:  // OPERATING_SYSTEM (blocked by cgroups)
      return EACCES;
    case 6:   // NOT_FOUND
    case 12:  // LIBRARY_NOT_FOUND
      return ENOENT;
    case 7:  // INSUFFICIENT_SIZE
      return ENOSPC;
    case 9:   // DRIVER_NOT_LOADED
    case 15:  // GPU_IS_LOST
    case 28:  // GPU_NOT_FOUND
      return ENODEV;
    case 10:  // TIMEOUT
      return ETIMEDOUT;
    case 13:  // FUNCTION_NOT_FOUND
      return ENOSYS;
    case 18:  // LIB_RM_VERSION_MISMATCH
      return ELIBBAD;
    case 19:  // IN_USE
    case 27:  // NOT_READY
      return EBUSY;
    case 20:  // MEMORY
      return ENOMEM;
    case 21:  // NO_DATA
      return ENODATA;
    default:
      return EIO;
  }
}

std::string_view NvmlDeviceSample::error(std::string_view field) const {
  for (const auto& [f, why] : errors) {
    if (f == field) return why;
  }
  return {};
}

// ---- NvmlLibrary -------------------------------------------------------------

base::Result<std::unique_ptr<NvmlLibrary>> NvmlLibrary::open(const std::string& path) {
  std::unique_ptr<NvmlLibrary> lib(new NvmlLibrary());
  lib->path_ = path;
  lib->api_ = std::make_unique<Api>();
  // RTLD_LOCAL: NVML's symbols stay out of the global namespace.
  lib->handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib->handle_ == nullptr) {
    const char* why = dlerror();
    const std::string text = why != nullptr ? why : "unknown error";
    // dlerror says "cannot open shared object file: No such file or
    // directory" for a library that is not there, and more for one that is
    // there and broken (wrong ELF class, a missing dependency of its own).
    if (text.find("No such file or directory") != std::string::npos) {
      return base::make_error(ENOENT, fmt::format("{}: not found — no NVIDIA driver (dlopen: {})", path, text));
    }
    return base::make_error(ELIBBAD, fmt::format("{}: cannot be loaded (dlopen: {})", path, text));
  }
  Api& a = *lib->api_;
  void* h = lib->handle_;
  std::string missing;
  auto need = [&](auto& fn, const char* name) {
    fn = symbol<std::remove_reference_t<decltype(fn)>>(h, name);
    if (fn == nullptr) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", name);
  };
  need(a.init_v2, "nvmlInit_v2");
  need(a.shutdown, "nvmlShutdown");
  need(a.error_string, "nvmlErrorString");
  need(a.device_get_count_v2, "nvmlDeviceGetCount_v2");
  need(a.device_get_handle_by_index_v2, "nvmlDeviceGetHandleByIndex_v2");
  if (!missing.empty()) {
    return base::make_error(
        ENOSYS, fmt::format("{}: missing {} (a driver older than NVML's v2 API, or not NVML)", path, missing));
  }
  a.device_get_name = symbol<decltype(a.device_get_name)>(h, "nvmlDeviceGetName");
  a.device_get_uuid = symbol<decltype(a.device_get_uuid)>(h, "nvmlDeviceGetUUID");
  a.device_get_utilization_rates = symbol<decltype(a.device_get_utilization_rates)>(h, "nvmlDeviceGetUtilizationRates");
  a.device_get_memory_info_v2 = symbol<decltype(a.device_get_memory_info_v2)>(h, "nvmlDeviceGetMemoryInfo_v2");
  a.device_get_memory_info = symbol<decltype(a.device_get_memory_info)>(h, "nvmlDeviceGetMemoryInfo");
  a.device_get_clock_info = symbol<decltype(a.device_get_clock_info)>(h, "nvmlDeviceGetClockInfo");
  a.device_get_compute_running_processes_v3 =
      symbol<decltype(a.device_get_compute_running_processes_v3)>(h, "nvmlDeviceGetComputeRunningProcesses_v3");
  a.device_get_power_usage = symbol<decltype(a.device_get_power_usage)>(h, "nvmlDeviceGetPowerUsage");
  // Deprecated in NVML 13 in favour of nvmlDeviceGetTemperatureV, still exported.
  a.device_get_temperature = symbol<decltype(a.device_get_temperature)>(h, "nvmlDeviceGetTemperature");

  if (const NvmlReturn r = a.init_v2(); r != kNvmlSuccess) {
    return base::propagate(lib->error("nvmlInit_v2", r), path);
  }
  lib->initialized_ = true;
  return lib;
}

NvmlLibrary::~NvmlLibrary() {
  if (initialized_) (void)api_->shutdown();
  // NVML is reference counted: shutdown undoes our init only.
  if (handle_ != nullptr) dlclose(handle_);
}

bool NvmlLibrary::has_memory_v2() const { return api_->device_get_memory_info_v2 != nullptr; }
bool NvmlLibrary::has_processes_v3() const { return api_->device_get_compute_running_processes_v3 != nullptr; }

std::string NvmlLibrary::error_string(int result) const {
  const char* s = api_->error_string != nullptr ? api_->error_string(result) : nullptr;
  return s != nullptr && *s != '\0' ? std::string(s) : nvml_result_name(result);
}

std::string NvmlLibrary::describe(std::string_view call, int result) const {
  return fmt::format("{}: {} (NVML error {})", call, error_string(result), result);
}

base::Error NvmlLibrary::error(std::string_view call, int result) const {
  return base::Error(nvml_errno(result) != 0 ? nvml_errno(result) : EIO, describe(call, result));
}

base::Result<std::uint32_t> NvmlLibrary::device_count() const {
  unsigned int n = 0;
  if (const NvmlReturn r = api_->device_get_count_v2(&n); r != kNvmlSuccess) {
    return std::unexpected(error("nvmlDeviceGetCount_v2", r));
  }
  return n;
}

base::Result<NvmlDeviceSample> NvmlLibrary::sample_device(std::uint32_t index) const {
  const Api& a = *api_;
  NvmlDevice dev = nullptr;
  if (const NvmlReturn r = a.device_get_handle_by_index_v2(index, &dev); r != kNvmlSuccess) {
    return std::unexpected(error(fmt::format("nvmlDeviceGetHandleByIndex_v2({})", index), r));
  }
  NvmlDeviceSample s;
  s.index = index;
  auto failed = [&](std::string_view field, std::string_view call, NvmlReturn r) {
    s.errors.emplace_back(std::string(field), describe(call, r));
  };
  auto absent = [&](std::string_view field, std::string_view call) {
    s.errors.emplace_back(std::string(field), fmt::format("{}: not exported by {}", call, path_));
  };

  if (a.device_get_name != nullptr) {
    char buf[kNameBuffer] = {};
    if (const NvmlReturn r = a.device_get_name(dev, buf, sizeof buf); r == kNvmlSuccess) {
      s.name = from_buffer(buf, sizeof buf);
    } else {
      failed("name", "nvmlDeviceGetName", r);
    }
  } else {
    absent("name", "nvmlDeviceGetName");
  }
  if (a.device_get_uuid != nullptr) {
    char buf[kUuidBuffer] = {};
    if (const NvmlReturn r = a.device_get_uuid(dev, buf, sizeof buf); r == kNvmlSuccess) {
      s.uuid = from_buffer(buf, sizeof buf);
    } else {
      failed("uuid", "nvmlDeviceGetUUID", r);
    }
  } else {
    absent("uuid", "nvmlDeviceGetUUID");
  }

  if (a.device_get_utilization_rates != nullptr) {
    NvmlUtilization u{};
    if (const NvmlReturn r = a.device_get_utilization_rates(dev, &u); r == kNvmlSuccess) {
      s.utilization_gpu_percent = u.gpu;
      s.utilization_memory_percent = u.memory;
    } else {
      failed("utilization", "nvmlDeviceGetUtilizationRates", r);
    }
  } else {
    absent("utilization", "nvmlDeviceGetUtilizationRates");
  }

  // v2 separates the driver's reserved memory out of `used`; v1 (drivers
  // before R510) counts it in.
  // A driver that exports v2 but refuses it (some vGPU and older drivers:
  // NOT_SUPPORTED, ARGUMENT_VERSION_MISMATCH) still answers v1.
  bool memory_v2 = false;
  NvmlReturn memory_v2_failure = kNvmlSuccess;
  if (a.device_get_memory_info_v2 != nullptr) {
    NvmlMemoryV2 m{};
    m.version = kMemoryV2Version;
    if (const NvmlReturn r = a.device_get_memory_info_v2(dev, &m); r == kNvmlSuccess) {
      s.memory_total_bytes = m.total;
      s.memory_reserved_bytes = m.reserved;
      s.memory_free_bytes = m.free;
      s.memory_used_bytes = m.used;
      memory_v2 = true;
    } else {
      memory_v2_failure = r;
    }
  }
  if (memory_v2) {
    // done
  } else if (memory_v2_failure != kNvmlSuccess && a.device_get_memory_info == nullptr) {
    failed("memory", "nvmlDeviceGetMemoryInfo_v2", memory_v2_failure);
  } else if (a.device_get_memory_info != nullptr) {
    NvmlMemoryV1 m{};
    if (const NvmlReturn r = a.device_get_memory_info(dev, &m); r == kNvmlSuccess) {
      s.memory_total_bytes = m.total;
      s.memory_free_bytes = m.free;
      s.memory_used_bytes = m.used;
    } else {
      failed("memory", "nvmlDeviceGetMemoryInfo", r);
    }
  } else {
    absent("memory", "nvmlDeviceGetMemoryInfo_v2 and nvmlDeviceGetMemoryInfo");
  }

  if (a.device_get_clock_info != nullptr) {
    unsigned int mhz = 0;
    if (const NvmlReturn r = a.device_get_clock_info(dev, kClockSm, &mhz); r == kNvmlSuccess) {
      s.sm_clock_mhz = mhz;
    } else {
      failed("sm_clock", "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)", r);
    }
    if (const NvmlReturn r = a.device_get_clock_info(dev, kClockMem, &mhz); r == kNvmlSuccess) {
      s.memory_clock_mhz = mhz;
    } else {
      failed("memory_clock", "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)", r);
    }
  } else {
    absent("sm_clock", "nvmlDeviceGetClockInfo");
    absent("memory_clock", "nvmlDeviceGetClockInfo");
  }

  if (a.device_get_power_usage != nullptr) {
    unsigned int mw = 0;
    if (const NvmlReturn r = a.device_get_power_usage(dev, &mw); r == kNvmlSuccess) {
      s.power_mw = mw;
    } else {
      failed("power", "nvmlDeviceGetPowerUsage", r);
    }
  } else {
    absent("power", "nvmlDeviceGetPowerUsage");
  }
  if (a.device_get_temperature != nullptr) {
    unsigned int c = 0;
    if (const NvmlReturn r = a.device_get_temperature(dev, kTemperatureGpu, &c); r == kNvmlSuccess) {
      s.temperature_c = c;
    } else {
      failed("temperature", "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)", r);
    }
  } else {
    absent("temperature", "nvmlDeviceGetTemperature");
  }

  read_processes(dev, s);
  return s;
}

void NvmlLibrary::read_processes(void* device, NvmlDeviceSample& s) const {
  static constexpr std::string_view kCall = "nvmlDeviceGetComputeRunningProcesses_v3";
  const auto query = api_->device_get_compute_running_processes_v3;
  if (query == nullptr) {
    s.errors.emplace_back("processes", fmt::format("{}: not exported by {}", kCall, path_));
    return;
  }
  auto* dev = static_cast<NvmlDevice>(device);
  // Count 0 first to size the list; processes that start between that and
  // the next call make NVML answer INSUFFICIENT_SIZE again with the new
  // count, so grow and ask again, a few times.
  std::vector<NvmlProcessInfo> infos;
  unsigned int count = 0;
  NvmlReturn r = query(dev, &count, nullptr);
  for (int tries = 0; r == kNvmlErrorInsufficientSize && tries < NvmlSampler::kProcessTries; ++tries) {
    infos.assign(count, NvmlProcessInfo{});
    r = query(dev, &count, infos.data());
  }
  if (r != kNvmlSuccess) {
    std::string why = describe(kCall, r);
    if (r == kNvmlErrorInsufficientSize) {
      why += fmt::format(", the list still growing after {} tries", NvmlSampler::kProcessTries);
    }
    s.errors.emplace_back("processes", std::move(why));
    return;
  }
  std::vector<NvmlProcess> list;
  const std::size_t n = std::min<std::size_t>(count, infos.size());
  list.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    NvmlProcess p;
    p.pid = static_cast<pid_t>(infos[i].pid);
    if (infos[i].used_gpu_memory != kValueNotAvailable) p.used_bytes = infos[i].used_gpu_memory;
    list.push_back(p);
  }
  std::sort(list.begin(), list.end(), [](const NvmlProcess& x, const NvmlProcess& y) { return x.pid < y.pid; });
  s.processes = std::move(list);
}

// ---- NvmlSampler -------------------------------------------------------------

base::Result<std::unique_ptr<NvmlSampler>> NvmlSampler::open(const std::string& path, const base::Clock* clock) {
  auto lib = NvmlLibrary::open(path);
  if (!lib) return base::propagate(std::move(lib.error()));
  auto count = (*lib)->device_count();
  if (!count) return base::propagate(std::move(count.error()), path);
  return std::unique_ptr<NvmlSampler>(new NvmlSampler(std::move(*lib), *count, clock));
}

base::Result<NvmlSample> NvmlSampler::sample() {
  auto count = lib_->device_count();
  if (!count) return base::propagate(std::move(count.error()));
  count_ = *count;
  NvmlSample out;
  out.time = clock_ != nullptr ? clock_->now() : monotonic_.now();
  out.devices.reserve(count_);
  for (std::uint32_t i = 0; i < count_; ++i) {
    auto d = lib_->sample_device(i);
    if (d) {
      out.devices.push_back(std::move(*d));
    } else {
      NvmlDeviceSample lost;
      lost.index = i;
      lost.errors.emplace_back("device", d.error().context());
      out.devices.push_back(std::move(lost));
    }
  }
  return out;
}

}  // namespace tandem::gpu
