// Report output: the table, the JSON schema of issue 4 (round-tripped through
// nlohmann), CSV, the gnuplot PNG, and errors that name the path.
#include "sim/report.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace tandem::sim {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool gnuplot_installed() {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (!dir.empty() && ::access((dir + "/gnuplot").c_str(), X_OK) == 0) return true;
  }
  return false;
}

// Sets an environment variable for the scope of a test, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

Metrics metrics_for(double rate, double scale) {
  Metrics m;
  m.sessions = 20;
  m.e2e_mean_s = 40.0 * scale;
  m.e2e_p50_s = 35.0 * scale;
  m.e2e_p90_s = 70.0 * scale;
  m.e2e_p99_s = 95.5 * scale;
  m.slowdown_mean = 1.25 * scale;
  m.goodput_a1 = 0.1 * rate;
  m.goodput_a2 = 0.5 * rate;
  m.goodput_a3 = 0.9 * rate;
  m.throughput_sps = rate;
  m.rounds_per_min = 600.0 * rate;
  m.ttft_mean_s = 0.25 * scale;
  m.ttft_p99_s = 2.5 * scale;
  m.kv_hit_rate = 0.875;
  m.recomputed_tokens = 1234567;
  m.preemptions = 3;
  m.pinned_block_seconds = 4500.25;
  m.gpu_busy = 0.625;
  m.tool_cpu_util = 0.125;
  m.tool_stretch_mean = 1.5;
  m.makespan_s = 20.0 / rate;
  m.capped_rounds = 2;
  return m;
}

Run make_run(std::string policy, std::string variant, double rate, double scale) {
  Run r;
  r.policy = std::move(policy);
  r.variant = std::move(variant);
  r.rate = rate;
  r.sessions = 20;
  r.metrics = metrics_for(rate, scale);
  for (int i = 1; i <= 20; ++i) r.e2e_s.push_back(scale * i * 4.0);
  r.wall_s = 0.75;
  return r;
}

// Two rates, listed high rate first so the table must regroup them.
Report sample_report() {
  Report rep;
  rep.preset = "h100-llama8b";
  rep.workload = "swe_mix";
  rep.runs.push_back(make_run("tandem", "", 1.0, 1.0));
  rep.runs.push_back(make_run("fcfs", "", 1.0, 3.0));
  rep.runs.push_back(make_run("tandem", "", 0.5, 0.5));
  rep.runs.push_back(make_run("fcfs", "", 0.5, 0.75));
  rep.runs.push_back(make_run("tandem", "-residency", 0.5, 0.6));
  rep.runs.push_back(make_run("tandem", "-residency", 1.0, 50.0));
  return rep;
}

