// The tandemctl binary end to end: usage errors exit 2 naming the argument;
// a missing daemon exits 1 naming the socket path; against a fake daemon (a
// SOCK_SEQPACKET socket in a temp dir, answering with ipc/ builders) it sends
// Hello{CtlRead} and the CtlRequest, prints the rendered answer or --json,
// and turns Error, a failed CtlResponse, silence and a hang-up into exit 1.
#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/unique_fd.h"
#include "ctl/render.h"
#include "ipc/messages.h"

extern char** environ;

namespace tandem::ctl {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSessions = R"({"sessions":[{"id":"0x00000000deadbeef","name":"s1","state":"reasoning",
  "residency":"pinned","engine":3,"owner":4,"round":2,"rounds_done":2,"blocks_held":120,"in_tool":false,"priority":0,
  "age_s":12.3,"in_state_s":1.2,"cpu_weight":null,"cpu_quota_us":null}]})";

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tandemctl-test-XXXXXX").string();
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Outcome {
  int exit_code = -1;
  pid_t pid = -1;
  std::string out;
  std::string err;
};

// Runs tandemctl with `args`; TANDEM_RUNTIME_DIR is removed from the
// environment unless `runtime_env` is given. stdout and stderr go to files in
// `scratch` (no pipes to drain, so no deadlock whatever the child prints).
Outcome run_ctl(const fs::path& scratch, const std::vector<std::string>& args,
                const std::optional<std::string>& runtime_env = std::nullopt) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string_view(*e).starts_with("TANDEM_RUNTIME_DIR=")) continue;
    env.emplace_back(*e);
  }
  if (runtime_env) env.push_back("TANDEM_RUNTIME_DIR=" + *runtime_env);
  std::vector<char*> envp;
  envp.reserve(env.size() + 1);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  std::vector<std::string> argv_s{TANDEMCTL_PATH};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(argv_s.size() + 1);
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  fs::path out = scratch / "stdout";
  fs::path err = scratch / "stderr";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  Outcome o;
  int rc = ::posix_spawn(&o.pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  EXPECT_EQ(rc, 0) << std::strerror(rc);
  if (rc != 0) return o;
  int status = 0;
  while (::waitpid(o.pid, &status, 0) < 0 && errno == EINTR) {
  }
  EXPECT_TRUE(WIFEXITED(status)) << "tandemctl died: status " << status;
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  o.out = slurp(out);
  o.err = slurp(err);
  return o;
}

// What the fake daemon saw from its one client.
struct Seen {
  bool hello = false;
  wire::Role role = wire::Role::Unknown;
  std::string name;
  int pid = 0;
  bool request = false;
  std::string command;
  std::size_t n_args = 0;
  bool json = false;
};

