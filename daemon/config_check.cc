// tandemd's configuration checked and compiled: validate() for a Config
// however it was built, describe() for --check-config, compile() into what
// the daemon runs, and reload_plan() for what a running one can change.
#include <sys/types.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <map>
#include <ranges>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "base/text.h"
#include "daemon/config.h"
#include "daemon/config_keys.h"
#include "daemon/kv_events.h"
#include "daemon/metrics.h"

namespace tandem::daemon {

using namespace config_keys;  // NOLINT(google-build-using-namespace): the tables this file checks against

std::string_view to_string(Role role) {
  auto i = static_cast<std::size_t>(role);
  return i < kRoleCount ? kRoleNames[i] : "unknown";
}

base::Result<void> validate(const Config& c) {
  auto fail = [&](std::string_view key, std::string_view problem) {
    return base::make_error(EINVAL, fmt::format("{}: {}: {}", c.source, key, problem));
  };
  if (c.runtime_dir.empty() || c.runtime_dir.front() != '/') {
    return fail("runtime_dir", fmt::format("must be an absolute path, got '{}'", c.runtime_dir));
  }
  if (std::ranges::find(kLogLevels, c.log_level) == std::end(kLogLevels)) {
    return fail("log_level", fmt::format("must be one of {}, got '{}'", join(kLogLevels), c.log_level));
  }

  if (!c.metrics_listen.empty()) {
    if (auto a = parse_listen(c.metrics_listen, c.metrics_allow_remote); !a) {
      return fail("metrics.listen", a.error().message());
    }
  }
  if (c.metrics_engines.size() > MetricsEndpoints::kMaxEngines) {
    return fail("metrics.engines",
                fmt::format("at most {} engines, got {}", MetricsEndpoints::kMaxEngines, c.metrics_engines.size()));
  }
  std::map<std::pair<std::string, std::uint16_t>, std::string> taken;  // (host, port) → who asked for it
  if (auto a = parse_listen(c.metrics_listen, c.metrics_allow_remote); a && a->port != 0) {
    taken[{a->host, a->port}] = "metrics.listen";
  }
  for (const auto& [name, address] : c.metrics_engines) {
    const std::string key = dotted("metrics.engines", base::escape(name, 64));
    if (auto ok = base::check_name(name, "engine name"); !ok) return fail(key, ok.error().message());
    auto a = parse_listen(address, c.metrics_allow_remote);
    if (!a) return fail(key, a.error().message());
    if (a->port == 0) continue;  // any free port: never the same as another
    // 0.0.0.0 and [::] overlap every address of their family: compare ports then.
    const bool wildcard = a->host == "0.0.0.0" || a->host == "::";
    for (const auto& [other, who] : taken) {
      const bool other_wildcard = other.first == "0.0.0.0" || other.first == "::";
      if (other.second == a->port && (other.first == a->host || wildcard || other_wildcard)) {
        return fail(key, fmt::format("\"{}\" overlaps {}: each endpoint needs a port of its own", address, who));
      }
    }
    taken[{a->host, a->port}] = key;
  }

  if (!c.kv_events.endpoint.empty()) {
    if (auto e = check_kv_endpoint(c.kv_events.endpoint); !e) return fail("kv_events.endpoint", e.error().context());
  }
  if (auto t = check_kv_topic(c.kv_events.topic); !t) {
    return fail("kv_events.topic", fmt::format("'{}': {}", c.kv_events.topic, t.error().context()));
  }
  if (c.kv_events.hwm < 1 || c.kv_events.hwm > kMaxKvEventsHwm) {
    return fail("kv_events.hwm", range_problem(1, kMaxKvEventsHwm, c.kv_events.hwm));
  }

  const sched::PolicyEntry* entry = sched::find_policy(c.policy);
  if (entry == nullptr) {
    return fail("policy.name", fmt::format("unknown policy '{}' (known: {})", c.policy, known_policies()));
  }
  for (const auto& [name, value] : c.policy_params) {
    std::string key = dotted("policy.params", name);
    auto spec = std::ranges::find(entry->params, std::string_view(name), &sched::ParamSpec::name);
    if (spec == entry->params.end()) {
      std::string takes = join(entry->params | std::views::transform(&sched::ParamSpec::name));
      return fail(
          key, fmt::format("not a parameter of policy '{}' (it takes: {})", c.policy, takes.empty() ? "none" : takes));
    }
    if (!(value >= spec->min && value <= spec->max)) {
      return fail(key, fmt::format("must be between {} and {}, got {}", spec->min, spec->max, value));
    }
  }

  if (c.tick < std::chrono::milliseconds(kMinTickMs) || c.tick > std::chrono::milliseconds(kMaxTickMs)) {
    return fail("policy.tick_ms", fmt::format("must be between {} and {}, got {}", kMinTickMs, kMaxTickMs,
                                              std::chrono::duration<double, std::milli>(c.tick).count()));
  }
  for (const auto& k : kIpcKeys) {
    std::uint32_t v = c.*(k.field);
    std::string key = dotted("ipc", k.name);
    if (v < k.min || v > k.max) return fail(key, range_problem(k.min, k.max, v));
    if (k.power_of_two && !std::has_single_bit(v)) {
      return fail(key, fmt::format("must be a power of two, got {}", v));
    }
  }
  for (const auto& k : kLimitKeys) {
    std::uint32_t v = c.limits.*(k.field);
    if (v < k.min || v > k.max) return fail(dotted("limits", k.name), range_problem(k.min, k.max, v));
  }

  const HostConfig& h = c.host;
  if (h.root.empty()) {
    if (h.subtree.empty() || h.subtree.front() == '/' || h.subtree.find("..") != std::string::npos) {
      return fail("cgroups.subtree", fmt::format("must be a relative path without '..', got '{}'", h.subtree));
    }
  } else if (h.root.front() != '/' || h.root.find("..") != std::string::npos) {
    return fail("cgroups.root", fmt::format("must be an absolute path without '..', got '{}'", h.root));
  }
  for (const auto& [key, cpus] :
       {std::pair{"cgroups.engine_cpus", &h.engine_cpus}, {"cgroups.tool_cpus", &h.tool_cpus}}) {
    if (cpus->find_first_not_of("0123456789,-") != std::string::npos) {
      return fail(key, fmt::format("must be a cpu list like \"0-3,6\", got '{}'", *cpus));
    }
  }
  if (h.pids_max == 0) return fail("tools.pids_max", "must be at least 1 (0 would forbid the tool itself)");
  if (h.memory_high != 0 && h.memory_max != 0 && h.memory_high > h.memory_max) {
    return fail("tools.memory_high", "must not exceed tools.memory_max");
  }
  if (!(h.pressure_high > 0.0 && h.pressure_high <= 100.0)) {
    return fail("memory.pressure_high", fmt::format("must be a percentage in (0, 100], got {}", h.pressure_high));
  }
  if (!(h.pressure_critical >= h.pressure_high && h.pressure_critical <= 100.0)) {
    return fail("memory.pressure_critical",
                fmt::format("must be between memory.pressure_high and 100, got {}", h.pressure_critical));
  }
  if (h.stall_kill_after < std::chrono::milliseconds(100))
    return fail("memory.stall_kill_after", "must be at least 100ms");
  if (h.pool_idle < std::chrono::seconds(1) || h.pool_idle > std::chrono::hours(24)) {
    return fail("tools.pool_idle", "must be between 1s and 24h");
  }
  if (!h.bubblewrap.empty() && h.bubblewrap.front() != '/') {
    return fail("tools.bubblewrap", fmt::format("must be an absolute path, got '{}'", h.bubblewrap));
  }
  const GpuConfig& gc = c.gpu;
  for (const auto& [key, v, lo, hi] :
       {std::tuple{"gpu.sm_min", gc.sm_min, 1u, 1024u}, std::tuple{"gpu.grow_hold", gc.grow_hold, 1u, 1000u},
        std::tuple{"gpu.hold", gc.hold, 1u, 100000u}}) {
    if (v < lo || v > hi) return fail(key, range_problem(lo, hi, v));
  }
  if (!(gc.alpha >= 0.0 && gc.alpha <= 1024.0)) {
    return fail("gpu.alpha", fmt::format("must be between 0 and 1024 (SMs per pending prefill), got {}", gc.alpha));
  }
  if (!(gc.link_bytes_per_s >= 1e6 && gc.link_bytes_per_s <= 1e13)) {
    return fail("gpu.link_bytes_per_s",
                fmt::format("must be between 1e6 and 1e13 bytes/s, got {}", gc.link_bytes_per_s));
  }
  if (!(gc.offload_pressure > 0.0 && gc.offload_pressure <= 10.0)) {
    return fail("gpu.offload_pressure", fmt::format("must be in (0, 10], got {}", gc.offload_pressure));
  }
  if (!(gc.restore_pressure > 0.0 && gc.restore_pressure < gc.offload_pressure)) {
    return fail("gpu.restore_pressure", fmt::format("must be in (0, gpu.offload_pressure {}), got {}",
                                                    gc.offload_pressure, gc.restore_pressure));
  }
  const NvmlConfig& nv = c.nvml;
  if (std::ranges::find(kNvmlModes, nv.enabled) == std::end(kNvmlModes)) {
    return fail("nvml.enabled", fmt::format("must be one of {}, got '{}'", join(kNvmlModes), nv.enabled));
  }
  if (nv.interval_ms < kMinNvmlIntervalMs || nv.interval_ms > kMaxNvmlIntervalMs) {
    return fail("nvml.interval_ms", range_problem(kMinNvmlIntervalMs, kMaxNvmlIntervalMs, nv.interval_ms));
  }
  if (nv.library.empty() || nv.library.find('\0') != std::string::npos) {
    return fail("nvml.library", "must be a library name or path, got an empty or NUL-containing string");
  }
  for (std::size_t r = 0; r < kRoleCount; ++r) {
    const RoleGrant& g = c.roles[r];
    auto bad = [](std::uint32_t id) { return id > kMaxId; };
    if (std::ranges::any_of(g.uids, bad))
      return fail(fmt::format("roles.{}.uids", kRoleNames[r]), "(uid_t)-1 is not a user");
    if (std::ranges::any_of(g.gids, bad))
      return fail(fmt::format("roles.{}.gids", kRoleNames[r]), "(gid_t)-1 is not a group");
  }
  return {};
}

std::string describe(const Config& c) {
  std::string out;
  out += fmt::format("config       {}\n", c.source);
  out += fmt::format("runtime_dir  {}\n", c.runtime_dir);
  out += fmt::format("log_level    {}\n", c.log_level);
  out +=
      fmt::format("policy       {}, tick {} ms\n", c.policy, std::chrono::duration<double, std::milli>(c.tick).count());
  if (c.policy_params.empty()) {
    out += "params       all defaults\n";
  } else {
    std::string params;
    for (const auto& [k, v] : c.policy_params) params += fmt::format("{}{} = {}", params.empty() ? "" : ", ", k, v);
    out += fmt::format("params       {} (others default)\n", params);
  }
  out += fmt::format("ipc          event_slots {}, directive_slots {}\n", c.event_slots, c.directive_slots);
  out += fmt::format(
      "limits       max_clients {} ({} reserved for engines and runners, {} per uid), sessions_per_client {}, "
      "records_per_s {}, messages_per_s {}, pump_batch {}, ctl_idle_timeout_s {}, tools_per_session {}, "
      "tools_per_client {}\n",
      c.limits.max_clients, c.limits.reserved(), c.limits.clients_per_uid, c.limits.sessions_per_client,
      c.limits.records_per_s, c.limits.messages_per_s, c.limits.pump_batch, c.limits.ctl_idle_timeout_s,
      c.limits.tools_per_session, c.limits.tools_per_client);
  const HostConfig& h = c.host;
  out += fmt::format("cgroups      {}, {}, on restart {} (grace {} s)\n", h.cgroups,
                     h.root.empty() ? fmt::format("subtree {}", h.subtree) : fmt::format("root {}", h.root),
                     h.on_restart, std::chrono::duration<double>(h.adopt_grace).count());
  out += fmt::format(
      "tools        memory_high {}, memory_max {}, pids_max {}, cpu_max_percent {}{}; "
      "pool_max {}, pool_per_session {}, pool_idle {} s, ahead {}\n",
      h.memory_high, h.memory_max, h.pids_max, h.cpu_max_percent,
      h.bubblewrap.empty() ? "" : fmt::format(", bubblewrap {}", h.bubblewrap), h.pool_max, h.pool_per_session,
      std::chrono::duration<double>(h.pool_idle).count(), h.ahead);
  out += fmt::format(
      "memory       pressure_high {} %, pressure_critical {} %, tools_budget {}, stall_kill_after {} s\n",
      h.pressure_high, h.pressure_critical, h.tools_budget, std::chrono::duration<double>(h.stall_kill_after).count());
  out += fmt::format("telemetry    {}\n", h.telemetry);
  out += fmt::format("metrics      {}{}", c.metrics_listen.empty() ? "off" : c.metrics_listen,
                     c.metrics_allow_remote ? " (remote scrapes allowed)" : "");
  for (const auto& [name, address] : c.metrics_engines) out += fmt::format("; engine {} {}", name, address);
  out += '\n';
  const KvEventsConfig& kv = c.kv_events;
  out += kv.endpoint.empty() ? std::string("kv_events    off\n")
                             : fmt::format("kv_events    {} {}, topic '{}', hwm {}\n", kv.connect ? "connect" : "bind",
                                           kv.endpoint, kv.topic, kv.hwm);
  out += fmt::format("nvml         {}, every {} ms, library {}\n", c.nvml.enabled, c.nvml.interval_ms, c.nvml.library);
  const GpuConfig& gpu = c.gpu;
  out += fmt::format(
      "gpu          sm_min {}, alpha {}, grow_hold {}; offload at pressure {}, restore below {} "
      "(hold {} ticks), link {} B/s, allow_slowdown {}\n",
      gpu.sm_min, gpu.alpha, gpu.grow_hold, gpu.offload_pressure, gpu.restore_pressure, gpu.hold, gpu.link_bytes_per_s,
      gpu.allow_slowdown);
  for (std::size_t r = 0; r < kRoleCount; ++r) {
    const RoleGrant& g = c.roles[r];
    std::string who = "root, the daemon's user";
    if (g.anyone) {
      who = "anyone";
    } else {
      if (!g.uids.empty()) who += fmt::format(", uids {}", join(g.uids));
      if (!g.gids.empty()) who += fmt::format(", gids {}", join(g.gids));
    }
    out += fmt::format("role {:<10}{}\n", kRoleNames[r], who);
  }
  return out;
}

base::Result<Compiled> CompiledConfig::compile(Config config) {
  if (auto ok = validate(config); !ok) return base::propagate(std::move(ok.error()));
  auto inst = sched::make_policy(config.policy, config.policy_params);
  if (!inst) return base::propagate(std::move(inst.error()), config.source);
  const sched::PolicyEntry* entry = sched::find_policy(config.policy);
  sched::PolicyParams params = inst->params;
  Compiled out{std::shared_ptr<const CompiledConfig>(new CompiledConfig(std::move(config), std::move(params), entry)),
               std::move(*inst)};
  return out;
}

ReloadPlan reload_plan(const Config& old, const Config& fresh) {
  ReloadPlan plan;
  if (fresh.runtime_dir != old.runtime_dir) plan.refused.emplace_back("runtime_dir");
  if (fresh.event_slots != old.event_slots) plan.refused.emplace_back("ipc.event_slots");
  if (fresh.directive_slots != old.directive_slots) plan.refused.emplace_back("ipc.directive_slots");
  if (!(fresh.host == old.host)) plan.at_restart.emplace_back("[cgroups], [tools], [memory] and [telemetry]");
  if (fresh.metrics_listen != old.metrics_listen || fresh.metrics_allow_remote != old.metrics_allow_remote ||
      fresh.metrics_engines != old.metrics_engines) {
    plan.at_restart.emplace_back("[metrics]");
  }
  if (!(fresh.kv_events == old.kv_events)) plan.at_restart.emplace_back("[kv_events]");
  plan.policy = fresh.policy != old.policy || fresh.policy_params != old.policy_params;
  plan.tick = fresh.tick != old.tick;
  plan.gpu = !(fresh.gpu == old.gpu);
  plan.nvml = !(fresh.nvml == old.nvml);
  return plan;
}

bool CompiledConfig::allowed(Role role, uid_t uid, gid_t gid, uid_t daemon_uid) const {
  if (uid == 0 || uid == daemon_uid) return true;
  auto i = static_cast<std::size_t>(role);
  if (i >= kRoleCount) return false;
  const RoleGrant& g = config_.roles[i];
  return g.anyone || std::ranges::find(g.uids, uid) != g.uids.end() || std::ranges::find(g.gids, gid) != g.gids.end();
}

}  // namespace tandem::daemon