class ReportFiles : public testing::Test {
 protected:
  void SetUp() override {
    std::string templ = testing::TempDir() + "/report_test-XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << "mkdtemp: " << std::strerror(errno);
    dir_ = templ;
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

TEST(RunLabel, PolicyThenVariant) {
  EXPECT_EQ(run_label(make_run("tandem", "-residency", 1.0, 1.0)), "tandem-residency");
  EXPECT_EQ(run_label(make_run("fcfs", "", 1.0, 1.0)), "fcfs");
}

TEST(PrintTable, ShowsLabelsAndRatesGroupedByRate) {
  std::ostringstream os;
  print_table(os, sample_report());
  const std::string out = os.str();
  EXPECT_NE(out.find("h100-llama8b"), std::string::npos);
  EXPECT_NE(out.find("swe_mix"), std::string::npos);
  EXPECT_NE(out.find("tandem-residency"), std::string::npos);
  EXPECT_NE(out.find("fcfs"), std::string::npos);
  EXPECT_NE(out.find("1.23M"), std::string::npos) << "recomputed tokens with a suffix\n" << out;
  EXPECT_NE(out.find("87.5"), std::string::npos) << "kv hit %\n" << out;

  // In each block the rows run by rate ascending and, within a rate, in
  // report order: tandem, fcfs, tandem-residency at 0.5, then tandem, fcfs,
  // tandem-residency at 1.
  std::istringstream lines(out);
  std::string line;
  std::vector<std::string> rows;
  while (std::getline(lines, line)) {
    EXPECT_LE(line.size(), 160u) << line;
    if (line.starts_with("tandem-sim")) continue;  // the heading
    if (line.starts_with("tandem") || line.starts_with("fcfs")) rows.push_back(line);
  }
  ASSERT_EQ(rows.size(), 12u) << out;
  const char* want_label[] = {"tandem ", "fcfs ", "tandem-residency", "tandem ", "fcfs ", "tandem-residency"};
  const char* want_rate[] = {"0.500", "0.500", "0.500", "1.00", "1.00", "1.00"};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_TRUE(rows[i].starts_with(want_label[i % 6])) << rows[i];
    std::istringstream cells(rows[i]);
    std::string label, rate;
    cells >> label >> rate;
    EXPECT_EQ(rate, want_rate[i % 6]) << rows[i];
  }
}

TEST(Stat, MeanAndStudentInterval) {
  const double v[] = {1.0, 2.0, 3.0, 4.0, 5.0};
  const sim::Stat s = sim::stat_of(v);
  EXPECT_EQ(s.n, 5u);
  EXPECT_DOUBLE_EQ(s.mean, 3.0);
  // sd = sqrt(2.5), t(4) = 2.776: half = 2.776 * sqrt(2.5) / sqrt(5).
  EXPECT_NEAR(s.half, 2.776 * std::sqrt(2.5) / std::sqrt(5.0), 1e-12);
  const double one[] = {7.0};
  EXPECT_EQ(sim::stat_of(one).half, 0.0) << "one value has no spread";
  EXPECT_EQ(sim::stat_of({}).n, 0u);
  EXPECT_DOUBLE_EQ(sim::t95(1), 12.706);
  EXPECT_DOUBLE_EQ(sim::t95(1000), 1.96);
}

TEST(Summary, GroupsSeedsByLabelAndRateAndKeepsFailures) {
  Report rep;
  for (std::uint64_t seed : {2, 1}) {
    sim::Run r;
    r.policy = "fcfs";
    r.rate = 0.5;
    r.seed = seed;
    r.metrics.e2e_mean_s = 10.0 * static_cast<double>(seed);
    rep.runs.push_back(r);
  }
  sim::Run t;
  t.policy = "tandem";
  t.rate = 0.25;
  rep.runs.push_back(t);
  rep.failed.push_back({"fcfs", "", 0.5, 3, "livelock"});
  const auto sums = sim::summarize(rep);
  ASSERT_EQ(sums.size(), 2u);
  EXPECT_EQ(sums[0].rate, 0.25) << "by rate ascending";
  const sim::Summary& f = sums[1];
  ASSERT_EQ(f.runs.size(), 2u);
  EXPECT_EQ(f.runs[0]->seed, 1u) << "by seed";
  EXPECT_EQ(f.failed, std::vector<std::uint64_t>{3});
  EXPECT_DOUBLE_EQ(f.stat("e2e_mean_s").mean, 15.0);
  EXPECT_EQ(sim::seed_count(rep), 3u);
  std::ostringstream os;
  print_table(os, rep);
  EXPECT_NE(os.str().find("Mean over 3 seeds"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("1 failed"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("15.0 ± "), std::string::npos) << os.str();
}

TEST(PrintTable, EmptyReportPrintsOnlyTheHeading) {
  std::ostringstream os;
  Report rep;
  rep.preset = "p";
  rep.workload = "w";
  print_table(os, rep);
  EXPECT_NE(os.str().find("0 runs"), std::string::npos) << os.str();
}

TEST_F(ReportFiles, JsonRoundTrip) {
  const Report rep = sample_report();
  const std::string file = path("out.json");
  auto r = write_json(rep, file);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_FALSE(fs::exists(file + ".tmp"));

  const std::string text = slurp(file);
  EXPECT_NE(text.find("\n  \"runs\""), std::string::npos) << "indented by 2";
  const auto doc = nlohmann::json::parse(text);
  std::set<std::string> top;
  for (const auto& item : doc.items()) top.insert(item.key());
  EXPECT_EQ(top, (std::set<std::string>{"preset", "workload", "runs", "summary"}));
  EXPECT_EQ(doc["preset"], "h100-llama8b");
  EXPECT_EQ(doc["workload"], "swe_mix");
  ASSERT_TRUE(doc["runs"].is_array());
  ASSERT_EQ(doc["runs"].size(), rep.runs.size());

  const std::set<std::string> run_keys = {"policy", "variant", "rate", "seed", "sessions", "metrics", "wall_s"};
  const std::set<std::string> metric_keys = {"e2e_mean_s",
                                             "e2e_p50_s",
                                             "e2e_p90_s",
                                             "e2e_p99_s",
                                             "slowdown_mean",
                                             "goodput_a1",
                                             "goodput_a2",
                                             "goodput_a3",
                                             "throughput_sps",
                                             "ttft_mean_s",
                                             "ttft_p99_s",
                                             "kv_hit_rate",
                                             "recomputed_tokens",
                                             "preemptions",
                                             "pinned_block_seconds",
                                             "gpu_busy",
                                             "tool_stretch_mean",
                                             "rounds_per_min",
                                             "tool_cpu_util",
                                             "makespan_s",
                                             "capped_rounds",
                                             "completed",
                                             "tokens_per_s",
                                             "resume_recomputed_tokens",
                                             "swaps",
                                             "kv_waste_block_s",
                                             "host_peak_blocks"};
  for (std::size_t i = 0; i < rep.runs.size(); ++i) {
    const auto& jr = doc["runs"][i];
    const sim::Run& run = rep.runs[i];
    std::set<std::string> keys;
    for (const auto& item : jr.items()) keys.insert(item.key());
    EXPECT_EQ(keys, run_keys);
    std::set<std::string> mkeys;
    for (const auto& item : jr["metrics"].items()) mkeys.insert(item.key());
    EXPECT_EQ(mkeys, metric_keys);

    EXPECT_EQ(jr["policy"], run.policy);
    EXPECT_EQ(jr["variant"], run.variant);
    EXPECT_EQ(jr["rate"].get<double>(), run.rate);
    EXPECT_EQ(jr["sessions"].get<std::uint64_t>(), run.sessions);
    EXPECT_EQ(jr["seed"].get<std::uint64_t>(), run.seed);
    EXPECT_EQ(jr["wall_s"].get<double>(), run.wall_s);
    const auto& jm = jr["metrics"];
    const Metrics& m = run.metrics;
    // nlohmann prints doubles with round-trip precision: exact equality.
    EXPECT_EQ(jm["e2e_mean_s"].get<double>(), m.e2e_mean_s);
    EXPECT_EQ(jm["e2e_p50_s"].get<double>(), m.e2e_p50_s);
    EXPECT_EQ(jm["e2e_p90_s"].get<double>(), m.e2e_p90_s);
    EXPECT_EQ(jm["e2e_p99_s"].get<double>(), m.e2e_p99_s);
    EXPECT_EQ(jm["slowdown_mean"].get<double>(), m.slowdown_mean);
    EXPECT_EQ(jm["goodput_a1"].get<double>(), m.goodput_a1);
    EXPECT_EQ(jm["goodput_a2"].get<double>(), m.goodput_a2);
    EXPECT_EQ(jm["goodput_a3"].get<double>(), m.goodput_a3);
    EXPECT_EQ(jm["throughput_sps"].get<double>(), m.throughput_sps);
    EXPECT_EQ(jm["rounds_per_min"].get<double>(), m.rounds_per_min);
    EXPECT_EQ(jm["ttft_mean_s"].get<double>(), m.ttft_mean_s);
    EXPECT_EQ(jm["ttft_p99_s"].get<double>(), m.ttft_p99_s);
    EXPECT_EQ(jm["kv_hit_rate"].get<double>(), m.kv_hit_rate);
    EXPECT_TRUE(jm["recomputed_tokens"].is_number_integer());
    EXPECT_EQ(jm["recomputed_tokens"].get<std::uint64_t>(), m.recomputed_tokens);
    EXPECT_EQ(jm["preemptions"].get<std::uint64_t>(), m.preemptions);
    EXPECT_EQ(jm["pinned_block_seconds"].get<double>(), m.pinned_block_seconds);
    EXPECT_EQ(jm["gpu_busy"].get<double>(), m.gpu_busy);
    EXPECT_EQ(jm["tool_cpu_util"].get<double>(), m.tool_cpu_util);
    EXPECT_EQ(jm["tool_stretch_mean"].get<double>(), m.tool_stretch_mean);
    EXPECT_EQ(jm["makespan_s"].get<double>(), m.makespan_s);
    EXPECT_EQ(jm["capped_rounds"].get<std::uint64_t>(), m.capped_rounds);
    EXPECT_EQ(jm["completed"].get<std::uint64_t>(), m.sessions);
  }
}

TEST_F(ReportFiles, JsonReplacesAnExistingFile) {
  const std::string file = path("out.json");
  { std::ofstream(file) << "stale, and not JSON"; }
  Report rep;
  rep.preset = "p";
  rep.workload = "w";
  ASSERT_TRUE(write_json(rep, file));
  const auto doc = nlohmann::json::parse(slurp(file));
  EXPECT_TRUE(doc["runs"].is_array());
  EXPECT_TRUE(doc["runs"].empty());
}

TEST_F(ReportFiles, CsvHasAHeaderAndOneRowPerRun) {
  Report rep = sample_report();
  rep.workload = "mix, \"quoted\"";
  const std::string file = path("out.csv");
  auto r = write_csv(rep, file);
  ASSERT_TRUE(r) << r.error().message();

  std::istringstream in(slurp(file));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), rep.runs.size() + 1);
  EXPECT_TRUE(lines[0].starts_with("preset,workload,policy,variant,rate,seed,sessions,e2e_mean_s,")) << lines[0];
  EXPECT_NE(lines[0].find(",tool_stretch_mean,"), std::string::npos);
  EXPECT_NE(lines[0].find(",completed,"), std::string::npos);
  EXPECT_TRUE(lines[0].ends_with(",wall_s"));
  // 7 identity columns, 27 metrics, wall_s.
  EXPECT_EQ(std::count(lines[0].begin(), lines[0].end(), ','), 34);
  const std::string quoted = "\"mix, \"\"quoted\"\"\"";
  for (std::size_t i = 1; i < lines.size(); ++i) {
    EXPECT_TRUE(lines[i].starts_with("h100-llama8b," + quoted + ",")) << lines[i];
    // The quoted field holds one comma of its own.
    EXPECT_EQ(std::count(lines[i].begin(), lines[i].end(), ','), 35) << lines[i];
  }
  EXPECT_TRUE(lines[6].starts_with("h100-llama8b," + quoted + ",tandem,-residency,1,1,20,2000,")) << lines[6];
  EXPECT_NE(lines[1].find(",1234567,0,3,0,4500.25,"), std::string::npos) << lines[1];
}

TEST(ReportErrors, UnwritablePathIsNamed) {
  const std::string json = "/nonexistent-dir/x.json";
  auto r = write_json(sample_report(), json);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOENT);
  EXPECT_NE(r.error().message().find(json), std::string::npos) << r.error().message();