// A daemon stand-in: listens on <dir>/tandemd.sock and serves one client on
// a thread. `on_hello` is sent after the Hello (nothing if empty); `on_request`
// after the CtlRequest (nothing if empty: the connection is then closed).
class FakeDaemon {
 public:
  FakeDaemon(const fs::path& dir, std::vector<std::uint8_t> on_hello, std::vector<std::uint8_t> on_request,
             bool hang = false)
      : on_hello_(std::move(on_hello)), on_request_(std::move(on_request)), hang_(hang) {
    listener_ = base::UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    EXPECT_TRUE(listener_.valid()) << std::strerror(errno);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::string path = (dir / "tandemd.sock").string();
    EXPECT_LT(path.size(), sizeof addr.sun_path);
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    EXPECT_EQ(::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0)
        << std::strerror(errno);
    EXPECT_EQ(::listen(listener_.get(), 4), 0) << std::strerror(errno);
    // A client that never comes must not hang the test: accept() honours
    // SO_RCVTIMEO.
    timeval tv{10, 0};
    ::setsockopt(listener_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeDaemon() {
    if (thread_.joinable()) thread_.join();
  }
  FakeDaemon(const FakeDaemon&) = delete;
  FakeDaemon& operator=(const FakeDaemon&) = delete;

  // Waits for the client to be served; valid after that.
  const Seen& seen() {
    if (thread_.joinable()) thread_.join();
    return seen_;
  }

 private:
  void serve() {
    base::UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn) return;
    auto hello = ipc::recv_message(conn.get());
    if (!hello) return;
    if (const auto* h = hello->message()->payload_as_Hello()) {
      seen_.hello = true;
      seen_.role = h->role();
      seen_.name = h->name()->str();
      seen_.pid = h->pid();
    }
    if (hang_) {
      // Say nothing until the client gives up and closes.
      (void)ipc::recv_message(conn.get());
      return;
    }
    if (on_hello_.empty() || !ipc::send_message(conn.get(), on_hello_)) return;
    auto request = ipc::recv_message(conn.get());
    if (!request) return;
    if (const auto* r = request->message()->payload_as_CtlRequest()) {
      seen_.request = true;
      seen_.command = r->command()->str();
      seen_.n_args = r->args() != nullptr ? r->args()->size() : 0;
      seen_.json = r->json();
    }
    if (!on_request_.empty()) (void)ipc::send_message(conn.get(), on_request_);
  }

  base::UniqueFd listener_;
  std::vector<std::uint8_t> on_hello_;
  std::vector<std::uint8_t> on_request_;
  bool hang_;
  Seen seen_;
  std::thread thread_;
};

std::vector<std::uint8_t> welcome() { return ipc::build_welcome(ipc::WelcomeInfo{.client_id = 9}); }

// --- usage ----------------------------------------------------------------

struct UsageCase {
  std::vector<std::string> args;
  std::string needle;
};

TEST(TandemctlUsage, ErrorsExitTwoNamingTheArgument) {
  TempDir dir;
  const UsageCase cases[] = {
      {{}, "no command given"},
      {{"frobnicate"}, "unknown command 'frobnicate'"},
      {{"--bogus", "status"}, "unknown option '--bogus'"},
      {{"--timeout-ms", "abc", "status"}, "--timeout-ms: not a positive integer: 'abc'"},
      {{"--timeout-ms=0", "status"}, "--timeout-ms: not a positive integer: '0'"},
      {{"status", "--timeout-ms"}, "--timeout-ms needs"},
      {{"status", "--runtime-dir"}, "--runtime-dir needs"},
      {{"--json=yes", "status"}, "--json takes no value"},
      {{"sessions", "extra"}, "sessions: unexpected argument 'extra'"},
      {{"--runtime-dir", "/" + std::string(200, 'x'), "status"}, "--runtime-dir: socket path too long"},
      {{"session"}, "session: expected 'session evict SESSION' or 'session kill SESSION'"},
      {{"session", "frob", "x"}, "session: expected"},
      {{"session", "evict"}, "session-evict: needs one session name or id"},
      {{"policy", "set", "window_max"}, "policy: expected 'policy [get]' or 'policy set KEY VALUE'"},
      {{"policy", "frob"}, "policy: expected"},
      {{"drain", "now"}, "drain: unexpected argument 'now'"},
      {{"status", "--follow"}, "--follow goes with events"},
      {{"top", "--interval", "0"}, "--interval needs a number of seconds"},
      {{"top", "--count", "x"}, "--count needs a positive integer"},
  };
  for (const auto& c : cases) {
    Outcome o = run_ctl(dir.path(), c.args);
    EXPECT_EQ(o.exit_code, 2) << c.needle << "\n" << o.err;
    EXPECT_NE(o.err.find("tandemctl: " + c.needle), std::string::npos) << o.err;
    EXPECT_EQ(o.out, "");
  }
}

TEST(TandemctlUsage, HelpExitsZero) {
  TempDir dir;
  Outcome o = run_ctl(dir.path(), {"--help"});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(o.out.starts_with("usage: tandemctl")) << o.out;
  EXPECT_EQ(o.err, "");
}

// --- no daemon --------------------------------------------------------------

TEST(TandemctlConnect, MissingSocketExitsOneNamingThePath) {
  TempDir dir;
  Outcome o = run_ctl(dir.path(), {"--runtime-dir", dir.path().string(), "status"});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.err, "tandemctl: cannot connect to " + (dir.path() / "tandemd.sock").string() + ": " +
                       std::strerror(ENOENT) + " (is tandemd running?)\n");
  EXPECT_EQ(o.out, "");
}

