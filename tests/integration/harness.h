// Integration-test harness: the real tandemd in a temporary runtime dir, and
// a raw protocol client for the tests that must send what libtandem never
// would (wrong versions, garbage, a scribbled segment).
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <csignal>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "ipc/daemon_connection.h"
#include "ipc/records.h"

namespace tandem::it {

// A temporary directory removed (recursively) at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A child process started with fork/exec; killed (SIGKILL) at destruction if
// still running. stdout and stderr go to files.
class Process {
 public:
  Process() = default;
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // Starts `argv` with extra environment `env` ("K=V"); output to
  // `out_path` (stdout) and `err_path` (stderr), appended.
  void start(const std::vector<std::string>& argv, const std::string& out_path, const std::string& err_path,
             const std::vector<std::string>& env = {});
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  void kill9();
  // Sends `sig` and waits; returns the wait status (-1 if not running).
  int stop(int sig, std::chrono::milliseconds timeout = std::chrono::seconds(10));

 private:
  pid_t pid_ = -1;
};

// tandemd in `runtime_dir` with a config file holding `config_text`.
class Daemon {
 public:
  explicit Daemon(std::string runtime_dir, const std::string& config_text = "");
  // Stops it, then removes its cgroup subtree (a daemon killed with SIGKILL
  // leaves it behind for the next one to adopt), processes inside first.
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  // Starts it and waits until its socket accepts connections (5 s at most).
  // `wrapper` runs it (e.g. {"/usr/bin/prlimit", "--nofile=40:40", "--"}).
  void start(const std::vector<std::string>& wrapper = {});
  void kill9() { proc_.kill9(); }
  int stop() { return proc_.stop(SIGTERM); }
  pid_t pid() const { return proc_.pid(); }
  std::string log() const;
  const std::string& socket_path() const { return socket_; }
  const std::string& runtime_dir() const { return dir_; }

 private:
  std::string dir_;
  std::string socket_;
  std::string config_path_;
  Process proc_;
};

// Whether `path` accepts a SOCK_SEQPACKET connection now.
bool socket_accepts(const std::string& path);

// An engine's parameters for raw-protocol tests: GPU 0, 1,000 blocks of 16
// tokens, 64 sequences, 2,048 tokens a step.
ipc::EngineInfo test_engine_info();

// Polls `pred` every 10 ms until it is true or `timeout` passes.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    ::usleep(10'000);
  }
  return pred();
}

// A client that speaks the socket protocol by hand.
using RawClient = ipc::DaemonConnection;

// A record with `session` and now's timestamp.
template <class T>
ipc::Slot record(const T& r, std::uint64_t session) {
  return ipc::encode(r, session, base::to_ns(base::MonotonicClock().now()));
}

// ctl `command` over a fresh connection; aborts the test on failure.
nlohmann::json ctl(const std::string& socket_path, const std::string& command);

}  // namespace tandem::it
