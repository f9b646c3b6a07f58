// Client: connection state machine, session table, fail-open slots.
#include "libclient/client.h"

#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include <fmt/format.h>

#include "base/ids.h"

namespace tandem::client {
namespace {

using sched::Residency;
using sched::SessionState;

// Room one SessionSnapshot takes in a Resync besides its name (table,
// vtable share, string header and padding, vector slot), rounded up.
constexpr std::size_t kSnapshotOverhead = 96;
// ... and per running tool call it lists (table, vtable share, fields).
constexpr std::size_t kToolSnapshotBytes = 40;
// Bytes of snapshots per Resync datagram, leaving headroom under the limit.
constexpr std::size_t kResyncBytes = ipc::kMaxMessageSize - 4096;
// Socket messages read per drive, so a chatty peer cannot starve the caller.
constexpr int kMaxMessagesPerPump = 1024;

int poll_ms(base::Duration left) {
  if (left <= base::Duration::zero()) return 0;
  // Round up: never wake a hair early and spin through poll(…, 0).
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<std::int64_t>(ms, INT_MAX));
}

}  // namespace

base::Result<std::unique_ptr<Client>> Client::create(Config config) {
  auto coordinator = Coordinator::create();
  if (!coordinator) return base::propagate(std::move(coordinator.error()));
  return std::unique_ptr<Client>(new Client(std::move(config), std::move(*coordinator)));
}

Client::Client(Config config, Coordinator coordinator)
    : config_(std::move(config)), coordinator_(std::move(coordinator)), backoff_(config_.reconnect_min) {
  stats_.sz = sizeof stats_;
  // This handle's name to the daemon across reconnects (Hello.instance):
  // random, so that no other handle, in this process or another, can be
  // mistaken for it; the daemon checks uid and pid itself.
  while (instance_ == 0) {
    if (::getrandom(&instance_, sizeof instance_, 0) != static_cast<ssize_t>(sizeof instance_)) {
      instance_ = static_cast<std::uint64_t>(base::to_ns(clock_.now())) ^
                  (static_cast<std::uint64_t>(::getpid()) << 32) ^ reinterpret_cast<std::uintptr_t>(this);
    }
  }
}

Client::~Client() {
  reap_tools(0);  // a handle's tools die with it, as tandemd kills their cgroups when it goes
  shutdown();
}

void Client::start() { drive(false); }

void Client::shutdown() {
  if (state_ == ConnState::kConnected) {
    // A runner's sessions end with its handle: say so, or the daemon would
    // hold them for a reconnect until the process exits.
    if (config_.role == Role::kRunner) {
      for (const auto& [id, s] : sessions_) {
        if (!s.open) continue;
        ipc::SessionClose r;
        r.reason = static_cast<std::uint8_t>(ipc::CloseReason::kNormal);
        send_record(r, id);
      }
    }
    sender_->flush();
    try {
      flush_outbox();
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while closing; nothing left to report to
    }
  }
  drop_connection();
}

void Client::drop_connection() {
  sender_.reset();
  directives_.reset();
  status_.reset();
  directive_bell_ = ipc::Doorbell();
  channel_.reset();
  sock_.reset();
  outbox_.clear();
  state_ = ConnState::kDisconnected;
}

tandem_client_stats Client::stats() const { return stats_; }

int Client::fail(int code, std::string message) {
  last_error_ = std::move(message);
  return -code;
}

// ---- connection ---------------------------------------------------------------

void Client::drive(bool read_socket) {
  switch (state_) {
    case ConnState::kDisconnected: {
      base::Time now = clock_.now();
      if (now >= next_attempt_) try_connect(now);
      break;
    }
    case ConnState::kAwaitingWelcome:
      if (pump_socket() && state_ == ConnState::kAwaitingWelcome && clock_.now() - hello_at_ >= kWelcomeTimeout) {
        lose("no Welcome within 1 s of Hello");
      }
      break;
    case ConnState::kConnected:
      if (read_socket && pump_socket() && flush_outbox()) sender_->flush();
      break;
  }
}

