// libtandem through its C ABI (and the C++ wrappers tandem.hpp and
// tandem_gpu.hpp): fail-open behaviour without a daemon, argument and role
// checks, in-process step planning, and
// the protocol against a fake daemon that lives in the test — it binds
// <tmpdir>/tandemd.sock, answers Hello with a Welcome carrying a real
// ipc::Channel, reads the event ring, pushes directives and reads resyncs.
//
// The client never blocks, so the fake daemon runs on the test's own thread:
// each step is "let the client act (tandem_poll), then let the daemon act".
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/ids.h"
#include "base/unique_fd.h"
#include "ipc/channel.h"
#include "ipc/messages.h"
#include "ipc/records.h"
#include "tandem/tandem.h"
#include "tandem/tandem.hpp"
#include "tandem/tandem_gpu.hpp"
#include "tests/libclient/fake_daemon.h"

namespace tandem {
namespace {

using libclient_testing::connect;
using libclient_testing::FakeDaemon;
using libclient_testing::now_ns;
using libclient_testing::pump_until;
using libclient_testing::Snap;
using libclient_testing::TempDir;
using std::chrono::milliseconds;
using std::chrono::steady_clock;
using ::testing::HasSubstr;

constexpr std::uint8_t kWaiting = 0;  // sched::SessionState values
constexpr std::uint8_t kReasoning = 1;
constexpr std::uint8_t kActing = 2;

tandem_options options(const char* dir, std::uint32_t cap = 0, std::uint32_t min_ms = 0, std::uint32_t max_ms = 0) {
  tandem_options o{};
  o.sz = sizeof o;
  o.runtime_dir = dir;
  o.name = "test-client";
  o.fallback_cap = cap;
  o.reconnect_min_ms = min_ms;
  o.reconnect_max_ms = max_ms;
  return o;
}

tandem_engine_params engine_params() {
  tandem_engine_params p{};
  p.sz = sizeof p;
  p.gpu_index = 0;
  p.block_size = 16;
  p.total_blocks = 4096;
  p.max_seqs = 64;
  p.token_budget = 2048;
  p.saturating_tokens = 512;
  p.max_model_len = 32768;
  return p;
}

tandem_round make_round(std::uint32_t round, std::uint32_t prompt = 100, std::uint32_t cached = 0) {
  tandem_round r{};
  r.sz = sizeof r;
  r.round = round;
  r.prompt_tokens = prompt;
  r.cached_tokens = cached;
  r.projected_blocks = 8;
  r.max_output_tokens = 256;
  return r;
}

tandem_client_stats get_stats(const tandem_client* c) {
  tandem_client_stats s{};
  s.sz = sizeof s;
  EXPECT_EQ(tandem_get_stats(c, &s), 0);
  return s;
}

// ---- fail-open ----------------------------------------------------------------

TEST(FailOpen, EngineRunsUnderTheLocalCapWithoutADaemon) {
  TempDir dir;  // no daemon ever listens here
  auto o = options(dir.path().c_str(), 2);
  auto p = engine_params();
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_engine_open(&o, &p, &c), 0);
  EXPECT_EQ(tandem_connected(c), 0);
  EXPECT_EQ(tandem_client_id(c), 0u);
  EXPECT_STREQ(tandem_last_error(c), "");

  const std::uint64_t a = tandem_session_id("a"), b = tandem_session_id("b"), d = tandem_session_id("d");
  EXPECT_EQ(tandem_session_runnable(c, tandem_session_id("never-submitted")), 1);
  for (std::uint64_t s : {a, b, d}) {
    auto r = make_round(0);
    EXPECT_EQ(tandem_round_submit(c, s, &r), 0);
  }
  EXPECT_EQ(tandem_session_runnable(c, a), 1);
  EXPECT_EQ(tandem_session_runnable(c, b), 1);
  EXPECT_EQ(tandem_session_runnable(c, d), 0) << "beyond fallback_cap";
  EXPECT_EQ(tandem_session_runnable(c, d), 0);
  EXPECT_EQ(tandem_round_first_token(c, a, 0, 1000, 2000), 0);
  EXPECT_EQ(tandem_round_end(c, a, 0, 50, 4, 1), 0);
  EXPECT_EQ(tandem_session_runnable(c, d), 1) << "a's slot came back at its round end";
  // a's next round waits for a slot again.
  auto r1 = make_round(1);
  EXPECT_EQ(tandem_round_submit(c, a, &r1), 0);
  EXPECT_EQ(tandem_session_runnable(c, a), 0);
  EXPECT_EQ(tandem_round_end(c, b, 0, 5, 0, 0), 0);
  EXPECT_EQ(tandem_session_runnable(c, a), 1);

  tandem_kv_stats kv{};
  kv.sz = sizeof kv;
  kv.blocks_total = 100;
  kv.blocks_free = 50;
  EXPECT_EQ(tandem_kv_stats_report(c, &kv), 0);
  EXPECT_EQ(tandem_kv_event(c, a, TANDEM_KV_EVICTED, 4, 0), 0);
  EXPECT_EQ(tandem_session_name(c, a, "a"), 0);

  auto stats = get_stats(c);
  EXPECT_EQ(stats.connects, 0u);
  EXPECT_EQ(stats.records_sent, 0u);
  EXPECT_EQ(stats.records_dropped, 9u);  // 4 submits, 1 first token, 2 ends, kv stats, kv event

  // tandem_poll waits the timeout, not longer.
  const auto t0 = steady_clock::now();
  tandem_directive dirs[4];
  EXPECT_EQ(tandem_poll(c, 100, 4, dirs), 0);
  const auto waited = steady_clock::now() - t0;
  EXPECT_GE(waited, milliseconds(95));
  EXPECT_LT(waited, milliseconds(1000));
  EXPECT_EQ(tandem_poll(c, 0, 0, nullptr), 0);
  tandem_close(c);
}

TEST(FailOpen, SlotsGoToQueuedRoundsInSubmitOrder) {
  TempDir dir;
  auto o = options(dir.path().c_str(), 2);
  auto p = engine_params();
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_engine_open(&o, &p, &c), 0);
  const std::uint64_t s1 = tandem_session_id("1"), s2 = tandem_session_id("2"), s3 = tandem_session_id("3");
  for (std::uint64_t s : {s1, s2, s3}) {
    auto r = make_round(0);
    ASSERT_EQ(tandem_round_submit(c, s, &r), 0);
  }
  // Asking about the newest first still hands the slots to the oldest.
  EXPECT_EQ(tandem_session_runnable(c, s3), 0);
  EXPECT_EQ(tandem_session_runnable(c, s1), 1);
  EXPECT_EQ(tandem_session_runnable(c, s2), 1);
  tandem_close(c);
}

TEST(FailOpen, RunnerCallsSucceedWithoutADaemon) {
  TempDir dir;
  auto o = options(dir.path().c_str());
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_runner_open(&o, &c), 0);
  std::uint64_t s = 0;
  tandem_session_hints hints{};
  hints.sz = sizeof hints;
  hints.priority_class = 2;
  hints.expected_rounds = 5;
  ASSERT_EQ(tandem_session_open(c, "runner-session", &hints, &s), 0);
  EXPECT_EQ(s, tandem_session_id("runner-session"));
  EXPECT_EQ(tandem_tool_begin(c, s, "pytest", 1, 1234), 0);
  tandem_tool_usage usage{};
  usage.sz = sizeof usage;
  usage.wall_ns = 1000;
  usage.cpu_ns = 500;
  usage.peak_memory_bytes = 4096;
  EXPECT_EQ(tandem_tool_end(c, s, "pytest", 1, -9, &usage), 0);
  EXPECT_EQ(tandem_session_close(c, s, TANDEM_CLOSE_CANCELLED), 0);
  EXPECT_EQ(get_stats(c).records_dropped, 4u);
  tandem_close(c);
}

// ---- argument and role checks -----------------------------------------------

TEST(Validation, OpenRejectsBadOptionsAndParams) {
  tandem_client* c = nullptr;
  auto p = engine_params();
  auto o = options("/nonexistent");
  EXPECT_EQ(tandem_engine_open(&o, &p, nullptr), -EINVAL);
  EXPECT_EQ(tandem_engine_open(&o, nullptr, &c), -EINVAL);
  auto bad = p;
  bad.block_size = 0;
  EXPECT_EQ(tandem_engine_open(&o, &bad, &c), -EINVAL);
  bad = p;
  bad.gpu_index = -2;
  EXPECT_EQ(tandem_engine_open(&o, &bad, &c), -EINVAL);
  bad = p;
  bad.sz = 8;
  EXPECT_EQ(tandem_engine_open(&o, &bad, &c), -EINVAL);
  auto bo = o;
  bo.reconnect_min_ms = 500;
  bo.reconnect_max_ms = 100;
  EXPECT_EQ(tandem_engine_open(&bo, &p, &c), -EINVAL);
  bo = o;
  bo.runtime_dir = "";
  EXPECT_EQ(tandem_runner_open(&bo, &c), -EINVAL);
  const std::string long_dir(200, 'x');
  bo.runtime_dir = long_dir.c_str();
  EXPECT_EQ(tandem_runner_open(&bo, &c), -EINVAL);
  bo = o;
  bo.name = "";
  EXPECT_EQ(tandem_runner_open(&bo, &c), -EINVAL);
  bo = o;
  bo.sz = 0;
  EXPECT_EQ(tandem_runner_open(&bo, &c), -EINVAL);
  EXPECT_EQ(c, nullptr) << "untouched on failure";
  // An old, shorter options struct: the fields it lacks take defaults.
  bo = o;
  bo.sz = offsetof(tandem_options, fallback_cap);
  ASSERT_EQ(tandem_runner_open(&bo, &c), 0);
  tandem_close(c);
}

