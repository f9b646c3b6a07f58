// tandem-engine-emu end to end: the real binary, started with an empty
// runtime dir (no daemon: libtandem runs fail-open) and --speedup 20, driven
// over HTTP with httplib::Client. Every test starts its own process and kills
// it by pid in teardown if it is still there.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/preset.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr double kSpeedup = 20.0;

// A child process with its stdout on a pipe.
class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { kill_now(); }

  bool start(const std::vector<std::string>& args, const std::string& stderr_path) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return false;
    pid_ = fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      const int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (err >= 0) dup2(err, STDERR_FILENO);
      std::vector<char*> argv;
      argv.reserve(args.size() + 1);
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fds[0];
    return true;
  }
  // A line of stdout, or "" after `timeout`.
  std::string read_line(std::chrono::milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    while (buf_.find('\n') == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
      if (left <= 0) return "";
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char b[256];
      const ssize_t n = read(out_, b, sizeof b);
      if (n <= 0) return "";
      buf_.append(b, static_cast<std::size_t>(n));
    }
    const std::size_t nl = buf_.find('\n');
    std::string line = buf_.substr(0, nl);
    buf_.erase(0, nl + 1);
    return line;
  }
  // The exit status (-signal if killed), or nullopt if still running after `timeout`.
  std::optional<int> wait(std::chrono::milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    while (pid_ > 0) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      }
      if (Clock::now() > end) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return std::nullopt;
  }
  void signal(int sig) const {
    if (pid_ > 0) kill(pid_, sig);
  }
  void kill_now() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    if (out_ >= 0) close(out_);
    out_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buf_;
};

class EmuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tandem-emu-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::vector<std::string> args = {TANDEM_ENGINE_EMU, "--port", "0",           "--runtime-dir", dir_ + "/run",
                                     "--speedup",       "20",     "--kv-blocks", "4096"};
    for (const std::string& a : extra_args()) args.push_back(a);
    ASSERT_TRUE(emu_.start(args, dir_ + "/stderr"));
    const std::string line = emu_.read_line(std::chrono::seconds(20));
    const std::string prefix = "tandem-engine-emu: listening on 127.0.0.1:";
    ASSERT_TRUE(line.starts_with(prefix)) << "stdout: '" << line << "', stderr: " << stderr_text();
    port_ = std::stoi(line.substr(prefix.size()));
    ASSERT_GT(port_, 0);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    client_->set_read_timeout(30, 0);
  }
  // Flags after the fixture's own.
  virtual std::vector<std::string> extra_args() const { return {}; }
  void TearDown() override {
    emu_.kill_now();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string stderr_text() const {
    std::string s;
    if (FILE* f = fopen((dir_ + "/stderr").c_str(), "r")) {
      char b[4096];
      std::size_t n = 0;
      while ((n = fread(b, 1, sizeof b, f)) > 0) s.append(b, n);
      fclose(f);
    }
    return s;
  }
  json post(const std::string& path, const json& body, int expect_status = 200) {
    auto res = client_->Post(path, body.dump(), "application/json");
    EXPECT_TRUE(res) << "no reply to " << path;
    if (!res) return json();
    EXPECT_EQ(res->status, expect_status) << res->body;
    return json::parse(res->body, nullptr, false);
  }
  json stats() {
    auto res = client_->Get("/stats");
    EXPECT_TRUE(res && res->status == 200);
    return res ? json::parse(res->body, nullptr, false) : json();
  }

  std::string dir_;
  Child emu_;
  int port_ = 0;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(EmuTest, CompletionReturnsUsageAndFillerText) {
  const json r = post("/v1/completions", {{"prompt", "hello world!"}, {"max_tokens", 5}});  // 12 bytes: 3 tokens
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "h100-llama3-8b");
  EXPECT_EQ(r["choices"][0]["text"], " tok tok tok tok tok");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(r["usage"]["completion_tokens"], 5);
  EXPECT_EQ(r["usage"]["total_tokens"], 8);

  const json c =
      post("/v1/chat/completions",
           {{"messages", {{{"role", "system"}, {"content", "abcd"}}, {{"role", "user"}, {"content", "efghi"}}}},
            {"max_tokens", 2},
            {"prompt_tokens", 300}});
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"]["content"], " tok tok");
  EXPECT_EQ(c["usage"]["prompt_tokens"], 300);
  EXPECT_EQ(c["usage"]["total_tokens"], 302);

  auto health = client_->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  const json h = json::parse(health->body);
  EXPECT_EQ(h["status"], "ok");
  EXPECT_EQ(h["connected"], false);  // no daemon: fail-open
  auto models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "h100-llama3-8b");

  // The pool agrees with the engine's accounting, and the engine with itself.
  const json s = stats();
  EXPECT_EQ(s["rounds"]["completed"], 2);
  EXPECT_EQ(s["pool"]["errors"], 0);
  EXPECT_EQ(s["engine"]["violations"], 0);
  EXPECT_EQ(s["pool"]["blocks_free"], s["engine"]["blocks_free"]);
  EXPECT_EQ(s["pool"]["blocks_pinned"], s["engine"]["blocks_pinned"]);
  EXPECT_EQ(s["pool"]["blocks_cached"], s["engine"]["blocks_cached"]);
  EXPECT_EQ(s["pool"]["blocks_total"], 4096);
  EXPECT_GT(s["pool"]["touched_bytes"].get<std::uint64_t>(), 0u);
  // Both rounds are over and the engine idle: whatever lateness it did not
  // make up was forgiven, and it is part of all the lateness.
  const double late = s["time"]["late_s"], unrecovered = s["time"]["late_unrecovered_s"];
  EXPECT_GE(unrecovered, 0.0);
  EXPECT_LE(unrecovered, late);
}

