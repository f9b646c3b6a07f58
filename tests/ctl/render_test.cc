// tandemctl's renderers: every command's sample answer (docs/tandemctl.md)
// gives the exact cells and text; missing keys, nulls, wrong types and
// hostile strings render as "-" or cleaned text, never throw; empty lists
// print "(none)"; a body that is not JSON, or has the wrong shape, is an
// error.
#include "ctl/render.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tandem::ctl {
namespace {

using nlohmann::json;
using Row = std::vector<std::string>;

constexpr std::string_view kStatus = R"({"version":"0.1.0","pid":123,"uptime_s":12.5,"runtime_dir":"/run/tandem",
  "policy":{"name":"tandem","epoch":1},"clients":{"engine":1,"runner":1,"ctl_read":1,"ctl_admin":0},
  "sessions":{"total":3,"waiting":0,"reasoning":1,"acting":2,"paused":0},"records":{"accepted":1000,"rejected":2,"late":1},
  "ticks":250,"directives":40,"effects":{"cpu_weight":3,"cpu_quota":0,"sm_partition":0,"kill_tools":0},
  "host":{"cgroups":"v2 cpuacct,freezer /sys/fs/cgroup/unified/tandem","telemetry_mode":"ebpf",
  "telemetry":"ebpf: tp_btf, ringbuf, task storage","sessions":2,"tool_cgroups":3,"memory_pressure":"normal"},
  "tools":{"prepared":7}})";

constexpr std::string_view kEngines = R"({"engines":[{"id":3,"name":"emu-0","pid":1234,"gpu":0,"block_size":16,
  "total_blocks":1000,"free_blocks":800,"pinned_blocks":10,"offloaded_blocks":0,"usage":0.2,"running":3,"waiting":1,
  "queued_blocks":50,"step_tokens":512,"step_time_us":30000,"sessions":4,"sm_partition":2,"sm_decode_sms":96,
  "blocks_total":1000,"projected_blocks":1100,"pressure":1.1,"weight_modules":3,"offloaded_modules":[4],
  "offload_freed_bytes":800000000}]})";

constexpr std::string_view kSessions = R"({"sessions":[{"id":"0x00000000deadbeef","name":"s1","state":"reasoning",
  "residency":"pinned","engine":3,"owner":4,"round":2,"rounds_done":2,"blocks_held":120,"in_tool":false,"priority":0,
  "age_s":12.3,"in_state_s":1.2,"cpu_weight":null,"cpu_quota_us":null}]})";

json parse(std::string_view s) { return json::parse(s); }

TEST(RenderStatus, SampleIsAlignedKeyValueLines) {
  auto text = render("status", kStatus, false);
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_EQ(*text,
            "version:              0.1.0\n"
            "pid:                  123\n"
            "uptime_s:             12.5\n"
            "runtime_dir:          /run/tandem\n"
            "policy.name:          tandem\n"
            "policy.epoch:         1\n"
            "admission_window:     -\n"
            "metrics.listen:       -\n"
            "clients.engine:       1\n"
            "clients.runner:       1\n"
            "clients.ctl_read:     1\n"
            "clients.ctl_admin:    0\n"
            "sessions.total:       3\n"
            "sessions.waiting:     0\n"
            "sessions.reasoning:   1\n"
            "sessions.acting:      2\n"
            "sessions.paused:      0\n"
            "records.accepted:     1000\n"
            "records.rejected:     2\n"
            "records.late:         1\n"
            "ticks:                250\n"
            "directives:           40\n"
            "effects.cpu_weight:   3\n"
            "effects.cpu_quota:    0\n"
            "effects.sm_partition: 0\n"
            "effects.kill_tools:   0\n"
            "host.cgroups:         v2 cpuacct,freezer /sys/fs/cgroup/unified/tandem\n"
            "host.telemetry_mode:  ebpf\n"
            "host.telemetry:       ebpf: tp_btf, ringbuf, task storage\n"
            "host.sessions:        2\n"
            "host.tool_cgroups:    3\n"
            "host.memory_pressure: normal\n"
            "tools.prepared:       7\n"
            "host.pool.ready:      -\n"
            "host.pool.hits:       -\n"
            "host.pool.hit_rate:   -\n"
            "host.ahead.held:      -\n"
            "host.favordynmods:    -\n");
}

