// Server: tandemd's core — the io_uring loop, the client registry, the ring
// pump and the control tick (docs/architecture.md "Wire records", "Trust
// model", "Processes"). One object, written in parts, a file each
// (docs/architecture.md "The daemon's parts"): server.cc (start-up, the
// loop), handshake.cc, sessions.cc, intake.cc, tick.cc and server_ctl.cc.
// Five parts are classes with their own state: Loop (daemon/loop.h: the
// ring, the signalfd, the tick's timer); Clients (daemon/clients.h: the
// client registry and the limits it judges); SessionDirectory
// (daemon/directory.h: each session's meta, the runner handles that own
// sessions, tombstones and the ownership journal, what each engine is
// charged); Control (daemon/control.h: the model, the policy, the GPU plane,
// actions into directives and effects), which reaches the rest through
// ControlOutlet; and CtlService (daemon/ctl_service.h: tandemctl's answers
// and the metrics text), which reads the Server only through CtlView and
// steers it only through CtlCommands. The Server implements those three
// interfaces (tick.cc, server_ctl.cc). Smaller parts hold state of their own
// and reach nothing: UnplacedTools (daemon/unplaced.h) and KvEventsOut
// (daemon/kv_events.h). The handshake judges a Hello with the pure
// judge_hello (daemon/hello.h), and ring intake each record with the pure
// daemon::authorize (daemon/events.h), over facts the Server gathers.
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
#include <sys/stat.h>
#include <sys/types.h>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/clock.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "daemon/clients.h"
#include "daemon/config.h"
#include "daemon/control.h"
#include "daemon/ctl_service.h"
#include "daemon/directory.h"
#include "daemon/effects.h"
#include "daemon/event_log.h"
#include "daemon/events.h"
#include "daemon/gpu_plane.h"
#include "daemon/gpu_telemetry.h"
#include "daemon/kv_events.h"
#include "daemon/loop.h"
#include "daemon/metrics.h"
#include "daemon/owners.h"
#include "daemon/stats.h"
#include "daemon/unplaced.h"
#include "daemon/uring.h"
#include "ipc/channel.h"
#include "ipc/messages.h"
#include "ipc/records.h"
#include "sched/apply.h"
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
using ConfigLoader = std::function<base::Result<Compiled>()>;

// Thread-safety: one thread.
class Server : private ControlOutlet, private CtlView, private CtlCommands {
 public:
  // Binds <runtime_dir>/tandemd.sock (creating the directory; refusing if
  // another tandemd holds <runtime_dir>/tandemd.lock), sets up the signalfd
  // (SIGTERM, SIGINT, SIGHUP must already be blocked in every thread) and
  // the tick timer, and runs the compiled policy. `clock` (the monotonic
  // clock by default) is what every decision reads; tests step a
  // VirtualClock and call tick_now() themselves.
  static base::Result<std::unique_ptr<Server>> create(Compiled config, HostEffects& effects, Notifier& notifier,
                                                      ConfigLoader reload, const base::Clock* clock = nullptr);
  ~Server() override;
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
  // What the tick timer does (expiries, every ring drained, the control
  // tick), at the clock's now: tests that step a VirtualClock call it
  // rather than wait for the timer.
  void tick_now();

  const ServerStats& stats() const override { return stats_; }
  using Footprint = daemon::Footprint;
  Footprint footprint() const override;
  const std::string& socket_path() const { return socket_path_; }

 private:
  Server() = default;

  // Loop plumbing.
  void arm();  // the first operations (accept, signals, timer, host events); once
  // Runs `f`; an exception escaping it is counted and logged (never out of
  // the loop). Returns false if one did; `what` names the handler.
  template <class F>
  bool guarded(std::string_view what, F&& f);
  void arm_socket(Client& c);
  void handle(Tag tag, int res);
  void on_accept(int fd);
  void on_signal(int signo);
  void on_timer();
  void on_client_socket(Client& c);
  void on_client_bell(Client& c);
  // Marks a client for removal; sweep() removes it at the end of the loop
  // iteration (cancels its operations, releases its sessions, logs once).
  void doom(Client& c, std::string why, bool misbehaved);
  void sweep();
  void release_sessions(Client& c, base::Time now);
  // Ends every session `owner` holds (its process exited, or it cannot be
  // held for it): tools killed, sessions closed, the owner forgotten.
  void end_owner(std::uint32_t owner, Closed why, base::Time now);
  // The Owner for a runner connection with key `key`, made if new.
  Owner& owner_for(const OwnerKey& key);
  // Removes handle `o` (its pidfd's poll cancelled if outstanding); its
  // sessions must already be gone or closed.
  void forget_owner(const Owner& o);
  // Closes a live session: its tools killed with `reason`, the close fed
  // to the model, the journal told why (nullopt: not a tombstone).
  void close_session(sched::SessionId id, ipc::ToolExitReason reason, std::optional<Closed> why, base::Time now);
  // A per-request Error, at most kErrorsPerSecond a second per client.
  void tell(Client& c, int code, std::string_view message, sched::SessionId session = 0);
  // Sessions the ownership journal says were owned when tandemd last ran:
  // recreated, held for their owners, when the process still lives.
  void restore_owners(const JournalState& loaded, base::Time now);
  // Sends an Error and removes the client.
  void refuse(Client& c, int code, const std::string& message);