TEST_F(EmuTest, StreamYieldsOneChunkPerTokenSpreadOverSteps) {
  constexpr int kTokens = 24;
  std::string buffer;
  std::vector<Clock::time_point> at;  // when each data event arrived
  std::vector<json> chunks;
  bool done = false;
  const json body = {{"prompt", std::string(64, 'a')}, {"max_tokens", kTokens}, {"stream", true}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, std::size_t len, std::uint64_t, std::uint64_t) {
    buffer.append(data, len);
    for (std::size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      EXPECT_TRUE(event.starts_with("data: ")) << event;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        EXPECT_FALSE(done);
        done = true;
        continue;
      }
      EXPECT_FALSE(done) << "data after [DONE]";
      chunks.push_back(json::parse(payload));
      at.push_back(Clock::now());
    }
    return true;
  };
  const Clock::time_point sent = Clock::now();
  auto res = client_->send(req);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_TRUE(done);
  ASSERT_EQ(chunks.size(), static_cast<std::size_t>(kTokens));
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i]["choices"][0]["text"], " tok");
    EXPECT_EQ(chunks[i]["choices"][0]["finish_reason"].is_null(), i + 1 < chunks.size());
  }
  EXPECT_EQ(chunks.back()["usage"]["completion_tokens"], kTokens);

  // The tokens come one step apart: the last arrives no sooner than half the
  // modelled decode steps (÷ the speedup) after the request was sent.
  const auto preset = *tandem::sim::find_preset("h100-llama3-8b");
  double decode_us = 0;
  for (int j = 1; j < kTokens; ++j) {
    tandem::sim::StepShape shape;
    shape.tokens = 1;
    shape.decode_context = 16 + static_cast<std::uint64_t>(j);
    shape.seqs = 1;
    decode_us += preset.step.step_us(shape);
  }
  const double span_us = std::chrono::duration<double, std::micro>(at.back() - sent).count();
  // A loaded machine only stretches the span. It is measured from the send,
  // not from the first chunk: under load the client's reads coalesce chunks,
  // so the first may arrive late with many behind it (a CI run under ASan
  // saw 1.9 ms between first and last of a 138 ms / 20 stream).
  EXPECT_GT(span_us, 0.5 * decode_us / kSpeedup) << "modelled " << decode_us << " us";
}

