// The tandemd harness (testbed/daemon_process.h).
#include "testbed/daemon_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "base/unique_fd.h"
#include "cpu/cgroup.h"

extern char** environ;  // NOLINT(readability-redundant-declaration): POSIX leaves it undeclared

namespace tandem::testbed {
namespace {

// How often start() looks at the socket and stop() at the child.
constexpr std::int64_t kPollNs = 2'000'000;
// How long the sweep waits for the processes it kills.
constexpr int kSweepKillTimeoutMs = 2000;

void sleep_ns(std::int64_t ns) {
  timespec ts{ns / 1'000'000'000, ns % 1'000'000'000};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// Whether `path` accepts a SOCK_SEQPACKET connection now (tandemd's socket).
bool accepts(const std::string& path) {
  base::UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);  // length checked by create()
  return ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
}

// The environment of the child: ours, with `extra`'s names replaced.
std::vector<std::string> child_env(std::span<const std::string> extra) {
  auto name_of = [](std::string_view kv) { return kv.substr(0, kv.find('=')); };
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const bool replaced = std::ranges::any_of(extra, [&](const std::string& x) { return name_of(x) == name_of(kv); });
    if (!replaced) out.emplace_back(kv);
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

base::Result<base::UniqueFd> open_output(const std::string& path) {
  base::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!fd) return base::errno_error(fmt::format("open {}", path));
  return fd;
}

// Kills what runs in the subtree `name` and removes it; whether there was
// something left (a process or a child cgroup). Root only.
base::Result<bool> sweep_subtree(const std::string& name) {
  const std::string what = fmt::format("sweep the cgroup subtree {}", name);
  cpu::ManagerOptions o;
  o.subtree = name;
  auto m = cpu::CgroupManager::open(o);  // (makes the subtree when it is gone: removed below)
  if (!m) return base::propagate(std::move(m.error()), what);
  const cpu::Node& root = (*m)->root();
  auto procs = (*m)->processes(root);
  auto children = (*m)->children("");
  const bool left = (procs && !procs->empty()) || (children && !children->empty());
  if (auto k = (*m)->kill(root, kSweepKillTimeoutMs); !k) return base::propagate(std::move(k.error()), what);
  if (auto r = (*m)->remove(root); !r) return base::propagate(std::move(r.error()), what);
  return left;
}

// Whether `pid` names a process (one we may not signal still runs).
bool pid_runs(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

// ---------------------------------------------------------------------------
// TempDir

base::Result<TempDir> TempDir::make(std::string_view prefix, std::string_view parent) {
  std::error_code ec;
  std::filesystem::path base_dir = parent.empty() ? std::filesystem::temp_directory_path(ec) : parent;
  if (ec) base_dir = "/tmp";
  std::string pattern = (base_dir / fmt::format("{}XXXXXX", prefix)).string();
  if (::mkdtemp(pattern.data()) == nullptr) return base::errno_error(fmt::format("mkdtemp {}", pattern));
  return TempDir(std::move(pattern));
}

TempDir::~TempDir() { remove(); }

TempDir::TempDir(TempDir&& other) noexcept
    : path_(std::exchange(other.path_, std::string())), keep_(std::exchange(other.keep_, false)) {}

TempDir& TempDir::operator=(TempDir&& other) noexcept {
  if (this != &other) {
    remove();
    path_ = std::exchange(other.path_, std::string());
    keep_ = std::exchange(other.keep_, false);
  }
  return *this;
}

void TempDir::remove() {
  if (!path_.empty() && !keep_) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  path_.clear();
  keep_ = false;
}

// ---------------------------------------------------------------------------
// ChildProcess

base::Result<void> ChildProcess::start(std::span<const std::string> argv, const std::string& out_path,
                                       const std::string& err_path, std::span<const std::string> env) {
  if (pid_ > 0) return base::make_error(EBUSY, fmt::format("pid {} is running", pid_));
  if (argv.empty()) return base::make_error(EINVAL, "no program given");
  // Everything the child needs is made here: after fork() it only calls
  // async-signal-safe functions.
  std::vector<std::string> args(argv.begin(), argv.end());
  std::vector<std::string> vars = child_env(env);
  const std::vector<char*> c_argv = c_strings(args);
  const std::vector<char*> c_envp = c_strings(vars);
  auto out = open_output(out_path);
  if (!out) return base::propagate(std::move(out.error()));
  auto err = open_output(err_path);
  if (!err) return base::propagate(std::move(err.error()));
  // The child writes its errno here if exec fails; EOF means it exec'd.
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return base::errno_error("pipe2");
  base::UniqueFd report_rd(report[0]);
  base::UniqueFd report_wr(report[1]);

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return base::errno_error("fork");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(125);  // the parent died before prctl
    if (::dup2(out->get(), STDOUT_FILENO) < 0 || ::dup2(err->get(), STDERR_FILENO) < 0) {
      const int e = errno;
      (void)!::write(report_wr.get(), &e, sizeof e);
      ::_exit(126);
    }
    ::execve(c_argv[0], c_argv.data(), c_envp.data());
    const int e = errno;
    (void)!::write(report_wr.get(), &e, sizeof e);
    ::_exit(127);
  }
  pid_ = pid;
  last_pid_ = pid;
  report_wr.reset();
  int child_errno = 0;
  ssize_t n = 0;
  do {
    n = ::read(report_rd.get(), &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    kill();
    return base::make_error(child_errno, fmt::format("exec {}", args[0]));
  }
  return {};
}

void ChildProcess::reaped(int status) {
  wait_status_ = status;
  pid_ = -1;
}

bool ChildProcess::exited() {
  if (pid_ <= 0) return true;
  int status = 0;
  pid_t r = 0;
  do {
    r = ::waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    reaped(status);
    return true;
  }
  return false;
}

void ChildProcess::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped(status);
}

base::Result<int> ChildProcess::wait(int sig, std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return base::make_error(ECHILD, "no child is running");
  if (sig != 0) ::kill(pid_, sig);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!exited()) {
    if (std::chrono::steady_clock::now() > deadline) {
      const pid_t pid = pid_;
      kill();
      return base::make_error(ETIMEDOUT,
                              fmt::format("pid {} did not exit within {} ms; killed it", pid, timeout.count()));
    }
    sleep_ns(kPollNs);
  }
  return *wait_status_;
}

// ---------------------------------------------------------------------------
// DaemonProcess

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), ::strsignal(WTERMSIG(status)));
  }
  return fmt::format("changed state (wait status {:#x})", status);
}

