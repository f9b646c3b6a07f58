// tandem-agents' pure parts (testbed/replay.h) and its output
// (testbed/replay_report.h): flags, tool steps, the daemon config of a
// compressed run (checked by tandemd's own parser), metrics in trace
// seconds, and the comparison of run files.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon/config.h"
#include "tandem/tandem.h"
#include "testbed/replay.h"
#include "testbed/replay_report.h"

namespace tandem::testbed {
namespace {

std::expected<ReplayFlags, std::string> parse(std::vector<std::string_view> args) { return parse_replay_flags(args); }

TEST(ReplayFlags, RunNeedsAWorkloadAndToolCores) {
  auto f =
      parse({"run", "--trace", "t.jsonl", "--tool-cores", "1", "--compress=16", "--sessions", "40", "--fixed-rate"});
  ASSERT_TRUE(f) << f.error();
  EXPECT_EQ(f->mode, ReplayFlags::Mode::kRun);
  EXPECT_EQ(f->trace, "t.jsonl");
  EXPECT_EQ(f->compress, 16);
  EXPECT_EQ(f->sessions, 40u);
  EXPECT_FALSE(f->poisson);
  EXPECT_EQ(f->rate, 0.03);

  auto none = parse({"run", "--tool-cores", "1"});
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().find("--trace or --synthetic"), std::string::npos) << none.error();
  auto both = parse({"run", "--trace", "a", "--synthetic", "b", "--tool-cores", "1"});
  EXPECT_FALSE(both);
  auto cores = parse({"run", "--synthetic", "agentic"});
  ASSERT_FALSE(cores);
  EXPECT_NE(cores.error().find("--tool-cores"), std::string::npos);
}

// The prediction models the memory controller tandemd has (SimConfig::memory_v1).
TEST(MemoryOnV1, ReadsTheControllersOfTandemdsCgroups) {
  EXPECT_TRUE(
      memory_on_v1("v2 cpuacct,freezer /sys/fs/cgroup/unified/t; v1 cpu /sys/fs/cgroup/cpu/t; "
                   "v1 memory /sys/fs/cgroup/memory/a/t; v1 pids /sys/fs/cgroup/pids/t"));
  EXPECT_TRUE(memory_on_v1("v1 cpu,cpuacct /c/t; v1 memory,pids /m/t"));
  EXPECT_FALSE(memory_on_v1("v2 cpu,memory,pids /sys/fs/cgroup/t"));
  EXPECT_FALSE(memory_on_v1("v1 cpu /c/t; v2 memory /u/t"));
  EXPECT_FALSE(memory_on_v1("v1 memorylike /x"));
  EXPECT_FALSE(memory_on_v1("off"));
  EXPECT_FALSE(memory_on_v1(""));
}

TEST(ReplayFlags, ErrorsNameTheFlag) {
  const std::vector<std::vector<std::string_view>> bad = {
      {"run", "--synthetic", "a", "--tool-cores", "1", "--rate", "0"},
      {"run", "--synthetic", "a", "--tool-cores", "1", "--rate", "fast"},
      {"run", "--synthetic", "a", "--tool-cores", "-1"},
      {"run", "--synthetic", "a", "--tool-cores", "1", "--compress", "5000"},
      {"run", "--synthetic", "a", "--tool-cores", "1", "--sessions", "0"},
      {"run", "--synthetic", "a", "--tool-cores", "1", "--url", "localhost:8000"},
      {"run", "--synthetic", "a", "--tool-cores", "1", "--timeout"},
      {"run", "--synthetic", "a", "--tool-cores", "1", "--quiet=yes"},
  };
  const std::vector<std::string> names = {"--rate",     "--rate", "--tool-cores", "--compress",
                                          "--sessions", "--url",  "--timeout",    "--quiet"};
  for (std::size_t i = 0; i < bad.size(); ++i) {
    auto f = parse(bad[i]);
    ASSERT_FALSE(f) << names[i];
    EXPECT_NE(f.error().find(names[i]), std::string::npos) << f.error();
  }
  auto other_mode = parse({"compare", "a.json", "--rate", "1"});
  ASSERT_FALSE(other_mode);
  EXPECT_NE(other_mode.error().find("'--rate' for 'compare'"), std::string::npos) << other_mode.error();
  auto cmd = parse({"replay"});
  ASSERT_FALSE(cmd);
  EXPECT_NE(cmd.error().find("'replay'"), std::string::npos);
  EXPECT_FALSE(parse({}));
  auto subtree = parse({"daemon-config", "--policy", "fcfs", "--subtree", "a/b"});
  ASSERT_FALSE(subtree);
  EXPECT_NE(subtree.error().find("--subtree"), std::string::npos);
}

TEST(ReplayFlags, CompareAndDaemonConfig) {
  auto c = parse({"compare", "a.json", "b.json", "--json", "out.json", "--plot=p.png"});
  ASSERT_TRUE(c) << c.error();
  EXPECT_EQ(c->inputs, (std::vector<std::string>{"a.json", "b.json"}));
  EXPECT_EQ(c->json, "out.json");
  EXPECT_EQ(c->plot, "p.png");
  EXPECT_FALSE(parse({"compare"}));

  auto d = parse({"daemon-config", "--policy", "tandem", "--compress", "16", "--tool-cpus", "1"});
  ASSERT_TRUE(d) << d.error();
  EXPECT_EQ(d->policy, "tandem");
  EXPECT_EQ(d->compress, 16);
  EXPECT_EQ(d->tool_cpus, "1");
  EXPECT_FALSE(parse({"daemon-config"}));
  EXPECT_EQ(parse({"run", "--help"})->mode, ReplayFlags::Mode::kHelp);
}

// Host memory (issue 22): drawn tool peaks for the run, a policy's
// parameters for the run's prediction and tandemd, and the tools' budget.
TEST(ReplayFlags, HostMemoryAndPolicyParameters) {
  auto f = parse({"run", "--synthetic", "agentic", "--tool-cores", "1", "--tool-mem", "pytest=900,*=20",
                  "--tool-mem-scale", "2", "--host-mem-gib", "0.5", "--retry-delay=0", "--param", "host_admission=0"});
  ASSERT_TRUE(f) << f.error();
  EXPECT_EQ(f->tool_mem, "pytest=900,*=20");
  EXPECT_EQ(f->tool_mem_scale, 2);
  EXPECT_EQ(f->host_mem_gib, 0.5);
  EXPECT_EQ(f->retry_delay_s, 0);
  EXPECT_EQ(f->params, (std::map<std::string, double>{{"host_admission", 0}}));
  auto d = parse({"daemon-config", "--policy", "tandem", "--param", "host_admission=0", "--tools-budget-mib", "512"});
  ASSERT_TRUE(d) << d.error();
  EXPECT_EQ(d->tools_budget_mib, 512u);
  EXPECT_EQ(d->params.at("host_admission"), 0);
  // The run takes it too: the prediction's host rules get tandemd's budget.
  auto r = parse({"run", "--synthetic", "agentic", "--tool-cores", "1", "--tools-budget-mib", "512"});
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(r->tools_budget_mib, 512u);

  const std::vector<std::pair<std::vector<std::string_view>, std::string>> bad = {
      {{"run", "--synthetic", "a", "--tool-cores", "1", "--tool-mem", "pytest=lots"}, "--tool-mem"},
      {{"run", "--synthetic", "a", "--tool-cores", "1", "--tool-mem-scale", "0"}, "--tool-mem-scale"},
      {{"run", "--synthetic", "a", "--tool-cores", "1", "--param", "host_admission"}, "--param"},
      {{"run", "--synthetic", "a", "--tool-cores", "1", "--param", "=1"}, "--param"},
      {{"run", "--synthetic", "a", "--tool-cores", "1", "--param", "x=nan"}, "--param"},
      {{"daemon-config", "--policy", "fcfs", "--tools-budget-mib", "lots"}, "--tools-budget-mib"},
      {{"run", "--synthetic", "a", "--tool-cores", "1", "--tools-budget-mib", "-1"}, "--tools-budget-mib"},
  };
  for (const auto& [args, name] : bad) {
    auto e = parse(args);
    ASSERT_FALSE(e) << name;
    EXPECT_NE(e.error().find(name), std::string::npos) << e.error();
  }
}

TEST(DaemonConfigTest, ParametersAsGivenAndTheToolsBudgetReachTandemd) {
  auto c = daemon_config("tandem", 16, "", "", nullptr, {{"host_admission", 0}}, 512);
  ASSERT_TRUE(c) << c.error();
  EXPECT_EQ(c->params.at("host_admission"), 0);
  auto parsed = daemon::parse_config(c->toml, "daemon-config");
  ASSERT_TRUE(parsed) << parsed.error().message() << "\n" << c->toml;
  EXPECT_DOUBLE_EQ(parsed->policy_params.at("host_admission"), 0);
  EXPECT_DOUBLE_EQ(parsed->policy_params.at("horizon_s"), 1.0 / 16) << "the others still compressed";
  EXPECT_EQ(parsed->host.tools_budget, std::uint64_t{512} << 20);

  auto unknown = daemon_config("tandem", 1, "", "", nullptr, {{"nope", 1}});
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().find("'nope'"), std::string::npos) << unknown.error();
  auto range = daemon_config("tandem", 1, "", "", nullptr, {{"host_admission", 7}});
  ASSERT_FALSE(range);
  EXPECT_NE(range.error().find("host_admission"), std::string::npos) << range.error();
  auto none = daemon_config("fcfs", 1, "", "");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->toml.find("[memory]"), std::string::npos);
}

