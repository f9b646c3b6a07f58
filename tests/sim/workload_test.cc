// Workloads: the trace parser on good and hostile lines and on the real dev
// trace, the synthetic generators' determinism and shapes, make_workload's
// draw, arrivals and capping, and the tool CPU table.
#include "sim/workload.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/stats.h"

namespace tandem::sim {
namespace {

// data/traces/agentic_dev.jsonl, in the repository: its tests never skip.
std::filesystem::path dev_trace_path() { return TANDEM_DEV_TRACE; }

// The q-quantile of `v` (base::percentile).
template <class T>
double quantile(const std::vector<T>& v, double q) {
  const std::vector<double> d(v.begin(), v.end());
  return base::percentile(d, q * 100.0);
}

std::vector<SessionSpec> pool_of(std::string_view name, std::size_t count, std::uint64_t seed) {
  auto pool = synthetic_pool(name, count, seed);
  EXPECT_TRUE(pool.has_value()) << pool.error().message();
  return pool ? *pool : std::vector<SessionSpec>{};
}

bool same_sessions(const std::vector<SessionSpec>& a, const std::vector<SessionSpec>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].arrival_s != b[i].arrival_s || a[i].rounds.size() != b[i].rounds.size()) {
      return false;
    }
    for (std::size_t k = 0; k < a[i].rounds.size(); ++k) {
      const RoundSpec& x = a[i].rounds[k];
      const RoundSpec& y = b[i].rounds[k];
      if (x.input_tokens != y.input_tokens || x.output_tokens != y.output_tokens || x.tool != y.tool ||
          x.tool_seconds != y.tool_seconds || x.capped != y.capped) {
        return false;
      }
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// Trace parsing

TEST(ParseTrace, ReadsRoundsOfGoodLines) {
  std::string text =
      R"({"id":"s1","source":"x","rounds":[{"input_tokens":100,"output_tokens":20,"tool":"pytest","tool_seconds":1.5,"llm_seconds":3},)"
      R"({"input_tokens":130,"output_tokens":0,"tool":null}]})"
      "\n\n  \r\n"
      R"({"id":"s2","rounds":[{"input_tokens":7,"output_tokens":3,"tool":"Read","tool_seconds":2},)"
      R"({"input_tokens":9,"output_tokens":4}]})"
      "\r\n";
  TraceStats stats;
  auto sessions = parse_trace(text, "t.jsonl", &stats);
  ASSERT_TRUE(sessions.has_value()) << sessions.error().message();
  ASSERT_EQ(sessions->size(), 2u);

  const SessionSpec& s1 = (*sessions)[0];
  EXPECT_EQ(s1.name, "s1");
  EXPECT_EQ(s1.source, "x");
  EXPECT_EQ((*sessions)[1].source, "") << "no source field";
  ASSERT_EQ(s1.rounds.size(), 2u);
  EXPECT_EQ(s1.rounds[0].input_tokens, 100u);
  EXPECT_EQ(s1.rounds[0].output_tokens, 20u);
  EXPECT_EQ(s1.rounds[0].tool, "pytest");
  EXPECT_DOUBLE_EQ(s1.rounds[0].tool_seconds, 1.5);
  EXPECT_FALSE(s1.rounds[0].capped);
  EXPECT_EQ(s1.rounds[1].input_tokens, 130u);
  EXPECT_EQ(s1.rounds[1].output_tokens, 1u) << "0 generated tokens becomes 1";
  EXPECT_EQ(s1.rounds[1].tool, "");

  const SessionSpec& s2 = (*sessions)[1];
  EXPECT_EQ(s2.name, "s2");
  ASSERT_EQ(s2.rounds.size(), 2u);
  EXPECT_DOUBLE_EQ(s2.rounds[0].tool_seconds, 2.0) << "an integer tool_seconds is a number too";
  EXPECT_EQ(s2.rounds[1].tool, "") << "an absent tool is a final answer";
  EXPECT_EQ(s2.rounds[1].tool_seconds, 0.0);

  EXPECT_EQ(stats.sessions, 2u);
  EXPECT_EQ(stats.rounds, 4u);
  EXPECT_EQ(stats.dropped_rounds, 0u);
}

TEST(FilterBySource, KeepsPrefixesAndDropsExclusions) {
  std::vector<SessionSpec> pool(4);
  pool[0].source = "swecontextbench/claude-code/sonnet-4.5";
  pool[1].source = "agentcgroup/claude-code/haiku-3.5";
  pool[2].source = "agentcgroup/claude-code/glm-4.7-flash-local";
  pool[3].source = "terminal-bench/mini-swe-agent/sonnet-4";
  for (std::size_t i = 0; i < pool.size(); ++i) pool[i].name = std::to_string(i);
  auto names = [](const std::vector<SessionSpec>& v) {
    std::string out;
    for (const SessionSpec& s : v) out += s.name;
    return out;
  };
  const std::vector<std::string> none;
  const std::vector<std::string> swe = {"swecontextbench"};
  const std::vector<std::string> agent = {"agentcgroup", "terminal-bench"};
  const std::vector<std::string> glm = {"agentcgroup/claude-code/glm"};
  EXPECT_EQ(names(filter_by_source(pool, swe, none)), "0");
  EXPECT_EQ(names(filter_by_source(pool, none, swe)), "123") << "the complement, in pool order";
  EXPECT_EQ(names(filter_by_source(pool, agent, glm)), "13");
  EXPECT_EQ(names(filter_by_source(pool, none, none)), "0123");
}

TEST(ParseTrace, ANonStringSourceIsAnError) {
  auto r = parse_trace(R"({"id":"a","source":3,"rounds":[{"input_tokens":5,"output_tokens":1}]})", "t.jsonl");
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("(field source)"), std::string::npos) << r.error().message();
}

TEST(ParseTrace, SessionWithoutIdIsNamedByOriginAndLine) {
  auto sessions = parse_trace("\n{\"rounds\":[{\"input_tokens\":5,\"output_tokens\":1}]}\n", "t.jsonl");
  ASSERT_TRUE(sessions.has_value()) << sessions.error().message();
  ASSERT_EQ(sessions->size(), 1u);
  EXPECT_EQ((*sessions)[0].name, "t.jsonl:2");
}

TEST(ParseTrace, ClearsTheToolOfTheLastRound) {
  // The trace was cut after a tool call: nothing follows it, so it never runs.
  auto sessions =
      parse_trace(R"({"id":"a","rounds":[{"input_tokens":10,"output_tokens":2,"tool":"git","tool_seconds":0.3},)"
                  R"({"input_tokens":20,"output_tokens":2,"tool":"pip","tool_seconds":40}]})",
                  "t.jsonl");
  ASSERT_TRUE(sessions.has_value()) << sessions.error().message();
  const auto& rounds = (*sessions)[0].rounds;
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[0].tool, "git");
  EXPECT_DOUBLE_EQ(rounds[0].tool_seconds, 0.3);
  EXPECT_EQ(rounds[1].tool, "");
  EXPECT_EQ(rounds[1].tool_seconds, 0.0);
}

