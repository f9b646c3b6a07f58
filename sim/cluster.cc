// The cluster: nodes in one virtual clock and the router in front of them.
#include "sim/cluster.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <limits>
#include <memory>
#include <numeric>
#include <unordered_set>
#include <utility>

#include "base/ids.h"

namespace tandem::sim {
namespace {

constexpr std::array<std::string_view, 4> kRouterNames = {"round-robin", "least-queue", "epp", "epp+tandem"};

// Every node's counters into one: sums, except the peaks (the largest node's).
void add_counters(RunCounters& into, const RunCounters& c) {
  into.prompt_tokens += c.prompt_tokens;
  into.reused_tokens += c.reused_tokens;
  into.new_tokens += c.new_tokens;
  into.recomputed_tokens += c.recomputed_tokens;
  into.computed_tokens += c.computed_tokens;
  into.preemptions += c.preemptions;
  into.swaps += c.swaps;
  into.resume_recomputed_tokens += c.resume_recomputed_tokens;
  into.kv_waste_block_seconds += c.kv_waste_block_seconds;
  into.host_peak_blocks = std::max(into.host_peak_blocks, c.host_peak_blocks);
  into.pinned_block_seconds += c.pinned_block_seconds;
  into.gpu_busy_s += c.gpu_busy_s;
  into.engines += c.engines;
  into.tool_cpu_core_s += c.tool_cpu_core_s;
  into.tool_cores += c.tool_cores;
  into.tool_calls += c.tool_calls;
  into.tool_stretch_sum += c.tool_stretch_sum;
  into.tool_stretch_calls += c.tool_stretch_calls;
  into.capped_rounds += c.capped_rounds;
  into.host_memory = into.host_memory || c.host_memory;
  into.oom_kills += c.oom_kills;
  into.oom_kills_over_host += c.oom_kills_over_host;
  into.oom_kills_over_room += c.oom_kills_over_room;
  into.memory_kills += c.memory_kills;
  into.rerun_tool_s += c.rerun_tool_s;
  into.frozen_s += c.frozen_s;
  into.throttled_s += c.throttled_s;
  into.stranded_block_s += c.stranded_block_s;
  into.host_mem_peak_bytes = std::max(into.host_mem_peak_bytes, c.host_mem_peak_bytes);
  // PSI is a share of time per node: the cluster reports the worst node's.
  into.mem_psi_some_s = std::max(into.mem_psi_some_s, c.mem_psi_some_s);
  into.mem_psi_full_s = std::max(into.mem_psi_full_s, c.mem_psi_full_s);
  into.throttles += c.throttles;
  into.freezes += c.freezes;
}

// The router and the clock of one cluster run.
class Cluster final : public RoundRouter {
 public:
  Cluster(const Workload& w, const SimConfig& node, std::span<const double> ideal, const ClusterConfig& c)
      : workload_(w),
        node_config_(node),
        ideal_(ideal),
        config_(c),
        index_(std::vector<std::uint64_t>(c.nodes, static_cast<std::uint64_t>(node.preset.gpu_blocks) * node.engines)),
        // The picker's tie-breaks: seeded, so a run repeats exactly.
        rng_(c.seed * 0x9E3779B97F4A7C15ULL + c.nodes) {}

  base::Result<SimResult> run();

  std::size_t route_round(std::size_t node, std::size_t index, SessionId session, std::size_t round, Time now) override;

 private:
  // The rewrite count of round `round` of session `index` (the prefix
  // index's content identity): a prompt shorter than the one before.
  std::uint32_t version(std::size_t index, std::size_t round) const { return versions_[index][round]; }
  std::size_t epp(std::size_t index, SessionId session, std::size_t round);
  std::size_t place(std::size_t index, SessionId session);  // a new session's node

