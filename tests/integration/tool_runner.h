// A runner on libtandem spawning real tools (tandem-test-tool) through the
// real tandemd: the fixture the tool tests share (tools_test.cc,
// tool_pool_test.cc). As root only (tandemd makes cgroups for tools); skipped
// with a message elsewhere. The including test target defines
// TEST_TOOL_PATH.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tandem/tandem.h"
#include "tests/integration/harness.h"

#ifndef TEST_TOOL_PATH
#error "a test using tool_runner.h defines TEST_TOOL_PATH (the tandem-test-tool binary)"
#endif

namespace tandem::it {

// Thread-safety: one test's thread.
class ToolRunnerTest : public ::testing::Test {
 protected:
  // `runner_name`: the name the runner says Hello with.
  explicit ToolRunnerTest(std::string runner_name) : runner_name_(std::move(runner_name)) {}

  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: tandemd makes cgroups for tools";
  }
  void TearDown() override {
    if (runner_ != nullptr) tandem_close(runner_);
    if (daemon_) (void)daemon_->stop();
  }

  // Opens the runner and waits until its handshake is done.
  void open_runner() {
    tandem_options o{};
    o.sz = sizeof o;
    o.runtime_dir = dir_.path().c_str();
    o.name = runner_name_.c_str();
    ASSERT_EQ(tandem_runner_open(&o, &runner_), 0);
    ASSERT_TRUE(eventually([&] {
      (void)tandem_poll(runner_, 0, 0, nullptr);  // drives the handshake
      return tandem_connected(runner_) == 1;
    }));
  }
  std::uint64_t open_session(const char* name) {
    std::uint64_t s = 0;
    EXPECT_EQ(tandem_session_open(runner_, name, nullptr, &s), 0) << tandem_last_error(runner_);
    return s;
  }
  // tandem-test-tool with `args`, in `session`; its pid (0 on failure).
  pid_t spawn(std::uint64_t session, const std::vector<std::string>& args, const tandem_tool_options* opts = nullptr) {
    std::vector<const char*> argv{TEST_TOOL_PATH};
    for (const auto& a : args) argv.push_back(a.c_str());
    argv.push_back(nullptr);
    std::int32_t pid = 0;
    int r = tandem_tool_spawn(runner_, session, "test-tool", argv.data(), nullptr, nullptr, opts, &pid);
    EXPECT_EQ(r, 0) << tandem_last_error(runner_);
    return pid;
  }
  tandem_tool_result wait(pid_t pid, int timeout_ms = 20000) {
    tandem_tool_result res{};
    res.sz = sizeof res;
    EXPECT_EQ(tandem_tool_wait(runner_, pid, timeout_ms, &res), 0) << tandem_last_error(runner_);
    return res;
  }
  nlohmann::json status() { return ctl(daemon_->socket_path(), "status"); }

  TempDir dir_;
  std::optional<Daemon> daemon_;
  tandem_client* runner_ = nullptr;

 private:
  std::string runner_name_;
};

}  // namespace tandem::it
