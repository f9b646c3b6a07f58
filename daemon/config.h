// tandemd's configuration (docs/architecture.md "Processes"): /etc/tandem/tandemd.toml parsed
// into plain structs, validated, then compiled into an immutable object the
// daemon loop holds by shared_ptr.
//
// Parsing is pure apart from resolving user and group names (getpwnam_r /
// getgrnam_r): parse_config() takes the text and a source name, and every
// error says where ("<source>: <dotted.key>: <problem>", EINVAL). Unknown keys
// and tables are errors so a typo cannot silently leave a default in force.
// Keys a file leaves out keep their defaults. Reading the file is separate
// (load_config). Nothing here throws: toml++ parse errors are caught and
// turned into base::Error.
//
// A reload builds a whole new CompiledConfig and swaps the pointer only when
// that succeeded, so a bad file changes nothing (docs/architecture.md "Trust model").
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/result.h"
#include "sched/registry.h"

namespace tandem::daemon {

// What a connecting peer asks to be. Indexes Config::roles.
enum class Role : std::uint8_t { kEngine, kRunner, kCtlRead, kCtlAdmin };
inline constexpr std::size_t kRoleCount = 4;

// "engine", "runner", "ctl_read", "ctl_admin" (also the TOML table names).
std::string_view to_string(Role role);

// Who may take a role besides root and the daemon's own user.
// Thread-safety: a value type.
struct RoleGrant {
  bool anyone = false;
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;
};

// Per-client limits. Thread-safety: a value type.
struct Limits {
  std::uint32_t max_clients = 256;           // 1..65536
  std::uint32_t sessions_per_client = 4096;  // 1..1<<20
  std::uint32_t records_per_s = 200000;      // per client, token bucket, 1..1e8
  std::uint32_t messages_per_s = 500;        // socket messages per client per second, 1..1e6
  std::uint32_t pump_batch = 256;            // records drained per client per pump round, 1..65536
  // Connections (and runner handles holding sessions while disconnected)
  // of one uid at once, 1..65536; root and tandemd's own uid are exempt.
  std::uint32_t clients_per_uid = 64;
  // Of max_clients, the slots only peers granted engine or runner may take:
  // ctl clients and connections of other uids stop short of them. 0..65535;
  // at most a quarter of max_clients is reserved (reserved()).
  std::uint32_t reserved_clients = 64;
  std::uint32_t ctl_idle_timeout_s = 60;  // a ctl connection with no request this long is closed, 1..86400
  std::uint32_t tools_per_session = 256;  // tool cgroups of one session at once, 1..65536
  std::uint32_t tools_per_client = 1024;  // tool cgroups of the sessions one runner owns, 1..1<<20

  // The slots reserved for engines and runners: reserved_clients, at most a
  // quarter of max_clients (so readers always have three quarters).
  std::uint32_t reserved() const { return std::min(reserved_clients, max_clients / 4); }
};

// The host plane (issue 6, docs/host.md): cgroups, tool limits, memory
// pressure handling and telemetry. Thread-safety: a value type.
struct HostConfig {
  // [cgroups]
  std::string cgroups = "auto";      // auto (on if it can be set up, else off with a warning) | on (required) | off
  std::string subtree = "tandem";    // beneath tandemd's own cgroup in each hierarchy
  std::string root;                  // instead: an absolute path within every hierarchy
  std::string on_restart = "adopt";  // adopt | reap: tool cgroups found at start
  base::Duration adopt_grace = std::chrono::seconds(30);  // adopt: how long a runner has to claim its session
  std::string engine_cpus;                                // cpuset of engines/ ("" = all)
  std::string tool_cpus;                                  // cpuset of tools/ ("" = all)
  // [tools]: defaults of every tool call (0 = none); a runner's limits may only be tighter
  std::uint64_t memory_high = 0;
  std::uint64_t memory_max = 0;
  std::uint64_t pids_max = 4096;
  std::uint32_t cpu_max_percent = 0;  // of one core, per tool call
  std::string bubblewrap;             // path of bwrap: wrap every tool ("" = don't)
  std::vector<std::string> bubblewrap_args;
  // [tools] the warm pool of per-call cgroups (docs/host.md "The warm pool")
  std::uint32_t pool_max = 64;         // ready cgroups over every session (0 = no pool: each call makes its own)
  std::uint32_t pool_per_session = 8;  // ready cgroups one session may have at most
  base::Duration pool_idle = std::chrono::seconds(30);  // a session without a tool call this long keeps none ready
  bool ahead = true;  // runners may ask for a session's next call's cgroup early (ToolPrepare.ahead)
  // [memory]: degrade before killing
  double pressure_high = 10.0;      // node memory PSI some avg10 (%) from which tools are throttled
  double pressure_critical = 40.0;  // ... from which low-priority tools are frozen
  std::uint64_t tools_budget = 0;   // bytes all tools may use (0 = no budget); 90 % counts as high, 100 % critical
  base::Duration stall_kill_after = std::chrono::seconds(10);  // a tool stalled at its limit this long is killed
  std::uint64_t protect_low = 0;                               // memory.low of the tools of protected sessions (v2)
  // [telemetry]
  std::string telemetry = "auto";  // auto (eBPF if it works) | ebpf (required) | sampling

