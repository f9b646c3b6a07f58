// The node simulation loop: arrivals, engines, tools and the control policy.
#include "sim/node.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <optional>
#include <utility>

#include "base/ids.h"
#include "sched/apply.h"
#include "sched/registry.h"
#include "sim/cpu_pool.h"
#include "sim/host_memory.h"

namespace tandem::sim {
namespace {

using sched::Event;

// Virtual time starts at 1 s: sched/ reads Time{} as "never".
constexpr Time kEpoch = kSimEpoch;

// Host memory (docs/sim.md "Host memory"). A tool whose memory grows past its
// memory.high runs at kThrottleSpeed of its demand (the kernel sleeps it in
// a penalty that grows with the overage, up to 2 s per return to user space);
// with the node above kReclaimWatermark of its capacity every growing tool
// is in direct reclaim and runs at kReclaimSpeed. tandem's assumptions.
constexpr double kThrottleSpeed = 0.1;
constexpr double kReclaimSpeed = 0.5;
constexpr double kReclaimWatermark = 0.95;
constexpr std::size_t kRecentPeaks = 256;  // tool peaks behind HostMemoryView::tool_peak_p95_bytes

double to_s(Time t) { return base::to_seconds(t - kEpoch); }

}  // namespace

namespace detail {

struct SimSession {
  const SessionSpec* spec = nullptr;
  std::size_t index = 0;  // in the workload (the cluster's, on a node of one)
  SessionId id = 0;
  std::size_t round = 0;  // the round in flight or next to run
  double ideal_s = 0;     // T_ideal
  EngineId engine = 0;
  SessionContent content;
  bool admitted = false;
  bool paused = false;
  bool pending = false;  // its next round is ready but not runnable (waiting for admit or restore)
  bool done = false;     // finished here, or moved to another node
  bool moved = false;    // a cluster router moved it away
  Time arrival{};        // the session's arrival (its E2E starts here)
  Time arrive_at{};      // when it arrives at this node (its arrival, or the instant a router moved it here)
  Time ready{};          // when the pending or running round was submitted
  Time tool_start{};
  std::uint8_t priority = 0;
  std::uint32_t tool_call = 0;
  bool counted = false;  // its baseline is in host memory (admitted, not done)
  std::vector<double> ttft;
};

class Node final : public EngineHost, private sched::ActionSink {
 public:
  Node(const SimConfig& c, std::size_t node_index, RoundRouter* router)
      : config_(c), node_index_(node_index), router_(router), cpu_(c.tool_cores) {}

  // simulate(): the workload's sessions arrive at this node alone.
  base::Result<SimResult> run(const Workload& workload, std::span<const double> ideal);

  // The steppable form (NodeSim, docs/sim.md "Multi-node").
  base::Result<void> setup();
  Time next_event() const;
  base::Result<void> step();  // everything that happens at next_event()
  base::Result<void> advance_to(Time t) {
    while (next_event() <= t) {
      if (auto r = step(); !r) return r;
    }
    return {};
  }
  void accept(SessionHandoff h, Time now);
  std::vector<SessionHandoff> take_moved() { return std::exchange(outbox_, {}); }
  std::vector<std::pair<std::size_t, SessionRecord>> take_finished() { return std::exchange(records_, {}); }
  NodeLoad load() const;
  std::uint32_t tandem_hit(SessionId id) const;
  bool has(SessionId id) const {
    auto it = by_id_.find(id);
    return it != by_id_.end() && !sessions_[it->second].done;
  }
  std::size_t live() const { return live_; }
  std::uint64_t moved_out() const { return moved_out_; }
  SimResult finish();

  void first_token(EngineId engine, const RoundWork& work, Time now) override;
  void round_done(EngineId engine, const RoundWork& work, std::uint32_t blocks, std::uint32_t context,
                  Time now) override;
  void kv_changed(EngineId engine, SessionId session, sched::KvChange change, std::uint32_t blocks, Time now) override;

 private:
  void emit(const Event& e, Time now) {
    if (!model_.observe(e, now)) ++result_.rejected_events;
    control_->on_event(e, model_, now);
  }
  SimSession& session(SessionId id) { return sessions_[by_id_.at(id)]; }
  void set_pending(SimSession& s, bool on) {
    if (s.pending == on) return;
    s.pending = on;
    if (on) {
      ++held_;
    } else {
      --held_;
    }
  }
  void release(SimSession& s, std::size_t to, Time now);  // a router moved it to node `to`
  void arrive(SimSession& s, Time now);
  void round_ready(SimSession& s, Time now);  // the next round exists: submit or hold it
  void submit(SimSession& s, Time now);
  // start_wall_s: the wall seconds its start phase took (CpuPool::complete).
  void tool_done(SimSession& s, Time now, std::int32_t exit_code, double start_wall_s = 0);
  // A drawn peak times its scales, held at config_.tool_mem_cap_mib.
  double scaled_peak(double drawn, double scale) const;
  // A tool call's CPU: its start phase (config_.tool_start_s), then its body.
  void start_tool_cpu(std::uint64_t tool, std::uint64_t session, double demand, double nominal_s, Time now);
  void tick(Time now);
  // What the policy's actions do in the simulator (sched/apply.h applies
  // them, as in tandemd): its engines, its CPU pool, its tools.
  void admitted(const sched::Session& st, Time now) override;
  void paused(const sched::Session& st, Time now) override;
  void restored(const sched::Session& st, EngineId from, Time now) override;
  void priority(const sched::Session& st, std::int64_t level, Time now) override;
  void pinned(const sched::Session& st, Time until, Time now) override;
  void unpinned(const sched::Session& st, Time now) override;
  void dropped(const sched::Session& st, Time now) override;
  void offloaded(const sched::Session& st, Time now) override;
  void cpu_weight(const sched::Session& st, std::int64_t weight, Time now) override;
  void cpu_quota(const sched::Session& st, std::int64_t us_per_100ms, Time now) override;
  void kill_tools(const sched::Session& st, Time now) override;
  void sm_partition(EngineId /*engine*/, std::int64_t /*index*/, Time /*now*/) override {}  // no SM model
  EngineId route() const;                                                                   // engine for a new session
  std::string stuck_report() const;
  // Host memory (only with config_.tool_mem).
  struct HostTool {
    SessionId session = 0;
    std::string_view kind;
    double nominal_s = 0;
    double demand = 0;  // CPU cores
    std::uint64_t key = 0;
    std::uint32_t attempt = 0;
    std::uint32_t call = 0;
    double scale = 1;
    ToolMemDraw draw;
    double resident = 0;  // bytes now
    double progress = 0;  // nominal seconds done
    bool stalled = false;
    bool at_limit_v1 = false;  // memory_v1: waiting at its limit (under_oom)
    bool frozen = false;
    bool throttled = false;
    double limit = 0;      // memory.high the host rule set (0: none)
    bool waiting = false;  // killed, to be run again at retry_at
    Time retry_at{};
    std::optional<Time> stalled_since;
  };
  void start_host_tool(std::uint64_t tool, const SimSession& s, const RoundSpec& r, Time now);
  void host_step(Time now);
  void kill_host_tool(std::uint64_t tool, HostTool& t, Time now, bool oom);
  void count_baseline(SimSession& s, bool on);

