#include "daemon/server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/ids.h"
#include "base/text.h"
#include "daemon/events.h"
#include "daemon/gpu_telemetry.h"
#include "daemon/runtime_dir.h"

namespace tandem::daemon {
namespace {

using base::Time;
using sched::SessionState;

constexpr unsigned kUringEntries = 1024;
// A client must say Hello this soon after connecting.
constexpr base::Duration kHelloTimeout = std::chrono::seconds(5);
// Socket messages handled per client per wake-up before others get a turn.
constexpr int kMessagesPerWake = 64;
// Pump rounds per loop iteration: each gives every pending client one batch.
constexpr int kPumpRounds = 4;
// Bad records in one batch that mark a client as hostile.
constexpr std::uint64_t kHostileRejects = 1024;
// Directives kept for an engine whose ring is full.
constexpr std::size_t kBacklogLimit = 65536;
// A warning that could repeat (refused connections, accept failures) is
// logged at most once per interval, with a count of the ones held back.
constexpr base::Duration kQuietInterval = std::chrono::seconds(10);
// accept() failing for want of fds or memory: paused this long, doubling.
constexpr base::Duration kAcceptBackoffMin = std::chrono::milliseconds(10);
constexpr base::Duration kAcceptBackoffMax = std::chrono::seconds(1);
// Per-request Errors sent to one client in a second, at most (more are
// counted, not sent: a client over a limit would otherwise flood its socket).
constexpr std::uint32_t kErrorsPerSecond = 64;
// Sessions that ended remembered as tombstones.
constexpr std::size_t kTombstones = 16384;

base::Result<base::UniqueFd> make_timer(base::Duration tick) {
  base::UniqueFd fd(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!fd) return base::errno_error("timerfd_create");
  itimerspec spec{};
  const auto ns = tick.count();
  spec.it_interval.tv_sec = ns / 1'000'000'000;
  spec.it_interval.tv_nsec = ns % 1'000'000'000;
  spec.it_value = spec.it_interval;
  if (::timerfd_settime(fd.get(), 0, &spec, nullptr) != 0) return base::errno_error("timerfd_settime");
  return fd;
}

std::optional<Role> role_from_wire(wire::Role r) {
  switch (r) {
    case wire::Role::Engine:
      return Role::kEngine;
    case wire::Role::Runner:
      return Role::kRunner;
    case wire::Role::CtlRead:
      return Role::kCtlRead;
    case wire::Role::CtlAdmin:
      return Role::kCtlAdmin;
    default:
      return std::nullopt;
  }
}

template <class T>
ipc::Slot directive_slot(const T& record, sched::SessionId session, Time now) {
  return ipc::encode(record, session, base::to_ns(now));
}

}  // namespace

std::uint64_t TokenBucket::available(Time now) {
  if (now > last_) {
    tokens_ = std::min(rate_, tokens_ + rate_ * base::to_seconds(now - last_));
    last_ = now;
  }
  return tokens_ >= 1.0 ? static_cast<std::uint64_t>(tokens_) : 0;
}

base::Result<std::unique_ptr<Server>> Server::create(std::shared_ptr<const CompiledConfig> config, HostEffects& effects,
                                                     Notifier& notifier, ConfigLoader reload) {
  std::unique_ptr<Server> s(new Server());
  s->config_ = std::move(config);
  s->effects_ = &effects;
  effects.set_notice_sink([srv = s.get()](const ToolNotice& n) { srv->send_tool_notice(n); });
  s->notifier_ = &notifier;
  s->reload_ = std::move(reload);
  const Config& cfg = s->config_->config();

  // The runtime dir: opened once, checked, and from then on used only
  // through its fd (daemon/runtime_dir.h): nothing another user planted
  // there or above it is followed, created or chmod'ed.
  auto dir = open_runtime_dir(cfg.runtime_dir);
  if (!dir) return base::propagate(std::move(dir.error()));
  s->dir_fd_ = std::move(*dir);
  const int dfd = s->dir_fd_.get();

  // One daemon per runtime dir: the lock is held for the process's life.
  const std::string lock_path = cfg.runtime_dir + "/tandemd.lock";
  s->lock_ = base::UniqueFd(::openat(dfd, "tandemd.lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!s->lock_) {
    if (errno == ELOOP) {
      return base::make_error(
          ELOOP, fmt::format("{} is a symbolic link: tandemd does not follow it; remove it", base::escape(lock_path)));
    }
    return base::errno_error(fmt::format("open {}", base::escape(lock_path)));
  }
  struct stat lock_st {};
  if (::fstat(s->lock_.get(), &lock_st) != 0 || !S_ISREG(lock_st.st_mode) || lock_st.st_uid != ::geteuid() ||
      lock_st.st_nlink != 1) {
    return base::make_error(
        EPERM, fmt::format("{} is not a regular file of tandemd's own (one link): remove it", base::escape(lock_path)));
  }
  if (::flock(s->lock_.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return base::make_error(EADDRINUSE, fmt::format("another tandemd is running with runtime dir {} (it holds {})",
                                                      cfg.runtime_dir, lock_path));
    }
    return base::errno_error(fmt::format("flock {}", lock_path));
  }

  s->socket_path_ = cfg.runtime_dir + "/tandemd.sock";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (s->socket_path_.size() >= sizeof addr.sun_path) {
    return base::make_error(ENAMETOOLONG, fmt::format("socket path {} is longer than {} bytes (clients could not "
                                                      "connect to it)",
                                                      s->socket_path_, sizeof addr.sun_path - 1));
  }
  // Bound through our fd of the directory, not by its path; what is there
  // (a stale socket of a daemon that died — we hold the lock — or anything
  // planted) is unlinked, never followed.
  const std::string bind_path = fd_path(dfd, "tandemd.sock");
  std::memcpy(addr.sun_path, bind_path.c_str(), bind_path.size() + 1);
  if (::unlinkat(dfd, "tandemd.sock", 0) != 0 && errno != ENOENT) {
    return base::errno_error(fmt::format("remove the old {}", s->socket_path_));
  }
  s->listen_ = base::UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s->listen_) return base::errno_error("socket");
  if (::bind(s->listen_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    return base::errno_error(fmt::format("bind {}", s->socket_path_));
  }
  struct stat sock_st {};
  if (::fstatat(dfd, "tandemd.sock", &sock_st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISSOCK(sock_st.st_mode)) {
    return base::make_error(EEXIST, fmt::format("{} is not the socket tandemd bound", s->socket_path_));
  }
  s->socket_dev_ = sock_st.st_dev;
  s->socket_ino_ = sock_st.st_ino;
  // Anyone may connect; what a peer may do is decided by its SO_PEERCRED
  // against [roles] at Hello. (A socket, checked above: fchmodat does not
  // follow anything here.)
  if (::fchmodat(dfd, "tandemd.sock", 0666, 0) != 0) return base::errno_error(fmt::format("chmod {}", s->socket_path_));
  if (::listen(s->listen_.get(), 128) != 0) return base::errno_error(fmt::format("listen {}", s->socket_path_));

  // Who owned which session when a tandemd last ran here.
  auto journal = OwnerJournal::open(dfd);
  if (!journal) return base::propagate(std::move(journal.error()), "ownership journal");
  s->journal_ = std::move(*journal);

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  s->signal_fd_ = base::UniqueFd(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!s->signal_fd_) return base::errno_error("signalfd");

  auto timer = make_timer(cfg.tick);
  if (!timer) return base::propagate(std::move(timer.error()));
  s->timer_fd_ = std::move(*timer);

  auto uring = Uring::create(kUringEntries);
  if (!uring) return base::propagate(std::move(uring.error()));
  s->uring_ = std::move(*uring);

  if (auto r = s->install_policy(*s->config_); !r) return base::propagate(std::move(r.error()));
  // [nvml] enabled = "on" makes a library that does not load a start-up error.
  auto gpu_telemetry = GpuTelemetry::start(cfg.nvml);
  if (!gpu_telemetry) return base::propagate(std::move(gpu_telemetry.error()));
  s->gpu_telemetry_ = std::move(*gpu_telemetry);
  s->gpu_.configure(cfg.gpu);
  // The metrics endpoint is a convenience: a port in use costs the endpoint,
  // not the daemon (tandemctl metrics still answers, status says why).
  if (!cfg.metrics_listen.empty()) {
    auto address = parse_listen(cfg.metrics_listen);  // validated with the config
    auto endpoint = address ? MetricsEndpoint::open(*address) : std::unexpected(std::move(address.error()));
    if (endpoint) {
      s->metrics_.emplace(std::move(*endpoint));
    } else {
      s->metrics_error_ = endpoint.error().message();
      spdlog::warn("{}; serving metrics only through tandemctl metrics", s->metrics_error_);
    }
  }
  s->started_ = s->clock_.now();
  s->watchdog_usec_ = notifier.watchdog_usec();
  s->restore_owners(s->journal_.loaded(), s->started_);
  return s;
}

Server::~Server() {
  if (effects_ != nullptr) effects_->set_notice_sink(nullptr);
  // Only our own socket: a successor may have bound its own there already.
  struct stat st {};
  if (listen_ && dir_fd_ && ::fstatat(dir_fd_.get(), "tandemd.sock", &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      st.st_dev == socket_dev_ && st.st_ino == socket_ino_) {
    ::unlinkat(dir_fd_.get(), "tandemd.sock", 0);
  }
}

base::Result<void> Server::install_policy(const CompiledConfig& config) {
  auto inst = sched::make_policy(config.config().policy, config.config().policy_params);
  if (!inst) return base::propagate(std::move(inst.error()), "policy");
  policy_ = std::move(*inst);
  ++policy_epoch_;
  return {};
}

Server::Client* Server::find_client(std::uint32_t id) {
  auto it = clients_.find(id);
  return it == clients_.end() || it->second.doomed ? nullptr : &it->second;
}

// ---- the loop ----------------------------------------------------------------

template <class F>
bool Server::guarded(std::string_view what, F&& f) {
  try {
    std::forward<F>(f)();
    return true;
  } catch (const std::exception& e) {
    ++stats_.internal_errors;
    spdlog::error("internal error in {}: {} (answered as an error; tandemd goes on)", what, base::escape(e.what()));
  } catch (...) {
    ++stats_.internal_errors;
    spdlog::error("internal error in {}: an unknown exception (answered as an error; tandemd goes on)", what);
  }
  return false;
}

void Server::arm() {
  if (armed_) return;
  armed_ = true;
  uring_.accept(listen_.get(), Tag{Op::kAccept});
  accept_armed_ = true;
  for (auto& [id, o] : owners_) {
    if (o.pidfd && !o.pidfd_armed) {
      uring_.poll_in(o.pidfd.get(), Tag{Op::kOwnerPidfd, id});
      o.pidfd_armed = true;
    }
  }
  uring_.read(signal_fd_.get(), signal_buf_, sizeof(signalfd_siginfo), Tag{Op::kSignal});
  uring_.read(timer_fd_.get(), &timer_buf_, sizeof timer_buf_, Tag{Op::kTimer});
  if (effects_->event_fd() >= 0) {
    uring_.poll_in(effects_->event_fd(), Tag{Op::kHostEvents});
    host_armed_ = true;
  }
  if (metrics_) {
    metrics_->arm(uring_);
    spdlog::info("metrics on http://{}/metrics", metrics_->address());
  }
}

base::Result<void> Server::run_once(base::Duration timeout) {
  arm();
  const bool busy = std::any_of(clients_.begin(), clients_.end(), [](const auto& kv) { return kv.second.pending; });
  const auto handler = [this](Tag tag, int res) { guarded("a completion", [&] { handle(tag, res); }); };
  auto n = uring_.wait(busy ? base::Duration::zero() : timeout, handler);
  if (!n) return base::propagate(std::move(n.error()));
  guarded("the pump", [&] { pump(); });
  guarded("the sweep", [&] { sweep(); });
  return {};
}

base::Result<void> Server::run() {
  arm();
  notifier_->ready();
  if (watchdog_usec_ > 0) {
    notifier_->watchdog();
    last_watchdog_ = clock_.now();
    if (config_->config().tick >= std::chrono::microseconds(watchdog_usec_ / 2)) {
      spdlog::warn("the control tick ({} ms) is at least half the watchdog period ({} ms): pings may come late",
                   std::chrono::duration_cast<std::chrono::milliseconds>(config_->config().tick).count(),
                   watchdog_usec_ / 2000);
    }
  }
  notifier_->status(fmt::format("serving {} with policy {}", socket_path_, config_->config().policy));
  spdlog::info("listening on {} (policy {}, tick {} ms)", socket_path_, config_->config().policy,
               std::chrono::duration_cast<std::chrono::milliseconds>(config_->config().tick).count());

  while (!stopping_) {
    if (auto r = run_once(std::chrono::seconds(1)); !r) return r;
  }

  notifier_->stopping();
  spdlog::info("stopping: {} clients, {} sessions", clients_.size(), model_.sessions().size());
  for (auto& [id, c] : clients_) c.doomed = true;
  sweep();
  if (metrics_) metrics_->close_all(uring_);
  return {};
}

void Server::handle(Tag tag, int res) {
  switch (tag.op) {
    case Op::kSignal:
      if (res == static_cast<int>(sizeof(signalfd_siginfo))) on_signal();
      uring_.read(signal_fd_.get(), signal_buf_, sizeof(signalfd_siginfo), Tag{Op::kSignal});
      break;
    case Op::kTimer:
      guarded("the control tick", [&] { on_timer(); });
      uring_.read(timer_fd_.get(), &timer_buf_, sizeof timer_buf_, Tag{Op::kTimer});
      break;
    case Op::kAccept:
      accept_armed_ = false;
      if (res >= 0) {
        accept_backoff_ = base::Duration::zero();
        on_accept(res);
      } else if (res != -EINTR && res != -EAGAIN && res != -ECONNABORTED) {
        // Out of fds (EMFILE, ENFILE) or memory: a retry now fails the same
        // way, so pause accepting — connections wait in the backlog — for
        // a doubling interval, and say so once an interval.
        ++stats_.accept_errors;
        const Time now = clock_.now();
        accept_backoff_ = std::clamp<base::Duration>(accept_backoff_ * 2, kAcceptBackoffMin, kAcceptBackoffMax);
        accept_resume_ = now + accept_backoff_;
        quietly(quiet_accept_, now,
                fmt::format("accept on {}: {}; not accepting for {} ms", socket_path_, std::strerror(-res),
                            std::chrono::duration_cast<std::chrono::milliseconds>(accept_backoff_).count()));
        break;  // re-armed by the tick once accept_resume_ has passed
      }
      if (!stopping_) {
        uring_.accept(listen_.get(), Tag{Op::kAccept});
        accept_armed_ = true;
      }
      break;
    case Op::kClientSock:
      if (Client* c = find_client(tag.client)) {
        c->sock_armed = false;
        on_client_socket(*c);
      }
      break;
    case Op::kClientPidfd:
      if (Client* c = find_client(tag.client)) {
        c->pidfd_armed = false;
        if (res >= 0) {
          c->process_gone = true;
          doom(*c, "its process exited", false);
        }
      }
      break;
    case Op::kOwnerPidfd:
      if (auto it = owners_.find(tag.client); it != owners_.end()) {
        it->second.pidfd_armed = false;
        if (res >= 0) end_owner(tag.client, Closed::kOwnerGone, clock_.now());
      }
      break;
    case Op::kClientBell:
      if (Client* c = find_client(tag.client)) {
        c->bell_armed = false;
        c->event_bell.disarm();
        c->pending = true;
      }
      break;
    case Op::kHostEvents:
      host_armed_ = false;
      effects_->on_events();
      if (!stopping_ && effects_->event_fd() >= 0) {
        uring_.poll_in(effects_->event_fd(), Tag{Op::kHostEvents});
        host_armed_ = true;
      }
      break;
    case Op::kMetricsAccept:
    case Op::kMetricsConn:
      if (metrics_ && !stopping_) {
        const Time now = clock_.now();
        metrics_->on(tag, res, uring_, now, [&] { return metrics_text(now); });
      }
      break;
    case Op::kCancel:
      break;
  }
}

void Server::on_signal() {
  signalfd_siginfo info;
  std::memcpy(&info, signal_buf_, sizeof info);
  switch (info.ssi_signo) {
    case SIGHUP:
      (void)reload();  // logged either way
      break;
    case SIGTERM:
    case SIGINT:
      spdlog::info("{} received", info.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
      stopping_ = true;
      break;
    default:
      break;
  }
}

void Server::on_timer() {
  const Time now = clock_.now();
  if (metrics_) metrics_->expire(uring_, now);
  // Pings come only at ticks: ping when the next tick would be past half the
  // watchdog period, so two pings are never more than usec/2 apart.
  const auto due = std::max<base::Duration>(std::chrono::microseconds(watchdog_usec_ / 2) - config_->config().tick,
                                            base::Duration::zero());
  if (watchdog_usec_ > 0 && now - last_watchdog_ >= due) {
    notifier_->watchdog();
    last_watchdog_ = now;
  }
  if (!accept_armed_ && !stopping_ && now >= accept_resume_) {
    uring_.accept(listen_.get(), Tag{Op::kAccept});
    accept_armed_ = true;
  }
  const auto idle = std::chrono::seconds(config_->config().limits.ctl_idle_timeout_s);
  for (auto& [id, c] : clients_) {
    if (c.doomed) continue;
    if (c.phase == Phase::kHello && now - c.connected_at > kHelloTimeout) {
      doom(c, "sent no Hello within 5 s", true);
      continue;
    }
    if (c.phase == Phase::kActive && (c.role == Role::kCtlRead || c.role == Role::kCtlAdmin) &&
        now - c.last_request > idle) {
      ++stats_.ctl_idle_closed;
      doom(c, fmt::format("idle for {} s (limits.ctl_idle_timeout_s)", idle.count()), false);
      continue;
    }
    // Every ring is drained at each tick: records below a ring's wake-up
    // watermark wait for it (policies decide only at ticks), and a lost
    // wake-up (only a client's own doing) stalls it one tick at most. A
    // throttled socket is read again.
    if (c.has_channel) c.pending = true;
    if (!c.sock_armed) arm_socket(c);
  }
  pump();
  tick(clock_.now());  // the decision's time stamps the directives
}

void Server::arm_socket(Client& c) {
  uring_.poll_in(c.sock.get(), Tag{Op::kClientSock, c.id});
  c.sock_armed = true;
}

void Server::on_accept(int fd) {
  base::UniqueFd sock(fd);
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    spdlog::warn("SO_PEERCRED on a new connection: {}", std::strerror(errno));
    return;
  }
  add_connection(std::move(sock), cred);
}

void Server::quietly(Quiet& q, Time now, const std::string& text) {
  if (q.last != Time{} && now - q.last < kQuietInterval) {
    ++q.since;
    return;
  }
  if (q.since > 0) {
    spdlog::warn("{} ({} more like it in the last {} s)", text, q.since,
                 std::chrono::duration_cast<std::chrono::seconds>(kQuietInterval).count());
  } else {
    spdlog::warn("{}", text);
  }
  q.last = now;
  q.since = 0;
}

std::size_t Server::uid_load(uid_t uid, pid_t pid) const {
  std::size_t n = 0;
  for (const auto& [id, c] : clients_) n += !c.doomed && c.uid == uid ? 1 : 0;
  // Held handles count, except the connecting process's own: it may be
  // coming back for them.
  for (const auto& [id, o] : owners_) n += o.client == 0 && o.key.uid == uid && o.key.pid != pid ? 1 : 0;
  return n;
}

void Server::add_connection(base::UniqueFd sock, const ucred& cred) {
  const Limits& limits = config_->config().limits;
  const Time now = clock_.now();
  std::size_t live = 0;
  for (const auto& [id, c] : clients_) live += c.doomed ? 0 : 1;
  // Budgets by credentials, known before the peer says a word: all
  // clients; the slots kept for engines and runners, which a peer without
  // either role cannot take; and each uid's share (root and tandemd's own
  // user are trusted with more).
  const uid_t euid = ::geteuid();
  const bool serves = config_->allowed(Role::kEngine, cred.uid, cred.gid, euid) ||
                      config_->allowed(Role::kRunner, cred.uid, cred.gid, euid);
  const bool trusted = cred.uid == 0 || cred.uid == euid;
  std::string refusal;
  if (live >= limits.max_clients) {
    refusal = fmt::format("too many clients: limits.max_clients = {}", limits.max_clients);
  } else if (!serves && live >= limits.max_clients - limits.reserved()) {
    refusal = fmt::format(
        "too many clients: the last {} of limits.max_clients = {} are reserved for engines and "
        "runners (limits.reserved_clients), and uid {} is neither",
        limits.reserved(), limits.max_clients, cred.uid);
  } else if (!trusted && uid_load(cred.uid, cred.pid) >= limits.clients_per_uid) {
    refusal = fmt::format("uid {} has {} connections already: limits.clients_per_uid = {}", cred.uid,
                          uid_load(cred.uid, cred.pid), limits.clients_per_uid);
  }
  if (!refusal.empty()) {
    ++stats_.clients_refused;
    ++stats_.clients_refused_limits;
    (void)ipc::send_message(sock.get(), ipc::build_error(EAGAIN, refusal, 0, /*fatal=*/true));
    quietly(quiet_refused_, now, fmt::format("refused a connection (pid {}, uid {}): {}", cred.pid, cred.uid, refusal));
    return;
  }
  const std::uint32_t id = next_client_++;
  Client& c = clients_[id];
  c.id = id;
  c.sock = std::move(sock);
  c.pid = cred.pid;
  c.uid = cred.uid;
  c.gid = cred.gid;
  c.connected_at = now;
  c.last_request = now;
  c.message_budget = TokenBucket(limits.messages_per_s, now);
  ++stats_.clients_accepted;
  // A peer in another pid namespace shows pid 0: its socket's EOF is then
  // the only death notice.
  if (cred.pid > 0) {
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, cred.pid, 0));
    if (pidfd >= 0) {
      c.pidfd = base::UniqueFd(pidfd);
      uring_.poll_in(c.pidfd.get(), Tag{Op::kClientPidfd, id});
      c.pidfd_armed = true;
    }
  }
  arm_socket(c);
}

void Server::on_client_socket(Client& c) {
  const Time now = clock_.now();
  for (int i = 0; i < kMessagesPerWake && !c.doomed; ++i) {
    if (c.message_budget.available(now) == 0) {
      // Over its message rate: leave the rest in the socket; the tick reads on.
      if (!c.throttle_logged) {
        spdlog::warn("client {} ({}): over limits.messages_per_s = {}; throttled", c.id, c.name,
                     config_->config().limits.messages_per_s);
        c.throttle_logged = true;
      }
      return;
    }
    auto m = ipc::recv_message(c.sock.get());
    if (!m) {
      const int code = m.error().code();
      if (code == EAGAIN || code == EWOULDBLOCK) break;
      if (code == ECONNRESET) {
        // A client that closes cleanly (tandem_close) leaves its last
        // records — its sessions' closes — in the ring: take them first.
        if (c.has_channel && c.phase == Phase::kActive) {
          const std::uint32_t rounds =
              c.channel.event_slots() / std::max<std::uint32_t>(1, config_->config().limits.pump_batch) + 2;
          c.pending = true;
          for (std::uint32_t r = 0; r < rounds && !c.doomed && pump_client(c, now); ++r) {
          }
        }
        if (!c.doomed) doom(c, "closed the connection", false);
      } else {
        refuse(c, code, m.error().message());
      }
      return;
    }
    c.message_budget.take(1);
    c.last_request = now;
    ++stats_.messages;
    const wire::Message* msg = m->message();
    if (c.phase == Phase::kHello) {
      if (msg->payload_type() != wire::Payload::Hello) {
        refuse(c, EPROTO,
               fmt::format("the first message must be Hello, got {}", wire::EnumNamePayload(msg->payload_type())));
        return;
      }
      if (!guarded("Hello", [&] { on_hello(c, *msg->payload_as_Hello()); }) && !c.doomed) {
        refuse(c, EIO, "tandemd could not handle the Hello (an internal error, logged)");
      }
    } else if (!guarded(wire::EnumNamePayload(msg->payload_type()), [&] { on_message(c, *msg); }) && !c.doomed) {
      // The request failed inside tandemd, not because of the client: it is
      // told so, and stays connected.
      if (msg->payload_type() == wire::Payload::CtlRequest) {
        send_message(c, ipc::build_ctl_response(EIO, "internal error in tandemd (logged); nothing was changed"));
      } else {
        send_message(c, ipc::build_error(EIO, fmt::format("internal error in tandemd handling {} (logged)",
                                                          wire::EnumNamePayload(msg->payload_type()))));
      }
    }
  }
  if (!c.doomed) arm_socket(c);
}

void Server::send_message(Client& c, const std::vector<std::uint8_t>& bytes) {
  auto r = ipc::send_message(c.sock.get(), bytes);
  if (!r && r.error().code() != EPIPE && r.error().code() != ECONNRESET) {
    spdlog::debug("client {}: send: {}", c.id, r.error().message());
  }
}

void Server::refuse(Client& c, int code, const std::string& message) {
  send_message(c, ipc::build_error(code, message, 0, /*fatal=*/true));
  if (c.phase == Phase::kHello) ++stats_.clients_refused;
  doom(c, fmt::format("refused: {}", message), true);
}

void Server::doom(Client& c, std::string why, bool misbehaved) {
  if (c.doomed) return;
  c.doomed = true;
  c.doom_reason = std::move(why);
  c.misbehaved = misbehaved;
}

void Server::sweep() {
  const Time now = clock_.now();
  for (auto it = clients_.begin(); it != clients_.end();) {
    Client& c = it->second;
    if (!c.doomed) {
      ++it;
      continue;
    }
    const std::string who = c.phase == Phase::kActive
                                ? fmt::format("client {} ({} \"{}\", pid {})", c.id, to_string(c.role), c.name, c.pid)
                                : fmt::format("connection {} (pid {}, uid {})", c.id, c.pid, c.uid);
    if (c.misbehaved) {
      ++stats_.clients_dropped;
      spdlog::warn("{} dropped: {}", who, c.doom_reason);
    } else if (!stopping_) {
      spdlog::info("{} left: {}", who, c.doom_reason);
    }
    // An armed operation holds its file: cancel before the fds close.
    if (c.sock_armed) uring_.cancel(Tag{Op::kClientSock, c.id});
    if (c.pidfd_armed) uring_.cancel(Tag{Op::kClientPidfd, c.id});
    if (c.bell_armed) uring_.cancel(Tag{Op::kClientBell, c.id});
    if (c.phase == Phase::kActive) release_sessions(c, now);
    it = clients_.erase(it);
  }
}

void Server::release_sessions(Client& c, Time now) {
  if (stopping_) return;  // the journal keeps who owns what for the next tandemd
  if (c.role == Role::kEngine) {
    // Its rounds in flight are lost; their runners may submit them elsewhere.
    (void)model_.engine_gone(c.id, now);
    policy_.control->on_event(sched::EngineLeft{c.id}, model_, now);
    gpu_.engine_gone(c.id);
    // The sessions it opened by submitting that no runner took die with it
    // (its resync brings them back if it returns).
    std::vector<sched::SessionId> closing;
    for (const auto& [id, m] : meta_) {
      if (m.owner == 0 && m.creator == c.id) closing.push_back(id);
    }
    for (sched::SessionId id : closing) close_session(id, ipc::ToolExitReason::kKilledSession, std::nullopt, now);
    for (auto& [id, m] : meta_) {
      if (m.creator == c.id) m.creator = 0;  // no one is charged for it any more
    }
    return;
  }
  if (c.role != Role::kRunner) return;
  auto it = owners_.find(c.owner);
  if (it == owners_.end() || it->second.client != c.id) return;  // replaced by a newer connection of the handle
  Owner& o = it->second;
  o.client = 0;
  if (c.process_gone || !o.pidfd) {
    // The runner is gone (or its exit could not be watched): its sessions
    // end with it, their tools killed.
    end_owner(o.id, Closed::kOwnerGone, now);
    return;
  }
  if (o.sessions.empty()) {
    if (o.pidfd_armed) uring_.cancel(Tag{Op::kOwnerPidfd, o.id});
    owner_ids_.erase(o.key);
    owners_.erase(it);
    return;
  }
  // Only the connection ended: the runner lives, and so do its sessions and
  // their tools, held for it until it reconnects (its resync takes them
  // back) or its process exits (the pidfd).
  stats_.sessions_detached += o.sessions.size();
  for (sched::SessionId id : o.sessions) {
    if (auto m = meta_.find(id); m != meta_.end()) m->second.attached_conn = 0;
  }
  spdlog::info("runner handle of pid {} (uid {}): its {} sessions are held until it reconnects or its process exits",
               o.key.pid, o.key.uid, o.sessions.size());
}

Server::Owner& Server::owner_for(const OwnerKey& key) {
  if (auto k = owner_ids_.find(key); k != owner_ids_.end()) return owners_.at(k->second);
  const std::uint32_t id = next_owner_++;
  Owner& o = owners_[id];
  o.id = id;
  o.key = key;
  owner_ids_[key] = id;
  if (key.pid > 0) {
    base::UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_open, key.pid, 0)));
    // The pidfd is of whatever process has the pid now: it is the owner's
    // only if its start time is the owner's.
    if (fd && (key.start == 0 || process_start_time(kProcRoot, key.pid).value_or(0) == key.start)) {
      o.pidfd = std::move(fd);
      if (armed_) {
        uring_.poll_in(o.pidfd.get(), Tag{Op::kOwnerPidfd, id});
        o.pidfd_armed = true;
      }
    }
  }
  return o;
}

