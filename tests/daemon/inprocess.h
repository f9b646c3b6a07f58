// An in-process tandemd for tests and fuzz targets: a daemon::Server on
// effects of the test's choosing (RecordingEffects by default) in a
// temporary runtime dir, driven step by step with Server::run_once(), and
// clients connected through socketpairs with any credentials
// (Server::add_connection) — so a test can be "nobody" or another process
// without forking, and sees every answer in the same thread.
//
// Thread-safety: one thread.
#pragma once

#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/unique_fd.h"
#include "daemon/config.h"
#include "daemon/effects.h"
#include "daemon/log.h"
#include "daemon/server.h"
#include "ipc/channel.h"
#include "ipc/messages.h"
#include "ipc/records.h"
#include "tests/engine_info.h"

namespace tandem::testing {

class InProcessDaemon;

// The engine every in-process test registers (tests/engine_info.h).
using test_support::test_engine_info;

// Every line the daemon logs while it lives, as it would reach journald.
// Thread-safety: one thread (the logger is replaced for the process).
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    spdlog::set_default_logger(daemon::make_logger(std::make_shared<spdlog::sinks::ostream_sink_st>(out_), "debug"));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;
  std::vector<std::string> lines() const {
    std::vector<std::string> v;
    std::istringstream in(out_.str());
    for (std::string line; std::getline(in, line);) v.push_back(line);
    return v;
  }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

// One client end of a socketpair.
class InProcessClient {
 public:
  InProcessClient(InProcessDaemon* daemon, base::UniqueFd sock) : daemon_(daemon), sock_(std::move(sock)) {}

  // Sends Hello and runs the daemon until it answers; true on a Welcome
  // (the channel attached for engines and runners), false on an Error
  // (error() says which). `instance` is Hello.instance: a fresh one by
  // default, as libtandem sends; 0 for a client that predates it.
  bool hello(wire::Role role, std::string_view name, const std::optional<ipc::EngineInfo>& engine = std::nullopt,
             std::optional<std::uint64_t> instance = std::nullopt);
  // Sends one message, running the daemon while the socket is full.
  bool send(std::span<const std::uint8_t> bytes);
  // The next message the daemon sent, if any (no waiting).
  std::optional<ipc::ReceivedMessage> poll();
  // Runs the daemon until a message arrives (nullopt: none within `steps`).
  std::optional<ipc::ReceivedMessage> next(int steps = 200);
  // A ctl request and its answer (status, body); status -1 when none came.
  // `next_page` gets the cursor of the next page, if asked.
  std::pair<int, std::string> ctl(const std::string& command, const std::vector<std::string>& args = {},
                                  const std::string& cursor = "", std::string* next_page = nullptr);
  // Directives the daemon pushed on this client's ring since the last call.
  std::vector<ipc::Record> directives();
  // Pushes a record on the event ring (false: full).
  bool push(const ipc::Slot& slot) { return channel_ && events_.try_push(slot); }
  template <class T>
  bool push(const T& record, std::uint64_t session) {
    return push(ipc::encode(record, session, base::to_ns(base::MonotonicClock().now())));
  }
  // Whether the daemon closed the connection (after running it a little).
  bool closed();

  std::uint32_t id() const { return id_; }
  // Welcome.tool_ahead: the daemon takes placements ahead from this client.
  bool tool_ahead() const { return tool_ahead_; }
  int fd() const { return sock_.get(); }
  // The daemon closed the connection (seen by poll() or next()).
  bool eof() const { return eof_; }
  const std::string& error() const { return error_; }
  int error_code() const { return error_code_; }
  // Errors received since the last call (code, session, fatal).
  struct ErrorSeen {
    int code;
    std::uint64_t session;
    bool fatal;
    std::string message;
  };
  std::vector<ErrorSeen> take_errors();
  ipc::Channel* channel() { return channel_ ? &*channel_ : nullptr; }

 private:
  void note(const ipc::ReceivedMessage& m);