  const Workload& workload_;
  const SimConfig& node_config_;
  std::span<const double> ideal_;
  ClusterConfig config_;
  std::vector<NodeSim> nodes_;
  PrefixIndex index_;
  std::mt19937_64 rng_;
  std::vector<std::vector<std::uint32_t>> versions_;
  std::size_t rr_next_ = 0;
  std::vector<EndpointView> views_;  // scratch
};

std::size_t Cluster::epp(std::size_t index, SessionId session, std::size_t round) {
  const SessionSpec& spec = workload_.sessions[index];
  const std::uint32_t bs = node_config_.preset.block_size;
  const std::uint32_t blocks = prompt_blocks(spec.rounds[round].input_tokens, bs);
  const std::uint32_t v = version(index, round);
  const bool tandem = config_.router == Router::kEppTandem;
  views_.resize(nodes_.size());
  for (std::size_t k = 0; k < nodes_.size(); ++k) {
    EndpointView& e = views_[k];
    e.load = nodes_[k].load();
    e.prefix_blocks = index_.match(k, session, v, blocks);
    e.tandem_blocks = tandem ? std::min(nodes_[k].tandem_hit(session) / bs, blocks) : 0;
  }
  const std::size_t pick = epp_pick(views_, blocks, tandem, rng_);
  // PreRequest: the prompt's blocks are recorded on the endpoint picked.
  index_.add(pick, session, v, blocks);
  return pick;
}

std::size_t Cluster::place(std::size_t index, SessionId session) {
  switch (config_.router) {
    case Router::kRoundRobin:
      return rr_next_++ % nodes_.size();
    case Router::kLeastQueue: {
      std::vector<NodeLoad> loads;
      loads.reserve(nodes_.size());
      for (const NodeSim& n : nodes_) loads.push_back(n.load());
      return least_queue_pick(loads);
    }
    case Router::kEpp:
    case Router::kEppTandem:
      return epp(index, session, 0);
  }
  return 0;
}

std::size_t Cluster::route_round(std::size_t node, std::size_t index, SessionId session, std::size_t round,
                                 Time /*now*/) {
  // round-robin and least-queue are sticky after the session's first round.
  if (config_.router == Router::kRoundRobin || config_.router == Router::kLeastQueue) return node;
  return epp(index, session, round);
}

base::Result<SimResult> Cluster::run() {
  if (config_.nodes == 0 || config_.nodes > kMaxNodes) {
    return base::make_error(
        EINVAL, "a cluster has 1 to " + std::to_string(kMaxNodes) + " nodes, not " + std::to_string(config_.nodes));
  }
  const std::size_t n = workload_.sessions.size();
  if (ideal_.size() != n) return base::make_error(EINVAL, "ideal times do not match the workload's sessions");
  nodes_.reserve(config_.nodes);
  for (std::uint32_t k = 0; k < config_.nodes; ++k) {
    nodes_.emplace_back(node_config_, k, this);
    if (auto r = nodes_.back().start(); !r) return std::unexpected(r.error());
  }
  versions_.resize(n);
  std::vector<SessionId> ids(n);
  std::unordered_set<SessionId> seen;
  for (std::size_t i = 0; i < n; ++i) {
    const SessionSpec& s = workload_.sessions[i];
    if (s.rounds.empty()) return base::make_error(EINVAL, "session '" + s.name + "' has no rounds");
    ids[i] = base::session_id(s.name + "#" + std::to_string(i));
    if (!seen.insert(ids[i]).second) {
      return base::make_error(EINVAL, "two sessions hash to the same id: '" + s.name + "'");
    }
    std::uint32_t v = 0;
    versions_[i].reserve(s.rounds.size());
    for (std::size_t r = 0; r < s.rounds.size(); ++r) {
      if (r > 0 && s.rounds[r].input_tokens < s.rounds[r - 1].input_tokens) ++v;
      versions_[i].push_back(v);
    }
  }
  // Arrivals in time order (the workload's order breaks ties, as on one node).
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // (The index makes the order total: std::sort then gives what
  // std::stable_sort would, which libstdc++ 12 builds on a deprecated API.)
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double ta = workload_.sessions[a].arrival_s;
    const double tb = workload_.sessions[b].arrival_s;
    return ta < tb || (ta == tb && a < b);
  });
  auto arrival_of = [&](std::size_t i) { return kSimEpoch + base::from_seconds(workload_.sessions[i].arrival_s); };