TEST(ToolStepTest, DemandSetsCpuAndMemoryCompressionTheTime) {
  sim::ToolCpuTable cpus;
  ASSERT_TRUE(cpus.apply("pytest=1,Read=0.05,*=0.5"));
  sim::RoundSpec r;
  r.tool = "pytest";
  r.tool_seconds = 3.2;
  ToolStep t = tool_step(r, cpus, 16, 64);
  EXPECT_DOUBLE_EQ(t.wall_s, 0.2);
  EXPECT_DOUBLE_EQ(t.cpu_s, 0.2);
  EXPECT_EQ(t.mem_mb, 64u);
  r.tool = "Read";
  t = tool_step(r, cpus, 16, 64);
  EXPECT_DOUBLE_EQ(t.cpu_s, 0.05 * 0.2);
  EXPECT_EQ(t.mem_mb, 3u);  // round(0.05 · 64)
  r.tool = "unknown-kind";
  t = tool_step(r, cpus, 1, 64);
  EXPECT_DOUBLE_EQ(t.cpu_s, 0.5 * 3.2);
  EXPECT_EQ(tool_step(r, cpus, 1, 0).mem_mb, 0u);
  r.tool_seconds = 0;
  EXPECT_EQ(tool_step(r, cpus, 1, 64).wall_s, 0);
}

