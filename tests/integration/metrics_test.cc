// The real tandemd's metrics: scraped over HTTP from its loopback port and
// through `ctl metrics`, both checked with an independent parser (Debian's
// python3-prometheus-client), and their values against what a client did.

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <utility>

#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/integration/harness.h"
#include "tests/loopback_http.h"

namespace tandem::it {
namespace {

using ::testing::HasSubstr;

std::string http_get(std::uint16_t port, const std::string& path) {
  return tandem::test_support::loopback_exchange(port, "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n")
      .value_or("");
}

// The port of a "HOST:PORT" tandemd reports, and the body of an HTTP reply
// ("" when it has none yet).
std::uint16_t port_of(const std::string& listen) {
  return static_cast<std::uint16_t>(std::stoi(listen.substr(listen.rfind(':') + 1)));
}

std::string body_of(const std::string& reply) {
  const auto split = reply.find("\r\n\r\n");
  return split == std::string::npos ? std::string() : reply.substr(split + 4);
}

// Runs the exposition through prometheus_client's parser; returns its
// "name{labels} value" lines, or "ERROR: ..." (or "SKIP" without the parser).
std::string parse_with_prometheus_client(const std::string& text, const std::string& dir) {
  const std::string in = dir + "/metrics.txt";
  std::ofstream(in) << text;
  const std::string cmd =
      "/usr/bin/python3 -c '"
      "import sys\n"
      "try:\n"
      "    from prometheus_client.parser import text_string_to_metric_families\n"
      "except ImportError:\n"
      "    print(\"SKIP\"); sys.exit(0)\n"
      "try:\n"
      "    for f in text_string_to_metric_families(open(sys.argv[1]).read()):\n"
      "        for s in f.samples:\n"
      "            print(f.type, s.name, sorted(s.labels.items()), s.value)\n"
      "except Exception as e:\n"
      "    print(\"ERROR:\", e)\n"
      "' " +
      in + " 2>&1";
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

TEST(Metrics, ScrapedOverHttpAndCtlAndParsedByPrometheusClient) {
  TempDir dir;
  Daemon daemon(dir.path());
  daemon.start();
  auto engine = RawClient::connect(daemon.socket_path());
  ASSERT_TRUE(engine);
  ASSERT_TRUE(engine->hello(wire::Role::Engine, "gpu0-engine", test_engine_info()));
  ipc::KvStats stats;
  stats.blocks_total = 1000;
  stats.blocks_free = 700;
  stats.blocks_pinned = 40;
  ASSERT_TRUE(engine->push(record(stats, 0)));
  ipc::RoundSubmit round;
  round.prompt_tokens = 100;
  round.projected_blocks = 8;
  ASSERT_TRUE(engine->push(record(round, 0x77)));
  ipc::KvEvent evicted;
  evicted.kind = static_cast<std::uint8_t>(ipc::KvEventKind::kEvicted);
  evicted.blocks = 5;
  ASSERT_TRUE(engine->push(record(evicted, 0x77)));

  const nlohmann::json status = ctl(daemon.socket_path(), "status");
  const std::string listen = status["metrics"]["listen"].get<std::string>();
  ASSERT_THAT(listen, ::testing::StartsWith("127.0.0.1:")) << status.dump();
  const std::uint16_t port = port_of(listen);

  std::string body;
  ASSERT_TRUE(eventually([&] {
    body = body_of(http_get(port, "/metrics"));
    return body.find("kind=\"evicted\"} 1\n") != std::string::npos;
  })) << body;
  EXPECT_THAT(http_get(port, "/nope"), HasSubstr("404 Not Found"));

  const std::string parsed = parse_with_prometheus_client(body, dir.path());
  if (parsed.starts_with("SKIP")) GTEST_SKIP() << "python3-prometheus-client is not installed (scripts/install-deps)";
  ASSERT_THAT(parsed, ::testing::Not(HasSubstr("ERROR"))) << parsed << "\n---\n" << body;
  // The families the issue names, with the values this test caused.
  EXPECT_THAT(parsed, HasSubstr("gauge tandem_sessions [('state', 'reasoning')]"));
  EXPECT_THAT(parsed, HasSubstr("gauge tandem_kv_blocks [('engine', 'gpu0-engine'), ('state', 'total')] 1000.0"));
  EXPECT_THAT(parsed, HasSubstr("gauge tandem_kv_blocks [('engine', 'gpu0-engine'), ('state', 'pinned')] 40.0"));
  EXPECT_THAT(parsed, HasSubstr("counter tandem_kv_events_total [('kind', 'evicted')] 1.0"));
  EXPECT_THAT(parsed, HasSubstr("counter tandem_kv_event_blocks_total [('kind', 'evicted')] 5.0"));
  EXPECT_THAT(parsed, HasSubstr("gauge tandem_admission_window [] "));
  EXPECT_THAT(parsed, HasSubstr("gauge tandem_clients [('role', 'engine')] 1.0"));
  for (const char* family :
       {"tandem_kv_pinned_sessions", "tandem_recomputed_tokens_total", "tandem_tool_calls_total",
        "tandem_tool_cpu_seconds_total", "tandem_tool_memory_bytes", "tandem_control_tick_seconds_total",
        "tandem_control_ticks_total", "tandem_directive_ring_overflows_total", "tandem_records_total"}) {
    EXPECT_THAT(parsed, HasSubstr(std::string(" ") + family + " ")) << family;
  }

  // tandemctl metrics: the same families through the control socket.
  auto c = RawClient::connect(daemon.socket_path());
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->hello(wire::Role::CtlRead, "it-ctl"));
  auto text = c->ctl("metrics");
  ASSERT_TRUE(text) << text.error().message();
  const std::string via_ctl = parse_with_prometheus_client(*text, dir.path());
  EXPECT_THAT(via_ctl, ::testing::Not(HasSubstr("ERROR"))) << via_ctl;
  EXPECT_THAT(via_ctl, HasSubstr("counter tandem_kv_events_total [('kind', 'evicted')] 1.0"));
  EXPECT_GE(ctl(daemon.socket_path(), "status")["metrics"]["scrapes"].get<int>(), 1);
}

// `promtool check metrics` (Debian's prometheus package) on the text: its
// output and exit status ("SKIP" without promtool).
std::pair<int, std::string> promtool_check(const std::string& text, const std::string& dir) {
  if (::access("/usr/bin/promtool", X_OK) != 0) return {0, "SKIP"};
  const std::string in = dir + "/promtool-in.txt";
  std::ofstream(in) << text;
  std::string out;
  int status = -1;
  if (FILE* p = ::popen(("/usr/bin/promtool check metrics < " + in + " 2>&1").c_str(), "r")) {
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    status = ::pclose(p);
  }
  return {status, out};
}

TEST(Metrics, EachEngineGetsVllmNamesOnItsOwnEndpointAndPromtoolPassesThem) {
  TempDir dir;
  Daemon daemon(dir.path(),
                "[metrics]\nlisten = \"127.0.0.1:0\"\n[metrics.engines]\n\"gpu0-engine\" = \"127.0.0.1:0\"\n"
                "\"not-here\" = \"127.0.0.1:0\"\n");
  daemon.start();
  auto engine = RawClient::connect(daemon.socket_path());
  ASSERT_TRUE(engine);
  ASSERT_TRUE(engine->hello(wire::Role::Engine, "gpu0-engine", test_engine_info()));
  ipc::KvStats stats;
  stats.blocks_total = 1000;
  stats.blocks_free = 750;
  stats.blocks_pinned = 40;
  stats.blocks_offloaded = 12;
  stats.running_seqs = 3;
  stats.waiting_seqs = 2;
  ASSERT_TRUE(engine->push(record(stats, 0)));
  ipc::RoundSubmit round;
  round.prompt_tokens = 100;
  round.cached_tokens = 64;
  round.projected_blocks = 8;
  ASSERT_TRUE(engine->push(record(round, 0x77)));

  const nlohmann::json status = ctl(daemon.socket_path(), "status");
  ASSERT_TRUE(status["metrics"].contains("engines")) << status.dump();
  const std::string listen = status["metrics"]["engines"]["gpu0-engine"]["listen"].get<std::string>();
  ASSERT_THAT(listen, ::testing::StartsWith("127.0.0.1:")) << status.dump();
  std::string body;
  ASSERT_TRUE(eventually([&] {
    body = body_of(http_get(port_of(listen), "/metrics"));
    return body.find("vllm:prefix_cache_queries_total{model_name=\"gpu0-engine\"} 100\n") != std::string::npos;
  })) << body;
  EXPECT_THAT(body, HasSubstr("vllm:num_requests_running{model_name=\"gpu0-engine\"} 3\n"));
  EXPECT_THAT(body, HasSubstr("vllm:prefix_cache_hits_total{model_name=\"gpu0-engine\"} 64\n"));
  EXPECT_THAT(body, HasSubstr("vllm:kv_cache_usage_perc{model_name=\"gpu0-engine\"} 0.25\n"));
  EXPECT_THAT(body, HasSubstr("vllm:gpu_cache_usage_perc{model_name=\"gpu0-engine\"} 0.25\n"));
  EXPECT_THAT(body, HasSubstr("vllm:lora_requests_info{model_name=\"gpu0-engine\",max_lora=\"0\""));
  EXPECT_THAT(body, HasSubstr("tandem_kv_blocks{engine=\"gpu0-engine\",state=\"offloaded\"} 12\n"));
  EXPECT_THAT(body, HasSubstr("tandem_acting_sessions{engine=\"gpu0-engine\"} 0\n"));
  // The engine's two queued sequences, and the round the policy holds or
  // not (it may have admitted it by now).
  EXPECT_THAT(body, ::testing::AnyOf(HasSubstr("vllm:num_requests_waiting{model_name=\"gpu0-engine\"} 2\n"),
                                     HasSubstr("vllm:num_requests_waiting{model_name=\"gpu0-engine\"} 3\n")));
  EXPECT_THAT(body, ::testing::Not(HasSubstr("tandem_build_info")));  // only this engine's families

  // The node's endpoint has the same families for every engine.
  const std::string node = body_of(http_get(port_of(status["metrics"]["listen"].get<std::string>()), "/metrics"));
  EXPECT_THAT(node, HasSubstr("vllm:prefix_cache_queries_total{model_name=\"gpu0-engine\"} 100\n"));

  // promtool exits 1 on a text it cannot parse and 3 on lint problems. The
  // protocol's names carry a colon, which its lint reserves for recording
  // rules (vLLM's own /metrics gets the same remark): that remark, for the
  // vllm: families only, is the one problem allowed.
  const std::regex colon_remark("^vllm:[a-z_]+ metric names should not contain ':'$");
  for (const std::string& text : {body, node}) {
    const auto [rc, out] = promtool_check(text, dir.path());
    if (out == "SKIP") GTEST_SKIP() << "promtool is not installed (scripts/install-deps installs prometheus)";
    EXPECT_TRUE(WIFEXITED(rc) && (WEXITSTATUS(rc) == 0 || WEXITSTATUS(rc) == 3)) << rc << ": " << out;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      EXPECT_TRUE(line.empty() || std::regex_match(line, colon_remark)) << "promtool: " << line << "\n---\n" << text;
    }
    const std::string parsed = parse_with_prometheus_client(text, dir.path());
    EXPECT_THAT(parsed, ::testing::Not(HasSubstr("ERROR"))) << parsed;
  }
  // The check can fail: a broken exposition, and a lint problem of ours.
  const auto broken = promtool_check("vllm:num_requests_running{model_name=\"x\" 1\n", dir.path()).first;
  EXPECT_TRUE(WIFEXITED(broken) && WEXITSTATUS(broken) == 1) << broken;
  const std::string lint =
      promtool_check("# HELP tandem_x_count x\n# TYPE tandem_x_count counter\ntandem_x_count 1\n", dir.path()).second;
  EXPECT_THAT(lint, HasSubstr("_total"));

