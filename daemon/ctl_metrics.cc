// tandemd's metrics: everything the daemon counts and holds, as Prometheus
// text (docs/metrics.md), for the endpoint and `tandemctl metrics`.
#include <array>
#include <bit>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "daemon/ctl_service.h"
#include "daemon/metrics.h"
#include "daemon/server_parts.h"

namespace tandem::daemon {

using nlohmann::json;

namespace {

// `key` of the JSON object `obj` as a number; 0 when `obj` is not an object
// or has no such number (the host plane's status leaves out what it lacks).
double number_at(const json& obj, const char* key) {
  return obj.is_object() && obj.contains(key) && obj[key].is_number() ? obj[key].get<double>() : 0.0;
}

}  // namespace

std::string CtlService::metrics_text(base::Time now) const {
  PromText p;
  const Config& cfg = view_.config().config();
  const ServerStats& stats = view_.stats();
  p.gauge("tandem_build_info", "tandemd's version and running policy (always 1)", 1,
          {{"version", kVersion}, {"policy", cfg.policy}});
  p.gauge("tandem_uptime_seconds", "seconds since tandemd started", base::to_seconds(now - view_.started()));

  // Clients and sessions.
  std::array<std::uint64_t, kRoleCount> roles{};
  view_.for_each_client([&](const ClientCard& c) {
    if (c.active) ++roles[static_cast<std::size_t>(c.role)];
  });
  for (std::size_t r = 0; r < kRoleCount; ++r) {
    p.gauge("tandem_clients", "connected clients by role", static_cast<double>(roles[r]),
            {{"role", to_string(static_cast<Role>(r))}});
  }
  const sched::NodeModel& model = view_.model();
  const auto& table = model.sessions();
  using sched::SessionState;
  for (auto state : {SessionState::kWaiting, SessionState::kReasoning, SessionState::kActing, SessionState::kPaused}) {
    p.gauge("tandem_sessions", "live sessions by state", static_cast<double>(table.count(state)),
            {{"state", lower(state)}});
  }
  if (auto w = view_.policy().admission_window()) {
    p.gauge("tandem_admission_window", "sessions the policy lets reason at once (MARS's AIMD window)", *w);
  }
  std::uint64_t pinned_sessions = 0;
  for (const auto& [id, sess] : table.sessions()) pinned_sessions += sess.residency == sched::Residency::kPinned;
  p.gauge("tandem_kv_pinned_sessions", "sessions whose KV is pinned while their tool runs",
          static_cast<double>(pinned_sessions));

  // KV by engine, and the GPU plane's view of it.
  const auto projected = GpuPlane::projected_blocks(table);
  for (const auto& [id, v] : model.engines()) {
    const auto c = view_.client(id);
    const std::string name = c ? std::string(c->name) : std::to_string(id);
    const double total = v.has_stats ? v.kv.blocks_total : v.params.total_blocks;
    const char* help = "KV blocks of each engine's pool by state (offloaded: host copies, outside the pool)";
    p.gauge("tandem_kv_blocks", help, total, {{"engine", name}, {"state", "total"}});
    p.gauge("tandem_kv_blocks", help, v.has_stats ? v.kv.blocks_free : total, {{"engine", name}, {"state", "free"}});
    p.gauge("tandem_kv_blocks", help, v.kv.blocks_pinned, {{"engine", name}, {"state", "pinned"}});
    p.gauge("tandem_kv_blocks", help, v.kv.blocks_offloaded, {{"engine", name}, {"state", "offloaded"}});
    p.gauge("tandem_kv_blocks", help, static_cast<double>(v.queued_blocks), {{"engine", name}, {"state", "queued"}});
    const auto demand = projected.find(id);
    p.gauge("tandem_kv_blocks", help, demand == projected.end() ? 0.0 : static_cast<double>(demand->second),
            {{"engine", name}, {"state", "projected"}});
  }
  // The GPU plane, one family at a time (a family's samples must be together).
  struct EngineGpuSample {
    std::string name;
    double total = 0;
    double projected = 0;
    std::optional<ClientCard> client;
    const EngineGpu* gpu = nullptr;
  };
  std::vector<EngineGpuSample> gpu_samples;
  for (const auto& [id, v] : model.engines()) {
    const auto c = view_.client(id);
    const auto demand = projected.find(id);
    gpu_samples.push_back({c ? std::string(c->name) : std::to_string(id),
                           static_cast<double>(v.has_stats ? v.kv.blocks_total : v.params.total_blocks),
                           demand == projected.end() ? 0.0 : static_cast<double>(demand->second), c,
                           view_.gpu_plane().engine(id)});
  }
  for (const auto& e : gpu_samples) {
    if (e.total > 0) {
      p.gauge("tandem_kv_pressure", "projected KV demand of each engine's live sessions over its pool",
              e.projected / e.total, {{"engine", e.name}});
    }
  }
  for (const auto& e : gpu_samples) {
    if (e.client.has_value() && e.client->gpu.sm_partition_set) {
      p.gauge("tandem_sm_partition", "the green-context partition index published to each engine",
              e.client->gpu.sm_partition, {{"engine", e.name}});
    }
  }
  for (const auto& e : gpu_samples) {
    if (e.client.has_value() && e.client->gpu.sm_partition_set && e.gpu != nullptr &&
        e.client->gpu.sm_partition < e.gpu->decode_sms.size()) {
      p.gauge("tandem_sm_partition_decode_sms", "decode SMs of the partition published to each engine",
              e.gpu->decode_sms[e.client->gpu.sm_partition], {{"engine", e.name}});
    }
  }
  for (const auto& e : gpu_samples) {
    if (!e.client.has_value()) continue;
    p.gauge("tandem_offloaded_weight_modules", "weight modules each engine is asked to stream from host memory",
            static_cast<double>(std::popcount(e.client->gpu.offload_plan)), {{"engine", e.name}});
  }
  for (const auto& e : gpu_samples) {
    if (!e.client.has_value()) continue;
    p.gauge("tandem_offload_freed_bytes", "device bytes the offload plan frees for each engine's KV pool",
            static_cast<double>(e.client->gpu.offload_freed_bytes), {{"engine", e.name}});
  }
  static constexpr const char* kKvKinds[] = {"evicted", "restored", "offloaded", "dropped"};
  for (std::size_t k = 0; k < std::size(kKvKinds); ++k) {
    p.counter("tandem_kv_events_total", "KV moves engines reported, by kind", static_cast<double>(stats.kv_events[k]),
              {{"kind", kKvKinds[k]}});
  }
  for (std::size_t k = 0; k < std::size(kKvKinds); ++k) {
    p.counter("tandem_kv_event_blocks_total", "KV blocks those moves concerned, by kind",
              static_cast<double>(stats.kv_event_blocks[k]), {{"kind", kKvKinds[k]}});
  }
  p.counter("tandem_offload_plan_changes_total", "changes of an engine's weight-offload plan",
            static_cast<double>(stats.offload_plan_changes));
  p.counter("tandem_recomputed_tokens_total",
            "prompt tokens a session had computed before that its engine did not serve from cache",
            static_cast<double>(stats.recomputed_tokens));

  // Tools and the host.
  p.counter("tandem_tool_calls_total", "tool calls given a cgroup", static_cast<double>(stats.tools_prepared));
  p.counter("tandem_tool_calls_refused_total", "tool calls refused a cgroup", static_cast<double>(stats.tools_refused));
  json host;
  view_.host().status(host);
  const auto num = [&](const char* key) { return number_at(host, key); };
  p.gauge("tandem_tool_cgroups", "tool calls with a live cgroup", num("tool_cgroups"));
  p.gauge("tandem_tool_memory_bytes", "memory of every tool call's cgroup, at the last host tick",
          num("tools_memory_bytes"));
  p.counter("tandem_tool_cpu_seconds_total", "CPU time of every tool call's cgroup", num("tools_cpu_seconds"));
  p.counter("tandem_tools_killed_total", "tool calls tandemd killed", num("tools_killed"));
  p.counter("tandem_tool_throttles_total", "tool calls throttled under memory pressure", num("throttles"));
  p.counter("tandem_tool_freezes_total", "tool calls frozen under memory pressure", num("freezes"));
  p.counter("tandem_tool_memory_kills_total", "tool calls OOM-killed or killed by the memory rules",
            num("memory_kills"));
  p.gauge("tandem_tool_memory_peak_p95_bytes", "95th percentile of the last 256 ended tool calls' memory peaks",
          num("tool_peak_p95_bytes"));
  // The warm pool of tool-call cgroups.
  const json pool = host.is_object() && host.contains("pool") ? host["pool"] : json();
  const auto pool_num = [&](const char* key) { return number_at(pool, key); };
  p.gauge("tandem_tool_pool_ready", "tool-call cgroups made ahead and ready to hand out", pool_num("ready"));
  p.gauge("tandem_tool_pool_target", "ready tool-call cgroups the sessions' call rates ask for", pool_num("target"));
  p.counter("tandem_tool_pool_hits_total", "tool calls given a ready cgroup from the pool", pool_num("hits"));
  p.counter("tandem_tool_pool_misses_total", "tool calls that made their cgroup (the pool had none ready)",
            pool_num("misses"));
  const double mem_psi = num("memory_psi_some_avg10");
  const double cpu_psi = num("cpu_psi_some_avg10");
  if (host.is_object() && host.contains("memory_psi_some_avg10") && mem_psi >= 0) {
    p.gauge("tandem_pressure_some_avg10", "PSI some avg10 of the node (memory) and of the tools (cpu), percent",
            mem_psi, {{"resource", "memory"}});
  }
  if (host.is_object() && host.contains("cpu_psi_some_avg10") && cpu_psi >= 0) {
    p.gauge("tandem_pressure_some_avg10", "PSI some avg10 of the node (memory) and of the tools (cpu), percent",
            cpu_psi, {{"resource", "cpu"}});
  }

  // GPUs, from NVML.
  gpu_metrics(p, view_.gpu_telemetry().snapshot(), gpu_attribution());

  // The daemon itself.
  p.counter("tandem_control_ticks_total", "control ticks run", static_cast<double>(stats.ticks));
  p.counter("tandem_control_tick_seconds_total", "time spent in control ticks", stats.tick_seconds);
  p.gauge("tandem_control_tick_seconds_max", "the longest control tick since start", stats.tick_seconds_max);
  p.counter("tandem_records_total", "ring records taken from clients, by result",
            static_cast<double>(stats.records_accepted), {{"result", "accepted"}});
  p.counter("tandem_records_total", "ring records taken from clients, by result",
            static_cast<double>(stats.records_rejected), {{"result", "rejected"}});
  p.counter("tandem_directives_total", "directives sent to engines", static_cast<double>(stats.directives));
  p.counter("tandem_directive_ring_overflows_total",
            "directives dropped because an engine's directive ring and backlog were full",
            static_cast<double>(stats.directives_dropped));
  p.counter("tandem_clients_refused_total", "connections refused at the handshake",
            static_cast<double>(stats.clients_refused));
  p.counter("tandem_clients_dropped_total", "clients dropped for misbehaving",
            static_cast<double>(stats.clients_dropped));
  p.counter("tandem_internal_errors_total", "exceptions caught in a handler (bugs), answered as errors",
            static_cast<double>(stats.internal_errors));
  p.counter("tandem_clients_refused_limits_total",
            "connections refused by clients_per_uid, reserved_clients or the ctl cap",
            static_cast<double>(stats.clients_refused_limits));
  p.counter("tandem_resync_refused_total", "resync entries refused", static_cast<double>(stats.resync_refused));
  p.counter("tandem_accept_errors_total", "accept() failures (out of fds or memory)",
            static_cast<double>(stats.accept_errors));
  return p.text();
}

}  // namespace tandem::daemon