TEST(TandemctlConnect, RuntimeDirComesFromTheEnvironment) {
  TempDir dir;
  std::string env_dir = (dir.path() / "from-env").string();
  Outcome o = run_ctl(dir.path(), {"engines"}, env_dir);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("cannot connect to " + env_dir + "/tandemd.sock"), std::string::npos) << o.err;
  // --runtime-dir wins over the environment (--opt=value form).
  Outcome o2 = run_ctl(dir.path(), {"--runtime-dir=" + dir.path().string(), "engines"}, env_dir);
  EXPECT_NE(o2.err.find("cannot connect to " + dir.path().string() + "/tandemd.sock"), std::string::npos) << o2.err;
}

// --- against a fake daemon --------------------------------------------------

TEST(TandemctlDaemon, SessionsTableEndToEnd) {
  TempDir dir;
  FakeDaemon daemon(dir.path(), welcome(), ipc::build_ctl_response(0, kSessions));
  Outcome o = run_ctl(dir.path(), {"--runtime-dir", dir.path().string(), "sessions"});
  const Seen& seen = daemon.seen();
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.err, "");
  auto expected = render("sessions", kSessions, false);
  ASSERT_TRUE(expected);
  EXPECT_EQ(o.out, *expected);
  EXPECT_NE(o.out.find("00000000deadbeef  s1    reasoning"), std::string::npos) << o.out;

  EXPECT_TRUE(seen.hello);
  EXPECT_EQ(seen.role, wire::Role::CtlRead);
  EXPECT_EQ(seen.name, "tandemctl");
  EXPECT_EQ(seen.pid, o.pid);
  EXPECT_TRUE(seen.request);
  EXPECT_EQ(seen.command, "sessions");
  EXPECT_EQ(seen.n_args, 0u);
  EXPECT_FALSE(seen.json);
}

TEST(TandemctlDaemon, JsonPrintsTheBodyPrettyPrinted) {
  TempDir dir;
  FakeDaemon daemon(dir.path(), welcome(), ipc::build_ctl_response(0, R"({"engines":[{"id":3,"name":"emu-0"}]})"));
  Outcome o = run_ctl(dir.path(), {"--json", "--runtime-dir", dir.path().string(), "engines"});
  EXPECT_TRUE(daemon.seen().json);
  EXPECT_EQ(daemon.seen().command, "engines");
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "{\n  \"engines\": [\n    {\n      \"id\": 3,\n      \"name\": \"emu-0\"\n    }\n  ]\n}\n");
}

TEST(TandemctlDaemon, ErrorToHelloExitsOneWithItsMessage) {
  TempDir dir;
  FakeDaemon daemon(dir.path(), ipc::build_error(EACCES, "uid 1000 may not use role ctl_read"), {});
  Outcome o = run_ctl(dir.path(), {"--runtime-dir", dir.path().string(), "status"});
  EXPECT_TRUE(daemon.seen().hello);
  EXPECT_FALSE(daemon.seen().request);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.err, "tandemctl: uid 1000 may not use role ctl_read\n");
  EXPECT_EQ(o.out, "");
}

TEST(TandemctlDaemon, FailedRequestExitsOneWithTheBody) {
  TempDir dir;
  FakeDaemon daemon(dir.path(), welcome(), ipc::build_ctl_response(ENOSYS, "status: not implemented yet"));
  Outcome o = run_ctl(dir.path(), {"--runtime-dir", dir.path().string(), "status"});
  EXPECT_EQ(daemon.seen().command, "status");
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.err, "tandemctl: status: not implemented yet\n");
}