TEST(Validation, CallsRejectBadArgumentsNamingTheField) {
  auto o = options("/nonexistent");
  auto p = engine_params();
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_engine_open(&o, &p, &c), 0);
  const std::uint64_t s = tandem_session_id("v");
  auto r = make_round(0);

  EXPECT_EQ(tandem_round_submit(nullptr, s, &r), -EINVAL);
  EXPECT_EQ(tandem_round_submit(c, 0, &r), -EINVAL);
  EXPECT_NE(std::strstr(tandem_last_error(c), "session"), nullptr) << tandem_last_error(c);
  EXPECT_EQ(tandem_round_submit(c, s, nullptr), -EINVAL);
  auto bad = make_round(0, 10, 11);
  EXPECT_EQ(tandem_round_submit(c, s, &bad), -EINVAL);
  EXPECT_NE(std::strstr(tandem_last_error(c), "cached_tokens"), nullptr) << tandem_last_error(c);
  bad = make_round(0, 0);
  EXPECT_EQ(tandem_round_submit(c, s, &bad), -EINVAL);
  EXPECT_NE(std::strstr(tandem_last_error(c), "prompt_tokens"), nullptr) << tandem_last_error(c);
  bad = make_round(0);
  bad.sz = 4;
  EXPECT_EQ(tandem_round_submit(c, s, &bad), -EINVAL);

  EXPECT_EQ(tandem_round_end(c, s, 0, 1, 1, 0), -ENOENT) << "no round in flight";
  EXPECT_EQ(tandem_round_first_token(c, s, 0, 1, 1), -ENOENT);
  ASSERT_EQ(tandem_round_submit(c, s, &r), 0);
  EXPECT_EQ(tandem_round_submit(c, s, &r), -EBUSY);
  EXPECT_EQ(tandem_round_end(c, s, 3, 1, 1, 0), -EINVAL) << "not the round in flight";
  EXPECT_NE(std::strstr(tandem_last_error(c), "round"), nullptr);
  EXPECT_EQ(tandem_round_end(c, s, 0, 1, 1, 0), 0);

  tandem_kv_stats kv{};
  kv.sz = sizeof kv;
  EXPECT_EQ(tandem_kv_stats_report(c, &kv), -EINVAL);
  EXPECT_NE(std::strstr(tandem_last_error(c), "blocks_total"), nullptr);
  kv.blocks_total = 10;
  kv.blocks_free = 11;
  EXPECT_EQ(tandem_kv_stats_report(c, &kv), -EINVAL);
  kv.blocks_free = 8;
  kv.blocks_pinned = 3;
  EXPECT_EQ(tandem_kv_stats_report(c, &kv), -EINVAL);
  EXPECT_EQ(tandem_kv_stats_report(c, nullptr), -EINVAL);
  EXPECT_EQ(tandem_kv_event(c, s, 0, 1, 0), -EINVAL);
  EXPECT_EQ(tandem_kv_event(c, s, 5, 1, 0), -EINVAL);
  EXPECT_NE(std::strstr(tandem_last_error(c), "kind"), nullptr);

  const std::uint64_t hashes[2] = {1, 2};
  auto kv_blocks_error = [&](auto mutate) {
    tandem_kv_blocks b{};
    b.sz = sizeof b;
    b.op = TANDEM_KV_BLOCKS_STORED;
    b.hashes = hashes;
    b.count = 2;
    b.block_size = 16;
    mutate(b);
    const int rc = tandem_kv_blocks_report(c, s, &b);
    return rc == 0 ? std::string("accepted") : std::string(tandem_last_error(c));
  };
  EXPECT_EQ(kv_blocks_error([](tandem_kv_blocks&) {}), "accepted");
  EXPECT_THAT(kv_blocks_error([](tandem_kv_blocks& b) { b.op = 3; }), HasSubstr("blocks->op 3"));
  EXPECT_THAT(kv_blocks_error([](tandem_kv_blocks& b) { b.medium = 2; }), HasSubstr("blocks->medium"));
  EXPECT_THAT(kv_blocks_error([](tandem_kv_blocks& b) { b.count = 0; }), HasSubstr("blocks->count 0"));
  EXPECT_THAT(kv_blocks_error([](tandem_kv_blocks& b) { b.count = TANDEM_KV_BLOCKS_MAX + 1; }),
              HasSubstr("blocks->count"));
  EXPECT_THAT(kv_blocks_error([](tandem_kv_blocks& b) { b.hashes = nullptr; }), HasSubstr("blocks->hashes"));
  EXPECT_THAT(kv_blocks_error([](tandem_kv_blocks& b) { b.block_size = 0; }), HasSubstr("blocks->block_size"));
  EXPECT_THAT(kv_blocks_error([](tandem_kv_blocks& b) { b.op = TANDEM_KV_BLOCKS_REMOVED; }),
              HasSubstr("block_size of a REMOVED"));
  EXPECT_THAT(kv_blocks_error([](tandem_kv_blocks& b) { b.parent_hash = 5; }), HasSubstr("without has_parent"));
  EXPECT_THAT(kv_blocks_error([](tandem_kv_blocks& b) { b.sz = 8; }), HasSubstr("blocks->sz"));
  EXPECT_EQ(tandem_kv_blocks_report(c, s, nullptr), -EINVAL);

  tandem_directive d[2];
  EXPECT_EQ(tandem_poll(c, -1, 2, d), -EINVAL);
  EXPECT_EQ(tandem_poll(c, 0, -1, d), -EINVAL);
  EXPECT_EQ(tandem_poll(c, 0, 2, nullptr), -EINVAL);
  EXPECT_EQ(tandem_poll(nullptr, 0, 0, nullptr), -EINVAL);
  EXPECT_EQ(tandem_session_runnable(c, 0), -EINVAL);
  EXPECT_EQ(tandem_session_priority(c, 0), -EINVAL);
  EXPECT_EQ(tandem_session_name(c, s, ""), -EINVAL);
  EXPECT_EQ(tandem_session_name(c, s, nullptr), -EINVAL);
  EXPECT_EQ(tandem_session_name(c, 0, "x"), -EINVAL);
  // The daemon's rule for names, applied here: 256 bytes of valid UTF-8
  // without control characters, and the name of the session it names.
  EXPECT_EQ(tandem_session_name(c, tandem_session_id("other"), "x"), -EINVAL);
  const std::string long_name(257, 'n');
  EXPECT_EQ(tandem_session_name(c, tandem_session_id(long_name.c_str()), long_name.c_str()), -ENAMETOOLONG);
  const std::string max_name(256, 'n');
  EXPECT_EQ(tandem_session_name(c, tandem_session_id(max_name.c_str()), max_name.c_str()), 0);
  EXPECT_EQ(tandem_session_name(c, tandem_session_id("agent-\xff\xfe"), "agent-\xff\xfe"), -EINVAL);
  EXPECT_EQ(tandem_session_name(c, tandem_session_id("x\n<0>pwned"), "x\n<0>pwned"), -EINVAL);
  EXPECT_NE(std::string(tandem_last_error(c)).find("control"), std::string::npos) << tandem_last_error(c);
  tandem_client_stats st{};
  EXPECT_EQ(tandem_get_stats(c, &st), -EINVAL) << "sz 0";
  EXPECT_EQ(tandem_get_stats(c, nullptr), -EINVAL);
  EXPECT_EQ(tandem_session_id(nullptr), 0u);
  EXPECT_EQ(tandem_session_id("x"), base::session_id("x"));
  EXPECT_EQ(tandem_tool_kind("pytest"), base::tool_kind_id("pytest"));
  tandem_close(c);

  tandem_client* runner = nullptr;
  ASSERT_EQ(tandem_runner_open(&o, &runner), 0);
  std::uint64_t id = 0;
  EXPECT_EQ(tandem_session_open(runner, "", nullptr, &id), -EINVAL);
  EXPECT_EQ(tandem_session_open(runner, "x", nullptr, nullptr), -EINVAL);
  tandem_session_hints hints{};
  hints.sz = sizeof hints;
  hints.priority_class = 4;
  EXPECT_EQ(tandem_session_open(runner, "x", &hints, &id), -EINVAL);
  EXPECT_NE(std::strstr(tandem_last_error(runner), "priority_class"), nullptr);
  EXPECT_EQ(id, 0u) << "untouched on failure";
  ASSERT_EQ(tandem_session_open(runner, "x", nullptr, &id), 0);
  EXPECT_EQ(tandem_session_open(runner, "x", nullptr, &id), -EEXIST);
  EXPECT_EQ(tandem_session_close(runner, id, 7), -EINVAL);
  EXPECT_EQ(tandem_tool_begin(runner, id, "", 1, 0), -EINVAL);
  EXPECT_EQ(tandem_tool_begin(runner, id, "sh", 1, -5), -EINVAL);
  EXPECT_EQ(tandem_tool_end(runner, id, "sh", 1, 0, nullptr), -ENOENT) << "never begun";
  ASSERT_EQ(tandem_tool_begin(runner, id, "sh", 1, 0), 0);
  EXPECT_EQ(tandem_tool_begin(runner, id, "sh", 1, 0), -EEXIST);
  EXPECT_EQ(tandem_tool_end(runner, id, "sh", 1, 300, nullptr), -EINVAL);
  EXPECT_EQ(tandem_tool_end(runner, id, "other", 1, 0, nullptr), -EINVAL);
  EXPECT_EQ(tandem_tool_end(runner, id, "sh", 1, 0, nullptr), 0);
  EXPECT_EQ(tandem_tool_begin(runner, tandem_session_id("not-open"), "sh", 2, 0), -ENOENT);
  EXPECT_EQ(tandem_session_close(runner, id, TANDEM_CLOSE_ERROR), 0);
  EXPECT_EQ(tandem_session_close(runner, id, TANDEM_CLOSE_ERROR), -ENOENT);
  tandem_close(runner);
}

