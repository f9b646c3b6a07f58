// HostPlane: the daemon's host side (issue 6, docs/architecture.md "Host plane", docs/host.md).
// It implements HostEffects on real cgroups (cpu/cgroup.h) and telemetry
// (bpf/telemetry.h):
//
//   <subtree>/engines/                      cpuset of the engines' cores
//   <subtree>/tools/<session>/<call>/       one cgroup per tool call (made on demand: cold)
//   <subtree>/tools/<session>/pool-<n>/     a ready one of the warm pool (below)
//
// Session folders are the session id in 16 hex digits; a session's
// cpu.weight and cpu.max (the policy's set_cpu_weight / set_cpu_quota) sit on
// its folder, a tool call's limits on the call's. Tool calls are created on
// a runner's ToolPrepare; the runner starts the tool inside them. When a
// call ends its cgroup goes at the next tick if it is empty (daemonised leftovers keep
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
// The warm pool (docs/host.md "The warm pool"). Making a call's cgroup on
// ToolPrepare costs a mkdir and the limit writes in every hierarchy on the
// runner's path. So each session that calls tools keeps a few cgroups ready
// in its folder, made ahead with the call limits of [tools] written (the
// session's cpu.weight and cpu.max sit on the folder above them). ToolPrepare
// takes one (a hit) and writes only the limits the runner tightened; with
// none ready it makes one as before (a miss, counted). Refill and shrinking
// run in host_tick, at most kPoolBatch cgroups made or removed per tick, never
// on a request. A session's target follows its tool-call rate (an EWMA over
// kHostPeriod): ceil(rate × kPoolHorizon) + 1, at most
// [tools] pool_per_session; a session without a call for pool_idle keeps
// none; over all sessions at most pool_max. A used cgroup is never reused: a
// call's counters (cpu.stat, memory.peak, memory.events) cannot all be reset,
// and TOOL_END reads them, so a call's cgroup is removed once empty, as
// before, and the pool makes a fresh one. Ready cgroups hold no process and
// go with their session's folder; at stop they are removed; at start the
// ones found are removed (a handed-out one still holding processes is kept
// as its session's leftover until empty).
//
// Restart: tool cgroups found at start belong to sessions of the previous
// run. With on_restart = "adopt" each is kept for adopt_grace, and kept for
// good once a runner brings its session back (Resync); otherwise, or with
// "reap", its processes are killed and it is removed.
//
// Code: setup, requests and policy actions in host_plane.cc; the tick
// (sampling, memory rules, the warm pool, recycling) in host_tick.cc.
//
// Thread-safety: the daemon loop's thread only.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/id_map.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "bpf/telemetry.h"
#include "cpu/cgroup.h"
#include "daemon/config.h"
#include "daemon/effects.h"
#include "sched/host_memory.h"

namespace tandem::daemon {

// How often the plane samples and applies its memory rules
// (sched/host_memory.h says why).
inline constexpr base::Duration kHostPeriod = sched::kHostMemoryPeriod;
// The warm pool: cgroups made or removed per host_tick at most (the tick runs
// every policy tick, 50 ms by default: up to 80 a second), and how far ahead
// of its tool-call rate a session's ready cgroups reach. The batches are
// small because the loop does them: a cgroup made in five hierarchies cost
// about 0.8 ms on the development VM (spawn_bench, cold − warm), and a burst
// of calls waits behind the whole batch.
inline constexpr std::uint32_t kPoolBatch = 4;
// Ended calls' cgroups removed per tick at most (TOOL_END only marks them);
// every ended one each host period.
inline constexpr std::size_t kRecycleBatch = 16;
inline constexpr base::Duration kPoolHorizon = std::chrono::milliseconds(500);
// Name prefix of the warm pool's ready cgroups (tools/<session>/pool-<n>):
// never a number, so never taken for a call's.
inline constexpr std::string_view kPoolPrefix = "pool-";

// Where HostPlane::open() finds the host; the defaults are the real one.
// Tests point it at a fake cgroupfs and procfs in a temporary directory
// (tests/daemon/host_plane_test.cc; docs/host.md "Tests"). Thread-safety: a
// value type.
struct HostEnv {
  // The cgroup manager's options, but for subtree and root (HostConfig's):
  // the mountinfo and self-cgroup files, and the fake-tree hooks.
  cpu::ManagerOptions cgroups;
  // procfs: node pressure (<proc_root>/pressure/{memory,cpu}) and the sampler's files.
  std::string proc_root = "/proc";
};

class HostPlane final : public HostEffects {
 public:
  // Sets up the subtree and telemetry; `now` dates the adoption deadlines.
  static base::Result<std::unique_ptr<HostPlane>> open(const HostConfig& config, base::Time now,
                                                       const HostEnv& env = {});
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
  bool tool_ahead(sched::SessionId session) const override;

