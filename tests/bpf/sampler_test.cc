// The fallback sampler without privilege: its parsers on kernel texts, and its
// logic (live counts, synthetic events, cumulative times, pid reuse, untrack)
// on fake cgroupfs and procfs trees built in a temp dir. The real-kernel
// comparison with eBPF is in telemetry_test.cc.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/unique_fd.h"
#include "bpf/sampler.h"
#include "bpf/telemetry.h"

namespace tandem::bpf {
namespace {

namespace fs = std::filesystem;

TEST(Parse, PidList) {
  auto pids = parse_pid_list("12\n3456\n\n7\n");
  ASSERT_TRUE(pids) << pids.error().message();
  EXPECT_EQ(*pids, (std::vector<std::int32_t>{12, 3456, 7}));
  auto empty = parse_pid_list("");
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->empty());
  EXPECT_FALSE(parse_pid_list("12\nabc\n"));
  EXPECT_FALSE(parse_pid_list("0\n"));
  EXPECT_FALSE(parse_pid_list("-4\n"));
}

TEST(Parse, Schedstat) {
  auto s = parse_schedstat("5183722 2637509 17\n");
  ASSERT_TRUE(s) << s.error().message();
  EXPECT_EQ(s->run_ns, 5183722u);
  EXPECT_EQ(s->wait_ns, 2637509u);
  EXPECT_EQ(s->timeslices, 17u);
  EXPECT_FALSE(parse_schedstat("1 2\n"));
  EXPECT_FALSE(parse_schedstat("1 x 3\n"));
  EXPECT_FALSE(parse_schedstat(""));
}

TEST(Parse, ProcStatCommWithSpacesAndParens) {
  auto st = parse_proc_stat("4242 (my (odd) name) S 17 4242 4242 0 -1 4194560 110 0 0 0 0 0 0 0 20 0 1 0\n");
  ASSERT_TRUE(st) << st.error().message();
  EXPECT_EQ(st->comm, "my (odd) name");
  EXPECT_EQ(st->ppid, 17);
  EXPECT_FALSE(parse_proc_stat("4242 no parens S 1"));
  EXPECT_FALSE(parse_proc_stat("4242 (x) S"));
  EXPECT_FALSE(parse_proc_stat("4242 (x) S abc"));
}

TEST(Parse, CpuStatUsage) {
  auto ns = parse_cpu_stat_usage_ns("usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n");
  ASSERT_TRUE(ns) << ns.error().message();
  EXPECT_EQ(*ns, 1'500'000u);
  auto v1 = parse_cpu_stat_usage_ns("nr_periods 4\nnr_throttled 1\nthrottled_time 7000000\n");
  ASSERT_FALSE(v1);
  EXPECT_EQ(v1.error().code(), ENOENT);
  EXPECT_FALSE(parse_cpu_stat_usage_ns("usage_usec lots\n"));
}

TEST(RunqBucket, Log2Microseconds) {
  EXPECT_EQ(runq_bucket(0), 0u);
  EXPECT_EQ(runq_bucket(999), 0u);
  EXPECT_EQ(runq_bucket(1'000), 1u);
  EXPECT_EQ(runq_bucket(1'999), 1u);
  EXPECT_EQ(runq_bucket(2'000), 2u);
  EXPECT_EQ(runq_bucket(3'999), 2u);
  EXPECT_EQ(runq_bucket(4'000), 3u);
  EXPECT_EQ(runq_bucket(1'000'000), 10u);  // 1 ms: [512, 1024) µs
  EXPECT_EQ(runq_bucket((1ull << 22) * 1000 - 1), kRunqBuckets - 2);
  EXPECT_EQ(runq_bucket((1ull << 22) * 1000), kRunqBuckets - 1);
  EXPECT_EQ(runq_bucket(UINT64_MAX), kRunqBuckets - 1);
}

// A fake procfs and one fake cgroup directory under a fresh temp dir.
class FakeTree {
 public:
  FakeTree() {
    std::string tmpl = (fs::temp_directory_path() / "tandem-bpf-sampler-XXXXXX").string();
    root_ = ::mkdtemp(tmpl.data());
    fs::create_directories(proc() / "self");
  }
  ~FakeTree() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  FakeTree(const FakeTree&) = delete;
  FakeTree& operator=(const FakeTree&) = delete;

  fs::path proc() const { return root_ / "proc"; }

  // A cgroup directory `name` (v2 with cpu.stat, or bare).
  base::UniqueFd cgroup(const std::string& name) const {
    fs::create_directories(root_ / name);
    write(root_ / name / "cgroup.procs", "");
    return base::UniqueFd(::open((root_ / name).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  }
  void set_procs(const std::string& cgroup, const std::vector<int>& pids) const {
    std::string text;
    for (int p : pids) text += std::to_string(p) + "\n";
    write(root_ / cgroup / "cgroup.procs", text);
  }
  void set_usage_us(const std::string& cgroup, std::uint64_t us) const {
    write(root_ / cgroup / "cpu.stat", "usage_usec " + std::to_string(us) + "\nuser_usec 0\nsystem_usec 0\n");
  }
  void add_process(int pid, int ppid, const std::string& comm) const {
    fs::create_directories(proc() / std::to_string(pid) / "task");
    write(proc() / std::to_string(pid) / "stat",
          std::to_string(pid) + " (" + comm + ") S " + std::to_string(ppid) + " 1 1 0 -1 0 0 0 0 0 0 0\n");
  }
  void set_thread(int pid, int tid, std::uint64_t run, std::uint64_t wait, std::uint64_t slices) const {
    fs::create_directories(proc() / std::to_string(pid) / "task" / std::to_string(tid));
    write(proc() / std::to_string(pid) / "task" / std::to_string(tid) / "schedstat",
          std::to_string(run) + " " + std::to_string(wait) + " " + std::to_string(slices) + "\n");
  }
  void remove_thread(int pid, int tid) const {
    fs::remove_all(proc() / std::to_string(pid) / "task" / std::to_string(tid));
  }
  void remove_process(int pid) const { fs::remove_all(proc() / std::to_string(pid)); }

 private:
  static void write(const fs::path& path, const std::string& text) {
    std::ofstream out(path, std::ios::trunc);
    out << text;
  }
  fs::path root_;
};

class SamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Options options;
    options.proc_root = tree_.proc().string();
    options.clock = &clock_;
    auto t = open_sampler(options, "test");
    ASSERT_TRUE(t) << t.error().message();
    sampler_ = std::move(*t);
  }
  std::vector<ProcEvent> drain() {
    std::vector<ProcEvent> out;
    sampler_->drain_events([&out](const ProcEvent& e) { out.push_back(e); });
    return out;
  }

  FakeTree tree_;
  base::VirtualClock clock_{base::from_ns(1'000'000)};
  std::unique_ptr<Telemetry> sampler_;
};

TEST_F(SamplerTest, DescribesItself) {
  EXPECT_EQ(sampler_->mode(), Mode::kSampling);
  EXPECT_EQ(sampler_->describe(), "sampling (cgroupfs+/proc): test");
  EXPECT_EQ(sampler_->event_fd(), -1);
  EXPECT_EQ(sampler_->lost_events(), 0u);
}

TEST_F(SamplerTest, SeedsThenCountsForksExitsAndTime) {
  auto cg = tree_.cgroup("a");
  tree_.set_usage_us("a", 1000);
  tree_.add_process(10, 1, "old");
  tree_.set_thread(10, 10, 5'000'000, 1'000'000, 10);
  tree_.add_process(11, 1, "older");
  tree_.set_thread(11, 11, 1'000, 500, 1);
  tree_.set_procs("a", {10, 11});
  ASSERT_TRUE(sampler_->track(77, 5, cg.get()));

  // Present at track(): live, but neither forks nor their past times.
  auto s0 = sampler_->sample();
  ASSERT_TRUE(s0.contains(5));
  EXPECT_EQ(s0.at(5).live_processes, 2u);
  EXPECT_EQ(s0.at(5).forks, 0u);
  EXPECT_EQ(s0.at(5).on_cpu_ns, 0u);
  EXPECT_EQ(s0.at(5).runq_waits, 0u);
  EXPECT_TRUE(drain().empty());

  // 11 exits, 12 forks in (a new process counts all its waits), 10 waits
  // twice more (2000 ns: both in the [1,2) µs bucket), cpu.stat grows 2 ms.
  clock_.advance(std::chrono::milliseconds(10));
  tree_.remove_process(11);
  tree_.add_process(12, 10, "new kid");
  tree_.set_thread(12, 12, 700, 3'000, 1);
  tree_.set_thread(10, 10, 6'000'000, 1'002'000, 12);
  tree_.set_procs("a", {10, 12});
  tree_.set_usage_us("a", 3000);
  const auto& s1 = sampler_->sample().at(5);
  EXPECT_EQ(s1.live_processes, 2u);
  EXPECT_EQ(s1.forks, 1u);
  EXPECT_EQ(s1.exits, 1u);
  EXPECT_EQ(s1.execs, 0u);              // never seen by sampling
  EXPECT_EQ(s1.on_cpu_ns, 2'000'000u);  // from cpu.stat, not schedstat
  EXPECT_EQ(s1.runq_delay_ns, 5'000u);
  EXPECT_EQ(s1.runq_waits, 3u);
  EXPECT_EQ(s1.runq_hist[1], 2u);  // 1 µs mean for 10's two waits
  EXPECT_EQ(s1.runq_hist[2], 1u);  // 3 µs for 12's one
  auto events = drain();
  ASSERT_EQ(events.size(), 2u);
  std::sort(events.begin(), events.end(), [](const ProcEvent& x, const ProcEvent& y) { return x.pid < y.pid; });
  EXPECT_EQ(events[0].kind, ProcEvent::Kind::kExit);
  EXPECT_EQ(events[0].pid, 11);
  EXPECT_EQ(events[0].exit_code, -1);
  EXPECT_STREQ(events[0].comm, "older");
  EXPECT_EQ(events[1].kind, ProcEvent::Kind::kFork);
  EXPECT_EQ(events[1].pid, 12);
  EXPECT_EQ(events[1].ppid, 10);
  EXPECT_STREQ(events[1].comm, "new kid");
  for (const ProcEvent& e : events) {
    EXPECT_EQ(e.cgroup_id, 77u);
    EXPECT_EQ(e.group, 5u);
    EXPECT_EQ(e.timestamp_ns, 11'000'000u);
  }
  EXPECT_TRUE(drain().empty());

  // A second thread of 12 starts; its first thread ends: both cumulative.
  tree_.set_thread(12, 13, 100, 4'000, 2);
  tree_.remove_thread(12, 12);
  const auto& s2 = sampler_->sample().at(5);
  EXPECT_EQ(s2.runq_delay_ns, 9'000u);
  EXPECT_EQ(s2.runq_waits, 5u);
}

TEST_F(SamplerTest, WithoutUsageFilesOnCpuComesFromSchedstat) {
  auto cg = tree_.cgroup("v1");  // no cpu.stat, no cpuacct.usage: a v1 cpu dir
  tree_.add_process(20, 1, "w");
  tree_.set_thread(20, 20, 1'000, 0, 1);
  tree_.set_procs("v1", {20});
  ASSERT_TRUE(sampler_->track(8, 1, cg.get()));
  tree_.set_thread(20, 20, 51'000, 0, 2);
  tree_.set_thread(20, 21, 7'000, 0, 1);
  EXPECT_EQ(sampler_->sample().at(1).on_cpu_ns, 57'000u);
}

TEST_F(SamplerTest, ReusedPidIsAnExitAndAFork) {
  auto cg = tree_.cgroup("a");
  tree_.add_process(30, 1, "first");
  tree_.set_thread(30, 30, 9'000'000, 100, 50);
  tree_.set_procs("a", {30});
  ASSERT_TRUE(sampler_->track(1, 1, cg.get()));
  // Same pid, younger counters: another process.
  tree_.add_process(30, 1, "second");
  tree_.set_thread(30, 30, 10, 2'000, 1);
  const auto& s = sampler_->sample().at(1);
  EXPECT_EQ(s.forks, 1u);
  EXPECT_EQ(s.exits, 1u);
  EXPECT_EQ(s.live_processes, 1u);
  EXPECT_EQ(s.runq_delay_ns, 2'000u);
  auto events = drain();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, ProcEvent::Kind::kExit);
  EXPECT_STREQ(events[0].comm, "first");
  EXPECT_EQ(events[1].kind, ProcEvent::Kind::kFork);
  EXPECT_STREQ(events[1].comm, "second");
}

TEST_F(SamplerTest, GroupsSumCgroupsUntrackAndForget) {
  auto a = tree_.cgroup("a");
  auto b = tree_.cgroup("b");
  tree_.set_usage_us("a", 0);
  tree_.set_usage_us("b", 0);
  for (int pid : {40, 41, 42}) tree_.add_process(pid, 1, "p");
  tree_.set_procs("a", {40});
  tree_.set_procs("b", {41, 42});
  ASSERT_TRUE(sampler_->track(100, 9, a.get()));
  ASSERT_TRUE(sampler_->track(101, 9, b.get()));
  ASSERT_TRUE(sampler_->track(101, 9, b.get()));  // again, same group: no-op
  auto other = sampler_->track(101, 10, b.get());
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().code(), EEXIST);
  tree_.set_usage_us("a", 10);
  tree_.set_usage_us("b", 20);
  const auto& s = sampler_->sample().at(9);
  EXPECT_EQ(s.live_processes, 3u);
  EXPECT_EQ(s.on_cpu_ns, 30'000u);

  sampler_->untrack(101);
  tree_.set_usage_us("b", 1'000);  // no longer counted
  const auto& after = sampler_->sample().at(9);
  EXPECT_EQ(after.live_processes, 1u);
  EXPECT_EQ(after.on_cpu_ns, 30'000u);

  sampler_->forget_group(9);
  EXPECT_FALSE(sampler_->sample().contains(9));
}

TEST_F(SamplerTest, AProcessGoneBeforeItsStatIsReadIsSkipped) {
  auto cg = tree_.cgroup("a");
  ASSERT_TRUE(sampler_->track(1, 1, cg.get()));
  tree_.set_procs("a", {50});  // listed, but /proc/50 does not exist (exited)
  EXPECT_EQ(sampler_->sample().at(1).forks, 0u);
  EXPECT_TRUE(drain().empty());
}

TEST(OpenTelemetry, ForcedSampling) {
  Options options;
  options.force_sampling = true;
  auto t = open_telemetry(options);
  ASSERT_TRUE(t) << t.error().message();
  EXPECT_EQ((*t)->mode(), Mode::kSampling);
  EXPECT_EQ((*t)->describe(), "sampling (cgroupfs+/proc): forced by configuration");
  EXPECT_EQ((*t)->event_fd(), -1);
  EXPECT_TRUE((*t)->sample().empty());
}

TEST(OpenTelemetry, MissingProcRootIsAnError) {
  Options options;
  options.force_sampling = true;
  options.proc_root = "/nonexistent/tandem/proc";
  auto t = open_telemetry(options);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code(), ENOENT);
}

TEST(OpenTelemetry, MissingBtfFallsBackAndSaysWhy) {
  Options options;
  options.btf_path = "/nonexistent/vmlinux";
  auto t = open_telemetry(options);
  ASSERT_TRUE(t) << t.error().message();
  EXPECT_EQ((*t)->mode(), Mode::kSampling);
  // Unprivileged, or built without eBPF, the reason may be another one
  // found first; it always names itself.
  EXPECT_EQ((*t)->describe().find("sampling (cgroupfs+/proc): "), 0u) << (*t)->describe();
  EXPECT_GT((*t)->describe().size(), std::string_view("sampling (cgroupfs+/proc): ").size());
}

TEST(CgroupId, NotKernfsIsAnError) {
  base::UniqueFd tmp(::open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(tmp);
  // Only cgroupfs directories have cgroup ids (an ext4 handle is 8 bytes too).
  auto id = cgroup_id_of(tmp.get());
  ASSERT_FALSE(id);
  EXPECT_EQ(id.error().code(), EOPNOTSUPP);
}

}  // namespace
}  // namespace tandem::bpf