TEST(Validation, RoleChecks) {
  auto o = options("/nonexistent");
  auto p = engine_params();
  tandem_client* engine = nullptr;
  tandem_client* runner = nullptr;
  ASSERT_EQ(tandem_engine_open(&o, &p, &engine), 0);
  ASSERT_EQ(tandem_runner_open(&o, &runner), 0);
  std::uint64_t id = 0;
  EXPECT_EQ(tandem_session_open(engine, "x", nullptr, &id), -EPERM);
  EXPECT_NE(std::strstr(tandem_last_error(engine), "runner"), nullptr);
  EXPECT_EQ(tandem_session_close(engine, 1, 0), -EPERM);
  EXPECT_EQ(tandem_tool_begin(engine, 1, "sh", 1, 0), -EPERM);
  EXPECT_EQ(tandem_tool_end(engine, 1, "sh", 1, 0, nullptr), -EPERM);
  auto r = make_round(0);
  EXPECT_EQ(tandem_round_submit(runner, 1, &r), -EPERM);
  EXPECT_NE(std::strstr(tandem_last_error(runner), "engine"), nullptr);
  EXPECT_EQ(tandem_round_first_token(runner, 1, 0, 0, 0), -EPERM);
  EXPECT_EQ(tandem_round_end(runner, 1, 0, 0, 0, 0), -EPERM);
  tandem_kv_stats kv{};
  kv.sz = sizeof kv;
  kv.blocks_total = 10;
  kv.blocks_free = 5;
  EXPECT_EQ(tandem_kv_stats_report(runner, &kv), -EPERM);
  EXPECT_EQ(tandem_kv_event(runner, 1, TANDEM_KV_DROPPED, 1, 0), -EPERM);
  tandem_step_input in{};
  in.sz = sizeof in;
  tandem_step_plan plan{};
  plan.sz = sizeof plan;
  EXPECT_EQ(tandem_engine_plan_step(runner, &in, &plan), -EPERM);
  tandem_round_end_info info{};
  info.sz = sizeof info;
  info.session = 1;
  int decision = -1;
  std::int64_t until = -1;
  EXPECT_EQ(tandem_engine_keep_decision(runner, &info, &decision, &until), -EPERM);
  EXPECT_STREQ(tandem_engine_policy(runner), "");
  EXPECT_STREQ(tandem_engine_policy(engine), "fcfs");
  // Either role: names, polls, runnable, priority.
  EXPECT_EQ(tandem_session_name(runner, tandem_session_id("five"), "five"), 0);
  EXPECT_EQ(tandem_session_runnable(runner, 5), 1);
  EXPECT_EQ(tandem_session_priority(runner, 5), 0);
  EXPECT_EQ(tandem_poll(runner, 0, 0, nullptr), 0);
  tandem_close(engine);
  tandem_close(runner);
}

// ---- in-process step planning ---------------------------------------------------

tandem_step_request request(std::uint64_t id, std::uint32_t phase, std::uint32_t prompt, std::uint32_t computed,
                            std::uint32_t blocks) {
  tandem_step_request r{};
  r.id = id;
  r.session = 100 + id;
  r.phase = phase;
  r.prompt_tokens = prompt;
  r.computed_tokens = computed;
  r.blocks_held = blocks;
  r.arrival_ns = static_cast<std::int64_t>(id) * 1000;
  return r;
}

struct PlanBuffers {
  explicit PlanBuffers(std::size_t n) : run(n), preempt(n), unpin(n + 1), swap(n) {
    plan.sz = sizeof plan;
    plan.run = run.data();
    plan.preempt = preempt.data();
    plan.unpin = unpin.data();
    plan.swap = swap.data();
  }
  std::vector<tandem_chunk> run;
  std::vector<std::uint32_t> preempt;
  std::vector<std::uint64_t> unpin;
  std::vector<std::uint32_t> swap;
  tandem_step_plan plan{};
};

TEST(PlanStep, FcfsSchedulesRunningThenWaitingWithChunkedPrefill) {
  auto o = options("/nonexistent");
  auto p = engine_params();
  Client c;
  ASSERT_EQ(Client::open_engine(&o, p, c), 0);
  // r0 decodes; r1's prompt fits whole; r2 gets what is left of the budget
  // (chunked prefill); r3 finds the budget spent.
  const tandem_step_request reqs[] = {
      request(0, TANDEM_REQ_RUNNING, 50, 50, 4), request(1, TANDEM_REQ_WAITING, 60, 0, 0),
      request(2, TANDEM_REQ_WAITING, 80, 0, 0), request(3, TANDEM_REQ_PREEMPTED, 30, 0, 0)};
  tandem_step_input in{};
  in.sz = sizeof in;
  in.token_budget = 100;
  in.max_seqs = 8;
  in.block_size = 16;
  in.free_blocks = 100;
  in.requests = reqs;
  in.n_requests = 4;
  in.now_ns = 1'000'000;
  PlanBuffers out(4);
  ASSERT_EQ(c.plan_step(in, out.plan), 0) << c.last_error();
  ASSERT_EQ(out.plan.n_run, 3u);
  EXPECT_EQ(out.run[0].request, 0u);
  EXPECT_EQ(out.run[0].tokens, 1u);
  EXPECT_EQ(out.run[1].request, 1u);
  EXPECT_EQ(out.run[1].tokens, 60u);
  EXPECT_EQ(out.run[2].request, 2u);
  EXPECT_EQ(out.run[2].tokens, 39u);
  EXPECT_EQ(out.plan.n_preempt, 0u);
  EXPECT_EQ(out.plan.n_unpin, 0u);

  // Head-of-line blocking: the first waiting request that does not fit stops
  // admission, even if a later one would fit.
  const tandem_step_request hol[] = {request(0, TANDEM_REQ_WAITING, 64, 0, 0),
                                     request(1, TANDEM_REQ_WAITING, 16, 0, 0)};
  in.requests = hol;
  in.n_requests = 2;
  in.free_blocks = 2;  // 64 tokens need 4 blocks
  PlanBuffers out2(2);
  ASSERT_EQ(c.plan_step(in, out2.plan), 0);
  EXPECT_EQ(out2.plan.n_run, 0u);
}

TEST(PlanStep, FcfsPreemptsTheNewestRunningRequest) {
  auto o = options("/nonexistent");
  auto p = engine_params();
  Client c;
  ASSERT_EQ(Client::open_engine(&o, p, c), 0);
  // r0 has 32 tokens in 2 full blocks and needs a third for its next token;
  // nothing is free, so r1 (the newest running) is preempted and nothing
  // waiting is admitted in a step that preempted.
  const tandem_step_request reqs[] = {request(0, TANDEM_REQ_RUNNING, 32, 32, 2),
                                      request(1, TANDEM_REQ_RUNNING, 32, 32, 2),
                                      request(2, TANDEM_REQ_WAITING, 8, 0, 0)};
  tandem_step_input in{};
  in.sz = sizeof in;
  in.token_budget = 100;
  in.max_seqs = 8;
  in.block_size = 16;
  in.free_blocks = 0;
  in.requests = reqs;
  in.n_requests = 3;
  PlanBuffers out(3);
  ASSERT_EQ(c.plan_step(in, out.plan), 0);
  ASSERT_EQ(out.plan.n_run, 1u);
  EXPECT_EQ(out.run[0].request, 0u);
  EXPECT_EQ(out.run[0].tokens, 1u);
  ASSERT_EQ(out.plan.n_preempt, 1u);
  EXPECT_EQ(out.preempt[0], 1u);

  // fcfs releases KV to the prefix cache at every round end.
  tandem_round_end_info info{};
  info.sz = sizeof info;
  info.session = 7;
  info.tool_follows = 1;
  info.tool_kind = tandem_tool_kind("pytest");
  info.context_tokens = 1000;
  info.blocks = 63;
  info.now_ns = 5;
  int decision = -1;
  std::int64_t until = -1;
  ASSERT_EQ(c.keep_decision(info, decision, until), 0);
  EXPECT_EQ(decision, TANDEM_KEEP_RELEASE);
  EXPECT_EQ(until, 0);
}