TEST(TandemctlDaemon, SteeringAsksForTheAdminRoleAndDenialExitsThree) {
  struct Case {
    std::vector<std::string> args;
    std::string command;
    wire::Role role;
  };
  const Case cases[] = {
      {{"session", "evict", "a1"}, "session-evict", wire::Role::CtlAdmin},
      {{"session", "kill", "a1"}, "session-kill", wire::Role::CtlAdmin},
      {{"drain"}, "drain", wire::Role::CtlAdmin},
      {{"undrain"}, "undrain", wire::Role::CtlAdmin},
      {{"reload"}, "reload", wire::Role::CtlAdmin},
      {{"policy", "set", "window_max", "8"}, "policy", wire::Role::CtlAdmin},
      {{"policy"}, "policy", wire::Role::CtlRead},
      {{"metrics"}, "metrics", wire::Role::CtlRead},
  };
  for (const Case& c : cases) {
    TempDir dir;
    FakeDaemon daemon(dir.path(), welcome(), ipc::build_ctl_response(EPERM, c.command + " needs the ctl_admin role"));
    std::vector<std::string> args = {"--runtime-dir", dir.path().string()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    Outcome o = run_ctl(dir.path(), args);
    EXPECT_EQ(daemon.seen().command, c.command);
    EXPECT_EQ(daemon.seen().role, c.role) << c.command;
    EXPECT_EQ(o.exit_code, 3) << c.command << o.err;
    EXPECT_EQ(o.err, "tandemctl: " + c.command + " needs the ctl_admin role\n");
  }
}

TEST(TandemctlDaemon, UnknownSessionExitsFour) {
  TempDir dir;
  FakeDaemon daemon(dir.path(), welcome(), ipc::build_ctl_response(ENOENT, "no live session \"x\""));
  Outcome o = run_ctl(dir.path(), {"--runtime-dir", dir.path().string(), "session", "kill", "x"});
  EXPECT_EQ(o.exit_code, 4);
  EXPECT_EQ(o.err, "tandemctl: no live session \"x\"\n");
}

TEST(TandemctlDaemon, MetricsPrintsTheTextAsItComes) {
  TempDir dir;
  const std::string text = "# HELP tandem_up x\n# TYPE tandem_up gauge\ntandem_up 1\n";
  FakeDaemon daemon(dir.path(), welcome(), ipc::build_ctl_response(0, text));
  Outcome o = run_ctl(dir.path(), {"--runtime-dir", dir.path().string(), "--json", "metrics"});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, text);
}

TEST(TandemctlDaemon, BadJsonExitsOne) {
  TempDir dir;
  FakeDaemon daemon(dir.path(), welcome(), ipc::build_ctl_response(0, "{\"sessions\": ["));
  Outcome o = run_ctl(dir.path(), {"--runtime-dir", dir.path().string(), "sessions"});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("not valid JSON"), std::string::npos) << o.err;
}

TEST(TandemctlDaemon, SilentDaemonTimesOut) {
  TempDir dir;
  FakeDaemon daemon(dir.path(), {}, {}, /*hang=*/true);
  Outcome o = run_ctl(dir.path(), {"--timeout-ms", "200", "--runtime-dir", dir.path().string(), "status"});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("no welcome from " + (dir.path() / "tandemd.sock").string() + " within 200 ms"),
            std::string::npos)
      << o.err;
}

TEST(TandemctlDaemon, HangUpAfterWelcomeExitsOne) {
  TempDir dir;
  FakeDaemon daemon(dir.path(), welcome(), {});
  Outcome o = run_ctl(dir.path(), {"--runtime-dir", dir.path().string(), "engines"});
  EXPECT_TRUE(daemon.seen().request);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("closed the connection before sending its answer"), std::string::npos) << o.err;
}

}  // namespace
}  // namespace tandem::ctl