TEST(ParseTrace, NullToolMidSessionEndsItAndCountsDroppedRounds) {
  std::string text = R"({"id":"a","rounds":[{"input_tokens":10,"output_tokens":2,"tool":"ls","tool_seconds":0.1},)"
                     R"({"input_tokens":20,"output_tokens":2,"tool":null,"tool_seconds":5},)"
                     R"({"input_tokens":30,"output_tokens":2,"tool":"git","tool_seconds":0.1},)"
                     R"({"input_tokens":40,"output_tokens":2}]})"
                     "\n"
                     R"({"id":"b","rounds":[{"input_tokens":10,"output_tokens":2,"tool":"","tool_seconds":1},)"
                     R"({"input_tokens":20,"output_tokens":2}]})";
  TraceStats stats;
  auto sessions = parse_trace(text, "t.jsonl", &stats);
  ASSERT_TRUE(sessions.has_value()) << sessions.error().message();
  ASSERT_EQ(sessions->size(), 2u);
  ASSERT_EQ((*sessions)[0].rounds.size(), 2u);
  EXPECT_EQ((*sessions)[0].rounds[1].tool, "");
  EXPECT_EQ((*sessions)[0].rounds[1].tool_seconds, 0.0) << "a final answer has no tool time";
  ASSERT_EQ((*sessions)[1].rounds.size(), 1u) << "an empty tool name is a final answer too";
  EXPECT_EQ((*sessions)[1].rounds[0].tool_seconds, 0.0);
  EXPECT_EQ(stats.sessions, 2u);
  EXPECT_EQ(stats.rounds, 3u);
  EXPECT_EQ(stats.dropped_rounds, 3u);
}

