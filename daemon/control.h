// Control: tandemd's decisions. It owns the node model (sched::NodeModel),
// the running policy (both halves, and its epoch), the GPU plane
// (daemon/gpu_plane.h) and the drain switch, and turns what the policy
// decides into directives for engines and effects on the host.
//
// Events come in through feed(), already checked against their record's
// rule (intake.cc): the model observes each and the policy sees it. At each
// control tick decide() runs the policy's tick; every action is applied to
// the session table the way sched::apply says (sched/apply.h), and Control,
// as its ActionSink, turns it into a directive (ADMIT, PAUSE, RESTORE, PIN,
// UNPIN, DROP, OFFLOAD, PRIORITY), an effect (HostEffects: cpu weight and
// quota, killing tools, SM partitions) and an entry of the event log; the
// GPU plane then chooses partitions and offload plans. What lies outside —
// the engines' rings, the daemon's record of each session and of each
// engine's GPU choice, the event log — it reaches through ControlOutlet,
// which the Server implements.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "base/clock.h"
#include "daemon/effects.h"
#include "daemon/event_log.h"
#include "daemon/gpu_plane.h"
#include "daemon/stats.h"
#include "ipc/records.h"
#include "sched/apply.h"
#include "sched/model.h"
#include "sched/registry.h"

namespace tandem::daemon {

// What Control last told about a session, kept with the daemon's record of
// it (tandemctl sessions shows it). Thread-safety: a value type.
struct SessionSteer {
  sched::EngineId told = sched::kNoEngine;  // engine last sent ADMIT or RESTORE for it
  std::uint8_t priority = 0;
  std::int64_t cpu_weight = -1;  // -1: never set
  std::int64_t cpu_quota = -1;
};

// Where Control's decisions go outside it. Thread-safety: the loop thread only.
class ControlOutlet {
 public:
  virtual ~ControlOutlet() = default;
  // Queues a directive for engine `engine` (dropped when no engine of that
  // id is connected).
  virtual void send_directive(sched::EngineId engine, const ipc::Slot& record) = 0;
  // The daemon's record of session `id` (null: it keeps none).
  virtual SessionSteer* steer(sched::SessionId id) = 0;
  // What the GPU plane chose for engine `engine` (null: no engine of that id
  // is connected).
  virtual GpuChoice* gpu_choice(sched::EngineId engine) = 0;
  // An entry of the event log.
  virtual void note(base::Time now, EventLog::Kind kind, sched::SessionId session, std::array<std::int64_t, 4> v) = 0;
};

// Thread-safety: the loop thread only.
class Control : private sched::ActionSink {
 public:
  Control(HostEffects& effects, ServerStats& stats, ControlOutlet& outlet)
      : effects_(&effects), stats_(&stats), outlet_(&outlet) {}
  Control(const Control&) = delete;
  Control& operator=(const Control&) = delete;

  // Runs `policy` from now on (its epoch is the next one).
  void install_policy(sched::PolicyInstance policy);
  void configure_gpu(const GpuConfig& config) { gpu_.configure(config); }

  sched::NodeModel& model() { return model_; }
  const sched::NodeModel& model() const { return model_; }
  GpuPlane& gpu() { return gpu_; }
  const GpuPlane& gpu() const { return gpu_; }
  const sched::ControlPolicy& policy() const { return *policy_.control; }
  const sched::PolicyParams& params() const { return policy_.params; }
  std::uint64_t epoch() const { return policy_epoch_; }
  // tandemctl drain: no new session is admitted (paused ones are restored);
  // live ones go on.
  bool draining() const { return draining_; }
  void set_draining(bool on) { draining_ = on; }

  // Applies an event to the model and shows it to the policy, noting it in
  // the event log; false if the session table rejected it.
  bool feed(const sched::Event& e, base::Time now);
  // The policy's tick: its actions applied, then the GPU plane's choices.
  void decide(base::Time now);
  // Applies one action as if the policy had taken it (an operator's).
  void apply(const sched::Action& action, base::Time now) { sched::apply(action, model_.sessions(), *this, now); }
  // The host plane's tick (HostEffects::host_tick): its CPU view and its memory view
  // (HostEffects::host_memory) given to the model.
  void host_tick(base::Time now);
  // Engine `engine` left: its rounds in flight are lost, the policy and the
  // GPU plane forget it.
  void engine_gone(sched::EngineId engine, base::Time now);

 private:
  void gpu_tick(base::Time now);
  void note(base::Time now, EventLog::Kind kind, sched::SessionId session, std::array<std::int64_t, 4> v = {}) {
    outlet_->note(now, kind, session, v);
  }

  // sched::ActionSink (sched/apply.h): what the policy's actions do here.
  bool may_admit() const override;
  void admitted(const sched::Session& s, base::Time now) override;
  void paused(const sched::Session& s, base::Time now) override;
  void restored(const sched::Session& s, sched::EngineId from, base::Time now) override;
  void priority(const sched::Session& s, std::int64_t level, base::Time now) override;
  void pinned(const sched::Session& s, base::Time until, base::Time now) override;
  void unpinned(const sched::Session& s, base::Time now) override;
  void dropped(const sched::Session& s, base::Time now) override;
  void offloaded(const sched::Session& s, base::Time now) override;
  void cpu_weight(const sched::Session& s, std::int64_t weight, base::Time now) override;
  void cpu_quota(const sched::Session& s, std::int64_t us_per_100ms, base::Time now) override;
  void kill_tools(const sched::Session& s, base::Time now) override;
  void sm_partition(sched::EngineId engine, std::int64_t index, base::Time now) override;

  HostEffects* effects_;
  ServerStats* stats_;
  ControlOutlet* outlet_;
  sched::PolicyInstance policy_;
  std::uint64_t policy_epoch_ = 0;
  sched::NodeModel model_;
  GpuPlane gpu_{GpuConfig{}};           // configured by the Server from the config
  std::vector<GpuChange> gpu_changes_;  // tick scratch
  sched::Actions actions_;              // tick scratch
  bool draining_ = false;
};

}  // namespace tandem::daemon
