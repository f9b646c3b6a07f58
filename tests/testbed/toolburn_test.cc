// tandem-toolburn (testbed/toolburn.h): flags and plan on strings, the report's
// JSON, and the real binary run for a fraction of a second.
#include "testbed/toolburn.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/host_memory.h"

namespace tandem::testbed {
namespace {

std::expected<BurnOptions, std::string> parse(std::vector<std::string_view> args) { return parse_burn_flags(args); }

std::expected<BurnPlan, std::string> plan(std::vector<std::string_view> args) {
  auto o = parse_burn_flags(args);
  if (!o) return std::unexpected(o.error());
  return plan_burn(*o);
}

TEST(BurnFlags, DefaultsAndBothSpellings) {
  auto o = parse({"--cpu-seconds", "0.5", "--wall-seconds", "2"});
  ASSERT_TRUE(o) << o.error();
  EXPECT_EQ(o->cpu_s, 0.5);
  EXPECT_EQ(o->wall_s, 2.0);
  EXPECT_EQ(o->mem_mb, 0u);
  EXPECT_DOUBLE_EQ(o->period_s, 0.020);
  EXPECT_FALSE(o->report);
  EXPECT_FALSE(o->help);

  o = parse({"--cpu-seconds=1.5", "--wall-seconds=3", "--mem-mb=64", "--period-ms=50", "--report"});
  ASSERT_TRUE(o) << o.error();
  EXPECT_EQ(o->cpu_s, 1.5);
  EXPECT_EQ(o->wall_s, 3.0);
  EXPECT_EQ(o->mem_mb, 64u);
  EXPECT_DOUBLE_EQ(o->period_s, 0.050);
  EXPECT_TRUE(o->report);

  o = parse({"--mem-mb", "8", "--period-ms", "5", "--wall-seconds", "1", "--cpu-seconds", "0"});
  ASSERT_TRUE(o) << o.error();
  EXPECT_EQ(o->mem_mb, 8u);
  EXPECT_DOUBLE_EQ(o->period_s, 0.005);

  // --help needs nothing else.
  o = parse({"--help"});
  ASSERT_TRUE(o) << o.error();
  EXPECT_TRUE(o->help);
  EXPECT_TRUE(parse({"-h"})->help);
  EXPECT_NE(burn_usage().find("--cpu-seconds"), std::string::npos);
}

TEST(BurnFlags, ErrorsNameTheFlagAndValue) {
  auto expect_names = [](std::vector<std::string_view> args, std::string_view flag, std::string_view value) {
    auto o = parse_burn_flags(args);
    ASSERT_FALSE(o) << "accepted";
    EXPECT_NE(o.error().find(flag), std::string::npos) << o.error();
    EXPECT_NE(o.error().find(value), std::string::npos) << o.error();
  };
  const std::string_view w = "--wall-seconds=1";
  expect_names({"--cpu-seconds", "abc", w}, "--cpu-seconds", "abc");
  expect_names({"--cpu-seconds=-1", w}, "--cpu-seconds", "-1");
  expect_names({"--cpu-seconds", "nan", w}, "--cpu-seconds", "nan");
  expect_names({"--cpu-seconds", "inf", w}, "--cpu-seconds", "inf");
  expect_names({"--cpu-seconds", "1e999", w}, "--cpu-seconds", "1e999");
  expect_names({"--cpu-seconds", "1s", w}, "--cpu-seconds", "1s");
  expect_names({"--cpu-seconds", "", w}, "--cpu-seconds", "''");
  expect_names({"--cpu-seconds=1", "--wall-seconds", "-0.5"}, "--wall-seconds", "-0.5");
  expect_names({"--cpu-seconds=1", w, "--mem-mb", "1048577"}, "--mem-mb", "1048577");
  expect_names({"--cpu-seconds=1", w, "--mem-mb", "-1"}, "--mem-mb", "-1");
  expect_names({"--cpu-seconds=1", w, "--mem-mb", "1.5"}, "--mem-mb", "1.5");
  expect_names({"--cpu-seconds=1", w, "--period-ms", "0"}, "--period-ms", "0");
  expect_names({"--cpu-seconds=1", w, "--period-ms", "10001"}, "--period-ms", "10001");
  expect_names({"--cpu-seconds=1", w, "--period-ms=-5"}, "--period-ms", "-5");
  expect_names({"--cpu-seconds=1", w, "--report=yes"}, "--report", "yes");
  expect_names({"--cpu-seconds=1", w, "--bogus", "3"}, "--bogus", "--bogus");
  expect_names({"--cpu-seconds=1", w, "stray"}, "stray", "stray");
  expect_names({w, "--cpu-seconds"}, "--cpu-seconds", "needs a value");
  expect_names({w}, "--cpu-seconds", "required");
  expect_names({"--cpu-seconds=1"}, "--wall-seconds", "required");
  EXPECT_TRUE(parse({"--cpu-seconds=0", "--wall-seconds=0", "--mem-mb=1048576"}));  // the bound itself is fine
}

TEST(BurnFlags, MemBurstAndItsBase) {
  auto o =
      parse({"--cpu-seconds=0", "--wall-seconds=1", "--mem-mb", "8", "--mem-burst", "0.1,0.05,0.2", "--mem-base-mb=2"});
  ASSERT_TRUE(o) << o.error();
  ASSERT_TRUE(o->burst);
  EXPECT_DOUBLE_EQ(o->burst->start_s, 0.1);
  EXPECT_DOUBLE_EQ(o->burst->ramp_s, 0.05);
  EXPECT_DOUBLE_EQ(o->burst->hold_s, 0.2);
  EXPECT_EQ(o->mem_base_mb, 2u);
  auto fails = [](std::vector<std::string_view> extra, std::string_view says) {
    std::vector<std::string_view> args = {"--cpu-seconds=0", "--wall-seconds=1", "--mem-mb=8"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = parse_burn_flags(args);
    ASSERT_FALSE(r) << "accepted";
    EXPECT_NE(r.error().find(says), std::string::npos) << r.error();
  };
  fails({"--mem-burst", "1,2"}, "'1,2' is not START,RAMP,HOLD");
  fails({"--mem-burst", "1,2,3,4"}, "'1,2,3,4' is not START,RAMP,HOLD");
  fails({"--mem-burst", "1,-2,3"}, "'-2' is negative");
  fails({"--mem-burst", "1,,3"}, "--mem-burst: '' is not a finite number");
  fails({"--mem-base-mb", "2"}, "--mem-base-mb needs --mem-burst");
  fails({"--mem-base-mb", "x"}, "--mem-base-mb: 'x'");
  // Between flags: plan_burn()'s.
  auto over = plan({"--cpu-seconds=0", "--wall-seconds=1", "--mem-mb=8", "--mem-burst", "0,0,1", "--mem-base-mb", "9"});
  ASSERT_FALSE(over);
  EXPECT_NE(over.error().find("--mem-base-mb 9 is above the peak --mem-mb 8"), std::string::npos) << over.error();
}

TEST(MemBurst, BytesFollowTheSimulatorsShape) {
  // tandem-sim's tool_memory_at (sim/host_memory.cc) with a base of 100 and a
  // peak of 500: base, a linear ramp, the peak, base again.
  const std::optional<MemBurst> b = MemBurst{1.0, 0.5, 2.0};
  EXPECT_EQ(burst_bytes_at(b, 100, 500, 0.0), 100u);
  EXPECT_EQ(burst_bytes_at(b, 100, 500, 0.99), 100u);
  EXPECT_EQ(burst_bytes_at(b, 100, 500, 1.25), 300u);
  EXPECT_EQ(burst_bytes_at(b, 100, 500, 1.5), 500u);
  EXPECT_EQ(burst_bytes_at(b, 100, 500, 3.49), 500u);
  EXPECT_EQ(burst_bytes_at(b, 100, 500, 3.5), 100u);
  // No ramp: straight to the peak; no burst at all: the peak throughout.
  EXPECT_EQ(burst_bytes_at(MemBurst{1.0, 0.0, 1.0}, 100, 500, 1.0), 500u);
  EXPECT_EQ(burst_bytes_at(std::nullopt, 100, 500, 0.0), 500u);
}

// The live tool's shape is the simulator's, side by side: tandem-agents
// gives a call the drawn peak, start, ramp and hold, and a base of
// kResidualShare of the peak; toolburn must then hold what tool_memory_at
// says, at every point of the call (toolburn links only the standard
// library, so the two are separate code that this keeps in step).
TEST(MemBurst, MatchesTheSimulatorsToolMemoryAtEveryPoint) {
  const sim::ToolMemDraw draws[] = {
      {512.0 * (1 << 20), 1.0, 0.5, 2.0},  // the usual shape
      {64.0 * (1 << 20), 0.0, 1.5, 1.0},   // a burst from the start
      {3.0 * (1u << 30), 7.25, 0.0, 1.5},  // no ramp: straight to the peak
      {100.0 * (1 << 20), 2.0, 1.0, 0.0},  // no hold: down as soon as it is up
  };
  for (const sim::ToolMemDraw& d : draws) {
    const MemBurst burst{d.start_s, d.ramp_s, d.burst_s};
    const auto peak = static_cast<std::size_t>(d.peak_bytes);
    const auto base = static_cast<std::size_t>(d.peak_bytes * sim::kResidualShare);
    for (double x = 0; x <= d.start_s + d.ramp_s + d.burst_s + 1.0; x += 0.0625) {
      const double want = sim::tool_memory_at(d, x);
      EXPECT_NEAR(static_cast<double>(burst_bytes_at(burst, base, peak, x)), want, 1.0)
          << "peak " << d.peak_bytes << " at progress " << x << " s";
    }
  }
}

TEST(BurnPlan, OneThreadWhenCpuFitsInWall) {
  auto p = plan({"--cpu-seconds=0.5", "--wall-seconds=1"});
  ASSERT_TRUE(p) << p.error();
  EXPECT_EQ(p->threads, 1u);
  EXPECT_EQ(p->cycles, 50u);
  EXPECT_DOUBLE_EQ(p->burn_per_cycle_s, 0.01);
  EXPECT_DOUBLE_EQ(p->sleep_per_cycle_s, 0.01);

  p = plan({"--cpu-seconds=1", "--wall-seconds=1"});  // X == Y: one busy thread, no sleep
  ASSERT_TRUE(p) << p.error();
  EXPECT_EQ(p->threads, 1u);
  EXPECT_DOUBLE_EQ(p->burn_per_cycle_s, 0.02);
  EXPECT_EQ(p->sleep_per_cycle_s, 0.0);
}

TEST(BurnPlan, ThreadsWhenCpuExceedsWall) {
  auto p = plan({"--cpu-seconds=2.5", "--wall-seconds=1"});
  ASSERT_TRUE(p) << p.error();
  EXPECT_EQ(p->threads, 3u);
  EXPECT_EQ(p->cycles, 50u);
  EXPECT_DOUBLE_EQ(p->burn_per_cycle_s, 2.5 / (50 * 3));
  EXPECT_NEAR(p->sleep_per_cycle_s, 0.02 - 2.5 / 150, 1e-12);
  // Totals: each thread's burns and sleeps add up to Y, all burns to X.
  EXPECT_NEAR(p->cycles * (p->burn_per_cycle_s + p->sleep_per_cycle_s), 1.0, 1e-9);
  EXPECT_NEAR(p->cycles * p->threads * p->burn_per_cycle_s, 2.5, 1e-9);

  p = plan({"--cpu-seconds=64", "--wall-seconds=1"});
  ASSERT_TRUE(p) << p.error();
  EXPECT_EQ(p->threads, 64u);
  EXPECT_EQ(p->sleep_per_cycle_s, 0.0);

  auto bad = plan({"--cpu-seconds=64.5", "--wall-seconds=1"});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("--cpu-seconds 64.5"), std::string::npos) << bad.error();
  EXPECT_NE(bad.error().find("65 threads"), std::string::npos) << bad.error();
}

TEST(BurnPlan, CyclesRound) {
  EXPECT_EQ(plan({"--cpu-seconds=0", "--wall-seconds=0.03"})->cycles, 2u);   // 1.5 rounds up
  EXPECT_EQ(plan({"--cpu-seconds=0", "--wall-seconds=0.029"})->cycles, 1u);  // 1.45 rounds down
  EXPECT_EQ(plan({"--cpu-seconds=0", "--wall-seconds=1.009"})->cycles, 50u);
  EXPECT_EQ(plan({"--cpu-seconds=0", "--wall-seconds=1.011"})->cycles, 51u);
  EXPECT_EQ(plan({"--cpu-seconds=0", "--wall-seconds=1", "--period-ms=100"})->cycles, 10u);
  EXPECT_EQ(plan({"--cpu-seconds=0", "--wall-seconds=1", "--period-ms=3"})->cycles, 333u);

  auto bad = plan({"--cpu-seconds=0", "--wall-seconds=1e300"});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("--wall-seconds 1e+300"), std::string::npos) << bad.error();
}

TEST(BurnPlan, TinyWallIsOneCycle) {
  auto p = plan({"--cpu-seconds=0.001", "--wall-seconds=0.002"});
  ASSERT_TRUE(p) << p.error();
  EXPECT_EQ(p->threads, 1u);
  EXPECT_EQ(p->cycles, 1u);
  EXPECT_DOUBLE_EQ(p->burn_per_cycle_s, 0.001);
  EXPECT_DOUBLE_EQ(p->sleep_per_cycle_s, 0.001);

  p = plan({"--cpu-seconds=0", "--wall-seconds=0"});  // nothing at all to do
  ASSERT_TRUE(p) << p.error();
  EXPECT_EQ(p->cycles, 1u);
  EXPECT_EQ(p->burn_per_cycle_s, 0.0);
  EXPECT_EQ(p->sleep_per_cycle_s, 0.0);
}

TEST(BurnPlan, NoCpuOnlySleeps) {
  auto p = plan({"--cpu-seconds=0", "--wall-seconds=2"});
  ASSERT_TRUE(p) << p.error();
  EXPECT_EQ(p->threads, 1u);
  EXPECT_EQ(p->cycles, 100u);
  EXPECT_EQ(p->burn_per_cycle_s, 0.0);
  EXPECT_DOUBLE_EQ(p->sleep_per_cycle_s, 0.02);
}

TEST(BurnPlan, CpuWithoutWallIsAnError) {
  auto bad = plan({"--cpu-seconds=0.5", "--wall-seconds=0"});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("--wall-seconds"), std::string::npos) << bad.error();
  EXPECT_NE(bad.error().find("--cpu-seconds 0.5"), std::string::npos) << bad.error();

