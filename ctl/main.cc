// tandemctl: asks tandemd about its state over the control socket
// (docs/architecture.md "Wire records", "Processes"; docs/tandemctl.md).
//
// One connection per invocation: Hello{CtlRead} → Welcome (or Error), then
// one CtlRequest → one CtlResponse. Every receive is bounded by SO_RCVTIMEO,
// so a wedged daemon costs at most --timeout-ms per message. What the daemon
// answers is rendered by ctl/render.h; this file holds only the command line
// and the socket.
//
// Exit codes: 0 success, 1 the daemon could not be reached or refused or
// failed the request, 2 usage error.
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/parse.h"
#include "base/unique_fd.h"
#include "ctl/render.h"
#include "ipc/messages.h"

namespace tandem::ctl {
namespace {

constexpr std::string_view kUsage = R"(usage: tandemctl [--runtime-dir DIR] [--json] [--timeout-ms N] COMMAND [ARGS]

looking (the ctl_read role: anyone by default)
  status              the daemon: version, uptime, policy, admission window, clients,
                      sessions by state, host plane (cgroups, telemetry, pressure), metrics
  engines             connected inference engines and their KV pools
  sessions            live sessions: state, engine, KV residency, priority, rounds, tool
  tools               sessions' tool cgroups: calls, processes, CPU, memory, throttled/frozen
  gpu                 GPUs from NVML: utilization, memory, clocks, power, temperature, and
                      each process's memory with the engine it belongs to
  top [--interval S] [--count N]
                      status, engines and sessions refreshed every S seconds (default 2)
  events [--follow]   the daemon's recent events (sessions, rounds, tools, KV, the policy's
                      actions, operators' commands); --follow keeps printing new ones
  metrics             the Prometheus text tandemd serves on its metrics port
  policy [get]        the running policy, its parameters and their ranges

steering (the ctl_admin role: root by default)
  policy set KEY VALUE
                      change a parameter of the running policy (or `name`, or `tick_ms`),
                      validated as a config file is; lasts until the next reload or restart
  session evict SESSION
                      drop a session's KV on its engine now (its next round recomputes it)
  session kill SESSION
                      end a session: kill every process of its tools, remove its cgroups
  drain               stop admitting new sessions; live ones go on to finish
  undrain             admit new sessions again
  reload              re-read the configuration file (as SIGHUP does) and say how it went

SESSION is a session's name or its id (16 hex digits, or 0x-prefixed).

options
  --runtime-dir DIR   where tandemd.sock lives (default: $TANDEM_RUNTIME_DIR, else /run/tandem)
  --json              print the daemon's JSON answer instead of a table (events: one object per line)
  --timeout-ms N      give up on an answer after N milliseconds (default 5000)
  -h, --help          this text

exit status
  0 success; 1 the daemon could not be reached or failed the request; 2 usage error;
  3 permission denied for this role; 4 no such session
)";

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitDenied = 3;
constexpr int kExitNotFound = 4;

struct Options {
  std::string runtime_dir;
  bool json = false;
  int timeout_ms = 5000;
  bool follow = false;      // events
  double interval_s = 2.0;  // top
  std::uint64_t count = 0;  // top: refreshes (0 = until interrupted)
  std::string command;
  std::vector<std::string> args;
};

// A failure to report: the text after "tandemctl: " and the exit code.
struct Failure {
  int exit_code;
  std::string message;
};

// Parses argv. "--opt VALUE" and "--opt=VALUE" are both accepted.
std::variant<Options, Failure> parse_args(int argc, char** argv) {
  Options o;
  if (const char* env = std::getenv("TANDEM_RUNTIME_DIR"); env != nullptr && *env != '\0') {
    o.runtime_dir = env;
  } else {
    o.runtime_dir = "/run/tandem";
  }
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::optional<std::string_view> inline_value;
    if (arg.starts_with("--")) {
      if (auto eq = arg.find('='); eq != std::string_view::npos) {
        inline_value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
      }
    }
    auto value = [&]() -> std::optional<std::string_view> {
      if (inline_value) return inline_value;
      if (i + 1 >= argc) return std::nullopt;
      return std::string_view(argv[++i]);
    };
    if (arg == "-h" || arg == "--help") {
      return Failure{kExitOk, ""};
    } else if (arg == "--json") {
      if (inline_value) return Failure{kExitUsage, "--json takes no value"};
      o.json = true;
    } else if (arg == "--runtime-dir") {
      auto v = value();
      if (!v || v->empty()) return Failure{kExitUsage, "--runtime-dir needs a directory"};
      o.runtime_dir = *v;
    } else if (arg == "--timeout-ms") {
      auto v = value();
      if (!v) return Failure{kExitUsage, "--timeout-ms needs a number of milliseconds"};
      auto n = base::parse_int<int>(*v);
      if (!n || *n <= 0) return Failure{kExitUsage, fmt::format("--timeout-ms: not a positive integer: '{}'", *v)};
      o.timeout_ms = *n;
    } else if (arg == "--follow" || arg == "-f") {
      if (inline_value) return Failure{kExitUsage, "--follow takes no value"};
      o.follow = true;
    } else if (arg == "--interval") {
      auto v = value();
      auto x = v ? base::parse_double(*v) : base::make_error(EINVAL, "");
      if (!x || *x < 0.1 || *x > 3600) {
        return Failure{kExitUsage, "--interval needs a number of seconds from 0.1 to 3600"};
      }
      o.interval_s = *x;
    } else if (arg == "--count") {
      auto v = value();
      auto n = v ? base::parse_int<std::uint64_t>(*v) : base::make_error(EINVAL, "");
      if (!n || *n == 0) return Failure{kExitUsage, "--count needs a positive integer"};
      o.count = *n;
    } else if (arg == "--") {
      for (++i; i < argc; ++i) positional.emplace_back(argv[i]);
    } else if (arg.size() > 1 && arg.starts_with('-')) {
      return Failure{kExitUsage, fmt::format("unknown option '{}'", clean(arg))};
    } else {
      positional.emplace_back(arg);
    }
  }
  if (positional.empty()) return Failure{kExitUsage, "no command given"};
  // "session evict|kill SESSION" is the daemon's session-evict|session-kill.
  if (positional[0] == "session") {
    if (positional.size() < 2 || (positional[1] != "evict" && positional[1] != "kill")) {
      return Failure{kExitUsage, "session: expected 'session evict SESSION' or 'session kill SESSION'"};
    }
    positional[0] = "session-" + positional[1];
    positional.erase(positional.begin() + 1);
  }
  const std::string& cmd = positional[0];
  if (!known_command(cmd)) return Failure{kExitUsage, fmt::format("unknown command '{}'", clean(cmd))};
  const std::size_t given = positional.size() - 1;
  if (cmd == "session-kill" || cmd == "session-evict") {
    if (given != 1) return Failure{kExitUsage, fmt::format("{}: needs one session name or id", cmd)};
  } else if (cmd == "policy") {
    const bool get = given == 0 || (given == 1 && positional[1] == "get");
    const bool set = given == 3 && positional[1] == "set";
    if (!get && !set) return Failure{kExitUsage, "policy: expected 'policy [get]' or 'policy set KEY VALUE'"};
  } else if (given != 0) {
    return Failure{kExitUsage, fmt::format("{}: unexpected argument '{}'", cmd, clean(positional[1]))};
  }
  if (o.follow && cmd != "events") return Failure{kExitUsage, "--follow goes with events"};
  o.command = cmd;
  o.args.assign(positional.begin() + 1, positional.end());
  return o;
}

