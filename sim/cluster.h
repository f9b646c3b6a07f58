// A cluster of simulated nodes behind a router (docs/sim.md "Multi-node").
// Every node is a NodeSim (sim/node.h) with its own engines, tool cores and
// policy instance; all of them run in one virtual clock. The router places
// each LLM round: round-robin and least-queue choose a node when a session
// arrives and keep it there (sticky, as llm-d's session-affinity scorer
// does); epp scores every round with the Gateway API Inference Extension
// endpoint picker's default scorers, which may move a session, and then its
// next round pays a full prefill on its new node.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/result.h"
#include "sim/node.h"

namespace tandem::sim {

enum class Router : std::uint8_t { kRoundRobin, kLeastQueue, kEpp, kEppTandem };

// The routers' names, in this order: round-robin, least-queue, epp, epp+tandem.
std::span<const std::string_view> router_names();
std::string_view router_name(Router router);
// An unknown name is an error that lists the valid ones.
base::Result<Router> parse_router(std::string_view name);

// A cluster has at most this many nodes (each a full node simulation).
inline constexpr std::uint32_t kMaxNodes = 64;

// The endpoint picker's default profile: the weights of
// kubernetes-sigs/gateway-api-inference-extension v1.5.0,
// pkg/epp/config/loader/defaults.go (loadDefaultConfig), which llm-d's
// inference-scheduling guide sets too (llm-d/llm-d@086f217,
// guides/inference-scheduling/scheduler/inference-scheduling.values.yaml).
inline constexpr double kQueueWeight = 2.0;
inline constexpr double kKvWeight = 2.0;
inline constexpr double kPrefixWeight = 3.0;
// The prefix producer's defaults (approximateprefix/types.go, v1.5.0): at
// most 256 blocks of the prompt are hashed and matched.
inline constexpr std::uint32_t kMaxPrefixBlocks = 256;

// The scorers' formulas, as published (each score in [0, 1]).
// queue-scorer (queuedepth/queue.go): (max − q) / (max − min) over the
// candidates' waiting queues; 1 for every candidate when they are all equal.
std::vector<double> queue_scores(std::span<const std::uint32_t> waiting);
// kv-cache-utilization-scorer (kvcacheutilization/kvcache_utilization.go): 1 − usage.
double kv_score(double usage);
// prefix-cache-scorer (prefix/plugin.go): matched blocks / the prompt's
// hashed blocks; 0 when the prompt has no full block.
double prefix_score(std::uint32_t matched_blocks, std::uint32_t total_blocks);

// The approximate prefix index of the prefix producer
// (approximateprefix/indexer.go): the router records the hashed blocks of
// every prompt on the endpoint it picked, in one LRU per endpoint holding at
// most that endpoint's KV blocks (AutoTune, the default, sizes it from the
// engine's cache_config_info). It never hears of the engine's evictions.
// Hashes chain block by block, so a session's prompt matches a node up to
// the first block not recorded there; here a session's content is
// identified by its rewrite count (`version`: the prompt only grows until
// the agent rewrites it). A session's entry is evicted whole (the
// published LRU drops its blocks oldest first, block 0 first, which ends
// the greedy match just the same).
class PrefixIndex {
 public:
  explicit PrefixIndex(std::vector<std::uint64_t> capacity_blocks);
  // Leading blocks of a `blocks`-block prompt recorded on `node`.
  std::uint32_t match(std::size_t node, SessionId session, std::uint32_t version, std::uint32_t blocks) const;
  void add(std::size_t node, SessionId session, std::uint32_t version, std::uint32_t blocks);
  std::uint64_t used(std::size_t node) const { return nodes_[node].used; }

 private:
  struct Entry {
    std::uint32_t version = 0;
    std::uint32_t blocks = 0;
    std::list<SessionId>::iterator lru;
  };
  struct Node {
    std::uint64_t capacity = 0;
    std::uint64_t used = 0;
    std::list<SessionId> lru;  // most recent first
    std::unordered_map<SessionId, Entry> entries;
  };
  std::vector<Node> nodes_;
};

// What epp sees of one candidate node for one request.
struct EndpointView {
  NodeLoad load;
  std::uint32_t prefix_blocks = 0;  // leading prompt blocks the prefix index has on it
  std::uint32_t tandem_blocks = 0;  // prompt blocks its pinned or offloaded KV serves there (tandem's residency)
};

// The endpoint picker: Σ weight · score over the three scorers, the highest
// total wins, ties broken uniformly at random (max-score-picker shuffles the
// candidates before a stable sort). With `tandem`, tandem's signals go into
// the scorers' own inputs: the waiting queue counts the rounds the node's
// policy holds, the KV utilisation is max(usage, tool-core CPU pressure),
// and a session's pinned or offloaded KV counts as matched prefix blocks.
// `scores` (optional) receives each node's total.
std::size_t epp_pick(std::span<const EndpointView> nodes, std::uint32_t prompt_blocks, bool tandem,
                     std::mt19937_64& rng, std::vector<double>* scores = nullptr);

// least-queue: the fewest outstanding requests (queued and running in the
// engines, and held by the node's policy); ties go to the lowest index.
std::size_t least_queue_pick(std::span<const NodeLoad> nodes);

// A prompt's hashed blocks: its full blocks, at most kMaxPrefixBlocks.
std::uint32_t prompt_blocks(std::uint32_t prompt_tokens, std::uint32_t block_size);

struct ClusterConfig {
  std::uint32_t nodes = 1;
  Router router = Router::kRoundRobin;
  std::uint64_t seed = 1;  // the picker's tie-breaks
};

// Runs `workload` on config.nodes nodes, each configured as `node` (the
// workload is the cluster's: scale it with the nodes). The result's sessions
// are in workload order; its counters are the nodes' summed (engines and
// tool cores too, so utilisations stay per resource), with moved sessions
// counted. Errors: as simulate(), prefixed with the node; a bad node count.
base::Result<SimResult> simulate_cluster(const Workload& workload, const SimConfig& node,
                                         std::span<const double> ideal_s, const ClusterConfig& cluster);

}  // namespace tandem::sim