  BurnOptions o;  // built in code, not parsed: checked all the same
  o.cpu_s = -1;
  o.wall_s = 1;
  EXPECT_FALSE(plan_burn(o));
  o.cpu_s = 0;
  o.period_s = 0;
  EXPECT_FALSE(plan_burn(o));
}

TEST(BurnReport, JsonEscapesAndParses) {
  EXPECT_EQ(json_quote("0::/a.slice"), "\"0::/a.slice\"");
  EXPECT_EQ(json_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(json_quote(std::string_view("x\ny\x01", 4)), "\"x\\ny\\u0001\"");

  BurnReport r;
  r.wall_s = 1.25;
  r.cpu_s = 0.5;
  r.mem_mb = 8;
  r.threads = 2;
  r.cycles = 50;
  r.cgroup = {"0::/user.slice/\"odd\\name\"", "1:name=systemd:/x"};
  const std::string line = burn_report_json(r);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const auto j = nlohmann::json::parse(line);
  EXPECT_DOUBLE_EQ(j.at("wall_s").get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(j.at("cpu_s").get<double>(), 0.5);
  EXPECT_EQ(j.at("mem_mb").get<int>(), 8);
  EXPECT_EQ(j.at("threads").get<int>(), 2);
  EXPECT_EQ(j.at("cycles").get<int>(), 50);
  EXPECT_EQ(j.at("cgroup").get<std::vector<std::string>>(), r.cgroup);
}

TEST(BurnReport, SplitLines) {
  EXPECT_EQ(split_lines(""), std::vector<std::string>{});
  EXPECT_EQ(split_lines("0::/a\n"), std::vector<std::string>{"0::/a"});
  EXPECT_EQ(split_lines("a\nb"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(split_lines("a\n\nb\n"), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_TRUE(read_lines("/nonexistent/toolburn").empty());
}

TEST(BurnRunner, BurnsThreadCpu) {
  const double start = thread_cpu_seconds();
  burn_thread_cpu_until(start + 0.02);
  EXPECT_GE(thread_cpu_seconds() - start, 0.02);
}

// Whether [addr, addr + bytes) is mapped, and how many of its pages are resident.
std::expected<std::size_t, int> resident_pages(const void* addr, std::size_t bytes) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((bytes + page - 1) / page);
  if (mincore(const_cast<void*>(addr), bytes, vec.data()) != 0) return std::unexpected(errno);
  std::size_t n = 0;
  for (const unsigned char v : vec) n += v & 1;
  return n;
}

TEST(TouchedMemory, IsResidentAndOwned) {
  auto none = TouchedMemory::create(0);
  ASSERT_TRUE(none) << none.error();
  EXPECT_EQ(none->data(), nullptr);
  EXPECT_EQ(none->size(), 0u);
  EXPECT_FALSE(TouchedMemory::create(kMaxBurnMemMb + 1));

  auto a = TouchedMemory::create(2);
  ASSERT_TRUE(a) << a.error();
  ASSERT_EQ(a->size(), std::size_t{2} << 20);
  const void* a_addr = a->data();
  auto pages = resident_pages(a_addr, a->size());
  ASSERT_TRUE(pages);
  EXPECT_EQ(*pages * static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), a->size());

  TouchedMemory b = std::move(*a);  // a move leaves the source empty
  EXPECT_EQ(a->data(), nullptr);    // NOLINT(bugprone-use-after-move): checking exactly that
  EXPECT_EQ(b.data(), a_addr);

  auto c = TouchedMemory::create(1);
  ASSERT_TRUE(c) << c.error();
  const void* c_addr = c->data();
  b = std::move(*c);  // move over a live one unmaps the old mapping
  EXPECT_EQ(b.data(), c_addr);
  const auto gone = resident_pages(a_addr, std::size_t{2} << 20);
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error(), ENOMEM);

  auto& self = b;
  b = std::move(self);  // self-move keeps it
  EXPECT_EQ(b.data(), c_addr);
  EXPECT_TRUE(resident_pages(c_addr, b.size()));
}

TEST(TouchedMemory, HoldsWhatItIsToldAndGivesTheRestBack) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  auto m = TouchedMemory::create(8, 2);
  ASSERT_TRUE(m) << m.error();
  ASSERT_EQ(m->size(), 8 * kMiB);
  EXPECT_EQ(m->resident(), 2 * kMiB);
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  auto resident = [&] {
    auto p = resident_pages(m->data(), m->size());
    return p ? *p * page : std::size_t{0};
  };
  // Huge pages may make up to one more 2 MiB page resident than was touched.
  EXPECT_GE(resident(), 2 * kMiB);
  EXPECT_LE(resident(), 4 * kMiB);
  m->hold(6 * kMiB);
  EXPECT_EQ(m->resident(), 6 * kMiB);
  EXPECT_GE(resident(), 6 * kMiB);
  m->hold(1 * kMiB);
  EXPECT_EQ(m->resident(), 1 * kMiB);
  EXPECT_LE(resident(), 3 * kMiB);  // the rest was given back
  m->hold(100 * kMiB);              // at most the mapping
  EXPECT_EQ(m->resident(), 8 * kMiB);
}

TEST(BurnRunner, RunsThePlanOnItsThreads) {
  BurnPlan plan;
  plan.threads = 3;
  plan.cycles = 2;
  plan.burn_per_cycle_s = 0.01;
  plan.sleep_per_cycle_s = 0.005;
  const double caller = thread_cpu_seconds();
  const double process = process_cpu_seconds();
  ASSERT_TRUE(run_burn(plan, caller));
  EXPECT_GE(thread_cpu_seconds() - caller, 0.02);     // this thread's share
  EXPECT_GE(process_cpu_seconds() - process, 0.055);  // all three shares, less rusage's rounding

  plan.threads = 0;
  auto bad = run_burn(plan, caller);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("threads"), std::string::npos) << bad.error();
}

