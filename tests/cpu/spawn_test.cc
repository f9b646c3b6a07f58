// cpu::spawn / wait_exit on the real kernel, with tandem-test-tool as the
// command. The placement tests run as root (skipped otherwise) in cgroups
// created beneath this process's own cgroup in each hierarchy
// (tandem-spawntest-<pid>-<n>), whose processes are killed and which are
// removed at the end of every test; leftovers of a crashed run are swept on
// the next. Every test reaps what it spawned, so "no zombie left" is checked
// by asking the kernel whether this process has any child at all.
#include "cpu/spawn.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cpu/parse.h"

#ifndef TANDEM_TEST_TOOL
#error "TANDEM_TEST_TOOL must be the path of tandem-test-tool (tests/cpu/CMakeLists.txt)"
#endif

namespace tandem::cpu {
namespace {

constexpr const char* kTool = TANDEM_TEST_TOOL;
constexpr const char* kBwrap = "/usr/bin/bwrap";
constexpr uid_t kNobody = 65534;

bool is_root() { return ::geteuid() == 0; }

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

std::string read_path(const std::string& path) {
  base::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  return fd ? read_all(fd.get()) : std::string();
}

// Whether this process has a child of any kind, zombie or alive (without reaping it).
bool has_children() {
  siginfo_t info{};
  int r = ::waitid(P_ALL, 0, &info, WEXITED | WSTOPPED | WCONTINUED | WNOHANG | WNOWAIT);
  return !(r < 0 && errno == ECHILD);
}

// A spawned process that is killed and reaped if the test ends before it does.
class Child {
 public:
  explicit Child(Spawned s) : s_(std::move(s)) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (s_.pidfd && !reaped_) {
      (void)send_signal(s_.pidfd.get(), SIGKILL);
      (void)wait_exit(s_.pidfd.get(), -1);
    }
  }
  base::Result<ExitStatus> wait(int timeout_ms = -1) {
    auto r = wait_exit(s_.pidfd.get(), timeout_ms);
    if (r) reaped_ = true;
    return r;
  }
  const Spawned& spawned() const { return s_; }
  pid_t pid() const { return s_.pid; }
  int pidfd() const { return s_.pidfd.get(); }