  friend bool operator==(const HostConfig&, const HostConfig&) = default;
};

// The GPU plane (issue 9, docs/daemon.md "GPU plane"): Nova's SM partition
// choice and weight-offload policy, per engine. Thread-safety: a value type.
struct GpuConfig {
  // [gpu] SM partitioning: SM_dec = max(sm_min, SM_op − alpha·(N_pend − 1))
  std::uint32_t sm_min = 16;    // decode floor, SMs (1..1024; clamped to the device's SMs)
  double alpha = 8.0;           // SMs moved to prefill per extra pending prefill (0..1024)
  std::uint32_t grow_hold = 2;  // ticks a move to more decode SMs must be wanted (1..1000)
  // [gpu] weight offload (sched/weight_offload.h)
  double link_bytes_per_s = 25e9;  // host→device bandwidth, bytes/s (PCIe 4.0 x16 practical)
  double offload_pressure = 1.0;   // projected KV / pool at which modules are offloaded
  double restore_pressure = 0.8;   // ... below which, without their blocks, they are restored
  std::uint32_t hold = 10;         // ticks a restore must be wanted; ticks a change settles (1..100000)
  bool allow_slowdown = false;     // offload modules whose copies the link cannot hide

  friend bool operator==(const GpuConfig&, const GpuConfig&) = default;
};

// [nvml]: GPU telemetry from the driver's NVML (docs/nvml.md), sampled on a
// thread of its own. Thread-safety: a value type.
struct NvmlConfig {
  std::string enabled = "auto";               // auto (sample if NVML loads, else say so) | on (required) | off
  std::uint32_t interval_ms = 1000;           // 100 .. 60000 (NVML's utilisation period is 1/6 .. 1 s)
  std::string library = "libnvidia-ml.so.1";  // a name the dynamic loader finds, or a path

  friend bool operator==(const NvmlConfig&, const NvmlConfig&) = default;
};

// [kv_events]: the block hashes engines report, published over ZMQ in vLLM's
// KV event format for routers (daemon/kv_events.h, docs/daemon.md "KV events
// for routers"). Thread-safety: a value type.
struct KvEventsConfig {
  std::string endpoint;      // tcp://HOST:PORT or ipc:///PATH; "" = off
  bool connect = false;      // connect to the endpoint instead of binding it
  std::string topic;         // every message's topic; "{engine}" = the engine's name
  std::uint32_t hwm = 1000;  // messages queued per subscriber before batches drop, 1..100000

  friend bool operator==(const KvEventsConfig&, const KvEventsConfig&) = default;
};

// The parsed file: plain data, defaults in the initializers.
// Thread-safety: a value type.
struct Config {
  std::string runtime_dir = "/run/tandem";              // absolute path
  std::string log_level = "info";                       // trace|debug|info|warn|error
  std::string policy = "tandem";                        // a name in sched::policy_registry()
  std::map<std::string, double> policy_params;          // validated against the registry
  base::Duration tick = std::chrono::milliseconds(50);  // control tick, 1 ms .. 10 s
  std::uint32_t event_slots = 4096;                     // power of two, 64..1<<20
  std::uint32_t directive_slots = 1024;                 // power of two, 64..1<<20
  std::array<RoleGrant, kRoleCount> roles = {           // indexed by Role: ctl_read is open to anyone
      RoleGrant{}, RoleGrant{}, RoleGrant{.anyone = true, .uids = {}, .gids = {}}, RoleGrant{}};
  Limits limits;
  HostConfig host;
  NvmlConfig nvml;
  GpuConfig gpu;
  // [metrics] listen: Prometheus text on this loopback HOST:PORT
  // (docs/metrics.md); "" turns the endpoint off (tandemctl metrics stays).
  std::string metrics_listen = "127.0.0.1:9464";
  // [metrics] allow_remote: listen and the engines' addresses may be any
  // address, not only loopback (docs/cluster.md: a router on another host).
  bool metrics_allow_remote = false;
  // [metrics.engines]: engine name → HOST:PORT of a scrape endpoint of its
  // own, in vLLM's metric names (docs/metrics.md "Per engine").
  std::map<std::string, std::string> metrics_engines;
  KvEventsConfig kv_events;
  std::string source = "<defaults>";  // where it came from: "<defaults>" or a path

