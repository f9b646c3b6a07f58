// HostPlane: the daemon's host side (issue 6, docs/architecture.md "Host plane", docs/host.md).
// It implements HostEffects on real cgroups (cpu/cgroup.h) and telemetry
// (bpf/telemetry.h):
//
//   <subtree>/engines/                      cpuset of the engines' cores
//   <subtree>/tools/<session>/<call>/       one cgroup per tool call
//
// Session folders are the session id in 16 hex digits; a session's
// cpu.weight and cpu.max (the policy's set_cpu_weight / set_cpu_quota) sit on
// its folder, a tool call's limits on the call's. Tool calls are created on
// a runner's ToolPrepare; the runner starts the tool inside them. When a
// call ends its cgroup goes as soon as it is empty (daemonised leftovers keep
// it until the session ends); when a session ends every process in its folder
// is killed — found by cgroup membership, not the process tree — and the
// folder removed, retried each tick while a process is stuck.
//
// Memory: degrade before killing. Every `kHostPeriod` the plane reads node
// memory pressure (PSI some avg10) and the tools' memory against
// [memory] tools_budget. At "high" it throttles the tools of unprotected
// sessions at their current size (memory.high; on v1 the stalling limit); at
// "critical" it also freezes low-priority ones (priority class ≥ 2, or
// flagged low_priority); it undoes both once pressure falls below half of
// "high". Sessions whose KV is pinned are protected: never throttled or
// frozen, memory.low = [memory] protect_low on v2. A tool stalled at its
// limit for [memory] stall_kill_after is killed with reason kKilledMemory.
//
// Restart: tool cgroups found at start belong to sessions of the previous
// run. With on_restart = "adopt" each is kept for adopt_grace, and kept for
// good once a runner brings its session back (Resync); otherwise, or with
// "reap", its processes are killed and it is removed.
//
// Thread-safety: the daemon loop's thread only.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "bpf/telemetry.h"
#include "cpu/cgroup.h"
#include "daemon/config.h"
#include "daemon/effects.h"
#include "sched/host_memory.h"

namespace tandem::daemon {

// How often the plane samples and applies its memory rules (the policy tick
// may be faster; reading every tool's files at 20 Hz would cost more than
// the rest of the daemon).
inline constexpr base::Duration kHostPeriod = std::chrono::milliseconds(250);

class HostPlane final : public HostEffects {
 public:
  // Sets up the subtree and telemetry; `now` dates the adoption deadlines.
  static base::Result<std::unique_ptr<HostPlane>> open(const HostConfig& config, base::Time now);
  ~HostPlane() override;
  HostPlane(const HostPlane&) = delete;
  HostPlane& operator=(const HostPlane&) = delete;

  void set_cpu_weight(sched::SessionId session, std::uint32_t weight) override;
  void set_cpu_quota(sched::SessionId session, std::uint32_t us_per_100ms) override;
  void kill_tools(sched::SessionId session, ipc::ToolExitReason reason) override;
  void set_sm_partition(sched::EngineId /*engine*/, std::uint32_t /*index*/) override {}
  void session_gone(sched::SessionId session) override;
  std::vector<std::int32_t> survivors(sched::SessionId session) const override;

  base::Result<ToolGrant> prepare_tool(const ToolRequest& request) override;
  void tool_started(sched::SessionId session, std::uint32_t call, std::int32_t pid) override;
  void tool_ended(sched::SessionId session, std::uint32_t call) override;
  std::size_t tool_cgroups(sched::SessionId session) const override;

  std::optional<sched::CpuView> host_tick(base::Time now, const sched::NodeModel& model) override;
  int event_fd() const override { return telemetry_ ? telemetry_->event_fd() : -1; }
  void on_events() override;
  void status(nlohmann::json& out) const override;
  void tools(nlohmann::json& out) const override;

  // For tests and tandemctl.
  const cpu::CgroupManager& cgroups() const { return *cgroups_; }
  const bpf::Telemetry* telemetry() const { return telemetry_.get(); }
  std::size_t sessions() const { return sessions_.size(); }
  std::size_t pending_removals() const { return doomed_.size(); }