void Client::try_connect(base::Time now) {
  // The next attempt is due one backoff from now whatever happens here; a
  // Welcome resets the backoff.
  next_attempt_ = now + backoff_;
  backoff_ = std::min(backoff_ * 2, config_.reconnect_max);

  base::UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) {
    connection_error_ = fmt::format("socket: {}", std::strerror(errno));
    return;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // The length was checked when the handle was opened.
  std::memcpy(addr.sun_path, config_.socket_path.data(),
              std::min(config_.socket_path.size(), sizeof addr.sun_path - 1));
  // AF_UNIX connects complete at once or fail (EAGAIN when the backlog is
  // full, ENOENT/ECONNREFUSED without a daemon): never EINPROGRESS.
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    connection_error_ = fmt::format("connect {}: {}", config_.socket_path, std::strerror(errno));
    return;
  }
  if (std::string why; !trusted_daemon(fd.get(), why)) {
    connection_error_ = why;
    return;
  }
  auto hello = ipc::build_hello(config_.role == Role::kEngine ? wire::Role::Engine : wire::Role::Runner, config_.name,
                                static_cast<std::int32_t>(::getpid()), config_.engine, instance_);
  auto sent = ipc::send_message(fd.get(), hello);
  if (!sent) {
    connection_error_ = sent.error().message();
    return;
  }
  sock_ = std::move(fd);
  state_ = ConnState::kAwaitingWelcome;
  hello_at_ = now;
}

bool Client::pump_socket() {
  for (int i = 0; i < kMaxMessagesPerPump && state_ != ConnState::kDisconnected; ++i) {
    auto received = ipc::recv_message(sock_.get());
    if (!received) {
      const int code = received.error().code();
      if (code == EAGAIN || code == EWOULDBLOCK) return true;
      if (code == EINTR) continue;
      lose(received.error().message());
      return false;
    }
    if (!handle_message(*received)) return false;
  }
  return state_ != ConnState::kDisconnected;
}

bool Client::handle_message(ipc::ReceivedMessage& received) {
  const wire::Message* message = received.message();
  switch (message->payload_type()) {
    case wire::Payload::Welcome:
      if (state_ != ConnState::kAwaitingWelcome) {
        lose("protocol: a second Welcome");
        return false;
      }
      return on_welcome(*message->payload_as_Welcome(), received.fds);
    case wire::Payload::Error: {
      const wire::Error* error = message->payload_as_Error();
      if (state_ == ConnState::kConnected && !error->fatal()) {
        on_daemon_error(*error);  // one request refused: the connection stays
        return true;
      }
      lose(fmt::format("daemon: {} (error {})",
                       base::escape(error->message() != nullptr ? error->message()->string_view() : ""),
                       error->code()));
      return false;
    }
    case wire::Payload::PolicyConfig:
      if (state_ != ConnState::kConnected) {
        lose("protocol: PolicyConfig before Welcome");
        return false;
      }
      on_policy_config(*message->payload_as_PolicyConfig());
      return true;
    case wire::Payload::ResyncRequest:
      // Before Welcome there is nothing to resync onto; the Welcome sends one.
      if (state_ == ConnState::kConnected) queue_resync();
      return state_ != ConnState::kDisconnected;
    case wire::Payload::ToolPlacement: {
      const wire::ToolPlacement* p = message->payload_as_ToolPlacement();
      // Only answers to requests still waiting (request ids below next_request_).
      if (p->request() == 0 || p->request() >= next_request_) return true;
      Placement placed;
      placed.info = ipc::parse_tool_placement(*p);
      placed.fds = std::move(received.fds);
      placements_[p->request()] = std::move(placed);
      return true;
    }
    case wire::Payload::ToolKilled: {
      const wire::ToolKilled* k = message->payload_as_ToolKilled();
      for (const auto& [pid, t] : procs_) {
        if (t.session == k->session() && t.call == k->call()) {
          kills_[{k->session(), k->call()}] = Kill{k->reason(), k->message() != nullptr ? k->message()->str() : ""};
        }
      }
      return true;
    }
    default:
      // Nothing else is addressed to a client; ignore rather than guess.
      return true;
  }
}