TEST(DaemonConfigTest, DividesDurationsAndCostsAndTandemdAcceptsIt) {
  auto c = daemon_config("tandem", 16, "tandem-replay.x", "1");
  ASSERT_TRUE(c) << c.error();
  EXPECT_EQ(c->tick_ms, 3u);  // round(50 / 16)
  EXPECT_DOUBLE_EQ(c->params.at("horizon_s"), 1.0 / 16);
  EXPECT_DOUBLE_EQ(c->params.at("initial_pin_s"), 2.0 / 16);
  EXPECT_DOUBLE_EQ(c->params.at("prefill_us_per_token"), 20.0 / 16);
  EXPECT_DOUBLE_EQ(c->params.at("control_interval_s"), 0.2 / 16);
  EXPECT_FALSE(c->params.contains("full_price")) << "a price per block-second is a ratio: not compressed";
  EXPECT_FALSE(c->params.contains("window_max"));
  EXPECT_TRUE(c->clamped.empty());

  auto parsed = daemon::parse_config(c->toml, "daemon-config");
  ASSERT_TRUE(parsed) << parsed.error().message() << "\n" << c->toml;
  EXPECT_EQ(parsed->policy, "tandem");
  EXPECT_EQ(parsed->tick, std::chrono::milliseconds(3));
  EXPECT_DOUBLE_EQ(parsed->policy_params.at("horizon_s"), 1.0 / 16);
  EXPECT_EQ(parsed->host.subtree, "tandem-replay.x");
  EXPECT_EQ(parsed->host.tool_cpus, "1");

  // 0.2 s / 50 is below control_interval_s's minimum: held there, and said.
  auto strong = daemon_config("tandem", 50, "", "");
  ASSERT_TRUE(strong);
  EXPECT_DOUBLE_EQ(strong->params.at("control_interval_s"), 0.01);
  ASSERT_FALSE(strong->clamped.empty());
  EXPECT_NE(strong->clamped.front().find("control_interval_s"), std::string::npos);
  EXPECT_TRUE(daemon::parse_config(strong->toml, "strong"));

  // Costs in seconds per token are times too: InferCept's TTL and waste
  // terms, Continuum's reload cost.
  auto infercept = daemon_config("infercept", 16, "", "");
  ASSERT_TRUE(infercept);
  EXPECT_DOUBLE_EQ(infercept->params.at("fwd_s_per_token"), 2e-4 / 16);
  EXPECT_DOUBLE_EQ(infercept->params.at("swap_s_per_token"), 4e-5 / 16);
  EXPECT_DOUBLE_EQ(infercept->params.at("min_pin_s"), 0.01 / 16);
  EXPECT_FALSE(infercept->params.contains("swap_free_tokens")) << "a token count: not compressed";
  auto continuum = daemon_config("continuum", 16, "", "");
  ASSERT_TRUE(continuum);
  EXPECT_DOUBLE_EQ(continuum->params.at("reload_s_per_token"), 2e-4 / 16);
  EXPECT_DOUBLE_EQ(continuum->params.at("threshold_s"), 2.0 / 16);
  EXPECT_FALSE(continuum->params.contains("sample_window"));

  auto fcfs = daemon_config("fcfs", 1, "", "");
  ASSERT_TRUE(fcfs);
  EXPECT_TRUE(fcfs->params.empty());
  EXPECT_EQ(fcfs->tick_ms, 50u);
  EXPECT_EQ(fcfs->toml.find("[policy.params]"), std::string::npos);
  EXPECT_TRUE(daemon::parse_config(fcfs->toml, "fcfs"));

  auto unknown = daemon_config("lifo", 1, "", "");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().find("lifo"), std::string::npos);
  EXPECT_NE(unknown.error().find("tandem"), std::string::npos) << "lists the known ones";
}