TEST(PlanStep, RejectsBadInput) {
  auto o = options("/nonexistent");
  auto p = engine_params();
  Client c;
  ASSERT_EQ(Client::open_engine(&o, p, c), 0);
  tandem_step_request reqs[] = {request(0, TANDEM_REQ_WAITING, 10, 0, 0)};
  tandem_step_input in{};
  in.sz = sizeof in;
  in.token_budget = 100;
  in.max_seqs = 8;
  in.block_size = 16;
  in.free_blocks = 10;
  in.n_requests = 1;
  PlanBuffers out(1);
  out.plan.n_run = 99;
  EXPECT_EQ(c.plan_step(in, out.plan), -EINVAL) << "NULL requests";
  EXPECT_NE(std::strstr(c.last_error(), "requests"), nullptr);
  in.requests = reqs;
  reqs[0].phase = 3;
  EXPECT_EQ(c.plan_step(in, out.plan), -EINVAL);
  EXPECT_NE(std::strstr(c.last_error(), "phase"), nullptr);
  reqs[0].phase = TANDEM_REQ_WAITING;
  reqs[0].priority = 8;
  EXPECT_EQ(c.plan_step(in, out.plan), -EINVAL);
  reqs[0].priority = 0;
  in.block_size = 0;
  EXPECT_EQ(c.plan_step(in, out.plan), -EINVAL);
  in.block_size = 16;
  in.n_pinned = 1;
  EXPECT_EQ(c.plan_step(in, out.plan), -EINVAL) << "NULL pinned";
  in.n_pinned = 0;
  auto bad_plan = out.plan;
  bad_plan.run = nullptr;
  EXPECT_EQ(c.plan_step(in, bad_plan), -EINVAL);
  EXPECT_EQ(out.plan.n_run, 99u) << "untouched on failure";
  ASSERT_EQ(c.plan_step(in, out.plan), 0);
  EXPECT_EQ(out.plan.n_run, 1u);
}

// ---- against a fake daemon ----------------------------------------------------------

TEST(FakeDaemon, HandshakeRecordsAndResync) {
  TempDir dir;
  FakeDaemon daemon(dir.path());
  auto o = options(dir.path().c_str());
  auto p = engine_params();
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_engine_open(&o, &p, &c), 0);
  // Before the Welcome: fail-open, and the record is dropped.
  const std::uint64_t early = tandem_session_id("early");
  auto r0 = make_round(3, 500, 100);
  ASSERT_EQ(tandem_round_submit(c, early, &r0), 0);
  ASSERT_EQ(tandem_session_name(c, early, "early"), 0);
  EXPECT_EQ(get_stats(c).records_dropped, 1u);

  ASSERT_NO_FATAL_FAILURE(connect(c, daemon, 7));
  EXPECT_EQ(daemon.hello_role, wire::Role::Engine);
  EXPECT_EQ(daemon.hello_name, "test-client");
  EXPECT_EQ(daemon.hello_pid, ::getpid());
  EXPECT_EQ(daemon.hello_block_size, 16u);
  EXPECT_EQ(tandem_client_id(c), 7u);

  // The resync after Welcome carries the session submitted while away.
  auto snap = daemon.resync();
  ASSERT_TRUE(snap.has_value());
  ASSERT_EQ(snap->size(), 1u);
  const Snap& e = snap->at(early);
  EXPECT_EQ(e.state, kWaiting);
  EXPECT_EQ(e.round, 3u);
  EXPECT_EQ(e.name, "early");
  EXPECT_EQ(get_stats(c).resyncs, 1u);
  EXPECT_EQ(tandem_session_runnable(c, early), 0) << "connected: waits for ADMIT";

  // Records arrive on the event ring with the right fields.
  const std::uint64_t s = tandem_session_id("s");
  const std::int64_t t0 = now_ns();
  auto r = make_round(0, 300, 200);
  ASSERT_EQ(tandem_round_submit(c, s, &r), 0);
  ASSERT_EQ(tandem_round_first_token(c, s, 0, 11, 22), 0);
  ASSERT_EQ(tandem_round_end(c, s, 0, 40, 21, 1), 0);
  // Member by member, not positionally: a field appended to the struct
  // needs no change here (docs/contributing.md "Adding a field to a record").
  tandem_kv_stats kv{};
  kv.sz = sizeof kv;
  kv.blocks_total = 4096;
  kv.blocks_free = 1000;
  kv.blocks_pinned = 10;
  kv.blocks_offloaded = 5;
  kv.running_seqs = 3;
  kv.waiting_seqs = 2;
  kv.step_tokens = 256;
  kv.step_time_us = 900;
  ASSERT_EQ(tandem_kv_stats_report(c, &kv), 0);
  ASSERT_EQ(tandem_kv_event(c, s, TANDEM_KV_OFFLOADED, 21, 0), 0);
  const std::int64_t t1 = now_ns();
  auto events = daemon.events();
  ASSERT_EQ(events.size(), 5u);
  for (const auto& ev : events) {
    EXPECT_GE(ev.timestamp_ns(), t0);
    EXPECT_LE(ev.timestamp_ns(), t1);
  }
  ASSERT_EQ(events[0].type(), ipc::RecordType::kRoundSubmit);
  auto submit = events[0].as<ipc::RoundSubmit>();
  EXPECT_EQ(submit.header.session, s);
  EXPECT_EQ(submit.prompt_tokens, 300u);
  EXPECT_EQ(submit.cached_tokens, 200u);
  EXPECT_EQ(submit.projected_blocks, 8u);
  EXPECT_EQ(submit.max_output_tokens, 256u);
  ASSERT_EQ(events[1].type(), ipc::RecordType::kRoundFirstToken);
  EXPECT_EQ(events[1].as<ipc::RoundFirstToken>().queue_delay_ns, 11u);
  EXPECT_EQ(events[1].as<ipc::RoundFirstToken>().prefill_ns, 22u);
  ASSERT_EQ(events[2].type(), ipc::RecordType::kRoundEnd);
  auto end = events[2].as<ipc::RoundEnd>();
  EXPECT_EQ(end.output_tokens, 40u);
  EXPECT_EQ(end.blocks_held, 21u);
  EXPECT_EQ(end.header.flags & ipc::kRoundEndToolFollows, ipc::kRoundEndToolFollows);
  ASSERT_EQ(events[3].type(), ipc::RecordType::kKvStats);
  EXPECT_EQ(events[3].session(), 0u);
  EXPECT_EQ(events[3].as<ipc::KvStats>().blocks_total, 4096u);
  EXPECT_EQ(events[3].as<ipc::KvStats>().step_time_us, 900u);
  ASSERT_EQ(events[4].type(), ipc::RecordType::kKvEvent);
  EXPECT_EQ(events[4].as<ipc::KvEvent>().kind, static_cast<std::uint8_t>(ipc::KvEventKind::kOffloaded));
  EXPECT_EQ(events[4].as<ipc::KvEvent>().blocks, 21u);
  EXPECT_EQ(get_stats(c).records_sent, 5u);

  // Block hashes: split into records of 3, each continuing the chain.
  const std::uint64_t hashes[7] = {11, 12, 13, 14, 15, 16, 17};
  tandem_kv_blocks kb{};
  kb.sz = sizeof kb;
  kb.op = TANDEM_KV_BLOCKS_STORED;
  kb.medium = TANDEM_KV_MEDIUM_CPU;
  kb.hashes = hashes;
  kb.count = 7;
  kb.block_size = 16;
  kb.parent_hash = 10;
  kb.has_parent = 1;
  ASSERT_EQ(tandem_kv_blocks_report(c, s, &kb), 0);
  kb.op = TANDEM_KV_BLOCKS_REMOVED;
  kb.medium = TANDEM_KV_MEDIUM_GPU;
  kb.count = 2;
  kb.block_size = 0;
  kb.parent_hash = 0;
  kb.has_parent = 0;
  ASSERT_EQ(tandem_kv_blocks_report(c, s, &kb), 0);
  auto blocks = daemon.events();
  ASSERT_EQ(blocks.size(), 4u);
  const std::uint64_t parents[3] = {10, 13, 16};
  const std::uint8_t counts[3] = {3, 3, 1};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(blocks[i].type(), ipc::RecordType::kKvBlocks);
    const auto b = blocks[i].as<ipc::KvBlocks>();
    EXPECT_EQ(b.header.session, s);
    EXPECT_EQ(b.op, static_cast<std::uint8_t>(ipc::KvBlocksOp::kStored));
    EXPECT_EQ(b.medium, static_cast<std::uint8_t>(ipc::KvMedium::kCpu));
    EXPECT_EQ(b.header.flags, ipc::kKvBlocksHasParent);
    EXPECT_EQ(b.parent, parents[i]) << i;
    EXPECT_EQ(b.count, counts[i]) << i;
    EXPECT_EQ(b.hashes[0], hashes[3 * i]) << i;
    EXPECT_EQ(b.block_size, 16u);
  }
  const auto removed = blocks[3].as<ipc::KvBlocks>();
  EXPECT_EQ(removed.op, static_cast<std::uint8_t>(ipc::KvBlocksOp::kRemoved));
  EXPECT_EQ(removed.header.flags, 0);
  EXPECT_EQ(removed.count, 2u);
  EXPECT_EQ(removed.hashes[1], 12u);

  // A ResyncRequest gets a fresh snapshot: s is acting with its KV offloaded.
  daemon.send(ipc::build_resync_request("test"));
  ASSERT_TRUE(pump_until(c, [&] { return get_stats(c).resyncs == 2; }));
  snap = daemon.resync();
  ASSERT_TRUE(snap.has_value());
  ASSERT_EQ(snap->size(), 2u);
  EXPECT_EQ(snap->at(s).state, kActing);
  EXPECT_EQ(snap->at(s).blocks_held, 21u);
  EXPECT_EQ(snap->at(s).residency, 3u);  // sched::Residency::kOffloaded
  tandem_close(c);
}