  InProcessDaemon* daemon_;
  base::UniqueFd sock_;
  std::uint32_t id_ = 0;
  bool tool_ahead_ = false;
  std::optional<ipc::Channel> channel_;
  ipc::RingProducer events_;
  std::optional<ipc::RingConsumer> directives_;
  std::string error_;
  int error_code_ = 0;
  std::vector<ErrorSeen> errors_;
  bool eof_ = false;
};

class InProcessDaemon {
 public:
  // `config` is TOML added to a test default (no NVML, no metrics port, a
  // 10 ms tick); `effects` defaults to a RecordingEffects of its own. An
  // empty `dir` makes a temporary runtime dir (removed at destruction).
  // `clock`: what the daemon decides by (the monotonic clock by default); a
  // test that steps a VirtualClock calls Server::tick_now() for the timer.
  explicit InProcessDaemon(const std::string& config = "", daemon::HostEffects* effects = nullptr, std::string dir = "",
                           const base::Clock* clock = nullptr)
      : owned_dir_(dir.empty()), dir_(dir.empty() ? make_dir() : std::move(dir)), clock_(clock) {
    std::string text = "[nvml]\nenabled = \"off\"\n[metrics]\nlisten = \"\"\n" + config;
    if (text.find("[policy]") == std::string::npos) text += "\n[policy]\ntick_ms = 10\n";
    auto parsed = daemon::parse_config(text, "<in-process test>");
    if (!parsed) {
      error_ = parsed.error().message();
      return;
    }
    parsed->runtime_dir = dir_;
    config_ = std::move(*parsed);
    effects_ = effects != nullptr ? effects : &recording_;
    restart();
  }
  ~InProcessDaemon() {
    server_.reset();
    if (owned_dir_) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  InProcessDaemon(const InProcessDaemon&) = delete;
  InProcessDaemon& operator=(const InProcessDaemon&) = delete;

  bool ok() const { return server_ != nullptr; }
  const std::string& error() const { return error_; }
  daemon::Server& server() { return *server_; }
  daemon::RecordingEffects& recording() { return recording_; }
  const std::string& dir() const { return dir_; }
  // The configuration the next reload (SIGHUP, tandemctl reload) applies.
  void set_reload(daemon::Config next) { next_ = std::move(next); }
  // Makes a daemon (again, in the same runtime dir: a restart, which reads
  // what the last one left there, its ownership journal).
  void restart() {
    server_.reset();
    auto compiled = daemon::CompiledConfig::compile(config_);
    if (!compiled) {
      error_ = compiled.error().message();
      return;
    }
    auto server = daemon::Server::create(
        std::move(*compiled), *effects_, notifier_, [this] { return reload(); }, clock_);
    if (!server) {
      error_ = server.error().message();
      return;
    }
    server_ = std::move(*server);
  }

  // A client with credentials `cred` (ours by default).
  InProcessClient connect(std::optional<ucred> cred = std::nullopt) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) return {this, {}};
    base::UniqueFd ours(sv[0]);
    base::UniqueFd theirs(sv[1]);
    server_->add_connection(std::move(theirs), cred.value_or(ucred{::getpid(), ::getuid(), ::getgid()}));
    return {this, std::move(ours)};
  }
  // One loop iteration, waiting at most `timeout`.
  void step(std::chrono::milliseconds timeout = std::chrono::milliseconds(1)) { (void)server_->run_once(timeout); }
  // Steps until `pred()` holds (false if it never did within `steps`).
  template <class Pred>
  bool until(Pred pred, int steps = 500) {
    for (int i = 0; i < steps; ++i) {
      if (pred()) return true;
      step();
    }
    return pred();
  }

 private:
  static std::string make_dir() {
    char tmpl[] = "/tmp/tandem-ip-XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    return p != nullptr ? p : "/tmp/tandem-ip-failed";
  }
  base::Result<daemon::Compiled> reload() { return daemon::CompiledConfig::compile(next_ ? *next_ : config_); }

  bool owned_dir_;
  std::string dir_;
  std::string error_;
  const base::Clock* clock_;
  daemon::Config config_;
  std::optional<daemon::Config> next_;
  daemon::RecordingEffects recording_;
  daemon::HostEffects* effects_ = nullptr;
  daemon::Notifier notifier_;
  std::unique_ptr<daemon::Server> server_;
};