SessionLog session(double arrival, double finish, bool complete) {
  SessionLog s;
  s.name = "s";
  s.arrival_s = arrival;
  s.finish_s = finish;
  s.complete = complete;
  s.rounds = {{arrival, arrival + 0.01, arrival + 0.5, 100, 0}, {arrival + 1, arrival + 1.02, finish, 200, 96}};
  ToolLog t;
  t.kind = "pytest";
  t.nominal_s = 0.1;
  t.run_s = 0.15;
  t.wall_s = 0.16;
  t.cpu_s = 0.1;
  s.tools = {t};
  return s;
}

TEST(AssembleTest, TraceSecondsCompleteSessionsOnly) {
  const std::vector<SessionLog> logs = {session(0, 2, true), session(1, 4, false), session(2, 5, true)};
  const std::vector<double> ideal = {10, 10, 10};
  EngineTotals e;
  e.prompt_tokens = 600;
  e.reused_tokens = 192;
  e.new_tokens = 408;
  e.computed_tokens = 408;
  e.busy_s = 12;
  e.pinned_block_seconds = 1.5;
  const Assembled a = assemble(logs, ideal, e, 10, 1, 3);
  ASSERT_EQ(a.records.size(), 2u);
  EXPECT_DOUBLE_EQ(a.records[0].arrival_s, 0);
  EXPECT_DOUBLE_EQ(a.records[0].finish_s, 20);
  EXPECT_DOUBLE_EQ(a.records[1].arrival_s, 20);
  EXPECT_DOUBLE_EQ(a.records[1].finish_s, 50);
  ASSERT_EQ(a.records[0].ttft_s.size(), 2u);
  EXPECT_NEAR(a.records[0].ttft_s[0], 0.1, 1e-9);
  EXPECT_NEAR(a.records[0].ttft_s[1], 0.2, 1e-9);
  EXPECT_EQ(a.ttft_s.size(), 4u);
  // Tool calls count from every session, complete or not.
  EXPECT_EQ(a.counters.tool_calls, 3u);
  EXPECT_NEAR(a.counters.tool_stretch_sum, 3 * 1.5, 1e-9) << "the tool's own run time over its nominal time";
  EXPECT_NEAR(a.counters.tool_cpu_core_s, 3.0, 1e-9);
  EXPECT_EQ(a.counters.reused_tokens, 192u);
  EXPECT_DOUBLE_EQ(a.counters.pinned_block_seconds, 15);
  EXPECT_DOUBLE_EQ(a.counters.gpu_busy_s, 12) << "already modelled seconds";
  EXPECT_EQ(a.counters.capped_rounds, 3u);

  const sim::Metrics m = sim::compute_metrics(a.records, a.counters);
  EXPECT_EQ(m.sessions, 2u);
  EXPECT_DOUBLE_EQ(m.e2e_mean_s, 25);
  EXPECT_DOUBLE_EQ(m.kv_hit_rate, 192.0 / 600);
}

