// gpu/nvml.h against the fake libnvidia-ml (tests/gpu/fake_nvml.cc), loaded
// by path through the real dlopen path: values, the v2 memory struct's
// version, process lists that grow while being read, failing fields,
// missing libraries and entry points.
#include "gpu/nvml.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::gpu {
namespace {

using ::testing::HasSubstr;

// The fake's state file, named in $FAKE_NVML_STATE for the test's life.
class FakeState {
 public:
  FakeState() {
    char tmpl[] = "/tmp/tandem-fake-nvml-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    if (fd >= 0) ::close(fd);
    path_ = tmpl;
    ::setenv("FAKE_NVML_STATE", path_.c_str(), 1);
  }
  ~FakeState() {
    ::unsetenv("FAKE_NVML_STATE");
    ::unlink(path_.c_str());
  }
  FakeState(const FakeState&) = delete;
  FakeState& operator=(const FakeState&) = delete;
  void write(const std::string& text) { std::ofstream(path_, std::ios::trunc) << text; }

 private:
  std::string path_;
};

// Two H100s; GPU 0 runs two processes.
constexpr const char* kTwoGpus = R"(
count = 2
gpu0.name = NVIDIA H100 80GB HBM3
gpu0.uuid = GPU-11111111-2222-3333-4444-555555555555
gpu0.utilization = 37,12
gpu0.memory = 85520809984,566231040,64000000000,20954578944
gpu0.clocks = 1980,2619
gpu0.power_mw = 312000
gpu0.temperature_c = 54
gpu0.processes = 5678:2147483648,1234:1073741824
gpu1.name = NVIDIA H100 80GB HBM3
gpu1.uuid = GPU-66666666-7777-8888-9999-000000000000
gpu1.utilization = 0,0
gpu1.memory = 85520809984,566231040,84954578944,0
gpu1.clocks = 345,2619
gpu1.power_mw = 70000
gpu1.temperature_c = 31
)";

// The fake's test hooks, through a handle of our own (which also keeps its
// counters alive after the sampler closes its handle).
class FakeHooks {
 public:
  explicit FakeHooks(const char* path) : handle_(dlopen(path, RTLD_NOW | RTLD_LOCAL)) {}
  ~FakeHooks() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  FakeHooks(const FakeHooks&) = delete;
  FakeHooks& operator=(const FakeHooks&) = delete;
  std::uint64_t calls(const char* name) const {
    auto fn = reinterpret_cast<std::uint64_t (*)(const char*)>(dlsym(handle_, "fake_nvml_calls"));
    return fn != nullptr ? fn(name) : ~std::uint64_t{0};
  }
  int init_refs() const {
    auto fn = reinterpret_cast<int (*)()>(dlsym(handle_, "fake_nvml_init_refs"));
    return fn != nullptr ? fn() : -1;
  }
  void* get(const char* name) const { return dlsym(handle_, name); }
  bool loaded() const { return handle_ != nullptr; }

 private:
  void* handle_;
};

