// Coordinator: validation and translation around sched::StepScheduler.
#include "libclient/coordinator.h"

#include <cerrno>

#include <fmt/format.h>

#include "ipc/records.h"
#include "sched/registry.h"

namespace tandem::client {

base::Result<Coordinator> Coordinator::create() {
  Coordinator c;
  auto configured = c.configure("fcfs", {}, 0);
  if (!configured) return base::propagate(std::move(configured.error()), "initial policy");
  return c;
}

base::Result<void> Coordinator::configure(std::string_view name, const std::map<std::string, double>& params,
                                          std::uint64_t epoch) {
  auto instance = sched::make_policy(name, params);
  if (!instance) return base::propagate(std::move(instance.error()));
  if (!instance->step) return base::make_error(EINVAL, fmt::format("policy {} has no step half", name));
  step_ = std::move(instance->step);
  name_ = std::string(name);
  epoch_ = epoch;
  return {};
}

int Coordinator::plan(const tandem_step_input& in, tandem_step_plan& out, std::string& error) {
  auto invalid = [&error](std::string message) {
    error = std::move(message);
    return -EINVAL;
  };
  if (in.n_requests > 0 && in.requests == nullptr) return invalid("input.requests is NULL with n_requests > 0");
  if (in.n_pinned > 0 && in.pinned == nullptr) return invalid("input.pinned is NULL with n_pinned > 0");
  if (in.token_budget == 0) return invalid("input.token_budget is 0");
  if (in.max_seqs == 0) return invalid("input.max_seqs is 0");
  if (in.block_size == 0) return invalid("input.block_size is 0");
  if (in.now_ns < 0) return invalid("input.now_ns is negative");
  if (in.n_requests > 0 && (out.run == nullptr || out.preempt == nullptr)) {
    return invalid("plan.run or plan.preempt is NULL with n_requests > 0");
  }
  if (in.n_pinned > 0 && out.unpin == nullptr) return invalid("plan.unpin is NULL with n_pinned > 0");

  requests_.clear();
  requests_.reserve(in.n_requests);
  for (std::uint32_t i = 0; i < in.n_requests; ++i) {
    const tandem_step_request& r = in.requests[i];
    if (r.phase > TANDEM_REQ_PREEMPTED)
      return invalid(fmt::format("input.requests[{}].phase {} is unknown", i, r.phase));
    if (r.priority >= ipc::kPriorityLevels) {
      return invalid(
          fmt::format("input.requests[{}].priority {} is not below {}", i, r.priority, ipc::kPriorityLevels));
    }
    if (r.cached_tokens > r.prompt_tokens) {
      return invalid(fmt::format("input.requests[{}].cached_tokens > prompt_tokens", i));
    }
    if (r.arrival_ns < 0 || r.last_scheduled_ns < 0) {
      return invalid(fmt::format("input.requests[{}]: negative timestamp", i));
    }
    sched::StepRequest s;
    s.id = r.id;
    s.session = r.session;
    s.round = r.round;
    s.phase = static_cast<sched::RequestPhase>(r.phase);
    s.prompt_tokens = r.prompt_tokens;
    s.max_output_tokens = r.max_output_tokens;
    s.computed_tokens = r.computed_tokens;
    s.output_tokens = r.output_tokens;
    s.cached_tokens = r.cached_tokens;
    s.blocks_held = r.blocks_held;
    s.arrival = base::from_ns(r.arrival_ns);
    s.last_scheduled = base::from_ns(r.last_scheduled_ns);
    s.priority = r.priority;
    s.last_round = r.last_round != 0;
    requests_.push_back(s);
  }
  pinned_.clear();
  pinned_.reserve(in.n_pinned);
  for (std::uint32_t i = 0; i < in.n_pinned; ++i) {
    const tandem_pinned_kv& p = in.pinned[i];
    if (p.pinned_at_ns < 0 || p.until_ns < 0) return invalid(fmt::format("input.pinned[{}]: negative timestamp", i));
    pinned_.push_back(sched::PinnedKv{p.session, p.blocks, base::from_ns(p.pinned_at_ns), base::from_ns(p.until_ns)});
  }

  sched::StepInput step;
  step.token_budget = in.token_budget;
  step.max_seqs = in.max_seqs;
  step.block_size = in.block_size;
  step.free_blocks = in.free_blocks;
  if (in.max_model_len != 0) step.max_model_len = in.max_model_len;
  step.saturating_tokens = in.saturating_tokens;
  step.requests = requests_;
  step.pinned = pinned_;

  plan_.clear();
  last_now_ = base::from_ns(in.now_ns);
  if (!tools_.empty()) observe_tool_ends();
  step_->plan(step, last_now_, plan_);

  // The scheduler's contract bounds these; check before writing into arrays
  // the caller sized from it.
  // A caller with no room for swaps gets them as preemptions by recompute:
  // dropping one would leave a running request without the blocks the step
  // needs (the live stall this field was added for).
  const bool swaps = out.swap != nullptr;
  if (!swaps) {
    plan_.preempt.insert(plan_.preempt.end(), plan_.swap.begin(), plan_.swap.end());
    plan_.swap.clear();
  }
  if (plan_.run.size() > in.n_requests || plan_.preempt.size() + plan_.swap.size() > in.n_requests ||
      plan_.unpin.size() > in.n_pinned) {
    error = fmt::format("policy {} returned an oversized plan", name_);
    return -EIO;
  }
  for (const sched::ScheduledChunk& c : plan_.run) {
    if (c.request >= in.n_requests) {
      error = fmt::format("policy {} scheduled request {} of {}", name_, c.request, in.n_requests);
      return -EIO;
    }
  }
  for (std::size_t i = 0; i < plan_.run.size(); ++i)
    out.run[i] = tandem_chunk{plan_.run[i].request, plan_.run[i].tokens};
  for (std::size_t i = 0; i < plan_.preempt.size(); ++i) out.preempt[i] = plan_.preempt[i];
  for (std::size_t i = 0; i < plan_.unpin.size(); ++i) out.unpin[i] = plan_.unpin[i];
  for (std::size_t i = 0; i < plan_.swap.size(); ++i) out.swap[i] = plan_.swap[i];
  out.n_run = static_cast<std::uint32_t>(plan_.run.size());
  out.n_preempt = static_cast<std::uint32_t>(plan_.preempt.size());
  out.n_unpin = static_cast<std::uint32_t>(plan_.unpin.size());
  out.n_swap = static_cast<std::uint32_t>(plan_.swap.size());
  return 0;
}

// A request of a session whose tool is in flight, that arrived at or after
// the round end, is the next round: the tool (and the runner's time around
// it) took from that end to its arrival. Requests that arrived before are the
// ended round's own, still listed by an engine that has not retired them.
void Coordinator::observe_tool_ends() {
  for (const sched::StepRequest& r : requests_) {
    const ToolInFlight* t = tools_.find(r.session);
    if (t == nullptr || r.arrival < t->since) continue;
    const ToolInFlight ended = *t;
    tools_.erase(r.session);
    step_->on_tool_end(r.session, ended.kind, r.arrival - ended.since, last_now_);
    if (tools_.empty()) return;
  }
}

sched::KeepPlan Coordinator::keep(const tandem_round_end_info& info) {
  const base::Time now = base::from_ns(info.now_ns);
  if (info.tool_follows != 0) {
    tools_[info.session] = ToolInFlight{info.tool_kind, now};
  } else {
    tools_.erase(info.session);
  }
  sched::RoundEndInfo r;
  r.session = info.session;
  r.tool_follows = info.tool_follows != 0;
  r.tool = info.tool_kind;
  r.context_tokens = info.context_tokens;
  r.blocks = info.blocks;
  r.other_running_tokens = info.other_running_tokens;
  return step_->on_round_end(r, now);
}

void Coordinator::session_end(std::uint64_t id) {
  tools_.erase(id);
  step_->on_session_end(id, last_now_);
}

}  // namespace tandem::client
