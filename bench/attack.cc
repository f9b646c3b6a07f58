// attack: issue 18's attacks on a live stack, rerun, and a soak.
//
//   attack [--tandemd PATH] [--only NAME[,NAME...]] [--soak-seconds N] [--json FILE]
//
// Starts tandemd (the one built beside it, or --tandemd) in temporary runtime
// dirs, attacks it as a hostile raw-protocol client (ipc/), as libtandem
// runners and engines, and as the unprivileged user `nobody`, kills it with
// SIGKILL and restarts it, and feeds it bad configurations. Each attack says
// whether the promise held and the numbers behind the verdict. The soak then
// runs churn — runners opening and closing sessions and spawning tools, an
// engine running rounds, readers, a hostile client — for --soak-seconds and
// reports tandemd's RSS and fd count at the start, the peak and the end.
//
// It uses only the C ABI calls and protocol fields an older libtandem and
// tandemd also have, so the same binary attacks an older build (run it with
// --tandemd and LD_LIBRARY_PATH pointing at that build): the before and after
// of issue 18. Needs root (cgroups, setuid to nobody); exits 77 without.
// Exit status: 0 when every attack held, 1 otherwise, 2 for a usage error.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/ids.h"
#include "base/text.h"
#include "ipc/daemon_connection.h"
#include "ipc/records.h"
#include "tandem/tandem.h"
#include "testbed/daemon_process.h"
#include "tests/engine_info.h"

namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using tandem::ipc::DaemonConnection;
namespace ipc = tandem::ipc;
namespace wire = tandem::wire;

std::string g_tandemd = TANDEMD_PATH;

// ---- a stack ----------------------------------------------------------------

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool alive(pid_t pid) {
  const std::string stat = slurp(fmt::format("/proc/{}/stat", pid));
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

std::uint64_t rss_kb(pid_t pid) {
  std::istringstream in(slurp(fmt::format("/proc/{}/status", pid)));
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("VmRSS:")) return std::stoull(line.substr(6));
  }
  return 0;
}