TEST(FakeDaemon, DirectivesChangeRunnableAndPriority) {
  TempDir dir;
  FakeDaemon daemon(dir.path());
  auto o = options(dir.path().c_str());
  auto p = engine_params();
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_engine_open(&o, &p, &c), 0);
  ASSERT_NO_FATAL_FAILURE(connect(c, daemon, 7));
  ASSERT_TRUE(daemon.resync().has_value());

  const std::uint64_t s = tandem_session_id("s");
  auto r = make_round(0);
  ASSERT_EQ(tandem_round_submit(c, s, &r), 0);
  EXPECT_EQ(tandem_session_runnable(c, s), 0);

  tandem_directive d[8];
  daemon.push(ipc::Admit{}, s);
  ASSERT_EQ(tandem_poll(c, 1000, 8, d), 1);
  EXPECT_EQ(d[0].type, static_cast<std::uint32_t>(TANDEM_DIR_ADMIT));
  EXPECT_EQ(d[0].session, s);
  EXPECT_EQ(tandem_session_runnable(c, s), 1);

  ipc::Priority prio;
  prio.level = 3;
  daemon.push(prio, s);
  daemon.push(ipc::Pause{}, s);
  ASSERT_EQ(tandem_poll(c, 1000, 8, d), 2);
  EXPECT_EQ(d[0].type, static_cast<std::uint32_t>(TANDEM_DIR_PRIORITY));
  EXPECT_EQ(d[0].value, 3);
  EXPECT_EQ(d[1].type, static_cast<std::uint32_t>(TANDEM_DIR_PAUSE));
  EXPECT_EQ(tandem_session_priority(c, s), 3);
  EXPECT_EQ(tandem_session_runnable(c, s), 0);

  ipc::Restore elsewhere;
  elsewhere.engine = 9;
  daemon.push(elsewhere, s);
  ASSERT_EQ(tandem_poll(c, 1000, 8, d), 1);
  EXPECT_EQ(d[0].value, 9);
  EXPECT_EQ(tandem_session_runnable(c, s), 0) << "restored on another engine";
  ipc::Restore here;
  here.engine = 7;
  daemon.push(here, s);
  ASSERT_EQ(tandem_poll(c, 1000, 8, d), 1);
  EXPECT_EQ(tandem_session_runnable(c, s), 1) << "restored here";

  // Bad records are counted and skipped: an event type on the directive
  // ring, and a priority out of range. The good one behind them arrives.
  daemon.push(ipc::RoundSubmit{}, s);
  ipc::Priority bad;
  bad.level = 200;
  daemon.push(bad, s);
  ipc::Pin pin;
  pin.until_ns = 123456789;
  daemon.push(pin, s);
  ASSERT_EQ(tandem_poll(c, 1000, 8, d), 1);
  EXPECT_EQ(d[0].type, static_cast<std::uint32_t>(TANDEM_DIR_PIN));
  EXPECT_EQ(d[0].value, 123456789);
  EXPECT_EQ(get_stats(c).directives, 6u);

  // More directives than `max`: the rest wait for the next poll, already
  // applied.
  const std::uint64_t s2 = tandem_session_id("s2");
  ASSERT_EQ(tandem_round_submit(c, s2, &r), 0);
  daemon.push(ipc::Unpin{}, s);
  daemon.push(ipc::Admit{}, s2);
  ASSERT_EQ(tandem_poll(c, 0, 1, d), 1);
  EXPECT_EQ(d[0].type, static_cast<std::uint32_t>(TANDEM_DIR_UNPIN));
  EXPECT_EQ(tandem_session_runnable(c, s2), 1);
  ASSERT_EQ(tandem_poll(c, 0, 1, d), 1);
  EXPECT_EQ(d[0].type, static_cast<std::uint32_t>(TANDEM_DIR_ADMIT));
  tandem_close(c);
}

TEST(FakeDaemon, PollSleepsOnTheDoorbellAndWakesForADirective) {
  TempDir dir;
  FakeDaemon daemon(dir.path());
  auto o = options(dir.path().c_str());
  auto p = engine_params();
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_engine_open(&o, &p, &c), 0);
  ASSERT_NO_FATAL_FAILURE(connect(c, daemon, 7));
  ASSERT_TRUE(daemon.resync().has_value());
  const std::uint64_t s = tandem_session_id("s");

  // Nothing to get: the full timeout passes.
  auto t0 = steady_clock::now();
  tandem_directive d[2];
  EXPECT_EQ(tandem_poll(c, 50, 2, d), 0);
  EXPECT_GE(steady_clock::now() - t0, milliseconds(45));

  // A directive pushed while the client sleeps wakes it long before the
  // timeout (the daemon's push rings the doorbell the client armed).
  std::thread pusher([&] {
    std::this_thread::sleep_for(milliseconds(100));
    daemon.push(ipc::Admit{}, s);
  });
  t0 = steady_clock::now();
  const int n = tandem_poll(c, 5000, 2, d);
  const auto waited = steady_clock::now() - t0;
  pusher.join();
  EXPECT_EQ(n, 1);
  EXPECT_LT(waited, milliseconds(4000));
  tandem_close(c);
}

TEST(FakeDaemon, DaemonDeathFailsOpenThenReconnectsAndResyncs) {
  TempDir dir;
  auto daemon = std::make_unique<FakeDaemon>(dir.path());
  auto o = options(dir.path().c_str(), 1, 20, 100);
  auto p = engine_params();
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_engine_open(&o, &p, &c), 0);
  ASSERT_NO_FATAL_FAILURE(connect(c, *daemon, 7));
  ASSERT_TRUE(daemon->resync().has_value());

  const std::uint64_t a = tandem_session_id("a"), b = tandem_session_id("b"), d = tandem_session_id("d");
  for (std::uint64_t s : {a, b, d}) {
    auto r = make_round(1);
    ASSERT_EQ(tandem_round_submit(c, s, &r), 0);
  }
  daemon->push(ipc::Admit{}, a);
  tandem_directive dirs[4];
  ASSERT_EQ(tandem_poll(c, 1000, 4, dirs), 1);
  EXPECT_EQ(tandem_session_runnable(c, a), 1);
  EXPECT_EQ(tandem_session_runnable(c, b), 0);

  // The daemon dies: the client notices in tandem_poll and runs fail-open.
  daemon->stop();
  ASSERT_TRUE(pump_until(c, [&] { return tandem_connected(c) == 0; }));
  EXPECT_EQ(get_stats(c).disconnects, 1u);
  EXPECT_EQ(tandem_session_runnable(c, a), 1) << "admitted before the daemon went away";
  EXPECT_EQ(tandem_session_runnable(c, b), 1) << "the one local slot";
  EXPECT_EQ(tandem_session_runnable(c, d), 0) << "beyond fallback_cap";
  const auto dropped = get_stats(c).records_dropped;
  ASSERT_EQ(tandem_round_first_token(c, a, 1, 1, 1), 0);
  EXPECT_EQ(get_stats(c).records_dropped, dropped + 1);

  // A new daemon at the same path: the client reconnects within the backoff
  // (≤ 100 ms here) and resyncs the same sessions; b keeps running.
  daemon.reset();  // (its destructor unlinks the path)
  daemon = std::make_unique<FakeDaemon>(dir.path());
  ASSERT_NO_FATAL_FAILURE(connect(c, *daemon, 8));
  EXPECT_EQ(tandem_client_id(c), 8u);
  auto snap = daemon->resync();
  ASSERT_TRUE(snap.has_value());
  ASSERT_EQ(snap->size(), 3u);
  EXPECT_EQ(snap->at(a).state, kReasoning);
  EXPECT_EQ(snap->at(a).round, 1u);
  EXPECT_EQ(snap->at(b).state, kReasoning) << "ran on a slot: reported admitted";
  EXPECT_EQ(snap->at(d).state, kWaiting);
  EXPECT_EQ(tandem_session_runnable(c, a), 1);
  EXPECT_EQ(tandem_session_runnable(c, b), 1);
  EXPECT_EQ(tandem_session_runnable(c, d), 0);
  auto stats = get_stats(c);
  EXPECT_EQ(stats.connects, 2u);
  EXPECT_EQ(stats.resyncs, 2u);
  tandem_close(c);
}