 private:
  struct Call {
    cpu::Node node;
    std::int32_t pid = 0;
    bool ended = false;  // TOOL_END seen (its leftovers may still run)
    bool low_priority = false;
    cpu::Limits limits;  // as applied at creation
    bool throttled = false;
    bool frozen = false;
    std::optional<base::Time> stalled_since;
    std::uint64_t memory_bytes = 0;  // at the last sample
    std::uint64_t cpu_ns = 0;        // CPU time at the last read (tools_cpu_ns_ has it)
  };
  // Adds what `c` used since its last read to tools_cpu_ns_.
  void account_cpu(Call& c, const cpu::Usage& u);
  struct SessionCg {
    cpu::Node node;
    std::map<std::uint32_t, Call> calls;
    std::optional<std::uint32_t> cpu_weight;
    std::optional<std::uint32_t> cpu_quota;  // µs per 100 ms, 0 = unlimited
    bool orphan = false;                     // found at start, not yet claimed
    base::Time orphan_deadline{};
    bool protected_low = false;  // memory.low is set
    std::uint8_t priority_class = 0;
    bool pinned = false;
  };
  // Mirrors sched::MemoryLevel (the rule's levels), for status.
  enum class Pressure : std::uint8_t { kNormal, kHigh, kCritical };

  HostPlane(const HostConfig& config, std::unique_ptr<cpu::CgroupManager> cgroups);
  base::Result<void> start(base::Time now);
  SessionCg* session_cg(sched::SessionId session, bool create);
  // Kills and removes `node`; on failure it is retried every tick.
  void bury(cpu::Node node);
  // Kills the session's lineage (eBPF): its processes that left its cgroups.
  void kill_lineage(sched::SessionId session);
  void retry_burials();
  void memory_rules(base::Time now, const sched::NodeModel& model);
  void kill_call(sched::SessionId session, std::uint32_t call, Call& c, ipc::ToolExitReason reason,
                 std::string message);
  cpu::Limits limits_for(const ipc::ToolLimitsInfo& asked) const;

  HostConfig config_;
  std::unique_ptr<cpu::CgroupManager> cgroups_;
  base::UniqueFd lock_;  // flock on the subtree: one tandemd per subtree
  std::unique_ptr<bpf::Telemetry> telemetry_;
  std::string telemetry_error_;  // why telemetry is off, if it is
  cpu::Node engines_;
  cpu::Node tools_;
  std::uint32_t tool_cores_ = 0;
  std::unordered_map<sched::SessionId, SessionCg> sessions_;
  // The policy's cpu.weight and cpu.max for sessions without a folder yet.
  std::unordered_map<sched::SessionId, std::pair<std::optional<std::uint32_t>, std::optional<std::uint32_t>>> pending_;
  std::vector<cpu::Node> doomed_;
  base::Time last_sample_{};
  bool sampled_ = false;
  Pressure pressure_ = Pressure::kNormal;
  sched::HostMemoryRule memory_rule_;
  double memory_psi_ = -1.0;
  double cpu_psi_ = -1.0;
  std::uint64_t tools_memory_ = 0;
  std::uint64_t tools_cpu_ns_ = 0;  // Σ CPU of every tool call, read each host tick and at a call's end
  std::array<std::uint64_t, bpf::kRunqBuckets> runq_last_{};
  sched::CpuView view_;
  // Counters for tandemctl status.
  std::uint64_t tools_prepared_ = 0;
  std::uint64_t tools_killed_ = 0;
  std::uint64_t sessions_reaped_ = 0;
  std::uint64_t sessions_adopted_ = 0;
  std::uint64_t throttles_ = 0;
  std::uint64_t freezes_ = 0;
  std::uint64_t proc_events_ = 0;
  std::uint64_t execs_ = 0;
  std::uint64_t exits_ = 0;
  std::uint64_t lineage_killed_ = 0;  // processes killed at a session's end that had left its cgroups
};

}  // namespace tandem::daemon
