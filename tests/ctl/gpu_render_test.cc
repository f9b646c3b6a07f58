// `tandemctl gpu`'s rendering (ctl/render_gpu.cc) on sample answers: the
// tables, no driver, no sample yet, fields NVML could not read, and hostile
// or partial JSON.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ctl/render.h"

namespace tandem::ctl {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kReply = R"j({
  "enabled": "auto", "library": "libnvidia-ml.so.1", "available": true, "reason": null,
  "interval_ms": 1000, "samples": 12, "sample_failures": 0, "error": null, "age_s": 0.25, "truncated": false,
  "devices": [
    {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1", "utilization_gpu_percent": 37,
     "utilization_memory_percent": 12, "memory_total_bytes": 85520809984, "memory_used_bytes": 21474836480,
     "memory_free_bytes": 64000000000, "memory_reserved_bytes": 566231040, "sm_clock_mhz": 1980,
     "memory_clock_mhz": 2619, "power_mw": 312000, "temperature_c": 54,
     "processes": [{"pid": 1234, "used_bytes": 1073741824, "client": "gpu0-engine", "client_id": 3, "role": "engine"},
                   {"pid": 5678, "used_bytes": 536870912, "client": null, "client_id": null, "role": null}],
     "errors": {}},
    {"index": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-2", "utilization_gpu_percent": 0,
     "utilization_memory_percent": 0, "memory_total_bytes": 85520809984, "memory_used_bytes": 0,
     "sm_clock_mhz": 345, "memory_clock_mhz": 2619, "power_mw": null, "temperature_c": 31,
     "processes": [], "errors": {"power": "nvmlDeviceGetPowerUsage: Not Supported (NVML error 3)"}}
  ]})j";

TEST(GpuRender, DevicesAndProcesses) {
  auto text = render("gpu", kReply, false);
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_THAT(*text, HasSubstr("NVML: libnvidia-ml.so.1, every 1000 ms, sampled 0.2s ago\n"));
  EXPECT_THAT(*text, HasSubstr("GPU  NAME                   UTIL%  MEM%      MEMORY  SM.MHZ  MEM.MHZ  POWER  TEMP\n"));
  EXPECT_THAT(*text, HasSubstr("  0  NVIDIA H100 80GB HBM3     37    12  20.0/79.6G    1980     2619   312W   54C\n"));
  EXPECT_THAT(*text, HasSubstr("  1  NVIDIA H100 80GB HBM3      0     0   0.0/79.6G     345     2619      -   31C\n"));
  EXPECT_THAT(*text, HasSubstr("GPU   PID  CLIENT       ROLE    MEMORY\n"));
  EXPECT_THAT(*text, HasSubstr("  0  1234  gpu0-engine  engine    1.0G\n"));
  EXPECT_THAT(*text, HasSubstr("  0  5678  -            -       512.0M\n"));
  EXPECT_THAT(*text, HasSubstr("not read:\n  gpu 1 power: nvmlDeviceGetPowerUsage: Not Supported (NVML error 3)\n"));
}

TEST(GpuRender, JsonIsTheDaemonsAnswer) {
  auto text = render("gpu", kReply, true);
  ASSERT_TRUE(text);
  EXPECT_EQ(json::parse(*text), json::parse(kReply));
}

TEST(GpuRender, NoDriverIsAMessageNotAFailure) {
  auto text = render(
      "gpu",
      R"j({"enabled": "auto", "available": false, "reason": "libnvidia-ml.so.1: not found — no NVIDIA driver (dlopen: x)",
          "devices": []})j",
      false);
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_EQ(*text, "NVML: unavailable (libnvidia-ml.so.1: not found — no NVIDIA driver (dlopen: x))\n");
  text = render("gpu", R"j({"available": false})j", false);
  ASSERT_TRUE(text);
  EXPECT_EQ(*text, "NVML: unavailable (the daemon did not say why)\n");
}

TEST(GpuRender, NoSampleYetAndAFailedSample) {
  auto text = render("gpu", R"j({"available": true, "library": "/x/libnvidia-ml.so.1", "interval_ms": 100,
                               "age_s": null, "devices": []})j",
                     false);
  ASSERT_TRUE(text);
  EXPECT_EQ(*text, "NVML: /x/libnvidia-ml.so.1, every 100 ms: no sample yet\n");
  text = render("gpu", R"j({"available": true, "library": "l", "interval_ms": 100, "age_s": 3.0,
                          "error": "nvmlDeviceGetCount_v2: GPU is lost (NVML error 15)", "devices": []})j",
                false);
  ASSERT_TRUE(text);
  EXPECT_THAT(*text, HasSubstr("latest sample failed: nvmlDeviceGetCount_v2: GPU is lost (NVML error 15)\n"));
  EXPECT_THAT(*text, HasSubstr("(none)"));
}

TEST(GpuRender, HostileOrPartialJson) {
  // Control characters cannot reach the terminal; wrong types are "-".
  auto text = render("gpu", R"j({"available": true, "library": "l", "interval_ms": 1, "age_s": 1,
                               "devices": [{"index": "x", "name": "evil\u001b[2J", "power_mw": "lots",
                                            "processes": [{"pid": 7, "client": "\u0007bell"}],
                                            "errors": {"power": 3}}]})j",
                     false);
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_THAT(*text, Not(HasSubstr("\x1b")));
  EXPECT_THAT(*text, Not(HasSubstr("\x07")));
  EXPECT_THAT(*text, HasSubstr("evil?[2J"));
  EXPECT_THAT(*text, HasSubstr("gpu x power: -"));
  EXPECT_FALSE(render("gpu", "[1, 2]", false));
  EXPECT_FALSE(render("gpu", "not json", false));
  auto no_devices = render("gpu", R"j({"available": true, "age_s": 1})j", false);
  ASSERT_FALSE(no_devices);
  EXPECT_EQ(no_devices.error().code(), EBADMSG);
}

TEST(GpuRender, GpuIsAKnownCommand) { EXPECT_TRUE(known_command("gpu")); }

}  // namespace
}  // namespace tandem::ctl