// Whether `command` (with its arguments) steers: it needs ctl_admin.
bool steers(const Options& o) {
  return o.command == "session-kill" || o.command == "session-evict" || o.command == "drain" ||
         o.command == "undrain" || o.command == "reload" ||
         (o.command == "policy" && !o.args.empty() && o.args[0] == "set");
}

// Connects to the daemon's socket with send and receive timeouts set.
std::variant<base::UniqueFd, Failure> connect_daemon(const Options& o, const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return Failure{kExitUsage, fmt::format("--runtime-dir: socket path too long ({} bytes, at most {}): {}",
                                           path.size(), sizeof addr.sun_path - 1, clean(path))};
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  base::UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock) return Failure{kExitFailed, fmt::format("socket: {}", std::strerror(errno))};
  timeval tv{};
  tv.tv_sec = o.timeout_ms / 1000;
  tv.tv_usec = static_cast<suseconds_t>(o.timeout_ms % 1000) * 1000;
  if (::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      ::setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
    return Failure{kExitFailed, fmt::format("setsockopt: {}", std::strerror(errno))};
  }
  int rc = 0;
  do {
    rc = ::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    return Failure{kExitFailed,
                   fmt::format("cannot connect to {}: {} (is tandemd running?)", clean(path), std::strerror(errno))};
  }
  // Only root (tandemd) or this user (a test daemon) may answer: a socket
  // another user serves could say anything.
  ucred peer{};
  socklen_t len = sizeof peer;
  if (::getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
    return Failure{kExitFailed, fmt::format("SO_PEERCRED on {}: {}", clean(path), std::strerror(errno))};
  }
  if (peer.uid != 0 && peer.uid != ::geteuid()) {
    return Failure{kExitFailed, fmt::format("{} is served by uid {} (pid {}), not by root or this user: not asking it",
                                            clean(path), peer.uid, peer.pid)};
  }
  return sock;
}

