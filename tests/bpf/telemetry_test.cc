// The privileged suite of bpf/: real processes in real cgroup-v2 cgroups,
// eBPF telemetry (and the sampler beside it) on the real kernel. Needs root
// and CAP_BPF with a writable cgroup-v2 hierarchy; skips naming what is
// missing otherwise.
//
// Test cgroups live only under this process's own v2 cgroup, in a folder
// `tandem-bpftest-<pid>`; every cgroup is emptied (its processes killed) and
// removed on every exit path, failures included (RAII), and folders left by a
// run that crashed (its pid gone) are removed at the start.
#include <dirent.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/unique_fd.h"
#include "bpf/telemetry.h"

namespace tandem::bpf {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string read_at(int dirfd, const char* name) {
  base::UniqueFd fd(::openat(dirfd, name, O_RDONLY | O_CLOEXEC));
  if (!fd) return {};
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd.get(), buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  return out;
}

bool write_at(int dirfd, const char* name, const std::string& text) {
  base::UniqueFd fd(::openat(dirfd, name, O_WRONLY | O_CLOEXEC));
  return fd && ::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
}

std::vector<int> pids_in(int dirfd) {
  std::vector<int> out;
  std::istringstream in(read_at(dirfd, "cgroup.procs"));
  for (int pid; in >> pid;) out.push_back(pid);
  return out;
}

// This process's cgroup-v2 directory, or "" when no v2 hierarchy is mounted.
std::string own_v2_dir() {
  std::string mount;
  std::istringstream mi(read_text("/proc/self/mountinfo"));
  for (std::string line; std::getline(mi, line);) {
    const auto dash = line.find(" - cgroup2 ");
    if (dash == std::string::npos) continue;
    std::istringstream f(line.substr(0, dash));
    std::string id, parent, dev, root;
    f >> id >> parent >> dev >> root >> mount;
    break;
  }
  if (mount.empty()) return {};
  std::istringstream cg(read_text("/proc/self/cgroup"));
  for (std::string line; std::getline(cg, line);) {
    if (line.rfind("0::", 0) == 0) return mount + (line.substr(3) == "/" ? "" : line.substr(3));
  }
  return {};
}

void burn_thread_cpu(double seconds) {
  auto cpu = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  };
  const double start = cpu();
  std::uint64_t x = 1;
  while (cpu() - start < seconds) {
    for (int i = 0; i < 200000; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
    std::atomic_signal_fence(std::memory_order_seq_cst);  // keep the loop
  }
  if (x == 42) ::write(2, "", 0);
}

std::string fmt_path(const std::string& dir, const std::string& name) {
  std::string out = dir;
  out += '/';
  out += name;
  return out;
}

// The per-suite folder that holds this run's cgroups.
class Folder {
 public:
  static std::string& path() {
    static std::string p;
    return p;
  }
  // Removes folders of earlier runs whose process is gone (they crashed).
  static void remove_stale(const std::string& own) {
    DIR* d = ::opendir(own.c_str());
    if (d == nullptr) return;
    std::vector<std::string> stale;
    while (const dirent* de = ::readdir(d)) {
      const std::string name = de->d_name;
      if (name.rfind("tandem-bpftest-", 0) != 0) continue;
      const int pid = std::atoi(name.c_str() + 15);
      if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(fmt_path(own, name));
    }
    ::closedir(d);
    for (const std::string& dir : stale) remove_tree(dir);
  }
  // Empties (cgroup.kill) and removes a cgroup tree, leaves first.
  static void remove_tree(const std::string& dir) {
    if (DIR* d = ::opendir(dir.c_str())) {
      std::vector<std::string> kids;
      while (const dirent* de = ::readdir(d)) {
        if (de->d_type == DT_DIR && std::strcmp(de->d_name, ".") != 0 && std::strcmp(de->d_name, "..") != 0) {
          kids.push_back(fmt_path(dir, de->d_name));
        }
      }
      ::closedir(d);
      for (const std::string& k : kids) remove_tree(k);
    }
    base::UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (fd) {
      write_at(fd.get(), "cgroup.kill", "1");
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (!pids_in(fd.get()).empty() && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(5));
    }
    ::rmdir(dir.c_str());
  }
};

// One test cgroup and the children this test started in it. The destructor
// kills those children by pid and reaps them, kills what they started in
// turn (cgroup.kill), waits for the cgroup to be empty and removes it.
class TestCgroup {
 public:
  explicit TestCgroup(const std::string& name) : path_(Folder::path() + "/" + name) {
    if (::mkdir(path_.c_str(), 0755) != 0) {
      ADD_FAILURE() << "mkdir " << path_ << ": " << std::strerror(errno);
      return;
    }
    fd_ = base::UniqueFd(::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    auto id = cgroup_id_of(fd_.get());
    if (!id) {
      ADD_FAILURE() << id.error().message();
      return;
    }
    id_ = *id;
  }
  ~TestCgroup() {
    for (pid_t pid : children_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    Folder::remove_tree(path_);
  }
  TestCgroup(const TestCgroup&) = delete;
  TestCgroup& operator=(const TestCgroup&) = delete;

  int fd() const { return fd_.get(); }
  std::uint64_t id() const { return id_; }
  std::vector<int> procs() const { return pids_in(fd_.get()); }
  std::uint64_t usage_ns() const {
    std::istringstream in(read_at(fd_.get(), "cpu.stat"));
    std::string key;
    std::uint64_t value = 0;
    while (in >> key >> value) {
      if (key == "usage_usec") return value * 1000;
    }
    return 0;
  }

  // Starts `body` in a child born into this cgroup (clone3 with
  // CLONE_INTO_CGROUP: its fork is the cgroup's). The child exits 0 after.
  pid_t spawn(const std::function<void()>& body) {
    clone_args args{};
    args.flags = CLONE_INTO_CGROUP;
    args.exit_signal = SIGCHLD;
    args.cgroup = static_cast<std::uint64_t>(fd_.get());
    const long pid = ::syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) {
      body();
      ::_exit(0);
    }
    if (pid < 0) {
      ADD_FAILURE() << "clone3: " << std::strerror(errno);
      return -1;
    }
    children_.insert(static_cast<pid_t>(pid));
    return static_cast<pid_t>(pid);
  }
  pid_t spawn_exec(std::vector<std::string> argv) {
    return spawn([argv = std::move(argv)] {
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    });
  }
  // Starts `body` in a child that forks outside and moves itself in (the
  // daemon's path without CLONE_INTO_CGROUP): a migration, not a fork.
  pid_t spawn_migrating(const std::function<void()>& body) {
    const int dir = fd_.get();
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (!write_at(dir, "cgroup.procs", "0")) ::_exit(126);
      body();
      ::_exit(0);
    }
    if (pid > 0) children_.insert(pid);
    return pid;
  }
  // Reaps a child; returns its wait status.
  int wait(pid_t pid) {
    int status = -1;
    ::waitpid(pid, &status, 0);
    children_.erase(pid);
    return status;
  }
  void kill_and_wait(pid_t pid) {
    ::kill(pid, SIGKILL);
    wait(pid);
  }

