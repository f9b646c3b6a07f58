// The configuration's key tables and limits, shared by the parser
// (daemon/config.cc), its checks (daemon/config_check.cc) and `tandemctl
// policy set` (set_policy_key): one list of what each table takes.
// Included only by those files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "daemon/config.h"
#include "sched/registry.h"

namespace tandem::daemon::config_keys {

inline constexpr std::string_view kRoleNames[kRoleCount] = {"engine", "runner", "ctl_read", "ctl_admin"};
inline constexpr std::string_view kLogLevels[] = {"trace", "debug", "info", "warn", "error"};

inline constexpr std::int64_t kMinTickMs = 1;
inline constexpr std::int64_t kMaxTickMs = 10'000;
inline constexpr std::size_t kMaxFileBytes = std::size_t{1} << 20;
// (uid_t)-1 means "no id" to chown(2) and friends; it is never a real id.
inline constexpr std::int64_t kMaxId = std::int64_t{std::numeric_limits<std::uint32_t>::max()} - 1;

// A uint32 field, its TOML key and its range.
template <class S>
struct UintKey {
  std::string_view name;
  std::uint32_t S::*field;
  std::int64_t min;
  std::int64_t max;
  bool power_of_two;
};

inline constexpr UintKey<Limits> kLimitKeys[] = {
    {"max_clients", &Limits::max_clients, 1, 65536, false},
    {"sessions_per_client", &Limits::sessions_per_client, 1, 1 << 20, false},
    {"records_per_s", &Limits::records_per_s, 1, 100'000'000, false},
    {"messages_per_s", &Limits::messages_per_s, 1, 1'000'000, false},
    {"pump_batch", &Limits::pump_batch, 1, 65536, false},
    {"clients_per_uid", &Limits::clients_per_uid, 1, 65536, false},
    {"reserved_clients", &Limits::reserved_clients, 0, 65535, false},
    {"ctl_idle_timeout_s", &Limits::ctl_idle_timeout_s, 1, 86400, false},
    {"tools_per_session", &Limits::tools_per_session, 1, 65536, false},
    {"tools_per_client", &Limits::tools_per_client, 1, 1 << 20, false},
};

inline constexpr UintKey<Config> kIpcKeys[] = {
    {"event_slots", &Config::event_slots, 64, 1 << 20, true},
    {"directive_slots", &Config::directive_slots, 64, 1 << 20, true},
};

inline constexpr std::string_view kTopKeys[] = {"runtime_dir", "log_level", "policy", "roles",    "limits",
                                                "ipc",         "cgroups",   "tools",  "memory",   "telemetry",
                                                "metrics",     "gpu",       "nvml",   "kv_events"};
inline constexpr std::string_view kMetricsKeys[] = {"listen", "allow_remote", "engines"};
inline constexpr std::string_view kKvEventsKeys[] = {"endpoint", "connect", "topic", "hwm"};
inline constexpr std::int64_t kMaxKvEventsHwm = 100'000;
inline constexpr std::string_view kCgroupKeys[] = {"mode",        "subtree",     "root",     "on_restart",
                                                   "adopt_grace", "engine_cpus", "tool_cpus"};
inline constexpr std::string_view kToolKeys[] = {
    "memory_high",     "memory_max", "pids_max",         "cpu_max_percent", "bubblewrap",
    "bubblewrap_args", "pool_max",   "pool_per_session", "pool_idle",       "ahead"};
inline constexpr std::int64_t kMaxPool = 4096;           // tools.pool_max: empty cgroups tandemd keeps ready
inline constexpr std::int64_t kMaxPoolPerSession = 256;  // tools.pool_per_session
inline constexpr std::string_view kMemoryKeys[] = {"pressure_high", "pressure_critical", "tools_budget",
                                                   "stall_kill_after", "protect_low"};
inline constexpr std::string_view kTelemetryKeys[] = {"mode"};
inline constexpr std::string_view kNvmlKeys[] = {"enabled", "interval_ms", "library"};
inline constexpr std::string_view kNvmlModes[] = {"auto", "on", "off"};
inline constexpr std::int64_t kMinNvmlIntervalMs = 100;
inline constexpr std::int64_t kMaxNvmlIntervalMs = 60'000;
inline constexpr std::string_view kGpuKeys[] = {
    "sm_min",           "alpha", "grow_hold",     "link_bytes_per_s", "offload_pressure",
    "restore_pressure", "hold",  "allow_slowdown"};
inline constexpr std::string_view kCgroupModes[] = {"auto", "on", "off"};
inline constexpr std::string_view kRestartModes[] = {"adopt", "reap"};
inline constexpr std::string_view kTelemetryModes[] = {"auto", "ebpf", "sampling"};
inline constexpr std::string_view kPolicyKeys[] = {"name", "tick_ms", "params"};
inline constexpr std::string_view kGrantKeys[] = {"uids", "gids", "anyone"};

template <class Range>
inline std::string join(const Range& names) {
  std::string out;
  for (const auto& n : names) out += fmt::format("{}{}", out.empty() ? "" : ", ", n);
  return out;
}

template <class S, std::size_t N>
inline std::string join_keys(const UintKey<S> (&keys)[N]) {
  std::string out;
  for (const auto& k : keys) out += fmt::format("{}{}", out.empty() ? "" : ", ", k.name);
  return out;
}

inline std::string known_policies() {
  std::string out;
  for (const sched::PolicyEntry& e : sched::policy_registry()) {
    out += fmt::format("{}{}", out.empty() ? "" : ", ", e.name);
  }
  return out;
}

inline std::string dotted(std::string_view parent, std::string_view key) {
  return parent.empty() ? std::string(key) : fmt::format("{}.{}", parent, key);
}

inline std::string range_problem(std::int64_t min, std::int64_t max, std::int64_t got) {
  return fmt::format("must be between {} and {}, got {}", min, max, got);
}

}  // namespace tandem::daemon::config_keys