  // An engine that is not connected: 503 naming it; the daemon goes on.
  const std::string absent = status["metrics"]["engines"]["not-here"]["listen"].get<std::string>();
  const std::string reply = http_get(port_of(absent), "/metrics");
  EXPECT_THAT(reply, HasSubstr("503 Service Unavailable"));
  EXPECT_THAT(reply, HasSubstr("no engine named \"not-here\" is connected"));
  EXPECT_GE(ctl(daemon.socket_path(), "status")["metrics"]["engines"]["gpu0-engine"]["scrapes"].get<int>(), 1);
}

TEST(Metrics, APortInUseCostsTheEndpointNotTheDaemon) {
  TempDir first_dir;
  Daemon first(first_dir.path());
  first.start();
  const std::string taken = ctl(first.socket_path(), "status")["metrics"]["listen"].get<std::string>();
  TempDir dir;
  Daemon second(dir.path(), "[metrics]\nlisten = \"" + taken + "\"\n");
  second.start();
  const std::string listen = ctl(second.socket_path(), "status")["metrics"]["listen"].get<std::string>();
  EXPECT_THAT(listen, HasSubstr("off: metrics: bind " + taken));
  EXPECT_THAT(second.log(), HasSubstr("serving metrics only through tandemctl metrics"));
  auto c = RawClient::connect(second.socket_path());
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->hello(wire::Role::CtlRead, "it-ctl"));
  auto text = c->ctl("metrics");
  ASSERT_TRUE(text);
  EXPECT_THAT(*text, HasSubstr("tandem_build_info{"));
}

}  // namespace
}  // namespace tandem::it
