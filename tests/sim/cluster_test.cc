// The cluster (sim/cluster.h): each published scorer's formula and the
// picker on hand-built node states, round-robin's order and least-queue's
// ties, a 1-node cluster equal to simulate(), stickiness, and a moved
// session paying a full prefill on its new node.
#include "sim/cluster.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/sim/fixtures.h"

namespace tandem::sim {
namespace {

// ---------------------------------------------------------------------------
// The scorers, on hand-built inputs.

TEST(ClusterScorers, QueueScorerIsMinMaxNormalisedAndNeutralWhenEqual) {
  const std::vector<std::uint32_t> waiting = {3, 1, 5};
  const std::vector<double> s = queue_scores(waiting);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_DOUBLE_EQ(s[0], 0.5);  // (5 − 3) / (5 − 1)
  EXPECT_DOUBLE_EQ(s[1], 1.0);  // the shortest queue
  EXPECT_DOUBLE_EQ(s[2], 0.0);  // the longest
  const std::vector<std::uint32_t> equal = {4, 4};
  EXPECT_EQ(queue_scores(equal), (std::vector<double>{1.0, 1.0}));
}

TEST(ClusterScorers, KvAndPrefixScorers) {
  EXPECT_DOUBLE_EQ(kv_score(0.25), 0.75);
  EXPECT_DOUBLE_EQ(kv_score(0.0), 1.0);
  EXPECT_DOUBLE_EQ(kv_score(1.5), 0.0);  // clamped, as enforceScoreRange does
  EXPECT_DOUBLE_EQ(prefix_score(128, 256), 0.5);
  EXPECT_DOUBLE_EQ(prefix_score(0, 0), 0.0);  // a prompt without a full block
  EXPECT_EQ(prompt_blocks(100, 16), 6u);
  EXPECT_EQ(prompt_blocks(50000, 16), kMaxPrefixBlocks);  // at most 256 blocks are hashed
}

EndpointView view(std::uint32_t waiting, double kv, std::uint32_t prefix) {
  EndpointView v;
  v.load.waiting = waiting;
  v.load.kv_usage = kv;
  v.prefix_blocks = prefix;
  return v;
}

TEST(ClusterScorers, EppWeighsQueueTwoKvTwoPrefixThree) {
  std::mt19937_64 rng(1);
  std::vector<double> scores;
  // A: the longer queue but the session's prefix; B: idle, no prefix.
  std::vector<EndpointView> nodes = {view(6, 0.5, 100), view(0, 0.5, 0)};
  EXPECT_EQ(epp_pick(nodes, 100, false, rng, &scores), 0u);
  EXPECT_DOUBLE_EQ(scores[0], 2 * 0.0 + 2 * 0.5 + 3 * 1.0);
  EXPECT_DOUBLE_EQ(scores[1], 2 * 1.0 + 2 * 0.5 + 3 * 0.0);
  // A's cache nearly full: queue and KV together outweigh the prefix.
  nodes = {view(6, 0.95, 100), view(0, 0.1, 0)};
  EXPECT_EQ(epp_pick(nodes, 100, false, rng, &scores), 1u);
  EXPECT_DOUBLE_EQ(scores[0], 2 * 0.0 + 2 * 0.05 + 3 * 1.0);
  EXPECT_DOUBLE_EQ(scores[1], 2 * 1.0 + 2 * 0.9 + 0.0);
  // Half the prompt matched: half the prefix score.
  nodes = {view(1, 0.0, 50), view(1, 0.0, 0)};
  epp_pick(nodes, 100, false, rng, &scores);
  EXPECT_DOUBLE_EQ(scores[0], 2 + 2 + 1.5);
}

TEST(ClusterScorers, EppPlusTandemFeedsTandemsSignalsIntoTheSameScorers) {
  std::mt19937_64 rng(1);
  std::vector<double> plain, fed;
  // A holds rounds for admission (invisible to vLLM's queue) and its tool
  // cores are under pressure; B's engine cache forgot the session but B's
  // policy pinned it... here the other way round: B has the session pinned.
  std::vector<EndpointView> nodes = {view(2, 0.3, 0), view(2, 0.3, 0)};
  nodes[0].load.held = 8;
  nodes[0].load.cpu_pressure = 0.9;
  nodes[1].tandem_blocks = 100;
  const std::size_t p = epp_pick(nodes, 100, false, rng, &plain);
  EXPECT_DOUBLE_EQ(plain[0], plain[1]);  // epp sees two equal nodes: a tie
  EXPECT_LT(p, 2u);
  EXPECT_EQ(epp_pick(nodes, 100, true, rng, &fed), 1u);
  EXPECT_DOUBLE_EQ(fed[0], 2 * 0.0 + 2 * (1 - 0.9) + 0.0);  // queue 10 vs 2, KV input max(0.3, 0.9)
  EXPECT_DOUBLE_EQ(fed[1], 2 * 1.0 + 2 * 0.7 + 3 * 1.0);    // the pinned KV: a full prefix hit
}

TEST(ClusterScorers, EppBreaksTiesAtRandomAmongTheBestOnly) {
  std::mt19937_64 rng(7);
  std::vector<EndpointView> nodes = {view(0, 0.2, 0), view(5, 0.2, 0), view(0, 0.2, 0)};
  std::set<std::size_t> picked;
  for (int i = 0; i < 64; ++i) picked.insert(epp_pick(nodes, 10, false, rng));
  EXPECT_EQ(picked, (std::set<std::size_t>{0, 2}));
}

TEST(ClusterScorers, LeastQueueCountsOutstandingRequestsAndTiesGoLow) {
  std::vector<NodeLoad> loads(3);
  loads[0].running = 2;
  loads[1].waiting = 1;
  loads[1].held = 1;
  loads[2].running = 1;
  loads[2].waiting = 1;
  EXPECT_EQ(least_queue_pick(loads), 0u);  // 2, 2, 2: the lowest index
  loads[2].waiting = 0;
  EXPECT_EQ(least_queue_pick(loads), 2u);
}

TEST(ClusterPrefixIndex, MatchesTheRecordedPrefixOfTheSameContentAndEvictsLeastRecent) {
  PrefixIndex index({300, 300});
  index.add(0, 11, 0, 100);
  EXPECT_EQ(index.match(0, 11, 0, 150), 100u);  // the prompt grew: its first 100 blocks are known
  EXPECT_EQ(index.match(0, 11, 0, 60), 60u);
  EXPECT_EQ(index.match(1, 11, 0, 150), 0u);  // not on the other node
  EXPECT_EQ(index.match(0, 11, 1, 150), 0u);  // the context was rewritten: other hashes
  index.add(0, 12, 0, 150);
  index.add(0, 11, 0, 120);  // 11 used again: most recent
  index.add(0, 13, 0, 100);  // 370 > 300: 12 goes
  EXPECT_EQ(index.match(0, 12, 0, 150), 0u);
  EXPECT_EQ(index.match(0, 11, 0, 150), 120u);
  EXPECT_EQ(index.used(0), 220u);
}

TEST(ClusterRouters, NamesAndErrors) {
  ASSERT_EQ(router_names().size(), 4u);
  EXPECT_EQ(*parse_router("epp+tandem"), Router::kEppTandem);
  auto bad = parse_router("random");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().context().find("unknown router 'random'"), std::string::npos);
  EXPECT_NE(bad.error().context().find("round-robin, least-queue, epp, epp+tandem"), std::string::npos);
}

// ---------------------------------------------------------------------------
// Whole clusters.

using fixtures::config;
using fixtures::session;

Workload contended(int n) {
  Workload w;
  w.name = "contended";
  for (int i = 0; i < n; ++i) {
    w.sessions.push_back(session("s" + std::to_string(i), i * 0.5, 4000 + (i % 5) * 3000, 4 + i % 4, 0.3, i));
  }
  return w;
}

class OneNode : public ::testing::TestWithParam<std::tuple<std::string_view, Router>> {};

TEST_P(OneNode, EqualsTheNodeAlone) {
  const auto [policy, router] = GetParam();
  const Workload w = contended(30);
  const SimConfig c = config(std::string(policy));
  const auto ideal = ideal_times(w, c);
  auto alone = simulate(w, c, ideal);
  auto one = simulate_cluster(w, c, ideal, {1, router, 1});
  ASSERT_TRUE(alone) << alone.error().context();
  ASSERT_TRUE(one) << one.error().context();
  ASSERT_EQ(alone->sessions.size(), one->sessions.size());
  for (std::size_t i = 0; i < alone->sessions.size(); ++i) {
    EXPECT_EQ(alone->sessions[i].arrival_s, one->sessions[i].arrival_s) << i;
    EXPECT_EQ(alone->sessions[i].finish_s, one->sessions[i].finish_s) << i;
    EXPECT_EQ(alone->sessions[i].ttft_s, one->sessions[i].ttft_s) << i;
  }
  const RunCounters& a = alone->counters;
  const RunCounters& b = one->counters;
  EXPECT_EQ(a.prompt_tokens, b.prompt_tokens);
  EXPECT_EQ(a.reused_tokens, b.reused_tokens);
  EXPECT_EQ(a.recomputed_tokens, b.recomputed_tokens);
  EXPECT_EQ(a.preemptions, b.preemptions);
  EXPECT_EQ(a.gpu_busy_s, b.gpu_busy_s);
  EXPECT_EQ(a.pinned_block_seconds, b.pinned_block_seconds);
  EXPECT_EQ(a.tool_cpu_core_s, b.tool_cpu_core_s);
  EXPECT_EQ(a.engines, b.engines);
  EXPECT_EQ(a.tool_cores, b.tool_cores);
  EXPECT_EQ(alone->engine_steps, one->engine_steps);
  EXPECT_EQ(alone->actions, one->actions);
  EXPECT_EQ(b.moved_sessions, 0u);
  EXPECT_EQ(one->violations, 0u);
}

INSTANTIATE_TEST_SUITE_P(PoliciesAndRouters, OneNode,
                         ::testing::Combine(::testing::Values("fcfs", "tandem", "thunderagent"),
                                            ::testing::Values(Router::kRoundRobin, Router::kLeastQueue, Router::kEpp,
                                                              Router::kEppTandem)),
                         [](const auto& param_info) {
                           std::string name = std::string(std::get<0>(param_info.param)) + "_" +
                                              std::string(router_name(std::get<1>(param_info.param)));
                           for (char& ch : name) {
                             if (ch == '-' || ch == '+') ch = '_';
                           }
                           return name;
                         });

TEST(Cluster, RoundRobinPlacesInArrivalOrderAndNoStickyRouterMoves) {
  const Workload w = contended(24);
  const SimConfig c = config("tandem");
  const auto ideal = ideal_times(w, c);
  auto rr = simulate_cluster(w, c, ideal, {3, Router::kRoundRobin, 1});
  ASSERT_TRUE(rr) << rr.error().context();
  for (std::size_t i = 0; i < w.sessions.size(); ++i) EXPECT_EQ(rr->first_node[i], i % 3) << i;
  EXPECT_EQ(rr->counters.moved_sessions, 0u);
  EXPECT_EQ(rr->counters.nodes, 3u);
  EXPECT_EQ(rr->counters.engines, 6u);
  auto lq = simulate_cluster(w, c, ideal, {3, Router::kLeastQueue, 1});
  ASSERT_TRUE(lq) << lq.error().context();
  EXPECT_EQ(lq->counters.moved_sessions, 0u);
  EXPECT_EQ(lq->first_node[0], 0u);  // every node empty: the lowest index
  for (const auto* r : {&*rr, &*lq}) {
    EXPECT_EQ(r->violations, 0u) << r->first_violation;
    EXPECT_EQ(r->rejected_events, 0u);
    for (const SessionRecord& s : r->sessions) EXPECT_GE(s.finish_s - s.arrival_s, s.ideal_s - 1e-5);
  }
}

TEST(Cluster, EppKeepsSessionsByPrefixAffinityAndRepeatsExactly) {
  const Workload w = contended(24);
  const SimConfig c = config("tandem");
  const auto ideal = ideal_times(w, c);
  for (Router router : {Router::kEpp, Router::kEppTandem}) {
    auto a = simulate_cluster(w, c, ideal, {3, router, 5});
    auto b = simulate_cluster(w, c, ideal, {3, router, 5});
    ASSERT_TRUE(a) << a.error().context();
    ASSERT_TRUE(b);
    // Every later round scores the session's node with a full prefix (3 of
    // 7 points): only a node far more loaded loses it.
    EXPECT_LT(a->counters.moved_sessions, w.sessions.size() / 4);
    EXPECT_EQ(a->violations, 0u) << a->first_violation;
    EXPECT_EQ(a->rejected_events, 0u);
    ASSERT_EQ(a->sessions.size(), b->sessions.size());
    for (std::size_t i = 0; i < a->sessions.size(); ++i) EXPECT_EQ(a->sessions[i].finish_s, b->sessions[i].finish_s);
    EXPECT_EQ(a->counters.session_moves, b->counters.session_moves);
  }
}

// A router that moves every session to node 1 when its second round is ready.
class MoveAtRoundOne final : public RoundRouter {
 public:
  std::size_t route_round(std::size_t node, std::size_t /*index*/, SessionId /*session*/, std::size_t round,
                          Time /*now*/) override {
    return round == 1 ? 1 : node;
  }
};
class Stay final : public RoundRouter {
 public:
  std::size_t route_round(std::size_t node, std::size_t, SessionId, std::size_t, Time) override { return node; }
};

// Two nodes in one clock, one session placed on node 0; returns both nodes' results.
std::vector<SimResult> two_nodes(const Workload& w, const SimConfig& c, RoundRouter& router) {
  std::vector<NodeSim> nodes;
  for (std::size_t k = 0; k < 2; ++k) {
    nodes.emplace_back(c, k, &router);
    EXPECT_TRUE(nodes.back().start());
  }
  SessionHandoff h;
  h.spec = &w.sessions[0];
  h.ideal_s = 1;
  h.arrival = kSimEpoch;
  nodes[0].accept(std::move(h), kSimEpoch);
  std::size_t finished = 0;
  for (int guard = 0; finished == 0 && guard < 1000000; ++guard) {
    const Time t = std::min(nodes[0].next_event(), nodes[1].next_event());
    for (NodeSim& n : nodes) EXPECT_TRUE(n.advance_to(t));
    for (NodeSim& n : nodes) {
      for (SessionHandoff& m : n.take_moved()) {
        const std::size_t to = m.target;
        nodes[to].accept(std::move(m), t);
      }
      finished += n.take_finished().size();
    }
  }
  EXPECT_EQ(finished, 1u);
  return {nodes[0].finish(), nodes[1].finish()};
}

TEST(Cluster, AMovedSessionPaysAFullPrefillOnItsNewNode) {
  Workload w;
  SessionSpec s;
  s.name = "mover";
  s.rounds.resize(2);
  s.rounds[0].input_tokens = 8000;
  s.rounds[0].output_tokens = 200;
  s.rounds[0].tool = "Read";
  s.rounds[0].tool_seconds = 1.0;
  s.rounds[1].input_tokens = 8500;
  s.rounds[1].output_tokens = 100;
  w.sessions.push_back(s);
  const SimConfig c = config("fcfs");
  MoveAtRoundOne move;
  Stay stay;
  const std::vector<SimResult> moved = two_nodes(w, c, move);
  const std::vector<SimResult> stayed = two_nodes(w, c, stay);
  // Staying, round 2 reuses its cached prefix (8,192 of the 8,199 tokens
  // computed: whole blocks) and computes what is new.
  EXPECT_EQ(stayed[0].counters.reused_tokens, 8192u);
  EXPECT_EQ(stayed[1].counters.prompt_tokens, 0u);
  // Moved, node 1 computes the whole 8,500-token prompt: nothing reused, and
  // the 8,199 tokens node 0 computed (8,000 + 199 decoded) count as
  // recomputed. Node 0 released the session's KV.
  EXPECT_EQ(moved[0].counters.prompt_tokens, 8000u);
  EXPECT_EQ(moved[1].counters.prompt_tokens, 8500u);
  EXPECT_EQ(moved[1].counters.reused_tokens, 0u);
  EXPECT_EQ(moved[1].counters.recomputed_tokens, 8199u);
  EXPECT_EQ(moved[1].counters.new_tokens, 8500u - 8199u + 99u);
  EXPECT_EQ(moved[0].counters.new_tokens + moved[1].counters.new_tokens,
            stayed[0].counters.new_tokens + stayed[1].counters.new_tokens);
  for (const auto* r : {&moved, &stayed}) {
    for (const SimResult& n : *r) EXPECT_EQ(n.violations, 0u) << n.first_violation;
  }
}

TEST(Cluster, BadNodeCountsAreErrors) {
  const Workload w = contended(2);
  const SimConfig c = config("fcfs");
  const auto ideal = ideal_times(w, c);
  auto zero = simulate_cluster(w, c, ideal, {0, Router::kEpp, 1});
  ASSERT_FALSE(zero);
  EXPECT_NE(zero.error().context().find("1 to 64 nodes"), std::string::npos);
  EXPECT_FALSE(simulate_cluster(w, c, ideal, {kMaxNodes + 1, Router::kEpp, 1}));
}

}  // namespace
}  // namespace tandem::sim