 private:
  std::string path_;
  base::UniqueFd fd_;
  std::uint64_t id_ = 0;
  std::set<pid_t> children_;
};

// Polls until `done` or ~20 s (a guard against hangs, not a timing check).
bool eventually(const std::function<bool()>& done, int event_fd = -1) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (Clock::now() > deadline) return false;
    if (event_fd >= 0) {
      pollfd p{event_fd, POLLIN, 0};
      ::poll(&p, 1, 20);
    } else {
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  return true;
}

class BpfTelemetryTest : public ::testing::Test {
 protected:
  static std::string& skip_reason() {
    static std::string r;
    return r;
  }

  static void SetUpTestSuite() {
    if (::geteuid() != 0) {
      skip_reason() = "needs root and CAP_BPF: not root";
      return;
    }
    auto t = open_telemetry(Options{});
    if (!t) {
      skip_reason() = "needs root and CAP_BPF: " + t.error().message();
      return;
    }
    if ((*t)->mode() != Mode::kEbpf) {
      skip_reason() = "needs eBPF telemetry (CAP_BPF, kernel BTF, tp_btf): " + std::string((*t)->describe());
      return;
    }
    const std::string own = own_v2_dir();
    if (own.empty()) {
      skip_reason() = "needs a cgroup v2 hierarchy: none mounted";
      return;
    }
    Folder::remove_stale(own);
    Folder::path() = own + "/tandem-bpftest-" + std::to_string(::getpid());
    if (::mkdir(Folder::path().c_str(), 0755) != 0 && errno != EEXIST) {
      skip_reason() = "needs a writable cgroup v2 hierarchy: mkdir " + Folder::path() + ": " + std::strerror(errno);
    }
  }
  static void TearDownTestSuite() {
    if (!Folder::path().empty()) Folder::remove_tree(Folder::path());
  }

