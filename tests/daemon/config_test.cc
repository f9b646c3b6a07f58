// tandemd.toml parsing, validation, compilation and role checks.
#include "daemon/config.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <string>

namespace tandem::daemon {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Parses text that must be rejected; returns the error context.
std::string bad(std::string_view text, int code = EINVAL) {
  auto r = parse_config(text, "tandemd.toml");
  EXPECT_FALSE(r) << "accepted:\n" << text;
  if (r) return {};
  EXPECT_EQ(r.error().code(), code) << r.error().message();
  return r.error().context();
}

TEST(Config, Defaults) {
  Config c;
  EXPECT_EQ(c.runtime_dir, "/run/tandem");
  EXPECT_EQ(c.log_level, "info");
  EXPECT_EQ(c.policy, "tandem");
  EXPECT_TRUE(c.policy_params.empty());
  EXPECT_EQ(c.tick, 50ms);
  EXPECT_EQ(c.event_slots, 4096u);
  EXPECT_EQ(c.directive_slots, 1024u);
  EXPECT_EQ(c.limits.max_clients, 256u);
  EXPECT_EQ(c.limits.sessions_per_client, 4096u);
  EXPECT_EQ(c.limits.records_per_s, 200000u);
  EXPECT_EQ(c.limits.messages_per_s, 500u);
  EXPECT_EQ(c.limits.pump_batch, 256u);
  EXPECT_EQ(c.source, "<defaults>");
  for (Role r : {Role::kEngine, Role::kRunner, Role::kCtlAdmin}) {
    EXPECT_FALSE(c.role(r).anyone) << to_string(r);
    EXPECT_TRUE(c.role(r).uids.empty());
    EXPECT_TRUE(c.role(r).gids.empty());
  }
  EXPECT_TRUE(c.role(Role::kCtlRead).anyone);
  EXPECT_TRUE(validate(c));

  // An empty file is the defaults, with its source recorded.
  auto parsed = parse_config("", "empty.toml");
  ASSERT_TRUE(parsed) << parsed.error().message();
  EXPECT_EQ(parsed->source, "empty.toml");
  EXPECT_EQ(parsed->tick, 50ms);
  EXPECT_TRUE(parsed->role(Role::kCtlRead).anyone);
  EXPECT_FALSE(parsed->role(Role::kCtlAdmin).anyone);
}

TEST(Config, RoleNames) {
  EXPECT_EQ(to_string(Role::kEngine), "engine");
  EXPECT_EQ(to_string(Role::kRunner), "runner");
  EXPECT_EQ(to_string(Role::kCtlRead), "ctl_read");
  EXPECT_EQ(to_string(Role::kCtlAdmin), "ctl_admin");
}

TEST(Config, FullFileRoundTripsEveryField) {
  constexpr std::string_view kText = R"(
runtime_dir = "/var/run/tandem-test"
log_level = "debug"

[policy]
name = "mars"
tick_ms = 20

[policy.params]
window_max = 64
window_min = 8.0

[roles.engine]
uids = [1000, "1001", "root"]
gids = [27, "root"]
anyone = false

[roles.runner]
anyone = true

[roles.ctl_read]
anyone = false
uids = [5]

[roles.ctl_admin]
gids = [4]

[limits]
max_clients = 10
sessions_per_client = 20
records_per_s = 30
messages_per_s = 40
pump_batch = 50

[ipc]
event_slots = 128
directive_slots = 64
)";
  auto r = parse_config(kText, "/etc/tandem/tandemd.toml");
  ASSERT_TRUE(r) << r.error().message();
  const Config& c = *r;
  EXPECT_EQ(c.source, "/etc/tandem/tandemd.toml");
  EXPECT_EQ(c.runtime_dir, "/var/run/tandem-test");
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.policy, "mars");
  EXPECT_EQ(c.tick, 20ms);
  EXPECT_EQ(c.policy_params, (std::map<std::string, double>{{"window_max", 64.0}, {"window_min", 8.0}}));
  EXPECT_EQ(c.role(Role::kEngine).uids, (std::vector<uid_t>{1000, 1001, 0}));
  EXPECT_EQ(c.role(Role::kEngine).gids, (std::vector<gid_t>{27, 0}));
  EXPECT_FALSE(c.role(Role::kEngine).anyone);
  EXPECT_TRUE(c.role(Role::kRunner).anyone);
  EXPECT_FALSE(c.role(Role::kCtlRead).anyone) << "an explicit false overrides the default";
  EXPECT_EQ(c.role(Role::kCtlRead).uids, (std::vector<uid_t>{5}));
  EXPECT_EQ(c.role(Role::kCtlAdmin).gids, (std::vector<gid_t>{4}));
  EXPECT_FALSE(c.role(Role::kCtlAdmin).anyone);
  EXPECT_EQ(c.limits.max_clients, 10u);
  EXPECT_EQ(c.limits.sessions_per_client, 20u);
  EXPECT_EQ(c.limits.records_per_s, 30u);
  EXPECT_EQ(c.limits.messages_per_s, 40u);
  EXPECT_EQ(c.limits.pump_batch, 50u);
  EXPECT_EQ(c.event_slots, 128u);
  EXPECT_EQ(c.directive_slots, 64u);

  std::string d = describe(c);
  EXPECT_THAT(d, HasSubstr("/etc/tandem/tandemd.toml"));
  EXPECT_THAT(d, HasSubstr("mars, tick 20 ms"));
  EXPECT_THAT(d, HasSubstr("window_max = 64"));
  EXPECT_THAT(d, HasSubstr("uids 1000, 1001, 0"));
  EXPECT_THAT(d, HasSubstr("runner    anyone"));
}