void Server::end_owner(std::uint32_t owner, Closed why, Time now) {
  auto it = owners_.find(owner);
  if (it == owners_.end()) return;
  const std::vector<sched::SessionId> sessions(it->second.sessions.begin(), it->second.sessions.end());
  for (sched::SessionId id : sessions) close_session(id, ipc::ToolExitReason::kKilledSession, why, now);
  it = owners_.find(owner);  // close_session may have touched the table
  if (it == owners_.end()) return;
  if (it->second.pidfd_armed) uring_.cancel(Tag{Op::kOwnerPidfd, owner});
  if (Client* c = find_client(it->second.client)) c->owner = 0;
  owner_ids_.erase(it->second.key);
  owners_.erase(it);
}

void Server::close_session(sched::SessionId id, ipc::ToolExitReason reason, std::optional<Closed> why, Time now) {
  const sched::Session* s = model_.sessions().find(id);
  if (s == nullptr || s->state == SessionState::kDone) return;
  effects_->kill_tools(id, reason);
  ++stats_.effects_kill_tools;
  (void)kill_unplaced(id);
  if (why) remember_closed(id, *why);
  (void)feed(sched::SessionClosed{id}, now);
}

void Server::remember_closed(sched::SessionId id, Closed why) {
  closed_[id] = {why, ++closed_seq_};
  closed_order_.emplace_back(id, closed_seq_);
  while (closed_order_.size() > kTombstones) {
    const auto [old, seq] = closed_order_.front();
    closed_order_.pop_front();
    if (auto c = closed_.find(old); c != closed_.end() && c->second.second == seq) closed_.erase(c);
  }
  journal_.closed(id, why);
}

