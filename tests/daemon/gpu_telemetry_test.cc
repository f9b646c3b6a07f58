// daemon/gpu_telemetry.h: the [nvml] config section, the sampling thread
// against the fake libnvidia-ml (tests/gpu/fake_nvml.cc) in each mode, a
// reload's interval and restart, pid attribution through a fake /proc, and
// the JSON and Prometheus views.
#include "daemon/gpu_telemetry.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace tandem::daemon {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tandem-gpu-telemetry-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The fake's state, named in $FAKE_NVML_STATE for the test's life.
class FakeState {
 public:
  FakeState() : path_(dir_.path() + "/state") { ::setenv("FAKE_NVML_STATE", path_.c_str(), 1); }
  ~FakeState() { ::unsetenv("FAKE_NVML_STATE"); }
  FakeState(const FakeState&) = delete;
  FakeState& operator=(const FakeState&) = delete;
  void write(const std::string& text) {
    // Whole or not at all: the sampler may read it at any moment.
    const std::string tmp = path_ + ".tmp";
    std::ofstream(tmp, std::ios::trunc) << text;
    std::filesystem::rename(tmp, path_);
  }

 private:
  TempDir dir_;
  std::string path_;
};

constexpr const char* kOneGpu = R"(
count = 1
gpu0.name = NVIDIA H100 80GB HBM3
gpu0.uuid = GPU-abc
gpu0.utilization = 37,12
gpu0.memory = 85520809984,566231040,64000000000,20954578944
gpu0.clocks = 1980,2619
gpu0.power_mw = 312500
gpu0.temperature_c = 54
gpu0.processes = 4242:1073741824,4343:2147483648,4444:-
)";

NvmlConfig fake_config(std::string enabled = "auto", std::uint32_t interval_ms = 100) {
  NvmlConfig c;
  c.enabled = std::move(enabled);
  c.interval_ms = interval_ms;
  c.library = FAKE_NVML_PATH;
  return c;
}

// Polls until `pred` holds (5 s at most): waits for the sampling thread
// without asserting on how long it takes.
template <class Pred>
bool eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// ---- config -------------------------------------------------------------------

TEST(NvmlConfig, DefaultsAndParsing) {
  const NvmlConfig d;
  EXPECT_EQ(d.enabled, "auto");
  EXPECT_EQ(d.interval_ms, 1000u);
  EXPECT_EQ(d.library, "libnvidia-ml.so.1");
  auto r =
      parse_config("[nvml]\nenabled = \"on\"\ninterval_ms = 250\nlibrary = \"/opt/nv/libnvidia-ml.so.1\"\n", "t.toml");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->nvml.enabled, "on");
  EXPECT_EQ(r->nvml.interval_ms, 250u);
  EXPECT_EQ(r->nvml.library, "/opt/nv/libnvidia-ml.so.1");
  EXPECT_THAT(describe(*r), HasSubstr("nvml         on, every 250 ms, library /opt/nv/libnvidia-ml.so.1"));
}

TEST(NvmlConfig, BadValuesAreNamed) {
  auto bad = [](const std::string& text) {
    auto r = parse_config(text, "t.toml");
    return r ? std::string("accepted") : r.error().message();
  };
  EXPECT_THAT(bad("[nvml]\nenabled = \"yes\"\n"),
              HasSubstr("t.toml: nvml.enabled: must be one of auto, on, off, got 'yes'"));
  EXPECT_THAT(bad("[nvml]\ninterval_ms = 99\n"),
              HasSubstr("t.toml: nvml.interval_ms: must be between 100 and 60000, got 99"));
  EXPECT_THAT(bad("[nvml]\ninterval_ms = 60001\n"), HasSubstr("must be between 100 and 60000, got 60001"));
  EXPECT_THAT(bad("[nvml]\ninterval_ms = \"1s\"\n"), HasSubstr("nvml.interval_ms: expected an integer, got a string"));
  EXPECT_THAT(bad("[nvml]\nlibrary = \"\"\n"), HasSubstr("nvml.library: must be a library name or path"));
  EXPECT_THAT(bad("[nvml]\nintervall_ms = 100\n"),
              HasSubstr("nvml.intervall_ms: unknown key (known: enabled, interval_ms, library)"));
  Config c;
  c.nvml.interval_ms = 50;
  auto v = validate(c);
  ASSERT_FALSE(v);
  EXPECT_THAT(v.error().message(), HasSubstr("nvml.interval_ms: must be between 100 and 60000, got 50"));
}