TEST(ParseTrace, EveryMalformedLineNamesTheLineAndField) {
  const std::string good = R"({"id":"ok","rounds":[{"input_tokens":10,"output_tokens":2}]})";
  const std::string r0 = R"({"id":"x","rounds":[)";
  const std::string ok_round = R"({"input_tokens":10,"output_tokens":2,"tool":"ls"},)";
  struct Case {
    std::string line;
    std::string want;  // substring of the error after "t.jsonl:2: "
  };
  const std::vector<Case> cases = {
      {"not json", "not valid JSON"},
      {R"({"rounds":[{"input_tokens":10,"output_tokens":2}])", "not valid JSON"},  // truncated
      {R"({"rounds":[{"input_tokens":10,"output_tokens":2}]} trailing)", "not valid JSON"},
      {R"({"rounds":[{"input_tokens":10,"output_tokens":2,"tool_seconds":1e999}]})", "not valid JSON"},
      {"{\"rounds\":[{\"input_tokens\":10,\"output_tokens\":2,\"tool\":\"\xff\xfe\"}]}", "not valid JSON"},
      {"[1,2]", "not a JSON object"},
      {R"("text")", "not a JSON object"},
      {R"({"id":5,"rounds":[{"input_tokens":10,"output_tokens":2}]})", "(field id)"},
      {R"({"id":"x"})", "missing (field rounds)"},
      {R"({"rounds":{}})", "not an array (field rounds)"},
      {R"({"rounds":null})", "not an array (field rounds)"},
      {R"({"rounds":[]})", "empty array (field rounds)"},
      {r0 + "5]}", "not an object (field rounds[0])"},
      {r0 + ok_round + "[]]}", "not an object (field rounds[1])"},
      {r0 + R"({"output_tokens":2}]})", "missing (field rounds[0].input_tokens)"},
      {r0 + R"({"input_tokens":"12","output_tokens":2}]})", "(field rounds[0].input_tokens)"},
      {r0 + R"({"input_tokens":1.5,"output_tokens":2}]})", "(field rounds[0].input_tokens)"},
      {r0 + R"({"input_tokens":1e30,"output_tokens":2}]})", "(field rounds[0].input_tokens)"},
      {r0 + R"({"input_tokens":0,"output_tokens":2}]})", "(field rounds[0].input_tokens)"},
      {r0 + R"({"input_tokens":-5,"output_tokens":2}]})", "(field rounds[0].input_tokens)"},
      {r0 + R"({"input_tokens":2147483648,"output_tokens":2}]})", "(field rounds[0].input_tokens)"},
      {r0 + R"({"input_tokens":18446744073709551615,"output_tokens":2}]})", "(field rounds[0].input_tokens)"},
      {r0 + R"({"input_tokens":-9223372036854775808,"output_tokens":2}]})", "(field rounds[0].input_tokens)"},
      {r0 + R"({"input_tokens":99999999999999999999999999,"output_tokens":2}]})", "(field rounds[0].input_tokens)"},
      {r0 + ok_round + R"({"input_tokens":10}]})", "missing (field rounds[1].output_tokens)"},
      {r0 + ok_round + R"({"input_tokens":10,"output_tokens":-1}]})", "(field rounds[1].output_tokens)"},
      {r0 + ok_round + R"({"input_tokens":10,"output_tokens":true}]})", "(field rounds[1].output_tokens)"},
      {r0 + ok_round + R"({"input_tokens":10,"output_tokens":4294967296}]})", "(field rounds[1].output_tokens)"},
      {r0 + R"({"input_tokens":10,"output_tokens":2,"tool":7}]})", "(field rounds[0].tool)"},
      {r0 + R"({"input_tokens":10,"output_tokens":2,"tool":["ls"]}]})", "(field rounds[0].tool)"},
      {r0 + R"({"input_tokens":10,"output_tokens":2,"tool":"ls","tool_seconds":"1"}]})",
       "(field rounds[0].tool_seconds)"},
      {r0 + R"({"input_tokens":10,"output_tokens":2,"tool":"ls","tool_seconds":null}]})",
       "(field rounds[0].tool_seconds)"},
      {r0 + R"({"input_tokens":10,"output_tokens":2,"tool":"ls","tool_seconds":-0.5}]})",
       "(field rounds[0].tool_seconds)"},
      {r0 + R"({"input_tokens":10,"output_tokens":2,"tool":"ls","tool_seconds":1e300}]})",
       "(field rounds[0].tool_seconds)"},
      // A round a mid-session final answer would drop is still checked.
      {r0 + R"({"input_tokens":10,"output_tokens":2},{"input_tokens":-1,"output_tokens":2}]})",
       "(field rounds[1].input_tokens)"},
  };
  for (const Case& c : cases) {
    TraceStats stats{7, 8, 9};
    std::string text = good;
    text.append("\n").append(c.line).append("\n").append(good).append("\n");
    auto r = parse_trace(text, "t.jsonl", &stats);
    ASSERT_FALSE(r.has_value()) << "accepted: " << c.line;
    EXPECT_EQ(r.error().code(), EINVAL) << c.line;
    const std::string& msg = r.error().context();
    EXPECT_EQ(msg.rfind("t.jsonl:2: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.want), std::string::npos) << "line: " << c.line << "\nerror: " << msg;
    EXPECT_EQ(stats.sessions, 7u) << "stats are untouched on failure";
    EXPECT_EQ(stats.rounds, 8u);
    EXPECT_EQ(stats.dropped_rounds, 9u);
  }
}

TEST(ParseTrace, SurvivesDeeplyNestedJson) {
  std::string deep(200000, '[');
  deep += std::string(200000, ']');
  auto r = parse_trace(deep, "t.jsonl");
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().context().find("t.jsonl:1: "), std::string::npos);

  std::string unclosed(200000, '{');
  r = parse_trace(unclosed, "t.jsonl");
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().context().find("not valid JSON"), std::string::npos);
}

TEST(ParseTrace, EmptyTextHasNoSessions) {
  TraceStats stats{1, 1, 1};
  auto r = parse_trace("\n \n", "t.jsonl", &stats);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->empty());
  EXPECT_EQ(stats.sessions, 0u);
  EXPECT_EQ(stats.rounds, 0u);
}

TEST(LoadTrace, ReadsAFileAndNamesItInErrors) {
  std::filesystem::path path =
      std::filesystem::path(testing::TempDir()) / ("workload_test_" + std::to_string(::getpid()) + ".jsonl");
  {
    std::ofstream f(path);
    f << R"({"id":"a","rounds":[{"input_tokens":10,"output_tokens":2,"tool":"ls","tool_seconds":0.5},)"
      << R"({"input_tokens":20,"output_tokens":3}]})"
      << "\n"
      << R"({"id":"b","rounds":[{"input_tokens":"bad","output_tokens":2}]})"
      << "\n";
  }
  auto r = load_trace(path.string());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().context().rfind(path.string() + ":2: ", 0), 0u) << r.error().context();
  EXPECT_NE(r.error().context().find("rounds[0].input_tokens"), std::string::npos);

  {
    std::ofstream f(path);
    f << R"({"id":"a","rounds":[{"input_tokens":10,"output_tokens":2,"tool":"ls","tool_seconds":0.5},)"
      << R"({"input_tokens":20,"output_tokens":3}]})"
      << "\n";
  }
  TraceStats stats;
  r = load_trace(path.string(), &stats);
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(stats.sessions, 1u);
  EXPECT_EQ(stats.rounds, 2u);
  std::filesystem::remove(path);
}

TEST(LoadTrace, MissingFileIsAnErrnoError) {
  auto r = load_trace("/nonexistent/tandem/trace.jsonl");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ENOENT);
  EXPECT_NE(r.error().context().find("/nonexistent/tandem/trace.jsonl"), std::string::npos);
}