// The real binary: exit status, stdout and stderr.
struct Outcome {
  int status = -1;  // exit status; -1: did not exit normally
  std::string out;
  std::string err;
  long max_rss_kib = 0;  // the child's peak resident set (wait4)
};

std::string read_all(int fd) {
  std::string s;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      s.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  return s;
}

Outcome run_toolburn(std::vector<std::string> args) {
  args.insert(args.begin(), TANDEM_TOOLBURN);
  int out[2];
  int err[2];
  Outcome o;
  if (pipe2(out, O_CLOEXEC) != 0) return o;
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return o;
  }
  std::vector<char*> argv;  // built before fork(): the child only dup2()s and execs
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  if (pid > 0) {
    // The outputs are a line or two each, far below a pipe's capacity, so
    // reading one to its end before the other cannot block the child.
    o.out = read_all(out[0]);
    o.err = read_all(err[0]);
    int status = 0;
    rusage ru{};
    if (wait4(pid, &status, 0, &ru) == pid && WIFEXITED(status)) o.status = WEXITSTATUS(status);
    o.max_rss_kib = ru.ru_maxrss;
  }
  close(out[0]);
  close(err[0]);
  return o;
}

TEST(ToolburnBinary, BurnsSleepsAndReports) {
  const Outcome o = run_toolburn({"--cpu-seconds", "0.05", "--wall-seconds", "0.2", "--mem-mb", "8", "--report"});
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_EQ(o.err, "");
  ASSERT_FALSE(o.out.empty());
  EXPECT_EQ(o.out.back(), '\n');
  EXPECT_EQ(o.out.find('\n'), o.out.size() - 1) << "more than one line: " << o.out;
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_GE(j.at("wall_s").get<double>(), 0.2);
  EXPECT_LT(j.at("wall_s").get<double>(), 20.0);  // sanity only: machines are noisy
  EXPECT_GE(j.at("cpu_s").get<double>(), 0.05);
  EXPECT_EQ(j.at("mem_mb").get<int>(), 8);
  EXPECT_EQ(j.at("threads").get<int>(), 1);
  EXPECT_EQ(j.at("cycles").get<int>(), 10);
  ASSERT_TRUE(j.at("cgroup").is_array());
  EXPECT_FALSE(j.at("cgroup").empty()) << o.out;
  for (const auto& line : j.at("cgroup")) EXPECT_TRUE(line.is_string());
}