TEST(Config, BooleanParamsAreSwitches) {
  auto r = parse_config("[policy.params]\nresidency = false\noffload = true\n", "t.toml");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->policy_params.at("residency"), 0.0);
  EXPECT_EQ(r->policy_params.at("offload"), 1.0);
}

TEST(Config, UnknownTopLevelKey) {
  std::string e = bad("runtime_dri = \"/run/x\"\n");
  EXPECT_THAT(e, HasSubstr("tandemd.toml: runtime_dri: unknown key"));
  EXPECT_THAT(e, HasSubstr("runtime_dir")) << "lists the known keys";
}

TEST(Config, UnknownTable) {
  EXPECT_THAT(bad("[limit]\nmax_clients = 3\n"), HasSubstr("tandemd.toml: limit: unknown table"));
  EXPECT_THAT(bad("[limits]\nmax_client = 3\n"), HasSubstr("limits.max_client: unknown key"));
  EXPECT_THAT(bad("[policy]\ntick = 3\n"), HasSubstr("policy.tick: unknown key"));
  EXPECT_THAT(bad("[roles.admin]\nanyone = true\n"), HasSubstr("roles.admin: unknown role"));
  EXPECT_THAT(bad("[roles.engine]\nusers = [1]\n"), HasSubstr("roles.engine.users: unknown key"));
  EXPECT_THAT(bad("[ipc]\nslots = 64\n"), HasSubstr("ipc.slots: unknown key"));
}

TEST(Config, WrongType) {
  EXPECT_THAT(bad("[limits]\nmax_clients = \"many\"\n"),
              HasSubstr("limits.max_clients: expected an integer, got a string"));
  EXPECT_THAT(bad("runtime_dir = 5\n"), HasSubstr("runtime_dir: expected a string, got an integer"));
  EXPECT_THAT(bad("policy = \"mars\"\n"), HasSubstr("policy: expected a table, got a string"));
  EXPECT_THAT(bad("[policy]\ntick_ms = 2.5\n"), HasSubstr("policy.tick_ms: expected an integer, got a float"));
  EXPECT_THAT(bad("[roles.runner]\nanyone = 1\n"), HasSubstr("roles.runner.anyone: expected a boolean"));
  EXPECT_THAT(bad("[roles.runner]\nuids = 1000\n"), HasSubstr("roles.runner.uids: expected an array"));
  EXPECT_THAT(bad("[roles.runner]\nuids = [1000, 1.5]\n"),
              HasSubstr("roles.runner.uids[1]: expected a user id or name, got a float"));
  EXPECT_THAT(bad("[policy.params]\nwindow_max = \"64\"\n"),
              HasSubstr("policy.params.window_max: expected a number or a boolean, got a string"));
}