TEST(NvmlConfig, TheExampleFileShowsTheDefaults) {
  auto r = load_config(TANDEM_SOURCE_DIR "/examples/tandemd.toml");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->nvml, NvmlConfig{});
}

// ---- the sampler ---------------------------------------------------------------

TEST(GpuTelemetry, SamplesOnItsThreadAndPublishes) {
  FakeState state;
  state.write(kOneGpu);
  auto t = GpuTelemetry::start(fake_config());
  ASSERT_TRUE(t) << t.error().message();
  EXPECT_TRUE((*t)->sampling());
  ASSERT_TRUE(eventually([&] { return (*t)->snapshot().samples >= 1; }));
  const GpuTelemetry::Snapshot s = (*t)->snapshot();
  EXPECT_TRUE(s.available);
  EXPECT_EQ(s.reason, "");
  EXPECT_EQ(s.error, "");
  EXPECT_EQ(s.interval, std::chrono::milliseconds(100));
  ASSERT_TRUE(s.sample.has_value());
  ASSERT_EQ(s.sample->devices.size(), 1u);
  EXPECT_EQ(s.sample->devices[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(s.sample->devices[0].memory_used_bytes, 20954578944u);
  // A change in the driver's values shows up at a later sample.
  state.write(std::string(kOneGpu) + "gpu0.utilization = 90,40\n");
  EXPECT_TRUE(eventually([&] {
    auto now = (*t)->snapshot();
    return now.sample && now.sample->devices[0].utilization_gpu_percent == 90u;
  }));
}

TEST(GpuTelemetry, DestructionStopsAndJoinsTheThread) {
  FakeState state;
  state.write(kOneGpu);
  // A long interval: the destructor must not wait it out (ctest's timeout
  // would catch a hang).
  auto t = GpuTelemetry::start(fake_config("on", 60000));
  ASSERT_TRUE(t);
  ASSERT_TRUE(eventually([&] { return (*t)->snapshot().samples >= 1; }));
  t->reset();
  SUCCEED();
}

TEST(GpuTelemetry, AShorterIntervalAppliesToTheRunningThread) {
  FakeState state;
  state.write(kOneGpu);
  auto t = GpuTelemetry::start(fake_config("auto", 60000));
  ASSERT_TRUE(t);
  ASSERT_TRUE(eventually([&] { return (*t)->snapshot().samples >= 1; }));
  // With 60 s between samples a second one comes only if apply() woke the thread.
  (*t)->apply(fake_config("auto", 100));
  EXPECT_EQ((*t)->config().interval_ms, 100u);
  EXPECT_EQ((*t)->snapshot().interval, std::chrono::milliseconds(100));
  EXPECT_TRUE(eventually([&] { return (*t)->snapshot().samples >= 3; }));
}

TEST(GpuTelemetry, PrepareRestartsOnlyForANewModeOrLibrary) {
  FakeState state;
  state.write(kOneGpu);
  auto t = GpuTelemetry::start(fake_config());
  ASSERT_TRUE(t);
  auto same = GpuTelemetry::prepare(**t, fake_config("auto", 500));
  ASSERT_TRUE(same);
  EXPECT_EQ(*same, nullptr) << "an interval alone is applied in place";
  auto off = GpuTelemetry::prepare(**t, fake_config("off"));
  ASSERT_TRUE(off);
  ASSERT_NE(*off, nullptr);
  EXPECT_FALSE((*off)->sampling());
  EXPECT_FALSE((*off)->snapshot().available);
  NvmlConfig missing = fake_config("on");
  missing.library = "/nonexistent/libnvidia-ml.so.1";
  auto refused = GpuTelemetry::prepare(**t, missing);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ENOENT);
  missing.enabled = "auto";
  auto unavailable = GpuTelemetry::prepare(**t, missing);
  ASSERT_TRUE(unavailable);
  ASSERT_NE(*unavailable, nullptr);
  EXPECT_FALSE((*unavailable)->snapshot().available);
}

TEST(GpuTelemetry, ModeAutoWithoutTheLibraryRunsUnavailable) {
  NvmlConfig c = fake_config("auto");
  c.library = "/nonexistent/libnvidia-ml.so.1";
  auto t = GpuTelemetry::start(c);
  ASSERT_TRUE(t) << t.error().message();
  EXPECT_FALSE((*t)->sampling());
  const auto s = (*t)->snapshot();
  EXPECT_FALSE(s.available);
  EXPECT_THAT(s.reason, HasSubstr("/nonexistent/libnvidia-ml.so.1: not found — no NVIDIA driver"));
  const json j = gpu_json(s, base::Time{}, PidAttribution({}, "/proc"));
  EXPECT_EQ(j["available"], false);
  EXPECT_EQ(j["reason"], s.reason);
  EXPECT_EQ(j["devices"], json::array());
  PromText p;
  gpu_metrics(p, s, PidAttribution({}, "/proc"));
  EXPECT_THAT(p.text(), HasSubstr("tandem_nvml_up 0\n"));
  EXPECT_THAT(p.text(), Not(HasSubstr("tandem_gpu_")));
}

TEST(GpuTelemetry, ModeOnWithoutTheLibraryIsAnError) {
  NvmlConfig c = fake_config("on");
  c.library = "/nonexistent/libnvidia-ml.so.1";
  auto t = GpuTelemetry::start(c);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code(), ENOENT);
  EXPECT_THAT(t.error().context(), HasSubstr("nvml: /nonexistent/libnvidia-ml.so.1: not found — no NVIDIA driver"));
}

