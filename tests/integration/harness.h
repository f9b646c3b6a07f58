// Integration-test harness: the real tandemd in a temporary runtime dir, run
// by the harness the benchmarks use too (testbed/daemon_process.h) with the
// tests' defaults and their way of failing, and a raw protocol client for the
// tests that must send what libtandem never would (wrong versions, garbage, a
// scribbled segment).
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <csignal>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "ipc/daemon_connection.h"
#include "ipc/records.h"
#include "testbed/daemon_process.h"
#include "tests/engine_info.h"

namespace tandem::it {

// A fresh temporary directory, /tmp/tandem-it-XXXXXX (TMPDIR honoured),
// removed with everything in it at destruction. Throws when none can be made,
// which fails the test.
//
// Thread-safety: one thread at a time.
class TempDir : public testbed::TempDir {
 public:
  TempDir();
};

// A child process other than tandemd (an engine, a one-shot tandemd run):
// testbed::ChildProcess, killed (SIGKILL) at destruction if still running,
// stdout and stderr to files.
//
// Thread-safety: one thread at a time.
class Process {
 public:
  // Starts `argv` with extra environment `env` ("K=V"); output to
  // `out_path` (stdout) and `err_path` (stderr), appended. Throws (failing
  // the test) when it cannot be started, naming why.
  void start(const std::vector<std::string>& argv, const std::string& out_path, const std::string& err_path,
             const std::vector<std::string>& env = {});
  pid_t pid() const { return child_.pid(); }
  bool running() const { return child_.pid() > 0; }
  void kill9() { child_.kill(); }
  // Sends `sig` (0: none) and waits; returns the wait status (-1 if not
  // running, or killed with SIGKILL after `timeout`).
  int stop(int sig, std::chrono::milliseconds timeout = std::chrono::seconds(10));

 private:
  testbed::ChildProcess child_;
};

// tandemd in `runtime_dir` (testbed::DaemonProcess) with a config file
// holding `config_text` and, unless it has its own, the tests' two sections:
// a [cgroups] subtree named for the runtime dir (test daemons run side by
// side under ctest -j; a restart in the same dir finds its subtree), and a
// [metrics] port of its own (any free one: ctl status says which). A failure
// of the harness is a test failure, with its message and tandemd's log.
//
// Thread-safety: one thread at a time; the thread that starts tandemd
// outlives it (testbed::DaemonProcess).
class Daemon {
 public:
  explicit Daemon(std::string runtime_dir, const std::string& config_text = "");
  // Stops it (SIGTERM, SIGKILL after 10 s), then kills and removes what is
  // left of its cgroup subtree (a daemon killed with SIGKILL leaves it
  // behind for the next one to adopt), processes inside first.
  ~Daemon() = default;
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  // Starts it and waits until its socket accepts connections (5 s at most);
  // again after stop() or kill9(), in the same dir. `wrapper` runs it (e.g.
  // {"/usr/bin/prlimit", "--nofile=40:40", "--"}).
  void start(const std::vector<std::string>& wrapper = {});
  void kill9();
  // SIGTERM and wait; the wait status (0: a clean exit), -1 if it was not
  // running.
  int stop();
  pid_t pid() const;
  std::string log() const;
  const std::string& socket_path() const { return socket_; }
  const std::string& runtime_dir() const { return dir_; }

 private:
  std::string dir_;
  std::string socket_;
  std::unique_ptr<testbed::DaemonProcess> daemon_;
};

// Whether `path` accepts a SOCK_SEQPACKET connection now.
bool socket_accepts(const std::string& path);

// An engine's parameters for raw-protocol tests (tests/engine_info.h).
using test_support::test_engine_info;

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

// The whole of a (small) file; "" when it cannot be read.
std::string slurp(const std::string& path);
// Whether `pid` is a live process (not a zombie).
bool alive(pid_t pid);

// ctl `command` over a fresh connection; aborts the test on failure.
nlohmann::json ctl(const std::string& socket_path, const std::string& command);

}  // namespace tandem::it