TEST(Config, OutOfRangeNumbers) {
  EXPECT_THAT(bad("[limits]\nmax_clients = 0\n"),
              HasSubstr("tandemd.toml: limits.max_clients: must be between 1 and 65536, got 0"));
  EXPECT_THAT(bad("[limits]\nsessions_per_client = 1048577\n"),
              HasSubstr("limits.sessions_per_client: must be between 1 and 1048576, got 1048577"));
  EXPECT_THAT(bad("[limits]\nrecords_per_s = -1\n"), HasSubstr("limits.records_per_s: must be between"));
  // Larger than uint32: caught before narrowing, not wrapped.
  EXPECT_THAT(bad("[limits]\nmessages_per_s = 4294967297\n"), HasSubstr("got 4294967297"));
  EXPECT_THAT(bad("[limits]\npump_batch = 65537\n"), HasSubstr("limits.pump_batch"));
  EXPECT_THAT(bad("[policy]\ntick_ms = 0\n"), HasSubstr("policy.tick_ms: must be between 1 and 10000, got 0"));
  EXPECT_THAT(bad("[policy]\ntick_ms = 10001\n"), HasSubstr("policy.tick_ms"));
  EXPECT_THAT(bad("[ipc]\nevent_slots = 32\n"), HasSubstr("ipc.event_slots: must be between 64 and 1048576, got 32"));
  EXPECT_THAT(bad("[roles.engine]\nuids = [-1]\n"), HasSubstr("roles.engine.uids[0]: must be between 0 and"));
  EXPECT_THAT(bad("[roles.engine]\ngids = [\"4294967295\"]\n"), HasSubstr("roles.engine.gids[0]"));

  // The edges are accepted.
  auto r = parse_config("[limits]\nmax_clients = 65536\n[policy]\ntick_ms = 10000\n[ipc]\nevent_slots = 1048576\n",
                        "t.toml");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->tick, 10s);
}

TEST(Config, ToolPoolKeysAndTheirBounds) {
  auto r = parse_config("[tools]\npool_max = 0\npool_per_session = 256\npool_idle = \"5s\"\n", "t.toml");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->host.pool_max, 0u);
  EXPECT_EQ(r->host.pool_per_session, 256u);
  EXPECT_EQ(r->host.pool_idle, 5s);
  const HostConfig d;
  EXPECT_EQ(d.pool_max, 64u);
  EXPECT_EQ(d.pool_per_session, 8u);
  EXPECT_EQ(d.pool_idle, 30s);
  EXPECT_THAT(bad("[tools]\npool_max = 4097\n"), HasSubstr("tools.pool_max: must be between 0 and 4096, got 4097"));
  EXPECT_THAT(bad("[tools]\npool_max = -1\n"), HasSubstr("tools.pool_max"));
  EXPECT_THAT(bad("[tools]\npool_per_session = 0\n"), HasSubstr("tools.pool_per_session: must be between 1 and 256"));
  EXPECT_THAT(bad("[tools]\npool_idle = \"10ms\"\n"), HasSubstr("tools.pool_idle: must be between 1s and 24h"));
  EXPECT_THAT(bad("[tools]\npool_size = 3\n"), HasSubstr("pool_per_session"));  // the known keys are listed
}

TEST(Config, SlotsMustBePowersOfTwo) {
  EXPECT_THAT(bad("[ipc]\nevent_slots = 1000\n"), HasSubstr("ipc.event_slots: must be a power of two, got 1000"));
  EXPECT_THAT(bad("[ipc]\ndirective_slots = 96\n"), HasSubstr("ipc.directive_slots: must be a power of two"));
}

TEST(Config, RuntimeDirMustBeAbsolute) {
  EXPECT_THAT(bad("runtime_dir = \"run/tandem\"\n"), HasSubstr("runtime_dir: must be an absolute path"));
  EXPECT_THAT(bad("runtime_dir = \"\"\n"), HasSubstr("runtime_dir"));
}

TEST(Config, BadLogLevel) {
  std::string e = bad("log_level = \"verbose\"\n");
  EXPECT_THAT(e, HasSubstr("log_level: must be one of trace, debug, info, warn, error, got 'verbose'"));
}

TEST(Config, UnknownPolicyListsKnownOnes) {
  std::string e = bad("[policy]\nname = \"lottery\"\n");
  EXPECT_THAT(e, HasSubstr("policy.name: unknown policy 'lottery'"));
  for (const sched::PolicyEntry& p : sched::policy_registry()) EXPECT_THAT(e, HasSubstr(p.name));
}

TEST(Config, UnknownPolicyParam) {
  std::string e = bad("[policy.params]\nwindow_maxx = 3\n");
  EXPECT_THAT(e, HasSubstr("policy.params.window_maxx: not a parameter of policy 'tandem'"));
  EXPECT_THAT(e, HasSubstr("window_max,")) << "lists what it takes";
  // A parameter of another policy is not one of fcfs's (which takes none).
  EXPECT_THAT(bad("[policy]\nname = \"fcfs\"\n[policy.params]\nwindow_max = 3\n"),
              HasSubstr("policy.params.window_max: not a parameter of policy 'fcfs' (it takes: none)"));
}