TEST(GpuTelemetry, ModeOnWithAFailingInitIsAnError) {
  FakeState state;
  state.write("init = 9\n");
  auto t = GpuTelemetry::start(fake_config("on"));
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code(), ENODEV);
  EXPECT_THAT(t.error().context(), HasSubstr("nvmlInit_v2: Driver Not Loaded (NVML error 9)"));
}

TEST(GpuTelemetry, ModeOffLoadsNothing) {
  NvmlConfig c = fake_config("off");
  c.library = "/nonexistent/libnvidia-ml.so.1";
  auto t = GpuTelemetry::start(c);
  ASSERT_TRUE(t);
  EXPECT_FALSE((*t)->sampling());
  EXPECT_THAT((*t)->snapshot().reason, HasSubstr("off in the configuration"));
  EXPECT_EQ(gpu_status((*t)->snapshot())["available"], false);
}

TEST(GpuTelemetry, AFailingSampleIsCountedAndTheLastGoodOneKept) {
  FakeState state;
  state.write(kOneGpu);
  auto t = GpuTelemetry::start(fake_config());
  ASSERT_TRUE(t);
  ASSERT_TRUE(eventually([&] { return (*t)->snapshot().samples >= 1; }));
  state.write(std::string(kOneGpu) + "count_error = 15\n");
  ASSERT_TRUE(eventually([&] { return (*t)->snapshot().failures >= 1; }));
  const auto s = (*t)->snapshot();
  EXPECT_EQ(s.error, "nvmlDeviceGetCount_v2: GPU is lost (NVML error 15)");
  ASSERT_TRUE(s.sample.has_value());
  EXPECT_EQ(s.sample->devices.size(), 1u);
  PromText p;
  gpu_metrics(p, s, PidAttribution({}, "/proc"));
  EXPECT_THAT(p.text(), HasSubstr("tandem_nvml_up 0\n"));
  EXPECT_THAT(p.text(), HasSubstr("tandem_nvml_sample_failures_total "));
  EXPECT_EQ(gpu_status(s)["error"], s.error);
  state.write(kOneGpu);
  EXPECT_TRUE(eventually([&] { return (*t)->snapshot().error.empty(); }));
}

// ---- views ---------------------------------------------------------------------