base::Result<std::unique_ptr<DaemonProcess>> DaemonProcess::create(DaemonOptions options) {
  if (options.tandemd.empty()) return base::make_error(EINVAL, "tandemd harness: no tandemd binary given");
  std::unique_ptr<DaemonProcess> d(new DaemonProcess(std::move(options)));
  if (d->options_.runtime_dir.empty()) {
    auto dir = TempDir::make(d->options_.temp_prefix, d->options_.temp_parent);
    if (!dir) return base::propagate(std::move(dir.error()), "tandemd's runtime dir");
    if (d->options_.keep_dir) dir->keep();
    d->temp_dir_ = std::move(*dir);
    d->runtime_dir_ = d->temp_dir_.path();
  } else {
    d->runtime_dir_ = d->options_.runtime_dir;
    if (::mkdir(d->runtime_dir_.c_str(), 0700) != 0 && errno != EEXIST) {
      return base::errno_error(fmt::format("tandemd's runtime dir: mkdir {}", d->runtime_dir_));
    }
  }
  d->socket_path_ = d->runtime_dir_ + "/tandemd.sock";
  d->config_path_ = d->runtime_dir_ + "/tandemd.toml";
  d->log_path_ = d->runtime_dir_ + "/tandemd.log";
  d->out_path_ = d->runtime_dir_ + "/tandemd.out";
  if (d->socket_path_.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return base::make_error(
        ENAMETOOLONG, fmt::format("tandemd's socket path {} is longer than a Unix socket's {} bytes", d->socket_path_,
                                  sizeof(sockaddr_un{}.sun_path) - 1));
  }
  if (auto w = d->write_config(d->options_.config); !w) return base::propagate(std::move(w.error()));
  return d;
}

DaemonProcess::~DaemonProcess() {
  if (child_.pid() > 0) (void)stop();
  (void)sweep_cgroups();
  // temp_dir_ goes after this body: the runtime dir outlives the daemon.
}

