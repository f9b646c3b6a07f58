// The daemon's parts on their own, without a Server (docs/architecture.md
// "The daemon's parts"): Control behind a fake ControlOutlet, CtlService
// over a fake CtlView and CtlCommands, Clients and its limits.
#include <sys/socket.h>

#include <cerrno>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon/clients.h"
#include "daemon/control.h"
#include "daemon/ctl_service.h"
#include "daemon/directory.h"
#include "daemon/hello.h"
#include "ipc/messages.h"
#include "sched/registry.h"
#include "tests/engine_info.h"

namespace tandem::daemon {
namespace {

using base::Time;
using nlohmann::json;
constexpr sched::SessionId kA = 0xA;
constexpr sched::SessionId kB = 0xB;
constexpr sched::EngineId kE = 1;

Time at(int ms) { return base::from_ns(std::int64_t{ms} * 1'000'000); }

sched::EngineParams engine_params() {
  sched::EngineParams p;
  p.total_blocks = 1000;
  return p;
}

// Writes down where Control's decisions went.
class FakeOutlet final : public ControlOutlet {
 public:
  std::vector<std::string> directives;              // "ADMIT a to 1"
  std::map<sched::SessionId, SessionSteer> steers;  // the sessions the daemon keeps a record of
  std::map<sched::EngineId, GpuChoice> engines;     // the engines connected
  std::vector<EventLog::Kind> notes;

  void send_directive(sched::EngineId engine, const ipc::Slot& record) override {
    ipc::RecordDecoder decoder{ipc::Direction::kToClient};
    ipc::Record r;
    ASSERT_EQ(decoder.decode(record, r), ipc::DecodeStatus::kOk);
    directives.push_back(fmt::format("{} {:x} to {}", ipc::record_type_name(r.type()), r.session(), engine));
  }
  SessionSteer* steer(sched::SessionId id) override {
    auto it = steers.find(id);
    return it == steers.end() ? nullptr : &it->second;
  }
  GpuChoice* gpu_choice(sched::EngineId engine) override {
    auto it = engines.find(engine);
    return it == engines.end() ? nullptr : &it->second;
  }
  void note(Time /*now*/, EventLog::Kind kind, sched::SessionId /*session*/,
            std::array<std::int64_t, 4> /*v*/) override {
    notes.push_back(kind);
  }
};

class ControlPart : public ::testing::Test {
 protected:
  void SetUp() override {
    auto policy = sched::make_policy("fcfs");
    ASSERT_TRUE(policy) << policy.error().message();
    control_.install_policy(std::move(*policy));
    outlet_.engines[kE];
    ASSERT_TRUE(control_.feed(sched::EngineJoined{kE, engine_params()}, at(0)));
  }
  // Session `id` waiting with a round submitted to kE.
  void open(sched::SessionId id) {
    ASSERT_TRUE(control_.feed(sched::SessionOpened{id, 0, 3}, at(1)));
    ASSERT_TRUE(control_.feed(sched::RoundSubmitted{id, kE, 0, 100, 0, 7}, at(2)));
  }