std::optional<Closed> Server::tombstone(sched::SessionId id) const {
  auto c = closed_.find(id);
  if (c == closed_.end()) return std::nullopt;
  return c->second.first;
}

void Server::track_unplaced(Client& c, sched::SessionId session, std::uint32_t call, std::int32_t pid) {
  if (pid <= 0 || c.pid <= 0) return;
  auto& tools = unplaced_[session];
  if (tools.size() >= config_->config().limits.tools_per_session) return;
  for (const UnplacedTool& t : tools) {
    if (t.call == call) return;
  }
  // Only a process the runner itself started is the daemon's to kill: its
  // parent must be the runner (read after the pidfd is taken; the pidfd
  // still unsignalled afterwards means the stat was of that process).
  base::UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  bool child = false;
  if (fd) {
    const std::string path = fmt::format("{}/{}/stat", kProcRoot, pid);
    base::UniqueFd stat(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    char buf[1024];
    const ssize_t n = stat ? ::read(stat.get(), buf, sizeof buf - 1) : -1;
    pollfd p{fd.get(), POLLIN, 0};
    child = n > 0 && parse_parent_pid(std::string_view(buf, static_cast<std::size_t>(n))).value_or(0) == c.pid &&
            ::poll(&p, 1, 0) == 0;
  }
  if (!child) {
    ++stats_.unplaced_unverified;
    return;
  }
  ++stats_.unplaced_tools;
  tools.push_back(UnplacedTool{call, pid, std::move(fd)});
}

std::vector<Server::UnplacedTool> Server::kill_unplaced(sched::SessionId session) {
  auto it = unplaced_.find(session);
  if (it == unplaced_.end()) return {};
  std::vector<UnplacedTool> tools = std::move(it->second);
  unplaced_.erase(it);
  for (const UnplacedTool& t : tools) (void)::syscall(SYS_pidfd_send_signal, t.pidfd.get(), SIGKILL, nullptr, 0);
  return tools;
}

void Server::tell(Client& c, int code, std::string_view message, sched::SessionId session) {
  // A client that sent no Hello.instance predates non-fatal Errors (an
  // older libtandem drops its connection on any Error, then resyncs into the
  // same refusal): it is not told, only counted where it was refused.
  if (c.instance == 0) return;
  const Time now = clock_.now();
  if (now - c.errors_since >= std::chrono::seconds(1)) {
    c.errors_since = now;
    c.errors_sent = 0;
  }
  if (c.errors_sent >= kErrorsPerSecond) return;  // counted where it was refused; the rest are not sent
  ++c.errors_sent;
  send_message(c, ipc::build_error(code, message, session));
}

void Server::restore_owners(const JournalState& loaded, Time now) {
  for (const auto& [id, why] : loaded.closed) {
    closed_[id] = {why, ++closed_seq_};
    closed_order_.emplace_back(id, closed_seq_);
  }
  std::size_t gone = 0;
  for (const auto& [id, key] : loaded.owned) {
    Owner& o = owner_for(key);
    if (!o.pidfd) {
      // Its runner exited while no tandemd ran: the session is over.
      owner_ids_.erase(o.key);
      owners_.erase(o.id);
      remember_closed(id, Closed::kOwnerGone);
      ++gone;
      continue;
    }
    if (!feed(sched::SessionOpened{id}, now)) continue;
    SessionMeta& m = meta_[id];
    m.owner = o.id;
    o.sessions.insert(id);
    ++stats_.sessions_restored;
  }
  if (!loaded.owned.empty()) {
    spdlog::info("ownership journal: {} sessions held for their runners, {} closed (their runners exited)",
                 stats_.sessions_restored, gone);
  }
}

Server::Footprint Server::footprint() const {
  Footprint f;
  f.clients = clients_.size();
  f.sessions = model_.sessions().size();
  f.session_meta = meta_.size();
  for (const auto& [id, c] : clients_) f.pending_names += c.pending_names.size();
  f.owners = owners_.size();
  for (const auto& [id, o] : owners_) f.detached += o.client == 0 ? 1 : 0;
  f.tombstones = closed_.size();
  return f;
}

// ---- handshake and messages ---------------------------------------------------

void Server::on_hello(Client& c, const wire::Hello& hello) {
  const Config& cfg = config_->config();
  if (hello.protocol_version() != ipc::kProtocolVersion) {
    refuse(c, EPROTONOSUPPORT,
           fmt::format("protocol version {} is not supported: tandemd speaks version {}", hello.protocol_version(),
                       ipc::kProtocolVersion));
    return;
  }
  auto role = role_from_wire(hello.role());
  if (!role) {
    refuse(c, EINVAL, fmt::format("unknown role {}", static_cast<unsigned>(hello.role())));
    return;
  }
  const std::string_view name = hello.name()->string_view();
  if (auto ok = base::check_name(name, "client name"); !ok) {
    ++stats_.names_refused;
    refuse(c, ok.error().code(), ok.error().context());
    return;
  }
  if (!config_->allowed(*role, c.uid, c.gid, ::geteuid())) {
    refuse(c, EACCES,
           fmt::format("uid {} (gid {}) may not connect as {}: see [roles.{}] in {}", c.uid, c.gid, to_string(*role),
                       to_string(*role), cfg.source));
    return;
  }
  if (*role == Role::kCtlRead || *role == Role::kCtlAdmin) {
    // Readers never take the slots kept for engines and runners, whoever
    // they are.
    std::size_t ctl = 0;
    for (const auto& [id, other] : clients_) {
      ctl += !other.doomed && other.phase == Phase::kActive &&
                     (other.role == Role::kCtlRead || other.role == Role::kCtlAdmin)
                 ? 1
                 : 0;
    }
    const Limits& limits = cfg.limits;
    if (ctl >= limits.max_clients - limits.reserved()) {
      ++stats_.clients_refused_limits;
      refuse(c, EAGAIN,
             fmt::format("too many ctl clients: {} of limits.max_clients = {} ({} are kept for engines and runners: "
                         "limits.reserved_clients)",
                         ctl, limits.max_clients, limits.reserved()));
      return;
    }
  }
  c.role = *role;
  c.name = std::string(name);
  c.instance = hello.instance();
  if (c.role == Role::kEngine) {
    const wire::EngineParams* p = hello.engine();
    if (p == nullptr) {
      refuse(c, EINVAL, "an engine's Hello must carry its engine parameters");
      return;
    }
    const char* bad = p->block_size() == 0     ? "block_size"
                      : p->total_blocks() == 0 ? "total_blocks"
                      : p->max_seqs() == 0     ? "max_seqs"
                      : p->token_budget() == 0 ? "token_budget"
                                               : nullptr;
    if (bad != nullptr) {
      refuse(c, EINVAL, fmt::format("engine parameter {} must be > 0", bad));
      return;
    }
    c.engine.block_size = p->block_size();
    c.engine.total_blocks = p->total_blocks();
    c.engine.max_seqs = p->max_seqs();
    c.engine.token_budget = p->token_budget();
    if (p->max_model_len() > 0) c.engine.max_model_len = p->max_model_len();
    c.gpu_index = p->gpu_index();
    c.saturating_tokens = p->saturating_tokens();
  } else if (hello.engine() != nullptr) {
    refuse(c, EINVAL, fmt::format("only an engine's Hello carries engine parameters, not a {}'s", to_string(c.role)));
    return;
  }

  ipc::WelcomeInfo welcome;
  welcome.client_id = c.id;
  welcome.max_name = static_cast<std::uint32_t>(base::kMaxNameBytes);
  welcome.sessions_per_client = cfg.limits.sessions_per_client;
  welcome.tools_per_session = cfg.limits.tools_per_session;
  if (c.role == Role::kEngine || c.role == Role::kRunner) {
    auto channel = ipc::Channel::create(ipc::ChannelConfig{cfg.event_slots, cfg.directive_slots},
                                        fmt::format("tandem-{}-{}", to_string(c.role), c.id));
    if (!channel) {
      spdlog::error("client {}: cannot create its segment: {}", c.id, channel.error().message());
      refuse(c, channel.error().code(), "the daemon could not create the shared-memory segment");
      return;
    }
    c.channel = std::move(*channel);
    auto events = c.channel.event_consumer();
    auto directives = c.channel.directive_producer();
    auto status = c.channel.status_writer();
    if (!events || !directives || !status) {
      refuse(c, EIO, "the daemon could not set up the rings");
      return;
    }
    c.events = *events;
    c.directives = *directives;
    c.status = *status;
    c.event_bell = c.channel.event_doorbell();
    c.directive_bell = c.channel.directive_doorbell();
    c.has_channel = true;
    welcome.segment_size = c.channel.segment().layout().total_size;
    welcome.event_slots = c.channel.event_slots();
    welcome.directive_slots = c.channel.directive_slots();
  }
  const int fds[] = {c.channel.segment_fd(), c.channel.event_bell_fd(), c.channel.directive_bell_fd()};
  auto sent = ipc::send_message(c.sock.get(), ipc::build_welcome(welcome),
                                c.has_channel ? std::span<const int>(fds) : std::span<const int>());
  if (!sent) {
    doom(c, fmt::format("Welcome not delivered: {}", sent.error().message()), false);
    return;
  }
  const Time now = clock_.now();
  c.phase = Phase::kActive;
  c.record_budget = TokenBucket(cfg.limits.records_per_s, now);
  c.pending = c.has_channel;
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
      auto k = owner_ids_.find(key);
      Client* holder = k == owner_ids_.end() ? nullptr : find_client(owners_.at(k->second).client);
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
    feed(sched::EngineJoined{c.id, c.engine}, now);
    send_policy_config(c);
    publish_status(c, now);
  }
}