bool Client::on_welcome(const wire::Welcome& welcome, std::vector<base::UniqueFd>& fds) {
  if (welcome.protocol_version() != ipc::kProtocolVersion) {
    lose(fmt::format("protocol: daemon speaks version {}, we speak {}", welcome.protocol_version(),
                     ipc::kProtocolVersion));
    return false;
  }
  if (fds.size() != 3) {
    lose(fmt::format("protocol: Welcome carried {} fds, expected 3", fds.size()));
    return false;
  }
  auto attached = ipc::Channel::attach(std::move(fds[0]), std::move(fds[1]), std::move(fds[2]));
  if (!attached) {
    lose(attached.error().message());
    return false;
  }
  auto channel = std::make_unique<ipc::Channel>(std::move(*attached));
  if ((welcome.event_slots() != 0 && welcome.event_slots() != channel->event_slots()) ||
      (welcome.directive_slots() != 0 && welcome.directive_slots() != channel->directive_slots())) {
    lose("protocol: Welcome's ring sizes differ from the segment's");
    return false;
  }
  auto producer = channel->event_producer();
  auto consumer = channel->directive_consumer();
  auto status = channel->status_reader();
  if (!producer || !consumer || !status) {
    lose(!producer ? producer.error().message() : !consumer ? consumer.error().message() : status.error().message());
    return false;
  }
  channel_ = std::move(channel);
  sender_.emplace(*producer, channel_->event_doorbell(), &channel_->segment());
  directives_.emplace(*consumer);
  status_.emplace(*status);
  directive_bell_ = channel_->directive_doorbell();
  client_id_ = welcome.client_id();
  daemon_sessions_ = welcome.sessions_per_client();
  daemon_tools_ = welcome.tools_per_session();
  daemon_ahead_ = welcome.tool_ahead();
  state_ = ConnState::kConnected;
  backoff_ = config_.reconnect_min;
  connection_error_.clear();
  ++stats_.connects;

  // Sessions running on fail-open slots keep running: they are admitted from
  // now on, and the snapshot below says so.
  for (auto& [id, s] : sessions_) {
    if (s.has_slot) {
      s.has_slot = false;
      s.admitted = true;
      s.paused = false;
    }
  }
  slots_used_ = 0;
  queue_resync();
  return state_ == ConnState::kConnected;
}

bool Client::trusted_daemon(int fd, std::string& why) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    why = fmt::format("SO_PEERCRED: {}", std::strerror(errno));
    return false;
  }
  // Whoever listens on the socket learns our sessions and starts our tools'
  // cgroups: only root (tandemd) or our own user (a test daemon) may.
  if (cred.uid == 0 || cred.uid == ::geteuid()) return true;
  why = fmt::format("the socket is served by uid {} (pid {}), not by root or this user: not talking to it", cred.uid,
                    cred.pid);
  return false;
}

void Client::on_daemon_error(const wire::Error& error) {
  ++stats_.daemon_errors;
  daemon_error_ = base::escape(error.message() != nullptr ? error.message()->string_view() : "", 512);
  if (error.session() == 0) return;
  if (Session* s = find(error.session())) {
    if (s->refused == 0) ++stats_.sessions_refused;
    s->refused = error.code() > 0 ? error.code() : EIO;
    // An engine's refused session runs fail-open (under the local cap);
    // it queues for a slot like one submitted while disconnected.
    if (s->in_flight && !s->admitted && !s->has_slot) waiting_.insert({s->submit_seq, error.session()});
  }
}

void Client::on_policy_config(const wire::PolicyConfig& config) {
  if (config_.role != Role::kEngine) return;
  const auto* keys = config.keys();
  const auto* values = config.values();
  const std::size_t n_keys = keys != nullptr ? keys->size() : 0;
  const std::size_t n_values = values != nullptr ? values->size() : 0;
  if (n_keys != n_values) return;  // malformed: keep the policy we have
  std::map<std::string, double> params;
  for (std::size_t i = 0; i < n_keys; ++i) {
    const flatbuffers::String* key = keys->Get(static_cast<flatbuffers::uoffset_t>(i));
    if (key == nullptr) return;
    params[key->str()] = values->Get(static_cast<flatbuffers::uoffset_t>(i));
  }
  // A config that does not build leaves the previous policy in place.
  (void)coordinator_.configure(config.name()->string_view(), params, config.epoch()).has_value();
}

void Client::lose(std::string reason) {
  if (state_ == ConnState::kConnected) ++stats_.disconnects;
  for (auto& [pid, t] : procs_) t.daemon_lost = true;  // its ToolKilled, if any, may never come
  // Placements asked on this connection: their answers will not come now.
  aheads_.clear();
  placements_.clear();
  connection_error_ = std::move(reason);
  drop_connection();
  next_attempt_ = clock_.now() + backoff_;
  backoff_ = std::min(backoff_ * 2, config_.reconnect_max);
}

bool Client::flush_outbox() {
  while (state_ == ConnState::kConnected && !outbox_.empty()) {
    auto sent = ipc::send_message(sock_.get(), outbox_.front());
    if (!sent) {
      const int code = sent.error().code();
      if (code == EAGAIN || code == EWOULDBLOCK) return true;  // the rest goes out from poll()
      if (code == EINTR) continue;
      lose(sent.error().message());
      return false;
    }
    outbox_.pop_front();
  }
  return state_ == ConnState::kConnected;
}

void Client::queue_message(std::vector<std::uint8_t> message) {
  if (state_ != ConnState::kConnected) return;
  if (outbox_.size() >= kMaxOutbox) {
    lose("the daemon stopped reading its socket");
    return;
  }
  outbox_.push_back(std::move(message));
}

