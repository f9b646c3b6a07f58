// tandemctl: asks tandemd about its state over the control socket
// (DESIGN.md §3, §8; docs/tandemctl.md).
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

#include "base/parse.h"
#include "base/unique_fd.h"
#include "ctl/render.h"
#include "ipc/messages.h"

namespace tandem::ctl {
namespace {

constexpr std::string_view kUsage = R"(usage: tandemctl [--runtime-dir DIR] [--json] [--timeout-ms N] COMMAND

commands
  status        the daemon: version, uptime, policy, clients, session counts
  engines       connected inference engines and their KV pools
  sessions      live sessions: state, KV residency, rounds, tools
  tools         sessions' tool cgroups: calls, processes, CPU, memory, throttled/frozen
  session-kill SESSION
                end a session (name or id): kill every process of its tools and
                remove its cgroups (needs the ctl_admin role: root by default)

options
  --runtime-dir DIR   where tandemd.sock lives (default: $TANDEM_RUNTIME_DIR, else /run/tandem)
  --json              print the daemon's JSON answer instead of a table
  --timeout-ms N      give up on an answer after N milliseconds (default 5000)
  -h, --help          this text
)";

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

struct Options {
  std::string runtime_dir;
  bool json = false;
  int timeout_ms = 5000;
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
    } else if (arg == "--") {
      for (++i; i < argc; ++i) positional.emplace_back(argv[i]);
    } else if (arg.size() > 1 && arg.starts_with('-')) {
      return Failure{kExitUsage, fmt::format("unknown option '{}'", clean(arg))};
    } else {
      positional.emplace_back(arg);
    }
  }
  if (positional.empty()) return Failure{kExitUsage, "no command given"};
  if (!known_command(positional[0])) {
    return Failure{kExitUsage, fmt::format("unknown command '{}'", clean(positional[0]))};
  }
  const std::size_t want_args = positional[0] == "session-kill" ? 1 : 0;
  if (positional.size() < want_args + 1) {
    return Failure{kExitUsage, fmt::format("{}: needs a session name or id", positional[0])};
  }
  if (positional.size() > want_args + 1) {
    return Failure{kExitUsage,
                   fmt::format("{}: unexpected argument '{}'", positional[0], clean(positional[want_args + 1]))};
  }
  o.command = positional[0];
  o.args.assign(positional.begin() + 1, positional.end());
  return o;
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

// Asks the daemon and returns the CtlResponse body (status 0).
std::variant<std::string, Failure> ask(const Options& o) {
  std::string path = o.runtime_dir + "/tandemd.sock";
  auto connected = connect_daemon(o, path);
  if (auto* f = std::get_if<Failure>(&connected)) return std::move(*f);
  int sock = std::get<base::UniqueFd>(connected).get();

  // Steering needs ctl_admin; looking needs only ctl_read, which anyone may have.
  const wire::Role role = o.command == "session-kill" ? wire::Role::CtlAdmin : wire::Role::CtlRead;
  if (auto sent = ipc::send_message(sock, ipc::build_hello(role, "tandemctl", ::getpid())); !sent) {
    return Failure{kExitFailed, fmt::format("sending hello to {}: {}", clean(path), sent.error().message())};
  }
  auto welcome = receive(sock, o, path, "welcome");
  if (auto* f = std::get_if<Failure>(&welcome)) return std::move(*f);
  const wire::Message* m = std::get<ipc::ReceivedMessage>(welcome).message();
  if (const auto* e = m->payload_as_Error()) return Failure{kExitFailed, error_text(e)};
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
  if (const auto* e = m->payload_as_Error()) return Failure{kExitFailed, error_text(e)};
  const auto* response = m->payload_as_CtlResponse();
  if (response == nullptr) {
    return Failure{kExitFailed, fmt::format("unexpected answer to {} from {} ({})", o.command, clean(path),
                                            wire::EnumNamePayload(m->payload_type()))};
  }
  std::string body = response->body() != nullptr ? response->body()->str() : std::string();
  if (response->status() != 0) {
    if (body.empty()) body = std::strerror(response->status() > 0 ? response->status() : EPROTO);
    return Failure{kExitFailed, clean(body)};
  }
  return body;
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
  auto answer = ask(o);
  if (auto* f = std::get_if<Failure>(&answer)) {
    std::fprintf(stderr, "tandemctl: %s\n", f->message.c_str());
    return f->exit_code;
  }
  auto text = render(o.command, std::get<std::string>(answer), o.json);
  if (!text) {
    std::fprintf(stderr, "tandemctl: %s\n", text.error().context().c_str());
    return kExitFailed;
  }
  std::fwrite(text->data(), 1, text->size(), stdout);
  return std::fflush(stdout) == 0 ? kExitOk : kExitFailed;
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