  const SimConfig& config_;
  std::size_t node_index_ = 0;
  RoundRouter* router_ = nullptr;  // a cluster's; nullptr on a node alone
  CpuPool cpu_;
  sched::NodeModel model_;
  std::unique_ptr<sched::ControlPolicy> control_;
  std::vector<std::unique_ptr<sched::StepScheduler>> steps_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::unique_ptr<HostPool> host_pool_;
  std::vector<std::optional<Time>> step_end_;
  std::vector<std::optional<Time>> offload_done_;
  // A deque: engines and host copies point at a session's content, and
  // sessions moved in by a router are appended while others live.
  std::deque<SimSession> sessions_;
  std::unordered_map<SessionId, std::size_t> by_id_;
  std::vector<std::size_t> arrivals_;  // sessions_ indices in the order they arrive here
  std::size_t next_arrival_ = 0;
  std::size_t live_ = 0;    // arrived or to arrive, not finished or moved away
  std::uint32_t held_ = 0;  // sessions with a round held (pending)
  std::uint64_t moved_out_ = 0;
  std::vector<SessionHandoff> outbox_;
  std::vector<std::pair<std::size_t, SessionRecord>> records_;  // finished sessions by workload index
  Time now_ = kEpoch;
  Time next_tick_ = kEpoch;
  Duration period_{};
  Duration stall_{};
  std::vector<std::uint32_t> live_on_engine_;
  std::unordered_map<std::uint64_t, SessionId> tool_owner_;  // tool call id → session
  std::uint64_t next_tool_ = 1;
  std::size_t completed_ = 0;
  Time last_progress_{};
  SimResult result_;
  sched::Actions actions_;
  // Host memory.
  bool mem_on_ = false;
  double mem_capacity_ = 0;                       // bytes
  double baseline_ = 0;                           // bytes per counted session
  std::size_t counted_ = 0;                       // sessions whose baseline is resident
  std::map<std::uint64_t, HostTool> host_tools_;  // ordered: deterministic kill ties and rule order
  std::optional<sched::HostMemoryRule> rule_;
  HostPsi psi_;
  std::optional<Time> mem_last_;
  std::optional<Time> next_host_sample_;  // SimConfig::host_period_s: when the host plane samples next
  std::vector<double> recent_peaks_;
  std::size_t recent_next_ = 0;
  std::uint64_t mem_kills_total_ = 0;
};

base::Result<void> Node::setup() {
  if (auto v = validate(config_.preset); !v) return std::unexpected(v.error());
  if (config_.engines == 0) return base::make_error(EINVAL, "--engines must be at least 1");
  if (!(config_.tool_cores > 0) || !std::isfinite(config_.tool_cores)) {
    return base::make_error(EINVAL, "--tool-cores must be a positive number");
  }
  if (!(config_.tick_s > 0)) return base::make_error(EINVAL, "the control tick must be positive");
  for (std::uint32_t e = 0; e < config_.engines; ++e) {
    auto inst = sched::make_policy(config_.policy, config_.params);
    if (!inst) return std::unexpected(inst.error());
    if (e == 0) control_ = std::move(inst->control);
    steps_.push_back(std::move(inst->step));
  }
  result_.counters.engines = config_.engines;
  if (!(config_.host_kv_gib >= 0) || !std::isfinite(config_.host_kv_gib)) {
    return base::make_error(EINVAL, "--host-kv-gib must be a number >= 0");
  }
  std::uint64_t host_blocks = 0;  // unlimited
  if (config_.host_kv_gib > 0 && config_.preset.kv_bytes_per_token > 0) {
    const double block_bytes = static_cast<double>(config_.preset.kv_bytes_per_token) * config_.preset.block_size;
    host_blocks = std::max<std::uint64_t>(
        1, static_cast<std::uint64_t>(config_.host_kv_gib * config_.engines * 1073741824.0 / block_bytes));
  }
  host_pool_ = std::make_unique<HostPool>(host_blocks);
  result_.counters.tool_cores = static_cast<std::uint32_t>(std::ceil(config_.tool_cores));
  if (config_.tool_mem) {
    const double per_engine = config_.host_mem_gib > 0 ? config_.host_mem_gib : config_.preset.host_mem_gib;
    const double baseline_mib = config_.session_mem_mib >= 0 ? config_.session_mem_mib : config_.preset.session_mem_mib;
    if (!(per_engine > 0) || !std::isfinite(per_engine) || !(baseline_mib >= 0) || !std::isfinite(baseline_mib)) {
      return base::make_error(EINVAL, "host memory must be a positive number of GiB and the session baseline >= 0");
    }
    if (!(config_.retry_delay_s >= 0)) return base::make_error(EINVAL, "the retry delay must be >= 0");
    if (!(config_.host_period_s >= 0) || !std::isfinite(config_.host_period_s)) {
      return base::make_error(EINVAL, "the host plane's sampling period must be >= 0 seconds");
    }
    if (!(config_.psi_window_s > 0) || !std::isfinite(config_.psi_window_s)) {
      return base::make_error(EINVAL, "PSI's averaging window must be > 0 seconds");
    }
    psi_ = HostPsi(config_.psi_window_s);
    mem_on_ = true;
    mem_capacity_ = per_engine * config_.engines * 1073741824.0;
    baseline_ = baseline_mib * 1048576.0;
    result_.counters.host_memory = true;
    if (config_.host_rules == "all" || (config_.host_rules == "tandem" && config_.policy == "tandem")) {
      rule_.emplace(config_.host_rule_config);
    } else if (config_.host_rules != "none" && config_.host_rules != "tandem") {
      return base::make_error(EINVAL, "--host-rules must be tandem, all or none");
    }
  }
  for (std::uint32_t e = 0; e < config_.engines; ++e) {
    engines_.push_back(
        std::make_unique<Engine>(e, config_.preset, config_.limits, *steps_[e], *this, result_.counters));
    engines_.back()->set_host_pool(host_pool_.get());
    emit(sched::EngineJoined{e, engines_.back()->params()}, kEpoch);
  }
  step_end_.assign(config_.engines, std::nullopt);
  offload_done_.assign(config_.engines, std::nullopt);
  live_on_engine_.assign(config_.engines, 0);

  period_ = base::from_seconds(config_.tick_s);
  stall_ = base::from_seconds(config_.stall_s);
  last_progress_ = now_;
  return {};
}

base::Result<SimResult> Node::run(const Workload& workload, std::span<const double> ideal) {
  if (auto r = setup(); !r) return std::unexpected(r.error());
  if (ideal.size() != workload.sessions.size()) {
    return base::make_error(EINVAL, "ideal times do not match the workload's sessions");
  }
  sessions_.resize(workload.sessions.size());
  arrivals_.reserve(sessions_.size());
  for (std::size_t i = 0; i < sessions_.size(); ++i) {
    SimSession& s = sessions_[i];
    arrivals_.push_back(i);
    ++live_;
    s.spec = &workload.sessions[i];
    s.index = i;
    s.id = base::session_id(s.spec->name + "#" + std::to_string(i));
    s.arrival = kEpoch + base::from_seconds(s.spec->arrival_s);
    s.arrive_at = s.arrival;
    s.ideal_s = ideal[i];
    if (s.spec->rounds.empty()) return base::make_error(EINVAL, "session '" + s.spec->name + "' has no rounds");
    if (!by_id_.emplace(s.id, i).second) {
      return base::make_error(EINVAL, "two sessions hash to the same id: '" + s.spec->name + "'");
    }
    result_.counters.capped_rounds +=
        std::count_if(s.spec->rounds.begin(), s.spec->rounds.end(), [](const RoundSpec& r) { return r.capped; });
  }

  while (completed_ < sessions_.size()) {
    if (auto r = step(); !r) return std::unexpected(r.error());
  }
  SimResult out = finish();
  if (!records_.empty()) {
    out.sessions.resize(sessions_.size());
    for (auto& [index, rec] : records_) out.sessions[index] = std::move(rec);
  }
  return out;
}

Time Node::next_event() const {
  Time t = next_tick_;
  if (next_arrival_ < arrivals_.size()) t = std::min(t, sessions_[arrivals_[next_arrival_]].arrive_at);
  if (auto c = cpu_.next_completion()) t = std::min(t, *c);
  for (std::uint32_t e = 0; e < engines_.size(); ++e) {
    if (step_end_[e]) t = std::min(t, *step_end_[e]);
    if (offload_done_[e]) t = std::min(t, *offload_done_[e]);
  }
  return t;
}

base::Result<void> Node::step() {
  // The next instant anything happens.
  now_ = std::max(now_, next_event());
  const Time now = now_;

  for (std::uint32_t e = 0; e < engines_.size(); ++e) {
    if (step_end_[e] && *step_end_[e] <= now) {
      step_end_[e].reset();
      engines_[e]->finish_step(now);
    }
  }
  if (auto c = cpu_.next_completion(); c && *c <= now) {
    std::vector<double> start_walls;
    const std::vector<std::uint64_t> done = cpu_.complete(now, &start_walls);
    for (std::size_t i = 0; i < done.size(); ++i) {
      auto it = tool_owner_.find(done[i]);
      const SessionId sid = it->second;
      tool_owner_.erase(it);
      host_tools_.erase(done[i]);
      tool_done(session(sid), now, 0, start_walls[i]);
    }
    last_progress_ = now;
  }
  bool arrived = false;
  while (next_arrival_ < arrivals_.size() && sessions_[arrivals_[next_arrival_]].arrive_at <= now) {
    arrive(sessions_[arrivals_[next_arrival_++]], now);
    arrived = true;
    last_progress_ = now;
  }
  if (arrived || now >= next_tick_) {
    tick(now);
    if (now >= next_tick_) next_tick_ = now + period_;
  }
  for (std::uint32_t e = 0; e < engines_.size(); ++e) {
    offload_done_[e] = engines_[e]->complete_offloads(now);
    if (!step_end_[e]) step_end_[e] = engines_[e]->start_step(now);
  }
  // A node of a cluster may stand empty for as long as no session is routed to it.
  if (live_ > 0 && now - last_progress_ > stall_) {
    return base::make_error(EDEADLK,
                            "policy '" + config_.policy + "' made no progress for " + std::to_string(config_.stall_s) +
                                " s of virtual time at t = " + std::to_string(to_s(now)) + " s: " + stuck_report());
  }
  return {};
}

SimResult Node::finish() {
  const Time now = now_;
  for (auto& e : engines_) {
    e->account(now);
    e->check_conservation();
    result_.engine_steps += e->steps();
    result_.violations += e->violations();
    if (result_.first_violation.empty()) result_.first_violation = e->first_violation();
  }
  result_.counters.tool_cpu_core_s = cpu_.core_seconds();
  if (mem_on_) {
    host_step(now);
    result_.counters.mem_psi_some_s = psi_.some_total_s();
    result_.counters.mem_psi_full_s = psi_.full_total_s();
  }
  result_.counters.host_peak_blocks = host_pool_->peak_blocks();
  result_.virtual_s = to_s(now);
  if (result_.counters.computed_tokens != result_.counters.new_tokens + result_.counters.recomputed_tokens) {
    ++result_.violations;
    if (result_.first_violation.empty()) result_.first_violation = "computed tokens != new + recomputed";
  }
  return std::move(result_);
}

std::string Node::stuck_report() const {
  std::size_t waiting = 0, pending = 0, paused = 0;
  for (const SimSession& s : sessions_) {
    if (s.done) continue;
    waiting += !s.admitted;
    pending += s.pending;
    paused += s.paused;
  }
  std::string engines;
  for (const auto& e : engines_) {
    const sched::KvPoolStats k = e->stats();
    engines +=
        "; engine " + std::to_string(e->id()) + ": " + std::to_string(k.running_seqs) + " running, " +
        std::to_string(k.waiting_seqs) + " queued, " + std::to_string(k.blocks_free) + " of " +
        std::to_string(k.blocks_total) + " blocks free, " + std::to_string(k.blocks_pinned) + " pinned" +
        (e->violations() != 0 ? ", " + std::to_string(e->violations()) + " violations: " + e->first_violation() : "");
  }
  return std::to_string(live_) + " sessions unfinished (" + std::to_string(waiting) + " never admitted, " +
         std::to_string(pending) + " with a round held, " + std::to_string(paused) + " paused" + engines + ")";
}

EngineId Node::route() const {
  EngineId best = 0;
  for (EngineId e = 1; e < live_on_engine_.size(); ++e) {
    if (live_on_engine_[e] < live_on_engine_[best]) best = e;
  }
  return best;
}

void Node::arrive(SimSession& s, Time now) {
  s.engine = route();
  ++live_on_engine_[s.engine];
  // A session a router moved here opens with the rounds it has left.
  emit(sched::SessionOpened{s.id, 0, static_cast<std::uint32_t>(s.spec->rounds.size() - s.round)}, now);
  s.ready = now;
  round_ready(s, now);
}

}  // namespace detail

std::uint32_t shared_prefix(const SessionSpec& spec, std::size_t round) {
  if (round == 0) return 0;
  const RoundSpec& r = spec.rounds[round];
  const RoundSpec& prev = spec.rounds[round - 1];
  // The prompt extends the previous context unless the agent rewrote it.
  if (r.input_tokens < prev.input_tokens) return 0;
  return std::min(r.input_tokens, prev.input_tokens + std::max<std::uint32_t>(1, prev.output_tokens));
}

namespace detail {

void Node::round_ready(SimSession& s, Time now) {
  const RoundSpec& r = s.spec->rounds[s.round];
  const std::uint32_t bs = config_.preset.block_size;
  const std::uint32_t hit = engines_[s.engine]->prefix_hit(s.id, shared_prefix(*s.spec, s.round), s.content);
  emit(sched::RoundSubmitted{s.id, s.engine, static_cast<std::uint32_t>(s.round + 1), r.input_tokens, hit,
                             (r.input_tokens + r.output_tokens + bs - 1) / bs},
       now);
  s.ready = now;
  set_pending(s, true);
  if (s.admitted && !s.paused) submit(s, now);
}

void Node::submit(SimSession& s, Time now) {
  set_pending(s, false);
  const RoundSpec& r = s.spec->rounds[s.round];
  RoundWork w;
  w.session = s.id;
  w.round = static_cast<std::uint32_t>(s.round + 1);
  w.prompt_tokens = r.input_tokens;
  w.output_tokens = std::max<std::uint32_t>(1, r.output_tokens);
  w.shared_prefix = shared_prefix(*s.spec, s.round);
  w.last_round = s.round + 1 == s.spec->rounds.size();
  w.tool = r.tool.empty() ? 0 : base::tool_kind_id(r.tool);
  w.priority = s.priority;
  w.submitted = s.ready;
  w.content = &s.content;
  engines_[s.engine]->submit(w, now);
}

void Node::first_token(EngineId engine, const RoundWork& work, Time now) {
  SimSession& s = session(work.session);
  s.ttft.push_back(base::to_seconds(now - work.submitted));
  emit(sched::RoundFirstToken{work.session, engine, work.round, Duration{}, now - work.submitted}, now);
}

void Node::round_done(EngineId engine, const RoundWork& work, std::uint32_t blocks, std::uint32_t /*context*/,
                      Time now) {
  SimSession& s = session(work.session);
  const RoundSpec& r = s.spec->rounds[s.round];
  last_progress_ = now;
  emit(sched::RoundEnded{s.id, engine, work.round, work.output_tokens, blocks, !work.last_round}, now);
  if (work.last_round) {
    s.done = true;
    ++completed_;
    --live_;
    --live_on_engine_[s.engine];
    SessionRecord rec;
    rec.arrival_s = to_s(s.arrival);
    rec.finish_s = to_s(now);
    rec.ideal_s = s.ideal_s;
    rec.rounds = static_cast<std::uint32_t>(s.spec->rounds.size());
    rec.ttft_s = std::move(s.ttft);
    records_.emplace_back(s.index, std::move(rec));
    count_baseline(s, false);
    emit(sched::SessionClosed{s.id}, now);
    for (auto& e : engines_) e->end_session(s.id, now);
    for (auto& st : steps_) st->on_session_end(s.id, now);
    cpu_.forget_group(s.id);
    model_.sessions().reap_done();
    return;
  }
  ++s.tool_call;
  const sched::ToolKind kind = base::tool_kind_id(r.tool);
  emit(sched::ToolStarted{s.id, kind, s.tool_call}, now);
  s.tool_start = now;
  const std::uint64_t tool = next_tool_++;
  tool_owner_.emplace(tool, s.id);
  start_tool_cpu(tool, s.id, config_.tool_cpu.demand(r.tool), r.tool_seconds, now);
  if (mem_on_) start_host_tool(tool, s, r, now);
}

double Node::scaled_peak(double drawn, double scale) const {
  return capped_peak(drawn * scale, config_.tool_mem_cap_mib);
}

void Node::start_tool_cpu(std::uint64_t tool, std::uint64_t session, double demand, double nominal_s, Time now) {
  const double start = config_.tool_start_extra ? config_.tool_start_s : std::min(config_.tool_start_s, nominal_s);
  cpu_.start(tool, session, demand, config_.tool_start_extra ? nominal_s : nominal_s - start, now, start);
}

void Node::tool_done(SimSession& s, Time now, std::int32_t exit_code, double start_wall_s) {
  const RoundSpec& r = s.spec->rounds[s.round];
  const Duration wall = now - s.tool_start;
  const sched::ToolKind kind = base::tool_kind_id(r.tool);
  emit(sched::ToolEnded{s.id, kind, s.tool_call, exit_code, wall, Duration{}}, now);
  for (auto& st : steps_) st->on_tool_end(s.id, kind, wall, now);
  ++result_.counters.tool_calls;
  // Stretch is the call's run over its nominal time. A start phase on top of
  // that time (the replay's stand-in tool) is not part of its run: the live
  // replay times its tool from main() on.
  const double run_s = base::to_seconds(wall) - (config_.tool_start_extra ? start_wall_s : 0.0);
  if (r.tool_seconds > 0) {
    result_.counters.tool_stretch_sum += run_s / r.tool_seconds;
    ++result_.counters.tool_stretch_calls;
  }
  result_.tool_calls.push_back({r.tool_seconds, run_s});
  ++s.round;
  // In a cluster the router picks the node of every round (most keep it).
  if (router_ != nullptr) {
    const std::size_t to = router_->route_round(node_index_, s.index, s.id, s.round, now);
    if (to != node_index_) {
      release(s, to, now);
      return;
    }
  }
  round_ready(s, now);
}

void Node::release(SimSession& s, std::size_t to, Time now) {
  SessionHandoff h;
  h.spec = s.spec;
  h.index = s.index;
  h.ideal_s = s.ideal_s;
  h.arrival = s.arrival;
  h.round = s.round;
  // What it computed here stays computed once: computing it again on the
  // new node counts as recomputed, as after any loss of its KV.
  h.computed_high = s.content.computed_high;
  h.tool_call = s.tool_call;
  h.ttft_s = std::move(s.ttft);
  h.target = to;
  s.done = true;  // here: no more events for it
  s.moved = true;
  --live_;
  --live_on_engine_[s.engine];
  ++moved_out_;
  count_baseline(s, false);
  emit(sched::SessionClosed{s.id}, now);
  // Its KV here is released: the cache, pins and host copy.
  for (auto& e : engines_) {
    e->drop(s.id, now);
    e->end_session(s.id, now);
  }
  for (auto& st : steps_) st->on_session_end(s.id, now);
  cpu_.forget_group(s.id);
  model_.sessions().reap_done();
  outbox_.push_back(std::move(h));
}

void Node::accept(SessionHandoff h, Time now) {
  const SessionId id = base::session_id(h.spec->name + "#" + std::to_string(h.index));
  std::size_t i = sessions_.size();
  if (auto it = by_id_.find(id); it != by_id_.end()) {
    i = it->second;  // it was here before and moved away: a fresh start
  } else {
    sessions_.emplace_back();
    by_id_.emplace(id, i);
  }
  SimSession& s = sessions_[i];
  s = SimSession{};
  s.spec = h.spec;
  s.index = h.index;
  s.id = id;
  s.round = h.round;
  s.ideal_s = h.ideal_s;
  s.arrival = h.arrival;
  s.arrive_at = now;
  s.content.computed_high = h.computed_high;
  s.tool_call = h.tool_call;
  s.ttft = std::move(h.ttft_s);
  if (h.round == 0) {
    result_.counters.capped_rounds +=
        std::count_if(s.spec->rounds.begin(), s.spec->rounds.end(), [](const RoundSpec& r) { return r.capped; });
  }
  arrivals_.push_back(i);
  ++live_;
}

NodeLoad Node::load() const {
  NodeLoad l;
  std::uint64_t free = 0;
  std::uint64_t total = 0;
  for (const auto& e : engines_) {
    const sched::KvPoolStats k = e->stats();
    l.waiting += k.waiting_seqs;
    l.running += k.running_seqs;
    free += k.blocks_free;
    total += k.blocks_total;
  }
  l.held = held_;
  // Arrived here but not yet opened (moved in this instant) count as held.
  l.held += static_cast<std::uint32_t>(arrivals_.size() - next_arrival_);
  l.kv_blocks = total;
  l.kv_usage = total == 0 ? 0.0 : 1.0 - static_cast<double>(free) / static_cast<double>(total);
  l.cpu_pressure = cpu_.pressure_avg10();
  return l;
}

std::uint32_t Node::tandem_hit(SessionId id) const {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return 0;
  const SimSession& s = sessions_[it->second];
  if (s.done || s.spec == nullptr || s.round >= s.spec->rounds.size()) return 0;
  const sched::Session* st = model_.sessions().find(id);
  if (st == nullptr || (st->residency != sched::Residency::kPinned && st->residency != sched::Residency::kOffloaded)) {
    return 0;
  }
  return engines_[s.engine]->prefix_hit(id, shared_prefix(*s.spec, s.round), s.content);
}

void Node::kv_changed(EngineId engine, SessionId session, sched::KvChange change, std::uint32_t blocks, Time now) {
  if (!by_id_.contains(session) || sessions_[by_id_.at(session)].done) return;
  emit(sched::KvChanged{session, engine, change, blocks}, now);
}

void Node::tick(Time now) {
  if (mem_on_) host_step(now);
  for (auto& e : engines_) emit(sched::KvStatsReported{e->id(), e->stats(now)}, now);
  sched::CpuView cpu;
  cpu.tool_cores = static_cast<std::uint32_t>(std::ceil(config_.tool_cores));
  cpu.psi_some_avg10 = cpu_.pressure_avg10();
  model_.set_cpu(cpu);
  actions_.clear();
  control_->tick(model_, now, actions_);
  result_.actions += actions_.list().size();
  for (const sched::Action& a : actions_.list()) sched::apply(a, model_.sessions(), *this, now);
}

void Node::admitted(const sched::Session& st, Time now) {
  SimSession& s = session(st.id);
  s.admitted = true;
  count_baseline(s, true);
  if (s.pending && !s.paused) submit(s, now);
}

void Node::paused(const sched::Session& st, Time /*now*/) { session(st.id).paused = true; }

void Node::restored(const sched::Session& st, EngineId /*from*/, Time now) {
  SimSession& s = session(st.id);
  s.paused = false;
  s.admitted = true;
  count_baseline(s, true);
  if (st.engine < engines_.size() && st.engine != s.engine) {
    --live_on_engine_[s.engine];
    s.engine = st.engine;
    ++live_on_engine_[s.engine];
  }
  if (s.pending) submit(s, now);
}

void Node::priority(const sched::Session& st, std::int64_t level, Time /*now*/) {
  session(st.id).priority = static_cast<std::uint8_t>(std::clamp<std::int64_t>(level, 0, 255));
}

void Node::pinned(const sched::Session& st, Time until, Time now) {
  for (auto& e : engines_) e->pin(st.id, until, now);
}

void Node::unpinned(const sched::Session& st, Time now) {
  for (auto& e : engines_) e->unpin(st.id, now);
}

void Node::dropped(const sched::Session& st, Time now) {
  for (auto& e : engines_) e->drop(st.id, now);
}

void Node::offloaded(const sched::Session& st, Time now) {
  for (auto& e : engines_) e->offload(st.id, now);
}

void Node::cpu_weight(const sched::Session& st, std::int64_t weight, Time now) {
  cpu_.set_weight(st.id, static_cast<double>(weight), now);
}

void Node::cpu_quota(const sched::Session& st, std::int64_t us_per_100ms, Time now) {
  cpu_.set_quota(st.id, static_cast<double>(us_per_100ms) / 1e5, now);
}

void Node::kill_tools(const sched::Session& st, Time now) {
  SimSession& s = session(st.id);
  for (auto& [tool, owner] : tool_owner_) {
    if (owner != s.id) continue;
    const std::uint64_t id = tool;
    tool_owner_.erase(id);
    cpu_.stop(id, now);
    host_tools_.erase(id);
    tool_done(s, now, 137);
    break;
  }
}

void Node::count_baseline(SimSession& s, bool on) {
  if (s.counted == on) return;
  s.counted = on;
  if (on) {
    ++counted_;
  } else {
    --counted_;
  }
}

void Node::start_host_tool(std::uint64_t tool, const SimSession& s, const RoundSpec& r, Time now) {
  HostTool t;
  t.session = s.id;
  t.kind = r.tool;
  t.nominal_s = r.tool_seconds;
  t.demand = config_.tool_cpu.demand(r.tool);
  // The same demand under every policy: keyed by the session and the call.
  t.key = mix64(s.id ^ mix64(static_cast<std::uint64_t>(s.round) + 1));
  t.call = s.tool_call;
  t.scale = s.spec->mem_scale * config_.tool_mem_scale;
  t.draw = config_.tool_mem_table.draw(r.tool, mix64(t.key), r.tool_seconds);
  t.draw.peak_bytes = scaled_peak(t.draw.peak_bytes, t.scale);
  if (recent_peaks_.size() < kRecentPeaks) {
    recent_peaks_.push_back(t.draw.peak_bytes);
  } else {
    recent_peaks_[recent_next_] = t.draw.peak_bytes;
    recent_next_ = (recent_next_ + 1) % kRecentPeaks;
  }
  host_tools_.emplace(tool, t);
  (void)now;
}

void Node::kill_host_tool(std::uint64_t tool, HostTool& t, Time now, bool oom) {
  result_.counters.rerun_tool_s += t.progress;
  ++(oom ? result_.counters.oom_kills : result_.counters.memory_kills);
  ++mem_kills_total_;
  cpu_.stop(tool, now);
  t.waiting = true;
  t.retry_at = now + base::from_seconds(config_.retry_delay_s);
  t.resident = 0;
  t.progress = 0;
  t.stalled = t.frozen = t.throttled = t.at_limit_v1 = false;
  t.limit = 0;
  t.stalled_since.reset();
}

void Node::host_step(Time now) {
  // The interval since the last step, in the state it had.
  const double dt = mem_last_ ? base::to_seconds(now - *mem_last_) : 0.0;
  mem_last_ = now;
  if (dt > 0) {
    std::size_t stalled = 0, active = 0;
    for (const auto& [id, t] : host_tools_) {
      if (t.waiting) continue;
      if (t.frozen) {
        result_.counters.frozen_s += dt;
      } else {
        ++active;
      }
      if (t.stalled && !t.frozen) {
        if (!t.at_limit_v1) ++stalled;  // the kernel's PSI does not count a wait at a v1 limit
        result_.counters.throttled_s += dt;
      }
      if (t.stalled || t.frozen) {
        const sched::Session* ss = model_.sessions().find(t.session);
        if (ss != nullptr && ss->residency == sched::Residency::kPinned) {
          result_.counters.stranded_block_s += dt * ss->blocks_held;
        }
      }
    }
    psi_.advance(dt, stalled, active);
  }

  // Memory now; retries whose delay is over run again from the start.
  const double baselines = baseline_ * static_cast<double>(counted_);
  double tools = 0;
  for (auto& [id, t] : host_tools_) {
    if (t.waiting && t.retry_at <= now) {
      ++t.attempt;
      t.draw = config_.tool_mem_table.draw(t.kind, mix64(t.key + t.attempt), t.nominal_s);
      t.draw.peak_bytes = scaled_peak(t.draw.peak_bytes, t.scale);
      t.waiting = false;
      start_tool_cpu(id, t.session, t.demand, t.nominal_s, now);
    }
    if (t.waiting) continue;
    t.progress = cpu_.progress(id, now);
    t.resident = tool_memory_at(t.draw, t.progress);
    tools += t.resident;
  }
  // Over capacity: the kernel's OOM killer takes the largest tool (its
  // badness is its resident memory), until the rest fits.
  while (baselines + tools > mem_capacity_) {
    auto victim = host_tools_.end();
    for (auto it = host_tools_.begin(); it != host_tools_.end(); ++it) {
      if (it->second.waiting || it->second.resident <= 0) continue;
      if (victim == host_tools_.end() || it->second.resident > victim->second.resident) victim = it;
    }
    if (victim == host_tools_.end()) break;
    const double peak = victim->second.draw.peak_bytes;
    if (peak > mem_capacity_) {
      ++result_.counters.oom_kills_over_host;
    } else if (peak > mem_capacity_ - baselines) {
      ++result_.counters.oom_kills_over_room;
    }
    tools -= victim->second.resident;
    kill_host_tool(victim->first, victim->second, now, true);
  }
  result_.counters.host_mem_peak_bytes = std::max(result_.counters.host_mem_peak_bytes, baselines + tools);

  // The host plane samples once a period (every tick when it is 0): the
  // rules decide and the policy's view is refreshed only then.
  const bool sample = !next_host_sample_ || now >= *next_host_sample_;
  if (sample) next_host_sample_ = now + base::from_seconds(config_.host_period_s);

  // tandemd's host-plane rules (sched/host_memory.h), where this policy has them.
  if (rule_ && sample) {
    std::vector<sched::MemoryCall> calls;
    std::vector<std::uint64_t> ids;
    for (auto& [id, t] : host_tools_) {
      if (t.waiting) continue;
      sched::MemoryCall c;
      c.session = t.session;
      c.call = t.call;
      c.memory_bytes = static_cast<std::uint64_t>(t.resident);
      // The daemon's per-call stall is v1's under_oom: on v2 it reads none,
      // and the stall kill never fires.
      c.stalled = t.at_limit_v1;
      c.frozen = t.frozen;
      const sched::Session* ss = model_.sessions().find(t.session);
      c.priority_class = ss != nullptr ? ss->priority_class : 0;
      c.protected_session = ss != nullptr && ss->residency == sched::Residency::kPinned;
      c.stalled_since = t.stalled_since;
      calls.push_back(c);
      ids.push_back(id);
    }
    const double budget =
        config_.tools_budget_mib > 0 ? config_.tools_budget_mib * 1048576.0 : std::max(0.0, mem_capacity_ - baselines);
    rule_->set_tools_budget(static_cast<std::uint64_t>(budget));
    std::vector<sched::MemoryVerdict> verdicts;
    rule_->decide(now, psi_.some_avg10(), static_cast<std::uint64_t>(tools), calls, verdicts);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      HostTool& t = host_tools_.at(ids[i]);
      t.stalled_since = calls[i].stalled_since;
      const sched::MemoryVerdict& v = verdicts[i];
      if (v.kill) {
        kill_host_tool(ids[i], t, now, false);
        continue;
      }
      if (v.throttle != t.throttled) {
        t.throttled = v.throttle;
        t.limit = v.throttle ? static_cast<double>(v.hold_bytes) : 0.0;
        if (v.throttle) ++result_.counters.throttles;
      }
      if (v.freeze != t.frozen) {
        t.frozen = v.freeze;
        if (v.freeze) ++result_.counters.freezes;
      }
    }
  }