 private:
  Spawned s_;
  bool reaped_ = false;
};

struct ToolRun {
  Spawned spawned;  // pidfd already reaped
  std::string out;
  ExitStatus status;
};

// Spawns `spec` with its stdout on a pipe, reads the pipe to EOF, waits.
base::Result<ToolRun> run_tool(SpawnSpec spec, const CgroupDirs& placement = {}) {
  std::array<int, 2> p{};
  if (::pipe2(p.data(), O_CLOEXEC) < 0) return base::errno_error("pipe2");
  base::UniqueFd rd(p[0]);
  base::UniqueFd wr(p[1]);
  spec.stdout_fd = wr.get();
  auto s = spawn(spec, placement);
  if (!s) return base::propagate(std::move(s.error()));
  wr.reset();
  Child child(std::move(*s));
  ToolRun out;
  out.out = read_all(rd.get());
  auto st = child.wait();
  if (!st) return base::propagate(std::move(st.error()));
  out.status = *st;
  out.spawned.pid = child.pid();
  out.spawned.started_ns = child.spawned().started_ns;
  out.spawned.method = child.spawned().method;
  return out;
}

SpawnSpec tool(std::vector<std::string> args) {
  SpawnSpec spec;
  spec.argv.push_back(kTool);
  for (auto& a : args) spec.argv.push_back(std::move(a));
  return spec;
}

// `tandem-test-tool self`'s output: key=value lines, cgroup= lines apart.
struct SelfReport {
  std::map<std::string, std::string> kv;
  std::string cgroup_text;  // as /proc/self/cgroup
};
SelfReport parse_self(const std::string& out) {
  SelfReport r;
  std::size_t pos = 0;
  while (pos < out.size()) {
    std::size_t eol = out.find('\n', pos);
    if (eol == std::string::npos) eol = out.size();
    std::string line = out.substr(pos, eol - pos);
    pos = eol + 1;
    std::size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    if (line.starts_with("cgroup=")) {
      r.cgroup_text += line.substr(eq + 1) + "\n";
    } else {
      r.kv[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  return r;
}

std::set<int> parse_fd_list(const std::string& text) {
  std::set<int> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    out.insert(std::stoi(text.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return out;
}

std::set<int> fds_above_stdio(const SelfReport& r) {
  std::set<int> all = parse_fd_list(r.kv.at("fds"));
  return {all.upper_bound(2), all.end()};
}

// A temporary directory, removed with its contents.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tandem-spawntest-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = std::filesystem::canonical(tmpl).string();
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---- Real cgroups beneath our own. ----

struct TestCgroup {
  unsigned hierarchy = 0;                // as in /proc/<pid>/cgroup
  std::vector<std::string> controllers;  // v1: the hierarchy's controllers
  std::string path;                      // within the hierarchy, as /proc/<pid>/cgroup shows it
  std::string dir;                       // on the filesystem
  base::UniqueFd fd;                     // O_PATH | O_DIRECTORY
};

// Kills whatever is in `dir` and removes it. cgroupfs has no event for "empty"
// in v1, so this polls, briefly, in a teardown only.
void kill_and_remove(const std::string& dir) {
  for (int attempt = 0; attempt < 500; ++attempt) {
    std::string procs = read_path(dir + "/cgroup.procs");
    auto pids = parse_pids(procs);
    if (pids && !pids->empty()) {
      for (int pid : *pids) ::kill(pid, SIGKILL);
    } else if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) {
      return;
    } else if (errno != EBUSY) {
      ADD_FAILURE() << "rmdir " << dir << ": " << std::strerror(errno);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "could not empty and remove " << dir;
}

// Removes tandem-spawntest-<pid>-* folders in `parent` whose test process is gone.
void sweep_stale(const std::string& parent) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(parent, ec)) {
    std::string name = e.path().filename().string();
    if (!name.starts_with("tandem-spawntest-") || !e.is_directory(ec)) continue;
    int pid = std::atoi(name.c_str() + std::strlen("tandem-spawntest-"));
    if (pid > 0 && ::kill(pid, 0) < 0 && errno == ESRCH) kill_and_remove(e.path().string());
  }
}

// The v2 cgroup and the v1 cgroups of `v1_controllers` (those this machine
// mounts) created for one test, killed and removed with it.
class TestCgroups {
 public:
  // nullptr with `why` set when they cannot be made here.
  static std::unique_ptr<TestCgroups> create(const std::vector<std::string>& v1_controllers, std::string& why) {
    if (!is_root()) {
      why = "needs root to create cgroups";
      return nullptr;
    }
    auto members = parse_proc_cgroup(read_path("/proc/self/cgroup"));
    auto mounts = parse_mountinfo(read_path("/proc/self/mountinfo"));
    if (!members || !mounts) {
      why = "cannot read /proc/self/cgroup or /proc/self/mountinfo";
      return nullptr;
    }
    static int seq = 0;
    std::string name = fmt::format("tandem-spawntest-{}-{}", ::getpid(), seq++);
    auto set = std::unique_ptr<TestCgroups>(new TestCgroups);
    for (const auto& m : *members) {
      const bool v2 = m.hierarchy == 0 && m.controllers.empty();
      bool wanted = v2;
      for (const auto& c : v1_controllers) {
        if (!v2 && std::find(m.controllers.begin(), m.controllers.end(), c) != m.controllers.end()) wanted = true;
      }
      if (!wanted) continue;
      auto sorted = [](std::vector<std::string> v) {
        std::sort(v.begin(), v.end());
        return v;
      };
      const CgroupMount* mount = nullptr;
      for (const auto& mt : *mounts) {
        if (mt.v2 == v2 && (v2 || sorted(mt.controllers) == sorted(m.controllers)) && m.path.starts_with(mt.root)) {
          mount = &mt;
          break;
        }
      }
      if (mount == nullptr) continue;
      std::string own = mount->mount_point + (mount->root == "/" ? m.path : m.path.substr(mount->root.size()));
      if (own.ends_with('/')) own.pop_back();
      sweep_stale(own);
      TestCgroup cg;
      cg.hierarchy = m.hierarchy;
      cg.controllers = m.controllers;
      cg.path = fmt::format("{}/{}", m.path == "/" ? "" : m.path, name);
      cg.dir = fmt::format("{}/{}", own, name);
      if (::mkdir(cg.dir.c_str(), 0755) < 0) {
        why = fmt::format("mkdir {}: {}", cg.dir, std::strerror(errno));
        return nullptr;
      }
      cg.fd.reset(::open(cg.dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (!cg.fd) {
        why = fmt::format("open {}: {}", cg.dir, std::strerror(errno));
        ::rmdir(cg.dir.c_str());
        return nullptr;
      }
      (v2 ? set->v2_ : set->v1_).push_back(std::move(cg));
    }
    return set;
  }
  TestCgroups(const TestCgroups&) = delete;
  TestCgroups& operator=(const TestCgroups&) = delete;
  ~TestCgroups() {
    for (auto& cg : v2_) kill_and_remove(cg.dir);
    for (auto& cg : v1_) kill_and_remove(cg.dir);
  }

  const TestCgroup* v2() const { return v2_.empty() ? nullptr : &v2_[0]; }
  const std::vector<TestCgroup>& v1() const { return v1_; }

  CgroupDirs placement() const {
    CgroupDirs p;
    if (v2() != nullptr) p.v2_dir = v2()->fd.get();
    for (const auto& cg : v1_) p.v1_dirs.push_back(cg.fd.get());
    return p;
  }

  // Expects `cgroup_text` (a /proc/<pid>/cgroup) to put the process in every test cgroup.
  void expect_member(const std::string& cgroup_text) const {
    auto members = parse_proc_cgroup(cgroup_text);
    ASSERT_TRUE(members) << members.error().message() << "\n" << cgroup_text;
    auto check = [&](const TestCgroup& cg) {
      auto it = std::find_if(members->begin(), members->end(), [&](const CgroupMembership& m) {
        return m.hierarchy == cg.hierarchy && m.controllers == cg.controllers;
      });
      ASSERT_NE(it, members->end()) << "hierarchy " << cg.hierarchy << " missing in\n" << cgroup_text;
      EXPECT_EQ(it->path, cg.path) << "hierarchy " << cg.hierarchy;
    };
    for (const auto& cg : v2_) check(cg);
    for (const auto& cg : v1_) check(cg);
  }

 private:
  TestCgroups() = default;
  std::vector<TestCgroup> v2_;  // zero or one
  std::vector<TestCgroup> v1_;
};

const std::vector<std::string> kV1Controllers = {"cpu", "memory", "pids"};

// Whether clone3 knows CLONE_INTO_CGROUP: asked with a directory fd that is no
// cgroup, which such a kernel refuses with EBADF before creating anything (an
// older one answers EINVAL or E2BIG, one without clone3 ENOSYS).
bool kernel_has_clone_into_cgroup() {
  base::UniqueFd root(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  std::array<std::uint64_t, 11> args{};
  args[0] = 0x200000000ULL;  // flags = CLONE_INTO_CGROUP
  args[4] = SIGCHLD;         // exit_signal
  args[10] = static_cast<std::uint64_t>(root.get());
  long r = ::syscall(SYS_clone3, args.data(), sizeof args);
  if (r == 0) ::_exit(0);  // not reached: "/" is no cgroup2 directory
  if (r > 0) {
    ::waitpid(static_cast<pid_t>(r), nullptr, 0);
    return true;
  }
  return errno == EBADF;
}

// ---- Placement. ----

TEST(SpawnPlacement, Clone3PutsTheProcessIntoEveryCgroup) {
  std::string why;
  auto cgs = TestCgroups::create(kV1Controllers, why);
  if (!cgs) GTEST_SKIP() << why;
  if (cgs->v2() == nullptr) GTEST_SKIP() << "no cgroup2 hierarchy mounted";
  auto r = run_tool(tool({"self"}), cgs->placement());
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->status.exit_code, 0);
  if (kernel_has_clone_into_cgroup()) {
    // In the v2 cgroup from its first instruction: the kernel placed it at clone.
    EXPECT_EQ(r->spawned.method, SpawnMethod::kClone3IntoCgroup);
  } else {
    EXPECT_NE(r->spawned.method, SpawnMethod::kClone3IntoCgroup);
  }
  SelfReport self = parse_self(r->out);
  EXPECT_EQ(self.kv["pid"], std::to_string(r->spawned.pid));
  cgs->expect_member(self.cgroup_text);
}

TEST(SpawnPlacement, TheFallbacksJoinThroughCgroupProcs) {
  std::string why;
  auto cgs = TestCgroups::create(kV1Controllers, why);
  if (!cgs) GTEST_SKIP() << why;
  if (cgs->v2() == nullptr) GTEST_SKIP() << "no cgroup2 hierarchy mounted";
  for (SpawnMethod method : {SpawnMethod::kClone3, SpawnMethod::kFork}) {
    SCOPED_TRACE(static_cast<int>(method));
    SpawnSpec spec = tool({"self"});
    spec.method = method;
    auto r = run_tool(spec, cgs->placement());
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(r->status.exit_code, 0);
    // kClone3 becomes kFork only where clone3 is missing altogether.
    if (method == SpawnMethod::kFork || ::syscall(SYS_clone3, nullptr, 0) != -1 || errno != ENOSYS) {
      EXPECT_EQ(r->spawned.method, method);
    }
    cgs->expect_member(parse_self(r->out).cgroup_text);
  }
}

// Runs `tandem-test-tool self` through spawn() in a forked helper whose clone3
// answers `error` (for every call, or only for the 88-byte struct that carries
// the cgroup field), as a seccomp filter in a container or an older kernel
// would. Returns "<method>\n<self output>", or what went wrong.
std::string spawn_with_clone3_failing(int error, bool only_with_cgroup_field, const CgroupDirs& placement) {
  std::array<int, 2> p{};
  if (::pipe2(p.data(), O_CLOEXEC) < 0) return "pipe2 failed";
  base::UniqueFd rd(p[0]);
  base::UniqueFd wr(p[1]);
  pid_t helper = ::fork();
  if (helper < 0) return "fork failed";
  if (helper == 0) {
    std::array<sock_filter, 6> filter = {{
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[1])),  // size, low half
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, only_with_cgroup_field ? 88u : 0u, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<unsigned>(error) & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    }};
    if (!only_with_cgroup_field) {
      filter[2] = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<unsigned>(error) & SECCOMP_RET_DATA));
    }
    sock_fprog prog{static_cast<unsigned short>(filter.size()), filter.data()};
    std::string out;
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0) {
      out = fmt::format("seccomp: {}", std::strerror(errno));
    } else if (auto r = run_tool(tool({"self"}), placement); !r) {
      out = r.error().message();
    } else {
      out = fmt::format("{}\n{}", static_cast<int>(r->spawned.method), r->out);
    }
    (void)!::write(wr.get(), out.data(), out.size());
    ::_exit(0);
  }
  wr.reset();
  std::string out = read_all(rd.get());
  int status = 0;
  ::waitpid(helper, &status, 0);
  return out;
}

TEST(SpawnPlacement, FallsBackWhereTheKernelLacksClone3OrItsCgroupField) {
  std::string why;
  auto cgs = TestCgroups::create(kV1Controllers, why);
  if (!cgs) GTEST_SKIP() << why;
  if (cgs->v2() == nullptr) GTEST_SKIP() << "no cgroup2 hierarchy mounted";
  struct Case {
    int error;
    bool only_with_cgroup_field;
    SpawnMethod expected;
  };
  for (const Case& c : {Case{ENOSYS, false, SpawnMethod::kFork},      // no clone3 (seccomp, < 5.3)
                        Case{E2BIG, true, SpawnMethod::kClone3},      // 5.3-5.6: struct longer than it knows
                        Case{EINVAL, true, SpawnMethod::kClone3}}) {  // a kernel that rejects the flag
    SCOPED_TRACE(c.error);
    std::string out = spawn_with_clone3_failing(c.error, c.only_with_cgroup_field, cgs->placement());
    std::size_t eol = out.find('\n');
    ASSERT_NE(eol, std::string::npos) << out;
    EXPECT_EQ(out.substr(0, eol), std::to_string(static_cast<int>(c.expected)));
    cgs->expect_member(parse_self(out.substr(eol + 1)).cgroup_text);
  }
  // A refusal of the placement itself is not retried another way.
  std::string out = spawn_with_clone3_failing(EACCES, true, cgs->placement());
  EXPECT_NE(out.find("clone3 into v2 cgroup"), std::string::npos) << out;
  EXPECT_FALSE(has_children());
}

TEST(SpawnPlacement, ADaemonizedGrandchildStaysInTheCgroups) {
  std::string why;
  auto cgs = TestCgroups::create(kV1Controllers, why);
  if (!cgs) GTEST_SKIP() << why;
  auto r = run_tool(tool({"daemonize", "60"}), cgs->placement());
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->status.exit_code, 0);
  int grandchild = std::atoi(r->out.c_str());
  ASSERT_GT(grandchild, 0) << r->out;
  // Escaped from the tool's session and process tree, but not from its cgroups
  // (which ~TestCgroups kills).
  EXPECT_NE(::getsid(grandchild), r->spawned.pid);
  EXPECT_GT(::getsid(grandchild), 0);
  cgs->expect_member(read_path(fmt::format("/proc/{}/cgroup", grandchild)));
  EXPECT_FALSE(has_children());
}

TEST(SpawnPlacement, JoinFailuresNameTheStepAndLeaveNoZombie) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  base::UniqueFd not_cgroup(::open(tmp.path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(not_cgroup);

  CgroupDirs v1;
  v1.v1_dirs = {not_cgroup.get()};
  auto r = spawn(tool({"exit", "0"}), v1);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOENT);
  EXPECT_NE(r.error().context().find("join v1 cgroup 0"), std::string::npos) << r.error().message();
  EXPECT_FALSE(has_children());

  CgroupDirs v2;
  v2.v2_dir = not_cgroup.get();
  r = spawn(tool({"exit", "0"}), v2);  // refused by clone3 itself
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EBADF) << r.error().message();
  EXPECT_NE(r.error().context().find("clone3 into v2 cgroup"), std::string::npos) << r.error().message();
  EXPECT_FALSE(has_children());