TEST(RenderStatus, MissingKeysAreDashesAndUnknownKeysFollow) {
  auto text = render_status(parse(R"({"version":"0.2.0","policy":null,"clients":{"engine":2},
                                      "gpu":{"util":0.5,"ids":[0,1]},"zz":true})"));
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_NE(text->find("version:              0.2.0\n"), std::string::npos) << *text;
  EXPECT_NE(text->find("pid:                  -\n"), std::string::npos) << *text;
  EXPECT_NE(text->find("policy.name:          -\n"), std::string::npos) << *text;
  EXPECT_NE(text->find("clients.engine:       2\n"), std::string::npos) << *text;
  EXPECT_NE(text->find("clients.runner:       -\n"), std::string::npos) << *text;
  // Keys the renderer does not know come after the documented ones.
  auto ids = text->find("gpu.ids:              [0,1]\n");
  auto util = text->find("gpu.util:             0.5\n");
  auto zz = text->find("zz:                   yes\n");
  ASSERT_NE(ids, std::string::npos) << *text;
  ASSERT_NE(util, std::string::npos) << *text;
  ASSERT_NE(zz, std::string::npos) << *text;
  EXPECT_GT(ids, text->find("effects.kill_tools:"));
}

TEST(RenderStatus, NotAnObjectIsAnError) {
  auto text = render("status", "[1,2]", false);
  ASSERT_FALSE(text);
  EXPECT_EQ(text.error().code(), EBADMSG);
}

TEST(RenderEngines, SampleCells) {
  auto t = engines_table(parse(kEngines));
  ASSERT_TRUE(t) << t.error().message();
  EXPECT_EQ(t->header, (Row{"ID", "NAME", "PID", "GPU", "KV%", "TOTAL", "FREE", "PINNED", "OFFL", "PROJ", "PRESS%",
                            "RUN", "WAIT", "QUEUED", "STEP(tok/ms)", "SESS", "SM", "OFFLOAD"}));
  ASSERT_EQ(t->rows.size(), 1u);
  EXPECT_EQ(t->rows[0], (Row{"3", "emu-0", "1234", "0", "20.0", "1000", "800", "10", "0", "1100", "110.0", "3", "1",
                             "50", "512/30.0", "4", "2/96", "1/3 0.80G"}));
}

TEST(RenderEngines, SampleText) {
  auto text = render("engines", kEngines, false);
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_EQ(
      *text,
      "ID  NAME    PID  GPU   KV%  TOTAL  FREE  PINNED  OFFL  PROJ  PRESS%  RUN  WAIT  QUEUED  STEP(tok/ms)  SESS  "
      "SM    OFFLOAD\n"
      " 3  emu-0  1234    0  20.0   1000   800      10     0  1100   110.0    3     1      50      512/30.0     4  "
      "2/96  1/3 0.80G\n");
}

