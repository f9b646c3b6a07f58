// CtlService: tandemd's answers to tandemctl (ctl.cc) and its Prometheus
// text (ctl_metrics.cc), for the ctl roles' requests on the socket and for
// the metrics endpoint.
//
// It holds no state of the daemon's. It reads the daemon through CtlView,
// a read-only view of what the answers show (the configuration, the model,
// the clients and sessions as cards, the counters, the event log, the host
// plane's and NVML's status), and steers it through CtlCommands, the few
// things an operator may do (reload, apply a configuration, drain, evict or
// kill a session). The Server implements both (docs/architecture.md "The
// daemon's parts"); a test may give it others. The only state of its own is
// which policy keys `tandemctl policy set` changed since the file was read.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/result.h"
#include "daemon/config.h"
#include "daemon/effects.h"
#include "daemon/event_log.h"
#include "daemon/gpu_plane.h"
#include "daemon/gpu_telemetry.h"
#include "daemon/metrics.h"
#include "daemon/stats.h"
#include "ipc/messages.h"
#include "sched/model.h"
#include "sched/policy.h"

namespace tandem::daemon {

// A connection as tandemctl sees it. Thread-safety: a value type.
struct ClientCard {
  std::uint32_t id = 0;
  bool active = false;  // past its Hello and not being removed
  Role role = Role::kCtlRead;
  std::string_view name;  // valid until the loop goes on
  pid_t pid = 0;
  sched::EngineParams engine;  // engines: from their Hello
  std::int32_t gpu_index = -1;
  GpuChoice gpu;  // engines
  std::uint64_t accepted = 0;
  std::uint64_t rejected = 0;
  std::uint64_t late = 0;  // records about an ended session, skipped
};

// A session's daemon-side facts (its name, owner and effects) as tandemctl
// sees them. Thread-safety: a value type.
struct SessionCard {
  std::string_view name;           // valid until the loop goes on
  std::uint32_t owner = 0;         // the runner handle owning it (0: none)
  std::uint32_t owner_client = 0;  // ... and the connection attached to it (0: none, or held)
  std::uint8_t priority = 0;
  std::int64_t cpu_weight = -1;  // -1: never set
  std::int64_t cpu_quota = -1;
};

// What tandemctl reads of the daemon.
// Thread-safety: the loop thread only; what it returns is valid until the
// loop goes on.
class CtlView {
 public:
  virtual ~CtlView() = default;
  virtual const CompiledConfig& config() const = 0;
  virtual const sched::ControlPolicy& policy() const = 0;
  virtual std::uint64_t policy_epoch() const = 0;
  virtual const sched::NodeModel& model() const = 0;
  virtual const GpuPlane& gpu_plane() const = 0;
  virtual const ServerStats& stats() const = 0;
  virtual Footprint footprint() const = 0;
  virtual base::Time started() const = 0;
  virtual bool draining() const = 0;
  // Every connection in id order, those being removed included.
  virtual void for_each_client(const std::function<void(const ClientCard&)>& f) const = 0;
  // Connection `id`, being removed or not (nullopt: none).
  virtual std::optional<ClientCard> client(std::uint32_t id) const = 0;
  // Session `id`'s card (nullopt: the daemon keeps nothing for it).
  virtual std::optional<SessionCard> session(sched::SessionId id) const = 0;
  // Every session the daemon keeps a card for, in no order.
  virtual void for_each_session(const std::function<void(sched::SessionId, const SessionCard&)>& f) const = 0;
  virtual const EventLog& events() const = 0;
  virtual const HostEffects& host() const = 0;
  virtual const GpuTelemetry& gpu_telemetry() const = 0;
  // The metrics endpoints: the node's and the engines' (each with why it is
  // off, when it is).
  virtual const MetricsEndpoints& metrics() const = 0;
  // [kv_events]: "off", "bind ENDPOINT" / "connect ENDPOINT", or "off: <why>".
  virtual const std::string& kv_events_state() const = 0;
};

// What tandemctl's commands do to the daemon.
// Thread-safety: the loop thread only.
class CtlCommands {
 public:
  virtual ~CtlCommands() = default;
  // Takes the records waiting in every ring now (those below a ring's
  // wake-up watermark wait for the tick), so an answer is never a tick stale.
  virtual void refresh() = 0;
  // Reads the configuration again and applies it, as SIGHUP does; a failure
  // is logged and returned, and changes nothing.
  virtual base::Result<void> reload() = 0;
  // Makes `fresh` the running configuration; refused (nothing changes) when
  // a restart-only key differs. `why` names the caller in logs.
  virtual base::Result<void> apply_config(Compiled fresh, std::string_view why) = 0;
  // tandemctl drain (true) and undrain: no new session is admitted; live
  // ones go on. A change is noted in the event log.
  virtual void set_draining(bool on, base::Time now) = 0;
  // Frees live session `id`'s KV (pins included) on its engine, the
  // policy's way (unpin, drop), noted in the event log.
  // REQUIRES: `id` is live and on an engine.
  virtual void evict_session(sched::SessionId id, base::Time now) = 0;
  // Closes live session `id`, killing its tools, noted in the event log;
  // returns the pids of its processes still alive after (checked, never
  // assumed). REQUIRES: `id` is live.
  virtual std::vector<std::int32_t> kill_session(sched::SessionId id, base::Time now) = 0;
};

// Thread-safety: the loop thread only.
class CtlService {
 public:
  CtlService(const CtlView& view, CtlCommands& commands, const base::Clock& clock)
      : view_(view), commands_(commands), clock_(clock) {}