  SpawnSpec forked = tool({"exit", "0"});
  forked.method = SpawnMethod::kFork;
  r = spawn(forked, v2);  // refused when the child writes cgroup.procs
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOENT);
  EXPECT_NE(r.error().context().find("join v2 cgroup"), std::string::npos) << r.error().message();
  EXPECT_FALSE(has_children());

  std::string why;
  auto cgs = TestCgroups::create(kV1Controllers, why);
  if (!cgs || cgs->v1().empty()) return;  // the index of a later v1 dir needs a real first one
  CgroupDirs second = cgs->placement();
  second.v1_dirs.push_back(not_cgroup.get());
  r = spawn(tool({"exit", "0"}), second);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().context().find(fmt::format("join v1 cgroup {}", cgs->v1().size())), std::string::npos)
      << r.error().message();
  EXPECT_FALSE(has_children());
}

// Drops the effective uid to `uid` for a scope (the real uid stays root, so it comes back).
class EffectiveUid {
 public:
  explicit EffectiveUid(uid_t uid) { ok_ = ::seteuid(uid) == 0; }
  EffectiveUid(const EffectiveUid&) = delete;
  EffectiveUid& operator=(const EffectiveUid&) = delete;
  ~EffectiveUid() {
    if (ok_) {
      EXPECT_EQ(::seteuid(0), 0);
    }
  }
  bool ok() const { return ok_; }

