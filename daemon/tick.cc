// tandemd's control tick as the Server runs it (daemon/server.h): Control
// (daemon/control.h) decides; the Server sends the directives to clients'
// rings and rings their bells, publishes engines' status pages, ends
// finished sessions, and reloads the configuration.

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

namespace tandem::daemon {

using base::Time;
using sched::SessionState;

void Server::tick(Time now) {
  // The tick's own cost in real time, whatever clock it decides by.
  const auto began = std::chrono::steady_clock::now();
  ++stats_.ticks;
  control_->decide(now);

  auto& table = control_->model().sessions();
  std::vector<sched::SessionId> done;
  for (const sched::Session* s : table.in_state(SessionState::kDone)) done.push_back(s->id);
  for (sched::SessionId id : done) session_done(id);
  table.reap_done();
  control_->host_tick(now);

  for (auto& [id, c] : clients_) {
    if (!c.doomed() && c.role == Role::kEngine && c.rings.attached) publish_status(c, now);
  }
  ring_directive_bells();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  stats_.tick_seconds += took;
  stats_.tick_seconds_max = std::max(stats_.tick_seconds_max, took);
}

void Server::session_done(sched::SessionId id) {
  if (const SessionMeta* m = sessions_.find(id)) {
    // The engine that ran it and its runner forget it (CLOSE): the engine
    // frees what it kept for it, and neither brings it back in a resync.
    const Time now = clock_->now();
    const ipc::Slot close = directive_slot(ipc::Close{}, id, now);
    const sched::Session* s = control_->model().sessions().find(id);
    if (s != nullptr && s->engine != sched::kNoEngine) {
      if (Client* e = find_client(s->engine)) push_directive(*e, close);
    }
    const sched::EngineId told = m->steer.told;
    if (told != sched::kNoEngine && (s == nullptr || told != s->engine)) {
      if (Client* e = find_client(told)) push_directive(*e, close);
    }
    const std::uint32_t owner = m->owner;
    if (const Owner* o = sessions_.owners().find(owner)) {
      if (Client* r = find_client(o->client)) push_directive(*r, close);
    }
    sessions_.erase(id);  // uncharged, its handle's no more, the journal told
    if (const Owner* o = sessions_.owners().find(owner); o != nullptr && o->client == 0 && o->sessions.empty()) {
      forget_owner(*o);
    }
  }
  (void)unplaced_.kill(id);
  effects_->session_gone(id);
}

// ---- where Control's decisions go (ControlOutlet; daemon/control.h) ----------

SessionSteer* Server::steer(sched::SessionId id) {
  SessionMeta* m = sessions_.find(id);
  return m == nullptr ? nullptr : &m->steer;
}

GpuChoice* Server::gpu_choice(sched::EngineId engine) {
  Client* c = find_client(engine);
  return c == nullptr || c->role != Role::kEngine ? nullptr : &c->engine.gpu;
}

void Server::note(Time now, LogKind kind, sched::SessionId session, std::array<std::int64_t, 4> v) {
  log_event(now, kind, session, v);
}

void Server::send_directive(sched::EngineId engine, const ipc::Slot& record) {
  Client* c = find_client(engine);
  if (c == nullptr || c->role != Role::kEngine) return;
  push_directive(*c, record);
}

void Server::push_directive(Client& c, const ipc::Slot& record) {
  if (c.doomed() || !c.rings.attached) return;
  ++stats_.directives;
  if (c.rings.backlog.empty() && c.rings.directives.try_push(record)) {
    c.rings.bell_due = true;  // rung once for all of this tick's directives
    return;
  }
  if (c.rings.backlog.size() >= kBacklogLimit) {
    ++stats_.directives_dropped;
    if (!c.warned.backlog) {
      spdlog::warn("client {} ({}): directive ring and backlog full (is it polling?); dropping directives", c.id,
                   base::escape(c.name));
      c.warned.backlog = true;
    }
    return;
  }
  c.rings.backlog.push_back(record);
}

void Server::flush_backlog(Client& c) {
  bool pushed = false;
  while (!c.rings.backlog.empty() && c.rings.directives.try_push(c.rings.backlog.front())) {
    c.rings.backlog.pop_front();
    pushed = true;
  }
  if (pushed) c.rings.bell_due = true;
}

void Server::ring_directive_bells() {
  for (auto& [id, c] : clients_) {
    if (!c.rings.bell_due || c.doomed()) continue;
    c.rings.directive_bell.notify();
    c.rings.bell_due = false;
  }
}

std::uint32_t Server::wake_watermark(const Client& c) {
  // An eighth of the ring: a client far below it waits at most one tick; one
  // that sends faster wakes the loop about eight times per ring's worth.
  return std::max<std::uint32_t>(1, c.rings.channel.event_slots() / 8);
}

void Server::publish_status(Client& c, Time now) {
  ipc::EngineStatus st;
  st.policy_epoch = control_->epoch();
  st.updated_ns = base::to_ns(now);
  st.sm_partition = c.engine.gpu.sm_partition;
  st.offload_plan = c.engine.gpu.offload_plan;
  st.offload_freed_bytes = c.engine.gpu.offload_freed_bytes;
  if (c.engine.gpu.sm_partition_set) {
    // The index is for the pool the daemon chose it for: an engine that
    // opened another since follows nothing until the next tick chooses.
    const EngineGpu* g = control_->gpu().engine(c.id);
    if (g != nullptr && g->has_pool()) {
      st.flags |= ipc::kStatusSmPartitionSet;
      st.sm_partition_pool = g->pool_id;
    }
  }
  c.rings.status.publish(st);
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
  if (plan.policy) control_->install_policy(std::move(fresh.policy));
  if (plan.tick) {
    // The armed read holds the old timer's file; it fires once more and is
    // re-armed on the new one.
    if (auto retimed = loop_.retime(cfg.tick); !retimed) {
      spdlog::error("{}: new tick timer: {}; keeping the old tick", why, retimed.error().message());
    }
  }
  if (*gpu_telemetry) {
    gpu_telemetry_ = std::move(*gpu_telemetry);  // the old sampler's thread is joined here
  } else if (plan.nvml) {
    gpu_telemetry_->apply(cfg.nvml);
  }
  if (why == "reload") ctl_->file_reloaded();  // the file again, with nothing set on top
  config_ = std::move(fresh.config);
  if (plan.gpu) control_->configure_gpu(config_->config().gpu);
  if (plan.policy) {
    for (auto& [id, c] : clients_) {
      if (!c.doomed() && c.role == Role::kEngine && c.phase == Phase::kActive) send_policy_config(c);
    }
  }
  spdlog::info("{}: {} (policy {}{})", why, config_->config().source, config_->config().policy,
               plan.policy ? ", changed" : "");
  return {};
}

}  // namespace tandem::daemon
