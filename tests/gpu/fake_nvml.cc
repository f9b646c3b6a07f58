// A fake libnvidia-ml for tests: the NVML entry points tandem calls, with the
// values a test writes to a state file. gpu/nvml.cc loads it by path with
// dlopen exactly as it loads the driver's, so the real loading, symbol and
// struct-version paths run.
//
// The state file is named by $FAKE_NVML_STATE and re-read at every call, so
// a test (or a daemon under test) sees a change at its next sample. Lines are
// "key = value"; '#' starts a comment. Without the variable or the file there
// are no devices.
//
//   init = 9                        nvmlInit_v2's return (default 0)
//   count = 2                       devices (default 0); count_error = 15 fails the query
//   gpuN.handle_error = 15          nvmlDeviceGetHandleByIndex_v2(N) fails so
//   gpuN.name = NVIDIA H100 80GB HBM3
//   gpuN.uuid = GPU-…
//   gpuN.utilization = 37,12        gpu %, memory %
//   gpuN.memory = total,reserved,free,used   (bytes; v1 reports used + reserved)
//   gpuN.clocks = 1980,2619         SM MHz, memory MHz
//   gpuN.power_mw = 312000
//   gpuN.temperature_c = 54
//   gpuN.processes = 1234:1073741824,5678:-  pid:bytes ('-': NVML_VALUE_NOT_AVAILABLE)
//   gpuN.processes_race = 2         each query with a list adds one process
//                                   (pid 90000+k, 1 MiB), up to this many: the
//                                   list grows between "how many" and "fill"
//   gpuN.fail = power:3,sm_clock:3  field:nvmlReturn_t (name, uuid, utilization,
//                                   memory, sm_clock, memory_clock, power,
//                                   temperature, processes)
//
// Like the real nvmlDeviceGetMemoryInfo_v2 it checks the struct's version
// (sizeof | 2 << 24 = 0x02000028) and answers
// NVML_ERROR_ARGUMENT_VERSION_MISMATCH (25) to any other. The structs here
// are written from nvml.h independently of gpu/nvml.cc's.
//
// Built three ways (tests/gpu/CMakeLists.txt): the full library; FAKE_NVML_OLD,
// a pre-R510 driver without nvmlDeviceGetMemoryInfo_v2, _v3 processes, power
// and temperature; and FAKE_NVML_NO_COUNT, without nvmlDeviceGetCount_v2.
//
// Test hooks (not NVML): fake_nvml_calls(name) counts calls of an entry
// point since the library was loaded (it may outlive a dlclose: compare
// counts before and after), fake_nvml_init_refs() is nvmlInit_v2 minus
// nvmlShutdown.
//
// Thread-safety: one mutex around everything.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

