// tandemd's handshake and socket messages: Hello, PolicyConfig, session names, tool placement (daemon/server.h).

#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "base/ids.h"
#include "base/text.h"
#include "daemon/events.h"
#include "daemon/hello.h"
#include "daemon/server.h"
#include "daemon/server_parts.h"

namespace tandem::daemon {

using base::Time;
using sched::SessionState;

// ---- handshake and messages ---------------------------------------------------

void Server::on_hello(Client& c, const wire::Hello& hello) {
  const Config& cfg = config_->config();
  HelloVerdict v = judge_hello(hello, *config_, c.uid, c.gid, ::geteuid(), clients_);
  if (v.bad_name) ++stats_.names_refused;
  if (v.over_limit) ++stats_.clients_refused_limits;
  if (v.identified) {
    c.role = v.terms.role;
    c.name = std::move(v.terms.name);
    c.instance = v.terms.instance;
  }
  if (!v.taken) {
    refuse(c, v.code, v.why);
    return;
  }
  if (c.role == Role::kEngine) {
    c.engine.params = v.terms.engine;
    c.engine.gpu_index = v.terms.gpu_index;
    c.engine.saturating_tokens = v.terms.saturating_tokens;
  }

  ipc::WelcomeInfo welcome;
  welcome.client_id = c.id;
  welcome.max_name = static_cast<std::uint32_t>(base::kMaxNameBytes);
  welcome.sessions_per_client = cfg.limits.sessions_per_client;
  welcome.tools_per_session = cfg.limits.tools_per_session;
  welcome.tool_ahead = cfg.host.ahead && c.role == Role::kRunner;
  if (c.role == Role::kEngine || c.role == Role::kRunner) {
    auto channel = ipc::Channel::create(ipc::ChannelConfig{cfg.event_slots, cfg.directive_slots},
                                        fmt::format("tandem-{}-{}", to_string(c.role), c.id));
    if (!channel) {
      spdlog::error("client {}: cannot create its segment: {}", c.id, channel.error().message());
      refuse(c, channel.error().code(), "the daemon could not create the shared-memory segment");
      return;
    }
    c.rings.channel = std::move(*channel);
    auto events = c.rings.channel.event_consumer();
    auto directives = c.rings.channel.directive_producer();
    auto status = c.rings.channel.status_writer();
    if (!events || !directives || !status) {
      refuse(c, EIO, "the daemon could not set up the rings");
      return;
    }
    c.rings.events = *events;
    c.rings.directives = *directives;
    c.rings.status = *status;
    c.rings.event_bell = c.rings.channel.event_doorbell();
    c.rings.directive_bell = c.rings.channel.directive_doorbell();
    c.rings.attached = true;
    welcome.segment_size = c.rings.channel.segment().layout().total_size;
    welcome.event_slots = c.rings.channel.event_slots();
    welcome.directive_slots = c.rings.channel.directive_slots();
  }
  const int fds[] = {c.rings.channel.segment_fd(), c.rings.channel.event_bell_fd(),
                     c.rings.channel.directive_bell_fd()};
  auto sent = ipc::send_message(c.sock.get(), ipc::build_welcome(welcome),
                                c.rings.attached ? std::span<const int>(fds) : std::span<const int>());
  if (!sent) {
    doom(c, fmt::format("Welcome not delivered: {}", sent.error().message()), false);
    return;
  }
  const Time now = clock_->now();
  c.phase = Phase::kActive;
  c.budgets.records = TokenBucket(cfg.limits.records_per_s, now);
  c.rings.pending = c.rings.attached;
  spdlog::info("client {} connected: {} \"{}\" (pid {}, uid {})", c.id, to_string(c.role), base::escape(c.name), c.pid,
               c.uid);
  if (c.role == Role::kRunner) {
    // The handle that owns the sessions this connection opens: the same
    // handle (uid, pid, process start, instance) reconnecting gets back what
    // it held. A client that names no instance (an older libtandem, a raw
    // client) is taken as its process's one handle while no other
    // connection of the process holds that, and as a handle of its own
    // otherwise.
    OwnerKey key{c.uid, c.pid, 0, c.instance};
    if (c.pid > 0) key.start = process_start_time(kProcRoot, c.pid).value_or(0);
    if (key.instance == 0) {
      const Owner* handle = sessions_.owners().find(key);
      Client* holder = handle == nullptr ? nullptr : find_client(handle->client);
      // A holder whose peer already closed (its EOF not yet read) is the
      // connection this one replaces.
      char byte = 0;
      if (holder != nullptr && ::recv(holder->sock.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
        doom(*holder, "closed the connection", false);
        holder = nullptr;
      }
      if (c.pid <= 0 || holder != nullptr) key.instance = (std::uint64_t{1} << 63) | c.id;
    }
    Owner& o = owner_for(key);
    if (o.client != 0 && o.client != c.id) {
      if (Client* old = find_client(o.client)) doom(*old, "replaced by a new connection of the same handle", false);
    }
    o.client = c.id;
    c.owner = o.id;
  }
  if (c.role == Role::kEngine) {
    control_->feed(sched::EngineJoined{c.id, c.engine.params}, now);
    send_policy_config(c);
    publish_status(c, now);
  }
}

void Server::send_policy_config(Client& c) {
  std::vector<std::string> keys;
  std::vector<double> values;
  for (const auto& [k, v] : control_->params().values()) {
    keys.push_back(k);
    values.push_back(v);
  }
  send_message(c, ipc::build_policy_config(control_->epoch(), config_->config().policy, keys, values));
}

void Server::on_message(Client& c, const wire::Message& msg) {
  switch (msg.payload_type()) {
    case wire::Payload::SessionName:
      on_session_name(c, *msg.payload_as_SessionName());
      break;
    case wire::Payload::Resync:
      if (c.role != Role::kEngine && c.role != Role::kRunner) {
        refuse(c, EPERM, "Resync is for engines and runners");
        return;
      }
      on_resync(c, *msg.payload_as_Resync());
      break;
    case wire::Payload::CtlRequest: {
      auto answer = ctl_->handle(c.role, *msg.payload_as_CtlRequest());
      // The answer may show sessions closed in this iteration (ctl pumps the
      // rings first; `session kill`): on disk before anyone sees them gone,
      // or a crash would bring back a session ctl said had ended.
      sessions_.ledger().flush();
      send_message(c, answer);
      break;
    }
    case wire::Payload::ToolPrepare:
      on_tool_prepare(c, *msg.payload_as_ToolPrepare());
      break;
    case wire::Payload::Error: {
      const auto* e = msg.payload_as_Error();
      spdlog::debug("client {} reports error {}: {}", c.id, e->code(),
                    base::escape(e->message() != nullptr ? e->message()->string_view() : std::string_view()));
      break;
    }
    default:
      refuse(c, EPROTO, fmt::format("unexpected {} from a client", wire::EnumNamePayload(msg.payload_type())));
      break;
  }
}

void Server::on_session_name(Client& c, const wire::SessionName& sn) {
  if (c.role != Role::kEngine && c.role != Role::kRunner) {
    refuse(c, EPERM, "SessionName is for engines and runners");
    return;
  }
  const std::string_view name = sn.name()->string_view();
  // A bad name is an answer about the name (session 0 in the Error): the
  // session itself is not refused.
  if (auto ok = base::check_name(name, "session name"); !ok) {
    ++stats_.names_refused;
    tell(c, ok.error().code(), fmt::format("SessionName: {}", ok.error().context()));
    return;
  }
  if (base::session_id(name) != sn.session()) {
    ++stats_.names_refused;
    tell(c, EINVAL,
         fmt::format("SessionName: \"{}\" is not the name of session {:#018x}", base::escape(name, 64), sn.session()));
    return;
  }
  set_name(c, sn.session(), name);
}

void Server::set_name(Client& c, sched::SessionId id, std::string_view name) {
  SessionMeta* found = sessions_.find(id);
  if (found == nullptr) {
    // The name may come before the record that opens the session — but not
    // after the session ended (a runner's name trailing its close).
    if (!sessions_.ledger().tombstone(id) && c.pending_names.size() < config_->config().limits.sessions_per_client) {
      c.pending_names[id] = std::string(name);
    }
    return;
  }
  // A session's name is its owner's to give (ids are hashes, and a name
  // hashing to a chosen id can be made): a runner's session takes its
  // runner's name, another client's only while it has none.
  SessionMeta& m = *found;
  const bool owner = m.owner == 0 || (c.role == Role::kRunner && m.owner == c.owner);
  if (owner || m.name.empty()) {
    m.name = std::string(name);
    m.named_by_owner = owner;
  }
  // Otherwise ignored: an engine naming a runner's session is no error, but
  // the runner's name stands.
}

void Server::on_tool_prepare(Client& c, const wire::ToolPrepare& tp) {
  if (c.role != Role::kRunner) {
    refuse(c, EPERM, "ToolPrepare is for runners");
    return;
  }
  ipc::ToolPlacementInfo reply;
  reply.request = tp.request();
  auto answer_error = [&](int code, std::string message) {
    ++stats_.tools_refused;
    reply.code = code;
    reply.message = std::move(message);
    send_message(c, ipc::build_tool_placement(reply));
  };
  // Its SESSION_OPEN may still sit below its ring's wake-up watermark: take
  // its records first (ToolPrepare comes over the socket, records over the
  // ring). Only this runner's: the other clients' rings, their backlogs and
  // the engines' bells wait for the loop's own pump, off the runner's path.
  if (c.rings.attached) {
    c.rings.pending = true;
    const Time now = clock_->now();
    for (int round = 0; round < kPumpRounds && !c.doomed() && pump_client(c, now); ++round) {
    }
    if (c.doomed()) return;
  }
  // The runner's own, open session only.
  const SessionMeta* m = sessions_.find(tp.session());
  const sched::Session* s = control_->model().sessions().find(tp.session());
  if (m == nullptr || s == nullptr || s->state == SessionState::kDone) {
    answer_error(ENOENT, fmt::format("session {:#018x} is not open", tp.session()));
    return;
  }
  if (m->owner != c.owner || c.owner == 0) {
    answer_error(EPERM, fmt::format("session {:#018x} belongs to another client", tp.session()));
    return;
  }
  // Every cgroup a runner makes the daemon hold is bounded: per session, and
  // over all the sessions of its handle. A placement ahead (the session's
  // next call, asked early) must fit them as an ordinary call would, one per
  // session; until TOOL_START names it, it is not counted, so a session may
  // hold it beside tools_per_session calls (one cgroup over, at most).
  const Limits& limits = config_->config().limits;
  if (tp.ahead()) {
    if (!config_->config().host.ahead) {
      answer_error(ENOTSUP, "placement ahead is off here ([tools] ahead = false)");
      return;
    }
    if (effects_->tool_ahead(tp.session())) {
      answer_error(EBUSY, fmt::format("session {:#018x} has a placement ahead already", tp.session()));
      return;
    }
  }
  if (effects_->tool_cgroups(tp.session()) >= limits.tools_per_session) {
    answer_error(ENOSPC, fmt::format("session {:#018x} has {} tool cgroups already: limits.tools_per_session = {}",
                                     tp.session(), effects_->tool_cgroups(tp.session()), limits.tools_per_session));
    return;
  }
  std::size_t held = 0;
  if (const Owner* o = sessions_.owners().find(c.owner)) {
    o->sessions.for_each([&](sched::SessionId id) { held += effects_->tool_cgroups(id); });
  }
  if (held >= limits.tools_per_client) {
    answer_error(ENOSPC,
                 fmt::format("this runner's sessions have {} tool cgroups already: limits.tools_per_client = {}", held,
                             limits.tools_per_client));
    return;
  }
  ToolRequest req;
  req.session = tp.session();
  req.call = tp.call();
  req.kind = tp.tool_kind();
  req.ahead = tp.ahead();
  if (const wire::ToolLimits* l = tp.limits()) {
    req.limits = ipc::ToolLimitsInfo{l->cpu_quota_us(), l->cpu_period_us(), l->memory_high(),
                                     l->memory_max(),   l->pids_max(),      l->low_priority()};
  }
  auto grant = effects_->prepare_tool(req);
  if (!grant) {
    answer_error(grant.error().code(), grant.error().message());
    return;
  }
  grant->info.request = tp.request();
  auto sent = ipc::send_message(c.sock.get(), ipc::build_tool_placement(grant->info), grant->fds);
  if (!sent) {
    doom(c, fmt::format("ToolPlacement not delivered: {}", sent.error().message()), false);
    return;
  }
  ++stats_.tools_prepared;
}

void Server::send_tool_notice(const ToolNotice& n) {
  const SessionMeta* m = sessions_.find(n.session);
  if (m == nullptr) return;
  const Owner* o = sessions_.owners().find(m->owner);
  Client* owner = o == nullptr ? nullptr : find_client(o->client);
  if (owner == nullptr || owner->doomed()) return;
  send_message(*owner, ipc::build_tool_killed(n.session, n.call, static_cast<std::uint8_t>(n.reason), n.message));
}

}  // namespace tandem::daemon
