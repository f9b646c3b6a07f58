// The cgroupfs and procfs parsers on the texts real kernels write.
#include "cpu/parse.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace tandem::cpu {
namespace {

TEST(Psi, NodeCpuWithAndWithoutFull) {
  auto p = parse_psi(
      "some avg10=1.50 avg60=0.25 avg300=0.05 total=3972526607\n"
      "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n");
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_DOUBLE_EQ(p->some.avg10, 1.5);
  EXPECT_DOUBLE_EQ(p->some.avg60, 0.25);
  EXPECT_DOUBLE_EQ(p->some.avg300, 0.05);
  EXPECT_EQ(p->some.total_us, 3972526607u);
  ASSERT_TRUE(p->full.has_value());
  EXPECT_EQ(p->full->total_us, 0u);

  auto old = parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=12\n");  // node cpu before 5.13
  ASSERT_TRUE(old);
  EXPECT_FALSE(old->full.has_value());
}

TEST(Psi, UnknownFieldsAreSkippedMissingOnesAreErrors) {
  EXPECT_TRUE(parse_psi("some avg10=0.1 avg60=0.2 avg300=0.3 avg900=0.4 total=5"));
  auto missing = parse_psi("some avg10=0.1 avg60=0.2 total=5");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message().find("lacks"), std::string::npos);
  EXPECT_FALSE(parse_psi(""));
  EXPECT_FALSE(parse_psi("full avg10=0 avg60=0 avg300=0 total=0"));  // no 'some'
  EXPECT_FALSE(parse_psi("some avg10=abc avg60=0 avg300=0 total=0"));
  EXPECT_FALSE(parse_psi("some avg10=101 avg60=0 avg300=0 total=0"));
  EXPECT_FALSE(parse_psi("some avg10 avg60=0 avg300=0 total=0"));
  EXPECT_FALSE(parse_psi("most avg10=0 avg60=0 avg300=0 total=0"));
}

TEST(CpuStat, V2AndV1) {
  auto v2 = parse_cpu_stat(
      "usage_usec 1000\nuser_usec 600\nsystem_usec 400\ncore_sched.force_idle_usec 0\n"
      "nr_periods 10\nnr_throttled 3\nthrottled_usec 2500\nnr_bursts 0\nburst_usec 0\n");
  ASSERT_TRUE(v2) << v2.error().message();
  EXPECT_EQ(v2->usage_us, 1000u);
  EXPECT_EQ(v2->user_us, 600u);
  EXPECT_EQ(v2->system_us, 400u);
  EXPECT_EQ(v2->nr_periods, 10u);
  EXPECT_EQ(v2->nr_throttled, 3u);
  EXPECT_EQ(v2->throttled_us, 2500u);

  auto v1 = parse_cpu_stat("nr_periods 4\nnr_throttled 1\nthrottled_time 7000000\n");
  ASSERT_TRUE(v1);
  EXPECT_EQ(v1->throttled_us, 7000u);
  EXPECT_EQ(v1->usage_us, 0u);
  auto usage = parse_cpuacct_usage_ns("123456789\n");
  ASSERT_TRUE(usage);
  EXPECT_EQ(*usage, 123456789u);
}

TEST(CpuStat, BadValuesNameTheKey) {
  auto r = parse_cpu_stat("usage_usec lots\n");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("usage_usec"), std::string::npos) << r.error().message();
  EXPECT_FALSE(parse_cpu_stat("usage_usec\n"));
  EXPECT_FALSE(parse_cpuacct_usage_ns("-1"));
}

TEST(MemoryEvents, Counters) {
  auto e = parse_memory_events("low 0\nhigh 12\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n");
  ASSERT_TRUE(e) << e.error().message();
  EXPECT_EQ(e->high, 12u);
  EXPECT_EQ(e->max, 3u);
  EXPECT_EQ(e->oom, 1u);
  EXPECT_EQ(e->oom_kill, 1u);
  EXPECT_FALSE(parse_memory_events("high twelve\n"));
}

TEST(CpuMax, ParseAndFormat) {
  auto unlimited = parse_cpu_max("max 100000\n");
  ASSERT_TRUE(unlimited);
  EXPECT_FALSE(unlimited->quota_us.has_value());
  EXPECT_EQ(unlimited->period_us, 100000u);
  auto half = parse_cpu_max("50000 100000");
  ASSERT_TRUE(half);
  EXPECT_EQ(half->quota_us, 50000u);
  EXPECT_FALSE(parse_cpu_max("50000"));
  EXPECT_FALSE(parse_cpu_max("50000 0"));
  EXPECT_FALSE(parse_cpu_max("half 100000"));

  EXPECT_EQ(format_cpu_max(*half).value(), "50000 100000");
  EXPECT_EQ(format_cpu_max(*unlimited).value(), "max 100000");
  EXPECT_EQ(parse_cpu_max(format_cpu_max(*half).value()).value(), *half);
  EXPECT_FALSE(format_cpu_max(CpuMax{500, 100000}));        // under the kernel's 1 ms minimum
  EXPECT_FALSE(format_cpu_max(CpuMax{std::nullopt, 999}));  // period too short
  EXPECT_FALSE(format_cpu_max(CpuMax{std::nullopt, 2'000'000}));
}

TEST(ProcCgroup, HybridV1AndV2) {
  auto m = parse_proc_cgroup(
      "9:name=systemd:/\n"
      "4:memory:/process_api/5f094cd4\n"
      "2:cpu,cpuacct:/a:b\n"
      "0::/\n");
  ASSERT_TRUE(m) << m.error().message();
  ASSERT_EQ(m->size(), 4u);
  EXPECT_EQ((*m)[0].controllers, std::vector<std::string>{"name=systemd"});
  EXPECT_EQ((*m)[1].hierarchy, 4u);
  EXPECT_EQ((*m)[1].path, "/process_api/5f094cd4");
  EXPECT_EQ((*m)[2].controllers, (std::vector<std::string>{"cpu", "cpuacct"}));
  EXPECT_EQ((*m)[2].path, "/a:b");
  EXPECT_EQ((*m)[3].hierarchy, 0u);
  EXPECT_TRUE((*m)[3].controllers.empty());

  EXPECT_FALSE(parse_proc_cgroup("4:memory\n"));
  EXPECT_FALSE(parse_proc_cgroup("x:memory:/\n"));
  EXPECT_FALSE(parse_proc_cgroup("4:memory:relative\n"));
}

// This machine's own files, where it has them.
std::string slurp(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(RealKernel, ParsesThisMachinesFiles) {
  const std::string psi = slurp("/proc/pressure/cpu");
  const std::string cgroup = slurp("/proc/self/cgroup");
  if (psi.empty() || cgroup.empty()) GTEST_SKIP() << "no /proc/pressure/cpu or /proc/self/cgroup here";
  auto p = parse_psi(psi);
  EXPECT_TRUE(p) << p.error().message() << "\n" << psi;
  auto m = parse_proc_cgroup(cgroup);
  ASSERT_TRUE(m) << m.error().message() << "\n" << cgroup;
  EXPECT_FALSE(m->empty());
}

}  // namespace
}  // namespace tandem::cpu