TEST(FakeDaemon, ErrorMessageDropsTheConnectionAndTheClientRetries) {
  TempDir dir;
  FakeDaemon daemon(dir.path());
  auto o = options(dir.path().c_str(), 0, 20, 40);
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_runner_open(&o, &c), 0);
  ASSERT_TRUE(pump_until(c, [&] { return daemon.accept(0); }));
  ASSERT_TRUE(daemon.recv().has_value());  // Hello
  daemon.send(ipc::build_error(EACCES, "role not granted"));
  // The client gives up on this connection and comes back after the backoff.
  ASSERT_TRUE(pump_until(c, [&] { return daemon.accept(0); })) << "no second attempt";
  EXPECT_EQ(tandem_connected(c), 0);
  daemon.handshake(3);
  ASSERT_TRUE(pump_until(c, [&] { return tandem_connected(c) == 1; }));
  EXPECT_EQ(get_stats(c).connects, 1u);
  EXPECT_EQ(get_stats(c).disconnects, 0u) << "never welcomed before";
  tandem_close(c);
}

// After the Welcome, an Error answers one request: counted, the session it
// names marked refused, and the connection kept — only a fatal one (or the
// daemon closing) ends it. The daemon's limits from its Welcome are applied
// here, without a round trip.
TEST(FakeDaemon, AnErrorAfterTheWelcomeIsNotADisconnect) {
  TempDir dir;
  FakeDaemon daemon(dir.path());
  daemon.welcome_sessions = 2;
  auto o = options(dir.path().c_str(), 0, 20, 40);
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_runner_open(&o, &c), 0);
  ASSERT_NO_FATAL_FAILURE(connect(c, daemon, 5));
  std::uint64_t s1 = 0, s2 = 0, s3 = 0;
  ASSERT_EQ(tandem_session_open(c, "one", nullptr, &s1), 0);
  ASSERT_EQ(tandem_session_open(c, "two", nullptr, &s2), 0);
  EXPECT_EQ(tandem_session_open(c, "three", nullptr, &s3), -ENOSPC);
  EXPECT_NE(std::string(tandem_last_error(c)).find("limits.sessions_per_client"), std::string::npos);
  EXPECT_EQ(tandem_session_open(c, std::string(300, 'x').c_str(), nullptr, &s3), -ENAMETOOLONG);
  EXPECT_EQ(tandem_session_open(c, "agent-\xff\xfe", nullptr, &s3), -EINVAL);
  daemon.send(ipc::build_error(ENOSPC, "session refused: limits.sessions_per_client", s2));
  daemon.send(ipc::build_error(EINVAL, "SessionName: bad"));
  for (int i = 0; i < 20; ++i) (void)tandem_poll(c, 5, 0, nullptr);
  EXPECT_EQ(tandem_connected(c), 1);
  auto st = get_stats(c);
  EXPECT_EQ(st.connects, 1u);
  EXPECT_EQ(st.disconnects, 0u);
  EXPECT_EQ(st.daemon_errors, 2u);
  EXPECT_EQ(st.sessions_refused, 1u);
  // The refused session's tools are refused with the daemon's errno.
  const char* argv[] = {"/bin/true", nullptr};
  std::int32_t pid = 0;
  EXPECT_EQ(tandem_tool_spawn(c, s2, "t", argv, nullptr, nullptr, nullptr, &pid), -ENOSPC);
  // A fatal Error is the end of the connection.
  daemon.send(ipc::build_error(EPROTO, "protocol violation", 0, /*fatal=*/true));
  for (int i = 0; i < 20 && tandem_connected(c) == 1; ++i) (void)tandem_poll(c, 5, 0, nullptr);
  EXPECT_EQ(tandem_connected(c), 0);
  EXPECT_EQ(get_stats(c).disconnects, 1u);
  tandem_close(c);
}

TEST(FakeDaemon, NoWelcomeWithinASecondCountsAsFailure) {
  TempDir dir;
  FakeDaemon daemon(dir.path());
  auto o = options(dir.path().c_str(), 0, 20, 40);
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_runner_open(&o, &c), 0);
  ASSERT_TRUE(pump_until(c, [&] { return daemon.accept(0); }));
  const auto t0 = steady_clock::now();
  // The daemon never answers; the client must try again after ~1 s.
  ASSERT_TRUE(pump_until(
      c, [&] { return daemon.accept(0); }, milliseconds(5000)));
  EXPECT_GE(steady_clock::now() - t0, milliseconds(900));
  tandem_close(c);
}

TEST(FakeDaemon, RunnerResyncListsOpenSessionsAndTools) {
  TempDir dir;
  auto o = options(dir.path().c_str(), 0, 20, 40);
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_runner_open(&o, &c), 0);
  std::uint64_t s1 = 0, s2 = 0, s3 = 0;
  ASSERT_EQ(tandem_session_open(c, "one", nullptr, &s1), 0);
  ASSERT_EQ(tandem_session_open(c, "two", nullptr, &s2), 0);
  ASSERT_EQ(tandem_session_open(c, "three", nullptr, &s3), 0);
  ASSERT_EQ(tandem_tool_begin(c, s2, "pytest", 4, 0), 0);
  ASSERT_EQ(tandem_session_close(c, s3, TANDEM_CLOSE_NORMAL), 0);

  FakeDaemon daemon(dir.path());  // the daemon starts late
  ASSERT_NO_FATAL_FAILURE(connect(c, daemon, 5));
  EXPECT_EQ(daemon.hello_role, wire::Role::Runner);
  auto snap = daemon.resync();
  ASSERT_TRUE(snap.has_value());
  ASSERT_EQ(snap->size(), 2u);
  EXPECT_EQ(snap->at(s1).state, kReasoning);
  EXPECT_FALSE(snap->at(s1).in_tool);
  EXPECT_EQ(snap->at(s1).name, "one");
  EXPECT_EQ(snap->at(s2).state, kActing);
  EXPECT_TRUE(snap->at(s2).in_tool);
  EXPECT_EQ(snap->at(s2).tool_kind, tandem_tool_kind("pytest"));

  // Connected: a session opened now is named over the socket and its
  // records go on the ring.
  std::uint64_t s4 = 0;
  ASSERT_EQ(tandem_session_open(c, "four", nullptr, &s4), 0);
  auto m = daemon.recv();
  ASSERT_TRUE(m.has_value());
  const wire::SessionName* name = m->message()->payload_as_SessionName();
  ASSERT_NE(name, nullptr);
  EXPECT_EQ(name->session(), s4);
  EXPECT_EQ(name->name()->str(), "four");
  ASSERT_EQ(tandem_tool_end(c, s2, "pytest", 4, 1, nullptr), 0);
  auto events = daemon.events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type(), ipc::RecordType::kSessionOpen);
  ASSERT_EQ(events[1].type(), ipc::RecordType::kToolEnd);
  EXPECT_EQ(events[1].as<ipc::ToolEnd>().tool_call, 4u);
  EXPECT_EQ(events[1].as<ipc::ToolEnd>().exit_code, 1);
  EXPECT_EQ(events[1].as<ipc::ToolEnd>().tool_kind, tandem_tool_kind("pytest"));
  tandem_close(c);
}

TEST(FakeDaemon, LargeResyncIsSplitInBatches) {
  TempDir dir;
  auto o = options(dir.path().c_str(), 0, 20, 40);
  auto p = engine_params();
  tandem_client* c = nullptr;
  ASSERT_EQ(tandem_engine_open(&o, &p, &c), 0);
  constexpr int kSessions = 600;
  for (int i = 0; i < kSessions; ++i) {
    auto r = make_round(0);
    ASSERT_EQ(tandem_round_submit(c, tandem_session_id(("s" + std::to_string(i)).c_str()), &r), 0);
  }
  FakeDaemon daemon(dir.path());
  ASSERT_NO_FATAL_FAILURE(connect(c, daemon, 5));
  auto snap = daemon.resync();
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->size(), static_cast<std::size_t>(kSessions));
  EXPECT_EQ(daemon.resync_messages, 3) << "256 + 256 + 88";
  tandem_close(c);
}