  SimResult out;
  out.sessions.resize(n);
  out.first_node.resize(n);
  std::size_t next = 0;
  std::size_t finished = 0;
  std::vector<bool> moved(n, false);
  std::uint64_t moves = 0;
  while (finished < n) {
    Time t = Time::max();
    if (next < n) t = arrival_of(order[next]);
    for (const NodeSim& node : nodes_) t = std::min(t, node.next_event());
    while (next < n && arrival_of(order[next]) <= t) {
      const std::size_t i = order[next++];
      SessionHandoff h;
      h.spec = &workload_.sessions[i];
      h.index = i;
      h.ideal_s = ideal_[i];
      h.arrival = arrival_of(i);
      const std::size_t k = place(i, ids[i]);
      out.first_node[i] = static_cast<std::uint32_t>(k);
      nodes_[k].accept(std::move(h), t);
    }
    for (std::size_t k = 0; k < nodes_.size(); ++k) {
      if (auto r = nodes_[k].advance_to(t); !r) {
        return base::propagate(r.error(), "node " + std::to_string(k));
      }
    }
    // Sessions moved at t arrive at their new node at t (the next pass runs them).
    for (NodeSim& node : nodes_) {
      for (SessionHandoff& h : node.take_moved()) {
        moved[h.index] = true;
        ++moves;
        const std::size_t to = h.target;
        nodes_[to].accept(std::move(h), t);
      }
      for (auto& [i, rec] : node.take_finished()) {
        out.sessions[i] = std::move(rec);
        ++finished;
      }
    }
    if (finished < n && next >= n &&
        std::all_of(nodes_.begin(), nodes_.end(), [](const NodeSim& node) { return node.live() == 0; })) {
      return base::make_error(EPROTO, std::to_string(n - finished) + " sessions were lost between nodes");
    }
  }
  // Engines and tool cores are summed (utilisations stay per resource).
  out.counters.engines = 0;
  out.counters.tool_cores = 0;
  for (std::size_t k = 0; k < nodes_.size(); ++k) {
    SimResult r = nodes_[k].finish();
    add_counters(out.counters, r.counters);
    out.engine_steps += r.engine_steps;
    out.violations += r.violations;
    if (out.first_violation.empty() && !r.first_violation.empty()) {
      out.first_violation = "node " + std::to_string(k) + ": " + r.first_violation;
    }
    out.rejected_events += r.rejected_events;
    out.actions += r.actions;
    out.virtual_s = std::max(out.virtual_s, r.virtual_s);
    out.tool_calls.insert(out.tool_calls.end(), r.tool_calls.begin(), r.tool_calls.end());
  }
  out.counters.nodes = config_.nodes;
  out.counters.moved_sessions = static_cast<std::uint64_t>(std::count(moved.begin(), moved.end(), true));
  out.counters.session_moves = moves;
  return out;
}

}  // namespace

std::span<const std::string_view> router_names() { return kRouterNames; }

std::string_view router_name(Router router) { return kRouterNames[static_cast<std::size_t>(router)]; }

base::Result<Router> parse_router(std::string_view name) {
  for (std::size_t i = 0; i < kRouterNames.size(); ++i) {
    if (kRouterNames[i] == name) return static_cast<Router>(i);
  }
  std::string valid;
  for (std::string_view r : kRouterNames) valid += (valid.empty() ? "" : ", ") + std::string(r);
  return base::make_error(EINVAL, "unknown router '" + std::string(name) + "' (valid: " + valid + ")");
}

std::vector<double> queue_scores(std::span<const std::uint32_t> waiting) {
  std::vector<double> out(waiting.size(), 1.0);
  if (waiting.empty()) return out;
  const auto [lo, hi] = std::minmax_element(waiting.begin(), waiting.end());
  if (*lo == *hi) return out;  // all equal: neutral
  for (std::size_t i = 0; i < waiting.size(); ++i) {
    out[i] = static_cast<double>(*hi - waiting[i]) / static_cast<double>(*hi - *lo);
  }
  return out;
}

double kv_score(double usage) { return std::clamp(1.0 - usage, 0.0, 1.0); }

