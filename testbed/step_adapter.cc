// StepScheduler → libtandem's C ABI.
#include "testbed/step_adapter.h"

#include <cstring>

#include <fmt/core.h>

#include "base/clock.h"
#include "sched/registry.h"

namespace tandem::testbed {
namespace {

std::int64_t ns(sched::Time t) { return base::to_ns(t); }

std::uint32_t phase(sched::RequestPhase p) {
  switch (p) {
    case sched::RequestPhase::kWaiting:
      return TANDEM_REQ_WAITING;
    case sched::RequestPhase::kRunning:
      return TANDEM_REQ_RUNNING;
    case sched::RequestPhase::kPreempted:
      return TANDEM_REQ_PREEMPTED;
  }
  return TANDEM_REQ_WAITING;
}

}  // namespace

TandemStepScheduler::TandemStepScheduler(tandem_client* client) : client_(client) {
  // "fcfs" is in the registry; its absence would be a build of sched/ without it.
  if (auto p = sched::make_policy("fcfs")) local_ = std::move(p->step);
}

TandemStepScheduler::~TandemStepScheduler() = default;

std::string_view TandemStepScheduler::name() const {
  if (client_ != nullptr) {
    const char* n = tandem_engine_policy(client_);
    if (n != nullptr) return n;
  }
  return local_ ? local_->name() : std::string_view("fcfs");
}

void TandemStepScheduler::failed(std::string_view call, int rc) {
  if (failures_++ == 0) {
    first_failure_ =
        fmt::format("{}: {} ({})", call, std::strerror(-rc), client_ != nullptr ? tandem_last_error(client_) : "");
    fmt::print(stderr, "tandem-engine-emu: {}; planning locally (fcfs)\n", first_failure_);
  }
}

void TandemStepScheduler::plan(const sched::StepInput& in, sched::Time now, sched::StepPlan& out) {
  if (client_ != nullptr) {
    requests_.resize(in.requests.size());
    for (std::size_t i = 0; i < in.requests.size(); ++i) {
      const sched::StepRequest& r = in.requests[i];
      tandem_step_request& c = requests_[i];
      c = tandem_step_request{};
      c.id = r.id;
      c.session = r.session;
      c.round = r.round;
      c.phase = phase(r.phase);
      c.prompt_tokens = r.prompt_tokens;
      c.max_output_tokens = r.max_output_tokens;
      c.computed_tokens = r.computed_tokens;
      c.output_tokens = r.output_tokens;
      c.cached_tokens = r.cached_tokens;
      c.blocks_held = r.blocks_held;
      c.arrival_ns = ns(r.arrival);
      c.last_scheduled_ns = r.last_scheduled == sched::Time{} ? 0 : ns(r.last_scheduled);
      c.priority = r.priority;
      c.last_round = r.last_round ? 1 : 0;
    }
    pinned_.resize(in.pinned.size());
    for (std::size_t i = 0; i < in.pinned.size(); ++i) {
      const sched::PinnedKv& p = in.pinned[i];
      pinned_[i] = tandem_pinned_kv{p.session, p.blocks, 0, ns(p.pinned_at), ns(p.until)};
    }
    tandem_step_input ci{};
    ci.sz = sizeof ci;
    ci.token_budget = in.token_budget;
    ci.max_seqs = in.max_seqs;
    ci.block_size = in.block_size;
    ci.free_blocks = in.free_blocks;
    ci.max_model_len = in.max_model_len;
    ci.saturating_tokens = in.saturating_tokens;
    ci.requests = requests_.data();
    ci.n_requests = static_cast<std::uint32_t>(requests_.size());
    ci.pinned = pinned_.data();
    ci.n_pinned = static_cast<std::uint32_t>(pinned_.size());
    ci.now_ns = ns(now);
    run_.resize(requests_.size());
    preempt_.resize(requests_.size());
    unpin_.resize(pinned_.size());
    swap_.resize(requests_.size());
    tandem_step_plan plan{};
    plan.sz = sizeof plan;
    plan.run = run_.data();
    plan.preempt = preempt_.data();
    plan.unpin = unpin_.data();
    plan.swap = swap_.data();
    const int rc = tandem_engine_plan_step(client_, &ci, &plan);
    const auto n = static_cast<std::uint32_t>(requests_.size());
    if (rc == 0 && plan.n_run <= n && plan.n_preempt <= n && plan.n_swap <= n && plan.n_unpin <= pinned_.size()) {
      for (std::uint32_t i = 0; i < plan.n_run; ++i) out.run.push_back({run_[i].request, run_[i].tokens});
      out.preempt.assign(preempt_.begin(), preempt_.begin() + plan.n_preempt);
      out.swap.assign(swap_.begin(), swap_.begin() + plan.n_swap);
      out.unpin.assign(unpin_.begin(), unpin_.begin() + plan.n_unpin);
      return;
    }
    failed("tandem_engine_plan_step", rc == 0 ? -ERANGE : rc);
    out.clear();
  }
  if (local_) local_->plan(in, now, out);
}

sched::KeepPlan TandemStepScheduler::on_round_end(const sched::RoundEndInfo& info, sched::Time now) {
  if (client_ == nullptr) return local_ ? local_->on_round_end(info, now) : sched::KeepPlan{};
  tandem_round_end_info ci{};
  ci.sz = sizeof ci;
  ci.session = info.session;
  ci.tool_follows = info.tool_follows ? 1 : 0;
  ci.tool_kind = info.tool;
  ci.context_tokens = info.context_tokens;
  ci.blocks = info.blocks;
  ci.other_running_tokens = info.other_running_tokens;
  ci.now_ns = ns(now);
  int decision = TANDEM_KEEP_RELEASE;
  std::int64_t until = 0;
  const int rc = tandem_engine_keep_decision(client_, &ci, &decision, &until);
  if (rc != 0) {
    failed("tandem_engine_keep_decision", rc);
    return {};
  }
  sched::KeepPlan k;
  switch (decision) {
    case TANDEM_KEEP_PIN:
      k.decision = sched::KeepDecision::kPin;
      k.until = base::from_ns(until);
      break;
    case TANDEM_KEEP_OFFLOAD:
      k.decision = sched::KeepDecision::kOffload;
      break;
    case TANDEM_KEEP_DROP:
      k.decision = sched::KeepDecision::kDrop;
      break;
    default:
      k.decision = sched::KeepDecision::kRelease;
      break;
  }
  return k;
}

}  // namespace tandem::testbed