  // Who stalls until the next step, and how fast everyone runs.
  const bool reclaim = baselines + tools >= kReclaimWatermark * mem_capacity_;
  for (auto& [id, t] : host_tools_) {
    if (t.waiting) continue;
    const bool growing = tool_memory_growing(t.draw, t.progress);
    const bool at_high = t.limit > 0 && t.resident >= t.limit;
    t.stalled = growing && (at_high || reclaim);
    t.at_limit_v1 = config_.memory_v1 && growing && at_high;
    const double speed = t.frozen || t.at_limit_v1 ? 0.0 : !t.stalled ? 1.0 : at_high ? kThrottleSpeed : kReclaimSpeed;
    cpu_.set_speed(id, speed, now);
  }

  if (!sample) return;
  sched::HostMemoryView view;
  view.capacity_bytes = static_cast<std::uint64_t>(mem_capacity_);
  view.used_bytes = static_cast<std::uint64_t>(baselines + tools);
  view.session_baseline_bytes = static_cast<std::uint64_t>(baseline_);
  if (!recent_peaks_.empty()) {
    std::vector<double> peaks = recent_peaks_;
    const auto k = static_cast<std::size_t>(0.95 * static_cast<double>(peaks.size() - 1));
    std::nth_element(peaks.begin(), peaks.begin() + static_cast<std::ptrdiff_t>(k), peaks.end());
    view.tool_peak_p95_bytes = static_cast<std::uint64_t>(peaks[k]);
  }
  view.psi_some_avg10 = psi_.some_avg10();
  view.kills = mem_kills_total_;
  model_.set_host_memory(view);
}

}  // namespace detail