double prefix_score(std::uint32_t matched_blocks, std::uint32_t total_blocks) {
  if (total_blocks == 0) return 0.0;
  return std::clamp(static_cast<double>(matched_blocks) / static_cast<double>(total_blocks), 0.0, 1.0);
}

std::uint32_t prompt_blocks(std::uint32_t prompt_tokens, std::uint32_t block_size) {
  if (block_size == 0) return 0;
  return std::min(prompt_tokens / block_size, kMaxPrefixBlocks);
}

std::size_t epp_pick(std::span<const EndpointView> nodes, std::uint32_t prompt_blocks, bool tandem,
                     std::mt19937_64& rng, std::vector<double>* scores) {
  std::vector<std::uint32_t> waiting;
  waiting.reserve(nodes.size());
  for (const EndpointView& e : nodes) waiting.push_back(e.load.waiting + (tandem ? e.load.held : 0));
  const std::vector<double> q = queue_scores(waiting);
  std::vector<double> total(nodes.size());
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    const EndpointView& e = nodes[k];
    const double usage = tandem ? std::max(e.load.kv_usage, e.load.cpu_pressure) : e.load.kv_usage;
    const std::uint32_t matched = tandem ? std::max(e.prefix_blocks, e.tandem_blocks) : e.prefix_blocks;
    total[k] = kQueueWeight * q[k] + kKvWeight * kv_score(usage) + kPrefixWeight * prefix_score(matched, prompt_blocks);
  }
  if (scores != nullptr) *scores = total;
  if (nodes.empty()) return 0;
  const double best = *std::max_element(total.begin(), total.end());
  std::vector<std::size_t> tied;
  for (std::size_t k = 0; k < total.size(); ++k) {
    if (total[k] == best) tied.push_back(k);
  }
  if (tied.size() == 1) return tied.front();
  // rng() % n, not uniform_int_distribution: the same draw under libstdc++ and libc++.
  return tied[rng() % tied.size()];
}

std::size_t least_queue_pick(std::span<const NodeLoad> nodes) {
  std::size_t best = 0;
  auto outstanding = [](const NodeLoad& l) { return std::uint64_t{l.waiting} + l.running + l.held; };
  for (std::size_t k = 1; k < nodes.size(); ++k) {
    if (outstanding(nodes[k]) < outstanding(nodes[best])) best = k;
  }
  return best;
}

PrefixIndex::PrefixIndex(std::vector<std::uint64_t> capacity_blocks) : nodes_(capacity_blocks.size()) {
  for (std::size_t k = 0; k < nodes_.size(); ++k) nodes_[k].capacity = capacity_blocks[k];
}

std::uint32_t PrefixIndex::match(std::size_t node, SessionId session, std::uint32_t version,
                                 std::uint32_t blocks) const {
  const Node& n = nodes_[node];
  auto it = n.entries.find(session);
  if (it == n.entries.end() || it->second.version != version) return 0;
  return std::min(it->second.blocks, blocks);
}

void PrefixIndex::add(std::size_t node, SessionId session, std::uint32_t version, std::uint32_t blocks) {
  Node& n = nodes_[node];
  if (auto it = n.entries.find(session); it != n.entries.end()) {
    n.used -= it->second.blocks;
    n.lru.erase(it->second.lru);
    n.entries.erase(it);
  }
  if (blocks == 0) return;  // a prompt without a full block hashes nothing
  n.lru.push_front(session);
  n.entries.emplace(session, Entry{version, blocks, n.lru.begin()});
  n.used += blocks;
  while (n.used > n.capacity && n.lru.size() > 1) {
    const SessionId victim = n.lru.back();
    n.lru.pop_back();
    auto it = n.entries.find(victim);
    n.used -= it->second.blocks;
    n.entries.erase(it);
  }
}

base::Result<SimResult> simulate_cluster(const Workload& workload, const SimConfig& node,
                                         std::span<const double> ideal_s, const ClusterConfig& cluster) {
  Cluster c(workload, node, ideal_s, cluster);
  return c.run();
}

}  // namespace tandem::sim