  void SetUp() override {
    if (!skip_reason().empty()) GTEST_SKIP() << skip_reason();
    auto t = open_telemetry(Options{});
    ASSERT_TRUE(t) << t.error().message();
    ASSERT_EQ((*t)->mode(), Mode::kEbpf) << (*t)->describe();
    ebpf_ = std::move(*t);
  }

  // Drains into events_ until `done` (polling the event fd).
  bool drain_until(const std::function<bool()>& done) {
    return eventually(
        [&] {
          ebpf_->drain_events([this](const ProcEvent& e) { events_.push_back(e); });
          return done();
        },
        ebpf_->event_fd());
  }
  std::size_t count(ProcEvent::Kind kind) const {
    std::size_t n = 0;
    for (const ProcEvent& e : events_) n += e.kind == kind ? 1 : 0;
    return n;
  }

  std::unique_ptr<Telemetry> ebpf_;
  std::vector<ProcEvent> events_;
};

TEST_F(BpfTelemetryTest, CgroupIdIsTheDirectorysInode) {
  TestCgroup cg("id");
  struct stat st {};
  ASSERT_EQ(::fstat(cg.fd(), &st), 0);
  EXPECT_EQ(cg.id(), st.st_ino);
  EXPECT_NE(cg.id(), 0u);
}

TEST_F(BpfTelemetryTest, EveryExecAndExitIsSeen) {
  TestCgroup cg("lifecycle");
  constexpr std::uint64_t kGroup = 0x5e55;
  ASSERT_TRUE(ebpf_->track(cg.id(), kGroup, cg.fd()));
  ASSERT_GE(ebpf_->event_fd(), 0);

  constexpr int kDirect = 100, kScripts = 4, kLoop = 5;
  std::set<pid_t> direct;
  for (int i = 0; i < kDirect; ++i) {
    const pid_t pid = cg.spawn_exec({"/bin/true"});
    ASSERT_GT(pid, 0);
    direct.insert(pid);
  }
  std::set<pid_t> scripts;
  for (int i = 0; i < kScripts; ++i) {
    scripts.insert(cg.spawn_exec({"/bin/sh", "-c", "for i in 1 2 3 4 5; do /bin/true; done"}));
  }
  const pid_t three = cg.spawn_exec({"/bin/sh", "-c", "exit 3"});
  const pid_t sleeper = cg.spawn_exec({"/bin/sleep", "1000"});
  for (pid_t pid : direct) EXPECT_EQ(cg.wait(pid), 0);
  for (pid_t pid : scripts) EXPECT_EQ(cg.wait(pid), 0);
  EXPECT_EQ(cg.wait(three), 3 << 8);
  // Killed only once it has exec'd (its exec event is in).
  ASSERT_TRUE(drain_until([&] {
    for (const ProcEvent& e : events_) {
      if (e.pid == sleeper && e.kind == ProcEvent::Kind::kExec) return true;
    }
    return false;
  }));
  cg.kill_and_wait(sleeper);

  // Everything forked in here (direct + scripts + their /bin/true children).
  const std::size_t processes = kDirect + kScripts + kScripts * kLoop + 2;
  ASSERT_TRUE(drain_until([&] { return count(ProcEvent::Kind::kExit) >= processes; }))
      << count(ProcEvent::Kind::kExit) << " exits of " << processes;
  EXPECT_EQ(ebpf_->drain_events([](const ProcEvent&) {}), 0u);
  EXPECT_EQ(ebpf_->lost_events(), 0u);

  std::map<pid_t, std::vector<const ProcEvent*>> by_pid;
  for (const ProcEvent& e : events_) {
    EXPECT_EQ(e.cgroup_id, cg.id());
    EXPECT_EQ(e.group, kGroup);
    EXPECT_GT(e.timestamp_ns, 0u);
    by_pid[e.pid].push_back(&e);
  }
  EXPECT_EQ(by_pid.size(), processes);
  // Each process: fork, exec, exit, in that order (a ring buffer is FIFO per
  // producer, and these happen on one task in sequence).
  std::size_t true_execs = 0;
  for (const auto& [pid, list] : by_pid) {
    ASSERT_EQ(list.size(), 3u) << "pid " << pid;
    EXPECT_EQ(list[0]->kind, ProcEvent::Kind::kFork) << pid;
    EXPECT_EQ(list[1]->kind, ProcEvent::Kind::kExec) << pid;
    EXPECT_EQ(list[2]->kind, ProcEvent::Kind::kExit) << pid;
    EXPECT_LE(list[0]->timestamp_ns, list[1]->timestamp_ns);
    EXPECT_LE(list[1]->timestamp_ns, list[2]->timestamp_ns);
    EXPECT_EQ(list[0]->exit_code, -1);
    EXPECT_EQ(list[1]->exit_code, -1);
    if (std::string(list[1]->comm) == "true") ++true_execs;
    if (direct.contains(pid) || scripts.contains(pid) || pid == three || pid == sleeper) {
      EXPECT_EQ(list[0]->ppid, ::getpid());
    } else {
      EXPECT_TRUE(scripts.contains(list[0]->ppid)) << "pid " << pid << " ppid " << list[0]->ppid;
    }
    const int code = pid == three ? 3 << 8 : pid == sleeper ? SIGKILL : 0;
    EXPECT_EQ(list[2]->exit_code, code) << "pid " << pid << " comm " << list[2]->comm;
  }
  EXPECT_EQ(true_execs, static_cast<std::size_t>(kDirect + kScripts * kLoop));

  const GroupStats& s = ebpf_->sample().at(kGroup);
  EXPECT_EQ(s.forks, processes);
  EXPECT_EQ(s.execs, processes);
  EXPECT_EQ(s.exits, processes);
  EXPECT_EQ(s.live_processes, 0u);
  EXPECT_GT(s.on_cpu_ns, 0u);
}

TEST_F(BpfTelemetryTest, OnCpuTimeIsWithinTwoPercentOfTheCgroupsAccounting) {
  TestCgroup a("cpu-a");
  TestCgroup b("cpu-b");
  constexpr std::uint64_t kGroup = 7;
  ASSERT_TRUE(ebpf_->track(a.id(), kGroup, a.fd()));
  ASSERT_TRUE(ebpf_->track(b.id(), kGroup, b.fd()));
  // ≥ 1.2 s of CPU in all: a single-threaded burner born in `a`, a two-thread
  // one that moves itself into `b`, and a shell loop of short processes.
  std::vector<pid_t> a_kids = {a.spawn([] { burn_thread_cpu(0.6); }),
                               a.spawn_exec({"/bin/sh", "-c", "for i in $(seq 50); do /bin/true; done"})};
  const pid_t b_kid = b.spawn_migrating([] {
    std::thread helper([] { burn_thread_cpu(0.3); });
    burn_thread_cpu(0.3);
    helper.join();
  });
  for (pid_t pid : a_kids) EXPECT_EQ(a.wait(pid), 0);
  EXPECT_EQ(b.wait(b_kid), 0);

  // The last switch-out of an exited task can trail its reaping by a moment:
  // both sides settle to the same value. Check until they agree or 20 s pass.
  double ebpf_ns = 0, cgroup_ns = 0;
  eventually([&] {
    ebpf_ns = static_cast<double>(ebpf_->sample().at(kGroup).on_cpu_ns);
    cgroup_ns = static_cast<double>(a.usage_ns() + b.usage_ns());
    return std::abs(ebpf_ns - cgroup_ns) <= 0.02 * cgroup_ns;
  });
  EXPECT_GE(cgroup_ns, 1.2e9);
  EXPECT_NEAR(ebpf_ns, cgroup_ns, 0.02 * cgroup_ns) << "eBPF " << ebpf_ns << " ns, cpu.stat " << cgroup_ns << " ns";
}

TEST_F(BpfTelemetryTest, LiveProcessesAgreeWithTheSamplerAndCgroupProcs) {
  TestCgroup cg("live");
  constexpr std::uint64_t kGroup = 3;
  // Three processes before tracking: seeded by both.
  std::vector<pid_t> sleepers;
  sleepers.reserve(7);
  for (int i = 0; i < 3; ++i) sleepers.push_back(cg.spawn_exec({"/bin/sleep", "1000"}));
  ASSERT_TRUE(eventually([&] { return cg.procs().size() == 3; }));
  auto sampler = open_sampler();
  ASSERT_TRUE(sampler);
  ASSERT_TRUE(ebpf_->track(cg.id(), kGroup, cg.fd()));
  ASSERT_TRUE((*sampler)->track(cg.id(), kGroup, cg.fd()));
  EXPECT_EQ(ebpf_->sample().at(kGroup).live_processes, 3u);
  EXPECT_EQ((*sampler)->sample().at(kGroup).live_processes, 3u);

  // Then: born inside, moved inside, and a shell that starts two of its own.
  for (int i = 0; i < 2; ++i) sleepers.push_back(cg.spawn_exec({"/bin/sleep", "1000"}));
  for (int i = 0; i < 2; ++i) sleepers.push_back(cg.spawn_migrating([] { ::pause(); }));
  const pid_t shell = cg.spawn_exec({"/bin/sh", "-c", "/bin/sleep 1000 & /bin/sleep 1000 & wait"});
  constexpr std::size_t kAll = 3 + 2 + 2 + 3;
  ASSERT_TRUE(eventually([&] { return cg.procs().size() == kAll; })) << cg.procs().size();
  auto agree = [&](std::size_t want) {
    const std::size_t procs = cg.procs().size();
    const std::uint64_t ebpf = ebpf_->sample().at(kGroup).live_processes;
    const std::uint64_t sampled = (*sampler)->sample().at(kGroup).live_processes;
    EXPECT_EQ(procs, want);
    EXPECT_EQ(ebpf, procs);
    EXPECT_EQ(sampled, procs);
  };
  agree(kAll);
  const auto& sampled = (*sampler)->sample().at(kGroup);
  EXPECT_EQ(sampled.forks, kAll - 3);                         // every new pid, whichever way it came
  EXPECT_EQ(ebpf_->sample().at(kGroup).forks, kAll - 3 - 2);  // a migration is not a fork

  // Two of the first, one moved in, and the shell (its children stay: orphans).
  cg.kill_and_wait(sleepers[0]);
  cg.kill_and_wait(sleepers[1]);
  cg.kill_and_wait(sleepers[5]);
  cg.kill_and_wait(shell);
  agree(kAll - 4);
  EXPECT_EQ(ebpf_->sample().at(kGroup).exits, 4u);
  EXPECT_EQ((*sampler)->sample().at(kGroup).exits, 4u);
}

TEST_F(BpfTelemetryTest, MigrationMovesTheLiveCountBetweenGroups) {
  TestCgroup a("mig-a");
  TestCgroup b("mig-b");
  TestCgroup c("mig-c");  // untracked
  ASSERT_TRUE(ebpf_->track(a.id(), 1, a.fd()));
  ASSERT_TRUE(ebpf_->track(b.id(), 2, b.fd()));
  const pid_t pid = a.spawn_exec({"/bin/sleep", "1000"});
  auto live = [&](std::uint64_t g) { return ebpf_->sample().at(g).live_processes; };
  EXPECT_EQ(live(1), 1u);
  EXPECT_EQ(live(2), 0u);
  ASSERT_TRUE(write_at(b.fd(), "cgroup.procs", std::to_string(pid)));
  EXPECT_EQ(live(1), 0u);
  EXPECT_EQ(live(2), 1u);
  ASSERT_TRUE(write_at(c.fd(), "cgroup.procs", std::to_string(pid)));
  EXPECT_EQ(live(1), 0u);
  EXPECT_EQ(live(2), 0u);
  ASSERT_TRUE(write_at(a.fd(), "cgroup.procs", std::to_string(pid)));
  EXPECT_EQ(live(1), 1u);
  a.kill_and_wait(pid);
  EXPECT_EQ(live(1), 0u);
  EXPECT_EQ(ebpf_->sample().at(1).exits, 1u);
  EXPECT_EQ(ebpf_->sample().at(2).exits, 0u);
}

TEST_F(BpfTelemetryTest, UntrackStopsAccountingAndRetrackSeeds) {
  TestCgroup cg("untrack");
  constexpr std::uint64_t kGroup = 11;
  ASSERT_TRUE(ebpf_->track(cg.id(), kGroup, cg.fd()));
  EXPECT_EQ(cg.wait(cg.spawn([] { burn_thread_cpu(0.1); })), 0);
  EXPECT_EQ(cg.wait(cg.spawn_exec({"/bin/true"})), 0);
  const pid_t sleeper = cg.spawn_exec({"/bin/sleep", "1000"});
  ASSERT_TRUE(drain_until([&] { return count(ProcEvent::Kind::kExit) == 2 && count(ProcEvent::Kind::kExec) == 2; }));
  EXPECT_GE(ebpf_->sample().at(kGroup).on_cpu_ns, 100'000'000u);
  EXPECT_EQ(ebpf_->sample().at(kGroup).live_processes, 1u);

  ebpf_->untrack(cg.id());
  // (After untrack: a late last switch-out of the burner is not charged either.)
  const GroupStats before = ebpf_->sample().at(kGroup);
  EXPECT_EQ(cg.wait(cg.spawn([] { burn_thread_cpu(0.1); })), 0);
  EXPECT_EQ(cg.wait(cg.spawn_exec({"/bin/true"})), 0);
  const GroupStats after = ebpf_->sample().at(kGroup);  // stays until forget_group
  EXPECT_EQ(after.on_cpu_ns, before.on_cpu_ns);
  EXPECT_EQ(after.forks, before.forks);
  EXPECT_EQ(after.execs, before.execs);
  EXPECT_EQ(after.exits, before.exits);
  EXPECT_EQ(after.live_processes, 0u);  // its cgroup is no longer the group's
  events_.clear();
  EXPECT_EQ(ebpf_->drain_events([this](const ProcEvent& e) { events_.push_back(e); }), 0u);

  // Tracked again: the sleeper is seeded once, and its exit balances it.
  ASSERT_TRUE(ebpf_->track(cg.id(), kGroup, cg.fd()));
  EXPECT_EQ(ebpf_->sample().at(kGroup).live_processes, 1u);
  cg.kill_and_wait(sleeper);
  EXPECT_EQ(ebpf_->sample().at(kGroup).live_processes, 0u);

  ebpf_->forget_group(kGroup);
  EXPECT_FALSE(ebpf_->sample().contains(kGroup));
  // Forgetting untracked the cgroup too: nothing more is counted anywhere.
  EXPECT_EQ(cg.wait(cg.spawn_exec({"/bin/true"})), 0);
  EXPECT_FALSE(ebpf_->sample().contains(kGroup));
}

TEST_F(BpfTelemetryTest, ALoneEventWakesAWaitingReader) {
  TestCgroup cg("wakeup");
  ASSERT_TRUE(ebpf_->track(cg.id(), 1, cg.fd()));
  // Fork now, exec 300 ms later: far more than wakeup_interval after the
  // fork's wakeup, so the exec record must wake a reader already waiting.
  const pid_t pid = cg.spawn([] {
    ::usleep(300'000);
    ::execl("/bin/true", "true", nullptr);
  });
  auto seen = [&](ProcEvent::Kind kind) {
    return std::any_of(events_.begin(), events_.end(),
                       [&](const ProcEvent& e) { return e.pid == pid && e.kind == kind; });
  };
  ASSERT_TRUE(drain_until([&] { return seen(ProcEvent::Kind::kFork); }));
  if (!seen(ProcEvent::Kind::kExec)) {  // (on a very slow machine it may be drained already)
    pollfd p{ebpf_->event_fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 10'000), 1) << "no wakeup for the exec record";
  }
  EXPECT_EQ(cg.wait(pid), 0);
}

TEST_F(BpfTelemetryTest, TrackingIntoAnotherGroupIsRefused) {
  TestCgroup cg("eexist");
  ASSERT_TRUE(ebpf_->track(cg.id(), 1, cg.fd()));
  EXPECT_TRUE(ebpf_->track(cg.id(), 1, cg.fd()));
  auto again = ebpf_->track(cg.id(), 2, cg.fd());
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), EEXIST);
}

TEST_F(BpfTelemetryTest, RunQueueDelayWhenBurnersOutnumberCores) {
  TestCgroup cg("runq");
  constexpr std::uint64_t kGroup = 21;
  auto sampler = open_sampler();
  ASSERT_TRUE(sampler);
  ASSERT_TRUE(ebpf_->track(cg.id(), kGroup, cg.fd()));
  ASSERT_TRUE((*sampler)->track(cg.id(), kGroup, cg.fd()));
  const long cores = std::max(2L, ::sysconf(_SC_NPROCESSORS_ONLN));
  std::vector<pid_t> burners;
  burners.reserve(static_cast<std::size_t>(2 * cores));
  for (long i = 0; i < 2 * cores; ++i) burners.push_back(cg.spawn([] { burn_thread_cpu(0.25); }));
  // The sampler samples while they run, as the daemon's control tick would.
  for (;;) {
    (*sampler)->sample();
    bool running = false;
    for (pid_t pid : burners) {
      if (::waitpid(pid, nullptr, WNOHANG) == 0) running = true;
    }
    if (!running) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  for (pid_t pid : burners) cg.wait(pid);  // already reaped; forgets them

  const GroupStats& s = ebpf_->sample().at(kGroup);
  EXPECT_GT(s.runq_waits, 0u);
  EXPECT_GT(s.runq_delay_ns, 0u);
  std::uint64_t in_hist = 0;
  for (std::uint64_t n : s.runq_hist) in_hist += n;
  EXPECT_EQ(in_hist, s.runq_waits);
  EXPECT_GT((*sampler)->sample().at(kGroup).runq_delay_ns, 0u);
}

}  // namespace
}  // namespace tandem::bpf