 private:
  bool ok_ = false;
};

TEST(SpawnPlacement, PermissionErrorsSayWhoMaySpawn) {
  std::string why;
  auto cgs = TestCgroups::create(kV1Controllers, why);
  if (!cgs) GTEST_SKIP() << why;
  const std::string hint = "root or inside the delegated subtree";
  if (cgs->v2() != nullptr) {
    CgroupDirs p;
    p.v2_dir = cgs->v2()->fd.get();
    EffectiveUid nobody(kNobody);
    ASSERT_TRUE(nobody.ok());
    auto r = spawn(tool({"exit", "0"}), p);
    ASSERT_FALSE(r);
    EXPECT_TRUE(r.error().code() == EACCES || r.error().code() == EPERM) << r.error().message();
    EXPECT_NE(r.error().context().find(hint), std::string::npos) << r.error().message();
  }
  if (!cgs->v1().empty()) {
    CgroupDirs p;
    p.v1_dirs = {cgs->v1()[0].fd.get()};
    EffectiveUid nobody(kNobody);
    ASSERT_TRUE(nobody.ok());
    auto r = spawn(tool({"exit", "0"}), p);
    ASSERT_FALSE(r);
    EXPECT_TRUE(r.error().code() == EACCES || r.error().code() == EPERM) << r.error().message();
    EXPECT_NE(r.error().context().find("join v1 cgroup 0"), std::string::npos) << r.error().message();
    EXPECT_NE(r.error().context().find(hint), std::string::npos) << r.error().message();
  }
  EXPECT_FALSE(has_children());
}

