// Server: tandemd's core — the io_uring loop, the client registry, the ring
// pump, the control tick and the ctl server (DESIGN.md §3, §7, §8).
//
// One thread owns everything here. Inputs arrive as io_uring completions
// (daemon/uring.h): the signalfd (SIGTERM/SIGINT stop, SIGHUP reloads), a
// timerfd for the control tick (which also drives the watchdog, handshake
// timeouts and a safety-net pump), accept on the listening socket, and per
// client a POLLIN on its socket, a POLLIN on its pidfd and a read of its
// event-ring doorbell.
//
// A connection's life: accept → Hello (first message, checked against the
// config's roles with SO_PEERCRED) → Welcome with the segment and two
// doorbells (engines and runners; ctl clients get a Welcome without fds) →
// PolicyConfig (engines) → records on the event ring, messages on the socket
// → gone (socket EOF, pidfd, a protocol violation, or a hostile segment). A
// client that goes takes its state with it within one loop iteration: a
// runner's sessions close, an engine's leave its KV accounting.
//
// Trust: everything from a client is validated before use (ipc/ verifies
// messages and records); on top of that the server checks that a client acts
// only on its own sessions, and enforces the per-client limits of the config.
// A bad record is counted and skipped; a client whose ring is corrupt, or
// that keeps sending bad records, is dropped and logged once. Nothing a client
// sends can disturb another client.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/clock.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "daemon/config.h"
#include "daemon/effects.h"
#include "daemon/gpu_plane.h"
#include "daemon/gpu_telemetry.h"
#include "daemon/metrics.h"
#include "daemon/uring.h"
#include "ipc/channel.h"
#include "ipc/messages.h"
#include "ipc/records.h"
#include "sched/model.h"
#include "sched/registry.h"

namespace tandem::daemon {

// Lifecycle notifications for the service manager (sd_notify in tandemd;
// nothing in tests). Thread-safety: called from the loop thread.
class Notifier {
 public:
  virtual ~Notifier() = default;
  virtual void ready() {}
  virtual void reloading() {}
  virtual void stopping() {}
  virtual void watchdog() {}
  virtual void status(const std::string& /*text*/) {}
  // The service manager's watchdog interval (0: none); watchdog() is then
  // called at half of it.
  virtual std::uint64_t watchdog_usec() const { return 0; }
};

// Loads and compiles the config again (SIGHUP). main() binds it to the file.
using ConfigLoader = std::function<base::Result<std::shared_ptr<const CompiledConfig>>()>;

// Allows `rate` events per second with bursts of one second's worth.
// Thread-safety: a value type.
class TokenBucket {
 public:
  TokenBucket() = default;
  TokenBucket(double rate, base::Time now) : rate_(rate), tokens_(rate), last_(now) {}
  // Tokens available now (whole ones), after refilling.
  std::uint64_t available(base::Time now);
  void take(std::uint64_t n) { tokens_ -= static_cast<double>(n); }