void Server::send_policy_config(Client& c) {
  std::vector<std::string> keys;
  std::vector<double> values;
  for (const auto& [k, v] : policy_.params.values()) {
    keys.push_back(k);
    values.push_back(v);
  }
  send_message(c, ipc::build_policy_config(policy_epoch_, config_->config().policy, keys, values));
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
    case wire::Payload::CtlRequest:
      on_ctl(c, *msg.payload_as_CtlRequest());
      break;
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
  auto it = meta_.find(id);
  if (it == meta_.end()) {
    // The name may come before the record that opens the session — but not
    // after the session ended (a runner's name trailing its close).
    if (!tombstone(id) && c.pending_names.size() < config_->config().limits.sessions_per_client) {
      c.pending_names[id] = std::string(name);
    }
    return;
  }
  // A session's name is its owner's to give (ids are hashes, and a name
  // hashing to a chosen id can be made): a runner's session takes its
  // runner's name, another client's only while it has none.
  SessionMeta& m = it->second;
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
  if (c.has_channel) {
    c.pending = true;
    const Time now = clock_.now();
    for (int round = 0; round < kPumpRounds && !c.doomed && pump_client(c, now); ++round) {
    }
    if (c.doomed) return;
  }
  // The runner's own, open session only.
  auto m = meta_.find(tp.session());
  const sched::Session* s = model_.sessions().find(tp.session());
  if (m == meta_.end() || s == nullptr || s->state == SessionState::kDone) {
    answer_error(ENOENT, fmt::format("session {:#018x} is not open", tp.session()));
    return;
  }
  if (m->second.owner != c.owner || c.owner == 0) {
    answer_error(EPERM, fmt::format("session {:#018x} belongs to another client", tp.session()));
    return;
  }
  // Every cgroup a runner makes the daemon hold is bounded: per session, and
  // over all the sessions of its handle.
  const Limits& limits = config_->config().limits;
  if (effects_->tool_cgroups(tp.session()) >= limits.tools_per_session) {
    answer_error(ENOSPC, fmt::format("session {:#018x} has {} tool cgroups already: limits.tools_per_session = {}",
                                     tp.session(), effects_->tool_cgroups(tp.session()), limits.tools_per_session));
    return;
  }
  std::size_t held = 0;
  if (auto o = owners_.find(c.owner); o != owners_.end()) {
    for (sched::SessionId id : o->second.sessions) held += effects_->tool_cgroups(id);
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
  auto m = meta_.find(n.session);
  if (m == meta_.end()) return;
  auto o = owners_.find(m->second.owner);
  Client* owner = o == owners_.end() ? nullptr : find_client(o->second.client);
  if (owner == nullptr || owner->doomed) return;
  send_message(*owner, ipc::build_tool_killed(n.session, n.call, static_cast<std::uint8_t>(n.reason), n.message));
}

void Server::on_resync(Client& c, const wire::Resync& resync) {
  ++stats_.resyncs;
  if (!c.resync_open) {
    c.resync_open = true;
    c.resync_listed.clear();
    c.resync_refused = 0;
    c.resync_problem.clear();
    c.resync_position = resync.ring_position();
  }
  const std::uint32_t limit = config_->config().limits.sessions_per_client;
  if (resync.sessions() != nullptr) {
    for (const wire::SessionSnapshot* snap : *resync.sessions()) {
      const char* why = nullptr;
      int code = EINVAL;
      bool taken = false;
      if (snap->session() == 0) {
        why = "session 0";
      } else if (c.resync_listed.size() >= limit) {
        // A snapshot lists at most what the client may hold.
        why = "more sessions than limits.sessions_per_client";
        code = ENOSPC;
      } else if (snap->state() > static_cast<std::uint8_t>(SessionState::kPaused) ||
                 snap->residency() > static_cast<std::uint8_t>(sched::Residency::kDropped)) {
        why = "not a state or residency of a live session";
      } else {
        c.resync_listed.insert(snap->session());
        taken = c.role == Role::kRunner ? resync_runner(c, *snap, &why, &code) : resync_engine(c, *snap, &why, &code);
      }
      if (taken) continue;
      ++stats_.resync_refused;
      ++c.resync_refused;
      if (c.resync_problem.empty() && why != nullptr) c.resync_problem = why;
      if (why != nullptr) {
        tell(c, code, fmt::format("Resync: session {:#018x} not taken: {}", snap->session(), why), snap->session());
      }
    }
  }
  if (resync.more()) return;
  if (c.role == Role::kRunner) finish_resync(c);
  if (c.resync_refused > 0) {
    spdlog::info("client {} ({}): resync: {} entries refused (first: {})", c.id, base::escape(c.name), c.resync_refused,
                 c.resync_problem);
  }
  c.resync_open = false;
  c.resync_listed.clear();
}

void Server::take_name(Client& c, sched::SessionId id, const flatbuffers::String* name) {
  if (name == nullptr || name->size() == 0) return;
  const std::string_view text = name->string_view();
  if (base::name_problem(text) != nullptr || base::session_id(text) != id) {
    ++stats_.names_refused;
    return;
  }
  set_name(c, id, text);
}

// A runner's entry: its own session, given back; a session no runner owns
// (an engine opened it), taken over; a new one, opened — and never another
// runner's, whoever asks first, nor one an operator killed.
bool Server::resync_runner(Client& c, const wire::SessionSnapshot& snap, const char** why, int* code) {
  const sched::SessionId id = snap.session();
  const Time now = clock_.now();
  auto& table = model_.sessions();
  const sched::Session* s = table.find(id);
  const bool live = s != nullptr && s->state != SessionState::kDone;
  auto m = meta_.find(id);
  if (live && m != meta_.end() && m->second.owner != 0 && m->second.owner != c.owner) {
    *why = "it belongs to another runner";
    *code = EPERM;
    return false;
  }
  if (!live && tombstone(id) == Closed::kKilled) {
    *why = "an operator killed it";
    *code = ECANCELED;
    return false;
  }
  const bool mine = m != meta_.end() && m->second.owner == c.owner;
  if (!mine && !admit_session(c, id)) {
    *why = nullptr;  // told already, with its own message
    return false;
  }
  if (!live) {
    if (!feed(sched::SessionOpened{id}, now)) {
      *why = "the session table refused it";
      return false;
    }
  }
  take_name(c, id, snap.name());
  SessionMeta& m2 = meta_for(c, id);
  const bool was_held = m2.owner == c.owner && m2.attached_conn != c.id;
  set_owner(c, id, m2);
  m2.attached_at = 0;
  if (was_held) ++stats_.sessions_reattached;
  s = table.find(id);
  if (snap.in_tool() && s != nullptr && s->tool == 0) feed(sched::ToolStarted{id, snap.tool_kind(), 0}, now);
  // Its tools that run without a cgroup: known by pid from here on.
  if (snap.tools() != nullptr) {
    for (const wire::ToolSnapshot* t : *snap.tools()) {
      if (t->cgroup_id() == 0) track_unplaced(c, id, t->call(), t->pid());
    }
  }
  return true;
}

// An engine's entry re-attaches its round in flight and the KV a session
// holds on it. It cannot recreate a session that ended, claim a round in
// flight on another engine, or change a runner's session beyond attaching
// its own round (whether a tool runs is the runner's word).
bool Server::resync_engine(Client& c, const wire::SessionSnapshot& snap, const char** why, int* code) {
  const sched::SessionId id = snap.session();
  const Time now = clock_.now();
  auto& table = model_.sessions();
  const auto state = static_cast<SessionState>(snap.state());
  const sched::Session* s = table.find(id);
  const bool live = s != nullptr && s->state != SessionState::kDone;
  if (!live && tombstone(id)) {
    // Its runner closed it, or an operator killed it: the engine should
    // forget it, and is told to.
    push_directive(c, directive_slot(ipc::Close{}, id, now));
    *why = "the session has ended";
    *code = ECANCELED;
    return false;
  }
  if (state == SessionState::kPaused) {
    // Paused: nothing on the engine to account for; its name, if known.
    take_name(c, id, snap.name());
    return true;
  }
  if (live && s->round_in_flight && s->engine != c.id) {
    *why = "its round is in flight on another engine";
    *code = EBUSY;
    return false;
  }
  auto m = meta_.find(id);
  const bool runners = m != meta_.end() && m->second.owner != 0;
  if (!live && !admit_session(c, id)) {
    *why = nullptr;
    return false;
  }
  take_name(c, id, snap.name());
  const bool in_flight = state == SessionState::kWaiting || state == SessionState::kReasoning;
  if (runners && !in_flight) return true;  // a runner's session between rounds: the runner says what it does
  if (in_flight || state == SessionState::kActing) {
    if (s == nullptr || !live || !s->round_in_flight) {
      feed(sched::RoundSubmitted{id, c.id, snap.round(), 0, 0, snap.blocks_held()}, now);
    }
    if (state != SessionState::kWaiting) {
      s = table.find(id);
      if (s != nullptr && s->state == SessionState::kWaiting) table.transition(id, SessionState::kReasoning, now);
    }
    if (state == SessionState::kActing) {
      feed(sched::RoundEnded{id, c.id, snap.round(), 0, snap.blocks_held(), true}, now);
    }
  }
  if (table.find(id) != nullptr) meta_for(c, id);
  return true;
}

void Server::finish_resync(Client& c) {
  // The snapshot is the runner's word on its sessions: those it holds that
  // are not in it were closed while the daemon could not hear it. Only
  // sessions the snapshot knew of are judged: held ones (attached to no
  // connection or another one of the handle's) and ones this connection
  // opened at a record before the snapshot was taken.
  auto o = owners_.find(c.owner);
  if (o == owners_.end()) return;
  std::vector<sched::SessionId> gone;
  for (sched::SessionId id : o->second.sessions) {
    if (c.resync_listed.contains(id)) continue;
    auto m = meta_.find(id);
    if (m == meta_.end()) continue;
    const bool judged = m->second.attached_conn != c.id || (c.resync_position != 0 && m->second.attached_at != 0 &&
                                                            m->second.attached_at <= c.resync_position);
    if (judged) gone.push_back(id);
  }
  const Time now = clock_.now();
  for (sched::SessionId id : gone) {
    spdlog::info("session {:#018x}: closed, its runner's resync leaves it out", id);
    close_session(id, ipc::ToolExitReason::kKilledSession, Closed::kByOwner, now);
  }
}

bool Server::admit_session(Client& c, sched::SessionId id) {
  const std::uint32_t limit = config_->config().limits.sessions_per_client;
  std::size_t held = c.sessions;
  if (c.role == Role::kRunner) {
    auto o = owners_.find(c.owner);
    held = o == owners_.end() ? 0 : o->second.sessions.size();
  }
  if (held < limit) return true;
  if (!c.limit_warned) {
    spdlog::warn("client {} ({}): at limits.sessions_per_client = {}; its new sessions are refused (each is told)",
                 c.id, base::escape(c.name), limit);
    c.limit_warned = true;
  }
  // Each refusal is answered: the client keeps its connection and knows
  // which session was not taken.
  tell(c, ENOSPC,
       fmt::format("session {:#018x} refused: limits.sessions_per_client = {}; new sessions are refused until some "
                   "close",
                   id, limit),
       id);
  return false;
}

Server::SessionMeta& Server::meta_for(Client& c, sched::SessionId id) {
  auto [it, fresh] = meta_.try_emplace(id);
  if (fresh) {
    if (c.role == Role::kRunner) {
      set_owner(c, id, it->second);
    } else {
      it->second.creator = c.id;
      ++c.sessions;
    }
    if (auto n = c.pending_names.find(id); n != c.pending_names.end()) {
      it->second.name = std::move(n->second);
      c.pending_names.erase(n);
    }
    closed_.erase(id);  // live again
  }
  return it->second;
}

void Server::set_owner(Client& c, sched::SessionId id, SessionMeta& m) {
  auto o = owners_.find(c.owner);
  if (o == owners_.end()) return;
  if (m.owner == c.owner) {
    m.attached_conn = c.id;
    return;
  }
  if (Client* creator = find_client(m.creator); creator != nullptr && creator->sessions > 0) --creator->sessions;
  m.creator = 0;
  if (auto old = owners_.find(m.owner); old != owners_.end()) old->second.sessions.erase(id);
  m.owner = c.owner;
  m.attached_conn = c.id;
  o->second.sessions.insert(id);
  journal_.owned(id, o->second.key);
}

// ---- ring pump ------------------------------------------------------------------

void Server::pump() {
  const Time now = clock_.now();
  for (int round = 0; round < kPumpRounds; ++round) {
    bool more = false;
    for (auto& [id, c] : clients_) {
      if (c.doomed || !c.pending || !c.has_channel) continue;
      more |= pump_client(c, now);
    }
    if (!more) break;
  }
  for (auto& [id, c] : clients_) {
    if (!c.doomed && c.has_channel && !c.backlog.empty()) flush_backlog(c);
  }
  ring_directive_bells();
}

bool Server::pump_client(Client& c, Time now) {
  const Limits& limits = config_->config().limits;
  const std::uint64_t allowed = std::min<std::uint64_t>(limits.pump_batch, c.record_budget.available(now));
  if (allowed == 0) {
    c.pending = false;  // over its record rate: the tick looks again
    return false;
  }
  batch_.resize(allowed);
  const std::size_t n = c.events.pop_batch(batch_);
  c.record_budget.take(n);
  c.rejected_this_round = 0;
  for (std::size_t i = 0; i < n && !c.doomed; ++i) {
    ++c.records_taken;
    ipc::Record record;
    std::string_view problem;
    const ipc::DecodeStatus st = c.decoder.decode(batch_[i], record, &problem);
    if (st != ipc::DecodeStatus::kOk) {
      reject_record(c, problem.empty() ? std::string_view("undecodable record") : problem);
      continue;
    }
    take_record(c, record, now);
  }
  if (c.doomed) return false;
  if (c.events.corruption_count() > 0) {
    doom(c, "its event ring is corrupt (indices or slot sequence numbers were tampered with)", true);
    return false;
  }
  if (c.rejected_this_round >= kHostileRejects) {
    doom(c, fmt::format("sent {} bad records in one batch", c.rejected_this_round), true);
    return false;
  }
  if ((c.channel.segment().take_flags(ipc::kFlagResyncNeeded) & ipc::kFlagResyncNeeded) != 0) {
    send_message(c, ipc::build_resync_request("events were lost: the event ring and its overflow were full"));
  }
  if (n == allowed) return true;  // more may be waiting: another round
  // Drained: announce we sleep with a watermark, re-check, and wait on the
  // doorbell. The tick drains whatever stays below the watermark.
  const std::uint32_t watermark = wake_watermark(c);
  c.event_bell.arm(watermark);
  if (c.events.available() >= watermark) {
    c.event_bell.disarm();
    return true;
  }
  c.pending = false;
  if (!c.bell_armed) {
    uring_.read(c.channel.event_bell_fd(), &c.bell_buf, sizeof c.bell_buf, Tag{Op::kClientBell, c.id});
    c.bell_armed = true;
  }
  return false;
}

void Server::reject_record(Client& c, std::string_view why) {
  ++c.rejected;
  ++c.rejected_this_round;
  ++stats_.records_rejected;
  if (!c.warned) {
    spdlog::warn("client {} ({} \"{}\"): rejected a record: {} (further rejections are only counted)", c.id,
                 to_string(c.role), c.name, why);
    c.warned = true;
  }
}

bool Server::authorize(Client& c, const ipc::Record& r, const char** why) {
  using T = ipc::RecordType;
  const T type = r.type();
  const sched::SessionId id = r.session();
  const bool gpu_record = type == T::kGpuPartitions || type == T::kStageProfile || type == T::kWeightModule;
  const bool engine_record = type == T::kRoundSubmit || type == T::kRoundFirstToken || type == T::kRoundEnd ||
                             type == T::kKvStats || type == T::kKvEvent || gpu_record;
  if (engine_record != (c.role == Role::kEngine)) {
    *why = c.role == Role::kEngine ? "an engine sent a runner's record" : "a runner sent an engine's record";
    return false;
  }
  if (type == T::kKvStats || gpu_record) return true;  // the engine's own pool and GPU: no session
  const sched::Session* s = model_.sessions().find(id);
  auto m = meta_.find(id);
  switch (type) {
    case T::kRoundSubmit:
      if (s != nullptr && s->round_in_flight && s->engine != c.id) {
        *why = "ROUND_SUBMIT: the session has a round in flight on another engine";
        return false;
      }
      if (m == meta_.end() && !admit_session(c, id)) {
        *why = "ROUND_SUBMIT: over limits.sessions_per_client";
        return false;
      }
      return true;
    case T::kRoundFirstToken:
    case T::kRoundEnd:
    case T::kKvEvent:
      if (s == nullptr || s->engine != c.id) {
        *why = "the session's round is not on this engine";
        return false;
      }
      return true;
    case T::kSessionOpen:
      if (m != meta_.end() && m->second.owner != 0 && m->second.owner != c.owner) {
        *why = "SESSION_OPEN: the session belongs to another runner";
        return false;
      }
      if ((m == meta_.end() || m->second.owner != c.owner) && !admit_session(c, id)) {
        *why = "SESSION_OPEN: over limits.sessions_per_client";
        return false;
      }
      return true;
    default:  // SESSION_CLOSE, TOOL_START, TOOL_END
      if (m == meta_.end() || s == nullptr) {
        *why = "unknown session";
        return false;
      }
      if (m->second.owner != 0 && m->second.owner != c.owner) {
        *why = "the session belongs to another runner";
        return false;
      }
      if (m->second.owner == 0 && !admit_session(c, id)) {  // taking over an engine's session: charged now
        *why = "over limits.sessions_per_client";
        return false;
      }
      return true;
  }
}

void Server::take_record(Client& c, const ipc::Record& r, Time now) {
  const char* why = "";
  if (!authorize(c, r, &why)) {
    reject_record(c, why);
    return;
  }
  if (r.type() == ipc::RecordType::kGpuPartitions || r.type() == ipc::RecordType::kStageProfile ||
      r.type() == ipc::RecordType::kWeightModule) {
    // GPU-plane state, not policy events.
    auto taken = gpu_.on_record(c.id, r);
    if (!taken) {
      reject_record(c, taken.error().context());
      return;
    }
    // A new pool: the index published for the old one means nothing until
    // the next tick chooses one for this pool.
    if (*taken) {
      c.sm_partition_set = false;
      publish_status(c, now);
    }
    ++c.accepted;
    ++stats_.records_accepted;
    return;
  }
  if (r.type() == ipc::RecordType::kKvStats) gpu_.on_kv_stats(c.id, r.as<ipc::KvStats>());
  auto event = to_event(r, c.id);
  if (!event) {
    reject_record(c, "a directive on the event ring");
    return;
  }
  if (r.type() == ipc::RecordType::kSessionOpen) {
    const sched::Session* s = model_.sessions().find(r.session());
    if (s != nullptr && s->state != SessionState::kDone) {
      // The engine's first round opened it: a runner's SESSION_OPEN and its
      // engine's ROUND_SUBMIT travel on different rings, so either may come
      // first. The runner takes the session over (authorize() checked that
      // no other runner holds it); its hints come too late for the policy,
      // which saw the session arrive with the round.
      SessionMeta& m = meta_for(c, r.session());
      if (m.owner != c.owner) log_event(now, LogKind::kSessionTakeover, r.session());
      set_owner(c, r.session(), m);
      m.attached_at = c.records_taken;
      ++c.accepted;
      ++stats_.records_accepted;
      return;
    }
  }
  count_record(r);
  // The host plane tracks tool calls whatever the scheduler makes of them
  // (a runner may run tools in a session no engine has seen).
  if (r.type() == ipc::RecordType::kToolStart) {
    const auto t = r.as<ipc::ToolStart>();
    effects_->tool_started(r.session(), t.tool_call, static_cast<std::int32_t>(t.pid));
    if (t.cgroup_id == 0) track_unplaced(c, r.session(), t.tool_call, static_cast<std::int32_t>(t.pid));
  } else if (r.type() == ipc::RecordType::kToolEnd) {
    const std::uint32_t call = r.as<ipc::ToolEnd>().tool_call;
    effects_->tool_ended(r.session(), call);
    if (auto u = unplaced_.find(r.session()); u != unplaced_.end()) {
      std::erase_if(u->second, [&](const UnplacedTool& t) { return t.call == call; });
      if (u->second.empty()) unplaced_.erase(u);
    }
  }
  if (!feed(*event, now)) {
    reject_record(c, fmt::format("{}: not legal in the session's state", ipc::record_type_name(r.type())));
    return;
  }
  ++c.accepted;
  ++stats_.records_accepted;
  if (r.type() == ipc::RecordType::kKvStats) return;
  const sched::Session* s = model_.sessions().find(r.session());
  if (s == nullptr) return;
  SessionMeta& m = meta_for(c, r.session());
  if (c.role == Role::kRunner) {
    if (m.owner != c.owner) set_owner(c, r.session(), m);  // a runner takes over an engine-opened session
    if (r.type() == ipc::RecordType::kSessionOpen) m.attached_at = c.records_taken;
  }
  if (r.type() == ipc::RecordType::kSessionClose) remember_closed(r.session(), Closed::kByOwner);
  if (r.type() == ipc::RecordType::kRoundSubmit && s->state == SessionState::kReasoning && m.told != c.id) {
    // Admitted before this round reached this engine (a runner opened it and
    // the policy admitted it, or it moved engines): the engine has not been
    // told it may run, so tell it now.
    send_directive(c.id, directive_slot(ipc::Admit{}, r.session(), now));
    m.told = c.id;
  }
}

// Counters for the metrics that the session table does not keep: KV moves
// by kind, and the tokens a round computes again because its session's
// earlier context was not served from cache (the part of the prompt that
// the session had computed before, less the engine's prefix hit).
void Server::count_record(const ipc::Record& r) {
  if (r.type() == ipc::RecordType::kKvEvent) {
    const auto e = r.as<ipc::KvEvent>();
    const std::size_t kind = e.kind - 1u;  // KvEventKind 1..4, validated by the decoder
    if (kind < stats_.kv_events.size()) {
      ++stats_.kv_events[kind];
      stats_.kv_event_blocks[kind] += e.blocks;
    }
  } else if (r.type() == ipc::RecordType::kRoundSubmit) {
    const auto rs = r.as<ipc::RoundSubmit>();
    if (const sched::Session* s = model_.sessions().find(r.session())) {
      const std::uint32_t known = std::min(rs.prompt_tokens, s->context_tokens);
      if (known > rs.cached_tokens) stats_.recomputed_tokens += known - rs.cached_tokens;
    }
  }
}

bool Server::feed(const sched::Event& e, Time now) {
  if (!model_.observe(e, now)) return false;
  policy_.control->on_event(e, model_, now);
  using L = LogKind;
  if (const auto* o = std::get_if<sched::SessionOpened>(&e)) {
    log_event(now, L::kSessionOpen, o->session);
  } else if (const auto* c = std::get_if<sched::SessionClosed>(&e)) {
    log_event(now, L::kSessionClose, c->session);
  } else if (const auto* r = std::get_if<sched::RoundSubmitted>(&e)) {
    log_event(now, L::kRoundSubmit, r->session, {r->round, r->engine, r->prompt_tokens, r->cached_tokens});
  } else if (const auto* d = std::get_if<sched::RoundEnded>(&e)) {
    log_event(now, L::kRoundEnd, d->session, {d->round, d->output_tokens, d->tool_follows});
  } else if (const auto* t = std::get_if<sched::ToolStarted>(&e)) {
    log_event(now, L::kToolStart, t->session, {t->tool_call});
  } else if (const auto* te = std::get_if<sched::ToolEnded>(&e)) {
    log_event(now, L::kToolEnd, te->session, {te->tool_call, te->exit_code, te->wall.count()});
  } else if (const auto* k = std::get_if<sched::KvChanged>(&e)) {
    log_event(now, L::kKv, k->session, {static_cast<std::int64_t>(k->change), k->blocks});
  }
  return true;
}

void Server::log_event(Time now, LogKind kind, sched::SessionId session, std::array<std::int64_t, 4> v) {
  if (events_.size() >= kEventLogSize) events_.pop_front();
  std::string name;
  if (kind == LogKind::kSessionClose || kind == LogKind::kKill) {
    if (auto m = meta_.find(session); m != meta_.end()) name = m->second.name;
  }
  events_.push_back({next_event_++, base::to_seconds(now - started_), kind, session, v, std::move(name)});
}

// ---- control ----------------------------------------------------------------------

void Server::tick(Time now) {
  const Time began = clock_.now();
  ++stats_.ticks;
  actions_.clear();
  policy_.control->tick(model_, now, actions_);
  stats_.actions += actions_.list().size();
  for (const sched::Action& a : actions_.list()) apply(a, now);
  gpu_tick(now);

  auto& table = model_.sessions();
  std::vector<sched::SessionId> done;
  for (const sched::Session* s : table.in_state(SessionState::kDone)) done.push_back(s->id);
  for (sched::SessionId id : done) session_done(id);
  table.reap_done();
  if (auto view = effects_->host_tick(now, model_)) model_.set_cpu(*view);

  for (auto& [id, c] : clients_) {
    if (!c.doomed && c.role == Role::kEngine && c.has_channel) publish_status(c, now);
  }
  ring_directive_bells();
  const double took = base::to_seconds(clock_.now() - began);
  stats_.tick_seconds += took;
  stats_.tick_seconds_max = std::max(stats_.tick_seconds_max, took);
}

void Server::gpu_tick(Time now) {
  gpu_changes_.clear();
  gpu_.tick(model_, gpu_changes_);
  for (const GpuChange& g : gpu_changes_) {
    Client* c = find_client(g.engine);
    if (c == nullptr || c->role != Role::kEngine) continue;
    if (g.sm) {
      // The policy's own path: Client.sm_partition, the effects, the count.
      apply(sched::Action{sched::ActionKind::kSetSmPartition, 0, g.engine, g.sm_partition}, now);
      log_event(now, LogKind::kSmPartition, 0, {g.engine, g.sm_partition, g.decode_sms, g.sm_dec});
    }
    if (g.offload) {
      c->offload_plan = g.offload_plan;
      c->offload_freed_bytes = g.freed_bytes;
      ++stats_.offload_plan_changes;
      log_event(now, LogKind::kOffloadPlan, 0,
                {g.engine, static_cast<std::int64_t>(g.offload_plan), static_cast<std::int64_t>(g.freed_bytes),
                 static_cast<std::int64_t>(std::min(g.pressure, 1e12) * 1000.0)});
    }
  }
}

void Server::session_done(sched::SessionId id) {
  auto m = meta_.find(id);
  if (m != meta_.end()) {
    if (Client* creator = find_client(m->second.creator); creator != nullptr && creator->sessions > 0) {
      --creator->sessions;
    }
    // The engine that ran it and its runner forget it (CLOSE): the engine
    // frees what it kept for it, and neither brings it back in a resync.
    const Time now = clock_.now();
    const ipc::Slot close = directive_slot(ipc::Close{}, id, now);
    const sched::Session* s = model_.sessions().find(id);
    if (s != nullptr && s->engine != sched::kNoEngine) {
      if (Client* e = find_client(s->engine)) push_directive(*e, close);
    }
    if (m->second.told != sched::kNoEngine && (s == nullptr || m->second.told != s->engine)) {
      if (Client* e = find_client(m->second.told)) push_directive(*e, close);
    }
    if (auto o = owners_.find(m->second.owner); o != owners_.end()) {
      o->second.sessions.erase(id);
      if (Client* r = find_client(o->second.client)) push_directive(*r, close);
      if (!tombstone(id)) journal_.closed(id, Closed::kByOwner);  // ended some other way: not owned any more
      if (o->second.client == 0 && o->second.sessions.empty()) {
        if (o->second.pidfd_armed) uring_.cancel(Tag{Op::kOwnerPidfd, o->first});
        owner_ids_.erase(o->second.key);
        owners_.erase(o);
      }
    }
    meta_.erase(m);
  }
  (void)kill_unplaced(id);
  effects_->session_gone(id);
}

void Server::apply(const sched::Action& a, Time now) {
  using K = sched::ActionKind;
  if (a.kind == K::kSetSmPartition) {
    if (Client* c = find_client(a.engine); c != nullptr && c->role == Role::kEngine) {
      c->sm_partition = static_cast<std::uint32_t>(a.value);
      c->sm_partition_set = true;
      effects_->set_sm_partition(a.engine, static_cast<std::uint32_t>(a.value));
      ++stats_.effects_sm_partition;
    }
    return;
  }
  auto& table = model_.sessions();
  const sched::Session* s = table.find(a.session);
  if (s == nullptr || s->state == SessionState::kDone) return;
  const sched::EngineId engine = s->engine;
  auto m = meta_.find(a.session);
  switch (a.kind) {
    case K::kAdmit:
      if (draining_) break;  // draining: new sessions wait (paused ones are still restored)
      if (table.transition(a.session, SessionState::kReasoning, now)) {
        log_event(now, LogKind::kAdmit, a.session, {engine});
        send_directive(engine, directive_slot(ipc::Admit{}, a.session, now));
        if (m != meta_.end()) m->second.told = engine;
      }
      break;
    case K::kPause:
      if (table.transition(a.session, SessionState::kPaused, now)) {
        log_event(now, LogKind::kPause, a.session);
        send_directive(engine, directive_slot(ipc::Pause{}, a.session, now));
        if (m != meta_.end()) m->second.told = sched::kNoEngine;
      }
      break;
    case K::kRestore:
      if (table.transition(a.session, SessionState::kReasoning, now, a.engine)) {
        log_event(now, LogKind::kRestore, a.session, {a.engine});
        ipc::Restore r;
        r.engine = a.engine;
        const ipc::Slot slot = directive_slot(r, a.session, now);
        send_directive(engine, slot);
        if (a.engine != engine) send_directive(a.engine, slot);
        if (m != meta_.end()) m->second.told = a.engine;
      }
      break;
    case K::kSetPriority: {
      ipc::Priority p;
      p.level = static_cast<std::uint8_t>(std::clamp<std::int64_t>(a.value, 0, ipc::kPriorityLevels - 1));
      if (m != meta_.end()) m->second.priority = p.level;
      send_directive(engine, directive_slot(p, a.session, now));
      break;
    }
    case K::kPin: {
      log_event(now, LogKind::kPin, a.session, {a.value - base::to_ns(now)});
      table.set_pinned(a.session, true);  // the host plane protects pinned sessions' tools
      ipc::Pin p;
      p.until_ns = std::max<std::int64_t>(a.value, 1);
      send_directive(engine, directive_slot(p, a.session, now));
      break;
    }
    case K::kUnpin:
      log_event(now, LogKind::kUnpin, a.session);
      table.set_pinned(a.session, false);
      send_directive(engine, directive_slot(ipc::Unpin{}, a.session, now));
      break;
    case K::kDrop:
      log_event(now, LogKind::kDrop, a.session);
      send_directive(engine, directive_slot(ipc::Drop{}, a.session, now));
      break;
    case K::kOffload:
      log_event(now, LogKind::kOffload, a.session);
      send_directive(engine, directive_slot(ipc::Offload{}, a.session, now));
      break;
    case K::kSetCpuWeight:
      if (m != meta_.end()) m->second.cpu_weight = a.value;
      effects_->set_cpu_weight(a.session, static_cast<std::uint32_t>(a.value));
      ++stats_.effects_cpu_weight;
      break;
    case K::kSetCpuQuota:
      if (m != meta_.end()) m->second.cpu_quota = a.value;
      effects_->set_cpu_quota(a.session, static_cast<std::uint32_t>(a.value));
      ++stats_.effects_cpu_quota;
      break;
    case K::kKillTools:
      log_event(now, LogKind::kKillTools, a.session);
      effects_->kill_tools(a.session, ipc::ToolExitReason::kKilledPolicy);
      ++stats_.effects_kill_tools;
      break;
    case K::kSetSmPartition:
      break;
  }
}

void Server::send_directive(sched::EngineId engine, const ipc::Slot& record) {
  Client* c = find_client(engine);
  if (c == nullptr || c->role != Role::kEngine) return;
  push_directive(*c, record);
}

void Server::push_directive(Client& c, const ipc::Slot& record) {
  if (c.doomed || !c.has_channel) return;
  ++stats_.directives;
  if (c.backlog.empty() && c.directives.try_push(record)) {
    c.bell_due = true;  // rung once for all of this tick's directives
    return;
  }
  if (c.backlog.size() >= kBacklogLimit) {
    ++stats_.directives_dropped;
    if (!c.backlog_warned) {
      spdlog::warn("client {} ({}): directive ring and backlog full (is it polling?); dropping directives", c.id,
                   base::escape(c.name));
      c.backlog_warned = true;
    }
    return;
  }
  c.backlog.push_back(record);
}

void Server::flush_backlog(Client& c) {
  bool pushed = false;
  while (!c.backlog.empty() && c.directives.try_push(c.backlog.front())) {
    c.backlog.pop_front();
    pushed = true;
  }
  if (pushed) c.bell_due = true;
}

void Server::ring_directive_bells() {
  for (auto& [id, c] : clients_) {
    if (!c.bell_due || c.doomed) continue;
    c.directive_bell.notify();
    c.bell_due = false;
  }
}

std::uint32_t Server::wake_watermark(const Client& c) {
  // An eighth of the ring: a client far below it waits at most one tick; one
  // that sends faster wakes the loop about eight times per ring's worth.
  return std::max<std::uint32_t>(1, c.channel.event_slots() / 8);
}

void Server::publish_status(Client& c, Time now) {
  ipc::EngineStatus st;
  st.policy_epoch = policy_epoch_;
  st.updated_ns = base::to_ns(now);
  st.sm_partition = c.sm_partition;
  st.offload_plan = c.offload_plan;
  st.offload_freed_bytes = c.offload_freed_bytes;
  if (c.sm_partition_set) {
    // The index is for the pool the daemon chose it for: an engine that
    // opened another since follows nothing until the next tick chooses.
    const EngineGpu* g = gpu_.engine(c.id);
    if (g != nullptr && g->has_pool()) {
      st.flags |= ipc::kStatusSmPartitionSet;
      st.sm_partition_pool = g->pool_id;
    }
  }
  c.status.publish(st);
}

base::Result<void> Server::reload() {
  notifier_->reloading();
  auto fresh = reload_ ? reload_() : base::Result<std::shared_ptr<const CompiledConfig>>(config_);
  base::Result<void> done;
  if (!fresh) {
    spdlog::error("reload failed; the running configuration is unchanged: {}", fresh.error().message());
    done = std::unexpected(std::move(fresh.error()));
  } else if (done = apply_config(std::move(*fresh), "reload"); !done) {
    spdlog::error("{}", done.error().message());
  }
  notifier_->ready();
  return done;
}

base::Result<void> Server::apply_config(std::shared_ptr<const CompiledConfig> fresh, std::string_view why) {
  const Config& old_cfg = config_->config();
  const Config& cfg = fresh->config();
  std::string restart_only;
  if (cfg.runtime_dir != old_cfg.runtime_dir) restart_only = "runtime_dir";
  if (cfg.event_slots != old_cfg.event_slots) restart_only = "ipc.event_slots";
  if (cfg.directive_slots != old_cfg.directive_slots) restart_only = "ipc.directive_slots";
  if (!restart_only.empty()) {
    return base::make_error(EINVAL, fmt::format("{} refused: {} changed and takes effect only at a restart; the "
                                                "running configuration is unchanged",
                                                why, restart_only));
  }
  if (!(cfg.host == old_cfg.host)) {
    spdlog::warn("{}: [cgroups], [tools], [memory] and [telemetry] changes take effect at the next restart", why);
  }
  if (cfg.metrics_listen != old_cfg.metrics_listen) {
    spdlog::warn("{}: [metrics] listen changes take effect at the next restart", why);
  }
  // [nvml]: a new mode or library starts a new sampler before anything
  // changes (with "on", one that cannot load refuses the reload); a new
  // interval is applied to the running one.
  auto gpu_telemetry = GpuTelemetry::prepare(*gpu_telemetry_, cfg.nvml);
  if (!gpu_telemetry) {
    return base::make_error(EINVAL, fmt::format("{} refused: {}; the running configuration is unchanged", why,
                                                gpu_telemetry.error().message()));
  }
  const bool policy_changed = cfg.policy != old_cfg.policy || cfg.policy_params != old_cfg.policy_params;
  if (policy_changed) {
    if (auto r = install_policy(*fresh); !r) {
      return base::make_error(
          EINVAL, fmt::format("{} failed; the running configuration is unchanged: {}", why, r.error().message()));
    }
  }
  if (cfg.tick != old_cfg.tick) {
    auto timer = make_timer(cfg.tick);
    if (!timer) {
      spdlog::error("{}: new tick timer: {}; keeping the old tick", why, timer.error().message());
    } else {
      // The armed read holds the old timer's file; it fires once more and is
      // re-armed on the new one.
      timer_fd_ = std::move(*timer);
    }
  }
  if (*gpu_telemetry) {
    gpu_telemetry_ = std::move(*gpu_telemetry);  // the old sampler's thread is joined here
  } else {
    gpu_telemetry_->apply(cfg.nvml);
  }
  if (why == "reload") policy_set_keys_.clear();  // the file again, with nothing set on top
  config_ = std::move(fresh);
  gpu_.configure(config_->config().gpu);
  if (policy_changed) {
    for (auto& [id, c] : clients_) {
      if (!c.doomed && c.role == Role::kEngine && c.phase == Phase::kActive) send_policy_config(c);
    }
  }
  spdlog::info("{}: {} (policy {}{})", why, config_->config().source, config_->config().policy,
               policy_changed ? ", changed" : "");
  return {};
}

}  // namespace tandem::daemon