TEST(Nvml, ValuesComeThrough) {
  FakeState state;
  state.write(kTwoGpus);
  FakeHooks hooks(FAKE_NVML_PATH);
  ASSERT_TRUE(hooks.loaded()) << dlerror();
  const std::uint64_t v2_before = hooks.calls("nvmlDeviceGetMemoryInfo_v2");
  const std::uint64_t v1_before = hooks.calls("nvmlDeviceGetMemoryInfo");
  const std::uint64_t shutdowns = hooks.calls("nvmlShutdown");
  const int refs = hooks.init_refs();
  auto sampler = NvmlSampler::open(FAKE_NVML_PATH);
  ASSERT_TRUE(sampler) << sampler.error().message();
  EXPECT_EQ((*sampler)->device_count(), 2u);
  EXPECT_TRUE((*sampler)->library().has_memory_v2());
  EXPECT_TRUE((*sampler)->library().has_processes_v3());
  auto s = (*sampler)->sample();
  ASSERT_TRUE(s) << s.error().message();
  ASSERT_EQ(s->devices.size(), 2u);
  const NvmlDeviceSample& d = s->devices[0];
  EXPECT_TRUE(d.errors.empty()) << d.errors.front().first << ": " << d.errors.front().second;
  EXPECT_EQ(d.index, 0u);
  EXPECT_EQ(d.name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(d.uuid, "GPU-11111111-2222-3333-4444-555555555555");
  EXPECT_EQ(d.utilization_gpu_percent, 37u);
  EXPECT_EQ(d.utilization_memory_percent, 12u);
  // v2: reserved apart from used (the fake rejects any other struct version).
  EXPECT_EQ(d.memory_total_bytes, 85520809984u);
  EXPECT_EQ(d.memory_reserved_bytes, 566231040u);
  EXPECT_EQ(d.memory_free_bytes, 64000000000u);
  EXPECT_EQ(d.memory_used_bytes, 20954578944u);
  EXPECT_EQ(d.sm_clock_mhz, 1980u);
  EXPECT_EQ(d.memory_clock_mhz, 2619u);
  EXPECT_EQ(d.power_mw, 312000u);
  EXPECT_EQ(d.temperature_c, 54u);
  ASSERT_TRUE(d.processes.has_value());
  ASSERT_EQ(d.processes->size(), 2u);  // ascending pid
  EXPECT_EQ((*d.processes)[0], (NvmlProcess{1234, 1073741824u}));
  EXPECT_EQ((*d.processes)[1], (NvmlProcess{5678, 2147483648u}));
  const NvmlDeviceSample& d1 = s->devices[1];
  EXPECT_TRUE(d1.errors.empty());
  EXPECT_EQ(d1.sm_clock_mhz, 345u);
  ASSERT_TRUE(d1.processes.has_value());
  EXPECT_TRUE(d1.processes->empty());
  EXPECT_EQ(hooks.calls("nvmlDeviceGetMemoryInfo_v2") - v2_before, 2u);
  EXPECT_EQ(hooks.calls("nvmlDeviceGetMemoryInfo") - v1_before, 0u) << "v1 is only the fallback";
  EXPECT_EQ(hooks.init_refs(), refs + 1);
  sampler->reset();
  EXPECT_EQ(hooks.init_refs(), refs) << "nvmlShutdown at destruction";
  EXPECT_EQ(hooks.calls("nvmlShutdown") - shutdowns, 1u);
}

TEST(Nvml, SamplesAreDatedWithTheGivenClock) {
  FakeState state;
  state.write(kTwoGpus);
  base::VirtualClock clock(base::from_ns(42'000'000));
  auto sampler = NvmlSampler::open(FAKE_NVML_PATH, &clock);
  ASSERT_TRUE(sampler) << sampler.error().message();
  auto s = (*sampler)->sample();
  ASSERT_TRUE(s);
  EXPECT_EQ(base::to_ns(s->time), 42'000'000);
  // Values are read afresh at each sample.
  state.write(std::string(kTwoGpus) + "gpu0.utilization = 99,50\n");
  clock.advance(std::chrono::milliseconds(100));
  s = (*sampler)->sample();
  ASSERT_TRUE(s);
  EXPECT_EQ(base::to_ns(s->time), 142'000'000);
  EXPECT_EQ(s->devices[0].utilization_gpu_percent, 99u);
}

// The fake checks the v2 struct's version as NVML does, so ValuesComeThrough
// proves gpu/nvml.cc sends the right one.
TEST(Nvml, FakeRejectsAWrongMemoryStructVersion) {
  FakeState state;
  state.write(kTwoGpus);
  FakeHooks hooks(FAKE_NVML_PATH);
  ASSERT_TRUE(hooks.loaded());
  struct MemoryV2 {
    unsigned int version;
    unsigned long long total, reserved, free, used;
  };
  using Init = int (*)();
  using Handle = int (*)(unsigned int, void**);
  using Memory = int (*)(void*, MemoryV2*);
  auto init = reinterpret_cast<Init>(hooks.get("nvmlInit_v2"));
  auto handle = reinterpret_cast<Handle>(hooks.get("nvmlDeviceGetHandleByIndex_v2"));
  auto memory = reinterpret_cast<Memory>(hooks.get("nvmlDeviceGetMemoryInfo_v2"));
  auto shutdown = reinterpret_cast<Init>(hooks.get("nvmlShutdown"));
  ASSERT_TRUE(init && handle && memory && shutdown);
  ASSERT_EQ(init(), 0);
  void* dev = nullptr;
  ASSERT_EQ(handle(0, &dev), 0);
  MemoryV2 m{};
  m.version = static_cast<unsigned int>(sizeof m) | (1u << 24);  // version 1 of a v2 struct
  EXPECT_EQ(memory(dev, &m), kNvmlErrorArgumentVersionMismatch);
  m.version = 0;
  EXPECT_EQ(memory(dev, &m), kNvmlErrorArgumentVersionMismatch);
  m.version = static_cast<unsigned int>(sizeof m) | (2u << 24);
  EXPECT_EQ(memory(dev, &m), kNvmlSuccess);
  EXPECT_EQ(m.used, 20954578944u);
  EXPECT_EQ(shutdown(), 0);
}

TEST(Nvml, ProcessListThatGrowsWhileReadIsAskedForAgain) {
  FakeState state;
  state.write(std::string(kTwoGpus) + "gpu0.processes_race = 2\n");
  FakeHooks hooks(FAKE_NVML_PATH);
  auto sampler = NvmlSampler::open(FAKE_NVML_PATH);
  ASSERT_TRUE(sampler) << sampler.error().message();
  const std::uint64_t before = hooks.calls("nvmlDeviceGetComputeRunningProcesses_v3");
  auto s = (*sampler)->sample();
  ASSERT_TRUE(s);
  const NvmlDeviceSample& d = s->devices[0];
  EXPECT_EQ(d.error("processes"), "");
  ASSERT_TRUE(d.processes.has_value());
  ASSERT_EQ(d.processes->size(), 4u);
  EXPECT_EQ((*d.processes)[2].pid, 90000);
  EXPECT_EQ((*d.processes)[3].pid, 90001);
  EXPECT_EQ((*d.processes)[3].used_bytes, 1u << 20);
  // GPU 0: sized with count 0, then two INSUFFICIENT_SIZE (one more process
  // each time), then the list; GPU 1: count 0 and nothing to list.
  EXPECT_EQ(hooks.calls("nvmlDeviceGetComputeRunningProcesses_v3") - before, 4u + 1u);
}

TEST(Nvml, ProcessListThatNeverSettlesCostsOnlyThatField) {
  FakeState state;
  state.write(std::string(kTwoGpus) + "gpu0.processes_race = 1000\n");
  auto sampler = NvmlSampler::open(FAKE_NVML_PATH);
  ASSERT_TRUE(sampler);
  auto s = (*sampler)->sample();
  ASSERT_TRUE(s);
  const NvmlDeviceSample& d = s->devices[0];
  EXPECT_FALSE(d.processes.has_value());
  EXPECT_THAT(std::string(d.error("processes")),
              HasSubstr("nvmlDeviceGetComputeRunningProcesses_v3: Insufficient Size (NVML error 7)"));
  EXPECT_THAT(std::string(d.error("processes")), HasSubstr("still growing after 5 tries"));
  EXPECT_EQ(d.errors.size(), 1u);
  EXPECT_EQ(d.memory_used_bytes, 20954578944u);
  EXPECT_EQ(d.power_mw, 312000u);
}

TEST(Nvml, AFailingFieldIsRecordedAndTheOthersRead) {
  FakeState state;
  state.write(std::string(kTwoGpus) + "gpu0.fail = power:3,sm_clock:3,utilization:4\n");
  auto sampler = NvmlSampler::open(FAKE_NVML_PATH);
  ASSERT_TRUE(sampler);
  auto s = (*sampler)->sample();
  ASSERT_TRUE(s);
  const NvmlDeviceSample& d = s->devices[0];
  EXPECT_FALSE(d.power_mw.has_value());
  EXPECT_FALSE(d.sm_clock_mhz.has_value());
  EXPECT_FALSE(d.utilization_gpu_percent.has_value());
  EXPECT_FALSE(d.utilization_memory_percent.has_value());
  EXPECT_EQ(d.error("power"), "nvmlDeviceGetPowerUsage: Not Supported (NVML error 3)");
  EXPECT_EQ(d.error("sm_clock"), "nvmlDeviceGetClockInfo(NVML_CLOCK_SM): Not Supported (NVML error 3)");
  EXPECT_EQ(d.error("utilization"), "nvmlDeviceGetUtilizationRates: Insufficient Permissions (NVML error 4)");
  EXPECT_EQ(d.errors.size(), 3u);
  EXPECT_EQ(d.memory_clock_mhz, 2619u);
  EXPECT_EQ(d.temperature_c, 54u);
  EXPECT_EQ(d.memory_used_bytes, 20954578944u);
  ASSERT_TRUE(d.processes.has_value());
  EXPECT_EQ(d.processes->size(), 2u);
  EXPECT_TRUE(s->devices[1].errors.empty()) << "GPU 1 is not configured to fail";
}

TEST(Nvml, ADeviceWithoutAHandleIsInTheSampleWithItsError) {
  FakeState state;
  state.write(std::string(kTwoGpus) + "gpu1.handle_error = 15\n");
  auto sampler = NvmlSampler::open(FAKE_NVML_PATH);
  ASSERT_TRUE(sampler);
  auto s = (*sampler)->sample();
  ASSERT_TRUE(s);
  ASSERT_EQ(s->devices.size(), 2u);
  EXPECT_TRUE(s->devices[0].errors.empty());
  EXPECT_EQ(s->devices[1].index, 1u);
  EXPECT_EQ(s->devices[1].error("device"), "nvmlDeviceGetHandleByIndex_v2(1): GPU is lost (NVML error 15)");
  EXPECT_FALSE(s->devices[1].memory_total_bytes.has_value());
}

TEST(Nvml, UnavailableProcessMemoryIsUnset) {
  FakeState state;
  state.write(std::string(kTwoGpus) + "gpu0.processes = 77:-\n");
  auto sampler = NvmlSampler::open(FAKE_NVML_PATH);
  ASSERT_TRUE(sampler);
  auto s = (*sampler)->sample();
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->devices[0].processes.has_value());
  ASSERT_EQ(s->devices[0].processes->size(), 1u);
  EXPECT_EQ((*s->devices[0].processes)[0], (NvmlProcess{77, std::nullopt}));
}