// A sample as the thread would publish it, at t = 10 s.
GpuTelemetry::Snapshot sample_snapshot() {
  GpuTelemetry::Snapshot s;
  s.enabled = "auto";
  s.library = "libnvidia-ml.so.1";
  s.available = true;
  s.interval = std::chrono::milliseconds(1000);
  s.samples = 7;
  gpu::NvmlSample sample;
  sample.time = base::from_ns(10'000'000'000);
  gpu::NvmlDeviceSample d;
  d.index = 0;
  d.name = "NVIDIA H100 80GB HBM3";
  d.uuid = "GPU-abc";
  d.utilization_gpu_percent = 37;
  d.utilization_memory_percent = 12;
  d.memory_total_bytes = 85520809984u;
  d.memory_used_bytes = 20954578944u;
  d.memory_free_bytes = 64000000000u;
  d.memory_reserved_bytes = 566231040u;
  d.sm_clock_mhz = 1980;
  d.memory_clock_mhz = 2619;
  d.temperature_c = 54;
  d.errors.emplace_back("power", "nvmlDeviceGetPowerUsage: Not Supported (NVML error 3)");
  d.processes = std::vector<gpu::NvmlProcess>{{100, 1073741824u}, {200, 2147483648u}, {300, std::nullopt}};
  sample.devices.push_back(d);
  s.sample = sample;
  return s;
}

TEST(GpuViews, JsonCarriesTheSampleAndItsClients) {
  PidAttribution clients({{100, GpuClient{3, "gpu0-engine", "engine"}}}, "/nonexistent-proc");
  const json j = gpu_json(sample_snapshot(), base::from_ns(10'250'000'000), clients);
  EXPECT_EQ(j["available"], true);
  EXPECT_EQ(j["reason"], nullptr);
  EXPECT_EQ(j["error"], nullptr);
  EXPECT_EQ(j["interval_ms"], 1000);
  EXPECT_EQ(j["samples"], 7);
  EXPECT_DOUBLE_EQ(j["age_s"].get<double>(), 0.25);
  ASSERT_EQ(j["devices"].size(), 1u);
  const json& d = j["devices"][0];
  EXPECT_EQ(d["name"], "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(d["utilization_gpu_percent"], 37);
  EXPECT_EQ(d["memory_used_bytes"], 20954578944u);
  EXPECT_EQ(d["memory_reserved_bytes"], 566231040u);
  EXPECT_EQ(d["power_mw"], nullptr);
  EXPECT_EQ(d["errors"]["power"], "nvmlDeviceGetPowerUsage: Not Supported (NVML error 3)");
  ASSERT_EQ(d["processes"].size(), 3u);
  EXPECT_EQ(
      d["processes"][0],
      (json{
          {"pid", 100}, {"used_bytes", 1073741824u}, {"client", "gpu0-engine"}, {"client_id", 3}, {"role", "engine"}}));
  EXPECT_EQ(d["processes"][1]["client"], nullptr);
  EXPECT_EQ(d["processes"][2]["used_bytes"], nullptr);
}

TEST(GpuViews, PrometheusFamilies) {
  PidAttribution clients({{100, GpuClient{3, "gpu0-engine", "engine"}}}, "/nonexistent-proc");
  PromText p;
  gpu_metrics(p, sample_snapshot(), clients);
  const std::string& t = p.text();
  EXPECT_THAT(t, HasSubstr("tandem_nvml_up 1\n"));
  EXPECT_THAT(t, HasSubstr("tandem_gpu_info{gpu=\"0\",name=\"NVIDIA H100 80GB HBM3\",uuid=\"GPU-abc\"} 1\n"));
  EXPECT_THAT(t,
              HasSubstr("# TYPE tandem_gpu_utilization_ratio gauge\ntandem_gpu_utilization_ratio{gpu=\"0\"} 0.37\n"));
  EXPECT_THAT(t, HasSubstr("tandem_gpu_memory_utilization_ratio{gpu=\"0\"} 0.12\n"));
  EXPECT_THAT(t, HasSubstr("tandem_gpu_memory_used_bytes{gpu=\"0\"} 20954578944\n"));
  EXPECT_THAT(t, HasSubstr("tandem_gpu_memory_total_bytes{gpu=\"0\"} 85520809984\n"));
  EXPECT_THAT(t, HasSubstr("tandem_gpu_sm_clock_hz{gpu=\"0\"} 1980000000\n"));
  EXPECT_THAT(t, HasSubstr("tandem_gpu_memory_clock_hz{gpu=\"0\"} 2619000000\n"));
  EXPECT_THAT(t, HasSubstr("tandem_gpu_temperature_celsius{gpu=\"0\"} 54\n"));
  EXPECT_THAT(t, Not(HasSubstr("tandem_gpu_power_watts"))) << "a field NVML could not read is absent";
  EXPECT_THAT(t,
              HasSubstr("tandem_gpu_process_memory_bytes{gpu=\"0\",pid=\"100\",client=\"gpu0-engine\"} 1073741824\n"));
  EXPECT_THAT(t, HasSubstr("tandem_gpu_process_memory_bytes{gpu=\"0\",pid=\"200\",client=\"\"} 2147483648\n"));
  EXPECT_THAT(t, Not(HasSubstr("pid=\"300\""))) << "no number, no sample";
}

TEST(GpuViews, EachFamilysSamplesStayTogetherAcrossGpus) {
  GpuTelemetry::Snapshot snap = sample_snapshot();
  gpu::NvmlDeviceSample second = snap.sample->devices.front();
  second.index = 1;
  second.uuid = "GPU-def";
  snap.sample->devices.push_back(second);
  PidAttribution clients({}, "/nonexistent-proc");
  PromText p;
  gpu_metrics(p, snap, clients);
  // Walk the samples: once a family is left, it never comes back.
  std::istringstream lines(p.text());
  std::set<std::string> done;
  std::string current;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const std::string name = line.substr(0, line.find_first_of("{ "));
    if (name == current) continue;
    EXPECT_FALSE(done.contains(name)) << name << " comes back after other families:\n" << p.text();
    if (!current.empty()) done.insert(current);
    current = name;
  }
  EXPECT_THAT(p.text(), HasSubstr("tandem_gpu_sm_clock_hz{gpu=\"0\"} 1980000000\ntandem_gpu_sm_clock_hz{gpu=\"1\"} "
                                  "1980000000\n"));
}

// ---- pid attribution -------------------------------------------------------------

TEST(PidAttribution, ParsesTheParentFromStat) {
  EXPECT_EQ(parse_stat_ppid("1234 (python3) S 1000 1234 1234 0 -1 4194560"), 1000);
  EXPECT_EQ(parse_stat_ppid("77 (a) b (c) R 5 77 77"), 5) << "a name with spaces and parentheses";
  EXPECT_EQ(parse_stat_ppid("1 (init) S 0 1 1"), 0);
  EXPECT_EQ(parse_stat_ppid("1234 python3 S 1000"), std::nullopt);
  EXPECT_EQ(parse_stat_ppid("1234 (x) S"), std::nullopt);
  EXPECT_EQ(parse_stat_ppid("1234 (x) S -5"), std::nullopt);
  EXPECT_EQ(parse_stat_ppid("1234 (x) Sleeping 5"), std::nullopt);
  EXPECT_EQ(parse_stat_ppid(""), std::nullopt);
}

TEST(PidAttribution, AChildOfAClientIsTheClients) {
  TempDir proc;
  auto stat = [&](int pid, int ppid) {
    std::filesystem::create_directories(fmt::format("{}/{}", proc.path(), pid));
    std::ofstream(fmt::format("{}/{}/stat", proc.path(), pid)) << fmt::format("{} (w {}) S {} 1 1 0", pid, pid, ppid);
  };
  stat(30, 20);  // worker of 20
  stat(20, 10);  // 10 is the engine
  stat(10, 1);
  stat(40, 1);   // someone else's
  stat(50, 50);  // its own parent: the walk must end
  PidAttribution a({{10, GpuClient{1, "engine-a", "engine"}}}, proc.path());
  ASSERT_NE(a.find(10), nullptr);
  EXPECT_EQ(a.find(10)->name, "engine-a");
  ASSERT_NE(a.find(30), nullptr);
  EXPECT_EQ(a.find(30)->id, 1u);
  EXPECT_EQ(a.find(40), nullptr);
  EXPECT_EQ(a.find(50), nullptr);
  EXPECT_EQ(a.find(99), nullptr) << "a pid with no /proc entry";
  EXPECT_EQ(a.find(0), nullptr);
}

TEST(PidAttribution, TheRealProcWalksToThisProcess) {
  // This test's own pid stands for a client: a child it forks is found
  // through the child's real /proc/<pid>/stat.
  const pid_t self = ::getpid();
  PidAttribution a({{self, GpuClient{9, "me", "engine"}}}, std::string(kProcRoot));
  ASSERT_NE(a.find(self), nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  const GpuClient* c = a.find(child);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->name, "me");
}

}  // namespace
}  // namespace tandem::daemon