std::optional<ipc::SessionSnapshotInfo> Client::snapshot(std::uint64_t id, const Session& s) const {
  ipc::SessionSnapshotInfo info;
  info.session = id;
  info.name = s.name;
  if (config_.role == Role::kEngine) {
    if (!s.in_flight && s.blocks_held == 0 && !s.tool_follows) return std::nullopt;
    SessionState state;
    if (s.in_flight) {
      state = s.admitted || s.has_slot ? SessionState::kReasoning : SessionState::kWaiting;
    } else if (s.paused) {
      state = SessionState::kPaused;
    } else {
      state = s.tool_follows ? SessionState::kActing : SessionState::kReasoning;
    }
    Residency residency = s.residency;
    if (residency == Residency::kNone && s.blocks_held > 0) residency = Residency::kResident;
    info.state = static_cast<std::uint8_t>(state);
    info.residency = static_cast<std::uint8_t>(residency);
    info.round = s.round;
    info.blocks_held = s.blocks_held;
  } else {
    if (!s.open) return std::nullopt;
    info.state = static_cast<std::uint8_t>(s.tools.empty() ? SessionState::kReasoning : SessionState::kActing);
    info.residency = static_cast<std::uint8_t>(Residency::kNone);
    info.in_tool = !s.tools.empty();
    info.tool_kind = s.tools.empty() ? 0 : s.tools.back().kind;
    for (const auto& [pid, t] : procs_) {
      if (t.session == id) info.tools.push_back(ipc::ToolSnapshotInfo{t.call, pid, t.cgroup_id});
    }
  }
  return info;
}

void Client::queue_resync() {
  std::vector<ipc::SessionSnapshotInfo> batch;
  std::size_t bytes = 0;
  // What the daemon takes from the ring after this many records is newer
  // than the snapshot (it judges only sessions the snapshot knew of).
  const std::uint64_t position = sender_ ? sender_->position() : 0;
  auto emit = [&](bool more) {
    queue_message(ipc::build_resync(batch, more, position));
    batch.clear();
    bytes = 0;
  };
  // Names already travel in the snapshot; named sessions outside it (an
  // engine's idle ones) get a SessionName each.
  std::vector<std::pair<std::uint64_t, const std::string*>> names;
  for (const auto& [id, s] : sessions_) {
    auto snap = snapshot(id, s);
    if (!snap) {
      if (!s.name.empty()) names.emplace_back(id, &s.name);
      continue;
    }
    const std::size_t size = snap->name.size() + kSnapshotOverhead + snap->tools.size() * kToolSnapshotBytes;
    if (!batch.empty() && (batch.size() == ipc::kResyncBatch || bytes + size > kResyncBytes)) emit(true);
    bytes += size;
    batch.push_back(std::move(*snap));
  }
  emit(false);  // always one message, even for an empty snapshot
  for (const auto& [id, name] : names) queue_message(ipc::build_session_name(id, *name));
  if (state_ == ConnState::kConnected) ++stats_.resyncs;
  flush_outbox();
  send_gpu_records();
}

// ---- rings ----------------------------------------------------------------------

template <class T>
void Client::send_record(const T& record, std::uint64_t session) {
  if (state_ != ConnState::kConnected) {
    ++stats_.records_dropped;  // fail-open: the resync after reconnecting carries the state
    return;
  }
  if (sender_->send(ipc::encode(record, session, base::to_ns(clock_.now())))) {
    ++stats_.records_sent;
  } else {
    ++stats_.records_dropped;  // ring and overflow full: the daemon was told to ask for a resync
  }
}
// libclient/tools.cc sends these as well.
template void Client::send_record(const ipc::ToolStart&, std::uint64_t);
template void Client::send_record(const ipc::ToolEnd&, std::uint64_t);

void Client::drain_directives() {
  if (state_ != ConnState::kConnected) return;
  ipc::Slot slot;
  // At most one ring's worth per call, so a daemon that keeps pushing cannot
  // hold the caller here.
  for (std::uint32_t i = 0; i < directives_->capacity() && directives_->try_pop(slot); ++i) {
    ipc::Record record;
    if (decoder_.decode(slot, record) != ipc::DecodeStatus::kOk) continue;  // counted by the decoder
    ++stats_.directives;
    apply(record);
  }
}