TEST(Config, PolicyParamOutOfRange) {
  EXPECT_THAT(bad("[policy.params]\nwindow_max = 0\n"),
              HasSubstr("policy.params.window_max: must be between 1 and 4096, got 0"));
  EXPECT_THAT(bad("[policy.params]\nhorizon_s = nan\n"), HasSubstr("policy.params.horizon_s"));
}

TEST(Config, UserAndGroupNames) {
  auto r = parse_config("[roles.ctl_admin]\nuids = [\"root\"]\ngids = [\"root\"]\n", "t.toml");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->role(Role::kCtlAdmin).uids, std::vector<uid_t>{0});
  EXPECT_EQ(r->role(Role::kCtlAdmin).gids, std::vector<gid_t>{0});

  EXPECT_THAT(bad("[roles.engine]\nuids = [0, \"no-such-user-tandem\"]\n"),
              HasSubstr("roles.engine.uids[1]: unknown user 'no-such-user-tandem'"));
  EXPECT_THAT(bad("[roles.engine]\ngids = [\"no-such-group-tandem\"]\n"),
              HasSubstr("roles.engine.gids[0]: unknown group 'no-such-group-tandem'"));
}

TEST(Config, SyntaxErrorHasLineNumber) {
  std::string e = bad("log_level = \"info\"\n[limits]\nmax_clients = = 3\n");
  EXPECT_THAT(e, HasSubstr("tandemd.toml: line 3"));
  EXPECT_THAT(e, HasSubstr("TOML syntax error"));
  EXPECT_THAT(bad("[limits]\n[limits]\n"), HasSubstr("line 2"));
}

TEST(Config, LoadMissingFileNamesPath) {
  auto r = load_config("/nonexistent/tandem/tandemd.toml");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOENT);
  EXPECT_THAT(r.error().message(), HasSubstr("/nonexistent/tandem/tandemd.toml"));
}

TEST(Config, LoadNamesTheFileInErrors) {
  auto r = load_config(TANDEM_SOURCE_DIR "/examples");
  ASSERT_FALSE(r) << "a directory is not a config";
  EXPECT_THAT(r.error().message(), HasSubstr("examples"));
}

TEST(Config, ExampleFileIsTheDefaults) {
  std::string path = TANDEM_SOURCE_DIR "/examples/tandemd.toml";
  auto r = load_config(path);
  ASSERT_TRUE(r) << r.error().message();
  Config d;
  EXPECT_EQ(r->source, path);
  EXPECT_EQ(r->runtime_dir, d.runtime_dir);
  EXPECT_EQ(r->log_level, d.log_level);
  EXPECT_EQ(r->policy, d.policy);
  EXPECT_EQ(r->policy_params, d.policy_params);
  EXPECT_EQ(r->tick, d.tick);
  EXPECT_EQ(r->event_slots, d.event_slots);
  EXPECT_EQ(r->directive_slots, d.directive_slots);
  for (std::size_t i = 0; i < kRoleCount; ++i) {
    EXPECT_EQ(r->roles[i].anyone, d.roles[i].anyone) << i;
    EXPECT_EQ(r->roles[i].uids, d.roles[i].uids) << i;
    EXPECT_EQ(r->roles[i].gids, d.roles[i].gids) << i;
  }
  EXPECT_EQ(r->limits.max_clients, d.limits.max_clients);
  EXPECT_EQ(r->limits.sessions_per_client, d.limits.sessions_per_client);
  EXPECT_EQ(r->limits.records_per_s, d.limits.records_per_s);
  EXPECT_EQ(r->limits.messages_per_s, d.limits.messages_per_s);
  EXPECT_EQ(r->limits.pump_batch, d.limits.pump_batch);
  EXPECT_EQ(r->metrics_listen, d.metrics_listen);
  EXPECT_EQ(r->host.pool_max, d.host.pool_max);
  EXPECT_EQ(r->host.pool_per_session, d.host.pool_per_session);
  EXPECT_EQ(r->host.pool_idle, d.host.pool_idle);
  EXPECT_EQ(r->kv_events, d.kv_events);
}