// An engine (the C++ wrapper) connected to a FakeDaemon whose Welcome names
// a policy: the set-up of the step-scheduler tests below.
struct EngineOnFakeDaemon : ::testing::Test {
  void open(const char* policy) {
    auto o = options(dir.path().c_str());
    auto p = engine_params();
    ASSERT_EQ(Client::open_engine(&o, p, c), 0);
    ASSERT_NO_FATAL_FAILURE(connect(c.get(), daemon, 7, policy));
    ASSERT_STREQ(c.policy(), policy) << c.last_error();
  }
  // Plans one step with `r` alone waiting, on a pool with room (1,000 free
  // blocks, a 4,096-token budget): the tokens of its first chunk, 0 if none.
  std::uint32_t plan_alone(const tandem_step_request& r, std::int64_t now_ns = 0) {
    tandem_step_input in{};
    in.sz = sizeof in;
    in.token_budget = 4096;
    in.max_seqs = 8;
    in.block_size = 16;
    in.free_blocks = 1000;
    in.requests = &r;
    in.n_requests = 1;
    in.now_ns = now_ns;
    PlanBuffers out(1);
    EXPECT_EQ(c.plan_step(in, out.plan), 0) << c.last_error();
    return out.plan.n_run == 1 ? out.run[0].tokens : 0u;
  }
  TempDir dir;
  FakeDaemon daemon{dir.path()};
  Client c;  // closed first: declared last
};

// A policy that preempts by swapping (autellix's default) reaches the
// engine's swap array; a caller built against the first, shorter
// tandem_step_plan, or with no swap array, gets those preemptions as
// recomputes. None may be lost: a running request left without the blocks
// its step needs stalls the engine (a live replay under tandem did).
TEST_F(EngineOnFakeDaemon, SwapPreemptionsReachTheEngineWhateverItsPlanStruct) {
  ASSERT_NO_FATAL_FAILURE(open("autellix"));
  // r0 needs a third block for its next token and none is free: one of the
  // two running requests is preempted.
  const tandem_step_request reqs[] = {request(0, TANDEM_REQ_RUNNING, 32, 32, 2),
                                      request(1, TANDEM_REQ_RUNNING, 48, 48, 3)};
  tandem_step_input in{};
  in.sz = sizeof in;
  in.token_budget = 100;
  in.max_seqs = 8;
  in.block_size = 16;
  in.free_blocks = 0;
  in.requests = reqs;
  in.n_requests = 2;

  PlanBuffers full(2);
  ASSERT_EQ(c.plan_step(in, full.plan), 0) << c.last_error();
  EXPECT_EQ(full.plan.n_preempt, 0u);
  ASSERT_EQ(full.plan.n_swap, 1u);
  const std::uint32_t victim = full.swap[0];
  ASSERT_EQ(full.plan.n_run, 1u);
  EXPECT_NE(full.run[0].request, victim);

  PlanBuffers old(2);
  old.plan.sz = offsetof(tandem_step_plan, swap);
  old.plan.n_swap = 77;  // past the caller's sz: never written
  ASSERT_EQ(c.plan_step(in, old.plan), 0) << c.last_error();
  ASSERT_EQ(old.plan.n_preempt, 1u);
  EXPECT_EQ(old.preempt[0], victim);
  EXPECT_EQ(old.plan.n_swap, 77u);

  PlanBuffers no_array(2);
  no_array.plan.swap = nullptr;
  ASSERT_EQ(c.plan_step(in, no_array.plan), 0) << c.last_error();
  ASSERT_EQ(no_array.plan.n_preempt, 1u);
  EXPECT_EQ(no_array.preempt[0], victim);
  EXPECT_EQ(no_array.plan.n_swap, 0u);

  PlanBuffers too_short(2);
  too_short.plan.sz = offsetof(tandem_step_plan, n_unpin);
  EXPECT_EQ(c.plan_step(in, too_short.plan), -EINVAL);
  EXPECT_NE(std::strstr(c.last_error(), "ret_plan->sz"), nullptr);
}

TEST_F(EngineOnFakeDaemon, PolicyConfigSwitchesThePolicyAndBadOnesAreIgnored) {
  ASSERT_NO_FATAL_FAILURE(open("mars"));
  daemon.send_policy("no-such-policy", {}, {});
  daemon.send_policy("fcfs", {"no_such_param"}, {1.0});
  daemon.send(ipc::build_resync_request("marker"));  // a marker: processed after the two above
  ASSERT_TRUE(pump_until(c.get(), [&] {
    tandem_client_stats s{};
    c.stats(s);
    return s.resyncs == 2;
  }));
  EXPECT_STREQ(c.policy(), "mars") << "configs that fail to build are ignored";
  daemon.send_policy("fcfs", {}, {});
  ASSERT_TRUE(pump_until(c.get(), [&] { return std::strcmp(c.policy(), "fcfs") == 0; }));

  // The wrapper moves ownership.
  Client moved(std::move(c));
  EXPECT_FALSE(static_cast<bool>(c));  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_TRUE(moved.connected());
  Client& alias = moved;
  moved = std::move(alias);  // self-move keeps the handle
  EXPECT_TRUE(moved.connected());
}

// A CLOSE directive ends the session in the step scheduler too, so what a
// policy keeps per session (here Autellix's program service) lives as long
// as the session: without it an engine's scheduler state grows with every
// session it ever ran. A round in flight when CLOSE comes ends it when the
// round ends.
TEST_F(EngineOnFakeDaemon, ACloseDirectiveEndsTheSessionInTheStepScheduler) {
  ASSERT_NO_FATAL_FAILURE(open("autellix"));

  // The first chunk of a new request: Q0's 2048 tokens while its session has
  // had under q1_service (2048) tokens, Q1's 1024 after.
  std::uint64_t next_id = 1;
  auto first_chunk = [&](std::uint64_t session) {
    tandem_step_request r = request(next_id++, TANDEM_REQ_WAITING, 3000, 0, 0);
    r.session = session;
    return plan_alone(r);
  };
  auto close = [&](std::uint64_t session) {
    const std::uint64_t before = get_stats(c.get()).directives;
    daemon.push(ipc::Close{}, session);
    return pump_until(c.get(), [&] { return get_stats(c.get()).directives == before + 1; });
  };

  const std::uint64_t s = tandem_session_id("s");
  EXPECT_EQ(first_chunk(s), 2048u);
  EXPECT_EQ(first_chunk(s), 1024u) << "the session's service so far demotes its next request";
  ASSERT_TRUE(close(s));
  EXPECT_EQ(first_chunk(s), 2048u) << "CLOSE forgot the session's service";

  // CLOSE while the session's round is in flight: the scheduler forgets it
  // once the round has ended, not before.
  const std::uint64_t t = tandem_session_id("t");
  auto round = make_round(0);
  ASSERT_EQ(tandem_round_submit(c.get(), t, &round), 0);
  EXPECT_EQ(first_chunk(t), 2048u);
  ASSERT_TRUE(close(t));
  EXPECT_EQ(first_chunk(t), 1024u) << "the round runs on: its service is still counted";
  ASSERT_EQ(tandem_round_end(c.get(), t, 0, 10, 0, 0), 0) << c.last_error();
  EXPECT_EQ(first_chunk(t), 2048u) << "the round ended: the closed session is forgotten";
}

// An engine never sees a tool run, yet Continuum, InferCept and tandem learn
// from tool durations. The coordinator measures one as the MARS repo does:
// from the round's end to the arrival of the session's next request. Here
// Continuum pins a round's KV only while its tool kind's mean duration is at
// most 2 s; a kind never seen is pinned.
TEST_F(EngineOnFakeDaemon, ToolDurationsReachTheStepSchedulerFromTheNextRequestsArrival) {
  ASSERT_NO_FATAL_FAILURE(open("continuum"));
  constexpr std::int64_t kSecond = 1'000'000'000;
  std::uint64_t next_id = 1;
  auto keep = [&](std::uint64_t session, const char* tool, std::int64_t now_ns) {
    tandem_round_end_info info{};
    info.sz = sizeof info;
    info.session = session;
    info.tool_follows = 1;
    info.tool_kind = tandem_tool_kind(tool);
    info.context_tokens = 1000;
    info.blocks = 63;
    info.now_ns = now_ns;
    int decision = -1;
    std::int64_t until = -1;
    EXPECT_EQ(c.keep_decision(info, decision, until), 0) << c.last_error();
    return decision;
  };
  // One step that lists a waiting request of `session` that arrived at `arrival_ns`.
  auto step = [&](std::uint64_t session, std::int64_t arrival_ns, std::int64_t now_ns) {
    tandem_step_request r = request(next_id++, TANDEM_REQ_WAITING, 100, 0, 0);
    r.session = session;
    r.arrival_ns = arrival_ns;
    plan_alone(r, now_ns);
  };

  const std::uint64_t s = tandem_session_id("s");
  EXPECT_EQ(keep(s, "pytest", 1 * kSecond), TANDEM_KEEP_PIN) << "pytest was never seen";
  step(s, kSecond / 2, kSecond + 1);  // the ended round's own request, not yet retired: no duration
  EXPECT_EQ(keep(tandem_session_id("t"), "pytest", 2 * kSecond), TANDEM_KEEP_PIN);
  step(s, 6 * kSecond, 6 * kSecond);  // s's next round: its pytest took 5 s
  EXPECT_EQ(keep(tandem_session_id("u"), "pytest", 7 * kSecond), TANDEM_KEEP_RELEASE)
      << "pytest's mean is 5 s, above Continuum's 2 s";
  step(s, 9 * kSecond, 9 * kSecond);  // no tool of s in flight: nothing to measure

  // A session closed while its tool runs is forgotten with it: a request
  // under the same id later measures nothing.
  const std::uint64_t v = tandem_session_id("v");
  EXPECT_EQ(keep(v, "grep", 10 * kSecond), TANDEM_KEEP_PIN) << "grep was never seen";
  const std::uint64_t before = get_stats(c.get()).directives;
  daemon.push(ipc::Close{}, v);
  ASSERT_TRUE(pump_until(c.get(), [&] { return get_stats(c.get()).directives == before + 1; }));
  step(v, 30 * kSecond, 30 * kSecond);
  EXPECT_EQ(keep(tandem_session_id("w"), "grep", 31 * kSecond), TANDEM_KEEP_PIN) << "grep is still unseen";
}