base::Result<SimResult> simulate(const Workload& workload, const SimConfig& config, std::span<const double> ideal_s) {
  detail::Node node(config, 0, nullptr);
  return node.run(workload, ideal_s);
}

NodeSim::NodeSim(const SimConfig& config, std::size_t node_index, RoundRouter* router)
    : impl_(std::make_unique<detail::Node>(config, node_index, router)) {}
NodeSim::~NodeSim() = default;
NodeSim::NodeSim(NodeSim&&) noexcept = default;
NodeSim& NodeSim::operator=(NodeSim&&) noexcept = default;
base::Result<void> NodeSim::start() { return impl_->setup(); }
Time NodeSim::next_event() const { return impl_->next_event(); }
base::Result<void> NodeSim::advance_to(Time t) { return impl_->advance_to(t); }
void NodeSim::accept(SessionHandoff session, Time now) { impl_->accept(std::move(session), now); }
std::vector<SessionHandoff> NodeSim::take_moved() { return impl_->take_moved(); }
std::vector<std::pair<std::size_t, SessionRecord>> NodeSim::take_finished() { return impl_->take_finished(); }
NodeLoad NodeSim::load() const { return impl_->load(); }
std::uint32_t NodeSim::tandem_hit(SessionId session) const { return impl_->tandem_hit(session); }
bool NodeSim::has(SessionId session) const { return impl_->has(session); }
std::size_t NodeSim::live() const { return impl_->live(); }
std::uint64_t NodeSim::moved_out() const { return impl_->moved_out(); }
SimResult NodeSim::finish() { return impl_->finish(); }

