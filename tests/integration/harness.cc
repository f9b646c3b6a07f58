#include "tests/integration/harness.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cpu/cgroup.h"

namespace tandem::it {

TempDir::TempDir() {
  char tmpl[] = "/tmp/tandem-it-XXXXXX";
  const char* p = ::mkdtemp(tmpl);
  if (p == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Process::~Process() { kill9(); }

void Process::start(const std::vector<std::string>& argv, const std::string& out_path, const std::string& err_path,
                    const std::vector<std::string>& env) {
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out < 0 || err < 0) ::_exit(126);
    ::dup2(out, 1);
    ::dup2(err, 2);
    for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
    ::execv(args[0], args.data());
    ::_exit(127);
  }
}

void Process::kill9() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

int Process::stop(int sig, std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, sig);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return status;
    }
    ::usleep(5'000);
  }
  kill9();
  return -1;
}

Daemon::Daemon(std::string runtime_dir, const std::string& config_text)
    : dir_(std::move(runtime_dir)), socket_(dir_ + "/tandemd.sock"), config_path_(dir_ + "/tandemd.toml") {
  std::string text = config_text;
  // Test daemons run side by side (ctest -j): each gets a cgroup subtree of
  // its own, named for its runtime dir (a restart in the same dir finds it).
  if (text.find("[cgroups]") == std::string::npos) {
    text += fmt::format("\n[cgroups]\nsubtree = \"{}\"\n", dir_.substr(dir_.rfind('/') + 1));
  }
  // ... and a metrics port of its own (any free one: status says which).
  if (text.find("[metrics]") == std::string::npos) text += "\n[metrics]\nlisten = \"127.0.0.1:0\"\n";
  std::ofstream(config_path_) << text;
}

Daemon::~Daemon() {
  if (proc_.running()) (void)proc_.stop(SIGTERM);
  if (::geteuid() != 0) return;
  cpu::ManagerOptions o;
  o.subtree = dir_.substr(dir_.rfind('/') + 1);  // the subtree every test daemon gets (its runtime dir's name)
  auto m = cpu::CgroupManager::open(o);
  if (!m) return;
  (void)(*m)->kill((*m)->root(), 2000);
  (void)(*m)->remove((*m)->root());
}

void Daemon::start(const std::vector<std::string>& wrapper) {
  // A socket left by a tandemd that was killed may still accept for a moment
  // (its io_uring, torn down asynchronously, holds a pending accept): wait
  // for the new daemon's own socket: a new file at the path (tmpfs reuses
  // inode numbers, so the change time tells).
  struct stat old {};
  const bool had = ::stat(socket_.c_str(), &old) == 0;
  std::vector<std::string> argv = wrapper;
  for (const char* a : {TANDEMD_PATH, "--config"}) argv.emplace_back(a);
  argv.insert(argv.end(), {config_path_, "--runtime-dir", dir_});
  proc_.start(argv, dir_ + "/tandemd.out", dir_ + "/tandemd.log");
  ASSERT_TRUE(eventually([&] {
    struct stat now {};
    if (::stat(socket_.c_str(), &now) != 0) return false;
    if (had && now.st_ino == old.st_ino && now.st_ctim.tv_sec == old.st_ctim.tv_sec &&
        now.st_ctim.tv_nsec == old.st_ctim.tv_nsec) {
      return false;
    }
    return socket_accepts(socket_);
  })) << "tandemd did not come up:\n"
      << log();
}

std::string Daemon::log() const {
  std::ifstream in(dir_ + "/tandemd.log");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool socket_accepts(const std::string& path) { return RawClient::connect(path).has_value(); }

ipc::EngineInfo test_engine_info() {
  ipc::EngineInfo e;
  e.gpu_index = 0;
  e.block_size = 16;
  e.total_blocks = 1000;
  e.max_seqs = 64;
  e.token_budget = 2048;
  return e;
}

nlohmann::json ctl(const std::string& socket_path, const std::string& command) {
  auto c = RawClient::connect(socket_path);
  if (!c) {
    ADD_FAILURE() << c.error().message();
    return {};
  }
  if (auto h = c->hello(wire::Role::CtlRead, "it-ctl"); !h) {
    ADD_FAILURE() << h.error().message();
    return {};
  }
  auto body = c->ctl(command);
  if (!body) {
    ADD_FAILURE() << body.error().message();
    return {};
  }
  return nlohmann::json::parse(*body);
}

}  // namespace tandem::it
