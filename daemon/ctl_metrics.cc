// tandemd's metrics: everything the daemon counts and holds, as Prometheus
// text (docs/metrics.md), for the endpoint and `tandemctl metrics`.
#include <array>
#include <bit>
#include <chrono>
#include <map>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/text.h"
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

// tandem_pressure_some_avg10 from the host plane's status (what it lacks is left out).
void pressure_families(PromText& p, const json& host) {
  for (const char* resource : {"memory", "cpu"}) {
    const std::string key = fmt::format("{}_psi_some_avg10", resource);
    if (host.is_object() && host.contains(key) && number_at(host, key.c_str()) >= 0) {
      p.gauge("tandem_pressure_some_avg10", "PSI some avg10 of the node (memory) and of the tools (cpu), percent",
              number_at(host, key.c_str()), {{"resource", resource}});
    }
  }
}

// Horizons of tandem_acting_expected_returns, seconds.
constexpr std::array<int, 3> kReturnHorizons = {1, 10, 60};

}  // namespace

struct CtlService::EngineLoad {
  double running = 0;  // the engines' running sequences
  double waiting = 0;  // their waiting sequences, and rounds tandemd holds for them
  double blocks_total = 0;
  double blocks_free = 0;
  double blocks_pinned = 0;
  double blocks_offloaded = 0;
  double prompt_tokens = 0;                                // prefix-cache queries
  double cached_tokens = 0;                                // ... and hits
  double acting = 0;                                       // sessions whose latest round ran here, in a tool now
  std::array<double, kReturnHorizons.size()> returning{};  // expected back within each horizon

  double usage() const { return blocks_total > 0 ? 1.0 - blocks_free / blocks_total : 0.0; }
};

std::map<std::string, CtlService::EngineLoad, std::less<>> CtlService::engine_loads(base::Time now) const {
  const sched::NodeModel& model = view_.model();
  std::map<sched::EngineId, EngineLoad*> by_id;
  std::map<std::string, EngineLoad, std::less<>> out;
  for (const auto& [id, v] : model.engines()) {
    const auto c = view_.client(id);
    EngineLoad& l = out[c ? std::string(c->name) : std::to_string(id)];
    by_id[id] = &l;
    l.running += v.kv.running_seqs;
    l.waiting += v.kv.waiting_seqs;
    const double total = v.has_stats ? v.kv.blocks_total : v.params.total_blocks;
    l.blocks_total += total;
    l.blocks_free += v.has_stats ? v.kv.blocks_free : total;
    l.blocks_pinned += v.kv.blocks_pinned;
    l.blocks_offloaded += v.kv.blocks_offloaded;
    l.prompt_tokens += static_cast<double>(v.prompt_tokens_total);
    l.cached_tokens += static_cast<double>(v.cached_tokens_total);
  }
  using sched::SessionState;
  for (const sched::Session* sp : model.sessions().by_id()) {
    const sched::Session& s = *sp;
    auto it = by_id.find(s.engine);
    if (it == by_id.end()) continue;
    EngineLoad& l = *it->second;
    // A round the policy holds (not admitted, or paused) waits as surely as
    // one in the engine's queue; the engine does not count it.
    if (s.round_in_flight && (s.state == SessionState::kWaiting || s.state == SessionState::kPaused)) ++l.waiting;
    if (s.state == SessionState::kActing) {
      ++l.acting;
      const base::Duration elapsed = now > s.tool_started ? now - s.tool_started : base::Duration::zero();
      for (std::size_t h = 0; h < kReturnHorizons.size(); ++h) {
        l.returning[h] += model.tools().p_return_within(s.tool, elapsed, std::chrono::seconds(kReturnHorizons[h]));
      }
    }
  }
  return out;
}