TEST(Config, KvEventsSection) {
  EXPECT_TRUE(Config{}.kv_events.endpoint.empty()) << "off by default";
  auto r = parse_config(
      "[kv_events]\nendpoint = \"tcp://127.0.0.1:5557\"\nconnect = true\ntopic = \"kv@pod@{engine}\"\nhwm = 50\n",
      "t.toml");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->kv_events.endpoint, "tcp://127.0.0.1:5557");
  EXPECT_TRUE(r->kv_events.connect);
  EXPECT_EQ(r->kv_events.topic, "kv@pod@{engine}");
  EXPECT_EQ(r->kv_events.hwm, 50u);
  EXPECT_THAT(describe(*r), HasSubstr("kv_events    connect tcp://127.0.0.1:5557"));
  for (std::string_view ok : {"tcp://*:5557", "tcp://[::1]:1", "tcp://node-3.example:65535", "ipc:///run/tandem/kv"}) {
    auto e = parse_config(fmt::format("[kv_events]\nendpoint = \"{}\"\n", ok), "t.toml");
    EXPECT_TRUE(e) << ok << ": " << e.error().message();
  }
  for (std::string_view no : {"udp://1.2.3.4:5", "tcp://127.0.0.1", "tcp://127.0.0.1:0", "tcp://127.0.0.1:70000",
                              "tcp://:5557", "tcp://a b:1", "ipc://relative", "tcp://[zz]:1", "inproc://x"}) {
    EXPECT_THAT(bad(fmt::format("[kv_events]\nendpoint = \"{}\"\n", no)), HasSubstr("kv_events.endpoint")) << no;
  }
  EXPECT_THAT(bad("[kv_events]\ntopic = \"kv@{pod}\"\n"), HasSubstr("kv_events.topic"));
  EXPECT_THAT(bad("[kv_events]\ntopic = \"kv}\"\n"), HasSubstr("kv_events.topic"));
  EXPECT_THAT(bad("[kv_events]\nhwm = 0\n"), HasSubstr("kv_events.hwm"));
  EXPECT_THAT(bad("[kv_events]\nhwm = 100001\n"), HasSubstr("kv_events.hwm"));
  EXPECT_THAT(bad("[kv_events]\nport = 1\n"), HasSubstr("kv_events.port"));
  Config later;
  later.kv_events.endpoint = "tcp://*:5557";
  EXPECT_EQ(reload_plan(Config{}, later).at_restart, (std::vector<std::string>{"[kv_events]"}));
}

TEST(Config, MetricsListensOnLoopbackOnly) {
  EXPECT_EQ(Config{}.metrics_listen, "127.0.0.1:9464");
  for (std::string_view ok : {"127.0.0.1:0", "127.1.2.3:9100", "localhost:9464", "[::1]:9464", ""}) {
    auto r = parse_config(fmt::format("[metrics]\nlisten = \"{}\"\n", ok), "t.toml");
    ASSERT_TRUE(r) << ok << ": " << r.error().message();
    EXPECT_EQ(r->metrics_listen, ok);
  }
  for (std::string_view bad :
       {"0.0.0.0:9464", "10.0.0.1:9464", "[::]:9464", "127.0.0.1", "127.0.0.1:70000", "host:9464", "[::1]9464"}) {
    auto r = parse_config(fmt::format("[metrics]\nlisten = \"{}\"\n", bad), "t.toml");
    ASSERT_FALSE(r) << bad;
    EXPECT_THAT(r.error().message(), HasSubstr("metrics.listen")) << bad;
    EXPECT_THAT(r.error().message(), HasSubstr(bad)) << bad;
  }
  auto unknown = parse_config("[metrics]\nport = 1\n", "t.toml");
  ASSERT_FALSE(unknown);
  EXPECT_THAT(unknown.error().message(), HasSubstr("metrics.port"));
  auto d = parse_config("[metrics]\nlisten = \"\"\n", "t.toml");
  ASSERT_TRUE(d);
  EXPECT_THAT(describe(*d), HasSubstr("metrics      off"));
}