TEST(RenderEngines, MissingNullAndWrongTypesAreDashes) {
  auto t = engines_table(parse(R"({"engines":[{"id":7,"gpu":-1,"usage":"high","step_tokens":null,
                                   "free_blocks":{"x":1},"running":[1]}, 5]})"));
  ASSERT_TRUE(t) << t.error().message();
  ASSERT_EQ(t->rows.size(), 2u);
  EXPECT_EQ(t->rows[0],
            (Row{"7", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-/-", "-", "-", "-"}));
  EXPECT_EQ(t->rows[1], Row(18, "-"));
}

TEST(RenderEngines, StepWithOnlyOneHalf) {
  auto t = engines_table(parse(R"({"engines":[{"step_time_us":1500},{"step_tokens":64},{}]})"));
  ASSERT_TRUE(t) << t.error().message();
  EXPECT_EQ(t->rows[0][14], "-/1.5");
  EXPECT_EQ(t->rows[1][14], "64/-");
  EXPECT_EQ(t->rows[2][14], "-");
}

TEST(RenderEngines, EmptyListPrintsNone) {
  auto text = render("engines", R"({"engines":[]})", false);
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_EQ(
      *text,
      "ID  NAME  PID  GPU  KV%  TOTAL  FREE  PINNED  OFFL  PROJ  PRESS%  RUN  WAIT  QUEUED  STEP(tok/ms)  SESS  SM  "
      "OFFLOAD\n(none)\n");
}

TEST(RenderEngines, NoListIsAnError) {
  for (std::string_view body : {R"({})", R"({"engines":{}})", R"([])", R"("engines")"}) {
    auto text = render("engines", body, false);
    ASSERT_FALSE(text) << body;
    EXPECT_EQ(text.error().code(), EBADMSG);
    EXPECT_NE(text.error().context().find("\"engines\""), std::string::npos) << text.error().context();
  }
}

TEST(RenderSessions, SampleCells) {
  auto t = sessions_table(parse(kSessions));
  ASSERT_TRUE(t) << t.error().message();
  EXPECT_EQ(t->header, (Row{"ID", "NAME", "STATE", "KV", "BLOCKS", "ENGINE", "ROUND", "AGE", "TOOL", "CPU.W"}));
  ASSERT_EQ(t->rows.size(), 1u);
  EXPECT_EQ(t->rows[0], (Row{"00000000deadbeef", "s1", "reasoning", "pinned", "120", "3", "2", "12.3s", "no", "-"}));
}

TEST(RenderSessions, SampleText) {
  auto text = render("sessions", kSessions, false);
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_EQ(*text,
            "ID                NAME  STATE      KV      BLOCKS  ENGINE  ROUND    AGE  TOOL  CPU.W\n"
            "00000000deadbeef  s1    reasoning  pinned     120       3      2  12.3s  no        -\n");
}

TEST(RenderTools, CallsProcessesUsageAndState) {
  auto t = tools_table(parse(R"({"sessions":[
      {"session":"913ec560715f3bce","name":"agent-1","pinned":true,"cpu_weight":400,"cpu_ns":1200000000,
       "memory_bytes":222717952,"processes":3,"calls":[{"call":1,"throttled":false,"frozen":false}]},
      {"session":"917663f82109798f","name":"agent-2","orphan":true,"cpu_weight":null,"processes":2,
       "calls":[{"call":1,"throttled":true,"frozen":true},{"call":2,"throttled":true}]},
      {}]})"));
  ASSERT_TRUE(t) << t.error().message();
  EXPECT_EQ(t->header, (Row{"SESSION", "NAME", "CALLS", "PROCS", "CPU", "MEMORY", "CPU.W", "STATE"}));
  ASSERT_EQ(t->rows.size(), 3u);
  EXPECT_EQ(t->rows[0], (Row{"913ec560715f3bce", "agent-1", "1", "3", "1.20s", "212.4M", "400", "protected"}));
  EXPECT_EQ(t->rows[1], (Row{"917663f82109798f", "agent-2", "2", "2", "-", "-", "-", "2 throttled, 1 frozen, orphan"}));
  EXPECT_EQ(t->rows[2], (Row{"-", "-", "0", "-", "-", "-", "-", "-"}));
  EXPECT_FALSE(tools_table(parse(R"({"tools":[]})")));
}

TEST(RenderSessionKill, SaysWhatHappened) {
  auto text = render("session-kill", R"({"session":"913ec560715f3bce","killed":true})", false);
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_NE(text->find("913ec560715f3bce killed"), std::string::npos) << *text;
  EXPECT_FALSE(render("session-kill", "{}", false));
}

TEST(RenderSteering, SaysWhatHappened) {
  auto drain = render("drain", R"({"draining":true,"waiting":2,"live":5})", false);
  ASSERT_TRUE(drain);
  EXPECT_EQ(*drain, "draining: no new session is admitted (2 waiting, 5 live)\n");
  EXPECT_EQ(*render("undrain", R"({"draining":false})", false), "admitting new sessions\n");
  EXPECT_EQ(
      *render("reload", R"({"reloaded":true,"source":"/etc/tandem/tandemd.toml","policy":"mars","epoch":3})", false),
      "reloaded /etc/tandem/tandemd.toml: policy mars (epoch 3)\n");
  EXPECT_NE(render("session-evict", R"({"session":"00ab","evicted":true,"engine":2})", false)->find("engine 2"),
            std::string::npos);
}

TEST(RenderPolicy, ParametersWithDefaultsAndRanges) {
  auto text = render("policy", R"({"name":"mars","epoch":2,"tick_ms":50,"source":"f.toml",
      "params":{"window_max":7,"window_min":1},
      "specs":[{"name":"window_max","default":30,"min":1,"max":4096,"doc":"ceiling"},
               {"name":"window_min","default":1,"min":1,"max":4096,"doc":"floor"}]})",
                     false);
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_EQ(*text,
            "policy mars (epoch 2, tick 50 ms) from f.toml\n"
            "PARAMETER   VALUE  DEFAULT  RANGE      MEANING\n"
            "window_max      7       30  1 .. 4096  ceiling\n"
            "window_min      1        1  1 .. 4096  floor\n");
  EXPECT_FALSE(render("policy", R"({"name":"mars"})", false));
}

