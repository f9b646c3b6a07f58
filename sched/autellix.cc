// Autellix PLAS step scheduler (see autellix.h for the algorithm and sources).
#include "sched/autellix.h"

#include <algorithm>
#include <tuple>

namespace tandem::sched {

AutellixParams autellix_params(const PolicyParams& p) {
  AutellixParams a;
  auto tokens = [&](std::string_view name) { return static_cast<std::uint64_t>(p.get(name)); };
  // Thresholds must ascend; a smaller later one is raised to the one before,
  // which makes that queue unreachable by arrival (only by demotion).
  a.service_threshold[0] = tokens("q1_service");
  a.service_threshold[1] = std::max(a.service_threshold[0], tokens("q2_service"));
  a.service_threshold[2] = std::max(a.service_threshold[1], tokens("q3_service"));
  a.quantum[0] = static_cast<std::uint32_t>(p.get("quantum0"));
  a.quantum[1] = static_cast<std::uint32_t>(p.get("quantum1"));
  a.quantum[2] = static_cast<std::uint32_t>(p.get("quantum2"));
  a.quantum[3] = static_cast<std::uint32_t>(p.get("quantum3"));
  a.beta = p.get("beta");
  a.swap_preempt = p.flag("swap_preempt");
  a.reserve_prompt = p.flag("reserve_prompt");
  return a;
}

std::unique_ptr<StepScheduler> make_autellix_step(const PolicyParams& p) {
  return std::make_unique<AutellixStepScheduler>(autellix_params(p));
}

int AutellixStepScheduler::queue_for_service(std::uint64_t service) const {
  for (int q = 0; q < AutellixParams::kQueues - 1; ++q) {
    if (service < params_.service_threshold[q]) return q;
  }
  return AutellixParams::kQueues - 1;
}

std::uint32_t AutellixStepScheduler::quantum_for(int queue, std::uint32_t token_budget) const {
  // As in the repo, a quantum never exceeds what one step can schedule.
  return std::max<std::uint32_t>(1, std::min(params_.quantum[queue], token_budget));
}

int AutellixStepScheduler::queue_of(std::uint64_t request_id) const {
  auto it = reqs_.find(request_id);
  return it == reqs_.end() ? -1 : it->second.queue;
}

std::uint64_t AutellixStepScheduler::program_service(SessionId session) const {
  auto it = programs_.find(session);
  return it == programs_.end() ? 0 : it->second.service;
}

void AutellixStepScheduler::on_session_end(SessionId session, Time /*now*/) { programs_.erase(session); }

void AutellixStepScheduler::plan(const StepInput& in, Time /*now*/, StepPlan& out) {
  ++generation_;
  const auto n_req = static_cast<std::uint32_t>(in.requests.size());

  // New requests enter the queue of their program's service so far; requests
  // are seen in arrival order, so FIFO order inside a queue is arrival order.
  // req_of_[i] is request i's state for the rest of the step: the map's
  // nodes stay put, and only requests this step does not hold are erased.
  req_of_.resize(n_req);
  for (std::uint32_t i = 0; i < n_req; ++i) {
    const StepRequest& r = in.requests[i];
    auto [it, inserted] = reqs_.try_emplace(r.id);
    Req& st = it->second;
    req_of_[i] = &st;
    if (inserted) {
      st.session = r.session;
      st.service_at_arrival = programs_[r.session].service;
      st.queue = queue_for_service(st.service_at_arrival);
      st.quanta_left = quantum_for(st.queue, in.token_budget);
      st.seq = next_back_seq_++;
    }
    st.seen = generation_;
  }
  // Requests that left the engine (finished) hand their wait to the program.
  std::erase_if(reqs_, [&](const auto& kv) {
    if (kv.second.seen == generation_) return false;
    if (auto p = programs_.find(kv.second.session); p != programs_.end()) p->second.wait += kv.second.wait;
    return true;
  });

  // Anti-starvation (before ordering, as the repo does it at the top of the step).
  for (std::uint32_t i = 0; i < n_req; ++i) {
    const StepRequest& r = in.requests[i];
    Req& st = *req_of_[i];
    if (st.queue == 0) continue;
    const std::uint64_t service = st.service_at_arrival + st.service;
    if (service == 0) continue;
    auto p = programs_.find(r.session);
    const std::uint64_t wait = (p == programs_.end() ? 0 : p->second.wait) + st.wait;
    if (static_cast<double>(wait) / static_cast<double>(service) < params_.beta) continue;
    st.queue = 0;
    st.quanta_left = quantum_for(0, in.token_budget);
    st.wait = 0;
    st.service = 0;
    if (r.phase != RequestPhase::kRunning) st.seq = next_back_seq_++;  // re-added at Q0's tail
  }

  // Running requests in (queue, arrival) order; ties keep input order. (The
  // index makes the order total, so std::sort gives what std::stable_sort
  // would, without libstdc++ 12's temporary buffer, which clang 19 rejects
  // as deprecated in C++23.)
  running_.clear();
  for (std::uint32_t i = 0; i < n_req; ++i) {
    if (in.requests[i].phase == RequestPhase::kRunning) running_.push_back(i);
  }
  std::sort(running_.begin(), running_.end(), [&](std::uint32_t a, std::uint32_t b) {
    return std::tuple(req_of_[a]->queue, in.requests[a].arrival, a) <
           std::tuple(req_of_[b]->queue, in.requests[b].arrival, b);
  });

  ChunkLedger plan(in);
  std::vector<std::uint32_t> cap_of_chunk(n_req, 0);  // the quantum cap each chunk ran under
  auto cap_of = [&](Req& st) {
    if (st.quanta_left == 0) st.quanta_left = quantum_for(st.queue, in.token_budget);
    return std::min(st.quanta_left, in.token_budget);
  };
  auto victim_key = [&](std::uint32_t idx) {
    const StepRequest& r = in.requests[idx];
    return std::tuple(req_of_[idx]->queue, plan.kv().blocks_for(std::min(r.computed_tokens, in.max_model_len)),
                      r.arrival);
  };

  bool preempted = false;
  for (std::size_t pos = 0; pos < running_.size() && plan.budget() > 0; ++pos) {
    const std::uint32_t idx = running_[pos];
    const StepRequest& r = in.requests[idx];
    const std::uint32_t cap = cap_of(*req_of_[idx]);
    const std::uint32_t n = std::min({r.tokens_wanted(), plan.budget(), cap});
    bool preempted_self = false;
    while (true) {
      if (plan.try_schedule(r, idx, n)) break;
      // Lowest queue, then largest footprint, then latest arrival pays; the
      // first of equals in running order.
      std::size_t vpos = 0;
      for (std::size_t k = 1; k < running_.size(); ++k) {
        if (victim_key(running_[k]) > victim_key(running_[vpos])) vpos = k;
      }
      const std::uint32_t victim = running_[vpos];
      plan.preempt(in.requests[victim], victim);  // a chunk already scheduled this step comes back too
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(vpos));
      if (vpos < pos) --pos;
      (params_.swap_preempt ? out.swap : out.preempt).push_back(victim);
      req_of_[victim]->seq = next_front_seq_--;  // head of its queue
      preempted = true;
      if (victim == idx) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;
    cap_of_chunk[idx] = cap;
  }

  if (!preempted) {
    waiting_.clear();
    for (std::uint32_t i = 0; i < n_req; ++i) {
      if (in.requests[i].phase != RequestPhase::kRunning) waiting_.push_back(i);
    }
    std::sort(waiting_.begin(), waiting_.end(), [&](std::uint32_t a, std::uint32_t b) {
      const Req& x = *req_of_[a];
      const Req& y = *req_of_[b];
      return std::tuple(x.queue, x.seq) < std::tuple(y.queue, y.seq);
    });
    auto seats = static_cast<std::uint32_t>(running_.size());
    // Blocks the batch's prompts still need beyond what they hold after this
    // step's chunks (reserve_prompt: vLLM 0.6.1 holds them from admission).
    auto prompt_left = [&](const StepRequest& r, std::uint32_t index) -> std::uint64_t {
      const std::uint32_t whole = plan.kv().blocks_for(std::min(r.prompt_tokens, in.max_model_len));
      const std::uint32_t after = std::max(r.blocks_held, plan.kv().blocks_for(r.start_tokens() + plan.tokens(index)));
      return whole > after ? whole - after : 0;
    };
    std::uint64_t reserved = 0;
    if (params_.reserve_prompt) {
      for (std::uint32_t idx : running_) reserved += prompt_left(in.requests[idx], idx);
    }
    for (std::uint32_t idx : waiting_) {
      if (plan.budget() == 0 || seats >= in.max_seqs) break;
      const StepRequest& r = in.requests[idx];
      const std::uint32_t cap = cap_of(*req_of_[idx]);
      const std::uint32_t n = std::min({r.tokens_wanted(), plan.budget(), cap});
      if (params_.reserve_prompt && seats > 0) {
        const std::uint64_t whole =
            plan.kv().blocks_needed(r, r.prompt_tokens > r.start_tokens() ? r.prompt_tokens - r.start_tokens() : n);
        if (reserved + whole > plan.kv().free_blocks()) break;  // the whole prompt does not fit
      }
      if (!plan.try_schedule(r, idx, n)) break;  // head-of-line blocking
      if (params_.reserve_prompt) reserved += prompt_left(r, idx);
      cap_of_chunk[idx] = cap;
      ++seats;
    }
  }

  plan.emit(out.run);

  // Accounting on the chunks that stay in the plan (the repo also counts
  // chunks that a later preemption took back; we do not).
  std::vector<bool> scheduled(n_req, false);
  std::uint64_t total = 0;
  for (std::size_t k = 0; k < out.run.size(); ++k) {
    const StepRequest& r = in.requests[out.run[k].request];
    const std::uint32_t n = out.run[k].tokens;
    Req& st = *req_of_[out.run[k].request];
    scheduled[out.run[k].request] = true;
    total += n;
    st.service += n;
    programs_[r.session].service += n;
    st.quanta_left -= std::min(st.quanta_left, n);
    // A full quantum with work left demotes (decode chunks leave none).
    if (n >= cap_of_chunk[out.run[k].request] && r.tokens_wanted() > n) {
      st.queue = std::min(st.queue + 1, AutellixParams::kQueues - 1);
      st.quanta_left = quantum_for(st.queue, in.token_budget);
    }
  }
  if (total == 0) return;
  for (std::uint32_t i = 0; i < n_req; ++i) {
    if (!scheduled[i]) req_of_[i]->wait += total;
  }
}

}  // namespace tandem::sched