// tandem_gpu.hpp on the simulated device, against no daemon: the RAII types
// (move-over-live closes the old handle, self-move keeps it, failed opens
// leave `ret` alone) and every call through them.
TEST(CxxWrapper, GpuPoolStreamerAndEngineRecords) {
  auto o = options("/nonexistent");
  auto p = engine_params();
  Client c;
  ASSERT_EQ(Client::open_engine(&o, p, c), 0);
  tandem_gpu_options go{};
  go.sz = sizeof go;
  go.backend = "sim";
  Gpu gpu;
  ASSERT_EQ(Gpu::open(c, &go, gpu), 0) << Gpu::open_error();
  ASSERT_TRUE(static_cast<bool>(gpu));
  EXPECT_STREQ(gpu.backend(), "sim");
  EXPECT_STREQ(gpu.last_error(), "");

  // A failed open names the problem and leaves `ret` as it was.
  tandem_gpu* const before = gpu.get();
  EXPECT_EQ(Gpu::open(c, &go, gpu), -EBUSY);
  EXPECT_EQ(gpu.get(), before);
  EXPECT_STREQ(Gpu::open_error(), "tandem_gpu_open: client already has an open tandem_gpu (one pool per engine)");
  EXPECT_STREQ(c.last_error(), Gpu::open_error());

  std::uint32_t decode = 9;
  ASSERT_EQ(gpu.stage("decode", decode), 0);
  EXPECT_EQ(decode, 1u);
  EXPECT_EQ(gpu.stage("vision", decode), -ENOENT);
  EXPECT_EQ(decode, 1u);
  EXPECT_STREQ(gpu.last_error(), "tandem_gpu_stage: no stage 'vision' in the pool");
  tandem_gpu_info info{};
  ASSERT_EQ(gpu.info(info), 0);
  EXPECT_EQ(info.sz, sizeof info);
  EXPECT_EQ(info.n_partitions, 7u);
  EXPECT_EQ(info.active_partition, 6u);
  std::uint32_t sms = 0;
  ASSERT_EQ(gpu.partition_sms(0, decode, sms), 0);
  EXPECT_EQ(sms, 16u);
  void* stream = nullptr;
  ASSERT_EQ(gpu.stream(decode, stream), 0);
  EXPECT_NE(stream, nullptr);
  std::uint32_t active = 0;
  ASSERT_EQ(gpu.begin_pass(&active), 0);
  EXPECT_EQ(active, 6u) << "no daemon: the partition stays";
  EXPECT_EQ(gpu.set_partition(7), -ERANGE);
  ASSERT_EQ(gpu.set_partition(1), 0);
  ASSERT_EQ(gpu.begin_pass(), 0);
  void* switched = nullptr;
  ASSERT_EQ(gpu.stream(decode, switched), 0);
  EXPECT_NE(switched, stream);
  void* context = nullptr;
  ASSERT_EQ(gpu.context(decode, context), 0);
  EXPECT_NE(context, nullptr);
  EXPECT_EQ(gpu.context(9, context), -EINVAL);

  // The streamer: a pass over 4 layers with 2 slots.
  std::vector<std::vector<unsigned char>> layers(4, std::vector<unsigned char>(256, 7));
  std::vector<const void*> host;
  host.reserve(layers.size());
  for (const auto& l : layers) host.push_back(l.data());
  tandem_streamer_options so{};
  so.sz = sizeof so;
  so.layers = 4;
  so.slots = 2;
  so.layer_bytes = 256;
  so.layer_compute_us = 50;
  LayerStreamer streamer;
  ASSERT_EQ(LayerStreamer::create(gpu, so, host.data(), streamer), 0) << gpu.last_error();
  for (std::uint32_t i = 0; i < 4; ++i) {
    std::uint64_t ptr = 0;
    ASSERT_EQ(streamer.acquire(i, switched, ptr), 0) << gpu.last_error();
    EXPECT_NE(ptr, 0u);
    ASSERT_EQ(streamer.release(i, switched), 0) << gpu.last_error();
  }
  std::uint64_t untouched = 5;
  EXPECT_EQ(streamer.acquire(1, switched, untouched), -EINVAL);
  EXPECT_EQ(untouched, 5u);
  EXPECT_NE(std::string(gpu.last_error()).find("out of order"), std::string::npos) << gpu.last_error();
  tandem_streamer_info si{};
  ASSERT_EQ(streamer.info(si), 0);
  EXPECT_EQ(si.device_bytes, 2u * 256);
  EXPECT_EQ(si.next_layer, 0u);
  auto bad = so;
  bad.slots = 4;
  tandem_layer_streamer* const live = streamer.get();
  EXPECT_EQ(LayerStreamer::create(gpu, bad, host.data(), streamer), -EINVAL);
  EXPECT_EQ(streamer.get(), live);
  // Move, self-move, move-over-live (destroys the old streamer).
  LayerStreamer moved(std::move(streamer));
  EXPECT_FALSE(static_cast<bool>(streamer));  // NOLINT(bugprone-use-after-move): checking the moved-from state
  LayerStreamer& self = moved;
  moved = std::move(self);
  ASSERT_EQ(moved.info(si), 0);
  LayerStreamer other;
  ASSERT_EQ(LayerStreamer::create(gpu, so, host.data(), other), 0);
  moved = std::move(other);
  ASSERT_EQ(moved.info(si), 0);
  EXPECT_EQ(si.next_layer, 0u);
  moved = LayerStreamer();  // destroys it, before the pool goes
  EXPECT_FALSE(static_cast<bool>(moved));

  // Engine records through the Client.
  const tandem_profile_row rows[] = {{16, 0, 0.02, 50.0}, {32, 0, 0.01, 80.0}};
  EXPECT_EQ(gpu_profile(c, TANDEM_GPU_STAGE_DECODE, rows), 0) << c.last_error();
  EXPECT_EQ(gpu_profile(c, TANDEM_GPU_STAGE_DECODE, std::span<const tandem_profile_row>()), -EINVAL);
  EXPECT_STREQ(c.last_error(), "tandem_gpu_profile: rows is NULL");
  tandem_weight_module_info m{};
  m.sz = sizeof m;
  m.index = 2;
  m.slots = 2;
  m.layers = 4;
  m.layer_compute_us = 50;
  m.bytes = 1024;
  m.name = "experts";
  EXPECT_EQ(weight_module(c, m), 0) << c.last_error();
  m.index = 64;
  EXPECT_EQ(weight_module(c, m), -EINVAL);
  EXPECT_STREQ(c.last_error(), "tandem_weight_module: module->index 64 is not below 64");
  std::uint64_t plan = 1, freed = 1;
  ASSERT_EQ(offload_plan(c, plan, freed), 0);
  EXPECT_EQ(plan, 0u);
  EXPECT_EQ(freed, 0u);

  // Gpu: move, self-move, move-over-live (closes the old pool, so the engine
  // may open another).
  Gpu moved_gpu(std::move(gpu));
  EXPECT_FALSE(static_cast<bool>(gpu));  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_STREQ(gpu.last_error(), "");
  Gpu& self_gpu = moved_gpu;
  moved_gpu = std::move(self_gpu);
  ASSERT_EQ(moved_gpu.info(info), 0);
  EXPECT_EQ(info.active_partition, 1u);
  Gpu plain;
  ASSERT_EQ(Gpu::open(nullptr, &go, plain), 0) << Gpu::open_error();
  moved_gpu = std::move(plain);
  ASSERT_EQ(moved_gpu.info(info), 0);
  EXPECT_EQ(info.active_partition, 6u) << "the pool that was moved in";
  Gpu again;
  EXPECT_EQ(Gpu::open(c, &go, again), 0) << "the engine's pool was closed by the move";
}

}  // namespace
}  // namespace tandem