TEST(RenderEvents, LinesAdvanceTheCursorAndSayWhatWasLost) {
  std::uint64_t since = 0;
  auto text = render_events(R"({"events":[
      {"seq":4,"t":1.5,"kind":"admit","session":"00000000000000ab","name":"agent-1","detail":"on engine 2"},
      {"seq":5,"t":2.25,"kind":"drain","detail":"by an operator"}],"next":5,"lost":0})",
                            false, since);
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_EQ(*text,
            "+      1.5s  admit          agent-1 (00000000000000ab)  on engine 2\n"
            "+     2.25s  drain          by an operator\n");
  EXPECT_EQ(since, 5u);
  auto json_lines = render_events(R"({"events":[{"seq":9,"t":3,"kind":"pin"}],"next":9,"lost":3})", true, since);
  ASSERT_TRUE(json_lines);
  EXPECT_EQ(*json_lines,
            "(3 events left the daemon's log before they were read)\n"
            "{\"kind\":\"pin\",\"seq\":9,\"t\":3}\n");
  EXPECT_EQ(since, 9u);
  EXPECT_FALSE(render_events("[]", false, since));
}

TEST(RenderTop, StatusSummaryAndTables) {
  auto head = render_top_part("status", R"({"version":"0.1.0","uptime_s":65,"policy":{"name":"tandem"},
      "admission_window":12,"draining":true,"sessions":{"total":3,"waiting":1,"reasoning":1,"acting":1,"paused":0},
      "clients":{"engine":2,"runner":1},"host":{"memory_pressure":"normal","memory_psi_some_avg10":0.5,
      "tool_cgroups":4,"tools_memory_bytes":1048576,"favordynmods":false,"pool":{"ready":3,"hit_rate":0.5},
      "ahead":{"held":2}}})");
  ASSERT_TRUE(head) << head.error().message();
  EXPECT_NE(head->find("policy tandem (window 12)  DRAINING"), std::string::npos) << *head;
  EXPECT_NE(head->find("sessions 3: 1 waiting, 1 reasoning, 1 acting, 0 paused"), std::string::npos) << *head;
  EXPECT_NE(head->find("4 tool cgroups, 1.0 MiB; pool 3 ready, hit rate 0.5; 2 ahead; favordynmods no"),
            std::string::npos)
      << *head;
  auto sparse = render_top_part("status", "{}");
  ASSERT_TRUE(sparse) << "missing keys are dashes, not errors";
  EXPECT_TRUE(render_top_part("sessions", R"({"sessions":[]})"));
  EXPECT_FALSE(render_top_part("engines", "nope"));
}