  const std::string csv = "/nonexistent-dir/x.csv";
  auto c = write_csv(sample_report(), csv);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), ENOENT);
  EXPECT_NE(c.error().message().find(csv), std::string::npos) << c.error().message();
}

TEST(ReportErrors, PlotOfNothingIsRefused) {
  Report rep;
  auto r = write_plot(rep, "/nonexistent-dir/x.png");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EINVAL);
  EXPECT_NE(r.error().message().find("/nonexistent-dir/x.png"), std::string::npos);
}

// Checks a PNG's magic and its IHDR size.
void expect_png(const std::string& file, std::uint32_t want_w, std::uint32_t want_h) {
  const std::string png = slurp(file);
  ASSERT_GE(png.size(), 24u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  auto be32 = [&](std::size_t at) {
    return (static_cast<std::uint32_t>(static_cast<unsigned char>(png[at])) << 24) |
           (static_cast<std::uint32_t>(static_cast<unsigned char>(png[at + 1])) << 16) |
           (static_cast<std::uint32_t>(static_cast<unsigned char>(png[at + 2])) << 8) |
           static_cast<std::uint32_t>(static_cast<unsigned char>(png[at + 3]));
  };
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  EXPECT_EQ(be32(16), want_w);
  EXPECT_EQ(be32(20), want_h);
}

TEST_F(ReportFiles, PlotWritesAPngAndCleansUp) {
  if (!gnuplot_installed()) GTEST_SKIP() << "gnuplot not installed (apt-get install gnuplot-nox)";
  // Scratch directories go under TMPDIR; point it at an empty directory to
  // see that none is left behind.
  const std::string scratch = path("tmp");
  ASSERT_EQ(::mkdir(scratch.c_str(), 0700), 0);
  ScopedEnv tmpdir("TMPDIR", scratch);

  const std::string file = path("plot.png");
  auto r = write_plot(sample_report(), file);
  ASSERT_TRUE(r) << r.error().message();
  expect_png(file, 1600, 1000);
  EXPECT_FALSE(fs::exists(file + ".tmp"));
  EXPECT_TRUE(fs::is_empty(scratch));
}

TEST_F(ReportFiles, PlotOfOneRateAndAwkwardNames) {
  if (!gnuplot_installed()) GTEST_SKIP() << "gnuplot not installed (apt-get install gnuplot-nox)";
  Report rep;
  rep.preset = "it's_a \"preset\"";
  rep.workload = "a^b {c} @d\nnext line";
  rep.runs.push_back(make_run("tandem", "-it's", 0.25, 1.0));
  rep.runs.push_back(make_run("fcfs", "_x", 0.25, 2.0));
  sim::Run empty = make_run("lru", "", 0.25, 1.0);  // nothing completed: no CDF line
  empty.e2e_s.clear();
  empty.metrics = Metrics{};
  rep.runs.push_back(empty);
  // A destination name gnuplot would choke on if it were ever put in a script.
  const std::string file = path("it's a \"plot\".png");
  auto r = write_plot(rep, file);
  ASSERT_TRUE(r) << r.error().message();
  expect_png(file, 1600, 1000);
}

TEST_F(ReportFiles, PlotWithNoCompletedSessions) {
  if (!gnuplot_installed()) GTEST_SKIP() << "gnuplot not installed (apt-get install gnuplot-nox)";
  Report rep;
  rep.preset = "p";
  rep.workload = "w";
  for (double rate : {0.5, 1.0}) {
    sim::Run run = make_run("fcfs", "", rate, 1.0);
    run.e2e_s.clear();
    run.metrics = Metrics{};
    rep.runs.push_back(run);
  }
  const std::string file = path("empty.png");
  auto r = write_plot(rep, file);
  ASSERT_TRUE(r) << r.error().message();
  expect_png(file, 1600, 1000);
}

TEST_F(ReportFiles, PlotUnwritableDestinationIsNamed) {
  if (!gnuplot_installed()) GTEST_SKIP() << "gnuplot not installed (apt-get install gnuplot-nox)";
  const std::string file = "/nonexistent-dir/x.png";
  auto r = write_plot(sample_report(), file);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOENT);
  EXPECT_NE(r.error().message().find(file), std::string::npos) << r.error().message();
}