  // The answer (a CtlResponse) to a request from a client of role `role`.
  std::vector<std::uint8_t> handle(Role role, const wire::CtlRequest& req);
  // Prometheus text of everything the daemon counts and holds
  // (docs/metrics.md): the endpoint's answer and `tandemctl metrics`.
  std::string metrics_text(base::Time now) const;
  // One engine's text in vLLM's metric names (docs/metrics.md "Per engine"),
  // for its own scrape endpoint: the engines connected under `name` together.
  // EAGAIN naming it when none is connected (the endpoint answers 503).
  base::Result<std::string> engine_metrics_text(std::string_view name, base::Time now) const;
  // The configuration file was read again: keys `policy set` changed are
  // forgotten.
  void file_reloaded() { policy_set_keys_.clear(); }

 private:
  // A page of a list answer: the body (JSON) and the cursor of the next
  // page ("" when this was the last). Every page fits one datagram.
  struct Page {
    std::string body;
    std::string next;
  };
  std::string status(base::Time now) const;
  Page engines(std::string_view cursor) const;
  Page sessions(base::Time now, std::string_view cursor) const;
  Page tools(std::string_view cursor) const;
  Page metrics(base::Time now, std::string_view cursor) const;
  std::string events(std::string_view since) const;
  // tandemctl gpu: NVML's latest sample, processes attributed to clients
  // (daemon/gpu_telemetry.h).
  std::string gpu(base::Time now) const;
  PidAttribution gpu_attribution() const;
  // What a router reads of each engine, by the engine's name (engines
  // connected under one name summed): the vLLM-named families and tandem's
  // own per-engine ones (daemon/ctl_metrics.cc).
  struct EngineLoad;
  std::map<std::string, EngineLoad, std::less<>> engine_loads(base::Time now) const;
  void engine_families(PromText& p, const std::map<std::string, EngineLoad, std::less<>>& loads) const;
  // tandem_pressure_some_avg10: the host plane's PSI (from its status).
  void host_pressure(PromText& p) const;
  std::string policy() const;
  // tandemctl policy set, session-kill, session-evict: 0 or an errno
  // value; `out` says what happened.
  int policy_set(std::string_view key, std::string_view value, std::string& out);
  int session_kill(std::string_view who, base::Time now, std::string& out);
  int session_evict(std::string_view who, base::Time now, std::string& out);
  // The live session `who` names (an id or a name), or 0 with `out` saying so.
  sched::SessionId find_live_session(std::string_view who, std::string& out) const;

  const CtlView& view_;
  CtlCommands& commands_;
  const base::Clock& clock_;
  // Keys `tandemctl policy set` changed since the file was last read.
  std::set<std::string> policy_set_keys_;
};

}  // namespace tandem::daemon
