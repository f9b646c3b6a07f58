// Budgets per principal (issue 18): no uid can lock engines and runners
// out, idle readers go, resync and tool requests cannot grow the daemon
// without bound, every answer fits (or pages), and a limit is an answer to
// one request, never a disconnect. In-process (tests/daemon/inprocess.h).
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/ids.h"
#include "tests/daemon/inprocess.h"

namespace tandem::testing {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr uid_t kNobody = 65534;

// nobody holds 300 reader connections: it gets its share, not everyone's.
// (pid 0: as a peer in another pid namespace, so no pidfd per connection.)
TEST(ServerLimits, ThreeHundredHeldReaderConnectionsLockNobodyOut) {
  InProcessDaemon d;
  ASSERT_TRUE(d.ok()) << d.error();
  std::vector<InProcessClient> held;
  int welcomed = 0;
  for (int i = 0; i < 300; ++i) {
    held.push_back(d.connect(ucred{0, kNobody, kNobody}));
    if (held.back().hello(wire::Role::CtlRead, "reader")) ++welcomed;
  }
  EXPECT_LE(welcomed, 64) << "limits.clients_per_uid";
  EXPECT_GT(welcomed, 0);
  // Root's engine, runner and tandemctl are all served.
  auto engine = d.connect();
  EXPECT_TRUE(engine.hello(wire::Role::Engine, "engine", test_engine_info())) << engine.error();
  auto runner = d.connect();
  EXPECT_TRUE(runner.hello(wire::Role::Runner, "runner")) << runner.error();
  auto admin = d.connect();
  ASSERT_TRUE(admin.hello(wire::Role::CtlAdmin, "admin")) << admin.error();
  const json st = json::parse(admin.ctl("status").second);
  EXPECT_EQ(st["clients"]["engine"], 1);
  EXPECT_EQ(st["clients"]["runner"], 1);
  EXPECT_GT(d.server().stats().clients_refused_limits, 200u);
}

// Many uids together still leave the slots kept for engines and runners.
TEST(ServerLimits, ReadersOfManyUidsLeaveTheReservedSlots) {
  InProcessDaemon d("[limits]\nmax_clients = 40\nreserved_clients = 10\nclients_per_uid = 3\n");
  ASSERT_TRUE(d.ok()) << d.error();
  std::vector<InProcessClient> held;
  int welcomed = 0;
  for (uid_t uid = 2000; uid < 2040; ++uid) {
    for (int i = 0; i < 3; ++i) {
      held.push_back(d.connect(ucred{0, uid, uid}));
      if (held.back().hello(wire::Role::CtlRead, "reader")) ++welcomed;
    }
  }
  EXPECT_EQ(welcomed, 30);  // 40 − 10 reserved
  auto engine = d.connect();
  EXPECT_TRUE(engine.hello(wire::Role::Engine, "engine", test_engine_info())) << engine.error();
  auto runner = d.connect();
  EXPECT_TRUE(runner.hello(wire::Role::Runner, "runner")) << runner.error();
}

TEST(ServerLimits, IdleReadersAreClosed) {
  InProcessDaemon d("[limits]\nctl_idle_timeout_s = 1\n");
  ASSERT_TRUE(d.ok()) << d.error();
  auto idle = d.connect();
  ASSERT_TRUE(idle.hello(wire::Role::CtlRead, "idle"));
  auto busy = d.connect();
  ASSERT_TRUE(busy.hello(wire::Role::CtlRead, "busy"));
  const auto until = std::chrono::steady_clock::now() + 1500ms;
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_EQ(busy.ctl("status").first, 0);
    for (int i = 0; i < 10; ++i) d.step(10ms);
  }
  EXPECT_TRUE(idle.closed());
  EXPECT_EQ(busy.ctl("status").first, 0);
  EXPECT_EQ(d.server().stats().ctl_idle_closed, 1u);
}