// ---- Exec, spec and process state. ----

TEST(Spawn, ExecFailureNamesThePathAndLeavesNoZombie) {
  base::UniqueFd devnull(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  SpawnSpec sanity = tool({});  // the tool itself starts (and complains: no command)
  sanity.stderr_fd = devnull.get();
  auto r = spawn(sanity, {});
  ASSERT_TRUE(r) << r.error().message();
  {
    Child c(std::move(*r));
    auto st = c.wait();
    ASSERT_TRUE(st);
    EXPECT_EQ(st->exit_code, 2);  // usage error: no command
  }

  SpawnSpec missing;
  missing.argv = {"/no/such/tool", "arg"};
  r = spawn(missing, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOENT);
  EXPECT_EQ(r.error().context(), "execve /no/such/tool");
  EXPECT_FALSE(has_children());

  SpawnSpec unfound;
  unfound.argv = {"tandem-no-such-tool"};
  unfound.env = {"PATH=/nonexistent:/also/nonexistent"};
  r = spawn(unfound, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOENT);
  EXPECT_NE(r.error().context().find("tandem-no-such-tool"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().context().find("PATH=/nonexistent:/also/nonexistent"), std::string::npos);
  EXPECT_FALSE(has_children());

  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  std::string not_exec = tmp.path() + "/not-exec";
  { base::UniqueFd f(::open(not_exec.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644)); }
  SpawnSpec denied;
  denied.argv = {not_exec};
  r = spawn(denied, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EACCES);
  EXPECT_EQ(r.error().context(), "execve " + not_exec);
  EXPECT_FALSE(has_children());

  SpawnSpec bad_cwd = tool({"exit", "0"});
  bad_cwd.cwd = "/no/such/dir";
  r = spawn(bad_cwd, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOENT);
  EXPECT_EQ(r.error().context(), "chdir /no/such/dir");
  EXPECT_FALSE(has_children());
}

TEST(Spawn, PathSearchFollowsExecvpe) {
  // An earlier PATH entry holding a non-executable file of the same name is
  // passed over (EACCES is remembered, not final); argv[0] stays as given.
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  { base::UniqueFd f(::open((tmp.path() + "/tandem-test-tool").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644)); }
  std::string tool_dir = std::filesystem::path(kTool).parent_path().string();
  SpawnSpec spec;
  spec.argv = {"tandem-test-tool", "exit", "7"};
  spec.env = {"PATH=/nonexistent:" + tmp.path() + ":" + tool_dir};
  auto r = run_tool(spec);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->status.exit_code, 7);

  // With only the non-executable candidate, EACCES is the answer.
  spec.env = {"PATH=/nonexistent:" + tmp.path()};
  auto e = spawn(spec, {});
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code(), EACCES);
  EXPECT_NE(e.error().context().find(tmp.path() + "/tandem-test-tool"), std::string::npos) << e.error().message();
  EXPECT_FALSE(has_children());
}