TEST(LoadTrace, TheDevTraceLoads) {
  const auto path = dev_trace_path();
  ASSERT_TRUE(std::filesystem::exists(path)) << "the dev trace is part of the repository: " << path;
  TraceStats stats;
  auto sessions = load_trace(path.string(), &stats);
  ASSERT_TRUE(sessions.has_value()) << sessions.error().message();
  // README: 473 sessions, 18,125 rounds; one session answers without a tool
  // mid-way, so a few of those rounds are dropped.
  EXPECT_EQ(sessions->size(), 473u);
  EXPECT_EQ(stats.sessions, 473u);
  EXPECT_EQ(stats.rounds + stats.dropped_rounds, 18125u);
  EXPECT_LT(stats.dropped_rounds, 100u);
  std::uint64_t rounds = 0;
  std::set<std::string> names;
  for (const SessionSpec& s : *sessions) {
    ASSERT_FALSE(s.rounds.empty());
    rounds += s.rounds.size();
    names.insert(s.name);
    EXPECT_TRUE(s.rounds.back().tool.empty()) << s.name;
    for (std::size_t i = 0; i + 1 < s.rounds.size(); ++i) {
      EXPECT_FALSE(s.rounds[i].tool.empty()) << s.name << " round " << i;
    }
    for (const RoundSpec& r : s.rounds) {
      EXPECT_GE(r.input_tokens, 1u);
      EXPECT_GE(r.output_tokens, 1u);
      EXPECT_GE(r.tool_seconds, 0.0);
    }
  }
  EXPECT_EQ(rounds, stats.rounds);
  EXPECT_EQ(names.size(), sessions->size()) << "trace ids are distinct session names";
}

// ---------------------------------------------------------------------------
// Synthetic generators

TEST(Synthetic, ListsTheGeneratorsWithDocs) {
  std::set<std::string> names;
  for (const SyntheticSpec& s : synthetic_workloads()) {
    names.emplace(s.name);
    EXPECT_GT(s.doc.size(), 40u) << s.name;
  }
  for (const char* want :
       {"mars-short", "mars-long", "mars-mixed", "agentic", "long-pause", "mars-ilr-125k", "mars-ilr-263k"}) {
    EXPECT_TRUE(names.contains(want)) << want;
  }
}

TEST(Synthetic, UnknownNameListsTheKnownOnes) {
  auto r = synthetic_pool("nope", 3, 1);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ENOENT);
  EXPECT_NE(r.error().context().find("nope"), std::string::npos);
  for (const SyntheticSpec& s : synthetic_workloads()) {
    EXPECT_NE(r.error().context().find(s.name), std::string::npos) << s.name;
  }
  auto zero = synthetic_pool("agentic", 0, 1);
  ASSERT_FALSE(zero.has_value());
  EXPECT_EQ(zero.error().code(), EINVAL);
}

TEST(Synthetic, SameSeedSameSessionsOtherSeedOthers) {
  for (const SyntheticSpec& s : synthetic_workloads()) {
    auto a = pool_of(s.name, 50, 42);
    auto b = pool_of(s.name, 50, 42);
    auto c = pool_of(s.name, 50, 43);
    EXPECT_TRUE(same_sessions(a, b)) << s.name;
    EXPECT_FALSE(same_sessions(a, c)) << s.name;
    // Sessions are drawn in sequence: a smaller pool is a prefix.
    auto prefix = pool_of(s.name, 20, 42);
    EXPECT_TRUE(same_sessions(prefix, std::vector<SessionSpec>(a.begin(), a.begin() + 20))) << s.name;
  }
}

TEST(Synthetic, StreamIsPinnedAcrossStandardLibraries) {
  // The distributions are hand-written so these numbers are the same under
  // libstdc++ and libc++; a change here changes every published comparison.
  auto p = pool_of("mars-short", 1, 7);
  ASSERT_EQ(p.size(), 1u);
  auto q = pool_of("agentic", 1, 7);
  ASSERT_EQ(q.size(), 1u);
  // rounds, first input, first output, first tool of each session.
  const SessionSpec& m = p[0];
  const SessionSpec& g = q[0];
  std::string got = std::to_string(m.rounds.size()) + " " + std::to_string(m.rounds[0].input_tokens) + " " +
                    std::to_string(m.rounds[0].output_tokens) + " " + m.rounds[0].tool + " " +
                    std::to_string(g.rounds.size()) + " " + std::to_string(g.rounds[0].input_tokens) + " " +
                    std::to_string(g.rounds[0].output_tokens) + " " + g.rounds[0].tool;
  EXPECT_EQ(got, "4 10110 356 pytest 74 16417 230 Task");
}