  RecordingEffects effects_;
  ServerStats stats_;
  FakeOutlet outlet_;
  Control control_{effects_, stats_, outlet_};
};

TEST_F(ControlPart, ActionsBecomeDirectivesEffectsAndTheSessionsSteering) {
  EXPECT_EQ(control_.epoch(), 1u);
  outlet_.steers[kA];
  open(kA);
  control_.apply({sched::ActionKind::kAdmit, kA}, at(3));
  control_.apply({sched::ActionKind::kSetPriority, kA, sched::kNoEngine, 2}, at(4));
  control_.apply({sched::ActionKind::kSetCpuWeight, kA, sched::kNoEngine, 250}, at(5));
  control_.apply({sched::ActionKind::kSetCpuQuota, kA, sched::kNoEngine, 50'000}, at(6));
  control_.apply({sched::ActionKind::kKillTools, kA}, at(7));
  control_.apply({sched::ActionKind::kSetSmPartition, 0, kE, 3}, at(8));

  EXPECT_EQ(outlet_.directives, (std::vector<std::string>{"ADMIT a to 1", "PRIORITY a to 1"}));
  const SessionSteer& steer = outlet_.steers[kA];
  EXPECT_EQ(steer.told, kE);
  EXPECT_EQ(steer.priority, 2);
  EXPECT_EQ(steer.cpu_weight, 250);
  EXPECT_EQ(steer.cpu_quota, 50'000);
  ASSERT_NE(effects_.session(kA), nullptr);
  EXPECT_EQ(effects_.session(kA)->cpu_weight, 250);
  EXPECT_EQ(effects_.session(kA)->cpu_quota, 50'000);
  EXPECT_EQ(effects_.session(kA)->kills, 1u);
  EXPECT_EQ(effects_.partitions().at(kE), 3u);
  EXPECT_TRUE(outlet_.engines[kE].sm_partition_set);
  EXPECT_EQ(outlet_.engines[kE].sm_partition, 3u);
  EXPECT_EQ(stats_.effects_cpu_weight, 1u);
  EXPECT_EQ(stats_.effects_cpu_quota, 1u);
  EXPECT_EQ(stats_.effects_kill_tools, 1u);
  EXPECT_EQ(stats_.effects_sm_partition, 1u);
  EXPECT_EQ(outlet_.notes, (std::vector<EventLog::Kind>{EventLog::Kind::kSessionOpen, EventLog::Kind::kRoundSubmit,
                                                        EventLog::Kind::kAdmit, EventLog::Kind::kKillTools}));
}

TEST_F(ControlPart, ASessionWithoutARecordStillGetsItsDirective) {
  open(kB);  // no steers[kB]: the daemon keeps nothing for it
  control_.apply({sched::ActionKind::kAdmit, kB}, at(3));
  EXPECT_EQ(outlet_.directives, (std::vector<std::string>{"ADMIT b to 1"}));
  EXPECT_EQ(outlet_.steers.count(kB), 0u);
}

TEST_F(ControlPart, DrainingAdmitsNothingAndAnEngineGoneTakesNoPartition) {
  open(kA);
  control_.set_draining(true);
  control_.apply({sched::ActionKind::kAdmit, kA}, at(3));
  EXPECT_TRUE(outlet_.directives.empty());
  EXPECT_EQ(control_.model().sessions().find(kA)->state, sched::SessionState::kWaiting);

  outlet_.engines.clear();  // no engine of that id is connected any more
  control_.apply({sched::ActionKind::kSetSmPartition, 0, kE, 3}, at(4));
  EXPECT_TRUE(effects_.partitions().empty());
  EXPECT_EQ(stats_.effects_sm_partition, 0u);
}

// ---- CtlService ------------------------------------------------------------------

// A daemon as tandemctl sees it: what the view shows is set by the test.
class FakeDaemon final : public CtlView, public CtlCommands {
 public:
  FakeDaemon() {
    Config cfg;
    cfg.nvml.enabled = "off";
    auto compiled = CompiledConfig::compile(std::move(cfg));
    EXPECT_TRUE(compiled) << compiled.error().message();
    config_ = std::move(compiled->config);
    policy_ = std::move(compiled->policy);
    auto telemetry = GpuTelemetry::start(config_->config().nvml);
    EXPECT_TRUE(telemetry) << telemetry.error().message();
    telemetry_ = std::move(*telemetry);
  }

  // The view.
  const CompiledConfig& config() const override { return *config_; }
  const sched::ControlPolicy& policy() const override { return *policy_.control; }
  std::uint64_t policy_epoch() const override { return 7; }
  const sched::NodeModel& model() const override { return node; }
  const GpuPlane& gpu_plane() const override { return gpu_; }
  const ServerStats& stats() const override { return stats_; }
  Footprint footprint() const override { return {}; }
  Time started() const override { return at(0); }
  bool draining() const override { return draining_; }
  void for_each_client(const std::function<void(const ClientCard&)>& f) const override {
    for (const ClientCard& c : cards) f(c);
  }
  std::optional<ClientCard> client(std::uint32_t id) const override {
    for (const ClientCard& c : cards) {
      if (c.id == id) return c;
    }
    return std::nullopt;
  }
  std::optional<SessionCard> session(sched::SessionId /*id*/) const override { return std::nullopt; }
  void for_each_session(const std::function<void(sched::SessionId, const SessionCard&)>& /*f*/) const override {}
  const EventLog& events() const override { return log_; }
  const HostEffects& host() const override { return effects_; }
  const GpuTelemetry& gpu_telemetry() const override { return *telemetry_; }
  const MetricsEndpoints& metrics() const override { return metrics_; }
  const std::string& kv_events_state() const override { return kv_events_state_; }

  // The commands.
  void refresh() override { ++refreshed; }
  base::Result<void> reload() override { return base::make_error(ENOTSUP, "no file"); }
  base::Result<void> apply_config(Compiled /*fresh*/, std::string_view /*why*/) override { return {}; }
  void set_draining(bool on, Time /*now*/) override {
    draining_ = on;
    ++drains;
  }
  void evict_session(sched::SessionId id, Time /*now*/) override { evicted.push_back(id); }
  std::vector<std::int32_t> kill_session(sched::SessionId id, Time /*now*/) override {
    killed.push_back(id);
    return survivors;
  }

  sched::NodeModel node;
  std::vector<ClientCard> cards;
  int refreshed = 0;
  int drains = 0;
  std::vector<sched::SessionId> evicted;
  std::vector<sched::SessionId> killed;
  std::vector<std::int32_t> survivors;

 private:
  std::shared_ptr<const CompiledConfig> config_;
  sched::PolicyInstance policy_;
  GpuPlane gpu_{GpuConfig{}};
  ServerStats stats_;
  bool draining_ = false;
  EventLog log_{at(0)};
  RecordingEffects effects_;
  std::unique_ptr<GpuTelemetry> telemetry_;
  MetricsEndpoints metrics_;
  std::string kv_events_state_ = "off";
};

class CtlPart : public ::testing::Test {
 protected:
  // The status and body of the answer to `command` from a client of `role`.
  std::pair<int, std::string> ask(Role role, const std::string& command, const std::vector<std::string>& args = {}) {
    const std::vector<std::uint8_t> request = ipc::build_ctl_request(command, args, true);
    auto req = ipc::verify_message(request);
    EXPECT_TRUE(req);
    const std::vector<std::uint8_t> answer = ctl_.handle(role, *(*req)->payload_as_CtlRequest());
    auto msg = ipc::verify_message(answer);
    EXPECT_TRUE(msg);
    EXPECT_EQ((*msg)->payload_type(), wire::Payload::CtlResponse);
    const auto* r = (*msg)->payload_as_CtlResponse();
    return {r->status(), r->body() != nullptr ? r->body()->str() : ""};
  }

  base::VirtualClock clock_;
  FakeDaemon daemon_;
  CtlService ctl_{daemon_, daemon_, clock_};
};

TEST_F(CtlPart, StatusReadsOnlyTheView) {
  ClientCard engine;
  engine.id = 1;
  engine.active = true;
  engine.role = Role::kEngine;
  ClientCard leaving = engine;
  leaving.id = 2;
  leaving.active = false;  // being removed: not counted
  daemon_.cards = {engine, leaving};
  const auto [code, body] = ask(Role::kCtlRead, "status");
  ASSERT_EQ(code, 0) << body;
  const json j = json::parse(body);
  EXPECT_EQ(j["clients"]["engine"], 1);
  EXPECT_EQ(j["policy"]["epoch"], 7);
  EXPECT_EQ(j["draining"], false);
  EXPECT_EQ(j["metrics"]["listen"], "off");
  EXPECT_EQ(daemon_.refreshed, 1);  // the rings are taken before any answer
}

TEST_F(CtlPart, SteeringGoesThroughTheCommandsAndOnlyForAdmins) {
  EXPECT_EQ(ask(Role::kCtlRead, "drain").first, EPERM);
  EXPECT_EQ(ask(Role::kRunner, "status").first, EPERM);
  EXPECT_EQ(daemon_.drains, 0);

  const auto [code, body] = ask(Role::kCtlAdmin, "drain");
  ASSERT_EQ(code, 0) << body;
  EXPECT_EQ(daemon_.drains, 1);
  EXPECT_EQ(json::parse(body)["draining"], true);

  const auto [reload_code, reload_body] = ask(Role::kCtlAdmin, "reload");
  EXPECT_EQ(reload_code, ENOTSUP);
  EXPECT_EQ(reload_body, "no file");
}

TEST_F(CtlPart, SessionKillNamesTheLiveSessionAndReportsSurvivors) {
  EXPECT_EQ(ask(Role::kCtlAdmin, "session-kill", {"0xa"}).first, ENOENT);
  EXPECT_TRUE(daemon_.killed.empty());

  ASSERT_TRUE(daemon_.node.observe(sched::SessionOpened{kA, 0, 3}, at(1)));
  daemon_.survivors = {4242};
  const auto [code, body] = ask(Role::kCtlAdmin, "session-kill", {"0xa"});
  EXPECT_EQ(code, EBUSY);
  EXPECT_NE(body.find("4242"), std::string::npos) << body;
  EXPECT_EQ(daemon_.killed, (std::vector<sched::SessionId>{kA}));

  daemon_.survivors.clear();
  const auto [ok, ok_body] = ask(Role::kCtlAdmin, "session-kill", {"0xa"});
  EXPECT_EQ(ok, 0) << ok_body;
  EXPECT_EQ(json::parse(ok_body)["killed"], true);

  // Evicting needs the session's KV on an engine; this one has none yet.
  EXPECT_EQ(ask(Role::kCtlAdmin, "session-evict", {"0xa"}).first, EAGAIN);
  EXPECT_TRUE(daemon_.evicted.empty());
}

// ---- Clients ---------------------------------------------------------------------

TEST(ClientsPart, LimitsAreJudgedFromTheRegistry) {
  Limits limits;
  limits.max_clients = 4;
  limits.reserved_clients = 1;
  limits.clients_per_uid = 2;
  Clients clients;
  const ucred alice{.pid = 100, .uid = 1000, .gid = 1000};
  EXPECT_EQ(clients.refusal(limits, alice, true, false, 0), "");
  Client& first = clients.add(base::UniqueFd(), alice, at(0), limits);
  Client& second = clients.add(base::UniqueFd(), alice, at(0), limits);
  EXPECT_EQ(first.id, 1u);
  EXPECT_EQ(second.id, 2u);
  EXPECT_EQ(clients.of_uid(1000), 2u);
  EXPECT_NE(clients.refusal(limits, alice, true, false, 0).find("clients_per_uid"), std::string::npos);
  EXPECT_EQ(clients.refusal(limits, alice, true, true, 0), "");  // trusted: no per-uid share
  // A handle held for the uid counts too.
  const ucred bob{.pid = 200, .uid = 1001, .gid = 1001};
  EXPECT_EQ(clients.refusal(limits, bob, true, false, 1), "");
  EXPECT_NE(clients.refusal(limits, bob, true, false, 2).find("clients_per_uid"), std::string::npos);
  // The last slot is kept for engines and runners.
  clients.add(base::UniqueFd(), bob, at(0), limits);
  EXPECT_NE(clients.refusal(limits, bob, false, true, 0).find("reserved"), std::string::npos);
  EXPECT_EQ(clients.refusal(limits, bob, true, true, 0), "");

  // Marked for removal: listed until swept, but not found nor counted.
  first.doom.marked = true;
  EXPECT_EQ(clients.find(1), nullptr);
  EXPECT_NE(clients.entry(1), nullptr);
  EXPECT_EQ(clients.of_uid(1000), 1u);
  EXPECT_EQ(clients.size(), 3u);
}

TEST(ClientsPart, ErrorsAreBudgetedPerSecond) {
  Client c;
  int sent = 0;
  for (int i = 0; i < 100; ++i) sent += Clients::take_error(c, at(10)) ? 1 : 0;
  EXPECT_EQ(sent, 64);
  EXPECT_TRUE(Clients::take_error(c, at(1010)));  // a new second
}

// ---- the handshake's verdict (judge_hello) ------------------------------------------

class HelloPart : public ::testing::Test {
 protected:
  HelloPart() {
    Config cfg;
    cfg.nvml.enabled = "off";
    cfg.role(Role::kEngine).uids = {1000};
    cfg.limits.max_clients = 4;
    cfg.limits.reserved_clients = 1;
    auto compiled = CompiledConfig::compile(std::move(cfg));
    EXPECT_TRUE(compiled) << compiled.error().message();
    config_ = std::move(compiled->config);
  }

  // `hello`'s verdict for a peer of uid `uid` (gid the same), the daemon
  // running as root.
  HelloVerdict judge(const std::vector<std::uint8_t>& hello, uid_t uid = 1000) {
    auto msg = ipc::verify_message(hello);
    EXPECT_TRUE(msg) << msg.error().message();
    return judge_hello(*(*msg)->payload_as_Hello(), *config_, uid, uid, 0, clients_);
  }

  // The tests' engine, with a GPU and a saturation point of its own.
  static ipc::EngineInfo engine_info() {
    ipc::EngineInfo e = test_support::test_engine_info();
    e.gpu_index = 2;
    e.saturating_tokens = 512;
    return e;
  }

  std::shared_ptr<const CompiledConfig> config_;
  Clients clients_;
};

TEST_F(HelloPart, AnEngineGrantedItsRoleGetsItsParameters) {
  const HelloVerdict v = judge(ipc::build_hello(wire::Role::Engine, "engine-a", 1, engine_info(), 77));
  ASSERT_TRUE(v.taken) << v.why;
  EXPECT_EQ(v.terms.role, Role::kEngine);
  EXPECT_EQ(v.terms.name, "engine-a");
  EXPECT_EQ(v.terms.instance, 77u);
  EXPECT_EQ(v.terms.engine.total_blocks, 1000u);
  EXPECT_EQ(v.terms.engine.token_budget, 2048u);
  EXPECT_EQ(v.terms.engine.max_model_len, sched::EngineParams{}.max_model_len) << "0 means unknown";
  EXPECT_EQ(v.terms.gpu_index, 2);
  EXPECT_EQ(v.terms.saturating_tokens, 512u);
}

TEST_F(HelloPart, EachRefusalNamesItsReason) {
  // A role the peer's uid is not granted: refused before anything else is read.
  HelloVerdict v = judge(ipc::build_hello(wire::Role::Runner, "runner-a", 1), 1000);
  EXPECT_FALSE(v.taken);
  EXPECT_EQ(v.code, EACCES);
  EXPECT_NE(v.why.find("uid 1000 (gid 1000) may not connect as runner"), std::string::npos) << v.why;
  EXPECT_FALSE(v.identified);
  // The daemon's own user (root here) may take any role.
  EXPECT_TRUE(judge(ipc::build_hello(wire::Role::Runner, "runner-a", 1), 0).taken);

  // A bad client name: counted as a refused name.
  v = judge(ipc::build_hello(wire::Role::Engine, std::string("bad\nname"), 1, engine_info()));
  EXPECT_FALSE(v.taken);
  EXPECT_TRUE(v.bad_name);
  EXPECT_NE(v.why.find("client name"), std::string::npos) << v.why;

  // Engine parameters: required of an engine, each > 0, and only an engine's.
  v = judge(ipc::build_hello(wire::Role::Engine, "engine-a", 1));
  EXPECT_EQ(v.code, EINVAL);
  EXPECT_EQ(v.why, "an engine's Hello must carry its engine parameters");
  EXPECT_TRUE(v.identified) << "logged under its role and name";
  EXPECT_EQ(v.terms.name, "engine-a");
  ipc::EngineInfo zero = engine_info();
  zero.max_seqs = 0;
  v = judge(ipc::build_hello(wire::Role::Engine, "engine-a", 1, zero));
  EXPECT_EQ(v.why, "engine parameter max_seqs must be > 0");
  v = judge(ipc::build_hello(wire::Role::CtlRead, "reader", 1, engine_info()));
  EXPECT_EQ(v.why, "only an engine's Hello carries engine parameters, not a ctl_read's");
}

TEST_F(HelloPart, CtlClientsNeverTakeTheReservedSlots) {
  const ucred peer{.pid = 5, .uid = 1000, .gid = 1000};
  for (int i = 0; i < 3; ++i) {  // three readers connected: all the slots but the reserved one
    Client& reader = clients_.add(base::UniqueFd(), peer, at(0), config_->config().limits);
    reader.role = Role::kCtlRead;
    reader.phase = Phase::kActive;
  }
  const HelloVerdict v = judge(ipc::build_hello(wire::Role::CtlRead, "reader", 1));
  EXPECT_FALSE(v.taken);
  EXPECT_TRUE(v.over_limit);
  EXPECT_EQ(v.code, EAGAIN);
  EXPECT_TRUE(judge(ipc::build_hello(wire::Role::Engine, "engine-b", 1, engine_info())).taken)
      << "the reserved slot is an engine's";
}

// ---- SessionDirectory --------------------------------------------------------------

Client engine_client(std::uint32_t id) {
  Client c;
  c.id = id;
  c.role = Role::kEngine;
  return c;
}

Client runner_client(std::uint32_t id, std::uint32_t handle) {
  Client c;
  c.id = id;
  c.role = Role::kRunner;
  c.owner = handle;
  return c;
}

// Who is charged for a session under limits.sessions_per_client, as it moves
// from the engine that opened it to a runner and out of the table.
TEST(SessionDirectoryPart, ASessionIsChargedToItsEngineUntilARunnerTakesItThenToTheRunner) {
  SessionDirectory dir;
  Client engine = engine_client(7);
  Owner& handle = dir.owners().add(OwnerKey{1000, 42, 5, 9});
  Client runner = runner_client(8, handle.id);
  runner.pending_names[0xc] = "named-early";

  SessionMeta& a = dir.meta_for(engine, 0xa);
  EXPECT_EQ(a.creator, 7u);
  EXPECT_EQ(a.owner, 0u);
  (void)dir.meta_for(engine, 0xb);
  (void)dir.meta_for(engine, 0xa);  // already held: charged once
  EXPECT_EQ(dir.held(engine), 2u);
  EXPECT_EQ(dir.held(runner), 0u);
  EXPECT_EQ(dir.unowned_of(7).size(), 2u);

  // The runner takes 0xa over: the engine is charged no more for it.
  dir.set_owner(runner, 0xa, *dir.find(0xa));
  EXPECT_EQ(dir.find(0xa)->owner, handle.id);
  EXPECT_EQ(dir.find(0xa)->creator, 0u);
  EXPECT_EQ(dir.find(0xa)->attached_conn, 8u);
  EXPECT_EQ(dir.held(engine), 1u);
  EXPECT_EQ(dir.held(runner), 1u);
  EXPECT_EQ(dir.unowned_of(7), std::vector<sched::SessionId>{0xb});

  // A runner's new session is its handle's, with the name it sent first.
  SessionMeta& c = dir.meta_for(runner, 0xc);
  EXPECT_EQ(c.owner, handle.id);
  EXPECT_EQ(c.name, "named-early");
  EXPECT_EQ(dir.held(runner), 2u);
  EXPECT_TRUE(runner.pending_names.empty());
  runner.pending_names[0xa] = "too-late";
  (void)dir.meta_for(runner, 0xa);
  EXPECT_TRUE(dir.find(0xa)->name.empty()) << "names are taken when a session is first held, not after";

  // Out of the table: nobody is charged for it.
  dir.erase(0xa);
  dir.erase(0xb);
  EXPECT_EQ(dir.find(0xa), nullptr);
  EXPECT_EQ(dir.held(runner), 1u);
  EXPECT_EQ(dir.held(engine), 0u);
  dir.erase(0xdead);  // unknown: nothing
  EXPECT_EQ(dir.size(), 1u);
}

TEST(SessionDirectoryPart, AnEngineGoneIsChargedForNothingAndARestoredSessionIsItsHandles) {
  SessionDirectory dir;
  Client engine = engine_client(3);
  (void)dir.meta_for(engine, 0x1);
  (void)dir.meta_for(engine, 0x2);
  dir.engine_gone(3);
  EXPECT_EQ(dir.held(engine), 0u);
  EXPECT_EQ(dir.find(0x1)->creator, 0u);
  EXPECT_TRUE(dir.unowned_of(3).empty());
  dir.erase(0x1);  // its charge is gone already: nothing goes below zero
  EXPECT_EQ(dir.held(engine), 0u);

  Owner& handle = dir.owners().add(OwnerKey{1000, 43, 6, 1});
  dir.restore(0x9, handle);
  EXPECT_EQ(dir.find(0x9)->owner, handle.id);
  EXPECT_TRUE(handle.sessions.contains(0x9));
  EXPECT_EQ(dir.held(runner_client(4, handle.id)), 1u);
}

}  // namespace
}  // namespace tandem::daemon