  RoleGrant& role(Role r) { return roles[static_cast<std::size_t>(r)]; }
  const RoleGrant& role(Role r) const { return roles[static_cast<std::size_t>(r)]; }
};

// Parses and validates TOML text. `source` names it in every error:
// "tandemd.toml: limits.max_clients: must be between 1 and 65536, got 0".
// Errors (all EINVAL): TOML syntax (with line and column), unknown key or
// table, wrong type (naming the expected one), a value out of range, an
// unknown policy (listing the known ones), an unknown or out-of-range policy
// parameter, an unknown user or group name.
base::Result<Config> parse_config(std::string_view text, std::string_view source);

// Reads `path` (errors carry the path and errno: ENOENT, EACCES, EISDIR, EFBIG
// for a file over 1 MiB), then parse_config(text, path).
base::Result<Config> load_config(const std::string& path);

// Checks a Config however it was built (parse_config already did this):
// ranges, runtime_dir absolute, log level, policy and its parameters.
base::Result<void> validate(const Config& config);

// A short multi-line human summary: what `tandemd --check-config` prints.
std::string describe(const Config& config);

// The compiled, immutable form the daemon runs with: the config plus the
// policy parameters validated by the registry (defaults filled in).
// Thread-safety: immutable after compile(); share it freely.
class CompiledConfig;

// What compile() makes: the immutable config, and the policy it names built
// from it — the instance the daemon runs, never built a second time. The
// policy is handed over once (Server::create, a reload or `tandemctl policy
// set` that changes it); a Compiled whose policy was taken has none.
// Thread-safety: a value type (move-only).
struct Compiled {
  std::shared_ptr<const CompiledConfig> config;
  sched::PolicyInstance policy;
};

class CompiledConfig {
 public:
  // Validates `config` and builds its policy: the runtime objects a
  // daemon starts or reloads with.
  static base::Result<Compiled> compile(Config config);

  const Config& config() const { return config_; }
  const sched::PolicyParams& params() const { return params_; }
  // The registry entry of config().policy (static storage).
  const sched::PolicyEntry& policy() const { return *policy_; }

  // Whether a peer whose SO_PEERCRED credentials are uid/gid may take
  // `role`. Root and the daemon's own user (`daemon_uid`, geteuid() in the
  // daemon) always may; otherwise the grant's anyone, uids or gids decide.
  // Only the peer's primary gid is known (SO_PEERCRED carries no
  // supplementary groups).
  bool allowed(Role role, uid_t uid, gid_t gid, uid_t daemon_uid) const;

 private:
  CompiledConfig(Config config, sched::PolicyParams params, const sched::PolicyEntry* policy)
      : config_(std::move(config)), params_(std::move(params)), policy_(policy) {}

  Config config_;
  sched::PolicyParams params_;
  const sched::PolicyEntry* policy_;
};

// What making `fresh` the running configuration in place of `old` takes
// (reload, `tandemctl policy set`): the one place that knows which keys a
// running daemon can change.
// Thread-safety: a value type.
struct ReloadPlan {
  // Keys that differ and locate things that already exist (the runtime
  // dir, the rings' sizes): the change is refused whole.
  std::vector<std::string> refused;
  // Tables that differ and are read only at start-up: the change goes on,
  // and these take effect at the next restart (logged).
  std::vector<std::string> at_restart;
  bool policy = false;  // the policy's name or a parameter: a new instance, engines told
  bool tick = false;    // the control tick: a new timer
  bool gpu = false;     // [gpu]: the GPU plane reconfigured
  bool nvml = false;    // [nvml]: the sampler reconfigured or restarted
};
ReloadPlan reload_plan(const Config& old, const Config& fresh);

// `tandemctl policy set KEY VALUE` on a copy of the running config: KEY is
// one of [policy]'s keys (`name`, `tick_ms`) or else a parameter name
// ([policy.params]), and VALUE goes through the same parser tables as the
// file's text: a name is a string, tick_ms an integer, a parameter a number
// or true/false. Errors (EINVAL) name the key as the file's would
// ("policy.tick_ms: ..."); `config` is then unchanged. A new policy name
// drops the old policy's parameters. Ranges, and whether the policy knows
// the parameter, are compile()'s to check.
base::Result<void> set_policy_key(Config& config, std::string_view key, std::string_view value);

}  // namespace tandem::daemon