TEST(Config, MetricsForEachEngineAndRemoteScrapes) {
  auto r = parse_config(
      "[metrics]\nlisten = \"0.0.0.0:9464\"\nallow_remote = true\n[metrics.engines]\n\"llama-0\" = \"0.0.0.0:9465\"\n"
      "\"llama-1\" = \"[::]:9466\"\n",
      "t.toml");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_TRUE(r->metrics_allow_remote);
  EXPECT_EQ(r->metrics_engines.size(), 2u);
  EXPECT_EQ(r->metrics_engines.at("llama-1"), "[::]:9466");
  EXPECT_THAT(describe(*r), HasSubstr("(remote scrapes allowed); engine llama-0 0.0.0.0:9465; engine llama-1"));
  EXPECT_FALSE(Config{}.metrics_allow_remote);
  EXPECT_TRUE(Config{}.metrics_engines.empty());

  struct Bad {
    std::string text;
    std::string says;
  };
  for (const Bad& b : std::vector<Bad>{
           {"[metrics.engines]\n\"e\" = \"10.0.0.1:9465\"\n",
            "metrics.engines.e: \"10.0.0.1:9465\": must be a loopback"},
           {"[metrics.engines]\n\"e\" = \"127.0.0.1\"\n", "metrics.engines.e"},
           {"[metrics.engines]\n\"e\" = 9465\n", "metrics.engines.e"},
           {"[metrics.engines]\n\"a\\u0001b\" = \"127.0.0.1:1\"\n", "engine name"},
           {"[metrics]\nengines = 1\n", "metrics.engines"},
           {"[metrics]\nallow_remote = \"yes\"\n", "metrics.allow_remote"},
           {"[metrics.engines]\n\"e\" = \"127.0.0.1:9464\"\n", "overlaps metrics.listen"},
           {"[metrics]\nallow_remote = true\n[metrics.engines]\n\"a\" = \"0.0.0.0:9470\"\n\"b\" = \"127.0.0.1:9470\"\n",
            "metrics.engines.b: \"127.0.0.1:9470\" overlaps metrics.engines.a"},
       }) {
    auto bad = parse_config(b.text, "t.toml");
    ASSERT_FALSE(bad) << b.text;
    EXPECT_THAT(bad.error().message(), HasSubstr(b.says)) << b.text;
  }
  // Port 0 (any free one) never clashes.
  EXPECT_TRUE(parse_config("[metrics.engines]\na = \"127.0.0.1:0\"\nb = \"127.0.0.1:0\"\n", "t.toml"));
  std::string many = "[metrics.engines]\n";
  for (int i = 0; i <= 64; ++i) many += fmt::format("e{} = \"127.0.0.1:0\"\n", i);
  auto too_many = parse_config(many, "t.toml");
  ASSERT_FALSE(too_many);
  EXPECT_THAT(too_many.error().message(), HasSubstr("at most 64 engines, got 65"));

  // A change of any of them waits for a restart.
  Config old;
  Config fresh = old;
  fresh.metrics_engines["e"] = "127.0.0.1:0";
  EXPECT_THAT(reload_plan(old, fresh).at_restart, ::testing::Contains("[metrics]"));
}

TEST(CompiledConfig, FillsPolicyDefaults) {
  Config c;
  c.policy = "mars";
  c.policy_params["window_max"] = 64;
  auto cc = CompiledConfig::compile(c);
  ASSERT_TRUE(cc) << cc.error().message();
  EXPECT_EQ(cc->config->config().policy, "mars");
  EXPECT_EQ(cc->config->policy().name, "mars");
  EXPECT_EQ(cc->config->params().get("window_max"), 64.0);
  EXPECT_EQ(cc->config->params().get("window_min"), 4.0) << "default filled in";
  // The policy the daemon runs is the one compile() built and checked.
  ASSERT_TRUE(cc->policy.control && cc->policy.step);
  EXPECT_EQ(cc->policy.params.get("window_max"), 64.0);
}

TEST(ReloadPlan, NamesWhatARunningDaemonCannotChange) {
  const Config old;
  EXPECT_TRUE(reload_plan(old, old).refused.empty());
  EXPECT_FALSE(reload_plan(old, old).policy);
  Config fresh = old;
  fresh.runtime_dir = "/run/elsewhere";
  fresh.directive_slots = 2048;
  fresh.event_slots = 8192;
  const ReloadPlan refused = reload_plan(old, fresh);
  EXPECT_EQ(refused.refused, (std::vector<std::string>{"runtime_dir", "ipc.event_slots", "ipc.directive_slots"}));

  Config later = old;
  later.tick = 20ms;
  later.policy_params["window_max"] = 8;
  later.metrics_listen = "";
  const ReloadPlan plan = reload_plan(old, later);
  EXPECT_TRUE(plan.refused.empty());
  EXPECT_TRUE(plan.policy);
  EXPECT_TRUE(plan.tick);
  EXPECT_FALSE(plan.gpu);
  EXPECT_FALSE(plan.nvml);
  EXPECT_EQ(plan.at_restart, (std::vector<std::string>{"[metrics]"}));
  later.nvml.interval_ms += 1;
  later.gpu.sm_min += 1;
  EXPECT_TRUE(reload_plan(old, later).nvml);
  EXPECT_TRUE(reload_plan(old, later).gpu);
}