TEST(ToolburnBinary, AMemoryBurstReachesItsPeakOnlyWhenTheCallGetsThere) {
  // 64 MiB peak, 16 MiB base. A burst 0.05 s into a 0.3 s call reaches the
  // peak; one drawn after the call's end never does.
  auto run = [](std::string burst) {
    return run_toolburn({"--cpu-seconds", "0.01", "--wall-seconds", "0.3", "--mem-mb", "64", "--mem-base-mb", "16",
                         "--mem-burst", std::move(burst)});
  };
  const Outcome reached = run("0.05,0.02,0.05");
  ASSERT_EQ(reached.status, 0) << reached.err;
  EXPECT_GE(reached.max_rss_kib, 64L * 1024);
  const Outcome never = run("10,0,1");
  ASSERT_EQ(never.status, 0) << never.err;
  EXPECT_GE(never.max_rss_kib, 16L * 1024);
  EXPECT_LT(never.max_rss_kib, 40L * 1024);  // the base (16 MiB, 18 with huge pages) and the binary
}

TEST(ToolburnBinary, NoReportNoOutput) {
  const Outcome o = run_toolburn({"--cpu-seconds=0", "--wall-seconds=0"});
  EXPECT_EQ(o.status, 0) << o.err;
  EXPECT_EQ(o.out, "");
  EXPECT_EQ(o.err, "");
}

TEST(ToolburnBinary, BadFlagExits2NamingIt) {
  Outcome o = run_toolburn({"--cpu-seconds", "0.05", "--wall-seconds", "0.2", "--mem-mb", "lots", "--report"});
  EXPECT_EQ(o.status, 2);
  EXPECT_EQ(o.out, "");  // nothing was done, nothing reported
  EXPECT_EQ(o.err.rfind("tandem-toolburn: ", 0), 0u) << o.err;
  EXPECT_NE(o.err.find("--mem-mb"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("lots"), std::string::npos) << o.err;

  o = run_toolburn({"--cpu-seconds", "100", "--wall-seconds", "1"});  // 100 threads
  EXPECT_EQ(o.status, 2);
  EXPECT_NE(o.err.find("--cpu-seconds 100"), std::string::npos) << o.err;
}

TEST(ToolburnBinary, HelpExits0) {
  const Outcome o = run_toolburn({"--help"});
  EXPECT_EQ(o.status, 0);
  EXPECT_NE(o.out.find("usage: tandem-toolburn"), std::string::npos) << o.out;
}

}  // namespace
}  // namespace tandem::testbed