inline void InProcessClient::note(const ipc::ReceivedMessage& m) {
  const wire::Message* msg = m.message();
  if (msg->payload_type() != wire::Payload::Error) return;
  const auto* e = msg->payload_as_Error();
  error_code_ = e->code();
  error_ = e->message() != nullptr ? e->message()->str() : "";
  errors_.push_back({e->code(), e->session(), e->fatal(), error_});
}

inline bool InProcessClient::send(std::span<const std::uint8_t> bytes) {
  for (int i = 0; i < 2000; ++i) {
    auto r = ipc::send_message(sock_.get(), bytes);
    if (r) return true;
    if (r.error().code() != EAGAIN) return false;
    while (poll()) {
    }
    daemon_->step();
  }
  return false;
}

inline std::optional<ipc::ReceivedMessage> InProcessClient::poll() {
  if (!sock_) return std::nullopt;
  auto m = ipc::recv_message(sock_.get());
  if (!m) {
    if (m.error().code() == ECONNRESET) eof_ = true;
    return std::nullopt;
  }
  note(*m);
  return std::move(*m);
}

inline std::optional<ipc::ReceivedMessage> InProcessClient::next(int steps) {
  for (int i = 0; i < steps; ++i) {
    if (auto m = poll()) return m;
    daemon_->step();
  }
  return poll();
}

inline bool InProcessClient::hello(wire::Role role, std::string_view name, const std::optional<ipc::EngineInfo>& engine,
                                   std::optional<std::uint64_t> instance) {
  static std::uint64_t next_instance = 0x7e57000000000000ull;
  if (!send(ipc::build_hello(role, name, ::getpid(), engine, instance.value_or(++next_instance)))) return false;
  for (;;) {
    auto m = next();
    if (!m) {
      error_ = "no answer to Hello";
      return false;
    }
    const wire::Message* msg = m->message();
    if (msg->payload_type() == wire::Payload::Error) return false;
    if (msg->payload_type() != wire::Payload::Welcome) continue;
    id_ = msg->payload_as_Welcome()->client_id();
    tool_ahead_ = msg->payload_as_Welcome()->tool_ahead();
    if (m->fds.size() == 3) {
      auto ch = ipc::Channel::attach(std::move(m->fds[0]), std::move(m->fds[1]), std::move(m->fds[2]));
      if (!ch) return false;
      channel_.emplace(std::move(*ch));
      auto ev = channel_->event_producer();
      if (!ev) return false;
      events_ = *ev;
    }
    return true;
  }
}

inline std::pair<int, std::string> InProcessClient::ctl(const std::string& command,
                                                        const std::vector<std::string>& args, const std::string& cursor,
                                                        std::string* next_page) {
  if (!send(ipc::build_ctl_request(command, args, true, cursor))) return {-1, "send failed"};
  for (;;) {
    auto m = next();
    if (!m) return {-1, "no answer"};
    const wire::Message* msg = m->message();
    if (msg->payload_type() != wire::Payload::CtlResponse) continue;
    const auto* r = msg->payload_as_CtlResponse();
    if (next_page != nullptr) *next_page = r->next() != nullptr ? r->next()->str() : "";
    return {r->status(), r->body() != nullptr ? r->body()->str() : ""};
  }
}

inline std::vector<ipc::Record> InProcessClient::directives() {
  std::vector<ipc::Record> out;
  if (!channel_) return out;
  if (!directives_) {
    auto c = channel_->directive_consumer();
    if (!c) return out;
    directives_ = *c;
  }
  ipc::RecordDecoder decoder{ipc::Direction::kToClient};
  ipc::Slot slot;
  while (directives_->try_pop(slot)) {
    ipc::Record r;
    if (decoder.decode(slot, r) == ipc::DecodeStatus::kOk) out.push_back(r);
  }
  return out;
}

inline bool InProcessClient::closed() {
  for (int i = 0; i < 50; ++i) {
    auto m = ipc::recv_message(sock_.get());
    if (!m && m.error().code() == ECONNRESET) return true;
    if (m) note(*m);
    daemon_->step();
  }
  return false;
}

inline std::vector<InProcessClient::ErrorSeen> InProcessClient::take_errors() {
  while (poll()) {
  }
  return std::exchange(errors_, {});
}

}  // namespace tandem::testing