void Client::apply(const ipc::Record& record) {
  const std::uint64_t id = record.session();
  tandem_directive d{static_cast<std::uint32_t>(record.type()), 0, id, 0};
  switch (record.type()) {
    case ipc::RecordType::kAdmit:
      if (Session* s = entry(id)) {
        set_admitted(id, *s, true);
        s->paused = false;
      }
      break;
    case ipc::RecordType::kPause:
      if (Session* s = entry(id)) {
        set_admitted(id, *s, false);
        s->paused = true;
      }
      break;
    case ipc::RecordType::kRestore: {
      const std::uint32_t engine = record.as<ipc::Restore>().engine;
      d.value = engine;
      if (Session* s = entry(id)) {
        const bool here = engine == client_id_;
        set_admitted(id, *s, here);
        s->paused = !here;
      }
      break;
    }
    case ipc::RecordType::kPriority: {
      const std::uint8_t level = record.as<ipc::Priority>().level;
      d.value = level;
      if (Session* s = entry(id)) s->priority = level;
      break;
    }
    case ipc::RecordType::kPin:
      d.value = record.as<ipc::Pin>().until_ns;
      if (Session* s = find(id)) s->residency = Residency::kPinned;
      break;
    case ipc::RecordType::kUnpin:
      if (Session* s = find(id); s != nullptr && s->residency == Residency::kPinned)
        s->residency = Residency::kResident;
      break;
    case ipc::RecordType::kDrop:
      if (Session* s = find(id)) s->residency = Residency::kDropped;
      break;
    case ipc::RecordType::kOffload:
      if (Session* s = find(id)) s->residency = Residency::kOffloaded;
      break;
    case ipc::RecordType::kPrefetch:
      if (Session* s = find(id)) s->residency = Residency::kResident;
      break;
    case ipc::RecordType::kClose:
      // The session is over: forget it, here and in the step scheduler (an
      // engine after the round it runs: maybe_forget()).
      if (Session* s = find(id); s != nullptr && s->in_flight) {
        s->closed = true;
        s->tool_follows = false;
      } else {
        if (s != nullptr) {
          waiting_.erase({s->submit_seq, id});
          release_slot(id, *s);
          sessions_.erase(id);
        }
        coordinator_.session_end(id);
      }
      break;
    default:
      return;  // the decoder passes directives only
  }
  if (ready_.size() >= kMaxQueuedDirectives) ready_.pop_front();  // applied already; the oldest goes
  ready_.push_back(d);
}

void Client::wait(base::Time deadline) {
  while (ready_.empty()) {
    const base::Time now = clock_.now();
    if (now >= deadline) return;
    base::Time until = deadline;
    pollfd fds[2] = {};
    nfds_t nfds = 0;
    bool armed = false;
    switch (state_) {
      case ConnState::kConnected:
        // Doorbell protocol (ipc/doorbell.h): announce the sleep, re-check
        // the ring, and only then block on the eventfd.
        directive_bell_.arm();
        if (!directives_->empty()) {
          directive_bell_.disarm();
          drain_directives();
          continue;
        }
        armed = true;
        fds[0] = {sock_.get(), static_cast<short>(POLLIN | (outbox_.empty() ? 0 : POLLOUT)), 0};
        fds[1] = {directive_bell_.fd(), POLLIN, 0};
        nfds = 2;
        break;
      case ConnState::kAwaitingWelcome:
        fds[0] = {sock_.get(), POLLIN, 0};
        nfds = 1;
        until = std::min(deadline, hello_at_ + kWelcomeTimeout);
        break;
      case ConnState::kDisconnected:
        until = std::min(deadline, next_attempt_);  // poll() without fds: a sleep
        break;
    }
    const int r = ::poll(fds, nfds, poll_ms(until - now));
    if (armed) {
      directive_bell_.disarm();
      if (r > 0 && (fds[1].revents & POLLIN) != 0) (void)directive_bell_.consume().has_value();
    }
    drive(true);
    drain_directives();
  }
}

int Client::poll(int timeout_ms, int max, tandem_directive* out) {
  const base::Time deadline = clock_.now() + std::chrono::milliseconds(timeout_ms);
  drive(true);
  drain_directives();
  if (ready_.empty() && timeout_ms > 0) wait(deadline);
  int n = 0;
  while (n < max && !ready_.empty()) {
    out[n++] = ready_.front();
    ready_.pop_front();
  }
  return n;
}

// ---- sessions -------------------------------------------------------------------