// Receives one message; a timeout and a closed connection get their own words.
std::variant<ipc::ReceivedMessage, Failure> receive(int sock, const Options& o, const std::string& path,
                                                    std::string_view waiting_for) {
  auto got = ipc::recv_message(sock);
  if (got) return std::move(*got);
  int code = got.error().code();
  if (code == EAGAIN || code == EWOULDBLOCK) {
    return Failure{kExitFailed, fmt::format("no {} from {} within {} ms", waiting_for, clean(path), o.timeout_ms)};
  }
  if (code == ECONNRESET) {
    return Failure{kExitFailed,
                   fmt::format("{} closed the connection before sending its {}", clean(path), waiting_for)};
  }
  return Failure{kExitFailed, fmt::format("reading the {}: {}", waiting_for, got.error().message())};
}

std::string error_text(const wire::Error* e) {
  if (e->message() != nullptr && e->message()->size() > 0) return clean(e->message()->string_view());
  return std::strerror(e->code() > 0 ? e->code() : EPROTO);
}

// Pages of one answer, at most (a daemon that keeps paging is broken).
constexpr int kMaxPages = 100000;

// Adds a later page to an answer: JSON lists are joined (and the answer is
// no longer truncated), text is appended.
void merge_page(std::string& body, std::string_view page) {
  auto whole = nlohmann::json::parse(body, nullptr, false);
  auto part = nlohmann::json::parse(page, nullptr, false);
  if (whole.is_discarded() || part.is_discarded() || !whole.is_object() || !part.is_object()) {
    body.append(page);
    return;
  }
  for (auto& [key, value] : part.items()) {
    if (value.is_array() && whole.contains(key) && whole[key].is_array()) {
      for (auto& v : value) whole[key].push_back(std::move(v));
    }
  }
  whole["truncated"] = part.value("truncated", false);
  body = whole.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Asks the daemon and returns the CtlResponse body (status 0).
std::variant<std::string, Failure> ask(const Options& o) {
  std::string path = o.runtime_dir + "/tandemd.sock";
  auto connected = connect_daemon(o, path);
  if (auto* f = std::get_if<Failure>(&connected)) return std::move(*f);
  int sock = std::get<base::UniqueFd>(connected).get();

  // Steering needs ctl_admin; looking needs only ctl_read, which anyone may have.
  const wire::Role role = steers(o) ? wire::Role::CtlAdmin : wire::Role::CtlRead;
  if (auto sent = ipc::send_message(sock, ipc::build_hello(role, "tandemctl", ::getpid())); !sent) {
    return Failure{kExitFailed, fmt::format("sending hello to {}: {}", clean(path), sent.error().message())};
  }
  auto welcome = receive(sock, o, path, "welcome");
  if (auto* f = std::get_if<Failure>(&welcome)) return std::move(*f);
  const wire::Message* m = std::get<ipc::ReceivedMessage>(welcome).message();
  if (const auto* e = m->payload_as_Error())
    return Failure{e->code() == EPERM ? kExitDenied : kExitFailed, error_text(e)};
  if (m->payload_as_Welcome() == nullptr) {
    return Failure{kExitFailed, fmt::format("unexpected answer to hello from {} ({})", clean(path),
                                            wire::EnumNamePayload(m->payload_type()))};
  }

  if (auto sent = ipc::send_message(sock, ipc::build_ctl_request(o.command, o.args, o.json)); !sent) {
    return Failure{kExitFailed, fmt::format("sending the request: {}", sent.error().message())};
  }
  auto reply = receive(sock, o, path, "answer");
  if (auto* f = std::get_if<Failure>(&reply)) return std::move(*f);
  m = std::get<ipc::ReceivedMessage>(reply).message();
  if (const auto* e = m->payload_as_Error())
    return Failure{e->code() == EPERM ? kExitDenied : kExitFailed, error_text(e)};
  const auto* response = m->payload_as_CtlResponse();
  if (response == nullptr) {
    return Failure{kExitFailed, fmt::format("unexpected answer to {} from {} ({})", o.command, clean(path),
                                            wire::EnumNamePayload(m->payload_type()))};
  }
  std::string body = response->body() != nullptr ? response->body()->str() : std::string();
  if (response->status() != 0) {
    if (body.empty()) body = std::strerror(response->status() > 0 ? response->status() : EPROTO);
    const int code = response->status() == EPERM    ? kExitDenied
                     : response->status() == ENOENT ? kExitNotFound
                                                    : kExitFailed;
    return Failure{code, clean(body)};
  }
  // An answer larger than one datagram comes in pages: ask for each next
  // one on the same connection and put them together.
  std::string next = response->next() != nullptr ? response->next()->str() : std::string();
  for (int pages = 1; !next.empty(); ++pages) {
    if (pages > kMaxPages)
      return Failure{kExitFailed, fmt::format("{} answered more than {} pages", clean(path), kMaxPages)};
    if (auto sent = ipc::send_message(sock, ipc::build_ctl_request(o.command, o.args, o.json, next)); !sent) {
      return Failure{kExitFailed, fmt::format("asking for the next page: {}", sent.error().message())};
    }
    auto more = receive(sock, o, path, "next page");
    if (auto* f = std::get_if<Failure>(&more)) return std::move(*f);
    const auto* r = std::get<ipc::ReceivedMessage>(more).message()->payload_as_CtlResponse();
    if (r == nullptr || r->status() != 0) {
      return Failure{kExitFailed, fmt::format("{} failed a later page of the answer", clean(path))};
    }
    merge_page(body, r->body() != nullptr ? r->body()->string_view() : std::string_view());
    next = r->next() != nullptr ? r->next()->str() : std::string();
  }
  return body;
}

volatile std::sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

int print(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  return std::fflush(stdout) == 0 ? kExitOk : kExitFailed;
}

int fail(const Failure& f) {
  std::fprintf(stderr, "tandemctl: %s\n", f.message.c_str());
  return f.exit_code;
}

// Sleeps `seconds` in short steps; false when interrupted.
bool pause_for(double seconds) {
  for (double left = seconds; left > 0 && !g_interrupted; left -= 0.05) ::usleep(50000);
  return !g_interrupted;
}

// events: asks for what came after the last seen event; --follow asks again
// every 250 ms until interrupted or the daemon goes.
int run_events(Options o) {
  std::uint64_t since = 0;
  for (;;) {
    o.args = {std::to_string(since)};
    auto answer = ask(o);
    if (auto* f = std::get_if<Failure>(&answer)) return fail(*f);
    auto text = render_events(std::get<std::string>(answer), o.json, since);
    if (!text) return fail(Failure{kExitFailed, text.error().context()});
    if (print(*text) != kExitOk) return kExitFailed;
    if (!o.follow || !pause_for(0.25)) return kExitOk;
  }
}

// top: status, engines and sessions, the screen redrawn every interval.
int run_top(const Options& o) {
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  for (std::uint64_t n = 1;; ++n) {
    std::string screen = tty ? "\x1b[H\x1b[2J" : "";  // home, clear
    for (const char* command : {"status", "engines", "sessions"}) {
      Options one = o;
      one.command = command;
      one.args.clear();
      auto answer = ask(one);
      if (auto* f = std::get_if<Failure>(&answer)) return fail(*f);
      auto text = render_top_part(command, std::get<std::string>(answer));
      if (!text) return fail(Failure{kExitFailed, text.error().context()});
      screen += *text;
    }
    if (!tty) screen += '\n';
    if (print(screen) != kExitOk) return kExitFailed;
    if ((o.count != 0 && n >= o.count) || !pause_for(o.interval_s)) return kExitOk;
  }
}

int run(int argc, char** argv) {
  auto parsed = parse_args(argc, argv);
  if (auto* f = std::get_if<Failure>(&parsed)) {
    if (f->exit_code == kExitOk) {
      std::fwrite(kUsage.data(), 1, kUsage.size(), stdout);
    } else {
      std::fprintf(stderr, "tandemctl: %s\nrun 'tandemctl --help' for usage\n", f->message.c_str());
    }
    return f->exit_code;
  }
  const Options& o = std::get<Options>(parsed);
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  if (o.command == "events") return run_events(o);
  if (o.command == "top") return run_top(o);
  auto answer = ask(o);
  if (auto* f = std::get_if<Failure>(&answer)) return fail(*f);
  auto text = render(o.command, std::get<std::string>(answer), o.json);
  if (!text) return fail(Failure{kExitFailed, text.error().context()});
  return print(*text);
}

}  // namespace
}  // namespace tandem::ctl

int main(int argc, char** argv) {
  // Only allocation can throw here (std::bad_alloc); say so instead of aborting.
  try {
    return tandem::ctl::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandemctl: %s\n", e.what());
    return 1;
  }
}