// A runner floods resyncs: 100 messages of 256 named entries, and an engine
// sends entries in states that hold nothing. The daemon holds no more than
// the limits allow.
TEST(ServerLimits, ResyncGrowthIsBounded) {
  InProcessDaemon d("[limits]\nsessions_per_client = 1000\nmessages_per_s = 1000000\n");
  ASSERT_TRUE(d.ok()) << d.error();
  auto runner = d.connect();
  ASSERT_TRUE(runner.hello(wire::Role::Runner, "flood"));
  auto engine = d.connect();
  ASSERT_TRUE(engine.hello(wire::Role::Engine, "engine", test_engine_info()));
  std::uint64_t n = 0;
  for (int m = 0; m < 100; ++m) {
    std::vector<ipc::SessionSnapshotInfo> batch;
    for (int i = 0; i < 256; ++i) {
      ipc::SessionSnapshotInfo s;
      s.name = fmt::format("flood-{:06d}-{}", n++, std::string(200, 'x'));
      s.session = base::session_id(s.name);
      s.state = 1;
      batch.push_back(std::move(s));
    }
    ASSERT_TRUE(runner.send(ipc::build_resync(batch, /*more=*/m + 1 < 100)));
    if (m % 8 == 0) d.until([&] { return false; }, 20);
  }
  for (int m = 0; m < 20; ++m) {
    std::vector<ipc::SessionSnapshotInfo> batch;
    for (int i = 0; i < 256; ++i) {
      ipc::SessionSnapshotInfo s;
      s.name = fmt::format("engine-{:06d}", n++);
      s.session = base::session_id(s.name);
      s.state = static_cast<std::uint8_t>(3 + i % 7);  // paused, done, and not states at all
      batch.push_back(std::move(s));
    }
    ASSERT_TRUE(engine.send(ipc::build_resync(batch, false)));
  }
  auto reader = d.connect();
  ASSERT_TRUE(reader.hello(wire::Role::CtlRead, "reader"));
  ASSERT_EQ(reader.ctl("status").first, 0);
  d.until([&] { return false; }, 50);
  const auto f = d.server().footprint();
  EXPECT_LE(f.sessions, 1000u);
  EXPECT_LE(f.session_meta, 1000u);
  EXPECT_LE(f.pending_names, 2000u);
  EXPECT_GT(d.server().stats().resync_refused, 20000u);
  EXPECT_FALSE(runner.closed());
}

// Host effects that grant tool cgroups without touching the host, and
// count them.
class CountingEffects final : public daemon::HostEffects {
 public:
  void set_cpu_weight(sched::SessionId, std::uint32_t) override {}
  void set_cpu_quota(sched::SessionId, std::uint32_t) override {}
  void kill_tools(sched::SessionId, ipc::ToolExitReason) override {}
  void set_sm_partition(sched::EngineId, std::uint32_t) override {}
  void session_gone(sched::SessionId s) override { calls_.erase(s); }
  base::Result<daemon::ToolGrant> prepare_tool(const daemon::ToolRequest& r) override {
    if (r.ahead) {
      ahead_.insert(r.session);
    } else {
      ++calls_[r.session];
    }
    ++granted;
    return daemon::ToolGrant{};
  }
  void tool_started(sched::SessionId s, std::uint32_t, std::int32_t) override {
    if (ahead_.erase(s) != 0) ++calls_[s];  // the ahead one is an ordinary call from now on
  }
  std::size_t tool_cgroups(sched::SessionId s) const override {
    auto it = calls_.find(s);
    return it == calls_.end() ? 0 : it->second;
  }
  bool tool_ahead(sched::SessionId s) const override { return ahead_.contains(s); }
  std::size_t granted = 0;

 private:
  std::map<sched::SessionId, std::size_t> calls_;
  std::set<sched::SessionId> ahead_;
};