 private:
  double rate_ = 0.0;
  double tokens_ = 0.0;
  base::Time last_{};
};

struct ServerStats {
  std::uint64_t records_accepted = 0;
  std::uint64_t records_rejected = 0;  // failed validation, authorization or the session table
  std::uint64_t messages = 0;
  std::uint64_t ticks = 0;
  std::uint64_t actions = 0;
  std::uint64_t directives = 0;
  std::uint64_t directives_dropped = 0;  // a client's directive backlog was full
  std::uint64_t clients_accepted = 0;
  std::uint64_t clients_refused = 0;  // handshake failed
  std::uint64_t clients_dropped = 0;  // removed for misbehaving
  std::uint64_t effects_cpu_weight = 0;
  std::uint64_t effects_cpu_quota = 0;
  std::uint64_t effects_kill_tools = 0;
  std::uint64_t effects_sm_partition = 0;
  std::uint64_t offload_plan_changes = 0;  // the GPU plane changed an engine's weight-offload plan
  std::uint64_t resyncs = 0;               // Resync messages taken
  std::uint64_t tools_prepared = 0;        // ToolPrepare answered with a cgroup
  std::uint64_t tools_refused = 0;         // ToolPrepare answered with an error
  // KV_EVENT records by ipc::KvEventKind − 1 (evicted, restored, offloaded,
  // dropped) and the blocks they moved.
  std::array<std::uint64_t, 4> kv_events{};
  std::array<std::uint64_t, 4> kv_event_blocks{};
  std::uint64_t recomputed_tokens = 0;  // prompt tokens a session had computed before and the engine did not hit
  double tick_seconds = 0;              // Σ control tick durations
  double tick_seconds_max = 0;
};

// Thread-safety: one thread.
class Server {
 public:
  // Binds <runtime_dir>/tandemd.sock (creating the directory; refusing if
  // another tandemd holds <runtime_dir>/tandemd.lock), sets up the signalfd
  // (SIGTERM, SIGINT, SIGHUP must already be blocked in every thread) and
  // the tick timer, and builds the policy.
  static base::Result<std::unique_ptr<Server>> create(std::shared_ptr<const CompiledConfig> config,
                                                      HostEffects& effects, Notifier& notifier, ConfigLoader reload);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves until SIGTERM or SIGINT (or stop()). Errors only if the loop
  // itself breaks.
  base::Result<void> run();
  void stop() { stopping_ = true; }
  // One iteration of run()'s loop: waits up to `timeout` (not at all while
  // a ring has records) for completions, handles them, pumps and sweeps.
  // Tests drive an in-process daemon with it.
  base::Result<void> run_once(base::Duration timeout);
  // A connection whose peer has credentials `cred`: what accept does with
  // each new socket (after SO_PEERCRED), and how in-process tests connect
  // (a socketpair end, any credentials). A connection over a limit is
  // answered with an Error and closed.
  void add_connection(base::UniqueFd sock, const ucred& cred);

  const ServerStats& stats() const { return stats_; }
  const std::string& socket_path() const { return socket_path_; }

 private:
  enum class Phase : std::uint8_t { kHello, kActive };

  struct Client {
    std::uint32_t id = 0;
    Phase phase = Phase::kHello;
    Role role = Role::kCtlRead;
    std::string name;
    pid_t pid = 0;
    uid_t uid = 0;
    gid_t gid = 0;
    base::UniqueFd sock;
    base::UniqueFd pidfd;
    base::Time connected_at{};
    bool has_channel = false;
    ipc::Channel channel;
    ipc::RingConsumer events;
    ipc::RingProducer directives;
    ipc::StatusWriter<ipc::EngineStatus> status;
    ipc::Doorbell event_bell;
    ipc::Doorbell directive_bell;
    ipc::RecordDecoder decoder{ipc::Direction::kToDaemon};
    std::deque<ipc::Slot> backlog;  // directives that did not fit in the ring
    std::uint64_t bell_buf = 0;     // target of the doorbell read
    bool bell_armed = false;        // a doorbell read is outstanding
    bool sock_armed = false;        // a POLLIN on the socket is outstanding
    bool pidfd_armed = false;       // a POLLIN on the pidfd is outstanding
    bool pending = false;           // the pump should look at its ring
    bool bell_due = false;          // directives pushed since its doorbell was last rung
    bool doomed = false;            // to be removed by sweep()
    bool misbehaved = false;        // removed for breaking the protocol or the limits
    std::string doom_reason;
    std::unordered_map<sched::SessionId, std::string> pending_names;  // names before their session
    TokenBucket record_budget;
    TokenBucket message_budget;
    sched::EngineParams engine;  // engines
    std::int32_t gpu_index = -1;
    std::uint32_t saturating_tokens = 0;
    std::uint32_t sessions = 0;  // sessions it owns (runner) or opened by submitting (engine)
    std::uint64_t accepted = 0;
    std::uint64_t rejected = 0;
    std::uint64_t rejected_this_round = 0;
    bool warned = false;           // logged its first bad record
    bool limit_warned = false;     // logged hitting its session limit
    bool throttle_logged = false;  // logged hitting its message rate
    bool backlog_warned = false;   // logged dropping directives
    std::uint32_t sm_partition = 0;
    bool sm_partition_set = false;
    std::uint64_t offload_plan = 0;         // the GPU plane's weight-offload plan (bit i: module i)
    std::uint64_t offload_freed_bytes = 0;  // device bytes that plan frees
  };