TEST(Spawn, BadSpecsAreEinvalAndStartNothing) {
  auto expect_einval = [](const SpawnSpec& spec, const std::string& what) {
    auto r = spawn(spec, {});
    ASSERT_FALSE(r) << what;
    EXPECT_EQ(r.error().code(), EINVAL) << what;
    EXPECT_NE(r.error().context().find(what), std::string::npos) << r.error().message();
  };
  expect_einval(SpawnSpec{}, "empty argv");
  SpawnSpec s;
  s.argv = {""};
  expect_einval(s, "empty argv[0]");
  s = tool({std::string("a\0b", 3)});
  expect_einval(s, "argv[1] contains a NUL");
  s = tool({});
  s.env = {"A=1", std::string("B=\0", 3)};
  expect_einval(s, "env[1] contains a NUL");
  s = tool({});
  s.cwd = std::string("/\0tmp", 5);
  expect_einval(s, "cwd contains a NUL");
  s = tool({});
  s.bwrap_args = {"--unshare-pid"};
  expect_einval(s, "bwrap_args given without bwrap");
  s = tool({});
  s.keep_fds = {1};
  expect_einval(s, "keep_fds holds 1");
  EXPECT_FALSE(has_children());
}

// Ignores SIGPIPE and blocks SIGUSR1 in this thread for a scope: state a
// daemon commonly has and a tool must not inherit.
class HostileSignalState {
 public:
  HostileSignalState() {
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ign, &old_pipe_);
    sigset_t set;
    ::sigemptyset(&set);
    ::sigaddset(&set, SIGUSR1);
    ::pthread_sigmask(SIG_BLOCK, &set, &old_mask_);
  }
  HostileSignalState(const HostileSignalState&) = delete;
  HostileSignalState& operator=(const HostileSignalState&) = delete;
  ~HostileSignalState() {
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }

 private:
  struct sigaction old_pipe_ {};
  sigset_t old_mask_{};
};

TEST(Spawn, EnvCwdSessionSignalsAndFdsAreApplied) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  // A descriptor without O_CLOEXEC, as a careless host process may hold.
  std::array<int, 2> leak_fds{};
  ASSERT_EQ(::pipe(leak_fds.data()), 0);  // NOLINT(android-cloexec-pipe): the leak is the point
  base::UniqueFd leak_rd(leak_fds[0]);
  base::UniqueFd leak_wr(leak_fds[1]);
  base::UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(devnull);

  SpawnSpec spec = tool({"self", "FOO", "HOME"});
  spec.env = {"FOO=bar baz", "PATH=/usr/bin:/bin"};
  spec.cwd = tmp.path();
  spec.stdin_fd = devnull.get();
  base::Result<ToolRun> r = base::make_error(EIO, "not run");
  {
    HostileSignalState hostile;
    r = run_tool(spec);
  }
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_EQ(r->status.exit_code, 0) << r->out;
  SelfReport self = parse_self(r->out);
  EXPECT_EQ(self.kv["env:FOO"], "bar baz");
  EXPECT_EQ(self.kv["env:HOME"], "(unset)");
  EXPECT_EQ(self.kv["cwd"], tmp.path());
  EXPECT_EQ(self.kv["sid"], std::to_string(r->spawned.pid));  // its own session
  EXPECT_EQ(self.kv["sigblk"], "0000000000000000");
  EXPECT_EQ(self.kv["sigign"], "0000000000000000");
  EXPECT_EQ(fds_above_stdio(self), std::set<int>{});  // close_other_fds: the leak is closed at exec
  EXPECT_EQ(parse_fd_list(self.kv["fds"]).count(0), 1u);

  spec.new_session = false;
  spec.keep_fds = {leak_wr.get()};
  r = run_tool(spec);
  ASSERT_TRUE(r) << r.error().message();
  self = parse_self(r->out);
  EXPECT_EQ(self.kv["sid"], std::to_string(::getsid(0)));
  EXPECT_EQ(fds_above_stdio(self), std::set<int>{leak_wr.get()});

  spec.keep_fds.clear();
  spec.close_other_fds = false;
  r = run_tool(spec);
  ASSERT_TRUE(r) << r.error().message();
  // Everything without O_CLOEXEC goes through (also whatever the test's own
  // parent leaked to it), the leak included.
  std::set<int> inherited = fds_above_stdio(parse_self(r->out));
  EXPECT_EQ(inherited.count(leak_rd.get()), 1u);
  EXPECT_EQ(inherited.count(leak_wr.get()), 1u);

  // Inheriting the environment: no `env` means environ.
  ASSERT_EQ(::setenv("TANDEM_SPAWN_TEST_VAR", "inherited", 1), 0);
  r = run_tool(tool({"self", "TANDEM_SPAWN_TEST_VAR"}));
  ::unsetenv("TANDEM_SPAWN_TEST_VAR");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(parse_self(r->out).kv["env:TANDEM_SPAWN_TEST_VAR"], "inherited");
}