TEST(ServerLimits, ToolPreparesAreBoundedPerSessionAndPerClient) {
  CountingEffects effects;
  InProcessDaemon d("[limits]\ntools_per_session = 50\ntools_per_client = 120\nmessages_per_s = 1000000\n", &effects);
  ASSERT_TRUE(d.ok()) << d.error();
  auto runner = d.connect();
  ASSERT_TRUE(runner.hello(wire::Role::Runner, "runner"));
  std::vector<std::uint64_t> sessions;
  for (int i = 0; i < 4; ++i) {
    sessions.push_back(base::session_id(fmt::format("tools-{}", i)));
    ASSERT_TRUE(runner.push(ipc::SessionOpen{}, sessions.back()));
  }
  int refused = 0;
  std::uint32_t request = 1;
  for (std::uint64_t s : sessions) {
    for (std::uint32_t call = 0; call < 750; ++call) {
      ASSERT_TRUE(runner.send(ipc::build_tool_prepare(request++, s, call, 1, {})));
      while (auto m = runner.next(20)) {
        const auto* p = m->message()->payload_as_ToolPlacement();
        if (p == nullptr) continue;
        if (p->code() == ENOSPC) ++refused;
        break;
      }
    }
  }
  EXPECT_EQ(effects.granted, 120u);  // 50 + 50 + 20, then the client's limit
  EXPECT_EQ(refused, 3000 - 120);
  EXPECT_EQ(effects.tool_cgroups(sessions[0]), 50u);
  EXPECT_FALSE(runner.closed());
}

// A placement ahead is one per session and must fit tools_per_session as an
// ordinary call would; unused, it is not counted, so a session holds at most
// one cgroup over the limit, whatever a runner does with TOOL_START. It is
// refused (answered, not dropped) when [tools] ahead is off. Only runners are
// told they may ask one.
TEST(ServerLimits, PlacementsAheadAreOnePerSessionWithinTheLimitsAndOffWhenConfiguredOff) {
  for (const bool on : {true, false}) {
    SCOPED_TRACE(on ? "ahead on" : "ahead off");
    CountingEffects effects;
    InProcessDaemon d(
        std::string("[limits]\ntools_per_session = 3\n[tools]\nahead = ") + (on ? "true" : "false") + "\n", &effects);
    ASSERT_TRUE(d.ok()) << d.error();
    auto runner = d.connect();
    ASSERT_TRUE(runner.hello(wire::Role::Runner, "runner"));
    EXPECT_EQ(runner.tool_ahead(), on);
    auto engine = d.connect();
    ASSERT_TRUE(engine.hello(wire::Role::Engine, "engine", test_engine_info()));
    EXPECT_FALSE(engine.tool_ahead());
    const std::uint64_t s = base::session_id("ahead");
    ASSERT_TRUE(runner.push(ipc::SessionOpen{}, s));
    std::uint32_t request = 1;
    auto answer = [&](std::uint32_t call, bool ahead) -> int {
      if (!runner.send(ipc::build_tool_prepare(request++, s, call, 1, {}, ahead))) return -1;
      while (auto m = runner.next(20)) {
        if (const auto* p = m->message()->payload_as_ToolPlacement()) return p->code();
      }
      return -2;
    };
    EXPECT_EQ(answer(1, false), 0);
    EXPECT_EQ(answer(2, false), 0);
    EXPECT_EQ(answer(3, true), on ? 0 : ENOTSUP);
    EXPECT_EQ(answer(4, true), on ? EBUSY : ENOTSUP) << "one per session";
    EXPECT_EQ(answer(5, false), 0) << "the unused ahead one is not counted";
    EXPECT_EQ(answer(6, false), ENOSPC) << "tools_per_session";
    EXPECT_EQ(effects.tool_cgroups(s) + (effects.tool_ahead(s) ? 1 : 0), on ? 4u : 3u);
    if (on) {
      // A runner that starts every ahead one and asks again gets no further.
      ipc::ToolStart start;
      start.tool_kind = 1;
      start.tool_call = 3;
      ASSERT_TRUE(runner.push(start, s));
      EXPECT_TRUE(d.until([&] { return effects.tool_cgroups(s) == 4u; }));
      EXPECT_EQ(answer(7, true), ENOSPC);
      EXPECT_EQ(effects.tool_cgroups(s), 4u);
      EXPECT_FALSE(effects.tool_ahead(s));
    }
    EXPECT_FALSE(runner.closed());
  }
}

