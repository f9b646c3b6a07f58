// tandem-llama under the real tandemd: the binary on the tiny model,
// registered as an engine with the pool it really has, following the
// daemon's KV directives (policy tandem pins a session's KV across its tool
// call), reporting real token counts, and fail-open: a daemon killed with
// SIGKILL in the middle of a streamed round does not stop the stream, and
// the engine reconnects to the restarted daemon.
#include <gtest/gtest.h>
#include <httplib.h>

#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/integration/harness.h"

namespace tandem::it {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tandemctl(const std::string& dir, const std::string& args) {
  const std::string cmd = std::string(TANDEMCTL_PATH) + " --runtime-dir " + dir + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  if (p != nullptr) ::pclose(p);
  return out;
}

class LlamaProcess {
 public:
  void start(const std::string& dir, const std::vector<std::string>& extra = {}) {
    out_ = dir + "/llama.out";
    log_ = dir + "/llama.log";
    std::vector<std::string> argv = {LLAMA_PATH, "--model", TANDEM_TINY_MODEL, "--port", "0",    "--runtime-dir",
                                     dir,        "--name",  "llama-0",         "--ctx",  "2048", "--threads",
                                     "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    proc_.start(argv, out_, log_);
    const std::regex re("listening on 127\\.0\\.0\\.1:([0-9]+)");
    ASSERT_TRUE(eventually(
        [&] {
          std::smatch m;
          const std::string text = slurp(out_);
          if (!std::regex_search(text, m, re)) return false;
          port_ = std::stoi(m[1]);
          return true;
        },
        30s))
        << slurp(log_);
  }
  int stop() { return proc_.stop(SIGTERM); }
  int port() const { return port_; }
  std::string log() const { return slurp(log_); }
  json stats() const {
    httplib::Client http("127.0.0.1", port_);
    http.set_read_timeout(5s);
    auto r = http.Get("/stats");
    return r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
  }
  json complete(const json& body) const {
    httplib::Client http("127.0.0.1", port_);
    http.set_read_timeout(60s);
    auto r = http.Post("/v1/completions", body.dump(), "application/json");
    if (!r) return json();
    json j = json::parse(r->body, nullptr, false);
    j["http_status"] = r->status;
    return j;
  }

 private:
  Process proc_;
  std::string out_, log_;
  int port_ = 0;
};

TEST(LlamaDaemon, RegistersItsRealPoolAndFollowsThePolicysPins) {
  TempDir dir;
  Daemon daemon(dir.path(), "[policy]\nname = \"tandem\"\n");
  daemon.start();
  LlamaProcess llama;
  llama.start(dir.path());
  json engines;
  ASSERT_TRUE(eventually(
      [&] {
        engines = json::parse(tandemctl(dir.path(), "engines --json"), nullptr, false);
        return !engines.is_discarded() && engines["engines"].size() == 1u &&
               engines["engines"][0].value("blocks_total", 0u) != 0u;
      },
      10s))
      << tandemctl(dir.path(), "engines") << daemon.log();
  EXPECT_EQ(engines["engines"][0]["name"], "llama-0");
  EXPECT_EQ(engines["engines"][0]["blocks_total"], 2048u / 16u) << "the cells llama.cpp has, in blocks of 16";

  // A round followed by a tool call: 300 prompt tokens, 8 generated.
  const json r = llama.complete({{"prompt", "task"},
                                 {"prompt_tokens", 300},
                                 {"max_tokens", 8},
                                 {"session_id", "agent-1"},
                                 {"temperature", 0},
                                 {"ignore_eos", true},
                                 {"tool_follows", true}});
  ASSERT_EQ(r.value("http_status", 0), 200) << r.dump();
  EXPECT_EQ(r["usage"]["prompt_tokens"], 300);
  EXPECT_EQ(r["usage"]["completion_tokens"], 8);
  // tandem keeps the KV of a session in a tool call (it pins it): the
  // daemon's directive reaches the engine and llama.cpp keeps the cells.
  json s;
  EXPECT_TRUE(eventually(
      [&] {
        s = llama.stats();
        return s.is_object() && s["directives"].value("pin", 0) >= 1;
      },
      10s))
      << s.dump() << daemon.log();
  EXPECT_GT(s["engine"].value("blocks_pinned", 0u), 0u) << s.dump();
  EXPECT_GE(s["kv"].value("cells_ledger", 0u), 16u * s["engine"].value("blocks_pinned", 0u));
  EXPECT_EQ(s["kv"].value("ledger_violations", 1u), 0u) << s["kv"].dump();
  const std::string sessions = tandemctl(dir.path(), "sessions");
  EXPECT_NE(sessions.find("agent-1"), std::string::npos) << sessions;

  // The next round reuses what is pinned: only new tokens are computed.
  const json r2 = llama.complete({{"prompt", "task r"},
                                  {"prompt_tokens", 340},
                                  {"max_tokens", 4},
                                  {"session_id", "agent-1"},
                                  {"temperature", 0},
                                  {"ignore_eos", true},
                                  {"tool_follows", false}});
  ASSERT_EQ(r2.value("http_status", 0), 200) << r2.dump();
  EXPECT_GE(r2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 288) << r2.dump();
  EXPECT_EQ(llama.stop(), 0);
}

TEST(LlamaDaemon, AStreamSurvivesTheDaemonKilledMidwayAndTheEngineReconnects) {
  TempDir dir;
  Daemon daemon(dir.path());
  daemon.start();
  LlamaProcess llama;
  llama.start(dir.path());
  ASSERT_TRUE(eventually([&] { return llama.stats().value("connected", false); }, 10s)) << llama.log();

  constexpr int kTokens = 160;
  std::atomic<int> chunks{0};
  bool done = false;
  std::string buffer;
  std::thread client([&] {
    httplib::Client http("127.0.0.1", llama.port());
    http.set_read_timeout(120s);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{
        {"prompt", "a story"},
        {"max_tokens", kTokens},
        {"stream", true},
        {"session_id", "streamer"},
        {"ignore_eos",
         true}}.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, std::size_t len, std::uint64_t, std::uint64_t) {
      buffer.append(data, len);
      for (std::size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
        const std::string event = buffer.substr(0, end);
        buffer.erase(0, end + 2);
        if (event == "data: [DONE]") {
          done = true;
        } else if (event.starts_with("data: ") && event.find("\"error\"") == std::string::npos) {
          ++chunks;
        }
      }
      return true;
    };
    auto res = http.send(req);
    EXPECT_TRUE(res);
  });
  ASSERT_TRUE(eventually([&] { return chunks >= 10; }, 60s)) << llama.log();
  daemon.kill9();
  client.join();
  EXPECT_TRUE(done);
  EXPECT_EQ(chunks, kTokens) << "every token arrived although the daemon died at token ~10";
  EXPECT_FALSE(llama.stats().value("connected", true));

  daemon.start();
  EXPECT_TRUE(eventually([&] { return llama.stats().value("connected", false); }, 15s)) << llama.log() << daemon.log();
  EXPECT_EQ(llama.stop(), 0);
}

TEST(LlamaDaemon, AMissingOrInvalidModelExitsTwoNamingTheFile) {
  TempDir dir;
  for (const std::string& model : {dir.path() + "/missing.gguf", std::string(TANDEMCTL_PATH)}) {
    Process p;
    p.start({LLAMA_PATH, "--model", model, "--port", "0", "--runtime-dir", dir.path()}, dir.path() + "/o",
            dir.path() + "/e");
    const int status = p.stop(0, 30s);  // signal 0: only waits
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
    const std::string err = slurp(dir.path() + "/e");
    EXPECT_NE(err.find(model), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace tandem::it
