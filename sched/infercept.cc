// InferCept step scheduler (see infercept.h for the algorithm and sources).
#include "sched/infercept.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace tandem::sched {

InferceptParams infercept_params(const PolicyParams& p) {
  InferceptParams i;
  i.fwd_s_per_token = p.get("fwd_s_per_token");
  i.fwd_s = p.get("fwd_s");
  i.swap = p.flag("swap");
  i.swap_s_per_token = p.get("swap_s_per_token");
  i.swap_free_tokens = p.get("swap_free_tokens");
  i.min_pin_s = p.get("min_pin_s");
  i.swap_preempt = p.flag("swap_preempt");
  i.mode = static_cast<int>(p.get("mode"));
  return i;
}

std::unique_ptr<StepScheduler> make_infercept_step(const PolicyParams& p) {
  return std::make_unique<InferceptStepScheduler>(infercept_params(p));
}

double InferceptStepScheduler::mean_s(ToolKind kind) const {
  const Kind* k = kinds_.find(kind);
  if (k == nullptr || k->count == 0) return 0.0;
  return k->sum / static_cast<double>(k->count);
}

InferceptWaste InferceptStepScheduler::waste(std::uint32_t c, std::uint32_t c_other, double tool_s) const {
  InferceptWaste w;
  if (c == 0) return w;
  const double ci = c;
  const double batch = ci + static_cast<double>(c_other);
  const double t_fwd = params_.fwd_s_per_token * ci + params_.fwd_s;
  const double t_swap = params_.swap_s_per_token * std::max(0.0, ci - params_.swap_free_tokens);
  w.preserve = tool_s * ci;
  w.discard = t_fwd * batch / 2.0;
  w.swap = 2.0 * t_swap * batch;
  w.ttl_s = w.discard / ci;
  return w;
}

KeepPlan InferceptStepScheduler::on_round_end(const RoundEndInfo& info, Time now) {
  last_round_end_[info.session] = now;
  if (!info.tool_follows) return {};
  std::uint32_t c = info.context_tokens;
  if (max_model_len_ != 0) c = std::min(c, max_model_len_);
  if (c == 0) return {};
  const InferceptWaste w = waste(c, info.other_running_tokens, mean_s(info.tool));
  const auto pin = [&]() -> KeepPlan {
    if (w.ttl_s <= params_.min_pin_s) return {};
    return {KeepDecision::kPin, now + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(w.ttl_s))};
  };
  if (params_.mode == 1) return {KeepDecision::kDrop, {}};
  if (params_.mode == 2) return pin();
  if (params_.mode == 3) return {KeepDecision::kOffload, {}};
  if (w.preserve <= w.discard && (!params_.swap || w.preserve <= w.swap)) {
    if (w.ttl_s <= params_.min_pin_s) return {};
    return {KeepDecision::kPin, now + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(w.ttl_s))};
  }
  if (!params_.swap || w.discard <= w.swap) return {KeepDecision::kDrop, {}};
  return {KeepDecision::kOffload, {}};
}

void InferceptStepScheduler::on_tool_end(SessionId /*session*/, ToolKind kind, Duration wall, Time /*now*/) {
  Kind& k = kinds_.use(kind);
  k.sum += std::max(0.0, std::chrono::duration<double>(wall).count());
  ++k.count;
}

void InferceptStepScheduler::on_session_end(SessionId session, Time /*now*/) { last_round_end_.erase(session); }

void InferceptStepScheduler::plan(const StepInput& in, Time now, StepPlan& out) {
  max_model_len_ = in.max_model_len;
  KvLedger kv(in);
  queued_.start(in);
  QueuedPins& waiting_sessions = queued_;
  std::vector<bool>& pin_alive = pin_alive_;
  pin_alive.assign(in.pinned.size(), true);
  auto unpin = [&](std::size_t k) {
    pin_alive[k] = false;
    out.unpin.push_back(in.pinned[k].session);
    // A queued request of the same session counts these blocks as its own
    // (StepRequest::blocks_held): released, they stay its prefix hit, now
    // drawn from the free pool, so the ledger gains nothing.
    if (!waiting_sessions.contains(in.pinned[k].session)) kv.release(in.pinned[k].blocks);
  };
  for (std::size_t k = 0; k < in.pinned.size(); ++k) {
    const PinnedKv& p = in.pinned[k];
    auto e = last_round_end_.find(p.session);
    const bool superseded = e != last_round_end_.end() && p.pinned_at < e->second;
    const bool expired = now >= p.until && !waiting_sessions.contains(p.session);
    if (superseded || expired) unpin(k);
  }

  // The step itself is vLLM V1's (sched/fcfs.h) over what is free once the
  // expired pins are gone.
  StepInput freed = in;
  freed.free_blocks = kv.free_blocks();
  vllm_.plan(freed, now, out_step_);
  // Swapped, not moved: both plans keep their storage from step to step.
  out.run.swap(out_step_.run);
  (params_.swap_preempt ? out.swap : out.preempt).swap(out_step_.preempt);
  out_step_.clear();

  // The repo's waiting-path rule: with nothing running, a head that does not
  // fit makes the longest-lived pin go, so the next step has room.
  const bool any_running = std::any_of(in.requests.begin(), in.requests.end(),
                                       [](const StepRequest& r) { return r.phase == RequestPhase::kRunning; });
  const bool any_waiting = std::any_of(in.requests.begin(), in.requests.end(),
                                       [](const StepRequest& r) { return r.phase != RequestPhase::kRunning; });
  if (!any_running && any_waiting && out.run.empty() && in.token_budget > 0 && in.max_seqs > 0) {
    std::ptrdiff_t best = -1;
    for (std::size_t k = 0; k < in.pinned.size(); ++k) {
      if (pin_alive[k] && (best < 0 || in.pinned[k].until > in.pinned[static_cast<std::size_t>(best)].until)) {
        best = static_cast<std::ptrdiff_t>(k);
      }
    }
    if (best >= 0) unpin(static_cast<std::size_t>(best));
  }
}

}  // namespace tandem::sched
