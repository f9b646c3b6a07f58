// NVML telemetry ([gpu_and_ipc] A.5, docs/nvml.md): the NVIDIA
// Management Library loaded with dlopen (never linked, so tandem builds and
// runs without a driver), and a sampler that reads every device's slow-loop
// state: name, UUID, utilisation, memory, clocks, power, temperature and the
// memory of each process using it.
//
// nvml.h is not installed with the CUDA toolkit's headers here, so gpu/nvml.cc
// declares the few prototypes, structs and enum values it uses itself, copied
// from NVIDIA's nvml.h (github.com/NVIDIA/go-nvml gen/nvml/nvml.h, NVML API
// 13) and checked there with static_asserts on their sizes.
//
// Errors name the NVML call and NVML's own error string:
// "nvmlDeviceGetPowerUsage: Not Supported (NVML error 3)", with an errno from
// nvml_errno(). A library that is not there is ENOENT, "libnvidia-ml.so.1:
// not found — no NVIDIA driver (…dlerror…)"; one that lacks a required entry
// point is ENOSYS naming it.
//
// Thread-safety: NvmlLibrary's calls may come from any thread (NVML is
// thread-safe); an NvmlSampler is used by one thread at a time; the sample
// types are values.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/result.h"

namespace tandem::gpu {

// The driver's NVML, as the dynamic loader finds it.
inline constexpr std::string_view kNvmlLibrary = "libnvidia-ml.so.1";

// nvmlReturn_t values tandem acts on (nvml.h).
inline constexpr int kNvmlSuccess = 0;
inline constexpr int kNvmlErrorNotSupported = 3;
inline constexpr int kNvmlErrorInsufficientSize = 7;
inline constexpr int kNvmlErrorArgumentVersionMismatch = 25;

// NVML's constant name for a return code ("NVML_ERROR_NOT_SUPPORTED"), or
// "NVML_ERROR_<n>" for one this file does not know.
std::string nvml_result_name(int result);
// The errno an NVML return code maps to (ENOTSUP, EACCES, ENODEV, …; EIO for
// anything unnamed; 0 for success).
int nvml_errno(int result);

// One process on a device (nvmlProcessInfo_t). `used_bytes` is unset where
// NVML reports NVML_VALUE_NOT_AVAILABLE.
struct NvmlProcess {
  pid_t pid = 0;
  std::optional<std::uint64_t> used_bytes;
  friend bool operator==(const NvmlProcess&, const NvmlProcess&) = default;
};

// One device at one moment. A field NVML could not give is unset, and
// `errors` says why, keyed by the field's name ("utilization", "memory",
// "sm_clock", "memory_clock", "power", "temperature", "processes").
// Thread-safety: a value type.
struct NvmlDeviceSample {
  std::uint32_t index = 0;
  std::string name;                                         // "NVIDIA H100 80GB HBM3"
  std::string uuid;                                         // "GPU-…"
  std::optional<std::uint32_t> utilization_gpu_percent;     // time ≥1 kernel ran, last sample period
  std::optional<std::uint32_t> utilization_memory_percent;  // time device memory was read or written
  std::optional<std::uint64_t> memory_total_bytes;
  std::optional<std::uint64_t> memory_used_bytes;  // v2: allocated; v1: allocated + reserved
  std::optional<std::uint64_t> memory_free_bytes;
  std::optional<std::uint64_t> memory_reserved_bytes;  // v2 only (nvmlDeviceGetMemoryInfo_v2)
  std::optional<std::uint32_t> sm_clock_mhz;
  std::optional<std::uint32_t> memory_clock_mhz;
  std::optional<std::uint32_t> power_mw;
  std::optional<std::uint32_t> temperature_c;
  std::optional<std::vector<NvmlProcess>> processes;        // compute processes, ascending pid
  std::vector<std::pair<std::string, std::string>> errors;  // (field, why)

  // The error recorded for `field`, or "" if it was read.
  std::string_view error(std::string_view field) const;
};

// Every device at one moment. Thread-safety: a value type.
struct NvmlSample {
  base::Time time{};  // CLOCK_MONOTONIC when the sample was taken
  std::vector<NvmlDeviceSample> devices;
};

// The loaded library: nvmlInit_v2 at open, nvmlShutdown and dlclose at
// destruction. Thread-safety: see the file comment.
class NvmlLibrary {
 public:
  // dlopen(path, RTLD_NOW | RTLD_LOCAL), the entry points resolved, then
  // nvmlInit_v2. ENOENT when the library is not there; ELIBBAD when it is
  // there but cannot be loaded; ENOSYS when a required entry point is
  // missing (nvmlInit_v2, nvmlShutdown, nvmlErrorString,
  // nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2); nvmlInit_v2's own
  // error otherwise (NVML_ERROR_DRIVER_NOT_LOADED is ENODEV).
  static base::Result<std::unique_ptr<NvmlLibrary>> open(const std::string& path = std::string(kNvmlLibrary));
  ~NvmlLibrary();
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  const std::string& path() const { return path_; }
  // nvmlErrorString(result), or the constant's name if NVML gives none.
  std::string error_string(int result) const;

  // nvmlDeviceGetCount_v2.
  base::Result<std::uint32_t> device_count() const;
  // Reads device `index` (nvmlDeviceGetHandleByIndex_v2, then one call per
  // field). Fails only when the handle cannot be had; a field that fails is
  // recorded in the sample's errors and the others are still read.
  base::Result<NvmlDeviceSample> sample_device(std::uint32_t index) const;

  // Whether optional entry points are there (for docs and tests).
  bool has_memory_v2() const;
  bool has_processes_v3() const;

  struct Api;  // the resolved entry points (gpu/nvml.cc)

 private:
  NvmlLibrary() = default;
  // "<call>: <nvmlErrorString> (NVML error <n>)" with nvml_errno(result).
  base::Error error(std::string_view call, int result) const;
  std::string describe(std::string_view call, int result) const;
  void read_processes(void* device, NvmlDeviceSample& out) const;

  std::string path_;
  void* handle_ = nullptr;  // from dlopen
  std::unique_ptr<Api> api_;
  bool initialized_ = false;
};

// Samples every device NVML sees. Thread-safety: one thread at a time.
class NvmlSampler {
 public:
  // Attempts to grow the process list when new processes keep appearing
  // between NVML's "how many" and "fill these" (NVML_ERROR_INSUFFICIENT_SIZE).
  static constexpr int kProcessTries = 5;

  // NvmlLibrary::open(path), then the device count.
  static base::Result<std::unique_ptr<NvmlSampler>> open(const std::string& path = std::string(kNvmlLibrary),
                                                         const base::Clock* clock = nullptr);
  const NvmlLibrary& library() const { return *lib_; }
  std::uint32_t device_count() const { return count_; }

  // One sample of every device, dated with the clock (CLOCK_MONOTONIC unless
  // one was given). Fails only when the device count cannot be read; a
  // device whose handle cannot be had is in the sample with only `index` and
  // an error under "device".
  base::Result<NvmlSample> sample();

 private:
  NvmlSampler(std::unique_ptr<NvmlLibrary> lib, std::uint32_t count, const base::Clock* clock)
      : lib_(std::move(lib)), count_(count), clock_(clock) {}
  std::unique_ptr<NvmlLibrary> lib_;
  std::uint32_t count_ = 0;
  const base::Clock* clock_ = nullptr;
  base::MonotonicClock monotonic_;
};

}  // namespace tandem::gpu