TEST(Nvml, DeviceCountFailureFailsTheSample) {
  FakeState state;
  state.write(kTwoGpus);
  auto sampler = NvmlSampler::open(FAKE_NVML_PATH);
  ASSERT_TRUE(sampler);
  state.write(std::string(kTwoGpus) + "count_error = 15\n");
  auto s = (*sampler)->sample();
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code(), ENODEV);
  EXPECT_EQ(s.error().context(), "nvmlDeviceGetCount_v2: GPU is lost (NVML error 15)");
}

TEST(Nvml, AnOldDriverFallsBackToV1MemoryAndLosesWhatItLacks) {
  FakeState state;
  state.write(kTwoGpus);
  auto sampler = NvmlSampler::open(FAKE_NVML_OLD_PATH);
  ASSERT_TRUE(sampler) << sampler.error().message();
  EXPECT_FALSE((*sampler)->library().has_memory_v2());
  EXPECT_FALSE((*sampler)->library().has_processes_v3());
  auto s = (*sampler)->sample();
  ASSERT_TRUE(s);
  const NvmlDeviceSample& d = s->devices[0];
  EXPECT_EQ(d.memory_total_bytes, 85520809984u);
  EXPECT_EQ(d.memory_used_bytes, 20954578944u + 566231040u) << "v1's used includes the reserved memory";
  EXPECT_FALSE(d.memory_reserved_bytes.has_value());
  EXPECT_EQ(d.error("memory"), "");
  EXPECT_EQ(d.sm_clock_mhz, 1980u);
  EXPECT_FALSE(d.power_mw.has_value());
  EXPECT_EQ(d.error("power"), std::string("nvmlDeviceGetPowerUsage: not exported by ") + FAKE_NVML_OLD_PATH);
  EXPECT_THAT(std::string(d.error("temperature")), HasSubstr("nvmlDeviceGetTemperature: not exported"));
  EXPECT_THAT(std::string(d.error("processes")), HasSubstr("nvmlDeviceGetComputeRunningProcesses_v3: not exported"));
  EXPECT_EQ(d.errors.size(), 3u);
}

