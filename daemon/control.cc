// tandemd's control tick: the policy's actions into directives and effects, the GPU plane, reload (daemon/server.h).

#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "base/ids.h"
#include "base/text.h"
#include "daemon/events.h"
#include "daemon/server.h"
#include "daemon/server_parts.h"
#include "sched/apply.h"

namespace tandem::daemon {

using base::Time;
using sched::SessionState;

// ---- control ----------------------------------------------------------------------

void Server::tick(Time now) {
  // The tick's own cost in real time, whatever clock it decides by.
  const auto began = std::chrono::steady_clock::now();
  ++stats_.ticks;
  actions_.clear();
  policy_.control->tick(model_, now, actions_);
  stats_.actions += actions_.list().size();
  for (const sched::Action& a : actions_.list()) sched::apply(a, model_.sessions(), *this, now);
  gpu_tick(now);

  auto& table = model_.sessions();
  std::vector<sched::SessionId> done;
  for (const sched::Session* s : table.in_state(SessionState::kDone)) done.push_back(s->id);
  for (sched::SessionId id : done) session_done(id);
  table.reap_done();
  if (auto view = effects_->host_tick(now, model_)) model_.set_cpu(*view);

  for (auto& [id, c] : clients_) {
    if (!c.doomed && c.role == Role::kEngine && c.has_channel) publish_status(c, now);
  }
  ring_directive_bells();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  stats_.tick_seconds += took;
  stats_.tick_seconds_max = std::max(stats_.tick_seconds_max, took);
}

void Server::gpu_tick(Time now) {
  gpu_changes_.clear();
  gpu_.tick(model_, gpu_changes_);
  for (const GpuChange& g : gpu_changes_) {
    Client* c = find_client(g.engine);
    if (c == nullptr || c->role != Role::kEngine) continue;
    if (g.sm) {
      sm_partition(g.engine, g.sm_partition, now);  // as the policy's own set_sm_partition would
      log_event(now, LogKind::kSmPartition, 0, {g.engine, g.sm_partition, g.decode_sms, g.sm_dec});
    }
    if (g.offload) {
      c->gpu.offload_plan = g.offload_plan;
      c->gpu.offload_freed_bytes = g.freed_bytes;
      ++stats_.offload_plan_changes;
      log_event(now, LogKind::kOffloadPlan, 0,
                {g.engine, static_cast<std::int64_t>(g.offload_plan), static_cast<std::int64_t>(g.freed_bytes),
                 static_cast<std::int64_t>(std::min(g.pressure, 1e12) * 1000.0)});
    }
  }
}

void Server::session_done(sched::SessionId id) {
  auto m = meta_.find(id);
  if (m != meta_.end()) {
    if (Client* creator = find_client(m->second.creator); creator != nullptr && creator->sessions > 0) {
      --creator->sessions;
    }
    // The engine that ran it and its runner forget it (CLOSE): the engine
    // frees what it kept for it, and neither brings it back in a resync.
    const Time now = clock_->now();
    const ipc::Slot close = directive_slot(ipc::Close{}, id, now);
    const sched::Session* s = model_.sessions().find(id);
    if (s != nullptr && s->engine != sched::kNoEngine) {
      if (Client* e = find_client(s->engine)) push_directive(*e, close);
    }
    if (m->second.told != sched::kNoEngine && (s == nullptr || m->second.told != s->engine)) {
      if (Client* e = find_client(m->second.told)) push_directive(*e, close);
    }
    if (auto o = owners_.find(m->second.owner); o != owners_.end()) {
      o->second.sessions.erase(id);
      if (Client* r = find_client(o->second.client)) push_directive(*r, close);
      if (!tombstone(id)) journal_.closed(id, Closed::kByOwner);  // ended some other way: not owned any more
      if (o->second.client == 0 && o->second.sessions.empty()) {
        if (o->second.pidfd_armed) uring_.cancel(Tag{Op::kOwnerPidfd, o->first});
        owner_ids_.erase(o->second.key);
        owners_.erase(o);
      }
    }
    meta_.erase(m);
  }
  (void)kill_unplaced(id);
  effects_->session_gone(id);
}

// ---- what the policy's actions do here (sched::ActionSink; sched/apply.h) ----

bool Server::may_admit() const { return !draining_; }  // draining: new sessions wait; paused ones are restored

void Server::admitted(const sched::Session& s, Time now) {
  log_event(now, LogKind::kAdmit, s.id, {s.engine});
  send_directive(s.engine, directive_slot(ipc::Admit{}, s.id, now));
  if (auto m = meta_.find(s.id); m != meta_.end()) m->second.told = s.engine;
}

void Server::paused(const sched::Session& s, Time now) {
  log_event(now, LogKind::kPause, s.id);
  send_directive(s.engine, directive_slot(ipc::Pause{}, s.id, now));
  if (auto m = meta_.find(s.id); m != meta_.end()) m->second.told = sched::kNoEngine;
}

void Server::restored(const sched::Session& s, sched::EngineId from, Time now) {
  log_event(now, LogKind::kRestore, s.id, {s.engine});
  ipc::Restore r;
  r.engine = s.engine;
  const ipc::Slot slot = directive_slot(r, s.id, now);
  send_directive(from, slot);
  if (s.engine != from) send_directive(s.engine, slot);
  if (auto m = meta_.find(s.id); m != meta_.end()) m->second.told = s.engine;
}

void Server::priority(const sched::Session& s, std::int64_t level, Time now) {
  ipc::Priority p;
  p.level = static_cast<std::uint8_t>(std::clamp<std::int64_t>(level, 0, ipc::kPriorityLevels - 1));
  if (auto m = meta_.find(s.id); m != meta_.end()) m->second.priority = p.level;
  send_directive(s.engine, directive_slot(p, s.id, now));
}

void Server::pinned(const sched::Session& s, Time until, Time now) {
  log_event(now, LogKind::kPin, s.id, {base::to_ns(until) - base::to_ns(now)});
  ipc::Pin p;
  p.until_ns = std::max<std::int64_t>(base::to_ns(until), 1);
  send_directive(s.engine, directive_slot(p, s.id, now));
}

void Server::unpinned(const sched::Session& s, Time now) {
  log_event(now, LogKind::kUnpin, s.id);
  send_directive(s.engine, directive_slot(ipc::Unpin{}, s.id, now));
}

void Server::dropped(const sched::Session& s, Time now) {
  log_event(now, LogKind::kDrop, s.id);
  send_directive(s.engine, directive_slot(ipc::Drop{}, s.id, now));
}

void Server::offloaded(const sched::Session& s, Time now) {
  log_event(now, LogKind::kOffload, s.id);
  send_directive(s.engine, directive_slot(ipc::Offload{}, s.id, now));
}

void Server::cpu_weight(const sched::Session& s, std::int64_t weight, Time /*now*/) {
  if (auto m = meta_.find(s.id); m != meta_.end()) m->second.cpu_weight = weight;
  effects_->set_cpu_weight(s.id, static_cast<std::uint32_t>(weight));
  ++stats_.effects_cpu_weight;
}

void Server::cpu_quota(const sched::Session& s, std::int64_t us_per_100ms, Time /*now*/) {
  if (auto m = meta_.find(s.id); m != meta_.end()) m->second.cpu_quota = us_per_100ms;
  effects_->set_cpu_quota(s.id, static_cast<std::uint32_t>(us_per_100ms));
  ++stats_.effects_cpu_quota;
}

void Server::kill_tools(const sched::Session& s, Time now) {
  log_event(now, LogKind::kKillTools, s.id);
  effects_->kill_tools(s.id, ipc::ToolExitReason::kKilledPolicy);
  ++stats_.effects_kill_tools;
}

void Server::sm_partition(sched::EngineId engine, std::int64_t index, Time /*now*/) {
  Client* c = find_client(engine);
  if (c == nullptr || c->role != Role::kEngine) return;
  c->gpu.sm_partition = static_cast<std::uint32_t>(index);
  c->gpu.sm_partition_set = true;
  effects_->set_sm_partition(engine, static_cast<std::uint32_t>(index));
  ++stats_.effects_sm_partition;
}

void Server::send_directive(sched::EngineId engine, const ipc::Slot& record) {
  Client* c = find_client(engine);
  if (c == nullptr || c->role != Role::kEngine) return;
  push_directive(*c, record);
}

void Server::push_directive(Client& c, const ipc::Slot& record) {
  if (c.doomed || !c.has_channel) return;
  ++stats_.directives;
  if (c.backlog.empty() && c.directives.try_push(record)) {
    c.bell_due = true;  // rung once for all of this tick's directives
    return;
  }
  if (c.backlog.size() >= kBacklogLimit) {
    ++stats_.directives_dropped;
    if (!c.warned.backlog) {
      spdlog::warn("client {} ({}): directive ring and backlog full (is it polling?); dropping directives", c.id,
                   base::escape(c.name));
      c.warned.backlog = true;
    }
    return;
  }
  c.backlog.push_back(record);
}

void Server::flush_backlog(Client& c) {
  bool pushed = false;
  while (!c.backlog.empty() && c.directives.try_push(c.backlog.front())) {
    c.backlog.pop_front();
    pushed = true;
  }
  if (pushed) c.bell_due = true;
}

void Server::ring_directive_bells() {
  for (auto& [id, c] : clients_) {
    if (!c.bell_due || c.doomed) continue;
    c.directive_bell.notify();
    c.bell_due = false;
  }
}

std::uint32_t Server::wake_watermark(const Client& c) {
  // An eighth of the ring: a client far below it waits at most one tick; one
  // that sends faster wakes the loop about eight times per ring's worth.
  return std::max<std::uint32_t>(1, c.channel.event_slots() / 8);
}

void Server::publish_status(Client& c, Time now) {
  ipc::EngineStatus st;
  st.policy_epoch = policy_epoch_;
  st.updated_ns = base::to_ns(now);
  st.sm_partition = c.gpu.sm_partition;
  st.offload_plan = c.gpu.offload_plan;
  st.offload_freed_bytes = c.gpu.offload_freed_bytes;
  if (c.gpu.sm_partition_set) {
    // The index is for the pool the daemon chose it for: an engine that
    // opened another since follows nothing until the next tick chooses.
    const EngineGpu* g = gpu_.engine(c.id);
    if (g != nullptr && g->has_pool()) {
      st.flags |= ipc::kStatusSmPartitionSet;
      st.sm_partition_pool = g->pool_id;
    }
  }
  c.status.publish(st);
}

base::Result<void> Server::reload() {
  notifier_->reloading();
  base::Result<void> done;
  if (!reload_) {
    done = base::make_error(ENOTSUP, "reload: this tandemd has no configuration to read again");
  } else if (auto fresh = reload_(); !fresh) {
    spdlog::error("reload failed; the running configuration is unchanged: {}", fresh.error().message());
    done = std::unexpected(std::move(fresh.error()));
  } else if (done = apply_config(std::move(*fresh), "reload"); !done) {
    spdlog::error("{}", done.error().message());
  }
  notifier_->ready();
  return done;
}

base::Result<void> Server::apply_config(Compiled fresh, std::string_view why) {
  const Config& cfg = fresh.config->config();
  const ReloadPlan plan = reload_plan(config_->config(), cfg);
  if (!plan.refused.empty()) {
    return base::make_error(EINVAL, fmt::format("{} refused: {} changed and takes effect only at a restart; the "
                                                "running configuration is unchanged",
                                                why, fmt::join(plan.refused, ", ")));
  }
  for (const std::string& what : plan.at_restart) {
    spdlog::warn("{}: {} changes take effect at the next restart", why, what);
  }
  // [nvml]: a new mode or library starts a new sampler before anything
  // changes (with "on", one that cannot load refuses the reload); a new
  // interval is applied to the running one.
  auto gpu_telemetry = GpuTelemetry::prepare(*gpu_telemetry_, cfg.nvml);
  if (!gpu_telemetry) {
    return base::make_error(EINVAL, fmt::format("{} refused: {}; the running configuration is unchanged", why,
                                                gpu_telemetry.error().message()));
  }
  if (plan.policy) install_policy(std::move(fresh.policy));
  if (plan.tick) {
    auto timer = make_timer(cfg.tick);
    if (!timer) {
      spdlog::error("{}: new tick timer: {}; keeping the old tick", why, timer.error().message());
    } else {
      // The armed read holds the old timer's file; it fires once more and is
      // re-armed on the new one.
      timer_fd_ = std::move(*timer);
    }
  }
  if (*gpu_telemetry) {
    gpu_telemetry_ = std::move(*gpu_telemetry);  // the old sampler's thread is joined here
  } else if (plan.nvml) {
    gpu_telemetry_->apply(cfg.nvml);
  }
  if (why == "reload") ctl_->file_reloaded();  // the file again, with nothing set on top
  config_ = std::move(fresh.config);
  if (plan.gpu) gpu_.configure(config_->config().gpu);
  if (plan.policy) {
    for (auto& [id, c] : clients_) {
      if (!c.doomed && c.role == Role::kEngine && c.phase == Phase::kActive) send_policy_config(c);
    }
  }
  spdlog::info("{}: {} (policy {}{})", why, config_->config().source, config_->config().policy,
               plan.policy ? ", changed" : "");
  return {};
}

}  // namespace tandem::daemon
