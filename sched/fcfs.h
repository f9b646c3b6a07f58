// fcfs: no coordination — vLLM V1's default scheduler ([baselines] §5).
//
// Control half: admits every session as soon as it is waiting.
// Step half, per step:
//   1. running requests in running order: each gets min(remaining, budget)
//      tokens (chunked prefill, or one decode token); when its blocks do not
//      fit, the *last* running request is preempted by recompute (its blocks
//      freed), repeatedly, until they fit — and if the victim is the request
//      itself, no further running request is scheduled this step;
//   2. only if nothing was preempted: waiting requests in queue order, each
//      with min(prompt − prefix hit, budget) tokens, while seats (max_seqs)
//      and budget last; the first one whose blocks do not fit stops admission
//      (strict head-of-line blocking, as vLLM does).
// At a round end the KV is released to the prefix cache (LRU decides).
//
// Deviation, by design: `long_prefill_token_threshold` (off by default in
// vLLM) is not modelled.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sched/policy.h"

namespace tandem::sched {

// Admits everything. Thread-safety: one thread.
class AdmitAllControl final : public ControlPolicy {
 public:
  explicit AdmitAllControl(std::string_view name) : name_(name) {}
  std::string_view name() const override { return name_; }
  void tick(const NodeModel& model, Time now, Actions& out) override;

 private:
  std::string_view name_;
};

// Thread-safety: one thread.
class VllmV1StepScheduler final : public StepScheduler {
 public:
  std::string_view name() const override { return "vllm-v1"; }
  void plan(const StepInput& in, Time now, StepPlan& out) override;

 private:
  std::vector<std::uint32_t> running_;  // scratch of plan(), kept to reuse its storage
};

}  // namespace tandem::sched
