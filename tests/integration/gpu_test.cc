// The real tandemd with [nvml] pointed at the fake libnvidia-ml
// (tests/gpu/fake_nvml.cc): `tandemctl gpu` (table and --json) reports the
// fake's numbers with GPU processes attributed to the engine that holds them
// (directly, and through a child process), the metrics carry them, a reload
// applies a new interval; without the library, mode "auto" runs and says
// unavailable and mode "on" refuses to start.
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/integration/harness.h"

namespace tandem::it {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// Runs `command` with sh; its stdout and stderr, and its exit status.
std::pair<std::string, int> run(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return {"popen failed", -1};
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

std::string tandemctl(const Daemon& d, const std::string& args) {
  return fmt::format("{} --runtime-dir {} {}", TANDEMCTL_PATH, d.runtime_dir(), args);
}

// $FAKE_NVML_STATE for the test's life; the daemon inherits it.
class FakeState {
 public:
  explicit FakeState(const std::string& dir) : path_(dir + "/fake-nvml.state") {
    ::setenv("FAKE_NVML_STATE", path_.c_str(), 1);
  }
  ~FakeState() { ::unsetenv("FAKE_NVML_STATE"); }
  FakeState(const FakeState&) = delete;
  FakeState& operator=(const FakeState&) = delete;
  void write(const std::string& text) {
    std::ofstream(path_ + ".tmp", std::ios::trunc) << text;
    std::rename((path_ + ".tmp").c_str(), path_.c_str());
  }

 private:
  std::string path_;
};

// A child of this process (standing for an engine's GPU worker) until destroyed.
class Child {
 public:
  Child() : pid_(::fork()) {
    if (pid_ == 0) {
      ::pause();
      ::_exit(0);
    }
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

std::string nvml_config(const std::string& library, const std::string& enabled, int interval_ms) {
  return fmt::format("[nvml]\nenabled = \"{}\"\nlibrary = \"{}\"\ninterval_ms = {}\n", enabled, library, interval_ms);
}

TEST(Gpu, TandemctlGpuReportsTheDriversNumbersAndWhoseProcessesTheyAre) {
  TempDir dir;
  FakeState state(dir.path());
  Child worker;
  ASSERT_GT(worker.pid(), 0);
  const pid_t self = ::getpid();
  state.write(fmt::format(R"(
count = 1
gpu0.name = NVIDIA H100 80GB HBM3
gpu0.uuid = GPU-0123
gpu0.utilization = 37,12
gpu0.memory = 85520809984,566231040,64000000000,20954578944
gpu0.clocks = 1980,2619
gpu0.power_mw = 312000
gpu0.temperature_c = 54
gpu0.processes = {}:1073741824,{}:2147483648,999999:536870912
gpu0.fail = sm_clock:3
)",
                          self, worker.pid()));
  Daemon daemon(dir.path(), nvml_config(FAKE_NVML_PATH, "on", 100));
  daemon.start();
  // This process is the engine: SO_PEERCRED gives the daemon our pid.
  auto engine = RawClient::connect(daemon.socket_path());
  ASSERT_TRUE(engine);
  ASSERT_TRUE(engine->hello(wire::Role::Engine, "gpu0-engine", test_engine_info()));

  json reply;
  ASSERT_TRUE(eventually([&] {
    auto [out, rc] = run(tandemctl(daemon, "gpu --json"));
    if (rc != 0) return false;
    reply = json::parse(out, nullptr, false);
    return reply.is_object() && reply.contains("devices") && !reply["devices"].empty();
  })) << daemon.log();
  EXPECT_EQ(reply["available"], true);
  EXPECT_EQ(reply["enabled"], "on");
  EXPECT_EQ(reply["interval_ms"], 100);
  const json& d = reply["devices"][0];
  EXPECT_EQ(d["name"], "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(d["uuid"], "GPU-0123");
  EXPECT_EQ(d["utilization_gpu_percent"], 37);
  EXPECT_EQ(d["memory_total_bytes"], 85520809984u);
  EXPECT_EQ(d["memory_used_bytes"], 20954578944u);
  EXPECT_EQ(d["memory_reserved_bytes"], 566231040u);
  EXPECT_EQ(d["memory_clock_mhz"], 2619);
  EXPECT_EQ(d["sm_clock_mhz"], nullptr);
  EXPECT_EQ(d["errors"]["sm_clock"], "nvmlDeviceGetClockInfo(NVML_CLOCK_SM): Not Supported (NVML error 3)");
  EXPECT_EQ(d["power_mw"], 312000);
  EXPECT_EQ(d["temperature_c"], 54);
  ASSERT_EQ(d["processes"].size(), 3u) << d.dump();
  json by_pid;
  for (const json& p : d["processes"]) by_pid[std::to_string(p["pid"].get<int>())] = p;
  EXPECT_EQ(by_pid[std::to_string(self)]["client"], "gpu0-engine");
  EXPECT_EQ(by_pid[std::to_string(self)]["role"], "engine");
  EXPECT_EQ(by_pid[std::to_string(self)]["used_bytes"], 1073741824u);
  EXPECT_EQ(by_pid[std::to_string(worker.pid())]["client"], "gpu0-engine") << "a child of the engine is the engine's";
  EXPECT_EQ(by_pid["999999"]["client"], nullptr);

  auto [table, rc] = run(tandemctl(daemon, "gpu"));
  EXPECT_EQ(rc, 0) << table;
  EXPECT_THAT(table, HasSubstr(fmt::format("NVML: {}, every 100 ms, sampled ", FAKE_NVML_PATH)));
  EXPECT_THAT(table, HasSubstr("NVIDIA H100 80GB HBM3     37    12  19.5/79.6G       -     2619   312W   54C"));
  EXPECT_THAT(table, HasSubstr(fmt::format("{}  gpu0-engine  engine    1.0G", self)));
  EXPECT_THAT(table, HasSubstr("gpu 0 sm_clock: nvmlDeviceGetClockInfo(NVML_CLOCK_SM): Not Supported"));

  auto m = RawClient::connect(daemon.socket_path());
  ASSERT_TRUE(m);
  ASSERT_TRUE(m->hello(wire::Role::CtlRead, "it-metrics"));
  auto text = m->ctl("metrics");
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_THAT(*text, HasSubstr("tandem_nvml_up 1\n"));
  EXPECT_THAT(*text, HasSubstr("tandem_gpu_utilization_ratio{gpu=\"0\"} 0.37\n"));
  EXPECT_THAT(*text, HasSubstr("tandem_gpu_memory_used_bytes{gpu=\"0\"} 20954578944\n"));
  EXPECT_THAT(
      *text, HasSubstr(fmt::format(
                 "tandem_gpu_process_memory_bytes{{gpu=\"0\",pid=\"{}\",client=\"gpu0-engine\"}} 1073741824\n", self)));
  const json status = ctl(daemon.socket_path(), "status");
  EXPECT_EQ(status["nvml"]["available"], true);
  EXPECT_EQ(status["nvml"]["devices"], 1);

  // A reload applies a new interval to the running sampler.
  {
    std::ifstream in(dir.path() + "/tandemd.toml");
    std::string text_cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto at = text_cfg.find("interval_ms = 100");
    ASSERT_NE(at, std::string::npos);
    text_cfg.replace(at, 17, "interval_ms = 250");
    std::ofstream(dir.path() + "/tandemd.toml", std::ios::trunc) << text_cfg;
  }
  auto [reloaded, reload_rc] = run(tandemctl(daemon, "reload"));
  ASSERT_EQ(reload_rc, 0) << reloaded;
  auto [after, after_rc] = run(tandemctl(daemon, "gpu --json"));
  ASSERT_EQ(after_rc, 0) << after;
  EXPECT_EQ(json::parse(after)["interval_ms"], 250);
  EXPECT_EQ(daemon.stop(), 0) << daemon.log();
}

TEST(Gpu, WithoutTheLibraryModeAutoRunsAndSaysUnavailable) {
  TempDir dir;
  Daemon daemon(dir.path(), nvml_config("/nonexistent/tandem/libnvidia-ml.so.1", "auto", 100));
  daemon.start();
  auto [table, rc] = run(tandemctl(daemon, "gpu"));
  EXPECT_EQ(rc, 0) << table;
  EXPECT_THAT(table,
              HasSubstr("NVML: unavailable (/nonexistent/tandem/libnvidia-ml.so.1: not found — no NVIDIA driver"));
  auto [out, json_rc] = run(tandemctl(daemon, "gpu --json"));
  ASSERT_EQ(json_rc, 0) << out;
  const json reply = json::parse(out);
  EXPECT_EQ(reply["available"], false);
  EXPECT_THAT(reply["reason"].get<std::string>(), HasSubstr("not found — no NVIDIA driver"));
  EXPECT_THAT(daemon.log(), HasSubstr("GPU telemetry off: /nonexistent/tandem/libnvidia-ml.so.1: not found"));
  EXPECT_EQ(ctl(daemon.socket_path(), "status")["nvml"]["available"], false);
  EXPECT_EQ(daemon.stop(), 0);
}

TEST(Gpu, WithoutTheLibraryModeOnRefusesToStart) {
  TempDir dir;
  const std::string config = dir.path() + "/tandemd.toml";
  std::ofstream(config) << nvml_config("/nonexistent/tandem/libnvidia-ml.so.1", "on", 100)
                        << "[metrics]\nlisten = \"\"\n[cgroups]\nmode = \"off\"\n";
  auto [out, rc] = run(fmt::format("timeout 20 {} --config {} --runtime-dir {}", TANDEMD_PATH, config, dir.path()));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_THAT(out,
              HasSubstr("cannot start: nvml: /nonexistent/tandem/libnvidia-ml.so.1: not found — no NVIDIA driver"));
}

}  // namespace
}  // namespace tandem::it