// Over its session limit a runner is told, per session, and stays.
TEST(ServerLimits, OverLimitSessionsAreAnsweredWithoutADisconnect) {
  InProcessDaemon d("[limits]\nsessions_per_client = 3\n");
  ASSERT_TRUE(d.ok()) << d.error();
  auto runner = d.connect();
  ASSERT_TRUE(runner.hello(wire::Role::Runner, "runner"));
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(base::session_id(fmt::format("s-{}", i)));
    ASSERT_TRUE(runner.push(ipc::SessionOpen{}, ids.back()));
  }
  auto reader = d.connect();
  ASSERT_TRUE(reader.hello(wire::Role::CtlRead, "reader"));
  EXPECT_EQ(json::parse(reader.ctl("status").second)["sessions"]["total"], 3);
  const auto errors = runner.take_errors();
  ASSERT_EQ(errors.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(errors[i].code, ENOSPC);
    EXPECT_FALSE(errors[i].fatal);
    EXPECT_EQ(errors[i].session, ids[3 + i]);
  }
  // A name too long and one not UTF-8: answered, not fatal.
  ASSERT_TRUE(runner.send(ipc::build_session_name(ids[0], std::string(300, 'n'))));
  ASSERT_TRUE(runner.send(ipc::build_session_name(ids[0], std::string("\xff", 1))));
  (void)reader.ctl("status");
  const auto more = runner.take_errors();
  ASSERT_EQ(more.size(), 2u);
  EXPECT_EQ(more[0].code, ENAMETOOLONG);
  EXPECT_EQ(more[1].code, EINVAL);
  EXPECT_FALSE(more[0].fatal || more[1].fatal);
  EXPECT_FALSE(runner.closed());
}

// Every answer fits one datagram or pages, whatever the history: thousands
// of long-named sessions, and a policy set thousands of times.
TEST(ServerLimits, AnswersFitOrPageWhateverTheHistory) {
  InProcessDaemon d("[limits]\nsessions_per_client = 10000\nmessages_per_s = 1000000\n");
  ASSERT_TRUE(d.ok()) << d.error();
  auto runner = d.connect();
  ASSERT_TRUE(runner.hello(wire::Role::Runner, "runner"));
  std::vector<ipc::SessionSnapshotInfo> all;
  for (int i = 0; i < 3000; ++i) {
    ipc::SessionSnapshotInfo s;
    s.name = fmt::format("{:04d}-{}", i, std::string(240, 'n'));
    s.session = base::session_id(s.name);
    s.state = 1;
    all.push_back(std::move(s));
  }
  for (std::size_t i = 0; i < all.size(); i += 200) {
    std::span<const ipc::SessionSnapshotInfo> part(all.data() + i, std::min<std::size_t>(200, all.size() - i));
    ASSERT_TRUE(runner.send(ipc::build_resync(part, i + 200 < all.size())));
  }
  auto admin = d.connect();
  ASSERT_TRUE(admin.hello(wire::Role::CtlAdmin, "admin"));
  std::set<std::string> listed;
  std::string cursor;
  int pages = 0;
  do {
    std::string next;
    auto [status, body] = admin.ctl("sessions", {}, cursor, &next);
    ASSERT_EQ(status, 0) << body;
    EXPECT_LE(body.size(), ipc::kMaxMessageSize);
    const json page = json::parse(body);
    for (const auto& s : page["sessions"]) listed.insert(s["id"].get<std::string>());
    cursor = next;
    ++pages;
  } while (!cursor.empty() && pages < 100);
  EXPECT_EQ(listed.size(), 3000u);
  EXPECT_GT(pages, 1);
  // The metrics page too, and the policy stays small after many sets.
  for (int i = 0; i < 2000; ++i) {
    ASSERT_EQ(admin.ctl("policy", {"set", "window_max", std::to_string(8 + i % 50)}).first, 0);
  }
  for (const char* command : {"policy", "status"}) {
    auto [status, body] = admin.ctl(command);
    EXPECT_EQ(status, 0);
    EXPECT_LT(body.size(), 16384u) << command;
  }
}

}  // namespace
}  // namespace tandem::testing