TEST(SetPolicyKey, GoesThroughTheParsersTables) {
  Config c;
  c.policy = "mars";
  ASSERT_TRUE(set_policy_key(c, "window_max", "12"));
  EXPECT_EQ(c.policy_params.at("window_max"), 12.0);
  ASSERT_TRUE(set_policy_key(c, "swap_preempt", "false"));
  EXPECT_EQ(c.policy_params.at("swap_preempt"), 0.0);
  ASSERT_TRUE(set_policy_key(c, "tick_ms", "25"));
  EXPECT_EQ(c.tick, 25ms);

  // Each bad value is named as the file's key would be, and changes nothing.
  const Config before = c;
  const auto problem = [&](std::string_view key, std::string_view value) {
    auto r = set_policy_key(c, key, value);
    EXPECT_FALSE(r) << key << " " << value;
    EXPECT_EQ(c.tick, before.tick);
    EXPECT_EQ(c.policy_params, before.policy_params);
    EXPECT_EQ(c.policy, before.policy);
    return r ? std::string() : r.error().context();
  };
  EXPECT_THAT(problem("tick_ms", "fast"), HasSubstr("policy.tick_ms: expected an integer, got a string"));
  EXPECT_THAT(problem("tick_ms", "0"), HasSubstr("policy.tick_ms: must be between 1 and 10000, got 0"));
  EXPECT_THAT(problem("tick_ms", "2.5"), HasSubstr("policy.tick_ms: expected an integer"));
  EXPECT_THAT(problem("window_max", "many"),
              HasSubstr("policy.params.window_max: expected a number or a boolean, got a string"));
  EXPECT_THAT(problem("params", "1"), HasSubstr("policy.params is a table"));

  // A new policy starts from its own defaults.
  ASSERT_TRUE(set_policy_key(c, "name", "fcfs"));
  EXPECT_EQ(c.policy, "fcfs");
  EXPECT_TRUE(c.policy_params.empty());
  ASSERT_TRUE(set_policy_key(c, "name", "fcfs"));
  ASSERT_TRUE(set_policy_key(c, "name", "tandem"));
  ASSERT_TRUE(set_policy_key(c, "window_max", "9"));
  ASSERT_TRUE(set_policy_key(c, "name", "tandem"));
  EXPECT_EQ(c.policy_params.at("window_max"), 9.0) << "naming the running policy keeps its parameters";
}

TEST(CompiledConfig, RejectsAHandBuiltBadConfig) {
  Config c;
  c.source = "built";
  c.event_slots = 100;
  auto cc = CompiledConfig::compile(c);
  ASSERT_FALSE(cc);
  EXPECT_EQ(cc.error().code(), EINVAL);
  EXPECT_THAT(cc.error().context(), HasSubstr("built: ipc.event_slots: must be a power of two"));

  Config p;
  p.policy = "nope";
  ASSERT_FALSE(CompiledConfig::compile(p));
  Config t;
  t.tick = 500us;
  auto ct = CompiledConfig::compile(t);
  ASSERT_FALSE(ct);
  EXPECT_THAT(ct.error().context(), HasSubstr("policy.tick_ms: must be between 1 and 10000, got 0.5"));
}

TEST(CompiledConfig, RootAndDaemonUserAlwaysAllowed) {
  auto cc = CompiledConfig::compile(Config{});
  ASSERT_TRUE(cc);
  const CompiledConfig& k = *cc->config;
  constexpr uid_t kDaemon = 991;
  for (Role r : {Role::kEngine, Role::kRunner, Role::kCtlRead, Role::kCtlAdmin}) {
    EXPECT_TRUE(k.allowed(r, 0, 12345, kDaemon)) << to_string(r);
    EXPECT_TRUE(k.allowed(r, kDaemon, 12345, kDaemon)) << to_string(r);
  }
  EXPECT_FALSE(k.allowed(Role::kEngine, 1000, 1000, kDaemon));
  EXPECT_FALSE(k.allowed(Role::kRunner, 1000, 1000, kDaemon));
  EXPECT_FALSE(k.allowed(Role::kCtlAdmin, 1000, 1000, kDaemon));
  EXPECT_TRUE(k.allowed(Role::kCtlRead, 1000, 1000, kDaemon)) << "ctl_read is open by default";
}