TEST(Synthetic, EveryGeneratorGrowsThePrefix) {
  for (const SyntheticSpec& s : synthetic_workloads()) {
    auto pool = pool_of(s.name, 300, 9);
    ASSERT_EQ(pool.size(), 300u);
    for (std::size_t i = 0; i < pool.size(); ++i) {
      const SessionSpec& session = pool[i];
      EXPECT_EQ(session.name, std::string(s.name) + "-" + std::to_string(i));
      ASSERT_FALSE(session.rounds.empty()) << session.name;
      EXPECT_TRUE(session.rounds.back().tool.empty()) << session.name;
      EXPECT_EQ(session.rounds.back().tool_seconds, 0.0) << session.name;
      for (std::size_t k = 0; k < session.rounds.size(); ++k) {
        const RoundSpec& r = session.rounds[k];
        EXPECT_GE(r.output_tokens, 1u);
        EXPECT_FALSE(r.capped);
        if (k + 1 < session.rounds.size()) {
          EXPECT_FALSE(r.tool.empty()) << session.name << " round " << k;
          EXPECT_TRUE(std::isfinite(r.tool_seconds));
          EXPECT_GE(r.tool_seconds, 0.0);
        }
        if (k > 0) {
          const RoundSpec& prev = session.rounds[k - 1];
          EXPECT_GE(r.input_tokens, prev.input_tokens + prev.output_tokens) << session.name << " round " << k;
        }
      }
    }
  }
}

TEST(Synthetic, MarsShortRegime) {
  const std::set<std::string> mix = {"python", "pytest", "pip", "git", "Read", "Edit", "Grep"};
  auto pool = pool_of("mars-short", 2000, 3);
  std::vector<std::uint32_t> first;
  std::vector<double> tool_s;
  std::set<std::size_t> lengths;
  std::set<std::string> kinds;
  for (const SessionSpec& s : pool) {
    first.push_back(s.rounds[0].input_tokens);
    lengths.insert(s.rounds.size());
    for (std::size_t k = 0; k < s.rounds.size(); ++k) {
      const RoundSpec& r = s.rounds[k];
      EXPECT_GE(r.output_tokens, 50u);
      EXPECT_LE(r.output_tokens, 500u);
      if (k + 1 < s.rounds.size()) {
        EXPECT_TRUE(mix.contains(r.tool)) << r.tool;
        kinds.insert(r.tool);
        EXPECT_LE(r.tool_seconds, 120.0);
        tool_s.push_back(r.tool_seconds);
      }
      if (k > 0) {
        const RoundSpec& prev = s.rounds[k - 1];
        std::uint32_t added = r.input_tokens - prev.input_tokens - prev.output_tokens;
        EXPECT_GE(added, 300u);
        EXPECT_LE(added, 1500u);
      }
    }
  }
  EXPECT_EQ(lengths, (std::set<std::size_t>{4, 5, 6, 7, 8}));
  EXPECT_EQ(kinds, mix);
  EXPECT_GE(*std::min_element(first.begin(), first.end()), 1024u);
  EXPECT_LE(*std::max_element(first.begin(), first.end()), 16384u);
  EXPECT_NEAR(quantile(first, 0.5), 4096.0, 300.0);
  EXPECT_NEAR(quantile(tool_s, 0.5), 0.5, 0.1);
  EXPECT_GT(quantile(tool_s, 0.99), 10.0) << "tool time is heavy-tailed";
}

TEST(Synthetic, MarsLongRegime) {
  auto pool = pool_of("mars-long", 1000, 3);
  std::vector<std::uint32_t> first;
  for (const SessionSpec& s : pool) {
    first.push_back(s.rounds[0].input_tokens);
    EXPECT_GE(s.rounds.size(), 4u);
    EXPECT_LE(s.rounds.size(), 8u);
  }
  EXPECT_GE(*std::min_element(first.begin(), first.end()), 50000u);
  EXPECT_LE(*std::max_element(first.begin(), first.end()), 100000u);
  EXPECT_NEAR(quantile(first, 0.5), 75000.0, 3000.0);
}

TEST(Synthetic, MarsMixedIsOneFifthLong) {
  auto pool = pool_of("mars-mixed", 4000, 5);
  std::size_t long_sessions = 0;
  for (const SessionSpec& s : pool) {
    std::uint32_t first = s.rounds[0].input_tokens;
    EXPECT_TRUE(first <= 16384 || (first >= 50000 && first <= 100000)) << first;
    if (first >= 50000) ++long_sessions;
  }
  EXPECT_NEAR(static_cast<double>(long_sessions) / 4000.0, 0.2, 0.025);
}

TEST(Synthetic, AgenticMatchesTheDevTraceShape) {
  auto pool = pool_of("agentic", 3000, 11);
  std::vector<double> rounds, first, output, tool_s, growth;
  for (const SessionSpec& s : pool) {
    rounds.push_back(static_cast<double>(s.rounds.size()));
    first.push_back(s.rounds[0].input_tokens);
    for (std::size_t k = 0; k < s.rounds.size(); ++k) {
      const RoundSpec& r = s.rounds[k];
      output.push_back(r.output_tokens);
      if (k + 1 < s.rounds.size()) tool_s.push_back(r.tool_seconds);
      if (k > 0) growth.push_back(static_cast<double>(r.input_tokens) - s.rounds[k - 1].input_tokens);
    }
  }
  auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return sum / static_cast<double>(v.size());
  };
  EXPECT_NEAR(mean(rounds), 39.0, 3.0);
  EXPECT_NEAR(quantile(rounds, 0.9), 64.0, 6.0);
  EXPECT_NEAR(quantile(first, 0.5), 13000.0, 1000.0);
  EXPECT_NEAR(quantile(output, 0.5), 120.0, 10.0);
  EXPECT_NEAR(quantile(output, 0.9), 600.0, 60.0);
  EXPECT_NEAR(mean(growth), 960.0, 120.0) << "~700 new tokens plus the previous answer per round";
  EXPECT_NEAR(quantile(tool_s, 0.5), 0.08, 0.03);
  EXPECT_GT(quantile(tool_s, 0.9), 3.0);
  EXPECT_LT(quantile(tool_s, 0.9), 10.0);
  EXPECT_NEAR(quantile(tool_s, 0.99), 30.0, 8.0);
}