  // Protocol.
  void on_hello(Client& c, const wire::Hello& hello);
  void on_message(Client& c, const wire::Message& msg);
  void on_resync(Client& c, const wire::Resync& resync);
  // One entry of a Resync; false (with `why`) when it is refused.
  bool resync_runner(Client& c, const wire::SessionSnapshot& snap, const char** why, int* code);
  bool resync_engine(Client& c, const wire::SessionSnapshot& snap, const char** why, int* code);
  // The end of a runner's Resync sequence: its sessions missing from it close.
  void finish_resync(Client& c);
  void take_name(Client& c, sched::SessionId id, const flatbuffers::String* name);
  // A valid name for session `id` from `c`, taken if `c` may name it.
  void set_name(Client& c, sched::SessionId id, std::string_view name);
  void on_session_name(Client& c, const wire::SessionName& sn);
  void on_tool_prepare(Client& c, const wire::ToolPrepare& tp);
  void send_tool_notice(const ToolNotice& n);
  // Whether `c` may open one more session (sessions_per_client: its
  // handle's for a runner). A check only: refuse_session() answers.
  bool may_open_session(const Client& c) const;
  // Tells `c` that session `id` was refused at sessions_per_client (and
  // warns once per client).
  void refuse_session(Client& c, sched::SessionId id);
  void send_policy_config(Client& c);
  void send_message(Client& c, const std::vector<std::uint8_t>& bytes);

  // Ring pump.
  void pump();
  // Drains up to the client's batch; returns true if records remain.
  bool pump_client(Client& c, base::Time now);
  void take_record(Client& c, const ipc::Record& r, base::Time now);
  // Whether client `c` may send record `r` under its type's rule: the facts
  // the daemon holds of `c` and the record's session, judged by the pure
  // daemon::authorize (daemon/events.h). A check only: it changes nothing
  // and sends nothing; take_record() acts on the verdict.
  Verdict authorize(const Client& c, const ipc::Record& r, const RecordRule& rule) const;
  void reject_record(Client& c, std::string_view why);

  // The control tick (daemon/tick.cc): Control decides; directives go out,
  // finished sessions end, status pages are published, bells rung.
  void tick(base::Time now);
  // Where Control's decisions go (ControlOutlet, daemon/control.h).
  void send_directive(sched::EngineId engine, const ipc::Slot& record) override;
  SessionSteer* steer(sched::SessionId id) override;
  GpuChoice* gpu_choice(sched::EngineId engine) override;
  void note(base::Time now, EventLog::Kind kind, sched::SessionId session, std::array<std::int64_t, 4> v) override;
  // Pushes a directive to any client with a directive ring (CLOSE to a runner).
  void push_directive(Client& c, const ipc::Slot& record);
  void flush_backlog(Client& c);
  // Rings each engine's directive doorbell once for the directives pushed
  // since the last call (after a pump and after a tick).
  void ring_directive_bells();
  // Records that must wait in a client's ring before it wakes the loop.
  static std::uint32_t wake_watermark(const Client& c);
  void publish_status(Client& c, base::Time now);
  void session_done(sched::SessionId id);
  // Re-reads the configuration and applies it (SIGHUP, `tandemctl reload`);
  // a failure is logged and returned, and changes nothing.
  base::Result<void> reload() override;
  // Makes `fresh` the running configuration (reload, `tandemctl policy set`):
  // the policy rebuilt when it changed, engines sent the new PolicyConfig,
  // the tick re-timed. Refused (nothing changes) when a restart-only key
  // differs or the policy cannot be built; `why` names the caller in logs.
  base::Result<void> apply_config(Compiled fresh, std::string_view why) override;

