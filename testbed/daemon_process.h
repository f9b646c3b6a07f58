// The one harness that runs the real tandemd for tests and benchmarks: the
// integration tests (tests/integration/harness.h), the engines' daemon test,
// bench/daemon_bench, bench/spawn_bench and bench/attack. No GoogleTest in
// it, so benches link it too.
//
// The pieces: TempDir (a directory removed at the end), ChildProcess (a
// fork/exec child with its output in files, dying with its parent), and
// DaemonProcess, tandemd in one of each.
//
// DaemonProcess::create() takes a runtime dir (the caller's, or a fresh
// temporary one it owns) and writes the config into it as tandemd.toml.
// start() forks and execs tandemd (optionally under a wrapper such as
// prlimit) with --config and --runtime-dir, stdout to <dir>/tandemd.out and
// stderr to <dir>/tandemd.log, and returns once tandemd's socket accepts a
// connection. A socket file left at the path by a tandemd killed before may
// still accept for a moment (its io_uring, torn down asynchronously, holds a
// pending accept), so only a new file counts: another inode or change time.
// stop() sends SIGTERM and waits; after a timeout it sends SIGKILL; either way
// it reaps. The child has PR_SET_PDEATHSIG(SIGKILL): tandemd dies with the
// thread that started it even when the caller is killed. The destructor stops
// a running tandemd, sweeps its cgroup subtree when the options name one (a
// tandemd killed with SIGKILL leaves its subtree, tools' processes in it, for
// the next one to adopt; as root only), and removes a temporary runtime dir
// unless asked to keep it. So nothing leaks when the caller returns early,
// throws, or a test fails.
//
// Errors are base::Result, and each names the step and the process: "start
// tandemd: exec /x/tandemd: No such file or directory", "tandemd (pid 123)
// exited with status 1 at start (log: /tmp/…/tandemd.log)". Nothing throws.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace tandem::testbed {

// Subtrees named <prefix><pid> beneath this process's own cgroup, in every
// hierarchy, whose pid no longer runs: what a bench killed by a signal left
// (its handler kills tandemd and exits at once, with no time to sweep). Each
// is swept as DaemonProcess::sweep_cgroups() sweeps: what runs in it is
// killed, then it is removed. Returns the names swept. Nothing without root.
// `prefix` must be non-empty and name no path ("tandem-bench-"); a pid that
// runs, and any other name, are left alone.
base::Result<std::vector<std::string>> sweep_stale_subtrees(std::string_view prefix);

// A directory made by mkdtemp(3), removed with everything in it at
// destruction unless kept. Move-only: moving over a live one removes the old
// directory first; a self-move keeps it.
//
// Thread-safety: one thread at a time.
class TempDir {
 public:
  // <parent>/<prefix>XXXXXX; an empty parent is TMPDIR, else /tmp.
  static base::Result<TempDir> make(std::string_view prefix, std::string_view parent = {});