std::size_t fd_count(pid_t pid) {
  std::error_code ec;
  std::size_t n = 0;
  for (auto it = std::filesystem::directory_iterator(fmt::format("/proc/{}/fd", pid), ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = 5s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

// tandemd in a runtime dir of its own, through the one harness
// (testbed/daemon_process.h): the dir is readable by all (nobody reaches the
// socket), the [cgroups] subtree is named after it and swept when the stack
// goes, and metrics and NVML are off unless the config says otherwise.
// Failures are printed, not fatal: an attack that finds no daemon fails its
// own verdict.
class Stack {
 public:
  explicit Stack(const std::string& config = "") {
    auto dir = tandem::testbed::TempDir::make("tandem-attack-");
    if (!dir) {
      std::fprintf(stderr, "attack: %s\n", dir.error().message().c_str());
      return;
    }
    dir_ = std::move(*dir);
    ::chmod(dir_.path().c_str(), 0755);
    std::string text = config;
    if (text.find("[cgroups]") == std::string::npos) text += fmt::format("\n[cgroups]\nsubtree = \"{}\"\n", name());
    if (text.find("[metrics]") == std::string::npos) text += "\n[metrics]\nlisten = \"\"\n";
    if (text.find("[nvml]") == std::string::npos) text += "\n[nvml]\nenabled = \"off\"\n";
    tandem::testbed::DaemonOptions o;
    o.tandemd = g_tandemd;
    o.runtime_dir = dir_.path();
    o.config = std::move(text);
    o.cgroup_subtree = name();
    o.start_timeout = 10s;
    auto d = tandem::testbed::DaemonProcess::create(std::move(o));
    if (!d) {
      std::fprintf(stderr, "attack: %s\n", d.error().message().c_str());
      return;
    }
    daemon_ = std::move(*d);
  }
  // As a crash would leave it: SIGKILL, then the harness sweeps the subtree
  // (and the tools' processes in it) and the dir goes.
  ~Stack() { kill9(); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;

  void start() {
    if (!daemon_) return;
    if (auto r = daemon_->start(); !r) {
      std::fprintf(stderr, "attack: tandemd did not come up: %s\n%s\n", r.error().message().c_str(), log().c_str());
    }
  }
  void kill9() {
    if (daemon_) daemon_->kill();
  }
  bool running() { return daemon_ && !daemon_->exited(); }
  pid_t pid() const { return daemon_ ? daemon_->pid() : -1; }
  std::string socket() const { return dir_.path() + "/tandemd.sock"; }
  const std::string& dir() const { return dir_.path(); }
  std::string name() const { return dir_.path().substr(dir_.path().rfind('/') + 1); }
  std::string log() const { return daemon_ ? daemon_->log() : ""; }

 private:
  tandem::testbed::TempDir dir_;                            // removed last,
  std::unique_ptr<tandem::testbed::DaemonProcess> daemon_;  // after the daemon's sweep
};

// A ctl request on a fresh connection: the body, or nullopt.
std::optional<std::string> ctl(const Stack& s, const std::string& command, std::vector<std::string> args = {},
                               wire::Role role = wire::Role::CtlAdmin) {
  auto c = DaemonConnection::connect(s.socket());
  if (!c || !c->hello(role, "attack-ctl", std::nullopt, 3000ms)) return std::nullopt;
  auto body = c->ctl(command, args, 5000ms);
  if (!body) return std::nullopt;
  return *body;
}

json status(const Stack& s) {
  auto b = ctl(s, "status");
  if (!b) return json::object();
  return json::parse(*b, nullptr, false);
}

json sessions(const Stack& s) {
  auto b = ctl(s, "sessions");
  if (!b) return json::array();
  json j = json::parse(*b, nullptr, false);
  return j.is_object() ? j["sessions"] : json::array();
}

bool has_session(const Stack& s, std::uint64_t id) {
  const std::string key = fmt::format("{:#018x}", id);
  for (const auto& e : sessions(s)) {
    if (e.value("id", "") == key) return true;
  }
  return false;
}

using tandem::test_support::test_engine_info;

template <class T>
ipc::Slot record(const T& r, std::uint64_t session) {
  return ipc::encode(r, session, tandem::base::to_ns(tandem::base::MonotonicClock().now()));
}

// Runs `fn` in a child as uid/gid 65534 and returns its exit status (or -1).
int as_nobody(const std::function<int()>& fn) {
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(100);
    ::_exit(fn());
  }
  int st = 0;
  ::waitpid(child, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

tandem_client* open_runner(const Stack& s, const char* name = "attack-runner") {
  tandem_options o{};
  o.sz = sizeof o;
  o.runtime_dir = s.dir().c_str();
  o.name = name;
  tandem_client* c = nullptr;
  if (tandem_runner_open(&o, &c) != 0) return nullptr;
  eventually([&] {
    (void)tandem_poll(c, 10, 0, nullptr);
    return tandem_connected(c) == 1;
  });
  return c;
}

tandem_client_stats stats_of(tandem_client* c) {
  tandem_client_stats st{};
  st.sz = sizeof st;
  (void)tandem_get_stats(c, &st);
  return st;
}

// ---- the attacks --------------------------------------------------------------

struct Verdict {
  std::string name;
  std::string promise;
  bool held = false;
  std::string detail;
};

Verdict crash_from_any_uid() {
  Verdict v{"crash", "a name that is not UTF-8 crashes nothing, for any ctl command from any uid", false, ""};
  Stack s;
  s.start();
  const std::string bad("agent-\xff\xfe", 8);
  const std::uint64_t id = tandem::base::session_id(bad);
  auto runner = DaemonConnection::connect(s.socket());
  if (runner && runner->hello(wire::Role::Runner, "hostile-runner")) {
    runner->push(record(ipc::SessionOpen{}, id));
    (void)runner->send(ipc::build_session_name(id, bad));
    ipc::SessionSnapshotInfo snap;
    snap.session = id;
    snap.name = bad;
    snap.state = 1;
    (void)runner->send(ipc::build_resync(std::span(&snap, 1), false));
  }
  auto engine = DaemonConnection::connect(s.socket());
  const bool bad_engine_welcomed = engine && engine->hello(wire::Role::Engine, bad, test_engine_info()).has_value();
  std::this_thread::sleep_for(200ms);
  const int rc = as_nobody([&] {
    int answered = 0;
    for (const char* cmd : {"sessions", "engines", "status", "tools", "events", "metrics", "policy"}) {
      auto c = DaemonConnection::connect(s.socket());
      if (c && c->hello(wire::Role::CtlRead, "nobody-ctl") && c->ctl(cmd, 3000ms)) ++answered;
    }
    return answered;
  });
  std::this_thread::sleep_for(100ms);
  const bool up = s.running();
  v.held = up && rc == 7 && status(s).contains("version");
  v.detail = fmt::format("daemon {}; nobody's 7 ctl commands answered: {}; an engine named so {}",
                         up ? "alive" : "DEAD", rc, bad_engine_welcomed ? "welcomed" : "refused");
  return v;
}

Verdict lockout() {
  Verdict v{"lockout", "300 held ctl connections of nobody lock out no engine, runner or tandemctl; tools keep cgroups",
            false, ""};
  Stack s;
  s.start();
  int ready[2];
  int release[2];
  if (::pipe(ready) != 0 || ::pipe(release) != 0) return v;
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(1);
    std::vector<DaemonConnection> held;
    int welcomed = 0;
    for (int i = 0; i < 300; ++i) {
      auto c = DaemonConnection::connect(s.socket());
      if (!c) continue;
      if (c->hello(wire::Role::CtlRead, "hog", std::nullopt, 2000ms)) ++welcomed;
      held.push_back(std::move(*c));
    }
    (void)!::write(ready[1], &welcomed, sizeof welcomed);
    char x = 0;
    (void)!::read(release[0], &x, 1);
    ::_exit(0);
  }
  int welcomed = -1;
  (void)!::read(ready[0], &welcomed, sizeof welcomed);
  auto engine = DaemonConnection::connect(s.socket());
  const bool engine_ok = engine && engine->hello(wire::Role::Engine, "engine", test_engine_info(), 3000ms).has_value();
  tandem_client* r = open_runner(s);
  const bool runner_ok = r != nullptr && tandem_connected(r) == 1;
  std::uint64_t sid = 0;
  std::uint64_t cgroup = 0;
  int spawn_rc = -1;
  if (r != nullptr && tandem_session_open(r, "siege", nullptr, &sid) == 0) {
    const char* argv[] = {"/bin/true", nullptr};
    std::int32_t pid = 0;
    spawn_rc = tandem_tool_spawn(r, sid, "true", argv, nullptr, nullptr, nullptr, &pid);
    if (spawn_rc == 0) {
      tandem_tool_result res{};
      res.sz = sizeof res;
      if (tandem_tool_wait(r, pid, 10000, &res) == 0) cgroup = res.cgroup_id;
    }
  }
  const bool ctl_ok = status(s).contains("version");
  (void)!::write(release[1], "x", 1);
  ::waitpid(child, nullptr, 0);
  if (r != nullptr) tandem_close(r);
  v.held = engine_ok && runner_ok && ctl_ok && spawn_rc == 0 && cgroup != 0;
  v.detail = fmt::format("nobody welcomed {} of 300; engine {}, runner {}, tandemctl {}; tool spawn rc {}, cgroup {}",
                         welcomed, engine_ok ? "welcomed" : "REFUSED", runner_ok ? "connected" : "NOT CONNECTED",
                         ctl_ok ? "answered" : "REFUSED", spawn_rc, cgroup != 0 ? "placed" : "NONE");
  return v;
}

Verdict unplaced_kill() {
  Verdict v{"unplaced-kill",
            "a tool started while tandemd was down is known to it; session kill never calls it dead while it lives",
            false, ""};
  Stack s;
  s.start();
  tandem_client* r = open_runner(s);
  if (r == nullptr) return v;
  s.kill9();
  std::uint64_t sid = 0;
  (void)tandem_session_open(r, "unplaced-victim", nullptr, &sid);
  tandem_tool_options o{};
  o.sz = sizeof o;
  o.flags = TANDEM_TOOL_ALLOW_UNPLACED;  // ignored by an older libtandem, which starts it unplaced anyway
  const char* argv[] = {"/bin/sleep", "60", nullptr};
  std::int32_t pid = 0;
  const int rc = tandem_tool_spawn(r, sid, "sleep", argv, nullptr, nullptr, &o, &pid);
  s.start();
  eventually([&] {
    (void)tandem_poll(r, 10, 0, nullptr);
    return tandem_connected(r) == 1 && has_session(s, sid);
  });
  auto c = DaemonConnection::connect(s.socket());
  std::string answer = "no answer";
  bool said_killed = false;
  if (c && c->hello(wire::Role::CtlAdmin, "admin")) {
    const std::string args[] = {"unplaced-victim"};
    auto b = c->ctl("session-kill", args, 5000ms);
    said_killed = b.has_value();
    answer = b ? *b : b.error().message();
  }
  std::this_thread::sleep_for(300ms);
  const bool lives = rc == 0 && alive(pid);
  v.held = rc == 0 && !(said_killed && lives);
  v.detail = fmt::format("spawn rc {}; session-kill {}: {}; the tool {}", rc, said_killed ? "said killed" : "failed",
                         tandem::base::escape(answer, 120), lives ? "LIVES" : "is dead");
  if (rc == 0) {
    (void)tandem_tool_kill(r, pid);
    tandem_tool_result res{};
    res.sz = sizeof res;
    (void)tandem_tool_wait(r, pid, 5000, &res);
  }
  tandem_close(r);
  return v;
}

Verdict log_forging() {
  Verdict v{"log-forging", "a name cannot write a forged line into tandemd's log", false, ""};
  Stack s;
  s.start();
  const std::string evil = "x\n<0>pwned";
  auto a = DaemonConnection::connect(s.socket());
  if (a) (void)a->hello(wire::Role::Runner, evil);
  auto b = DaemonConnection::connect(s.socket());
  if (b && b->hello(wire::Role::Runner, "runner")) {
    (void)b->send(ipc::build_session_name(tandem::base::session_id(evil), evil));
    b->push(record(ipc::SessionOpen{}, tandem::base::session_id(evil)));
  }
  (void)ctl(s, evil);
  std::this_thread::sleep_for(300ms);
  int forged = 0;
  std::istringstream in(s.log());
  for (std::string line; std::getline(in, line);)
    forged += line.starts_with("<0>") || line.starts_with("pwned") ? 1 : 0;
  v.held = forged == 0;
  v.detail = fmt::format("{} forged lines", forged);
  return v;
}

Verdict resync_closed() {
  Verdict v{"resync-closed", "after a restart, a session that had closed does not come back from an engine's snapshot",
            false, ""};
  Stack s;
  s.start();
  const std::uint64_t id = tandem::base::session_id("closed-before-the-kill");
  auto runner = DaemonConnection::connect(s.socket());
  auto engine = DaemonConnection::connect(s.socket());
  if (!runner || !engine || !runner->hello(wire::Role::Runner, "runner") ||
      !engine->hello(wire::Role::Engine, "engine", test_engine_info())) {
    return v;
  }
  runner->push(record(ipc::SessionOpen{}, id));
  ipc::RoundSubmit sub;
  sub.prompt_tokens = 100;
  sub.projected_blocks = 8;
  engine->push(record(sub, id));
  eventually([&] {
    for (const auto& e : sessions(s)) {
      if (e.value("state", "") == "reasoning") return true;
    }
    return false;
  });
  ipc::RoundEnd end;
  end.header.flags = ipc::kRoundEndToolFollows;
  end.output_tokens = 10;
  end.blocks_held = 8;
  engine->push(record(end, id));
  std::this_thread::sleep_for(200ms);
  runner->push(record(ipc::SessionClose{}, id));
  const bool closed = eventually([&] { return !has_session(s, id); });
  s.kill9();
  s.start();
  auto engine2 = DaemonConnection::connect(s.socket());
  if (engine2 && engine2->hello(wire::Role::Engine, "engine", test_engine_info())) {
    ipc::SessionSnapshotInfo snap;
    snap.session = id;
    snap.state = 2;  // acting
    snap.residency = 1;
    snap.blocks_held = 8;
    (void)engine2->send(ipc::build_resync(std::span(&snap, 1), false));
  }
  std::this_thread::sleep_for(300ms);
  const bool back = has_session(s, id);
  v.held = closed && !back;
  v.detail = fmt::format("closed before the kill: {}; after the restart and the engine's resync: {}", closed,
                         back ? "BACK (acting)" : "stays closed");
  return v;
}

Verdict resync_hijack() {
  Verdict v{"resync-hijack", "a hostile runner that resyncs a victim's session first gets nothing and closes nothing",
            false, ""};
  Stack s("[cgroups]\nadopt_grace = \"2s\"\n");
  s.start();
  int ready[2];
  int go[2];
  if (::pipe(ready) != 0 || ::pipe(go) != 0) return v;
  const std::uint64_t id = tandem::base::session_id("victim");
  const pid_t victim = ::fork();
  if (victim == 0) {
    tandem_client* r = open_runner(s, "victim");
    std::uint64_t sid = 0;
    std::int32_t pid = 0;
    if (r != nullptr && tandem_session_open(r, "victim", nullptr, &sid) == 0) {
      const char* argv[] = {"/bin/sleep", "60", nullptr};
      (void)tandem_tool_spawn(r, sid, "sleep", argv, nullptr, nullptr, nullptr, &pid);
    }
    (void)!::write(ready[1], &pid, sizeof pid);
    char x = 0;
    (void)!::read(go[0], &x, 1);  // the daemon restarts; the victim is busy elsewhere
    std::this_thread::sleep_for(3s);
    for (int i = 0; i < 100; ++i) (void)tandem_poll(r, 20, 0, nullptr);  // now it comes back
    std::this_thread::sleep_for(1s);
    (void)tandem_tool_kill(r, pid);
    tandem_tool_result res{};
    res.sz = sizeof res;
    (void)tandem_tool_wait(r, pid, 5000, &res);
    ::_exit(0);
  }
  std::int32_t tool = 0;
  (void)!::read(ready[0], &tool, sizeof tool);
  s.kill9();
  s.start();
  auto hostile = DaemonConnection::connect(s.socket());
  bool hostile_took = false;
  if (hostile && hostile->hello(wire::Role::Runner, "hostile")) {
    ipc::SessionSnapshotInfo snap;
    snap.session = id;
    snap.state = 1;
    (void)hostile->send(ipc::build_resync(std::span(&snap, 1), false));
    std::this_thread::sleep_for(200ms);
    for (const auto& e : sessions(s)) {
      if (e.value("id", "") == fmt::format("{:#018x}", id) && e["owner"].is_number() &&
          e["owner"].get<std::uint32_t>() == hostile->client_id()) {
        hostile_took = true;
      }
    }
    hostile->push(record(ipc::SessionClose{}, id));
  }
  std::this_thread::sleep_for(500ms);
  const bool session_lives = has_session(s, id);
  const bool tool_lives = tool > 0 && alive(tool);
  (void)!::write(go[1], "x", 1);
  ::waitpid(victim, nullptr, 0);
  v.held = !hostile_took && session_lives && tool_lives;
  v.detail = fmt::format("hostile became owner: {}; victim's session {}; victim's tool {}", hostile_took,
                         session_lives ? "lives" : "CLOSED", tool_lives ? "lives" : "KILLED");
  return v;
}

Verdict resync_growth() {
  Verdict v{"resync-growth", "resync entries and names cannot grow the daemon without bound", false, ""};
  Stack s("[limits]\nmessages_per_s = 1000000\n");
  s.start();
  const std::uint64_t before = rss_kb(s.pid());
  auto runner = DaemonConnection::connect(s.socket());
  auto engine = DaemonConnection::connect(s.socket());
  if (!runner || !engine || !runner->hello(wire::Role::Runner, "flood") ||
      !engine->hello(wire::Role::Engine, "flood-engine", test_engine_info())) {
    return v;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::uint64_t n = 0;
  int sent = 0;
  while (std::chrono::steady_clock::now() - t0 < 10s) {
    std::vector<ipc::SessionSnapshotInfo> batch;
    for (int i = 0; i < 200; ++i) {
      ipc::SessionSnapshotInfo e;
      e.name = fmt::format("flood-{:09d}-{}", n++, std::string(220, 'x'));
      e.session = tandem::base::session_id(e.name);
      e.state = static_cast<std::uint8_t>(sent % 2 == 0 ? 1 : 3 + i % 5);
      batch.push_back(std::move(e));
    }
    auto& who = sent % 2 == 0 ? *runner : *engine;
    if (!who.send(ipc::build_resync(batch, true))) std::this_thread::sleep_for(1ms);
    ++sent;
  }
  std::this_thread::sleep_for(500ms);
  const std::uint64_t after = rss_kb(s.pid());
  const json st = status(s);
  const json tables = st.value("tables", json::object());
  const auto total = st.contains("sessions") ? st["sessions"].value("total", 0) : -1;
  v.held = after < before + 64 * 1024 && total <= 4096 * 2;
  v.detail = fmt::format("{} entries in {} messages over 10 s; RSS {:.1f} → {:.1f} MB; sessions {}; tables {}", n, sent,
                         before / 1024.0, after / 1024.0, total, tables.dump());
  return v;
}

Verdict engine_on_runners_session() {
  Verdict v{"engine-overreach", "an engine's snapshot cannot put a runner's session in a tool call, or name it", false,
            ""};
  Stack s;
  s.start();
  const std::string name = "runner-owned";
  const std::uint64_t id = tandem::base::session_id(name);
  auto runner = DaemonConnection::connect(s.socket());
  auto engine = DaemonConnection::connect(s.socket());
  if (!runner || !engine || !runner->hello(wire::Role::Runner, "runner") ||
      !engine->hello(wire::Role::Engine, "engine", test_engine_info())) {
    return v;
  }
  runner->push(record(ipc::SessionOpen{}, id));
  (void)runner->send(ipc::build_session_name(id, name));
  std::this_thread::sleep_for(200ms);
  ipc::SessionSnapshotInfo snap;
  snap.session = id;
  snap.state = 2;  // acting
  snap.blocks_held = 8;
  snap.residency = 1;
  (void)engine->send(ipc::build_resync(std::span(&snap, 1), false));
  std::this_thread::sleep_for(300ms);
  std::string state = "?";
  for (const auto& e : sessions(s)) {
    if (e.value("id", "") == fmt::format("{:#018x}", id)) state = e.value("state", "?");
  }
  v.held = state != "acting";
  v.detail = fmt::format("the runner's session is {} after the engine's snapshot said acting", state);
  return v;
}

Verdict errors_not_disconnects() {
  Verdict v{"errors", "limit and name errors keep the connection, and the runner's tools live", false, ""};
  Stack s("[limits]\nsessions_per_client = 4\n");
  s.start();
  tandem_client* r = open_runner(s);
  if (r == nullptr) return v;
  std::uint64_t first = 0;
  (void)tandem_session_open(r, "keeps-a-tool", nullptr, &first);
  const char* argv[] = {"/bin/sleep", "60", nullptr};
  std::int32_t tool = 0;
  const int spawn_rc = tandem_tool_spawn(r, first, "sleep", argv, nullptr, nullptr, nullptr, &tool);
  std::vector<int> rcs;
  for (int i = 0; i < 5; ++i) {
    std::uint64_t sid = 0;
    rcs.push_back(tandem_session_open(r, fmt::format("over-{}", i).c_str(), nullptr, &sid));
  }
  std::uint64_t sid = 0;
  const std::string long_name(300, 'l');
  const int long_rc = tandem_session_open(r, long_name.c_str(), nullptr, &sid);
  const int name_rc = tandem_session_name(r, tandem_session_id(long_name.c_str()), long_name.c_str());
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < 8s) (void)tandem_poll(r, 20, 0, nullptr);
  const auto st = stats_of(r);
  const bool tool_lives = spawn_rc == 0 && alive(tool);
  v.held = st.connects == 1 && st.disconnects == 0 && tool_lives && long_rc == -ENAMETOOLONG;
  v.detail = fmt::format(
      "session_open rcs {} (limit 4, 1 open); 300-byte name rc {}; session_name rc {}; "
      "{} connects, {} disconnects in 8 s; the tool {}",
      fmt::join(rcs, " "), long_rc, name_rc, st.connects, st.disconnects, tool_lives ? "lives" : "was KILLED");
  if (spawn_rc == 0) {
    (void)tandem_tool_kill(r, tool);
    tandem_tool_result res{};
    res.sz = sizeof res;
    (void)tandem_tool_wait(r, tool, 5000, &res);
  }
  tandem_close(r);
  return v;
}

Verdict tool_wait_restart() {
  Verdict v{"tool-wait-restart", "tool_wait(-1) across a daemon restart reports the tool's real exit", false, ""};
  Stack s("[cgroups]\nadopt_grace = \"1s\"\n");
  s.start();
  tandem_client* r = open_runner(s);
  if (r == nullptr) return v;
  std::uint64_t sid = 0;
  (void)tandem_session_open(r, "waits", nullptr, &sid);
  const char* argv[] = {"/bin/sh", "-c", "sleep 4; exit 7", nullptr};
  std::int32_t pid = 0;
  const int rc = tandem_tool_spawn(r, sid, "sh", argv, nullptr, nullptr, nullptr, &pid);
  s.kill9();
  s.start();
  tandem_tool_result res{};
  res.sz = sizeof res;
  const int wrc = rc == 0 ? tandem_tool_wait(r, pid, -1, &res) : rc;
  v.held = wrc == 0 && res.exit_code == 7;
  v.detail = fmt::format("spawn rc {}, wait rc {}: exit {} (reason {}) {}", rc, wrc, res.exit_code, res.reason,
                         tandem::base::escape(res.message, 80));
  tandem_close(r);
  return v;
}

Verdict tool_prepare_flood() {
  Verdict v{"toolprepare-flood", "3,000 ToolPrepares in one session make a bounded number of cgroups", false, ""};
  Stack s("[limits]\nmessages_per_s = 1000000\n");
  s.start();
  const std::uint64_t id = tandem::base::session_id("flood-tools");
  auto runner = DaemonConnection::connect(s.socket());
  if (!runner || !runner->hello(wire::Role::Runner, "flood")) return v;
  runner->push(record(ipc::SessionOpen{}, id));
  int placed = 0;
  int refused = 0;
  for (std::uint32_t call = 1; call <= 3000; ++call) {
    if (!runner->send(ipc::build_tool_prepare(call, id, call, 1, {}))) break;
    auto m = runner->recv(5000ms);
    if (!m) break;
    const auto* p = m->message()->payload_as_ToolPlacement();
    if (p == nullptr) continue;
    (p->code() == 0 ? placed : refused)++;
  }
  const json st = status(s);
  const int cgroups = st.contains("host") ? st["host"].value("tool_cgroups", -1) : -1;
  v.held = placed <= 1024 && cgroups <= 1024;
  v.detail = fmt::format("{} placed, {} refused; tool cgroups held: {}", placed, refused, cgroups);
  return v;
}

// A tool kind is a hash of a name the runner chose: every TOOL_END of a new
// kind used to give the policy's duration model one more history, forever.
Verdict tool_kind_flood() {
  Verdict v{"toolkind-flood", "tool calls of ever new kinds cannot grow the daemon without bound", false, ""};
  Stack s;
  s.start();
  const std::uint64_t id = tandem::base::session_id("flood-kinds");
  auto runner = DaemonConnection::connect(s.socket());
  if (!runner || !runner->hello(wire::Role::Runner, "flood")) return v;
  runner->push(record(ipc::SessionOpen{}, id));
  std::this_thread::sleep_for(200ms);
  const std::uint64_t before = rss_kb(s.pid());
  const auto t0 = std::chrono::steady_clock::now();
  std::uint32_t call = 0;
  while (std::chrono::steady_clock::now() - t0 < 10s) {
    ipc::ToolStart start;
    start.tool_kind = 0x9e3779b97f4a7c15ULL * (call + 1);
    start.tool_call = call + 1;
    ipc::ToolEnd end;
    end.tool_kind = start.tool_kind;
    end.tool_call = start.tool_call;
    end.wall_ns = 1'000'000'000;
    if (!runner->push(record(start, id))) {
      std::this_thread::sleep_for(1ms);
      continue;
    }
    while (!runner->push(record(end, id))) std::this_thread::sleep_for(1ms);
    ++call;
  }
  std::this_thread::sleep_for(1s);  // the daemon takes what is still on the ring
  const std::uint64_t after = rss_kb(s.pid());
  const json st = status(s);
  const auto accepted = st.contains("records") ? st["records"].value("accepted", -1) : -1;
  v.held = s.running() && after < before + 32 * 1024;
  v.detail = fmt::format("{} tool calls of new kinds in 10 s ({} records accepted); RSS {:.1f} → {:.1f} MB", call,
                         accepted, before / 1024.0, after / 1024.0);
  return v;
}

Verdict bad_configs() {
  Verdict v{"bad-configs", "bad configuration files are refused with file: key: problem", false, ""};
  const std::vector<std::string> bad = {"[limits]\nmax_clients = 0\n",
                                        "[limits]\nclients_per_uid = 0\n",
                                        "[limits]\nreserved_clients = -1\n",
                                        "[limits]\nctl_idle_timeout_s = 0\n",
                                        "[limits]\ntools_per_session = 0\n",
                                        "[limits]\nnope = 1\n",
                                        "[policy]\nname = \"nope\"\n",
                                        "[policy]\ntick_ms = 0\n",
                                        "runtime_dir = \"relative\"\n",
                                        "[roles.engine]\nuids = [\"nosuchuser\"]\n",
                                        "[cgroups]\nadopt_grace = \"30\"\n",
                                        "[ipc]\nevent_slots = 100\n",
                                        "[[[",
                                        "[limits]\nmax_clients = \"256\"\n"};
  int refused = 0;
  std::vector<std::string> misses;
  auto dir = tandem::testbed::TempDir::make("tandem-attack-cfg-");
  if (!dir) {
    v.detail = dir.error().message();
    return v;
  }
  for (std::size_t i = 0; i < bad.size(); ++i) {
    const std::string path = fmt::format("{}/{}.toml", dir->path(), i);
    const std::string out_path = fmt::format("{}/{}.out", dir->path(), i);
    std::ofstream(path) << bad[i];
    tandem::testbed::ChildProcess check;
    const std::vector<std::string> argv = {g_tandemd, "--check-config", "--config", path};
    // Refused: it ran, exited with an error, and named the file and the key.
    bool failed = false;
    if (check.start(argv, out_path, out_path)) {
      auto status = check.wait(0, 10s);
      failed = status && !(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
    }
    if (failed && slurp(out_path).find(path + ": ") != std::string::npos) {
      ++refused;
    } else {
      misses.push_back(tandem::base::escape(bad[i], 40));
    }
  }
  v.held = refused == static_cast<int>(bad.size());
  v.detail = fmt::format("{} of {} refused{}{}", refused, bad.size(),
                         misses.empty() ? "" : "; not: ", fmt::join(misses, " | "));
  return v;
}

Verdict repeated_kill9() {
  Verdict v{"kill-9", "five kill -9s under load lose no session and no tool process", false, ""};
  Stack s;
  s.start();
  tandem_client* r = open_runner(s);
  if (r == nullptr) return v;
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 20; ++i) {
    std::uint64_t sid = 0;
    if (tandem_session_open(r, fmt::format("survivor-{}", i).c_str(), nullptr, &sid) == 0) ids.push_back(sid);
  }
  const char* argv[] = {"/bin/sleep", "120", nullptr};
  std::int32_t tool = 0;
  const int rc = tandem_tool_spawn(r, ids[0], "sleep", argv, nullptr, nullptr, nullptr, &tool);
  int back = 0;
  for (int k = 0; k < 5; ++k) {
    s.kill9();
    std::this_thread::sleep_for(200ms);
    s.start();
    if (eventually(
            [&] {
              (void)tandem_poll(r, 10, 0, nullptr);
              const json st = status(s);
              return st.contains("sessions") && st["sessions"].value("total", 0) == static_cast<int>(ids.size());
            },
            10s)) {
      ++back;
    }
  }
  const bool tool_lives = rc == 0 && alive(tool);
  v.held = back == 5 && tool_lives;
  v.detail = fmt::format("all {} sessions back after {} of 5 restarts; the tool {}", ids.size(), back,
                         tool_lives ? "lives" : "was KILLED");
  if (rc == 0) {
    (void)tandem_tool_kill(r, tool);
    tandem_tool_result res{};
    res.sz = sizeof res;
    (void)tandem_tool_wait(r, tool, 5000, &res);
  }
  tandem_close(r);
  return v;
}

// ---- the soak ----------------------------------------------------------------

json soak(int seconds) {
  Stack s("[limits]\nmessages_per_s = 100000\n");
  s.start();
  json out;
  tandem_client* r = open_runner(s, "soak-runner");
  auto engine = DaemonConnection::connect(s.socket());
  if (r == nullptr || !engine || !engine->hello(wire::Role::Engine, "soak-engine", test_engine_info())) return out;
  std::this_thread::sleep_for(500ms);
  const std::uint64_t rss0 = rss_kb(s.pid());
  const std::size_t fds0 = fd_count(s.pid());
  std::uint64_t rss_max = rss0;
  std::size_t fds_max = fds0;
  std::uint64_t sessions = 0;
  std::uint64_t tools = 0;
  std::uint64_t hostile = 0;
  std::uint64_t reads = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto last_sample = t0;
  for (std::uint64_t i = 0; std::chrono::steady_clock::now() - t0 < std::chrono::seconds(seconds); ++i) {
    // A runner session with a round on the engine and a short tool.
    const std::string name = fmt::format("soak-{}", i);
    std::uint64_t sid = 0;
    if (tandem_session_open(r, name.c_str(), nullptr, &sid) == 0) {
      ++sessions;
      ipc::RoundSubmit sub;
      sub.round = 0;
      sub.prompt_tokens = 64;
      sub.projected_blocks = 4;
      engine->push(record(sub, sid));
      if (i % 4 == 0) {
        const char* argv[] = {"/bin/true", nullptr};
        std::int32_t pid = 0;
        if (tandem_tool_spawn(r, sid, "true", argv, nullptr, nullptr, nullptr, &pid) == 0) {
          tandem_tool_result res{};
          res.sz = sizeof res;
          (void)tandem_tool_wait(r, pid, 5000, &res);
          ++tools;
        }
      }
      (void)tandem_session_close(r, sid, TANDEM_CLOSE_NORMAL);
    }
    (void)tandem_poll(r, 0, 0, nullptr);
    for (ipc::Slot slot; engine->directives().try_pop(slot);) {
    }
    // A reader, and a hostile client with bad names, garbage and a resync.
    if (i % 10 == 0) {
      (void)ctl(s, i % 20 == 0 ? "sessions" : "events", {}, wire::Role::CtlRead);
      ++reads;
    }
    if (i % 25 == 0) {
      auto h = DaemonConnection::connect(s.socket());
      if (h && h->hello(wire::Role::Runner, "hostile")) {
        const std::string bad("\xff\n<0>x", 6);
        (void)h->send(ipc::build_session_name(tandem::base::session_id(bad), bad));
        const char junk[] = "\x01\x02garbage";
        (void)h->send_raw(junk, sizeof junk);
      }
      ++hostile;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - last_sample >= 1s) {
      last_sample = now;
      rss_max = std::max(rss_max, rss_kb(s.pid()));
      fds_max = std::max(fds_max, fd_count(s.pid()));
    }
  }
  std::this_thread::sleep_for(1s);
  const std::uint64_t rss1 = rss_kb(s.pid());
  const std::size_t fds1 = fd_count(s.pid());
  out = {{"seconds", seconds},
         {"sessions", sessions},
         {"tools", tools},
         {"reads", reads},
         {"hostile_clients", hostile},
         {"rss_kb_start", rss0},
         {"rss_kb_end", rss1},
         {"rss_kb_max", rss_max},
         {"fds_start", fds0},
         {"fds_end", fds1},
         {"fds_max", fds_max},
         {"daemon_alive", s.running()},
         {"status_tables", status(s).value("tables", json::object())}};
  tandem_close(r);
  return out;
}

int usage(const char* why) {
  std::fprintf(stderr,
               "attack: %s\nusage: attack [--tandemd PATH] [--only NAME,...] [--soak-seconds N] [--json FILE]\n", why);
  return 2;
}

int run_main(int argc, char** argv) {
  std::vector<std::string> only;
  int soak_seconds = 0;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--tandemd") {
      g_tandemd = value();
    } else if (a == "--only") {
      std::string list = value();
      for (std::size_t p = 0; p <= list.size();) {
        const std::size_t q = std::min(list.find(',', p), list.size());
        only.push_back(list.substr(p, q - p));
        p = q + 1;
      }
    } else if (a == "--soak-seconds") {
      soak_seconds = std::atoi(value().c_str());
    } else if (a == "--json") {
      json_path = value();
    } else if (a == "-h" || a == "--help") {
      std::printf("attack [--tandemd PATH] [--only NAME,...] [--soak-seconds N] [--json FILE]\n");
      return 0;
    } else {
      return usage(fmt::format("unknown argument '{}'", a).c_str());
    }
  }
  if (::geteuid() != 0) {
    std::fprintf(stderr, "attack: needs root (cgroups, and setuid to nobody); skipped\n");
    return 77;
  }
  ::signal(SIGPIPE, SIG_IGN);
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  const std::vector<std::pair<const char*, Verdict (*)()>> attacks = {
      {"crash", crash_from_any_uid},
      {"lockout", lockout},
      {"unplaced-kill", unplaced_kill},
      {"log-forging", log_forging},
      {"resync-closed", resync_closed},
      {"resync-hijack", resync_hijack},
      {"resync-growth", resync_growth},
      {"engine-overreach", engine_on_runners_session},
      {"errors", errors_not_disconnects},
      {"tool-wait-restart", tool_wait_restart},
      {"toolprepare-flood", tool_prepare_flood},
      {"toolkind-flood", tool_kind_flood},
      {"bad-configs", bad_configs},
      {"kill-9", repeated_kill9},
  };
  json report = json::array();
  bool all = true;
  for (const auto& [name, fn] : attacks) {
    if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) continue;
    const auto t0 = std::chrono::steady_clock::now();
    const Verdict v = fn();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    all &= v.held;
    std::printf("%-18s %-6s %s\n%18s        %s (%.1f s)\n", v.name.c_str(), v.held ? "HELD" : "BROKEN",
                v.promise.c_str(), "", v.detail.c_str(), took);
    std::fflush(stdout);
    report.push_back({{"attack", v.name}, {"held", v.held}, {"promise", v.promise}, {"detail", v.detail}});
  }
  json out = {{"tandemd", g_tandemd}, {"attacks", report}};
  if (soak_seconds > 0) {
    const json s = soak(soak_seconds);
    std::printf("soak %d s: %s\n", soak_seconds, s.dump().c_str());
    out["soak"] = s;
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return all ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& e) {
    // bad_alloc, a JSON error, …
    std::fprintf(stderr, "attack: %s\n", e.what());
    return 1;
  }
}
