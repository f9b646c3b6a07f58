// The whole node: a session alone takes T_ideal; every policy completes a
// contended workload with the model's books balanced; runs are deterministic.
#include "sim/node.h"

#include <gtest/gtest.h>

#include <cmath>

#include "sched/registry.h"
#include "tests/sim/fixtures.h"

namespace tandem::sim {
namespace {

using fixtures::config;
using fixtures::session;

TEST(Node, ASessionAloneTakesItsIdealTime) {
  Workload w;
  w.sessions.push_back(session("alone", 0, 20000, 6, 0.5, 1));
  for (const char* policy : {"fcfs", "mars", "tandem"}) {
    SimConfig c = config(policy);
    auto ideal = ideal_times(w, c);
    auto r = simulate(w, c, ideal);
    ASSERT_TRUE(r) << r.error().context();
    ASSERT_EQ(r->sessions.size(), 1u);
    const double e2e = r->sessions[0].finish_s - r->sessions[0].arrival_s;
    // T_ideal is vLLM's own step order alone on the node; other step halves
    // may chunk differently (MARS's MLFQ quanta), never faster.
    if (std::string_view(policy) == "fcfs") {
      EXPECT_NEAR(e2e, ideal[0], 1e-5);
    } else {
      EXPECT_GE(e2e, ideal[0] - 1e-5) << policy;
      EXPECT_LE(e2e, ideal[0] * 1.02) << policy;
    }
    EXPECT_EQ(r->counters.preemptions, 0u);
  }
}

TEST(Node, ToolStartPhaseIsInsideTheCallUnlessExtra) {
  // Alone on the node a tool is never contended, so a start phase inside the
  // call's time leaves T_ideal as it is, and one on top adds its length to
  // every call (the session has 5 tool calls: 6 rounds, the last without).
  Workload w;
  w.sessions.push_back(session("alone", 0, 20000, 6, 0.5, 1));
  SimConfig c = config("fcfs");
  const auto ideal = ideal_times(w, c);
  c.tool_start_s = 0.02;
  auto inside = simulate(w, c, ideal);
  ASSERT_TRUE(inside) << inside.error().context();
  EXPECT_NEAR(inside->sessions[0].finish_s - inside->sessions[0].arrival_s, ideal[0], 1e-5);
  c.tool_start_extra = true;
  auto extra = simulate(w, c, ideal);
  ASSERT_TRUE(extra) << extra.error().context();
  EXPECT_NEAR(extra->sessions[0].finish_s - extra->sessions[0].arrival_s, ideal[0] + 5 * 0.02, 1e-5);
  // A start on top of the call is not part of its run: uncontended, every
  // call's run is its nominal time (stretch 1), as the live replay times it.
  ASSERT_EQ(extra->tool_calls.size(), 5u);
  for (const ToolCallRecord& t : extra->tool_calls) EXPECT_NEAR(t.wall_s, t.nominal_s, 1e-6);
  // Inside the call, the start is part of it: the call still takes its time.
  for (const ToolCallRecord& t : inside->tool_calls) EXPECT_NEAR(t.wall_s, t.nominal_s, 1e-6);
}

// A small pool (8B model, 6,000 blocks per engine) under 40 overlapping
// sessions: KV runs short, so preemption, eviction and admission control all act.
Workload contended() {
  Workload w;
  w.name = "contended";
  for (int i = 0; i < 40; ++i) {
    w.sessions.push_back(session("s" + std::to_string(i), i * 0.5, 4000 + (i % 5) * 3000, 4 + i % 4, 0.3, i));
  }
  return w;
}

class EveryPolicy : public ::testing::TestWithParam<std::string_view> {};

TEST_P(EveryPolicy, CompletesAContendedWorkloadWithBalancedBooks) {
  Workload w = contended();
  SimConfig c = config(std::string(GetParam()));
  c.preset.gpu_blocks = 6000;
  c.preset.max_model_len = 32000;
  auto ideal = ideal_times(w, c);
  auto r = simulate(w, c, ideal);
  ASSERT_TRUE(r) << r.error().context();
  EXPECT_EQ(r->violations, 0u) << r->first_violation;
  EXPECT_EQ(r->rejected_events, 0u);
  ASSERT_EQ(r->sessions.size(), w.sessions.size());
  for (std::size_t i = 0; i < w.sessions.size(); ++i) {
    const SessionRecord& s = r->sessions[i];
    EXPECT_EQ(s.rounds, w.sessions[i].rounds.size());
    EXPECT_EQ(s.ttft_s.size(), s.rounds);
    // Nobody beats being alone on the node (within ns rounding per step).
    EXPECT_GE(s.finish_s - s.arrival_s, s.ideal_s - 1e-5) << i;
  }
  const RunCounters& k = r->counters;
  EXPECT_EQ(k.computed_tokens, k.new_tokens + k.recomputed_tokens);
  EXPECT_LE(k.reused_tokens, k.prompt_tokens);
  std::uint64_t prompts = 0;
  for (const SessionSpec& s : w.sessions) {
    for (const RoundSpec& rs : s.rounds) prompts += rs.input_tokens;
  }
  EXPECT_EQ(k.prompt_tokens, prompts);
  EXPECT_GT(k.gpu_busy_s, 0.0);

  // Same input, same output.
  auto again = simulate(w, c, ideal);
  ASSERT_TRUE(again);
  ASSERT_EQ(again->sessions.size(), r->sessions.size());
  for (std::size_t i = 0; i < r->sessions.size(); ++i) {
    EXPECT_EQ(again->sessions[i].finish_s, r->sessions[i].finish_s);
  }
  EXPECT_EQ(again->counters.recomputed_tokens, k.recomputed_tokens);
}

std::vector<std::string_view> policy_names() {
  std::vector<std::string_view> names;
  for (const sched::PolicyEntry& e : sched::policy_registry()) names.push_back(e.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Sim, EveryPolicy, ::testing::ValuesIn(policy_names()),
                         [](const auto& param_info) { return std::string(param_info.param); });

TEST(Node, ContendedToolsStretch) {
  Workload w;
  for (int i = 0; i < 8; ++i) {
    SessionSpec s;
    s.name = "cpu" + std::to_string(i);
    s.rounds = {{1000, 10, "pytest", 2.0, false}, {1500, 10, "", 0.0, false}};
    w.sessions.push_back(s);
  }
  SimConfig c = config("fcfs");
  c.tool_cores = 2;  // 8 one-core tools on 2 cores: ≈4× stretch
  auto r = simulate(w, c, ideal_times(w, c));
  ASSERT_TRUE(r) << r.error().context();
  EXPECT_NEAR(r->counters.tool_stretch_sum / r->counters.tool_stretch_calls, 4.0, 0.2);
}

TEST(Node, UnknownPolicyIsAnError) {
  Workload w = contended();
  SimConfig c = config("lottery");
  auto r = simulate(w, c, ideal_times(w, c));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().context().find("lottery"), std::string::npos);
}

TEST(Node, BadParameterIsAnError) {
  Workload w = contended();
  SimConfig c = config("mars");
  c.params["window_max"] = -3;
  EXPECT_FALSE(simulate(w, c, ideal_times(w, c)));
}

}  // namespace
}  // namespace tandem::sim