TEST(Synthetic, LongPauseHasLongContextsHumanPausesAndMultiSecondTools) {
  auto pool = pool_of("long-pause", 2000, 5);
  std::vector<double> rounds, input, think, tool;
  for (const SessionSpec& s : pool) {
    rounds.push_back(static_cast<double>(s.rounds.size()));
    for (std::size_t k = 0; k < s.rounds.size(); ++k) {
      const RoundSpec& r = s.rounds[k];
      input.push_back(r.input_tokens);
      if (k + 1 == s.rounds.size()) continue;
      (r.tool == "human" ? think : tool).push_back(r.tool_seconds);
    }
  }
  // The issue's second held-out set: median context ~100k, think time p50 22 s and
  // p90 ~14 min, 38 rounds at p50, tool time p50 8.5 s.
  EXPECT_NEAR(quantile(rounds, 0.5), 38.0, 3.0);
  EXPECT_NEAR(quantile(input, 0.5), 100000.0, 10000.0);
  EXPECT_NEAR(quantile(think, 0.5), 22.0, 3.0);
  EXPECT_NEAR(quantile(think, 0.9), 840.0, 150.0);
  EXPECT_NEAR(quantile(tool, 0.5), 8.5, 1.0);
  EXPECT_NEAR(static_cast<double>(think.size()) / static_cast<double>(think.size() + tool.size()), 1.0 / 6.0, 0.02);
  EXPECT_EQ(ToolCpuTable().demand("human"), 0.0) << "a human thinking uses no tool core";
}

TEST(Synthetic, MarsIlrSpansTheMarsPromptVolumes) {
  // MARS sec. 6.1: mean request-level prompt volume (all of a task's prompts) 125K-263K.
  for (const auto& [name, volume] : {std::pair{"mars-ilr-125k", 125000.0}, std::pair{"mars-ilr-263k", 263000.0}}) {
    auto pool = pool_of(name, 4000, 2);
    double sum = 0;
    for (const SessionSpec& s : pool) {
      EXPECT_GE(s.rounds.size(), 4u);
      EXPECT_LE(s.rounds.size(), 8u) << "MARS's agent loop runs at most 8 rounds";
      for (const RoundSpec& r : s.rounds) sum += r.input_tokens;
    }
    EXPECT_NEAR(sum / static_cast<double>(pool.size()), volume, 0.03 * volume) << name;
  }
}

// ---------------------------------------------------------------------------
// make_workload

std::vector<SessionSpec> named_pool(std::initializer_list<const char*> names) {
  std::vector<SessionSpec> pool;
  for (const char* n : names) {
    SessionSpec s;
    s.name = n;
    s.rounds = {RoundSpec{100, 10, "ls", 0.1, false}, RoundSpec{200, 10, "", 0.0, false}};
    pool.push_back(s);
  }
  return pool;
}

TEST(MakeWorkload, SameSeedSameWorkload) {
  auto pool = pool_of("mars-mixed", 40, 1);
  ArrivalSpec spec{.rate_sps = 0.5, .poisson = true, .sessions = 100, .seed = 3};
  auto a = make_workload(pool, "w", spec);
  auto b = make_workload(pool, "w", spec);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->name, "w");
  EXPECT_TRUE(same_sessions(a->sessions, b->sessions));
  spec.seed = 4;
  auto c = make_workload(pool, "w", spec);
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(same_sessions(a->sessions, c->sessions));
}

TEST(MakeWorkload, PoissonGapsAverageOneOverRate) {
  auto pool = named_pool({"a", "b", "c"});
  const double rate = 0.5;
  auto w = make_workload(pool, "w", ArrivalSpec{.rate_sps = rate, .poisson = true, .sessions = 40000, .seed = 5});
  ASSERT_TRUE(w.has_value()) << w.error().message();
  ASSERT_EQ(w->sessions.size(), 40000u);
  EXPECT_EQ(w->sessions[0].arrival_s, 0.0);
  double sum = 0, sum_sq = 0;
  for (std::size_t i = 1; i < w->sessions.size(); ++i) {
    double gap = w->sessions[i].arrival_s - w->sessions[i - 1].arrival_s;
    ASSERT_GE(gap, 0.0);
    sum += gap;
    sum_sq += gap * gap;
  }
  const double n = static_cast<double>(w->sessions.size() - 1);
  const double mean = sum / n;
  const double sd = std::sqrt(sum_sq / n - mean * mean);
  // Standard error of the mean is 2/√40000 = 0.01: 0.04 is four of them.
  EXPECT_NEAR(mean, 1.0 / rate, 0.04);
  EXPECT_NEAR(sd / mean, 1.0, 0.05) << "exponential gaps: sd = mean";
}

TEST(MakeWorkload, FixedRateSpacesArrivalsExactly) {
  auto pool = named_pool({"a", "b", "c", "d"});
  auto w = make_workload(pool, "w", ArrivalSpec{.rate_sps = 0.25, .poisson = false, .sessions = 10, .seed = 1});
  ASSERT_TRUE(w.has_value());
  ASSERT_EQ(w->sessions.size(), 10u);
  for (std::size_t i = 0; i < 10; ++i) EXPECT_EQ(w->sessions[i].arrival_s, static_cast<double>(i) / 0.25);
}