  TempDir() = default;  // owns nothing
  ~TempDir();
  TempDir(TempDir&& other) noexcept;
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // Leaves the directory in place at destruction.
  void keep() { keep_ = true; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  void remove();

  std::string path_;
  bool keep_ = false;
};

// A child process started with fork and execve (the path is not searched
// for), stdout and stderr appended to files, with PR_SET_PDEATHSIG(SIGKILL).
// Killed and reaped at destruction if still running. tandemd runs in one
// (DaemonProcess); the tests run engines and one-shot commands in others.
//
// Thread-safety: one thread at a time. REQUIRES: the thread that calls
// start() outlives the child (PR_SET_PDEATHSIG fires when that thread ends).
class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess() { kill(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts `argv` with `env` ("NAME=value") added to this process's
  // environment, replacing what it names; returns once it has exec'd (an
  // exec that fails is this call's error, with its errno).
  base::Result<void> start(std::span<const std::string> argv, const std::string& out_path, const std::string& err_path,
                           std::span<const std::string> env = {});
  // Sends `sig` (0: none, only wait) and waits up to `timeout`, then SIGKILLs
  // it; always reaps. The wait status; ETIMEDOUT when it had to be killed.
  base::Result<int> wait(int sig, std::chrono::milliseconds timeout);
  // SIGKILL and reap, at once; nothing when it is not running.
  void kill();
  // Whether it is not running (reaps it when it has just exited).
  bool exited();

  // -1 when not running.
  pid_t pid() const { return pid_; }
  // The pid of the last start, also after the reap (for messages).
  pid_t last_pid() const { return last_pid_; }
  // The wait status of its last exit; nullopt until it has exited once.
  std::optional<int> wait_status() const { return wait_status_; }

 private:
  void reaped(int status);

  pid_t pid_ = -1;
  pid_t last_pid_ = -1;
  std::optional<int> wait_status_;
};

struct DaemonOptions {
  // The tandemd binary (tests and benches pass TANDEMD_PATH, the build's).
  std::string tandemd;
  // Where tandemd runs (made if missing, never removed); empty: a fresh
  // temporary directory, <temp_parent>/<temp_prefix>XXXXXX, removed at the
  // end (an empty temp_parent is TMPDIR, else /tmp).
  std::string runtime_dir;
  std::string temp_prefix = "tandem-daemon-";
  std::string temp_parent;
  // Keep the fresh temporary directory (its config and logs).
  bool keep_dir = false;
  // The text of <runtime_dir>/tandemd.toml.
  std::string config;
  // Extra environment for tandemd, "NAME=value" (replacing an inherited one).
  std::vector<std::string> env;
  // The [cgroups] subtree the config gives tandemd, to sweep once it is
  // gone; empty: nothing to sweep.
  std::string cgroup_subtree;
  // How long start() waits for the socket, and stop() for the exit.
  std::chrono::milliseconds start_timeout{5000};
  std::chrono::milliseconds stop_timeout{10000};
  // Polled while start() waits; true gives up (EINTR) and kills tandemd.
  std::function<bool()> interrupted;
};

// tandemd as a child process (see the top of the file).
//
// Thread-safety: one thread at a time. REQUIRES: the thread that calls
// start() outlives the daemon (PR_SET_PDEATHSIG fires when that thread ends).
class DaemonProcess {
 public:
  // Makes or takes the runtime dir and writes the config; starts nothing.
  static base::Result<std::unique_ptr<DaemonProcess>> create(DaemonOptions options);
  // Stops tandemd, sweeps its cgroup subtree, removes a temporary dir.
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // Starts tandemd, run by `wrapper` when given ({"/usr/bin/prlimit",
  // "--nofile=48:48", "--"}; the first element is a path, not searched for),
  // and waits until its socket accepts a connection. On an error tandemd is
  // not left running. Again after stop() or kill(): a restart in the same
  // runtime dir, with the config as it is then.
  base::Result<void> start(std::span<const std::string> wrapper = {});
  // SIGTERM, then SIGKILL after stop_timeout; always reaps. Succeeds when
  // tandemd exited with status 0 within the timeout. On a tandemd that is
  // not running: the verdict on its last exit.
  base::Result<void> stop();
  // SIGKILL and reap, at once; nothing when it is not running.
  void kill();
  // Whether tandemd is not running (reaps it when it has just exited).
  bool exited();
  // Kills what is left in the cgroup subtree the options name and removes
  // it; whether there was something left (a process or a child cgroup).
  // False without a subtree or without root. REQUIRES: tandemd not running.
  base::Result<bool> sweep_cgroups();
  // Replaces the config file (what a reload or the next start() reads).
  base::Result<void> write_config(std::string_view text);

  // -1 when not running.
  pid_t pid() const { return child_.pid(); }
  // The wait status of its last exit; nullopt until it has exited once.
  std::optional<int> wait_status() const { return child_.wait_status(); }
  const std::string& runtime_dir() const { return runtime_dir_; }
  const std::string& socket_path() const { return socket_path_; }
  const std::string& config_path() const { return config_path_; }
  const std::string& log_path() const { return log_path_; }
  // The whole of tandemd.log ("" when there is none yet).
  std::string log() const;

 private:
  explicit DaemonProcess(DaemonOptions options) : options_(std::move(options)) {}
  // The socket file's identity: a new file has another (tmpfs reuses inode
  // numbers, so the change time tells too).
  struct SocketStamp {
    std::uint64_t ino = 0;
    std::int64_t ctime_ns = 0;
    bool operator==(const SocketStamp&) const = default;
  };
  std::optional<SocketStamp> socket_stamp() const;
  base::Result<void> wait_ready(const std::optional<SocketStamp>& old);
  std::string who() const;

  DaemonOptions options_;
  TempDir temp_dir_;
  std::string runtime_dir_;
  std::string socket_path_;
  std::string config_path_;
  std::string log_path_;
  std::string out_path_;
  ChildProcess child_;
};

// "exited with status 3" or "was killed by signal 9 (Killed)".
std::string describe_wait_status(int status);

}  // namespace tandem::testbed