Client::Session* Client::find(std::uint64_t id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

Client::Session* Client::entry(std::uint64_t id) {
  if (Session* s = find(id)) return s;
  if (sessions_.size() >= kMaxSessions) return nullptr;
  return &sessions_[id];
}

void Client::set_admitted(std::uint64_t id, Session& s, bool admitted) {
  s.admitted = admitted;
  if (admitted) {
    waiting_.erase({s.submit_seq, id});
    release_slot(id, s);  // the daemon's word supersedes the local cap
  } else if (s.in_flight && !s.has_slot) {
    waiting_.insert({s.submit_seq, id});
  }
}

void Client::release_slot(std::uint64_t /*id*/, Session& s) {
  if (!s.has_slot) return;
  s.has_slot = false;
  --slots_used_;
}

void Client::grant_slots() {
  while (slots_used_ < config_.fallback_cap && !waiting_.empty()) {
    const auto [seq, id] = *waiting_.begin();
    waiting_.erase(waiting_.begin());
    Session* s = find(id);
    if (s == nullptr) continue;
    s->has_slot = true;
    ++slots_used_;
  }
}

void Client::maybe_forget(std::uint64_t id) {
  Session* s = find(id);
  if (s == nullptr || s->in_flight || s->has_slot) return;
  if (!s->closed && (s->blocks_held > 0 || s->tool_follows)) return;
  const bool over = s->closed;
  waiting_.erase({s->submit_seq, id});
  sessions_.erase(id);
  if (over) coordinator_.session_end(id);
}

int Client::runnable(std::uint64_t session) {
  drive(false);
  Session* s = find(session);
  if (s == nullptr || !s->submitted) return 1;
  if (state_ == ConnState::kConnected && s->refused == 0) return s->admitted ? 1 : 0;
  if (s->admitted || s->has_slot) return 1;
  if (!s->in_flight) return 0;
  grant_slots();
  return s->has_slot ? 1 : 0;
}

int Client::priority(std::uint64_t session) {
  const Session* s = find(session);
  return s == nullptr ? 0 : s->priority;
}

int Client::session_name(std::uint64_t session, std::string_view name) {
  drive(false);
  Session* s = entry(session);
  if (s == nullptr) return fail(ENOSPC, fmt::format("tandem_session_name: {} sessions tracked already", kMaxSessions));
  s->name = std::string(name);
  if (state_ == ConnState::kConnected) {
    queue_message(ipc::build_session_name(session, name));
    if (flush_outbox()) pump_socket();
  }
  return 0;
}

// ---- runner ---------------------------------------------------------------------

int Client::session_open(std::string_view name, std::uint8_t priority_class, std::uint32_t expected_rounds,
                         std::uint64_t& ret_session) {
  drive(false);
  const std::uint64_t id = base::session_id(name);
  Session* s = find(id);
  if (s != nullptr && s->open) return fail(EEXIST, fmt::format("tandem_session_open: '{}' is already open", name));
  if (daemon_sessions_ != 0 && state_ == ConnState::kConnected) {
    // The daemon would refuse it: say so now, and keep the connection.
    std::size_t open = 0;
    for (const auto& [sid, other] : sessions_) open += other.open ? 1 : 0;
    if (open >= daemon_sessions_) {
      return fail(ENOSPC, fmt::format("tandem_session_open: {} sessions are open on this handle: tandemd's "
                                      "limits.sessions_per_client",
                                      open));
    }
  }
  if (s == nullptr) s = entry(id);
  if (s == nullptr) return fail(ENOSPC, fmt::format("tandem_session_open: {} sessions open already", kMaxSessions));
  s->open = true;
  s->refused = 0;
  s->name = std::string(name);
  ipc::SessionOpen r;
  r.priority_class = priority_class;
  r.expected_rounds = expected_rounds;
  send_record(r, id);
  if (state_ == ConnState::kConnected) {
    queue_message(ipc::build_session_name(id, name));
    if (flush_outbox()) pump_socket();
  }
  ret_session = id;
  return 0;
}

int Client::session_close(std::uint64_t session, std::uint8_t reason) {
  drive(false);
  Session* s = find(session);
  if (s == nullptr || !s->open) return fail(ENOENT, "tandem_session_close: session is not open on this handle");
  ipc::SessionClose r;
  r.reason = reason;
  send_record(r, session);
  sessions_.erase(session);
  coordinator_.session_end(session);
  drop_ahead(session);  // tandemd removes its cgroup with the session's
  reap_tools(session);  // tandemd kills what its cgroups hold; these are ours to reap
  return 0;
}

int Client::tool_begin(std::uint64_t session, std::string_view tool, std::uint32_t call, std::int32_t pid) {
  drive(false);
  Session* s = find(session);
  if (s == nullptr || !s->open) return fail(ENOENT, "tandem_tool_begin: session is not open on this handle");
  for (const ToolCall& t : s->tools) {
    if (t.call == call) return fail(EEXIST, fmt::format("tandem_tool_begin: call {} is already running", call));
  }
  if (s->tools.size() >= kMaxToolsPerSession) {
    return fail(ENOSPC, fmt::format("tandem_tool_begin: {} tool calls running already", kMaxToolsPerSession));
  }
  const std::uint64_t kind = base::tool_kind_id(tool);
  const base::Time now = clock_.now();
  s->tools.push_back(ToolCall{call, kind, base::to_ns(now)});
  ipc::ToolStart r;
  r.tool_kind = kind;
  r.tool_call = call;
  r.pid = static_cast<std::uint32_t>(pid);
  send_record(r, session);
  return 0;
}

int Client::tool_end(std::uint64_t session, std::string_view tool, std::uint32_t call, std::int32_t exit_code,
                     const tandem_tool_usage* usage) {
  drive(false);
  Session* s = find(session);
  if (s == nullptr || !s->open) return fail(ENOENT, "tandem_tool_end: session is not open on this handle");
  auto it = std::find_if(s->tools.begin(), s->tools.end(), [call](const ToolCall& t) { return t.call == call; });
  if (it == s->tools.end()) return fail(ENOENT, fmt::format("tandem_tool_end: call {} was not begun", call));
  const std::uint64_t kind = base::tool_kind_id(tool);
  if (kind != it->kind) return fail(EINVAL, "tandem_tool_end: tool_name differs from tandem_tool_begin's");
  ipc::ToolEnd r;
  r.tool_kind = kind;
  r.tool_call = call;
  r.exit_code = exit_code;
  if (usage != nullptr) {
    r.wall_ns = usage->wall_ns;
    r.cpu_ns = usage->cpu_ns;
    r.peak_memory_bytes = usage->peak_memory_bytes;
  } else {
    r.wall_ns = static_cast<std::uint64_t>(std::max<std::int64_t>(0, base::to_ns(clock_.now()) - it->started_ns));
  }
  s->tools.erase(it);
  send_record(r, session);
  return 0;
}

// ---- engine ---------------------------------------------------------------------

int Client::round_submit(std::uint64_t session, const tandem_round& round) {
  drive(false);
  Session* s = entry(session);
  if (s == nullptr) return fail(ENOSPC, fmt::format("tandem_round_submit: {} sessions tracked already", kMaxSessions));
  if (s->in_flight) {
    return fail(EBUSY, fmt::format("tandem_round_submit: round {} of this session is in flight", s->round));
  }
  s->submitted = true;
  s->in_flight = true;
  s->tool_follows = false;
  s->refused = 0;  // asked again: the daemon says again if it still refuses
  s->closed = false;
  s->round = round.round;
  s->submit_seq = ++submit_seq_;
  if (!s->admitted) waiting_.insert({s->submit_seq, session});
  ipc::RoundSubmit r;
  r.round = round.round;
  r.prompt_tokens = round.prompt_tokens;
  r.cached_tokens = round.cached_tokens;
  r.projected_blocks = round.projected_blocks;
  r.max_output_tokens = round.max_output_tokens;
  send_record(r, session);
  return 0;
}

int Client::round_first_token(std::uint64_t session, std::uint32_t round, std::uint64_t queue_delay_ns,
                              std::uint64_t prefill_ns) {
  drive(false);
  const Session* s = find(session);
  if (s == nullptr || !s->in_flight) return fail(ENOENT, "tandem_round_first_token: session has no round in flight");
  if (s->round != round) {
    return fail(EINVAL,
                fmt::format("tandem_round_first_token: round {} is not the round in flight ({})", round, s->round));
  }
  ipc::RoundFirstToken r;
  r.round = round;
  r.queue_delay_ns = queue_delay_ns;
  r.prefill_ns = prefill_ns;
  send_record(r, session);
  return 0;
}

int Client::round_end(std::uint64_t session, std::uint32_t round, std::uint32_t output_tokens,
                      std::uint32_t blocks_held, bool tool_follows) {
  drive(false);
  Session* s = find(session);
  if (s == nullptr || !s->in_flight) return fail(ENOENT, "tandem_round_end: session has no round in flight");
  if (s->round != round) {
    return fail(EINVAL, fmt::format("tandem_round_end: round {} is not the round in flight ({})", round, s->round));
  }
  s->in_flight = false;
  s->blocks_held = blocks_held;
  s->tool_follows = tool_follows;
  s->residency = blocks_held > 0 ? Residency::kResident : Residency::kNone;
  waiting_.erase({s->submit_seq, session});
  release_slot(session, *s);
  ipc::RoundEnd r;
  r.header.flags = tool_follows ? ipc::kRoundEndToolFollows : 0;
  r.round = round;
  r.output_tokens = output_tokens;
  r.blocks_held = blocks_held;
  send_record(r, session);
  maybe_forget(session);
  return 0;
}

int Client::kv_stats(const tandem_kv_stats& stats) {
  drive(false);
  ipc::KvStats r;
  r.blocks_total = stats.blocks_total;
  r.blocks_free = stats.blocks_free;
  r.blocks_pinned = stats.blocks_pinned;
  r.blocks_offloaded = stats.blocks_offloaded;
  r.running_seqs = stats.running_seqs;
  r.waiting_seqs = stats.waiting_seqs;
  r.step_tokens = stats.step_tokens;
  r.step_time_us = stats.step_time_us;
  r.block_bytes = stats.block_bytes;
  send_record(r, 0);
  return 0;
}

int Client::kv_event(std::uint64_t session, int kind, std::uint32_t blocks, std::uint32_t round) {
  drive(false);
  if (Session* s = find(session)) {
    switch (kind) {
      case TANDEM_KV_RESTORED:
        s->blocks_held += blocks;
        s->residency = Residency::kResident;
        break;
      case TANDEM_KV_OFFLOADED:
        s->residency = Residency::kOffloaded;
        break;
      default:  // evicted, dropped
        s->blocks_held -= std::min(blocks, s->blocks_held);
        if (s->blocks_held == 0) s->residency = Residency::kDropped;
        break;
    }
  }
  ipc::KvEvent r;
  r.kind = static_cast<std::uint8_t>(kind);
  r.blocks = blocks;
  r.round = round;
  send_record(r, session);
  maybe_forget(session);
  return 0;
}

int Client::kv_blocks(std::uint64_t session, const tandem_kv_blocks& blocks) {
  drive(false);
  const bool stored = blocks.op == TANDEM_KV_BLOCKS_STORED;
  bool has_parent = stored && blocks.has_parent != 0;
  std::uint64_t parent = blocks.parent_hash;
  for (std::uint32_t at = 0; at < blocks.count; at += ipc::kKvBlocksPerRecord) {
    ipc::KvBlocks r;
    r.op = static_cast<std::uint8_t>(blocks.op);
    r.medium = static_cast<std::uint8_t>(blocks.medium);
    r.count = static_cast<std::uint8_t>(std::min(ipc::kKvBlocksPerRecord, blocks.count - at));
    r.block_size = stored ? blocks.block_size : 0;
    if (has_parent) {
      r.header.flags = ipc::kKvBlocksHasParent;
      r.parent = parent;
    }
    for (std::uint32_t i = 0; i < r.count; ++i) r.hashes[i] = blocks.hashes[at + i];
    send_record(r, session);
    // The next record continues the chain from this one's last block.
    has_parent = stored;
    parent = r.hashes[r.count - 1];
  }
  return 0;
}

// ---- engine GPU plane ------------------------------------------------------------

void Client::send_gpu_records() {
  if (state_ != ConnState::kConnected) return;  // the Welcome's resync sends them
  if (gpu_partitions_) send_record(*gpu_partitions_, 0);
  for (const auto& [stage, rows] : gpu_profiles_) {
    for (const ipc::StageProfileRow& row : rows) send_record(row, 0);
  }
  for (const auto& [index, module] : weight_modules_) send_record(module, 0);
}

std::uint32_t Client::set_gpu_partitions(ipc::GpuPartitions partitions) {
  drive(false);
  if (++last_pool_id_ == 0) last_pool_id_ = 1;
  partitions.pool_id = last_pool_id_;
  gpu_partitions_ = partitions;
  send_record(partitions, 0);
  return partitions.pool_id;
}

void Client::set_gpu_profile(ipc::GpuStage stage, std::vector<ipc::StageProfileRow> rows) {
  drive(false);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    rows[i].stage = static_cast<std::uint8_t>(stage);
    rows[i].row = static_cast<std::uint8_t>(i);
    rows[i].row_count = static_cast<std::uint8_t>(rows.size());
  }
  for (const ipc::StageProfileRow& row : rows) send_record(row, 0);
  gpu_profiles_[stage] = std::move(rows);
}

void Client::set_weight_module(const ipc::WeightModule& module) {
  drive(false);
  weight_modules_[module.index] = module;
  send_record(module, 0);
}

std::optional<ipc::EngineStatus> Client::engine_status() {
  drive(false);
  if (state_ != ConnState::kConnected || !status_) return std::nullopt;
  auto status = status_->read();
  if (!status) return std::nullopt;
  return *status;
}

}  // namespace tandem::client