void CtlService::engine_families(PromText& p, const std::map<std::string, EngineLoad, std::less<>>& loads) const {
  // vLLM's names (the model-server protocol a cluster router scrapes,
  // docs/metrics.md "Per engine"), one family at a time.
  for (const auto& [name, l] : loads) {
    p.gauge("vllm:num_requests_running", "requests in the engine's running batch", l.running, {{"model_name", name}});
  }
  for (const auto& [name, l] : loads) {
    p.gauge("vllm:num_requests_waiting", "requests waiting: in the engine's queue or held by tandemd's policy",
            l.waiting, {{"model_name", name}});
  }
  for (const auto& [name, l] : loads) {
    p.gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = 100 percent", l.usage(), {{"model_name", name}});
  }
  for (const auto& [name, l] : loads) {
    p.gauge("vllm:gpu_cache_usage_perc", "KV-cache usage, 1 = 100 percent (the name before vLLM 0.10)", l.usage(),
            {{"model_name", name}});
  }
  for (const auto& [name, l] : loads) {
    p.counter("vllm:prefix_cache_queries_total", "prompt tokens looked up in the prefix cache", l.prompt_tokens,
              {{"model_name", name}});
  }
  for (const auto& [name, l] : loads) {
    p.counter("vllm:prefix_cache_hits_total", "prompt tokens served from the prefix cache", l.cached_tokens,
              {{"model_name", name}});
  }
  // No LoRA adapters: the info metric says so, stamped with the wall clock
  // as vLLM stamps it (a router takes the newest sample).
  const double wall = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const auto& [name, l] : loads) {
    p.gauge("vllm:lora_requests_info", "running and waiting LoRA adapters (none), at the wall-clock time", wall,
            {{"model_name", name}, {"max_lora", "0"}, {"running_lora_adapters", ""}, {"waiting_lora_adapters", ""}});
  }
  // What only tandem knows: sessions in a tool call that will come back here.
  for (const auto& [name, l] : loads) {
    p.gauge("tandem_acting_sessions", "sessions in a tool call whose latest round ran on each engine", l.acting,
            {{"engine", name}});
  }
  for (const auto& [name, l] : loads) {
    for (std::size_t h = 0; h < kReturnHorizons.size(); ++h) {
      const std::string within = std::to_string(kReturnHorizons[h]);
      p.gauge("tandem_acting_expected_returns",
              "sessions in a tool call expected back on each engine within `within` seconds (the tool-time model)",
              l.returning[h], {{"engine", name}, {"within", within}});
    }
  }
}

base::Result<std::string> CtlService::engine_metrics_text(std::string_view name, base::Time now) const {
  auto loads = engine_loads(now);
  auto it = loads.find(name);
  if (it == loads.end()) {
    return base::make_error(EAGAIN, fmt::format("no engine named \"{}\" is connected", base::escape(name, 64)));
  }
  std::map<std::string, EngineLoad, std::less<>> one;
  one.insert(loads.extract(it));
  PromText p;
  engine_families(p, one);
  const EngineLoad& l = one.begin()->second;
  const std::string engine(name);
  const char* help = "KV blocks of each engine's pool by state (offloaded: host copies, outside the pool)";
  p.gauge("tandem_kv_blocks", help, l.blocks_total, {{"engine", engine}, {"state", "total"}});
  p.gauge("tandem_kv_blocks", help, l.blocks_free, {{"engine", engine}, {"state", "free"}});
  p.gauge("tandem_kv_blocks", help, l.blocks_pinned, {{"engine", engine}, {"state", "pinned"}});
  p.gauge("tandem_kv_blocks", help, l.blocks_offloaded, {{"engine", engine}, {"state", "offloaded"}});
  host_pressure(p);
  return p.text();
}

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
  for (const sched::Session* sess : table.by_id()) pinned_sessions += sess->residency == sched::Residency::kPinned;
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
  // Per engine, under vLLM's names as well (docs/metrics.md "Per engine").
  engine_families(p, engine_loads(now));
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
  // KV events for routers ([kv_events], docs/daemon.md).
  p.gauge("tandem_kv_events_publishing", "1 while the KV-event socket is open, 0 when it is off or failed",
          view_.kv_events_state().starts_with("off") ? 0.0 : 1.0);
  p.counter("tandem_kv_events_published_total", "vLLM-format KV events published to routers",
            static_cast<double>(stats.kv_events_published));
  p.counter("tandem_kv_events_dropped_total",
            "KV events not published: the socket's queue was full, or there is no socket",
            static_cast<double>(stats.kv_events_dropped));
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
  p.counter("tandem_tool_memory_stalled_seconds_total",
            "time tool calls waited at their memory limit (cgroup v1 under_oom), summed over calls",
            num("tools_memory_stalled_seconds"));
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
  const json ahead = host.is_object() && host.contains("ahead") ? host["ahead"] : json();
  p.gauge("tandem_tool_ahead_held", "placements ahead: sessions holding their next call's cgroup",
          number_at(ahead, "held"));
  p.counter("tandem_tool_ahead_prepared_total", "tool-call cgroups handed out ahead of their call",
            number_at(ahead, "prepared"));
  pressure_families(p, host);

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
  p.counter("tandem_records_total", "ring records taken from clients, by result",
            static_cast<double>(stats.records_late), {{"result", "late"}});
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

void CtlService::host_pressure(PromText& p) const {
  json host;
  view_.host().status(host);
  pressure_families(p, host);
}

}  // namespace tandem::daemon