  std::optional<sched::CpuView> host_tick(base::Time now, const sched::NodeModel& model) override;
  std::optional<sched::HostMemoryView> host_memory() const override;
  int event_fd() const override { return telemetry_ ? telemetry_->event_fd() : -1; }
  void on_events() override;
  void status(nlohmann::json& out) const override;
  void tools(nlohmann::json& out) const override;

  // For tests and tandemctl.
  const cpu::CgroupManager& cgroups() const { return *cgroups_; }
  const bpf::Telemetry* telemetry() const { return telemetry_.get(); }
  std::size_t sessions() const { return sessions_.size(); }
  std::size_t pending_removals() const { return doomed_.size(); }
  // The warm pool: cgroups ready now (all sessions), and ToolPrepares served from it or not.
  std::size_t pool_ready() const { return pool_ready_; }
  std::uint64_t pool_hits() const { return pool_hits_; }
  std::uint64_t pool_misses() const { return pool_misses_; }

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
    std::uint64_t peak_bytes = 0;    // the most it was seen to use (memory.peak where there is one)
    std::uint64_t oom_kills = 0;     // its cgroup's OOM kills at the last read
    std::uint64_t cpu_ns = 0;        // CPU time at the last read (tools_cpu_ns_ has it)
  };
  // Adds what `c` used since its last read to tools_cpu_ns_.
  void account_cpu(Call& c, const cpu::Usage& u);
  // Follows `c`'s peak and counts its new OOM kills in memory_kills_.
  void account_memory(Call& c, const cpu::Usage& u);
  // An ended call's peak joins the recent peaks (host_memory()'s 95th percentile).
  void remember_peak(const Call& c);
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
    // The warm pool: ready cgroups (made with pool_limits_), and the tool-call rate.
    std::vector<cpu::Node> ready;
    std::vector<cpu::Node> leftovers;  // handed-out pool cgroups found at start with processes
    std::uint32_t calls_in_period = 0;
    double rate = 0.0;  // tool calls a second, EWMA over kHostPeriod
    base::Time last_call{};
    bool called = false;  // a tool call seen by this run (orphans found at start have none)
    // The call prepared ahead (ToolPrepare.ahead) until a TOOL_START names it.
    std::optional<std::uint32_t> ahead;
  };
  // The session's placement ahead, if it has one no TOOL_START named yet.
  static const Call* ahead_call(const SessionCg& s);
  // Mirrors sched::MemoryLevel (the rule's levels), for status.
  enum class Pressure : std::uint8_t { kNormal, kHigh, kCritical };

  HostPlane(const HostConfig& config, const HostEnv& env, std::unique_ptr<cpu::CgroupManager> cgroups);
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
  // Removes the cgroups of up to `budget` ended calls that are empty: those
  // TOOL_END marked since, or with `all` (each host period) every ended one.
  void recycle(std::size_t budget, bool all);
  // The warm pool: grows and shrinks each session's ready cgroups (host_tick).
  void pool_tick(base::Time now, bool period);
  // Removes one ready cgroup (empty by construction); false if it failed.
  bool drop_ready(cpu::Node node);
  // A pooled cgroup of session `s` limited as `limits`, or nullopt (none ready, or
  // the extra limits would not apply: that one is removed).
  std::optional<cpu::Node> take_ready(SessionCg& s, const cpu::Limits& limits);

  HostConfig config_;
  std::string proc_root_;  // HostEnv::proc_root
  std::unique_ptr<cpu::CgroupManager> cgroups_;
  base::UniqueFd lock_;  // flock on the subtree: one tandemd per subtree
  std::unique_ptr<bpf::Telemetry> telemetry_;
  std::string telemetry_error_;  // why telemetry is off, if it is
  cpu::Node engines_;
  cpu::Node tools_;
  std::uint32_t tool_cores_ = 0;
  std::unordered_map<sched::SessionId, SessionCg> sessions_;
  // The policy's cpu.weight and cpu.max for sessions without a folder yet.
  base::IdMap<std::pair<std::optional<std::uint32_t>, std::optional<std::uint32_t>>> pending_;
  std::vector<cpu::Node> doomed_;
  base::Time last_sample_{};
  bool sampled_ = false;
  Pressure pressure_ = Pressure::kNormal;
  sched::HostMemoryRule memory_rule_;
  double memory_psi_ = -1.0;
  double cpu_psi_ = -1.0;
  std::uint64_t tools_memory_ = 0;
  std::uint64_t memory_kills_ = 0;  // tool calls OOM-killed or killed by the memory rules
  // Σ over tool calls of the time they waited at their memory limit (v1
  // under_oom: the throttle stops a tool, and PSI does not count the wait),
  // each sample charged the time since the previous one.
  base::Duration tools_memory_stalled_{};
  std::optional<base::Time> last_memory_sample_;
  std::deque<std::uint64_t> peaks_;  // peaks of the last kRecentPeaks ended calls
  std::uint64_t peak_p95_ = 0;       // their 95th percentile, kept as they change (0: none yet)
  static constexpr std::size_t kRecentPeaks = 256;
  std::uint64_t tools_cpu_ns_ = 0;  // Σ CPU of every tool call, read each host tick and at a call's end
  std::array<std::uint64_t, bpf::kRunqBuckets> runq_last_{};
  sched::CpuView view_;
  // Counters for tandemctl status.
  std::uint64_t tools_prepared_ = 0;
  std::uint64_t tools_ahead_ = 0;  // of those, placements ahead
  std::uint64_t tools_killed_ = 0;
  std::uint64_t sessions_reaped_ = 0;
  std::uint64_t sessions_adopted_ = 0;
  std::uint64_t throttles_ = 0;
  std::uint64_t freezes_ = 0;
  std::uint64_t proc_events_ = 0;
  std::uint64_t execs_ = 0;
  std::uint64_t exits_ = 0;
  std::uint64_t lineage_killed_ = 0;  // processes killed at a session's end that had left its cgroups
  // The warm pool.
  cpu::Limits pool_limits_;  // what a ready cgroup carries: limits_for({})
  std::uint64_t pool_seq_ = 0;
  std::size_t pool_ready_ = 0;      // Σ ready over the sessions
  std::uint64_t pool_hits_ = 0;     // ToolPrepares served from the pool
  std::uint64_t pool_misses_ = 0;   // ToolPrepares that made their cgroup (cold)
  std::uint64_t pool_made_ = 0;     // ready cgroups made
  std::uint64_t pool_dropped_ = 0;  // ready cgroups removed unused (shrinking, session end, stop)
  std::uint64_t pool_errors_ = 0;   // refills that failed
  std::uint32_t pool_target_ = 0;   // Σ of the sessions' targets at the last tick
  std::size_t ended_waiting_ = 0;   // ended calls whose cgroup recycle() may remove (0: none)
};

}  // namespace tandem::daemon
