// Control (daemon/control.h): the policy's events and tick, its actions
// into directives and effects, and the GPU plane's choices.

#include "daemon/control.h"

#include <algorithm>
#include <utility>

#include "daemon/server_parts.h"

namespace tandem::daemon {

using base::Time;
using LogKind = EventLog::Kind;

void Control::install_policy(sched::PolicyInstance policy) {
  policy_ = std::move(policy);
  ++policy_epoch_;
}

bool Control::feed(const sched::Event& e, Time now) {
  if (!model_.observe(e, now)) return false;
  policy_.control->on_event(e, model_, now);
  using L = LogKind;
  if (const auto* o = std::get_if<sched::SessionOpened>(&e)) {
    note(now, L::kSessionOpen, o->session);
  } else if (const auto* c = std::get_if<sched::SessionClosed>(&e)) {
    note(now, L::kSessionClose, c->session);
  } else if (const auto* r = std::get_if<sched::RoundSubmitted>(&e)) {
    note(now, L::kRoundSubmit, r->session, {r->round, r->engine, r->prompt_tokens, r->cached_tokens});
  } else if (const auto* d = std::get_if<sched::RoundEnded>(&e)) {
    note(now, L::kRoundEnd, d->session, {d->round, d->output_tokens, d->tool_follows});
  } else if (const auto* t = std::get_if<sched::ToolStarted>(&e)) {
    note(now, L::kToolStart, t->session, {t->tool_call});
  } else if (const auto* te = std::get_if<sched::ToolEnded>(&e)) {
    note(now, L::kToolEnd, te->session, {te->tool_call, te->exit_code, te->wall.count()});
  } else if (const auto* k = std::get_if<sched::KvChanged>(&e)) {
    note(now, L::kKv, k->session, {static_cast<std::int64_t>(k->change), k->blocks});
  }
  return true;
}

void Control::decide(Time now) {
  actions_.clear();
  policy_.control->tick(model_, now, actions_);
  stats_->actions += actions_.list().size();
  for (const sched::Action& a : actions_.list()) sched::apply(a, model_.sessions(), *this, now);
  gpu_tick(now);
}

void Control::host_tick(Time now) {
  if (auto view = effects_->host_tick(now, model_)) model_.set_cpu(*view);
  if (auto memory = effects_->host_memory()) model_.set_host_memory(*memory);
}

void Control::engine_gone(sched::EngineId engine, Time now) {
  (void)model_.engine_gone(engine, now);
  policy_.control->on_event(sched::EngineLeft{engine}, model_, now);
  gpu_.engine_gone(engine);
}

void Control::gpu_tick(Time now) {
  gpu_changes_.clear();
  gpu_.tick(model_, gpu_changes_);
  for (const GpuChange& g : gpu_changes_) {
    GpuChoice* choice = outlet_->gpu_choice(g.engine);
    if (choice == nullptr) continue;
    if (g.sm) {
      sm_partition(g.engine, g.sm_partition, now);  // as the policy's own set_sm_partition would
      note(now, LogKind::kSmPartition, 0, {g.engine, g.sm_partition, g.decode_sms, g.sm_dec});
    }
    if (g.offload) {
      choice->offload_plan = g.offload_plan;
      choice->offload_freed_bytes = g.freed_bytes;
      ++stats_->offload_plan_changes;
      note(now, LogKind::kOffloadPlan, 0,
           {g.engine, static_cast<std::int64_t>(g.offload_plan), static_cast<std::int64_t>(g.freed_bytes),
            static_cast<std::int64_t>(std::min(g.pressure, 1e12) * 1000.0)});
    }
  }
}

// ---- what the policy's actions do here (sched::ActionSink; sched/apply.h) ----

bool Control::may_admit() const { return !draining_; }  // draining: new sessions wait; paused ones are restored

void Control::admitted(const sched::Session& s, Time now) {
  note(now, LogKind::kAdmit, s.id, {s.engine});
  outlet_->send_directive(s.engine, directive_slot(ipc::Admit{}, s.id, now));
  if (SessionSteer* m = outlet_->steer(s.id)) m->told = s.engine;
}

void Control::paused(const sched::Session& s, Time now) {
  note(now, LogKind::kPause, s.id);
  outlet_->send_directive(s.engine, directive_slot(ipc::Pause{}, s.id, now));
  if (SessionSteer* m = outlet_->steer(s.id)) m->told = sched::kNoEngine;
}

void Control::restored(const sched::Session& s, sched::EngineId from, Time now) {
  note(now, LogKind::kRestore, s.id, {s.engine});
  ipc::Restore r;
  r.engine = s.engine;
  const ipc::Slot slot = directive_slot(r, s.id, now);
  outlet_->send_directive(from, slot);
  if (s.engine != from) outlet_->send_directive(s.engine, slot);
  if (SessionSteer* m = outlet_->steer(s.id)) m->told = s.engine;
}

void Control::priority(const sched::Session& s, std::int64_t level, Time now) {
  ipc::Priority p;
  p.level = static_cast<std::uint8_t>(std::clamp<std::int64_t>(level, 0, ipc::kPriorityLevels - 1));
  if (SessionSteer* m = outlet_->steer(s.id)) m->priority = p.level;
  outlet_->send_directive(s.engine, directive_slot(p, s.id, now));
}

void Control::pinned(const sched::Session& s, Time until, Time now) {
  note(now, LogKind::kPin, s.id, {base::to_ns(until) - base::to_ns(now)});
  ipc::Pin p;
  p.until_ns = std::max<std::int64_t>(base::to_ns(until), 1);
  outlet_->send_directive(s.engine, directive_slot(p, s.id, now));
}

void Control::unpinned(const sched::Session& s, Time now) {
  note(now, LogKind::kUnpin, s.id);
  outlet_->send_directive(s.engine, directive_slot(ipc::Unpin{}, s.id, now));
}

void Control::dropped(const sched::Session& s, Time now) {
  note(now, LogKind::kDrop, s.id);
  outlet_->send_directive(s.engine, directive_slot(ipc::Drop{}, s.id, now));
}

void Control::offloaded(const sched::Session& s, Time now) {
  note(now, LogKind::kOffload, s.id);
  outlet_->send_directive(s.engine, directive_slot(ipc::Offload{}, s.id, now));
}

void Control::cpu_weight(const sched::Session& s, std::int64_t weight, Time /*now*/) {
  if (SessionSteer* m = outlet_->steer(s.id)) m->cpu_weight = weight;
  effects_->set_cpu_weight(s.id, static_cast<std::uint32_t>(weight));
  ++stats_->effects_cpu_weight;
}

void Control::cpu_quota(const sched::Session& s, std::int64_t us_per_100ms, Time /*now*/) {
  if (SessionSteer* m = outlet_->steer(s.id)) m->cpu_quota = us_per_100ms;
  effects_->set_cpu_quota(s.id, static_cast<std::uint32_t>(us_per_100ms));
  ++stats_->effects_cpu_quota;
}

void Control::kill_tools(const sched::Session& s, Time now) {
  note(now, LogKind::kKillTools, s.id);
  effects_->kill_tools(s.id, ipc::ToolExitReason::kKilledPolicy);
  ++stats_->effects_kill_tools;
}

void Control::sm_partition(sched::EngineId engine, std::int64_t index, Time /*now*/) {
  GpuChoice* choice = outlet_->gpu_choice(engine);
  if (choice == nullptr) return;
  choice->sm_partition = static_cast<std::uint32_t>(index);
  choice->sm_partition_set = true;
  effects_->set_sm_partition(engine, static_cast<std::uint32_t>(index));
  ++stats_->effects_sm_partition;
}

}  // namespace tandem::daemon
