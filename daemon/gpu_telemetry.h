// GpuTelemetry: tandemd's NVML sampler (docs/nvml.md, config [nvml]).
//
// NVML calls can take milliseconds (and nvmlInit much longer without
// persistence mode), so sampling never runs on the io_uring loop: a thread
// of this object's own samples every device each interval and publishes the
// latest sample under a mutex; the loop copies it when `tandemctl gpu`, the
// metrics or `tandemctl status` ask. Two things do run on the loop, both
// rare and operator-driven: opening the library (nvmlInit, device count) at
// start-up and on a reload that changes the mode or the library, and
// joining the old object's thread when such a reload replaces it (at most
// one sample's wait). A new interval is applied to the running thread.
// The thread starts at start() and is stopped and joined by the destructor. The thread never logs: the daemon's logger
// is single-threaded. A failing sample is counted and its error shown.
//
// Modes: "off" starts nothing; "auto" samples if the library loads and
// otherwise logs once at info and reports unavailable with the reason; "on"
// makes a failure to load an error (tandemd then refuses to start, a reload
// is refused).
//
// GPU processes are attributed to tandem's clients by pid: a process is a
// client's when its pid, or an ancestor's (read from <proc>/<pid>/stat, for
// engines whose GPU work runs in child processes), is the pid SO_PEERCRED
// gave at the client's connection. Pids are the daemon's pid namespace's;
// NVML's are the host's, so a daemon in a container of its own may see none
// match.
//
// Thread-safety: start(), apply() and the destructor on one thread (the
// loop's); snapshot() from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include <nlohmann/json_fwd.hpp>

#include "base/clock.h"
#include "base/result.h"
#include "daemon/config.h"
#include "daemon/metrics.h"
#include "gpu/nvml.h"

namespace tandem::daemon {

inline constexpr std::string_view kProcRoot = "/proc";

// A connected client, as GPU processes are attributed to it.
struct GpuClient {
  std::uint32_t id = 0;
  std::string name;
  std::string role;  // "engine", "runner", …
};

// Resolves GPU pids to clients: the pid itself, else its ancestors (up to
// kMaxDepth) through <proc_root>/<pid>/stat. Thread-safety: a value type.
class PidAttribution {
 public:
  static constexpr int kMaxDepth = 16;
  PidAttribution(std::map<pid_t, GpuClient> clients, std::string proc_root)
      : clients_(std::move(clients)), proc_root_(std::move(proc_root)) {}
  // The client `pid` belongs to, or nullptr.
  const GpuClient* find(pid_t pid) const;

 private:
  std::map<pid_t, GpuClient> clients_;
  std::string proc_root_;
};

// The parent pid in the text of /proc/<pid>/stat (the field after the state,
// which follows the last ')' of the command name). nullopt if malformed.
std::optional<pid_t> parse_stat_ppid(std::string_view stat);

class GpuTelemetry {
 public:
  // What the loop reads. Thread-safety: a value type.
  struct Snapshot {
    std::string enabled;     // the mode it runs with
    std::string library;     // as configured
    bool available = false;  // the library loaded and NVML initialised
    std::string reason;      // why not, when !available
    std::chrono::milliseconds interval{};
    std::optional<gpu::NvmlSample> sample;  // the latest good sample (none before the first)
    std::string error;                      // the latest sample's failure, "" if it succeeded
    std::uint64_t samples = 0;              // successful samples
    std::uint64_t failures = 0;             // failed ones
  };

  // Loads NVML per `config` and starts the thread (see the file comment for
  // the modes). Errors only in mode "on": the load's error, e.g. ENOENT
  // "nvml: libnvidia-ml.so.1: not found — no NVIDIA driver (…)".
  static base::Result<std::unique_ptr<GpuTelemetry>> start(const NvmlConfig& config);
  // For a reload to `fresh`: a new, started object when the mode or the
  // library changed (an error only in mode "on"), nullptr when `running` can
  // go on with apply(fresh).
  static base::Result<std::unique_ptr<GpuTelemetry>> prepare(const GpuTelemetry& running, const NvmlConfig& fresh);
  ~GpuTelemetry();
  GpuTelemetry(const GpuTelemetry&) = delete;
  GpuTelemetry& operator=(const GpuTelemetry&) = delete;

  // Takes fresh's interval; the thread's current wait ends early if the new
  // interval is already over.
  void apply(const NvmlConfig& fresh);
  const NvmlConfig& config() const { return config_; }
  Snapshot snapshot() const;
  // Whether the sampling thread is running (tests).
  bool sampling() const { return thread_.joinable(); }

 private:
  explicit GpuTelemetry(const NvmlConfig& config) : config_(config) {}
  void run();

  NvmlConfig config_;                          // the loop's copy
  std::unique_ptr<gpu::NvmlSampler> sampler_;  // used by the thread only, once started
  mutable std::mutex mu_;
  std::condition_variable wake_;
  // Guarded by mu_:
  Snapshot shared_;
  bool stop_ = false;
  std::thread thread_;
};

// `tandemctl gpu`'s JSON (docs/tandemctl.md): availability, the latest
// sample's devices with each process's client, its age at `now`.
nlohmann::json gpu_json(const GpuTelemetry::Snapshot& snap, base::Time now, const PidAttribution& clients);
// tandem_nvml_up and the tandem_gpu_* families (docs/metrics.md).
void gpu_metrics(PromText& p, const GpuTelemetry::Snapshot& snap, const PidAttribution& clients);
// A short object for `tandemctl status`: enabled, available (or why not),
// devices, samples, failures.
nlohmann::json gpu_status(const GpuTelemetry::Snapshot& snap);

}  // namespace tandem::daemon