  // What tandemctl reads and does (CtlService, daemon/ctl_service.h), in
  // daemon/server_ctl.cc.
  const CompiledConfig& config() const override { return *config_; }
  const sched::ControlPolicy& policy() const override { return control_->policy(); }
  std::uint64_t policy_epoch() const override { return control_->epoch(); }
  const sched::NodeModel& model() const override { return control_->model(); }
  const GpuPlane& gpu_plane() const override { return control_->gpu(); }
  base::Time started() const override { return started_; }
  bool draining() const override { return control_->draining(); }
  void for_each_client(const std::function<void(const ClientCard&)>& f) const override;
  std::optional<ClientCard> client(std::uint32_t id) const override;
  std::optional<SessionCard> session(sched::SessionId id) const override;
  void for_each_session(const std::function<void(sched::SessionId, const SessionCard&)>& f) const override;
  const EventLog& events() const override { return log_; }
  const HostEffects& host() const override { return *effects_; }
  const GpuTelemetry& gpu_telemetry() const override { return *gpu_telemetry_; }
  const MetricsEndpoints& metrics() const override { return metrics_; }
  const std::string& kv_events_state() const override { return kv_events_.state(); }
  static ClientCard card(const Client& c);
  SessionCard card(const SessionMeta& m) const;
  void refresh() override;
  void set_draining(bool on, base::Time now) override;
  void evict_session(sched::SessionId id, base::Time now) override;
  std::vector<std::int32_t> kill_session(sched::SessionId id, base::Time now) override;
  void count_record(const ipc::Record& r);

  Client* find_client(std::uint32_t id) { return clients_.find(id); }

  std::shared_ptr<const CompiledConfig> config_;
  HostEffects* effects_ = nullptr;
  Notifier* notifier_ = nullptr;
  ConfigLoader reload_;
  base::MonotonicClock monotonic_;
  const base::Clock* clock_ = &monotonic_;  // what decisions read (create()'s `clock`)
  base::Time started_{};

  Loop loop_;  // the ring, the signalfd and the tick's timer
  base::UniqueFd listen_;
  base::UniqueFd lock_;
  std::string socket_path_;
  bool stopping_ = false;
  bool armed_ = false;       // arm() ran
  bool host_armed_ = false;  // a POLLIN on the host plane's event fd is outstanding
  // What `tandemctl events` reads (daemon/event_log.h).
  using LogKind = EventLog::Kind;
  EventLog log_;
  // Logs an event, keeping the session's name where it is about to go.
  void log_event(base::Time now, LogKind kind, sched::SessionId session, std::array<std::int64_t, 4> v = {});
  MetricsEndpoints metrics_;
  // [kv_events] as the daemon started with it: the PUB socket and each
  // engine's batches through it (daemon/kv_events.h).
  KvEventsOut kv_events_;
  void take_kv_blocks(Client& c, const ipc::KvBlocks& r, std::uint64_t session);
  void flush_kv_events(Client& c);
  void count_kv_events(const KvEventsOut::Sent& sent);
  // NVML sampling on a thread of its own ([nvml]); never null after create().
  std::unique_ptr<GpuTelemetry> gpu_telemetry_;
  std::uint64_t watchdog_usec_ = 0;
  base::Time last_watchdog_{};

  Clients clients_;               // the registry, in id order: the pump's round-robin order
  std::uint32_t pump_start_ = 0;  // client id the next pump round starts at

  // The model, the policy, the GPU plane and the drain switch; made in
  // create(), the GPU plane configured from config_ there and in
  // apply_config().
  std::optional<Control> control_;
  // Each session's meta, the runner handles that own sessions, tombstones
  // and the ownership journal (daemon/directory.h).
  SessionDirectory sessions_;
  // Tools a runner started without a cgroup (daemon/unplaced.h).
  UnplacedTools unplaced_;
  // Tracks runner `c`'s unplaced tool (UnplacedTools::track), counted.
  void track_unplaced(Client& c, sched::SessionId session, std::uint32_t call, std::int32_t pid);
  base::UniqueFd dir_fd_;  // the runtime dir (daemon/runtime_dir.h)
  dev_t socket_dev_ = 0;   // the socket file we bound, to remove only ours
  ino_t socket_ino_ = 0;
  // accept(): paused after EMFILE/ENFILE until this time, backing off.
  bool accept_armed_ = false;
  base::Time accept_resume_{};
  base::Duration accept_backoff_{};
  // Logged-at-most-once-an-interval warnings: when last logged, how many since.
  struct Quiet {
    base::Time last{};
    std::uint64_t since = 0;
  };
  Quiet quiet_refused_;
  Quiet quiet_accept_;
  // Logs `text` through `q` at most once every 10 s, saying how many were held back.
  void quietly(Quiet& q, base::Time now, const std::string& text);
  ServerStats stats_;
  std::optional<CtlService> ctl_;  // tandemctl's answers and the metrics text; made in create()
  std::vector<ipc::Slot> batch_;   // pump scratch
};

}  // namespace tandem::daemon
