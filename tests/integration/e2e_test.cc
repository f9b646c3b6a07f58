// End to end: the real tandemd, the engine emulator serving HTTP, runners
// through libtandem, and tandemctl — admission as the policy says, a daemon
// killed with SIGKILL under load and restarted, the emulator's GPU plane
// following the daemon's SM partition, and 64 clients × 1,000 sessions.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <future>
#include <regex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>

#include "tandem/tandem.h"
#include "tests/integration/harness.h"

namespace tandem::it {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// tandem-engine-emu on an ephemeral port in `dir`; `extra` flags come last
// (and win over the defaults).
class Emulator {
 public:
  void start(const std::string& dir, const std::string& name, const std::vector<std::string>& extra = {}) {
    out_ = dir + "/" + name + ".out";
    std::vector<std::string> argv = {EMU_PATH, "--port",    "0",  "--runtime-dir", dir,   "--name",
                                     name,     "--speedup", "20", "--kv-blocks",   "4000"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    proc_.start(argv, out_, dir + "/" + name + ".log");
    const std::regex re("listening on 127\\.0\\.0\\.1:([0-9]+)");
    ASSERT_TRUE(eventually([&] {
      std::smatch m;
      const std::string text = slurp(out_);
      if (!std::regex_search(text, m, re)) return false;
      port_ = std::stoi(m[1]);
      return true;
    })) << slurp(dir + "/" + name + ".log");
  }
  int stop() { return proc_.stop(SIGTERM); }
  int port() const { return port_; }

  // One completion of `max_tokens` for session `session`; the HTTP status.
  int complete(const std::string& session, int max_tokens, std::chrono::seconds timeout = 30s) const {
    httplib::Client http("127.0.0.1", port_);
    http.set_read_timeout(timeout);
    json body = {{"prompt", "hello from " + session}, {"max_tokens", max_tokens}, {"session_id", session}};
    auto r = http.Post("/v1/completions", body.dump(), "application/json");
    return r ? r->status : -1;
  }
  // GET /stats (null if it did not answer).
  json stats() const {
    httplib::Client http("127.0.0.1", port_);
    http.set_read_timeout(5s);
    auto r = http.Get("/stats");
    return r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
  }

 private:
  Process proc_;
  std::string out_;
  int port_ = 0;
};

// A runner handle through libtandem.
struct Runner {
  explicit Runner(const std::string& dir, const char* name = "it-runner") {
    tandem_options o{};
    o.sz = sizeof o;
    o.runtime_dir = dir.c_str();
    o.name = name;
    o.reconnect_min_ms = 20;
    o.reconnect_max_ms = 200;
    EXPECT_EQ(tandem_runner_open(&o, &handle), 0);
  }
  ~Runner() { tandem_close(handle); }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  std::uint64_t open(const std::string& name) {
    std::uint64_t id = 0;
    EXPECT_EQ(tandem_session_open(handle, name.c_str(), nullptr, &id), 0) << tandem_last_error(handle);
    pump();
    return id;
  }
  void pump() { tandem_poll(handle, 0, 0, nullptr); }
  bool connected() const { return tandem_connected(handle) == 1; }
  // Drives the handshake until the daemon welcomed it.
  bool wait_connected() {
    return eventually([&] {
      pump();
      return connected();
    });
  }