TEST(Nvml, AMissingLibraryIsENOENTSayingThereIsNoDriver) {
  auto lib = NvmlLibrary::open("/nonexistent/tandem/libnvidia-ml.so.1");
  ASSERT_FALSE(lib);
  EXPECT_EQ(lib.error().code(), ENOENT);
  EXPECT_THAT(lib.error().context(),
              HasSubstr("/nonexistent/tandem/libnvidia-ml.so.1: not found — no NVIDIA driver (dlopen: "));
  auto sampler = NvmlSampler::open("/nonexistent/tandem/libnvidia-ml.so.1");
  ASSERT_FALSE(sampler);
  EXPECT_EQ(sampler.error().code(), ENOENT);
}

TEST(Nvml, TheDriversLibraryByNameLoadsOrSaysWhy) {
  // This machine may or may not have a driver: either outcome is well formed.
  auto lib = NvmlLibrary::open();
  if (!lib) {
    EXPECT_THAT(lib.error().context(), HasSubstr("libnvidia-ml.so.1: "));
    EXPECT_NE(lib.error().code(), 0);
    GTEST_SKIP() << "no NVML here: " << lib.error().message();
  }
  auto n = (*lib)->device_count();
  EXPECT_TRUE(n) << n.error().message();
}

TEST(Nvml, AFileThatIsNotALibraryIsELIBBAD) {
  char tmpl[] = "/tmp/tandem-not-a-lib-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "not ELF\n", 8), 8);
  ::close(fd);
  auto lib = NvmlLibrary::open(tmpl);
  ::unlink(tmpl);
  ASSERT_FALSE(lib);
  EXPECT_EQ(lib.error().code(), ELIBBAD);
  EXPECT_THAT(lib.error().context(), HasSubstr("cannot be loaded (dlopen: "));
}