  struct SessionMeta {
    std::string name;
    std::uint32_t owner = 0;    // runner client id that opened it (0: none)
    std::uint32_t creator = 0;  // client charged for it against sessions_per_client
    std::int64_t cpu_weight = -1;
    std::int64_t cpu_quota = -1;
    std::uint8_t priority = 0;
    sched::EngineId told = sched::kNoEngine;  // engine last sent ADMIT or RESTORE for it
  };

  Server() = default;

  // Loop plumbing.
  void arm();  // the first operations (accept, signals, timer, host events); once
  void arm_socket(Client& c);
  void handle(Tag tag, int res);
  void on_accept(int fd);
  void on_signal();
  void on_timer();
  void on_client_socket(Client& c);
  void on_client_bell(Client& c);
  // Marks a client for removal; sweep() removes it at the end of the loop
  // iteration (cancels its operations, releases its sessions, logs once).
  void doom(Client& c, std::string why, bool misbehaved);
  void sweep();
  void release_sessions(Client& c, base::Time now);
  // Sends an Error and removes the client.
  void refuse(Client& c, int code, const std::string& message);

  // Protocol.
  void on_hello(Client& c, const wire::Hello& hello);
  void on_message(Client& c, const wire::Message& msg);
  void on_resync(Client& c, const wire::Resync& resync);
  void on_session_name(Client& c, const wire::SessionName& sn);
  void on_tool_prepare(Client& c, const wire::ToolPrepare& tp);
  void send_tool_notice(const ToolNotice& n);
  void on_ctl(Client& c, const wire::CtlRequest& req);
  // Whether `c` may open one more session (sessions_per_client); tells it if not.
  bool admit_session(Client& c, sched::SessionId id);
  // The session's meta, created (and charged to `c`) on first use.
  SessionMeta& meta_for(Client& c, sched::SessionId id);
  void send_policy_config(Client& c);
  void send_message(Client& c, const std::vector<std::uint8_t>& bytes);

  // Ring pump.
  void pump();
  // Drains up to the client's batch; returns true if records remain.
  bool pump_client(Client& c, base::Time now);
  void take_record(Client& c, const ipc::Record& r, base::Time now);
  // Whether client `c` may send record `r`; `why` names the reason if not.
  bool authorize(Client& c, const ipc::Record& r, const char** why);
  // Applies an event to the model and shows it to the policy; false if the
  // session table rejected it.
  bool feed(const sched::Event& e, base::Time now);
  void reject_record(Client& c, std::string_view why);

  // Control.
  void tick(base::Time now);
  void apply(const sched::Action& a, base::Time now);
  void send_directive(sched::EngineId engine, const ipc::Slot& record);
  void flush_backlog(Client& c);
  // Rings each engine's directive doorbell once for the directives pushed
  // since the last call (after a pump and after a tick).
  void ring_directive_bells();
  // The GPU plane's decisions of this tick: partitions and offload plans.
  void gpu_tick(base::Time now);
  // Records that must wait in a client's ring before it wakes the loop.
  static std::uint32_t wake_watermark(const Client& c);
  void publish_status(Client& c, base::Time now);
  void session_done(sched::SessionId id);
  base::Result<void> install_policy(const CompiledConfig& config);
  // Re-reads the configuration and applies it (SIGHUP, `tandemctl reload`);
  // a failure is logged and returned, and changes nothing.
  base::Result<void> reload();
  // Makes `fresh` the running configuration (reload, `tandemctl policy set`):
  // the policy rebuilt when it changed, engines sent the new PolicyConfig,
  // the tick re-timed. Refused (nothing changes) when a restart-only key
  // differs or the policy cannot be built; `why` names the caller in logs.
  base::Result<void> apply_config(std::shared_ptr<const CompiledConfig> fresh, std::string_view why);

  // ctl (daemon/ctl.cc).
  std::string ctl_status(base::Time now) const;
  std::string ctl_engines() const;
  std::string ctl_sessions(base::Time now) const;
  std::string ctl_tools() const;
  // tandemctl gpu: NVML's latest sample, processes attributed to clients (daemon/gpu_telemetry.h).
  std::string ctl_gpu(base::Time now) const;
  PidAttribution gpu_attribution() const;
  // tandemctl session-kill: closes a session, killing its tools. 0 or an errno value; `out` says what happened.
  int ctl_session_kill(std::string_view who, base::Time now, std::string& out);
  int ctl_session_evict(std::string_view who, base::Time now, std::string& out);
  // The live session `who` names (an id or a name), or 0 with `out` saying so.
  sched::SessionId find_live_session(std::string_view who, std::string& out) const;
  std::string ctl_policy() const;
  int ctl_policy_set(std::string_view key, std::string_view value, std::string& out);
  // Prometheus text of everything below (docs/metrics.md).
  std::string metrics_text(base::Time now) const;
  void count_record(const ipc::Record& r);