  tandem_client* handle = nullptr;
};

// tandemctl's output for `args` (exit status in *status).
std::string tandemctl(const std::string& dir, const std::string& args, int* status = nullptr) {
  const std::string cmd = std::string(TANDEMCTL_PATH) + " --runtime-dir " + dir + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int st = p != nullptr ? ::pclose(p) : -1;
  if (status != nullptr) *status = st;
  return out;
}

// name → state from `tandemctl sessions --json`.
std::map<std::string, std::string> session_states(const std::string& dir) {
  int st = 0;
  const std::string out = tandemctl(dir, "sessions --json", &st);
  std::map<std::string, std::string> m;
  if (st != 0) return m;
  auto j = json::parse(out, nullptr, false);
  if (j.is_discarded()) return m;
  for (const auto& s : j["sessions"]) m[s["name"].get<std::string>()] = s["state"].get<std::string>();
  return m;
}

TEST(EndToEnd, RoundsAreAdmittedAsThePolicySays) {
  TempDir dir;
  // mars with a window of one session: the second session waits for the first to close.
  Daemon daemon(dir.path(),
                "[policy]\nname = \"mars\"\n[policy.params]\nwindow_max = 1\nwindow_min = 1\nwindow_init = 1\n");
  daemon.start();
  Emulator emu;
  emu.start(dir.path(), "emu-0");
  Runner runner(dir.path());
  ASSERT_TRUE(runner.wait_connected());
  const std::uint64_t a = runner.open("agent-a");
  ASSERT_TRUE(eventually([&] { return session_states(dir.path())["agent-a"] == "reasoning"; })) << daemon.log();
  ASSERT_EQ(emu.complete("agent-a", 8), 200) << daemon.log() << tandemctl(dir.path(), "sessions");
  // a's round ended with a tool to follow: acting, and still in the window.
  runner.open("agent-b");
  ASSERT_TRUE(eventually([&] {
    auto s = session_states(dir.path());
    return s["agent-a"] == "acting" && s["agent-b"] == "waiting";
  })) << tandemctl(dir.path(), "sessions");

  // b's round is held: the window is full while a lives.
  auto b_done = std::async(std::launch::async, [&] { return emu.complete("agent-b", 8); });
  EXPECT_EQ(b_done.wait_for(1500ms), std::future_status::timeout);
  const std::string table = tandemctl(dir.path(), "sessions");
  EXPECT_NE(table.find("agent-b"), std::string::npos) << table;
  EXPECT_NE(table.find("waiting"), std::string::npos) << table;

  // a closes: b is admitted and its round completes.
  ASSERT_EQ(tandem_session_close(runner.handle, a, TANDEM_CLOSE_NORMAL), 0);
  runner.pump();
  ASSERT_EQ(b_done.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(b_done.get(), 200);
  ASSERT_TRUE(eventually([&] {
    auto s = session_states(dir.path());
    return s.count("agent-a") == 0 && s["agent-b"] == "acting";
  })) << tandemctl(dir.path(), "sessions");
  EXPECT_EQ(emu.stop(), 0);
}

// The operator's commands through the real tandemctl: drain holds new
// sessions while live ones go on; policy set changes the running policy
// (validated); events shows what happened; session evict/kill and the exit
// codes; reload goes back to the file.
TEST(EndToEnd, OperatorsSteerThroughTandemctl) {
  TempDir dir;
  Daemon daemon(dir.path(), "[policy]\nname = \"mars\"\n");
  daemon.start();
  Emulator emu;
  emu.start(dir.path(), "emu-0");
  Runner runner(dir.path());
  ASSERT_TRUE(runner.wait_connected());
  runner.open("live-1");
  ASSERT_EQ(emu.complete("live-1", 4), 200);

  int st = 0;
  EXPECT_NE(tandemctl(dir.path(), "drain", &st).find("draining: no new session is admitted"), std::string::npos);
  EXPECT_EQ(st, 0);
  runner.open("new-1");
  auto held = std::async(std::launch::async, [&] { return emu.complete("new-1", 4); });
  EXPECT_EQ(held.wait_for(1500ms), std::future_status::timeout) << "a new session waits while draining";
  EXPECT_EQ(emu.complete("live-1", 4), 200) << "a live session goes on";
  EXPECT_NE(tandemctl(dir.path(), "status").find("draining:"), std::string::npos);
  tandemctl(dir.path(), "undrain", &st);
  EXPECT_EQ(st, 0);
  ASSERT_EQ(held.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(held.get(), 200);

  // policy get / set: a bad key changes nothing and names the problem (exit 1).
  const std::string bad = tandemctl(dir.path(), "policy set window_maxx 3", &st);
  EXPECT_NE(st, 0);
  EXPECT_NE(bad.find("not a parameter of policy 'mars'"), std::string::npos) << bad;
  const std::string set = tandemctl(dir.path(), "policy set window_max 7", &st);
  EXPECT_EQ(st, 0) << set;
  const json policy = json::parse(tandemctl(dir.path(), "policy --json"));
  EXPECT_EQ(policy["name"], "mars");
  EXPECT_EQ(policy["params"]["window_max"], 7);
  EXPECT_GE(policy["epoch"].get<int>(), 2);

  // session evict / kill, and the exit codes for a missing session.
  const std::string evicted = tandemctl(dir.path(), "session evict live-1", &st);
  EXPECT_EQ(st, 0) << evicted;
  EXPECT_NE(evicted.find("dropped"), std::string::npos) << evicted;
  tandemctl(dir.path(), "session kill nobody", &st);
  EXPECT_EQ(WEXITSTATUS(st), 4);
  tandemctl(dir.path(), "session kill new-1", &st);
  EXPECT_EQ(st, 0);
  tandemctl(dir.path(), "session frob x", &st);
  EXPECT_EQ(WEXITSTATUS(st), 2);

  // events: what happened, in order, names included.
  const std::string events = tandemctl(dir.path(), "events");
  for (const char* want : {"drain", "undrain", "admit", "round_end", "evict", "kill"}) {
    EXPECT_NE(events.find(want), std::string::npos) << want << "\n" << events;
  }
  EXPECT_NE(events.find("new-1"), std::string::npos) << events;

  // reload: back to the file's policy parameters.
  const std::string reloaded = tandemctl(dir.path(), "reload", &st);
  EXPECT_EQ(st, 0) << reloaded;
  EXPECT_EQ(json::parse(tandemctl(dir.path(), "policy --json"))["params"]["window_max"], 30);
  const std::string top = tandemctl(dir.path(), "top --count 1", &st);
  EXPECT_EQ(st, 0);
  EXPECT_NE(top.find("policy mars"), std::string::npos) << top;
  EXPECT_EQ(emu.stop(), 0);
}

TEST(EndToEnd, DaemonKilledUnderLoadRestartsAndResyncs) {
  TempDir dir;
  Daemon daemon(dir.path());
  daemon.start();
  Emulator emu;
  emu.start(dir.path(), "emu-0");
  Runner runner(dir.path());
  ASSERT_TRUE(runner.wait_connected());
  const std::vector<std::string> names = {"s0", "s1", "s2", "s3"};
  for (const std::string& n : names) runner.open(n);

  // Four agents send rounds back to back until told to stop.
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> agents;
  agents.reserve(names.size());
  for (const std::string& n : names) {
    agents.emplace_back([&, n] {
      while (!stop) {
        (emu.complete(n, 4, 10s) == 200 ? ok : failed)++;
      }
    });
  }
  ASSERT_TRUE(eventually([&] { return ok >= 8; }, 20s));
  std::map<std::string, std::string> before;
  ASSERT_TRUE(eventually([&] {
    before = session_states(dir.path());
    return before.size() == names.size();
  }));

  daemon.kill9();
  const int at_kill = ok;
  // Fail-open: requests keep completing with no daemon.
  EXPECT_TRUE(eventually([&] { return ok >= at_kill + 8; }, 20s)) << "ok " << ok << " failed " << failed;

  daemon.start();
  // The emulator and the runner reconnect and resync: the same live sessions.
  std::map<std::string, std::string> after;
  EXPECT_TRUE(eventually(
      [&] {
        runner.pump();
        after = session_states(dir.path());
        return after.size() == names.size();
      },
      10s))
      << tandemctl(dir.path(), "sessions") << daemon.log();
  for (const std::string& n : names) EXPECT_EQ(after.count(n), 1u) << n;
  // The emulator reconnects on its own backoff (up to 2 s), maybe after the runner.
  json engines;
  EXPECT_TRUE(eventually(
      [&] {
        engines = json::parse(tandemctl(dir.path(), "engines --json"), nullptr, false);
        return !engines.is_discarded() && engines["engines"].size() == 1u;
      },
      10s));
  ASSERT_EQ(engines["engines"].size(), 1u);
  EXPECT_EQ(engines["engines"][0]["name"], "emu-0");

  stop = true;
  for (auto& t : agents) t.join();
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(emu.stop(), 0);
}

// The emulator as an engine of the GPU plane (--gpu sim): its pool reaches
// tandemd (tandemctl engines), and with prefills piling up the daemon moves
// it to fewer decode SMs — Nova's SM_dec = max(16, SM_op − alpha·(N_pend −
// 1)), SM_op the largest partition's 132 SMs without a profile — which the
// emulator's steps follow, and back to the whole device once they drained.
TEST(EndToEnd, EmulatorFollowsTheDaemonsSmPartition) {
  TempDir dir;
  // fcfs admits every round at once. alpha 64: 3 pending prefills give
  // SM_dec 16 (partition 0), 2 give 68 (still the whole device); the
  // default alpha 8 would need 10.
  Daemon daemon(dir.path(), "[policy]\nname = \"fcfs\"\n[gpu]\nalpha = 64\n");
  daemon.start();
  Emulator emu;
  // One running sequence per step: every other round waits in the engine, a
  // pending prefill in its KV_STATS.
  emu.start(dir.path(), "emu-gpu", {"--gpu", "sim", "--max-seqs", "1", "--speedup", "2"});
  const json all_sms = json::array({16, 24, 32, 40, 48, 56, 64, 132});
  json engines;
  ASSERT_TRUE(eventually(
      [&] {
        engines = json::parse(tandemctl(dir.path(), "engines --json"), nullptr, false);
        return !engines.is_discarded() && engines["engines"].size() == 1u &&
               engines["engines"][0]["sm_partitions"] == all_sms && engines["engines"][0]["sm_partition"] == 7;
      },
      10s))
      << engines.dump() << daemon.log();
  EXPECT_EQ(engines["engines"][0]["name"], "emu-gpu");
  EXPECT_EQ(engines["engines"][0]["device_sms"], 132);
  json g = emu.stats()["gpu"];
  ASSERT_TRUE(g.is_object()) << g.dump();
  EXPECT_EQ(g["active_partition"], 7);

  // Six rounds of 128 tokens (~0.4 s each at speedup 2), each sent once the
  // emulator has taken the one before: the queue builds up to 5 waiting
  // without a burst of connections (cpp-httplib listens with a backlog of 5).
  constexpr int kRounds = 6;
  std::vector<std::future<int>> rounds;
  rounds.reserve(kRounds);
  for (int i = 0; i < kRounds; ++i) {
    rounds.push_back(std::async(std::launch::async, [&emu, i] { return emu.complete("q-" + std::to_string(i), 128); }));
    EXPECT_TRUE(eventually([&] { return emu.stats()["rounds"]["submitted"] == i + 1; }, 10s)) << "round " << i;
  }
  json seen;
  const bool moved = eventually(
      [&] {
        seen = emu.stats();
        return seen["gpu"].is_object() && seen["gpu"]["active_partition"].get<int>() < 7;
      },
      20s);
  for (auto& r : rounds) EXPECT_EQ(r.get(), 200);
  ASSERT_TRUE(moved) << seen.dump() << "\n" << tandemctl(dir.path(), "engines --json");
  EXPECT_EQ(seen["gpu"]["active_partition"], 0) << seen["gpu"].dump();
  EXPECT_EQ(seen["gpu"]["active_decode_sms"], 16) << seen["gpu"].dump();
  EXPECT_EQ(seen["gpu"]["active_prefill_sms"], 116) << seen["gpu"].dump();
  EXPECT_GE(seen["engine"]["waiting_seqs"].get<int>(), 1) << "moved while prefills were pending";

  // The queue drained: back to the whole device (after the chooser's hold-down).
  ASSERT_TRUE(eventually(
      [&] {
        g = emu.stats()["gpu"];
        return g.is_object() && g["active_partition"] == 7;
      },
      10s))
      << g.dump();
  EXPECT_GE(g["switches"].get<int>(), 2);
  EXPECT_EQ(g["bad_indices"], 0);
  EXPECT_EQ(g["passes"], emu.stats()["engine"]["steps"]);
  engines = json::parse(tandemctl(dir.path(), "engines --json"), nullptr, false);
  ASSERT_FALSE(engines.is_discarded());
  ASSERT_EQ(engines["engines"].size(), 1u);
  EXPECT_EQ(engines["engines"][0]["sm_partitions"], all_sms);
  EXPECT_EQ(engines["engines"][0]["sm_partition"], 7);
  EXPECT_EQ(engines["engines"][0]["block_bytes"], 4096) << "KV_STATS carries --kv-block-bytes";
  EXPECT_EQ(emu.stop(), 0);
}

TEST(EndToEnd, SixtyFourClientsWithAThousandSessionsEach) {
  TempDir dir;
  Daemon daemon(dir.path());
  daemon.start();
  constexpr int kClients = 64;
  constexpr int kSessions = 1000;
  std::vector<std::unique_ptr<Runner>> runners;
  runners.reserve(kClients);
  for (int c = 0; c < kClients; ++c) {
    runners.push_back(std::make_unique<Runner>(dir.path(), ("load-" + std::to_string(c)).c_str()));
  }
  ASSERT_TRUE(eventually([&] {
    bool all = true;
    for (auto& r : runners) {
      r->pump();
      all &= r->connected();
    }
    return all;
  }));
  for (int c = 0; c < kClients; ++c) {
    for (int s = 0; s < kSessions; ++s) runners[c]->open("load-" + std::to_string(c) + "-" + std::to_string(s));
  }
  json status;
  EXPECT_TRUE(eventually(
      [&] {
        for (auto& r : runners) r->pump();
        status = ctl(daemon.socket_path(), "status");
        return status["sessions"]["total"] == kClients * kSessions;
      },
      30s))
      << status.dump();
  EXPECT_EQ(status["clients"]["runner"], kClients);
  EXPECT_EQ(status["records"]["rejected"], 0);
  // The session list is one datagram: it lists what fits and says so.
  const json sessions = ctl(daemon.socket_path(), "sessions");
  EXPECT_EQ(sessions["total"], kClients * kSessions);
  EXPECT_EQ(sessions["truncated"], true);
  EXPECT_GT(sessions["sessions"].size(), 50u);

  runners.clear();  // every runner leaves: its sessions close with it
  EXPECT_TRUE(eventually(
      [&] {
        status = ctl(daemon.socket_path(), "status");
        return status["sessions"]["total"] == 0 && status["clients"]["runner"] == 0;
      },
      10s))
      << status.dump();
  EXPECT_EQ(daemon.stop(), 0);
}

}  // namespace
}  // namespace tandem::it