TEST(CompiledConfig, UidGidAndAnyoneGrants) {
  auto parsed = parse_config(R"(
[roles.engine]
uids = [1000, 1001]
[roles.runner]
gids = [50]
[roles.ctl_read]
anyone = false
[roles.ctl_admin]
anyone = true
)",
                             "t.toml");
  ASSERT_TRUE(parsed) << parsed.error().message();
  auto cc = CompiledConfig::compile(*parsed);
  ASSERT_TRUE(cc) << cc.error().message();
  const CompiledConfig& k = *cc->config;
  constexpr uid_t kDaemon = 991;
  EXPECT_TRUE(k.allowed(Role::kEngine, 1001, 7, kDaemon));
  EXPECT_FALSE(k.allowed(Role::kEngine, 1002, 7, kDaemon));
  EXPECT_FALSE(k.allowed(Role::kEngine, 1002, 1000, kDaemon)) << "a uid list does not match gids";
  EXPECT_TRUE(k.allowed(Role::kRunner, 2000, 50, kDaemon));
  EXPECT_FALSE(k.allowed(Role::kRunner, 50, 51, kDaemon)) << "a gid list does not match uids";
  EXPECT_FALSE(k.allowed(Role::kCtlRead, 1000, 1000, kDaemon));
  EXPECT_TRUE(k.allowed(Role::kCtlRead, 0, 0, kDaemon));
  EXPECT_TRUE(k.allowed(Role::kCtlAdmin, 4242, 4242, kDaemon));
}

TEST(Config, GpuSection) {
  auto r = parse_config(R"([gpu]
sm_min = 24
alpha = 4
grow_hold = 3
link_bytes_per_s = 5e10
offload_pressure = 0.95
restore_pressure = 0.7
hold = 20
allow_slowdown = true
)",
                        "t.toml");
  ASSERT_TRUE(r) << r.error().message();
  const GpuConfig& g = r->gpu;
  EXPECT_EQ(g.sm_min, 24u);
  EXPECT_EQ(g.alpha, 4.0);
  EXPECT_EQ(g.grow_hold, 3u);
  EXPECT_EQ(g.link_bytes_per_s, 5e10);
  EXPECT_EQ(g.offload_pressure, 0.95);
  EXPECT_EQ(g.restore_pressure, 0.7);
  EXPECT_EQ(g.hold, 20u);
  EXPECT_TRUE(g.allow_slowdown);
  EXPECT_THAT(describe(*r), HasSubstr("gpu          sm_min 24, alpha 4"));

  EXPECT_THAT(bad("[gpu]\nsm_min = 0\n"), HasSubstr("tandemd.toml: gpu.sm_min: must be between 1 and 1024, got 0"));
  EXPECT_THAT(bad("[gpu]\nalpha = -1\n"), HasSubstr("gpu.alpha: must be between 0 and 1024"));
  EXPECT_THAT(bad("[gpu]\nalpha = \"8\"\n"), HasSubstr("gpu.alpha: expected a number, got a string"));
  EXPECT_THAT(bad("[gpu]\nlink_bytes_per_s = 0\n"), HasSubstr("gpu.link_bytes_per_s: must be between 1e6"));
  EXPECT_THAT(bad("[gpu]\nrestore_pressure = 1.0\n"),
              HasSubstr("gpu.restore_pressure: must be in (0, gpu.offload_pressure 1), got 1"));
  EXPECT_THAT(bad("[gpu]\noffload_pressure = nan\n"), HasSubstr("gpu.offload_pressure: must be in (0, 10]"));
  EXPECT_THAT(bad("[gpu]\nhold = 0\n"), HasSubstr("gpu.hold: must be between 1 and 100000, got 0"));
  EXPECT_THAT(bad("[gpu]\nallow_slowdown = 1\n"), HasSubstr("gpu.allow_slowdown: expected a boolean"));
  EXPECT_THAT(bad("[gpu]\nsm_mn = 1\n"), HasSubstr("gpu.sm_mn: unknown key (known: sm_min, alpha"));
  // validate() guards a Config built in code too.
  Config c;
  c.gpu.grow_hold = 0;
  auto v = validate(c);
  ASSERT_FALSE(v);
  EXPECT_THAT(v.error().context(), HasSubstr("gpu.grow_hold: must be between 1 and 1000, got 0"));
}

}  // namespace
}  // namespace tandem::daemon
