#include "daemon/server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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
#include "daemon/server_parts.h"

namespace tandem::daemon {

using base::Time;

base::Result<std::unique_ptr<Server>> Server::create(Compiled config, HostEffects& effects, Notifier& notifier,
                                                     ConfigLoader reload, const base::Clock* clock) {
  std::unique_ptr<Server> s(new Server());
  if (config.config == nullptr || !config.policy.control || !config.policy.step) {
    return base::make_error(EINVAL, "tandemd: a compiled configuration without its policy (already taken)");
  }
  s->config_ = std::move(config.config);
  if (clock != nullptr) s->clock_ = clock;
  s->ctl_.emplace(static_cast<const CtlView&>(*s), static_cast<CtlCommands&>(*s), *s->clock_);
  s->effects_ = &effects;
  s->control_.emplace(effects, s->stats_, static_cast<ControlOutlet&>(*s));
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

  // Who owned which session when a tandemd last ran here, and which ended.
  auto ledger = SessionLedger::open(dfd);
  if (!ledger) return base::propagate(std::move(ledger.error()));
  s->sessions_.set_ledger(std::move(*ledger));

  // The signalfd, the tick's timer and the ring.
  if (auto loop = s->loop_.open(cfg.tick); !loop) return base::propagate(std::move(loop.error()));

  s->control_->install_policy(std::move(config.policy));
  // [nvml] enabled = "on" makes a library that does not load a start-up error.
  auto gpu_telemetry = GpuTelemetry::start(cfg.nvml);
  if (!gpu_telemetry) return base::propagate(std::move(gpu_telemetry.error()));
  s->gpu_telemetry_ = std::move(*gpu_telemetry);
  s->control_->configure_gpu(cfg.gpu);
  // The metrics endpoint is a convenience: a port in use costs the endpoint,
  // not the daemon (tandemctl metrics still answers, status says why).
  s->metrics_ = MetricsEndpoints::open(cfg.metrics_listen, cfg.metrics_allow_remote, cfg.metrics_engines);
  // KV events for routers, like the metrics endpoint, cost only themselves
  // when their socket cannot be had: logged once, said in status, and every
  // event counted as dropped.
  s->kv_events_ = KvEventsOut(cfg.kv_events);
  s->started_ = s->clock_->now();
  s->log_ = EventLog(s->started_);
  s->watchdog_usec_ = notifier.watchdog_usec();
  s->restore_owners(s->sessions_.ledger().loaded(), s->started_);
  return s;
}

Server::~Server() {
  if (effects_ != nullptr) effects_->set_notice_sink(nullptr);
  sessions_.ledger().flush();
  // Only our own socket: a successor may have bound its own there already.
  struct stat st {};
  if (listen_ && dir_fd_ && ::fstatat(dir_fd_.get(), "tandemd.sock", &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      st.st_dev == socket_dev_ && st.st_ino == socket_ino_) {
    ::unlinkat(dir_fd_.get(), "tandemd.sock", 0);
  }
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
  loop_.uring().accept(listen_.get(), Tag{Op::kAccept});
  accept_armed_ = true;
  for (auto& [id, o] : sessions_.owners()) {
    if (o.pidfd && !o.pidfd_armed) {
      loop_.uring().poll_in(o.pidfd.get(), Tag{Op::kOwnerPidfd, id});
      o.pidfd_armed = true;
    }
  }
  loop_.arm_signal();
  loop_.arm_timer();
  if (effects_->event_fd() >= 0) {
    loop_.uring().poll_in(effects_->event_fd(), Tag{Op::kHostEvents});
    host_armed_ = true;
  }
  metrics_.arm(loop_.uring());
  if (metrics_.node().endpoint) spdlog::info("metrics on http://{}/metrics", metrics_.node().endpoint->address());
  for (const auto& e : metrics_.engines()) {
    if (e.endpoint) spdlog::info("engine \"{}\" metrics on http://{}/metrics", e.name, e.endpoint->address());
  }
}

base::Result<void> Server::run_once(base::Duration timeout) {
  arm();
  const bool busy =
      std::any_of(clients_.begin(), clients_.end(), [](const auto& kv) { return kv.second.rings.pending; });
  const auto handler = [this](Tag tag, int res) { guarded("a completion", [&] { handle(tag, res); }); };
  auto n = loop_.uring().wait(busy ? base::Duration::zero() : timeout, handler);
  if (!n) return base::propagate(std::move(n.error()));
  guarded("the pump", [&] { pump(); });
  guarded("the sweep", [&] { sweep(); });
  sessions_.ledger().flush();  // what this iteration changed of who owns which session: one write
  return {};
}

base::Result<void> Server::run() {
  arm();
  notifier_->ready();
  if (watchdog_usec_ > 0) {
    notifier_->watchdog();
    last_watchdog_ = clock_->now();
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
  spdlog::info("stopping: {} clients, {} sessions", clients_.size(), control_->model().sessions().size());
  for (auto& [id, c] : clients_) c.doom.marked = true;
  sweep();
  sessions_.ledger().flush();
  metrics_.close_all(loop_.uring());
  return {};
}

void Server::handle(Tag tag, int res) {
  switch (tag.op) {
    case Op::kSignal:
      if (const int signo = loop_.signal_read(res); signo != 0) on_signal(signo);
      loop_.arm_signal();
      break;
    case Op::kTimer:
      guarded("the control tick", [&] { on_timer(); });
      loop_.arm_timer();
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
        const Time now = clock_->now();
        accept_backoff_ = std::clamp<base::Duration>(accept_backoff_ * 2, kAcceptBackoffMin, kAcceptBackoffMax);
        accept_resume_ = now + accept_backoff_;
        quietly(quiet_accept_, now,
                fmt::format("accept on {}: {}; not accepting for {} ms", socket_path_, std::strerror(-res),
                            std::chrono::duration_cast<std::chrono::milliseconds>(accept_backoff_).count()));
        break;  // re-armed by the tick once accept_resume_ has passed
      }
      if (!stopping_) {
        loop_.uring().accept(listen_.get(), Tag{Op::kAccept});
        accept_armed_ = true;
      }
      break;
    case Op::kClientSock:
      if (Client* c = find_client(tag.client)) {
        c->armed.sock = false;
        on_client_socket(*c);
      }
      break;
    case Op::kClientPidfd:
      if (Client* c = find_client(tag.client)) {
        c->armed.pidfd = false;
        if (res >= 0) {
          c->doom.process_gone = true;
          doom(*c, "its process exited", false);
        }
      }
      break;
    case Op::kOwnerPidfd:
      if (Owner* o = sessions_.owners().find(tag.client)) {
        o->pidfd_armed = false;
        if (res >= 0) end_owner(tag.client, Closed::kOwnerGone, clock_->now());
      }
      break;
    case Op::kClientBell:
      if (Client* c = find_client(tag.client)) {
        c->armed.bell = false;
        c->rings.event_bell.disarm();
        c->rings.pending = true;
      }
      break;
    case Op::kHostEvents:
      host_armed_ = false;
      effects_->on_events();
      if (!stopping_ && effects_->event_fd() >= 0) {
        loop_.uring().poll_in(effects_->event_fd(), Tag{Op::kHostEvents});
        host_armed_ = true;
      }
      break;
    case Op::kMetricsAccept:
    case Op::kMetricsConn:
      if (!stopping_) {
        const Time now = clock_->now();
        metrics_.on(tag, res, loop_.uring(), now,
                    {[&] { return ctl_->metrics_text(now); },
                     [&](std::string_view engine) { return ctl_->engine_metrics_text(engine, now); }});
      }
      break;
    case Op::kCancel:
      break;
  }
}

void Server::on_signal(int signo) {
  switch (signo) {
    case SIGHUP:
      (void)reload();  // logged either way
      break;
    case SIGTERM:
    case SIGINT:
      spdlog::info("{} received", signo == SIGTERM ? "SIGTERM" : "SIGINT");
      stopping_ = true;
      break;
    default:
      break;
  }
}

void Server::on_timer() {
  const Time now = clock_->now();
  metrics_.expire(loop_.uring(), now);
  // Pings come only at ticks: ping when the next tick would be past half the
  // watchdog period, so two pings are never more than usec/2 apart.
  const auto due = std::max<base::Duration>(std::chrono::microseconds(watchdog_usec_ / 2) - config_->config().tick,
                                            base::Duration::zero());
  if (watchdog_usec_ > 0 && now - last_watchdog_ >= due) {
    notifier_->watchdog();
    last_watchdog_ = now;
  }
  if (!accept_armed_ && !stopping_ && now >= accept_resume_) {
    loop_.uring().accept(listen_.get(), Tag{Op::kAccept});
    accept_armed_ = true;
  }
  const auto idle = std::chrono::seconds(config_->config().limits.ctl_idle_timeout_s);
  for (auto& [id, c] : clients_) {
    if (c.doomed()) continue;
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
    if (c.rings.attached) c.rings.pending = true;
    if (!c.armed.sock) arm_socket(c);
  }
  pump();
  tick(clock_->now());  // the decision's time stamps the directives
}

void Server::tick_now() {
  arm();
  guarded("the control tick", [&] { on_timer(); });
}

void Server::arm_socket(Client& c) {
  loop_.uring().poll_in(c.sock.get(), Tag{Op::kClientSock, c.id});
  c.armed.sock = true;
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

void Server::add_connection(base::UniqueFd sock, const ucred& cred) {
  const Limits& limits = config_->config().limits;
  const Time now = clock_->now();
  // Budgets by credentials, known before the peer says a word: all
  // clients; the slots kept for engines and runners, which a peer without
  // either role cannot take; and each uid's share (root and tandemd's own
  // user are trusted with more).
  const uid_t euid = ::geteuid();
  const bool serves = config_->allowed(Role::kEngine, cred.uid, cred.gid, euid) ||
                      config_->allowed(Role::kRunner, cred.uid, cred.gid, euid);
  const bool trusted = cred.uid == 0 || cred.uid == euid;
  const std::string refusal =
      clients_.refusal(limits, cred, serves, trusted, sessions_.owners().held(cred.uid, cred.pid));
  if (!refusal.empty()) {
    ++stats_.clients_refused;
    ++stats_.clients_refused_limits;
    (void)ipc::send_message(sock.get(), ipc::build_error(EAGAIN, refusal, 0, /*fatal=*/true));
    quietly(quiet_refused_, now, fmt::format("refused a connection (pid {}, uid {}): {}", cred.pid, cred.uid, refusal));
    return;
  }
  Client& c = clients_.add(std::move(sock), cred, now, limits);
  const std::uint32_t id = c.id;
  ++stats_.clients_accepted;
  // A peer in another pid namespace shows pid 0: its socket's EOF is then
  // the only death notice.
  if (cred.pid > 0) {
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, cred.pid, 0));
    if (pidfd >= 0) {
      c.pidfd = base::UniqueFd(pidfd);
      loop_.uring().poll_in(c.pidfd.get(), Tag{Op::kClientPidfd, id});
      c.armed.pidfd = true;
    }
  }
  arm_socket(c);
}

void Server::on_client_socket(Client& c) {
  const Time now = clock_->now();
  for (int i = 0; i < kMessagesPerWake && !c.doomed(); ++i) {
    if (c.budgets.messages.available(now) == 0) {
      // Over its message rate: leave the rest in the socket; the tick reads on.
      if (!c.warned.throttle) {
        spdlog::warn("client {} ({}): over limits.messages_per_s = {}; throttled", c.id, c.name,
                     config_->config().limits.messages_per_s);
        c.warned.throttle = true;
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
        if (c.rings.attached && c.phase == Phase::kActive) {
          const std::uint32_t rounds =
              c.rings.channel.event_slots() / std::max<std::uint32_t>(1, config_->config().limits.pump_batch) + 2;
          c.rings.pending = true;
          for (std::uint32_t r = 0; r < rounds && !c.doomed() && pump_client(c, now); ++r) {
          }
        }
        if (!c.doomed()) doom(c, "closed the connection", false);
      } else {
        refuse(c, code, m.error().message());
      }
      return;
    }
    c.budgets.messages.take(1);
    c.last_request = now;
    ++stats_.messages;
    const wire::Message* msg = m->message();
    if (c.phase == Phase::kHello) {
      if (msg->payload_type() != wire::Payload::Hello) {
        refuse(c, EPROTO,
               fmt::format("the first message must be Hello, got {}", wire::EnumNamePayload(msg->payload_type())));
        return;
      }
      if (!guarded("Hello", [&] { on_hello(c, *msg->payload_as_Hello()); }) && !c.doomed()) {
        refuse(c, EIO, "tandemd could not handle the Hello (an internal error, logged)");
      }
    } else if (!guarded(wire::EnumNamePayload(msg->payload_type()), [&] { on_message(c, *msg); }) && !c.doomed()) {
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
  if (!c.doomed()) arm_socket(c);
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
  if (c.doomed()) return;
  c.doom.marked = true;
  c.doom.reason = std::move(why);
  c.doom.misbehaved = misbehaved;
}

void Server::sweep() {
  const Time now = clock_->now();
  for (auto it = clients_.begin(); it != clients_.end();) {
    Client& c = it->second;
    if (!c.doomed()) {
      ++it;
      continue;
    }
    const std::string who = c.phase == Phase::kActive
                                ? fmt::format("client {} ({} \"{}\", pid {})", c.id, to_string(c.role), c.name, c.pid)
                                : fmt::format("connection {} (pid {}, uid {})", c.id, c.pid, c.uid);
    if (c.doom.misbehaved) {
      ++stats_.clients_dropped;
      spdlog::warn("{} dropped: {}", who, c.doom.reason);
    } else if (!stopping_) {
      spdlog::info("{} left: {}", who, c.doom.reason);
    }
    // An armed operation holds its file: cancel before the fds close.
    if (c.armed.sock) loop_.uring().cancel(Tag{Op::kClientSock, c.id});
    if (c.armed.pidfd) loop_.uring().cancel(Tag{Op::kClientPidfd, c.id});
    if (c.armed.bell) loop_.uring().cancel(Tag{Op::kClientBell, c.id});
    if (c.phase == Phase::kActive) release_sessions(c, now);
    if (!c.engine.kv_batch.empty()) flush_kv_events(c);  // what it reported before it went
    it = clients_.erase(it);
  }
}

}  // namespace tandem::daemon