  Client* find_client(std::uint32_t id);

  std::shared_ptr<const CompiledConfig> config_;
  HostEffects* effects_ = nullptr;
  Notifier* notifier_ = nullptr;
  ConfigLoader reload_;
  base::MonotonicClock clock_;
  base::Time started_{};

  Uring uring_;
  base::UniqueFd listen_;
  base::UniqueFd lock_;
  base::UniqueFd signal_fd_;
  base::UniqueFd timer_fd_;
  std::string socket_path_;
  unsigned char signal_buf_[128] = {};  // one signalfd_siginfo
  std::uint64_t timer_buf_ = 0;
  bool stopping_ = false;
  bool armed_ = false;       // arm() ran
  bool host_armed_ = false;  // a POLLIN on the host plane's event fd is outstanding
  // The event log `tandemctl events` reads: session lifecycle, rounds,
  // tools, KV moves, the policy's actions and operators' commands.
  // Logged in the hot path as numbers; the text is made only when
  // `tandemctl events` asks (ctl_events).
  enum class LogKind : std::uint8_t {
    kSessionOpen,      // v: —
    kSessionTakeover,  // a runner's SESSION_OPEN after its engine's first round
    kSessionClose,
    kRoundSubmit,  // v: round, engine, prompt tokens, cached tokens
    kRoundEnd,     // v: round, output tokens, tool follows
    kToolStart,    // v: call
    kToolEnd,      // v: call, exit code, wall ns
    kKv,           // v: sched::KvChange, blocks
    kAdmit,        // v: engine
    kPause,
    kRestore,  // v: engine
    kPin,      // v: ns pinned for
    kUnpin,
    kDrop,
    kOffload,
    kKillTools,
    kDrain,
    kUndrain,
    kEvict,
    kKill,
    kSmPartition,  // session 0; v: engine, partition index, its decode SMs, SM_dec
    kOffloadPlan,  // session 0; v: engine, plan bits, freed bytes, pressure in thousandths
  };
  struct LoggedEvent {
    std::uint64_t seq;
    double t;  // seconds since start
    LogKind kind;
    sched::SessionId session;
    std::array<std::int64_t, 4> v;
    std::string name;  // only where the session's name is about to go (close, kill)
  };
  static constexpr std::size_t kEventLogSize = 4096;
  void log_event(base::Time now, LogKind kind, sched::SessionId session, std::array<std::int64_t, 4> v = {});
  std::string ctl_events(std::string_view since) const;
  static std::pair<std::string_view, std::string> describe_event(const LoggedEvent& e);
  std::deque<LoggedEvent> events_;
  std::uint64_t next_event_ = 1;
  bool draining_ = false;  // tandemctl drain: no new session is admitted; live ones go on
  std::optional<MetricsEndpoint> metrics_;
  std::string metrics_error_;  // why there is no endpoint ("" when there is, or none was asked)
  // NVML sampling on a thread of its own ([nvml]); never null after create().
  std::unique_ptr<GpuTelemetry> gpu_telemetry_;
  std::uint64_t watchdog_usec_ = 0;
  base::Time last_watchdog_{};

  std::map<std::uint32_t, Client> clients_;  // ordered by id: the pump's round-robin order
  std::uint32_t next_client_ = 1;
  std::uint32_t pump_start_ = 0;  // client id the next pump round starts at

  sched::PolicyInstance policy_;
  std::uint64_t policy_epoch_ = 0;
  sched::NodeModel model_;
  GpuPlane gpu_{GpuConfig{}};           // configured from config_ in create() and apply_config()
  std::vector<GpuChange> gpu_changes_;  // tick scratch
  sched::Actions actions_;
  std::unordered_map<sched::SessionId, SessionMeta> meta_;
  ServerStats stats_;
  std::vector<ipc::Slot> batch_;  // pump scratch
};

}  // namespace tandem::daemon