base::Result<void> DaemonProcess::write_config(std::string_view text) {
  std::ofstream out(config_path_, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return base::make_error(EIO, fmt::format("write tandemd's config {}", config_path_));
  return {};
}

std::optional<DaemonProcess::SocketStamp> DaemonProcess::socket_stamp() const {
  struct stat st {};
  if (::stat(socket_path_.c_str(), &st) != 0) return std::nullopt;
  return SocketStamp{static_cast<std::uint64_t>(st.st_ino),
                     std::int64_t{st.st_ctim.tv_sec} * 1'000'000'000 + st.st_ctim.tv_nsec};
}

std::string DaemonProcess::who() const { return fmt::format("tandemd (pid {})", child_.last_pid()); }

base::Result<void> DaemonProcess::start(std::span<const std::string> wrapper) {
  if (child_.pid() > 0) return base::make_error(EBUSY, fmt::format("start tandemd: {} is running", who()));
  const std::optional<SocketStamp> old = socket_stamp();
  std::vector<std::string> argv(wrapper.begin(), wrapper.end());
  argv.insert(argv.end(), {options_.tandemd, "--config", config_path_, "--runtime-dir", runtime_dir_});
  if (auto r = child_.start(argv, out_path_, log_path_, options_.env); !r) {
    return base::propagate(std::move(r.error()), "start tandemd");
  }
  return wait_ready(old);
}

base::Result<void> DaemonProcess::wait_ready(const std::optional<SocketStamp>& old) {
  const auto deadline = std::chrono::steady_clock::now() + options_.start_timeout;
  const std::string name = who();
  for (;;) {
    if (child_.exited()) {
      return base::make_error(ECHILD, fmt::format("{} {} at start (log: {})", name,
                                                  describe_wait_status(child_.wait_status().value_or(0)), log_path_));
    }
    const std::optional<SocketStamp> now = socket_stamp();
    if (now && now != old && accepts(socket_path_)) return {};
    if (options_.interrupted && options_.interrupted()) {
      child_.kill();
      return base::make_error(EINTR, fmt::format("start {}: interrupted", name));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      child_.kill();
      return base::make_error(ETIMEDOUT,
                              fmt::format("{}: its socket {} did not accept within {} ms; killed it (log: {})", name,
                                          socket_path_, options_.start_timeout.count(), log_path_));
    }
    sleep_ns(kPollNs);
  }
}

bool DaemonProcess::exited() { return child_.exited(); }

void DaemonProcess::kill() { child_.kill(); }

base::Result<void> DaemonProcess::stop() {
  if (child_.pid() <= 0) {
    const std::optional<int> last = child_.wait_status();
    if (!last) return base::make_error(ESRCH, "stop tandemd: it was never started");
    if (WIFEXITED(*last) && WEXITSTATUS(*last) == 0) return {};
    return base::make_error(
        EIO, fmt::format("stop tandemd: {} had ended already: it {}", who(), describe_wait_status(*last)));
  }
  const std::string name = who();
  auto status = child_.wait(SIGTERM, options_.stop_timeout);
  if (!status) {
    if (status.error().code() == ETIMEDOUT) {
      return base::make_error(ETIMEDOUT, fmt::format("{} did not exit within {} ms of SIGTERM; killed it", name,
                                                     options_.stop_timeout.count()));
    }
    return base::propagate(std::move(status.error()), fmt::format("stop {}", name));
  }
  if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) return {};
  return base::make_error(EIO, fmt::format("{} {} on SIGTERM", name, describe_wait_status(*status)));
}

base::Result<bool> DaemonProcess::sweep_cgroups() {
  if (options_.cgroup_subtree.empty() || ::geteuid() != 0) return false;
  if (child_.pid() > 0) {
    return base::make_error(
        EBUSY, fmt::format("sweep tandemd's cgroup subtree {}: {} is running", options_.cgroup_subtree, who()));
  }
  return sweep_subtree(options_.cgroup_subtree);
}

base::Result<std::vector<std::string>> sweep_stale_subtrees(std::string_view prefix) {
  std::vector<std::string> swept;
  if (prefix.empty() || prefix.find('/') != std::string_view::npos || prefix.starts_with(".")) {
    return base::make_error(EINVAL, fmt::format("sweep stale subtrees: '{}' is not a subtree name prefix", prefix));
  }
  if (::geteuid() != 0) return swept;
  // Where subtrees beneath this process's cgroup live: the planner's answer
  // for a probe subtree (it makes nothing), less the probe.
  cpu::ManagerOptions o;
  o.subtree = std::string(prefix) + "probe";
  auto plan = cpu::plan_cgroups(o);
  if (!plan) return swept;  // no cgroup hierarchy this process sits in: nothing to sweep
  std::vector<std::string> stale;
  for (const cpu::Hierarchy& h : plan->hierarchies) {
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(h.path()).parent_path();
    for (const auto& entry : std::filesystem::directory_iterator(parent, ec)) {
      const std::string name = entry.path().filename().string();
      if (!name.starts_with(prefix) || !entry.is_directory(ec)) continue;
      const std::string_view digits = std::string_view(name).substr(prefix.size());
      if (digits.empty() || digits.size() > 9 ||
          !std::ranges::all_of(digits, [](char c) { return c >= '0' && c <= '9'; })) {
        continue;
      }
      const auto pid = static_cast<pid_t>(std::stol(std::string(digits)));
      if (pid <= 0 || pid == ::getpid() || pid_runs(pid)) continue;
      if (std::ranges::find(stale, name) == stale.end()) stale.push_back(name);
    }
  }
  for (const std::string& name : stale) {
    if (auto r = sweep_subtree(name); !r) return base::propagate(std::move(r.error()));
    swept.push_back(name);
  }
  return swept;
}

std::string DaemonProcess::log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace tandem::testbed