TEST(MakeWorkload, RepeatsThePoolUnderDistinctNames) {
  auto pool = named_pool({"a", "b", "c"});
  auto w = make_workload(pool, "w", ArrivalSpec{.rate_sps = 1, .poisson = true, .sessions = 7, .seed = 2});
  ASSERT_TRUE(w.has_value());
  ASSERT_EQ(w->sessions.size(), 7u);
  std::vector<std::string> names;
  for (const SessionSpec& s : w->sessions) names.push_back(s.name);
  // Each pass over the pool is a permutation of it.
  std::set<std::string> pass1(names.begin(), names.begin() + 3);
  std::set<std::string> pass2(names.begin() + 3, names.begin() + 6);
  EXPECT_EQ(pass1, (std::set<std::string>{"a", "b", "c"}));
  EXPECT_EQ(pass2, (std::set<std::string>{"a#2", "b#2", "c#2"}));
  EXPECT_TRUE(names[6] == "a#3" || names[6] == "b#3" || names[6] == "c#3") << names[6];
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), 7u);
  EXPECT_EQ(w->rounds, 14u);
}

TEST(MakeWorkload, ShufflesWithTheSeed) {
  std::vector<SessionSpec> pool;
  for (int i = 0; i < 20; ++i) {
    pool.push_back(named_pool({"x"})[0]);
    pool.back().name = std::to_string(i);
  }
  std::set<std::vector<std::string>> orders;
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    auto w = make_workload(pool, "w", ArrivalSpec{.rate_sps = 1, .poisson = false, .sessions = 0, .seed = seed});
    ASSERT_TRUE(w.has_value());
    ASSERT_EQ(w->sessions.size(), 20u) << "0 sessions = the pool once";
    std::vector<std::string> order;
    for (const SessionSpec& s : w->sessions) order.push_back(s.name);
    std::vector<std::string> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::string> want;
    want.reserve(pool.size());
    for (const SessionSpec& s : pool) want.push_back(s.name);
    std::sort(want.begin(), want.end());
    EXPECT_EQ(sorted, want) << "every session once";
    orders.insert(order);
  }
  EXPECT_EQ(orders.size(), 5u) << "different seeds, different orders";
}

TEST(MakeWorkload, CapsContextsToTheModelLength) {
  SessionSpec s;
  s.name = "s";
  s.rounds = {
      RoundSpec{900, 50, "ls", 0.1, false},   // 950 fits
      RoundSpec{900, 200, "ls", 0.1, false},  // 1100: input cut to 800
      RoundSpec{100, 700, "ls", 0.1, false},  // output cut to 500, then 600 fits
      RoundSpec{5000, 5000, "", 0.0, false},  // output 500, input 500
  };
  std::vector<SessionSpec> pool{s};
  auto w = make_workload(pool, "w", ArrivalSpec{.rate_sps = 1, .poisson = true, .sessions = 2, .max_model_len = 1000});
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->rounds, 8u);
  EXPECT_EQ(w->capped_rounds, 4u);
  for (const SessionSpec& got : w->sessions) {
    const auto& r = got.rounds;
    EXPECT_EQ(r[0].input_tokens, 900u);
    EXPECT_EQ(r[0].output_tokens, 50u);
    EXPECT_FALSE(r[0].capped);
    EXPECT_EQ(r[1].input_tokens, 800u);
    EXPECT_EQ(r[1].output_tokens, 200u);
    EXPECT_TRUE(r[1].capped);
    EXPECT_EQ(r[2].input_tokens, 100u);
    EXPECT_EQ(r[2].output_tokens, 500u);
    EXPECT_FALSE(r[2].capped) << "only a cut input counts as capped";
    EXPECT_EQ(r[3].input_tokens, 500u);
    EXPECT_EQ(r[3].output_tokens, 500u);
    EXPECT_TRUE(r[3].capped);
  }
}

TEST(MakeWorkload, CappedLongSessionsStayWithinBound) {
  auto pool = pool_of("mars-long", 100, 1);
  const std::uint32_t max_len = 65536;
  auto w = make_workload(pool, "w", ArrivalSpec{.rate_sps = 1, .poisson = true, .seed = 1, .max_model_len = max_len});
  ASSERT_TRUE(w.has_value());
  std::uint64_t rounds = 0, capped = 0;
  for (const SessionSpec& s : w->sessions) {
    for (const RoundSpec& r : s.rounds) {
      ++rounds;
      if (r.capped) ++capped;
      EXPECT_LE(r.input_tokens + r.output_tokens, max_len);
      EXPECT_LE(r.output_tokens, max_len / 2);
      EXPECT_GE(r.input_tokens, 1u);
    }
  }
  EXPECT_EQ(w->rounds, rounds);
  EXPECT_EQ(w->capped_rounds, capped);
  EXPECT_GT(capped, rounds / 2) << "first prompts of 50k–100k mostly exceed 64k";
  // An uncapped run of the same pool caps nothing.
  auto wide = make_workload(pool, "w", ArrivalSpec{.rate_sps = 1, .poisson = true, .seed = 1});
  ASSERT_TRUE(wide.has_value());
  EXPECT_EQ(wide->capped_rounds, 0u);
}

TEST(MakeWorkload, RejectsBadArguments) {
  auto pool = named_pool({"a"});
  auto expect_einval = [](const base::Result<Workload>& r) {
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code(), EINVAL);
  };
  expect_einval(make_workload({}, "w", ArrivalSpec{}));
  for (double rate : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    expect_einval(make_workload(pool, "w", ArrivalSpec{.rate_sps = rate}));
  }
  expect_einval(make_workload(pool, "w", ArrivalSpec{.max_model_len = 1}));
  EXPECT_TRUE(make_workload(pool, "w", ArrivalSpec{.max_model_len = 2}).has_value());
}