TEST_F(EmuTest, SecondRoundOfASessionHitsThePrefixCache) {
  const std::string p1(400, 'x');  // 100 tokens
  const json r1 = post("/v1/completions", {{"prompt", p1}, {"max_tokens", 4}, {"session_id", "agent-1"}});
  EXPECT_EQ(r1["usage"]["prompt_tokens"], 100);
  EXPECT_EQ(r1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  // The agent appends the reply and a tool result to its context.
  const std::string p2 = p1 + r1["choices"][0]["text"].get<std::string>() + std::string(80, 'y');
  const json r2 = post("/v1/completions", {{"prompt", p2}, {"max_tokens", 4}, {"session_id", "agent-1"}});
  EXPECT_EQ(r2["usage"]["prompt_tokens"], 124);
  // 103 tokens computed in round 1: 6 full blocks of 16 stay cached.
  EXPECT_EQ(r2["usage"]["prompt_tokens_details"]["cached_tokens"], 96);
  const json s = stats();
  EXPECT_EQ(s["tokens"]["reused"], 96);
  EXPECT_EQ(s["pool"]["errors"], 0);

  // A different session with the same text shares nothing (sessions do not share KV).
  const json r3 = post("/v1/completions", {{"prompt", p2}, {"max_tokens", 1}, {"session_id", "agent-2"}});
  EXPECT_EQ(r3["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

TEST_F(EmuTest, BadRequestsAreRefusedNamingTheField) {
  auto expect_400 = [&](const std::string& path, const std::string& body, const std::string& field) {
    auto res = client_->Post(path, body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << body;
    const json e = json::parse(res->body, nullptr, false);
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
    EXPECT_EQ(e["error"]["param"], field) << res->body;
    EXPECT_NE(e["error"]["message"].get<std::string>().find(field == "body" ? "JSON" : field), std::string::npos)
        << res->body;
  };
  expect_400("/v1/completions", "{oops", "body");
  expect_400("/v1/completions", R"({"max_tokens":3})", "prompt");
  expect_400("/v1/completions", R"({"prompt":"a","max_tokens":0})", "max_tokens");
  expect_400("/v1/completions", R"({"prompt":"a","max_tokens":1000000})", "max_tokens");
  expect_400("/v1/completions", R"({"prompt":"a","stream":"yes"})", "stream");
  expect_400("/v1/completions", R"({"prompt":"a","session_id":12})", "session_id");
  expect_400("/v1/chat/completions", R"({"messages":"hi"})", "messages");
  auto missing = client_->Get("/v1/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

// Routers' session headers (llm-d's x-session-token, Dynamo's
// X-Dynamo-Session-ID) name the session as the body's session_id does.
TEST_F(EmuTest, SessionHeadersNameTheSession) {
  auto send = [&](const httplib::Headers& headers, const json& body) {
    auto res = client_->Post("/v1/completions", headers, body.dump(), "application/json");
    EXPECT_TRUE(res);
    return res;
  };
  const std::string p1(400, 'x');
  auto r1 = send({{"X-Session-Token", "agent-h"}}, {{"prompt", p1}, {"max_tokens", 2}});
  ASSERT_EQ(r1->status, 200) << r1->body;
  EXPECT_EQ(json::parse(r1->body)["session_id"], "agent-h");
  // The same session through Dynamo's header (any case): its prefix is cached.
  auto r2 = send({{"x-dynamo-session-id", "agent-h"}}, {{"prompt", p1 + "yyyy"}, {"max_tokens", 2}});
  ASSERT_EQ(r2->status, 200) << r2->body;
  const json j2 = json::parse(r2->body);
  EXPECT_EQ(j2["session_id"], "agent-h");
  EXPECT_EQ(j2["usage"]["prompt_tokens_details"]["cached_tokens"], 96);
  // The body's session_id wins over a router's token (llm-d's names a pod).
  auto r4 = send({{"x-session-token", "pod-token"}},
                 {{"prompt", p1 + "yyyyzzzz"}, {"max_tokens", 1}, {"session_id", "agent-h"}});
  ASSERT_EQ(r4->status, 200) << r4->body;
  EXPECT_EQ(json::parse(r4->body)["session_id"], "agent-h");
  // A value session_id could not be is refused the same way.
  auto r5 = send({{"X-Dynamo-Session-ID", std::string(300, 'd')}}, {{"prompt", "a"}, {"max_tokens", 1}});
  ASSERT_EQ(r5->status, 400) << r5->body;
  EXPECT_EQ(json::parse(r5->body)["error"]["param"], "x-dynamo-session-id");
}

TEST_F(EmuTest, ASecondRoundWhileOneIsInFlightIsAConflict) {
  // A long round (2000 decode steps ÷ 20: well over 100 ms) in the background.
  httplib::Client other("127.0.0.1", port_);
  other.set_read_timeout(60, 0);
  std::thread first([&] {
    auto res = other.Post("/v1/completions", json{{"prompt", "a"}, {"max_tokens", 2000}, {"session_id", "busy"}}.dump(),
                          "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
  });
  // Wait until the round is running, then try a second one.
  const auto end = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < end && stats()["engine"]["running_seqs"] != 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto res = client_->Post("/v1/completions", json{{"prompt", "b"}, {"session_id", "busy"}}.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 409);
  EXPECT_NE(res->body.find("in flight"), std::string::npos) << res->body;
  EXPECT_EQ(json::parse(res->body)["error"]["param"], "session_id");
  first.join();
  // Once it is over, the session takes its next round.
  post("/v1/completions", {{"prompt", "b"}, {"max_tokens", 1}, {"session_id", "busy"}});
}

TEST_F(EmuTest, SigtermFinishesTheRoundInFlightAndExitsZero) {
  httplib::Client other("127.0.0.1", port_);
  other.set_read_timeout(60, 0);
  int status = 0;
  std::string body;
  std::thread first([&] {
    auto res = other.Post("/v1/completions", json{{"prompt", "a"}, {"max_tokens", 1000}}.dump(), "application/json");
    if (res) {
      status = res->status;
      body = res->body;
    }
  });
  const auto end = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < end && stats()["engine"]["running_seqs"] != 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  emu_.signal(SIGTERM);
  const auto code = emu_.wait(std::chrono::seconds(20));
  first.join();
  ASSERT_TRUE(code.has_value()) << "still running 20 s after SIGTERM";
  EXPECT_EQ(*code, 0) << stderr_text();
  // The round in flight was answered: finished within the grace period.
  EXPECT_EQ(status, 200) << body;
  EXPECT_EQ(json::parse(body, nullptr, false)["usage"]["completion_tokens"], 1000);
}

// The GPU plane on the simulated device: libtandem's generated pool (decode
// 16..64 SMs by 8, prefill the rest) plus the whole device, the last.
class EmuGpuTest : public EmuTest {
 protected:
  std::vector<std::string> extra_args() const override { return {"--gpu", "sim"}; }
};

TEST_F(EmuGpuTest, StatsShowThePoolAndEveryStepIsAPass) {
  EXPECT_NE(stderr_text().find("GPU plane: backend sim (NVIDIA H100 80GB HBM3 (simulated), 132 SMs), 8 partitions, "
                               "decode 16..132 SMs"),
            std::string::npos)
      << stderr_text();
  json g = stats()["gpu"];
  ASSERT_TRUE(g.is_object()) << g.dump();
  EXPECT_EQ(g["backend"], "sim");
  EXPECT_EQ(g["device"], "NVIDIA H100 80GB HBM3 (simulated)");
  EXPECT_EQ(g["device_sms"], 132);
  EXPECT_EQ(g["partitions"], 8);
  EXPECT_EQ(g["decode_sms"], json::array({16, 24, 32, 40, 48, 56, 64, 132}));
  // A new pool starts on its last partition: the whole device.
  EXPECT_EQ(g["active_partition"], 7);
  EXPECT_EQ(g["active_decode_sms"], 132);
  EXPECT_EQ(g["active_prefill_sms"], 132);
  EXPECT_EQ(g["passes"], 0);

  post("/v1/completions", {{"prompt", "hello"}, {"max_tokens", 6}});
  const json s = stats();
  g = s["gpu"];
  // One forward-pass boundary per step; no daemon (fail-open): the partition stays.
  EXPECT_GE(s["engine"]["steps"].get<int>(), 6);
  EXPECT_EQ(g["passes"], s["engine"]["steps"]);
  EXPECT_EQ(g["active_partition"], 7);
  EXPECT_EQ(g["switches"], 0);
  EXPECT_EQ(g["bad_indices"], 0);
  EXPECT_EQ(s["report_errors"], 0);
}

class EmuGpuOffTest : public EmuTest {
 protected:
  std::vector<std::string> extra_args() const override { return {"--gpu", "off"}; }
};

TEST_F(EmuGpuOffTest, StatsHaveNoGpu) {
  post("/v1/completions", {{"prompt", "hello"}, {"max_tokens", 2}});
  const json s = stats();
  ASSERT_TRUE(s.contains("gpu"));
  EXPECT_TRUE(s["gpu"].is_null()) << s["gpu"].dump();
  EXPECT_EQ(s["rounds"]["completed"], 1);
  EXPECT_NE(stderr_text().find("GPU plane: off"), std::string::npos) << stderr_text();
}

// `--gpu cuda` without a driver is a start-up error naming why (exit 1);
// `--gpu auto` then runs on the simulated device.
TEST(EmuFlags, GpuCudaWithoutADriverFailsAndAutoFallsBack) {
  if (void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL); lib != nullptr) {
    dlclose(lib);
    GTEST_SKIP() << "libcuda.so.1 loads here: --gpu cuda's no-driver error cannot be seen";
  }
  char tmpl[] = "/tmp/tandem-emu-gpu-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto read_err = [&] {
    std::string err;
    if (FILE* f = fopen((dir + "/stderr").c_str(), "r")) {
      char b[4096];
      err.assign(b, fread(b, 1, sizeof b, f));
      fclose(f);
    }
    return err;
  };
  {
    Child c;
    ASSERT_TRUE(
        c.start({TANDEM_ENGINE_EMU, "--port", "0", "--runtime-dir", dir + "/run", "--gpu", "cuda"}, dir + "/stderr"));
    const auto code = c.wait(std::chrono::seconds(10));
    ASSERT_TRUE(code.has_value()) << "--gpu cuda without a driver still running";
    EXPECT_EQ(*code, 1);
    const std::string err = read_err();
    EXPECT_NE(err.find("--gpu cuda: tandem_gpu_open"), std::string::npos) << err;
    EXPECT_NE(err.find("libcuda"), std::string::npos) << err;
    EXPECT_EQ(c.read_line(std::chrono::milliseconds(100)), "") << "it must not serve";
  }
  {
    Child c;
    ASSERT_TRUE(
        c.start({TANDEM_ENGINE_EMU, "--port", "0", "--runtime-dir", dir + "/run", "--gpu", "auto"}, dir + "/stderr"));
    const std::string line = c.read_line(std::chrono::seconds(20));
    ASSERT_TRUE(line.starts_with("tandem-engine-emu: listening on")) << line << read_err();
    EXPECT_NE(read_err().find("GPU plane: backend sim ("), std::string::npos) << read_err();
  }
  std::filesystem::remove_all(dir);
}

TEST(EmuFlags, BadFlagsExitTwoNamingTheFlag) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--port", "abc"}, std::vector<std::string>{"--bogus"},
        std::vector<std::string>{"--preset", "no-such-preset"}, std::vector<std::string>{"--gpu", "nvidia"}}) {
    char tmpl[] = "/tmp/tandem-emu-flags-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const std::string dir = tmpl;
    Child c;
    std::vector<std::string> argv{TANDEM_ENGINE_EMU};
    argv.insert(argv.end(), args.begin(), args.end());
    ASSERT_TRUE(c.start(argv, dir + "/stderr"));
    const auto code = c.wait(std::chrono::seconds(10));
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 2);
    std::string err;
    if (FILE* f = fopen((dir + "/stderr").c_str(), "r")) {
      char b[1024];
      err.assign(b, fread(b, 1, sizeof b, f));
      fclose(f);
    }
    EXPECT_NE(err.find(args[0]), std::string::npos) << err;
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