std::vector<double> ideal_times(const Workload& workload, const SimConfig& config) {
  const Preset& p = config.preset;
  const StepTimeModel& m = p.step;
  const std::uint32_t bs = p.block_size;
  const std::uint32_t budget = config.limits.token_budget;
  // Steps are rounded to whole nanoseconds, as the engine does.
  auto step_s = [&](const StepShape& shape) { return std::llround(m.step_us(shape) * 1e3) * 1e-9; };
  std::vector<double> out;
  out.reserve(workload.sessions.size());
  for (const SessionSpec& s : workload.sessions) {
    double t = 0;
    std::uint32_t cached_blocks = 0;
    for (std::size_t i = 0; i < s.rounds.size(); ++i) {
      const RoundSpec& r = s.rounds[i];
      const std::uint32_t prompt = r.input_tokens;
      const std::uint32_t output = std::max<std::uint32_t>(1, r.output_tokens);
      const std::uint32_t keep = std::min(cached_blocks, shared_prefix(s, i) / bs);
      std::uint32_t start = std::min(keep * bs, prompt);
      if (start >= prompt) start = prompt - 1;
      while (start < prompt) {
        const std::uint32_t c = std::min(budget, prompt - start);
        StepShape shape;
        shape.tokens = c;
        shape.prefill_pairs = c * (start + c / 2.0);
        shape.seqs = 1;
        t += step_s(shape);
        start += c;
      }
      for (std::uint32_t j = 1; j < output; ++j) {
        StepShape shape;
        shape.tokens = 1;
        shape.decode_context = prompt + j;
        shape.seqs = 1;
        t += step_s(shape);
      }
      cached_blocks = (prompt + output - 1) / bs;
      t += r.tool.empty() ? 0.0 : r.tool_seconds;
    }
    out.push_back(t);
  }
  return out;
}

}  // namespace tandem::sim