TEST(RenderSessions, NullsEmptyNameAndOddIds) {
  auto t = sessions_table(parse(R"({"sessions":[
      {"id":"0xABC","name":"","state":"acting","engine":null,"in_tool":true,"cpu_weight":50,"age_s":125},
      {"id":3735928559,"name":"a\tb\nc\u001b[2J"},
      {"id":"not-hex"},
      {"id":-4, "age_s":-1},
      {}]})"));
  ASSERT_TRUE(t) << t.error().message();
  ASSERT_EQ(t->rows.size(), 5u);
  EXPECT_EQ(t->rows[0], (Row{"0000000000000abc", "-", "acting", "-", "-", "-", "-", "2m05s", "yes", "50"}));
  EXPECT_EQ(t->rows[1][0], "00000000deadbeef");
  EXPECT_EQ(t->rows[1][1], "a?b?c?[2J");  // control characters cannot reach the terminal
  EXPECT_EQ(t->rows[2][0], "not-hex");
  EXPECT_EQ(t->rows[3][0], "-");
  EXPECT_EQ(t->rows[3][7], "-");
  EXPECT_EQ(t->rows[4], Row(10, "-"));
}

TEST(RenderSessions, EmptyListPrintsNone) {
  auto text = render("sessions", R"({"sessions":[]})", false);
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_EQ(*text, "ID  NAME  STATE  KV  BLOCKS  ENGINE  ROUND  AGE  TOOL  CPU.W\n(none)\n");
}

TEST(RenderSessions, ATruncatedListSaysHowManyItShows) {
  auto text = render("sessions", R"({"sessions":[{"id":"0x1"}],"total":5000,"truncated":true})", false);
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_NE(text->find("(1 of 5000 shown"), std::string::npos) << *text;
  auto whole = render("sessions", R"({"sessions":[{"id":"0x1"}],"total":1,"truncated":false})", false);
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->find("shown"), std::string::npos) << *whole;
}

TEST(Render, JsonIsPrettyPrinted) {
  auto text = render("engines", R"({"engines":[{"id":3}]})", true);
  ASSERT_TRUE(text) << text.error().message();
  EXPECT_EQ(*text, "{\n  \"engines\": [\n    {\n      \"id\": 3\n    }\n  ]\n}\n");
}

TEST(Render, InvalidUtf8IsAnErrorNotAnException) {
  std::string body = "{\"name\":\"a\xff\"}";
  for (bool json_out : {true, false}) {
    auto text = render("status", body, json_out);
    ASSERT_FALSE(text);
    EXPECT_EQ(text.error().code(), EBADMSG);
  }
}

TEST(Render, InvalidJsonAndUnknownCommand) {
  auto bad = render("status", "{\"version\":", false);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), EBADMSG);
  auto unknown = render("frobnicate", "{}", false);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code(), EINVAL);
  EXPECT_TRUE(known_command("sessions"));
  EXPECT_FALSE(known_command("frobnicate"));
}

TEST(Render, FloatsHaveAtMostThreeDecimals) {
  auto t = sessions_table(parse(R"({"sessions":[{"cpu_weight":1.510721535},{"cpu_weight":2.0},{"cpu_weight":-0.0001},
                                                {"cpu_weight":1e20}]})"));
  ASSERT_TRUE(t) << t.error().message();
  EXPECT_EQ(t->rows[0][9], "1.511");
  EXPECT_EQ(t->rows[1][9], "2");
  EXPECT_EQ(t->rows[2][9], "0");
  EXPECT_EQ(t->rows[3][9], "100000000000000000000");
}

TEST(Render, FormatAge) {
  EXPECT_EQ(format_age(0), "0.0s");
  EXPECT_EQ(format_age(12.34), "12.3s");
  EXPECT_EQ(format_age(59.96), "1m00s");
  EXPECT_EQ(format_age(125), "2m05s");
  EXPECT_EQ(format_age(3720), "1h02m");
  EXPECT_EQ(format_age(273600), "3d04h");
  EXPECT_EQ(format_age(-1), "-");
  std::string huge = format_age(1e300);  // no overflowing cast
  EXPECT_TRUE(huge.ends_with("d")) << huge;
}

TEST(Render, TableRowsShorterThanHeaderArePadded) {
  Table t{{"A", "B"}, {false, true}, {{"x"}, {"long", "12"}}};
  EXPECT_EQ(format_table(t), "A      B\nx      -\nlong  12\n");
}

}  // namespace
}  // namespace tandem::ctl