TEST(Nvml, AMissingRequiredEntryPointIsENOSYSNamingIt) {
  FakeState state;
  state.write(kTwoGpus);
  auto lib = NvmlLibrary::open(FAKE_NVML_NO_COUNT_PATH);
  ASSERT_FALSE(lib);
  EXPECT_EQ(lib.error().code(), ENOSYS);
  EXPECT_THAT(lib.error().context(), HasSubstr("missing nvmlDeviceGetCount_v2"));
  EXPECT_THAT(lib.error().context(), HasSubstr(FAKE_NVML_NO_COUNT_PATH));
}

TEST(Nvml, InitFailureNamesTheCallAndNvmlsWords) {
  FakeState state;
  state.write("init = 9\ncount = 1\n");
  FakeHooks hooks(FAKE_NVML_PATH);
  const std::uint64_t shutdowns = hooks.calls("nvmlShutdown");
  auto lib = NvmlLibrary::open(FAKE_NVML_PATH);
  ASSERT_FALSE(lib);
  EXPECT_EQ(lib.error().code(), ENODEV);
  EXPECT_EQ(lib.error().context(), std::string(FAKE_NVML_PATH) + ": nvmlInit_v2: Driver Not Loaded (NVML error 9)");
  EXPECT_EQ(hooks.calls("nvmlShutdown"), shutdowns) << "no shutdown without a successful init";
}

TEST(Nvml, ResultNamesAndErrnos) {
  EXPECT_EQ(nvml_result_name(0), "NVML_SUCCESS");
  EXPECT_EQ(nvml_result_name(7), "NVML_ERROR_INSUFFICIENT_SIZE");
  EXPECT_EQ(nvml_result_name(25), "NVML_ERROR_ARGUMENT_VERSION_MISMATCH");
  EXPECT_EQ(nvml_result_name(999), "NVML_ERROR_UNKNOWN");
  EXPECT_EQ(nvml_result_name(4242), "NVML_ERROR_4242");
  EXPECT_EQ(nvml_errno(0), 0);
  EXPECT_EQ(nvml_errno(3), ENOTSUP);
  EXPECT_EQ(nvml_errno(4), EACCES);
  EXPECT_EQ(nvml_errno(9), ENODEV);
  EXPECT_EQ(nvml_errno(15), ENODEV);
  EXPECT_EQ(nvml_errno(999), EIO);
}

}  // namespace
}  // namespace tandem::gpu