// ---------------------------------------------------------------------------
// ToolCpuTable

TEST(ToolCpuTable, DefaultsFollowToolKinds) {
  ToolCpuTable t;
  EXPECT_DOUBLE_EQ(t.demand("pytest"), 1.0);
  EXPECT_DOUBLE_EQ(t.demand("python"), 1.0);
  EXPECT_DOUBLE_EQ(t.demand("pip"), 1.0);
  EXPECT_DOUBLE_EQ(t.demand("cargo"), 1.0);
  EXPECT_DOUBLE_EQ(t.demand("bash"), 0.5);
  EXPECT_DOUBLE_EQ(t.demand("git"), 0.3);
  EXPECT_DOUBLE_EQ(t.demand("ls"), 0.1);
  EXPECT_DOUBLE_EQ(t.demand("grep"), 0.1);
  EXPECT_DOUBLE_EQ(t.demand("Read"), 0.05);
  EXPECT_DOUBLE_EQ(t.demand("Grep"), 0.05);
  EXPECT_DOUBLE_EQ(t.demand("TodoWrite"), 0.05);
  EXPECT_DOUBLE_EQ(t.demand("WebFetch"), 0.02);
  EXPECT_DOUBLE_EQ(t.demand("Task"), 0.02);
  EXPECT_DOUBLE_EQ(t.fallback(), 0.5);
  EXPECT_DOUBLE_EQ(t.demand("never-seen-tool"), 0.5);
  for (const auto& [kind, cores] : t.table()) {
    EXPECT_GE(cores, 0.0) << kind;
    EXPECT_LE(cores, 1.0) << kind;
  }
}

TEST(ToolCpuTable, DefaultsNameTheTracesCommonestKinds) {
  const auto path = dev_trace_path();
  ASSERT_TRUE(std::filesystem::exists(path)) << "the dev trace is part of the repository: " << path;
  auto sessions = load_trace(path.string());
  ASSERT_TRUE(sessions.has_value()) << sessions.error().message();
  std::map<std::string, std::size_t> counts;
  for (const SessionSpec& s : *sessions) {
    for (const RoundSpec& r : s.rounds) {
      if (!r.tool.empty()) ++counts[r.tool];
    }
  }
  std::vector<std::pair<std::size_t, std::string>> by_count;
  by_count.reserve(counts.size());
  for (const auto& [kind, n] : counts) by_count.emplace_back(n, kind);
  std::sort(by_count.rbegin(), by_count.rend());
  ToolCpuTable t;
  for (std::size_t i = 0; i < 30 && i < by_count.size(); ++i) {
    EXPECT_TRUE(t.table().contains(by_count[i].second)) << by_count[i].second << " (" << by_count[i].first << " calls)";
  }
}

TEST(ToolCpuTable, ApplyOverridesKindsAndTheFallback) {
  ToolCpuTable t;
  auto ok = t.apply("pytest=0.8, *=0.3 ,new-tool = 2.5,git=0");
  ASSERT_TRUE(ok.has_value()) << ok.error().message();
  EXPECT_DOUBLE_EQ(t.demand("pytest"), 0.8);
  EXPECT_DOUBLE_EQ(t.demand("new-tool"), 2.5);
  EXPECT_DOUBLE_EQ(t.demand("git"), 0.0);
  EXPECT_DOUBLE_EQ(t.fallback(), 0.3);
  EXPECT_DOUBLE_EQ(t.demand("never-seen-tool"), 0.3);
  EXPECT_DOUBLE_EQ(t.demand("python"), 1.0) << "unnamed kinds keep their defaults";
  ASSERT_TRUE(t.apply("python=64,ls=1e-3").has_value());
  EXPECT_DOUBLE_EQ(t.demand("python"), 64.0);
  EXPECT_DOUBLE_EQ(t.demand("ls"), 0.001);
  ASSERT_TRUE(t.apply("").has_value()) << "an empty spec changes nothing";
  EXPECT_DOUBLE_EQ(t.demand("python"), 64.0);
}

TEST(ToolCpuTable, RejectsBadEntriesAndChangesNothing) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"pytest", "pytest"},
      {"pytest=", "pytest="},
      {"=1", "=1"},
      {"pytest=abc", "pytest=abc"},
      {"pytest=-1", "pytest=-1"},
      {"pytest=64.5", "pytest=64.5"},
      {"pytest=nan", "pytest=nan"},
      {"pytest=inf", "pytest=inf"},
      {"pytest=1=2", "pytest=1=2"},
      {"pytest:0.8", "pytest:0.8"},
      {"pytest=0.8,", "''"},
      {"pytest=0.8,,git=1", "''"},
      {"pytest=0.2,*=0.1,git=bad", "git=bad"},  // all or nothing
  };
  for (const auto& [spec, entry] : bad) {
    ToolCpuTable t;
    const auto before = t.table();
    auto r = t.apply(spec);
    ASSERT_FALSE(r.has_value()) << "accepted: " << spec;
    EXPECT_EQ(r.error().code(), EINVAL) << spec;
    EXPECT_NE(r.error().context().find(entry), std::string::npos) << spec << ": " << r.error().context();
    EXPECT_EQ(t.table(), before) << spec;
    EXPECT_DOUBLE_EQ(t.fallback(), 0.5) << spec;
  }
}

}  // namespace
}  // namespace tandem::sim