TEST_F(ReportFiles, MissingGnuplotSaysWhatToInstall) {
  // An empty PATH directory: posix_spawnp finds no gnuplot.
  const std::string bin = path("bin");
  ASSERT_EQ(::mkdir(bin.c_str(), 0700), 0);
  ScopedEnv env("PATH", bin);
  auto r = write_plot(sample_report(), path("x.png"));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOENT);
  EXPECT_NE(r.error().message().find("gnuplot-nox"), std::string::npos) << r.error().message();
  EXPECT_FALSE(fs::exists(path("x.png")));
}

TEST_F(ReportFiles, FailingGnuplotReportsItsStatusAndStderr) {
  // A stand-in gnuplot that fails the way a script error does.
  const std::string bin = path("bin");
  ASSERT_EQ(::mkdir(bin.c_str(), 0700), 0);
  {
    std::ofstream script(bin + "/gnuplot");
    script << "#!/bin/sh\necho '\"plot.gp\" line 3: undefined variable: foo' >&2\nexit 3\n";
  }
  ASSERT_EQ(::chmod((bin + "/gnuplot").c_str(), 0755), 0);
  ScopedEnv env("PATH", bin);
  auto r = write_plot(sample_report(), path("x.png"));
  ASSERT_FALSE(r);
  const std::string msg = r.error().message();
  EXPECT_NE(msg.find("status 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("undefined variable: foo"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path("x.png")), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(path("x.png")));
}

}  // namespace
}  // namespace tandem::sim