TEST(MeanStretchTest, OnlyCallsLongEnough) {
  const std::vector<std::pair<double, double>> calls = {{0.001, 0.01}, {0.02, 0.03}, {0.04, 0.04}, {0, 1}};
  EXPECT_DOUBLE_EQ(mean_stretch(calls, 0.010), (1.5 + 1.0) / 2);
  EXPECT_DOUBLE_EQ(mean_stretch(calls, 0), (10 + 1.5 + 1.0) / 3);
  EXPECT_EQ(mean_stretch(calls, 1), 0);
}

TEST(ToolStartTest, MedianCpuBeyondTheStepOverCallsThatRanToTheEnd) {
  sim::ToolCpuTable cpus;
  ASSERT_TRUE(cpus.apply("pytest=1,Read=0.1"));
  const auto call = [](std::string kind, double nominal, double cpu) {
    ToolLog t;
    t.kind = std::move(kind);
    t.nominal_s = nominal;
    t.cpu_s = cpu;
    return t;
  };
  SessionLog s;
  s.tools = {call("pytest", 0.10, 0.107), call("Read", 0.20, 0.028), call("Read", 0.05, 0.014)};
  ToolLog killed = call("pytest", 1.0, 0.5);  // killed part way: not a start cost
  killed.memory_kill = true;
  killed.reason = TANDEM_TOOL_OOM_KILLED;
  s.tools.push_back(killed);
  ToolLog failed = call("Read", 0.1, 0.5);
  failed.exit_code = 1;
  s.tools.push_back(failed);
  // Extras 7, 8 and 9 ms; the median is 8 ms.
  EXPECT_NEAR(tool_start_cpu_s(std::span(&s, 1), cpus), 0.008, 1e-9);
  EXPECT_EQ(tool_start_cpu_s({}, cpus), 0.0);
  // A call that used less than it asked for counts as no start cost, not a negative one.
  SessionLog light;
  light.tools = {call("pytest", 0.1, 0.05)};
  EXPECT_EQ(tool_start_cpu_s(std::span(&light, 1), cpus), 0.0);
}

class CompareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/replay_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& policy, double e2e_mean, const std::string& workload = "w") {
    logs_.push_back({session(0, 2, true)});
    RunSummary r;
    r.preset = "h100-llama3-8b";
    r.workload = workload;
    r.policy = policy;
    r.rate = 0.03;
    r.compress = 16;
    r.sessions = 1;
    r.wall_s = 3;
    r.measured.sessions = 1;
    r.measured.e2e_mean_s = e2e_mean;
    r.e2e_s = {e2e_mean};
    r.ttft_s = {0.1, 0.2};
    sim::Metrics p;
    p.sessions = 1;
    p.e2e_mean_s = e2e_mean / 2;
    r.predicted = p;
    r.predicted_e2e_s = {e2e_mean / 2};
    r.predicted_ttft_s = {0.05};
    r.logs = &logs_.back();
    r.peak_tools_memory = 64 << 20;
    const std::string path = dir_ + "/run-" + policy + ".json";
    EXPECT_TRUE(write_run(r, path));
    return path;
  }
  std::string dir_;
  std::vector<std::vector<SessionLog>> logs_;
};

TEST_F(CompareTest, SideBySideWithRatioAndMergedFiles) {
  logs_.reserve(4);
  const std::vector<std::string> in = {write("fcfs", 100), write("tandem", 50)};
  // A run file is the simulator's document plus the testbed's records.
  std::ifstream f(in[0]);
  const nlohmann::json doc = nlohmann::json::parse(f);
  EXPECT_EQ(doc["runs"].size(), 1u);
  EXPECT_EQ(doc["runs"][0]["metrics"]["e2e_mean_s"], 100);
  EXPECT_EQ(doc["predicted"]["runs"][0]["metrics"]["e2e_mean_s"], 50);
  EXPECT_EQ(doc["testbed"]["tools"]["calls"], 1);
  EXPECT_EQ(doc["testbed"]["tool_calls"].size(), 1u);
  ASSERT_EQ(doc["testbed"]["round_log"].size(), 2u);
  EXPECT_EQ(doc["testbed"]["round_log"][1], nlohmann::json::parse("[0, 1.0, 1.02, 2.0, 200, 96]"));

  char* buf = nullptr;
  std::size_t size = 0;
  std::FILE* out = ::open_memstream(&buf, &size);
  ASSERT_NE(out, nullptr);
  auto r = compare_runs(out, in, dir_ + "/results.json", dir_ + "/sim.json", "");
  std::fclose(out);
  const std::string table(buf, size);
  std::free(buf);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_NE(table.find("tandem/fcfs"), std::string::npos) << table;
  EXPECT_NE(table.find("0.50x"), std::string::npos) << table;
  EXPECT_NE(table.find("sim tandem"), std::string::npos) << table;

  std::ifstream rj(dir_ + "/results.json");
  const nlohmann::json results = nlohmann::json::parse(rj);
  ASSERT_EQ(results["runs"].size(), 2u);
  EXPECT_EQ(results["runs"][1]["policy"], "tandem");
  EXPECT_TRUE(results["testbed"].contains("fcfs"));
  std::ifstream sj(dir_ + "/sim.json");
  const nlohmann::json sims = nlohmann::json::parse(sj);
  ASSERT_EQ(sims["runs"].size(), 2u);
  EXPECT_EQ(sims["runs"][0]["metrics"]["e2e_mean_s"], 50);
}

TEST_F(CompareTest, RefusesOtherWorkloadsAndOtherFiles) {
  logs_.reserve(4);
  const std::vector<std::string> in = {write("fcfs", 100, "a"), write("tandem", 50, "b")};
  std::FILE* null = std::fopen("/dev/null", "w");
  auto r = compare_runs(null, in, "", "", "");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("different workloads"), std::string::npos) << r.error().message();

  const std::string junk = dir_ + "/junk.json";
  std::ofstream(junk) << R"({"runs":[]})";
  const std::vector<std::string> bad = {junk};
  r = compare_runs(null, bad, "", "", "");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("not a tandem-agents run file"), std::string::npos);
  const std::vector<std::string> missing = {dir_ + "/none.json"};
  EXPECT_FALSE(compare_runs(null, missing, "", "", ""));
  std::fclose(null);
}

}  // namespace
}  // namespace tandem::testbed