TEST(Spawn, StdioSourcesInTheLowFdsAreNotClobbered) {
  // The output pipe sits at fd 0 while stdin is to become /dev/null: a naive
  // dup2(devnull, 0) first would send the output to /dev/null.
  std::array<int, 2> p{};
  ASSERT_EQ(::pipe2(p.data(), O_CLOEXEC), 0);
  base::UniqueFd rd(p[0]);
  base::UniqueFd wr(p[1]);
  base::UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  base::UniqueFd saved_stdin(::fcntl(0, F_DUPFD_CLOEXEC, 3));  // -1 if stdin was closed
  ASSERT_EQ(::dup2(wr.get(), 0), 0);
  SpawnSpec spec = tool({"self"});
  spec.stdin_fd = devnull.get();
  spec.stdout_fd = 0;
  auto s = spawn(spec, {});
  if (saved_stdin) {
    ::dup2(saved_stdin.get(), 0);
  } else {
    ::close(0);
  }
  wr.reset();
  ASSERT_TRUE(s) << s.error().message();
  Child child(std::move(*s));
  std::string out = read_all(rd.get());
  auto st = child.wait();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->exit_code, 0);
  EXPECT_EQ(parse_self(out).kv["pid"], std::to_string(child.pid())) << out;
}

// ---- Exit status, timing and resources. ----

TEST(WaitExit, ExitCodesAndSignalsMap) {
  for (int code : {0, 3, 255}) {
    auto r = run_tool(tool({"exit", std::to_string(code)}));
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(r->status.exit_code, code);
  }
  for (int sig : {SIGTERM, SIGUSR1}) {
    auto r = run_tool(tool({"raise", std::to_string(sig)}));
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(r->status.exit_code, -sig);
  }
  auto r = run_tool(tool({"raise", "SIGINT"}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status.exit_code, -SIGINT);

  auto s = spawn(tool({"sleep", "60"}), {});
  ASSERT_TRUE(s) << s.error().message();
  Child child(std::move(*s));
  ASSERT_TRUE(send_signal(child.pidfd(), SIGKILL));
  auto st = child.wait();
  ASSERT_TRUE(st) << st.error().message();
  EXPECT_EQ(st->exit_code, -SIGKILL);
  EXPECT_GE(st->ended_ns, child.spawned().started_ns);
  // Reaped: the pidfd answers ECHILD now, and signals ESRCH.
  auto again = wait_exit(child.pidfd(), 0);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), ECHILD);
  auto sig = send_signal(child.pidfd(), SIGTERM);
  ASSERT_FALSE(sig);
  EXPECT_EQ(sig.error().code(), ESRCH);
}

volatile sig_atomic_t g_alarms = 0;
void on_alarm(int /*sig*/) { g_alarms = g_alarms + 1; }

TEST(WaitExit, TimesOutWithoutReapingAndRetriesEintr) {
  auto s = spawn(tool({"sleep", "60"}), {});
  ASSERT_TRUE(s) << s.error().message();
  Child child(std::move(*s));

  auto r = wait_exit(child.pidfd(), 0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ETIMEDOUT);

  // A signal handler without SA_RESTART interrupts poll() every 20 ms; the
  // wait must go on to its full deadline.
  struct sigaction sa {};
  sa.sa_handler = on_alarm;
  struct sigaction old {};
  ASSERT_EQ(::sigaction(SIGALRM, &sa, &old), 0);
  itimerval every{{0, 20'000}, {0, 20'000}};
  ASSERT_EQ(::setitimer(ITIMER_REAL, &every, nullptr), 0);
  g_alarms = 0;
  auto t0 = std::chrono::steady_clock::now();
  r = wait_exit(child.pidfd(), 250);
  auto waited = std::chrono::steady_clock::now() - t0;
  itimerval off{};
  ::setitimer(ITIMER_REAL, &off, nullptr);
  ::sigaction(SIGALRM, &old, nullptr);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ETIMEDOUT);
  EXPECT_GE(waited, std::chrono::milliseconds(250));
  EXPECT_GE(g_alarms, 1);  // at least one EINTR was retried

  // Nothing was reaped: the process is still there to signal and wait for.
  ASSERT_TRUE(send_signal(child.pidfd(), 0));
  ASSERT_TRUE(send_signal(child.pidfd(), SIGKILL));
  auto st = child.wait(60'000);
  ASSERT_TRUE(st) << st.error().message();
  EXPECT_EQ(st->exit_code, -SIGKILL);
}

