// HostEffects: the narrow interface through which a policy's CPU and GPU
// actions, and the runners' tool calls, reach the host (docs/contributing.md "The
// daemon": side effects go through interfaces, tests substitute recorders).
//
// The host plane (daemon/host_plane.h: cgroups, tool placement, memory
// pressure, telemetry; issue 6) and the GPU plane (SM partitions; issue 9)
// implement it. RecordingEffects keeps every call and changes nothing on the
// host: the daemon runs with it when cgroups are off (`[cgroups] mode`), and
// tests use it.
#pragma once

#include <cerrno>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/clock.h"
#include "base/result.h"
#include "ipc/messages.h"
#include "sched/model.h"
#include "sched/types.h"

namespace tandem::daemon {

// A runner asks for a tool call's cgroup (ToolPrepare).
struct ToolRequest {
  sched::SessionId session = 0;
  std::uint32_t call = 0;
  sched::ToolKind kind = 0;
  ipc::ToolLimitsInfo limits;
  bool ahead = false;  // ToolPrepare.ahead: the session's next call, not started yet
};

// The answer: what ToolPlacement says, and the directory fds it carries
// (borrowed from the host plane; valid until its next call).
struct ToolGrant {
  ipc::ToolPlacementInfo info;
  std::vector<int> fds;
};

// The host plane killed a tool call's processes: the server tells the
// session's runner (ToolKilled), so its tandem_tool_wait says why.
struct ToolNotice {
  sched::SessionId session = 0;
  std::uint32_t call = 0;
  ipc::ToolExitReason reason = ipc::ToolExitReason::kKilledPolicy;
  std::string message;
};

// Thread-safety: called from the daemon's loop thread only.
class HostEffects {
 public:
  virtual ~HostEffects() = default;
  // ---- policy actions ----
  virtual void set_cpu_weight(sched::SessionId session, std::uint32_t weight) = 0;
  virtual void set_cpu_quota(sched::SessionId session, std::uint32_t us_per_100ms) = 0;
  // Kills the processes of the session's running tool calls; `reason` is what
  // their runner is told.
  virtual void kill_tools(sched::SessionId session, ipc::ToolExitReason reason) = 0;
  virtual void set_sm_partition(sched::EngineId engine, std::uint32_t index) = 0;
  // The session ended: every process of it dies and what was set for it goes.
  virtual void session_gone(sched::SessionId session) = 0;
  // After session_gone(): the processes of the session still alive — in
  // its cgroups, or (eBPF) of its lineage wherever they went. Empty when it
  // is all dead; tandemctl session kill reports them instead of success.
  virtual std::vector<std::int32_t> survivors(sched::SessionId /*session*/) const { return {}; }

  // ---- tool calls (runners) ----
  // ENOTSUP: no host plane (the runner then starts the tool unplaced).
  virtual base::Result<ToolGrant> prepare_tool(const ToolRequest& /*request*/) {
    return base::make_error(ENOTSUP, "tandemd runs without cgroups ([cgroups] mode = off, or setup failed)");
  }
  virtual void tool_started(sched::SessionId /*session*/, std::uint32_t /*call*/, std::int32_t /*pid*/) {}
  virtual void tool_ended(sched::SessionId /*session*/, std::uint32_t /*call*/) {}
  // Tool cgroups the session has now (running calls, and ended ones whose
  // processes linger): what limits.tools_per_session bounds.
  virtual std::size_t tool_cgroups(sched::SessionId /*session*/) const { return 0; }
  // Whether the session holds a placement ahead that no TOOL_START has named yet.
  virtual bool tool_ahead(sched::SessionId /*session*/) const { return false; }

  // ---- the control tick ----
  // Samples telemetry and pressure, applies the memory-pressure rules, reaps
  // what is due; returns the CPU view for the policy (nullopt: nothing known).
  virtual std::optional<sched::CpuView> host_tick(base::Time /*now*/, const sched::NodeModel& /*model*/) {
    return std::nullopt;
  }
  // The host's memory for the policy (sched::HostMemoryView), as of the last
  // host_tick; nullopt: nothing known. Capacity 0 means no budget is
  // configured, and policies then do not gate on it.
  virtual std::optional<sched::HostMemoryView> host_memory() const { return std::nullopt; }
  // Where the plane reports a kill, before it kills, so that the runner
  // hears why before it sees the exit (the server sends ToolKilled).
  void set_notice_sink(std::function<void(const ToolNotice&)> sink) { notice_sink_ = std::move(sink); }
  // An fd the loop polls (the eBPF ring buffer); on POLLIN it calls on_events(). -1: none.
  virtual int event_fd() const { return -1; }
  virtual void on_events() {}
  // tandemctl status's "host" object, and tandemctl tools.
  virtual void status(nlohmann::json& /*out*/) const {}
  virtual void tools(nlohmann::json& /*out*/) const {}

 protected:
  void notice(const ToolNotice& n) const {
    if (notice_sink_) notice_sink_(n);
  }

 private:
  std::function<void(const ToolNotice&)> notice_sink_;
};

class RecordingEffects final : public HostEffects {
 public:
  struct SessionEffects {
    std::int64_t cpu_weight = -1;  // -1: never set
    std::int64_t cpu_quota = -1;
    std::uint64_t kills = 0;
  };

  void set_cpu_weight(sched::SessionId s, std::uint32_t weight) override { sessions_[s].cpu_weight = weight; }
  void set_cpu_quota(sched::SessionId s, std::uint32_t us) override { sessions_[s].cpu_quota = us; }
  void kill_tools(sched::SessionId s, ipc::ToolExitReason /*reason*/) override { ++sessions_[s].kills; }
  void set_sm_partition(sched::EngineId e, std::uint32_t index) override { partitions_[e] = index; }
  void session_gone(sched::SessionId s) override { sessions_.erase(s); }

  const SessionEffects* session(sched::SessionId s) const {
    auto it = sessions_.find(s);
    return it == sessions_.end() ? nullptr : &it->second;
  }
  const std::map<sched::EngineId, std::uint32_t>& partitions() const { return partitions_; }

 private:
  std::map<sched::SessionId, SessionEffects> sessions_;
  std::map<sched::EngineId, std::uint32_t> partitions_;
};

}  // namespace tandem::daemon