// The structs of the exported signatures (named, so the extern "C" functions
// do not use internal-linkage types).
namespace fake_nvml {
struct Utilization {
  unsigned int gpu;
  unsigned int memory;
};
struct MemoryV1 {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct MemoryV2 {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
struct ProcessInfo {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
}  // namespace fake_nvml

namespace {

using fake_nvml::MemoryV1;
using fake_nvml::MemoryV2;
using fake_nvml::ProcessInfo;
using fake_nvml::Utilization;

constexpr unsigned int kMemoryV2Version = 0x02000028;
static_assert((sizeof(MemoryV2) | (2u << 24)) == kMemoryV2Version);

constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;
constexpr int kUninitialized = 1;
constexpr int kInsufficientSize = 7;
[[maybe_unused]] constexpr int kArgumentVersionMismatch = 25;  // not in FAKE_NVML_OLD

std::mutex g_mu;
std::map<std::string, std::uint64_t> g_calls;
int g_init_refs = 0;
std::map<int, int> g_race_calls;  // per device: process queries that passed a list

using State = std::map<std::string, std::string>;

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

State read_state() {
  State st;
  const char* path = std::getenv("FAKE_NVML_STATE");
  if (path == nullptr) return st;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    st[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return st;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, sep);) out.push_back(trim(part));
  return out;
}

unsigned long long num(const State& st, const std::string& key, unsigned long long dflt = 0) {
  auto it = st.find(key);
  return it == st.end() || it->second.empty() ? dflt : std::strtoull(it->second.c_str(), nullptr, 10);
}

std::vector<unsigned long long> nums(const State& st, const std::string& key) {
  std::vector<unsigned long long> out;
  auto it = st.find(key);
  if (it == st.end()) return out;
  for (const auto& p : split(it->second, ',')) out.push_back(std::strtoull(p.c_str(), nullptr, 10));
  return out;
}

// Device i's handle is &g_handles[i] (never dereferenced by callers).
constexpr int kMaxDevices = 64;
char g_handles[kMaxDevices];

int device_index(const void* dev) {
  const char* p = static_cast<const char*>(dev);
  if (p < g_handles || p >= g_handles + kMaxDevices) return -1;
  return static_cast<int>(p - g_handles);
}

std::string gpu_key(const void* dev, const char* field) {
  return "gpu" + std::to_string(device_index(dev)) + "." + field;
}

// The configured failure of `field` on `dev`, or 0.
int failure(const State& st, const void* dev, const char* field) {
  auto it = st.find(gpu_key(dev, "fail"));
  if (it == st.end()) return 0;
  for (const auto& item : split(it->second, ',')) {
    const auto colon = item.find(':');
    if (colon != std::string::npos && item.substr(0, colon) == field) return std::atoi(item.c_str() + colon + 1);
  }
  return 0;
}

// Counts the call and checks the library is initialized and `dev` valid.
int enter(const char* name, const State& st, const void* dev) {
  ++g_calls[name];
  if (g_init_refs <= 0) return kUninitialized;
  const int i = device_index(dev);
  if (i < 0 || static_cast<unsigned long long>(i) >= num(st, "count")) return kInvalidArgument;
  return kSuccess;
}

int copy_string(const std::string& s, char* buf, unsigned int len) {
  if (buf == nullptr) return kInvalidArgument;
  if (s.size() + 1 > len) return kInsufficientSize;
  std::memcpy(buf, s.c_str(), s.size() + 1);
  return kSuccess;
}

}  // namespace

// NVML's names, as the loader must find them.
// NOLINTBEGIN(readability-identifier-naming)
extern "C" {
struct NvmlDeviceSt;
int nvmlInit_v2();
int nvmlShutdown();
const char* nvmlErrorString(int result);
int nvmlDeviceGetCount_v2(unsigned int* count);
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, NvmlDeviceSt** device);
int nvmlDeviceGetName(NvmlDeviceSt* device, char* name, unsigned int length);
int nvmlDeviceGetUUID(NvmlDeviceSt* device, char* uuid, unsigned int length);
int nvmlDeviceGetUtilizationRates(NvmlDeviceSt* device, Utilization* utilization);
int nvmlDeviceGetMemoryInfo(NvmlDeviceSt* device, MemoryV1* memory);
int nvmlDeviceGetMemoryInfo_v2(NvmlDeviceSt* device, MemoryV2* memory);
int nvmlDeviceGetClockInfo(NvmlDeviceSt* device, int type, unsigned int* clock);
int nvmlDeviceGetComputeRunningProcesses_v3(NvmlDeviceSt* device, unsigned int* count, ProcessInfo* infos);
int nvmlDeviceGetPowerUsage(NvmlDeviceSt* device, unsigned int* power);
int nvmlDeviceGetTemperature(NvmlDeviceSt* device, int sensor, unsigned int* temp);
std::uint64_t fake_nvml_calls(const char* name);
int fake_nvml_init_refs();

int nvmlInit_v2() {
  std::lock_guard lock(g_mu);
  ++g_calls["nvmlInit_v2"];
  const int r = static_cast<int>(num(read_state(), "init"));
  // The library may stay loaded after its last dlclose (libstdc++'s unique
  // symbols make it so): a first init starts the races afresh.
  if (r == kSuccess && g_init_refs++ == 0) g_race_calls.clear();
  return r;
}

int nvmlShutdown() {
  std::lock_guard lock(g_mu);
  ++g_calls["nvmlShutdown"];
  if (g_init_refs <= 0) return kUninitialized;
  --g_init_refs;
  return kSuccess;
}

const char* nvmlErrorString(int result) {
  switch (result) {
    case 0:
      return "Success";
    case 1:
      return "Uninitialized";
    case 2:
      return "Invalid Argument";
    case 3:
      return "Not Supported";
    case 4:
      return "Insufficient Permissions";
    case 7:
      return "Insufficient Size";
    case 9:
      return "Driver Not Loaded";
    case 15:
      return "GPU is lost";
    case 25:
      return "Argument version mismatch";
    default:
      return "Unknown Error";
  }
}

#ifndef FAKE_NVML_NO_COUNT
int nvmlDeviceGetCount_v2(unsigned int* count) {
  std::lock_guard lock(g_mu);
  ++g_calls["nvmlDeviceGetCount_v2"];
  if (g_init_refs <= 0) return kUninitialized;
  if (count == nullptr) return kInvalidArgument;
  const State st = read_state();
  if (const int e = static_cast<int>(num(st, "count_error")); e != 0) return e;
  *count = static_cast<unsigned int>(num(st, "count"));
  return kSuccess;
}
#endif

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, NvmlDeviceSt** device) {
  std::lock_guard lock(g_mu);
  ++g_calls["nvmlDeviceGetHandleByIndex_v2"];
  if (g_init_refs <= 0) return kUninitialized;
  const State st = read_state();
  if (device == nullptr || index >= num(st, "count") || index >= kMaxDevices) return kInvalidArgument;
  if (const int e = static_cast<int>(num(st, "gpu" + std::to_string(index) + ".handle_error")); e != 0) return e;
  *device = reinterpret_cast<NvmlDeviceSt*>(&g_handles[index]);
  return kSuccess;
}

int nvmlDeviceGetName(NvmlDeviceSt* device, char* name, unsigned int length) {
  std::lock_guard lock(g_mu);
  const State st = read_state();
  if (const int e = enter("nvmlDeviceGetName", st, device); e != 0) return e;
  if (const int e = failure(st, device, "name"); e != 0) return e;
  auto it = st.find(gpu_key(device, "name"));
  return copy_string(it == st.end() ? "Fake GPU" : it->second, name, length);
}

int nvmlDeviceGetUUID(NvmlDeviceSt* device, char* uuid, unsigned int length) {
  std::lock_guard lock(g_mu);
  const State st = read_state();
  if (const int e = enter("nvmlDeviceGetUUID", st, device); e != 0) return e;
  if (const int e = failure(st, device, "uuid"); e != 0) return e;
  auto it = st.find(gpu_key(device, "uuid"));
  return copy_string(it == st.end() ? "GPU-00000000-0000-0000-0000-000000000000" : it->second, uuid, length);
}

int nvmlDeviceGetUtilizationRates(NvmlDeviceSt* device, Utilization* utilization) {
  std::lock_guard lock(g_mu);
  const State st = read_state();
  if (const int e = enter("nvmlDeviceGetUtilizationRates", st, device); e != 0) return e;
  if (const int e = failure(st, device, "utilization"); e != 0) return e;
  if (utilization == nullptr) return kInvalidArgument;
  auto v = nums(st, gpu_key(device, "utilization"));
  v.resize(2);
  utilization->gpu = static_cast<unsigned int>(v[0]);
  utilization->memory = static_cast<unsigned int>(v[1]);
  return kSuccess;
}

int nvmlDeviceGetMemoryInfo(NvmlDeviceSt* device, MemoryV1* memory) {
  std::lock_guard lock(g_mu);
  const State st = read_state();
  if (const int e = enter("nvmlDeviceGetMemoryInfo", st, device); e != 0) return e;
  if (const int e = failure(st, device, "memory"); e != 0) return e;
  if (memory == nullptr) return kInvalidArgument;
  auto v = nums(st, gpu_key(device, "memory"));
  v.resize(4);
  memory->total = v[0];
  memory->free = v[2];
  memory->used = v[3] + v[1];  // v1 counts the reserved memory as used
  return kSuccess;
}

#ifndef FAKE_NVML_OLD
int nvmlDeviceGetMemoryInfo_v2(NvmlDeviceSt* device, MemoryV2* memory) {
  std::lock_guard lock(g_mu);
  const State st = read_state();
  if (const int e = enter("nvmlDeviceGetMemoryInfo_v2", st, device); e != 0) return e;
  if (memory == nullptr) return kInvalidArgument;
  if (memory->version != kMemoryV2Version) return kArgumentVersionMismatch;
  if (const int e = failure(st, device, "memory"); e != 0) return e;
  auto v = nums(st, gpu_key(device, "memory"));
  v.resize(4);
  memory->total = v[0];
  memory->reserved = v[1];
  memory->free = v[2];
  memory->used = v[3];
  return kSuccess;
}
#endif

int nvmlDeviceGetClockInfo(NvmlDeviceSt* device, int type, unsigned int* clock) {
  std::lock_guard lock(g_mu);
  const State st = read_state();
  if (const int e = enter("nvmlDeviceGetClockInfo", st, device); e != 0) return e;
  if (clock == nullptr || type < 0 || type > 3) return kInvalidArgument;
  auto v = nums(st, gpu_key(device, "clocks"));
  v.resize(2);
  if (type == 1) {  // NVML_CLOCK_SM
    if (const int e = failure(st, device, "sm_clock"); e != 0) return e;
    *clock = static_cast<unsigned int>(v[0]);
  } else if (type == 2) {  // NVML_CLOCK_MEM
    if (const int e = failure(st, device, "memory_clock"); e != 0) return e;
    *clock = static_cast<unsigned int>(v[1]);
  } else {
    return 3;  // graphics and video clocks: not faked
  }
  return kSuccess;
}

#ifndef FAKE_NVML_OLD
int nvmlDeviceGetComputeRunningProcesses_v3(NvmlDeviceSt* device, unsigned int* count, ProcessInfo* infos) {
  std::lock_guard lock(g_mu);
  const State st = read_state();
  if (const int e = enter("nvmlDeviceGetComputeRunningProcesses_v3", st, device); e != 0) return e;
  if (const int e = failure(st, device, "processes"); e != 0) return e;
  if (count == nullptr) return kInvalidArgument;
  std::vector<ProcessInfo> list;
  if (auto it = st.find(gpu_key(device, "processes")); it != st.end() && !it->second.empty()) {
    for (const auto& item : split(it->second, ',')) {
      const auto colon = item.find(':');
      ProcessInfo p{};
      p.pid = static_cast<unsigned int>(std::strtoul(item.c_str(), nullptr, 10));
      const std::string bytes = colon == std::string::npos ? "0" : item.substr(colon + 1);
      p.used_gpu_memory =
          bytes == "-" ? static_cast<unsigned long long>(-1) : std::strtoull(bytes.c_str(), nullptr, 10);
      p.gpu_instance_id = 0xFFFFFFFF;
      p.compute_instance_id = 0xFFFFFFFF;
      list.push_back(p);
    }
  }
  // A process starts between each "fill this list" and the next, up to the race's length.
  int& raced = g_race_calls[device_index(device)];
  const int race = static_cast<int>(num(st, gpu_key(device, "processes_race")));
  if (infos != nullptr && raced < race) ++raced;
  for (int k = 0; k < std::min(raced, race); ++k) {
    list.push_back(ProcessInfo{static_cast<unsigned int>(90000 + k), 1 << 20, 0xFFFFFFFF, 0xFFFFFFFF});
  }
  if (list.size() > *count) {
    *count = static_cast<unsigned int>(list.size());
    return kInsufficientSize;
  }
  if (!list.empty() && infos == nullptr) return kInvalidArgument;
  for (std::size_t i = 0; i < list.size(); ++i) infos[i] = list[i];
  *count = static_cast<unsigned int>(list.size());
  return kSuccess;
}

int nvmlDeviceGetPowerUsage(NvmlDeviceSt* device, unsigned int* power) {
  std::lock_guard lock(g_mu);
  const State st = read_state();
  if (const int e = enter("nvmlDeviceGetPowerUsage", st, device); e != 0) return e;
  if (const int e = failure(st, device, "power"); e != 0) return e;
  if (power == nullptr) return kInvalidArgument;
  *power = static_cast<unsigned int>(num(st, gpu_key(device, "power_mw")));
  return kSuccess;
}

int nvmlDeviceGetTemperature(NvmlDeviceSt* device, int sensor, unsigned int* temp) {
  std::lock_guard lock(g_mu);
  const State st = read_state();
  if (const int e = enter("nvmlDeviceGetTemperature", st, device); e != 0) return e;
  if (const int e = failure(st, device, "temperature"); e != 0) return e;
  if (temp == nullptr || sensor != 0) return kInvalidArgument;  // NVML_TEMPERATURE_GPU only
  *temp = static_cast<unsigned int>(num(st, gpu_key(device, "temperature_c")));
  return kSuccess;
}
#endif

std::uint64_t fake_nvml_calls(const char* name) {
  std::lock_guard lock(g_mu);
  auto it = g_calls.find(name);
  return it == g_calls.end() ? 0 : it->second;
}

int fake_nvml_init_refs() {
  std::lock_guard lock(g_mu);
  return g_init_refs;
}
}  // extern "C"
// NOLINTEND(readability-identifier-naming)