TEST(WaitExit, ReportsCpuTimeAndPeakMemory) {
  auto cpu = run_tool(tool({"burn-cpu", "1"}));
  ASSERT_TRUE(cpu) << cpu.error().message();
  EXPECT_EQ(cpu->status.exit_code, 0);
  // The tool burns 1 s of its own CPU time, however long that takes on a busy machine.
  EXPECT_GE(cpu->status.cpu_ns, 900'000'000u);
  EXPECT_LT(cpu->status.cpu_ns, 30'000'000'000u);
  EXPECT_GE(cpu->status.ended_ns - cpu->spawned.started_ns, 900'000'000);

  auto mem = run_tool(tool({"burn-mem", "64"}));
  ASSERT_TRUE(mem) << mem.error().message();
  EXPECT_EQ(mem->status.exit_code, 0);
  EXPECT_NE(mem->out.find("allocated 64 MiB"), std::string::npos) << mem->out;
  EXPECT_GE(mem->status.max_rss_bytes, 64u << 20);
  EXPECT_LT(mem->status.max_rss_bytes, 1024u << 20);

  // A short command's numbers are small but set.
  auto quick = run_tool(tool({"exit", "0"}));
  ASSERT_TRUE(quick);
  EXPECT_LT(quick->status.cpu_ns, 900'000'000u);
  EXPECT_GT(quick->status.max_rss_bytes, 0u);
}

TEST(WaitExit, CountsWaitedForChildren) {
  // The shell waits for the tool it runs, so the tool's CPU time is the shell's too.
  SpawnSpec spec;
  spec.argv = {"/bin/sh", "-c", fmt::format("'{}' burn-cpu 0.5 && exit 4", kTool)};
  auto r = run_tool(spec);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->status.exit_code, 4);
  EXPECT_GE(r->status.cpu_ns, 450'000'000u);
}

// ---- bubblewrap. ----

TEST(Spawn, BubblewrapWrapsTheCommand) {
  if (!std::filesystem::exists(kBwrap)) GTEST_SKIP() << kBwrap << " not installed (apt-get install bubblewrap)";
  if (!is_root()) GTEST_SKIP() << "bwrap needs root here (or unprivileged user namespaces)";
  std::string why;
  auto cgs = TestCgroups::create(kV1Controllers, why);  // placement is checked where cgroups can be made
  CgroupDirs placement = cgs ? cgs->placement() : CgroupDirs{};
  SpawnSpec spec = tool({"self"});
  spec.bwrap = kBwrap;
  spec.bwrap_args = {"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--die-with-parent"};
  auto r = run_tool(spec, placement);
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_EQ(r->status.exit_code, 0) << r->out;
  SelfReport self = parse_self(r->out);
  // In bwrap's pid namespace the command is a low pid, not the one we started (bwrap).
  ASSERT_FALSE(self.kv["pid"].empty()) << r->out;
  EXPECT_NE(self.kv["pid"], std::to_string(r->spawned.pid));
  EXPECT_LE(std::stoi(self.kv["pid"]), 3);
  // bwrap joined the cgroups before it ran; what it starts is inside too.
  if (cgs) cgs->expect_member(self.cgroup_text);

  spec.argv = {kTool, "exit", "5"};
  r = run_tool(spec, placement);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->status.exit_code, 5);
  EXPECT_FALSE(has_children());
}

// ---- The tool's own interface. ----

TEST(TestTool, UsageAndSubcommands) {
  auto help = run_tool(tool({"--help"}));
  ASSERT_TRUE(help);
  EXPECT_EQ(help->status.exit_code, 0);
  for (const char* cmd : {"burn-cpu", "burn-mem", "daemonize", "sleep", "exit", "storm"}) {
    EXPECT_NE(help->out.find(cmd), std::string::npos) << cmd;
  }
  for (const auto& bad : std::vector<std::vector<std::string>>{{"frobnicate"},
                                                               {"burn-cpu"},
                                                               {"burn-cpu", "abc"},
                                                               {"burn-cpu", "-1"},
                                                               {"burn-mem", "1", "2", "3"},
                                                               {"exit", "256"},
                                                               {"sleep", "nan"},
                                                               {"storm", "x"},
                                                               {"raise", "NOSUCH"}}) {
    SpawnSpec spec = tool(bad);
    base::UniqueFd devnull(::open("/dev/null", O_WRONLY | O_CLOEXEC));
    spec.stderr_fd = devnull.get();
    auto r = run_tool(spec);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status.exit_code, 2) << bad[0];
  }
  auto storm = run_tool(tool({"storm", "5"}));
  ASSERT_TRUE(storm);
  EXPECT_EQ(storm->status.exit_code, 0);
  auto sleep = run_tool(tool({"sleep", "0.05"}));
  ASSERT_TRUE(sleep);
  EXPECT_EQ(sleep->status.exit_code, 0);
  EXPECT_GE(sleep->status.ended_ns - sleep->spawned.started_ns, 50'000'000);
}

}  // namespace
}  // namespace tandem::cpu
