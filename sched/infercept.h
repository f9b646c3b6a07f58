// infercept: FCFS vLLM V1 steps, plus a min-waste choice at every tool call
// among preserve (pin), discard (recompute later) and swap (offload)
// ([baselines] §3; [mars_code] §4).
//
// At a round end that a tool follows, with C = the round's context tokens
// (capped at max_model_len), C_o = the other running requests' context,
// T = the expected tool time and M (bytes per token) cancelled out, the
// waste in token·seconds of each choice is
//
//   preserve  W_p = T · C                                      (paper §3.1)
//   discard   W_d = T_fwd(C) · (C + C_o) / 2                   (MARS repo: the
//             chunked-recompute form; the paper's unchunked one has no /2)
//   swap      W_s = 2 · T_swap(C) · (C + C_o)                  (paper §3.1)
//
//   T_fwd(x)  = fwd_s_per_token · x + fwd_s                    (MARS repo: 2e-4 s/token, 0;
//                                                               InferCept 13B: 2.79e-5, 0.0154)
//   T_swap(x) = swap_s_per_token · max(0, x − swap_free_tokens)  (InferCept scheduler.py:
//             4e-5 s/token beyond 640 tokens that overlap one iteration;
//             swap_s_per_token is KV bytes per token / host-link bandwidth)
//
// and the smallest wins (ties: preserve, then discard, then swap):
//   preserve → pin until now + TTL with the MARS repo's TTL, the hold at which
//              W_p would equal W_d:  TTL = W_d / C = T_fwd(C)(C + C_o)/(2C)
//              (= 1e-4 · (C + C_o) s with the defaults); a TTL ≤ min_pin_s
//              releases to the prefix cache instead, as the repo does;
//   discard  → kDrop;   swap → kOffload.
// T: InferCept uses an oracle tool time; here it is the running mean of the
// kind's observed durations, 0 for a kind never seen (so cold start preserves)
// or forgotten (at most kMaxToolKinds kinds, sched/kind_table.h).
// With the default constants swap is always cheaper than discard (4·4e-5 <
// 2e-4 per token): discard is chosen only with swap disabled or dearer.
//
// `mode` reproduces InferCept's fixed baselines (its api_policy D, P and S):
// always discard, always preserve (pin for the same TTL) or always swap.
//
// Each step is vLLM V1's (sched/fcfs.h: running in order, the last running
// request is the victim, strict head-of-line admission in arrival order) with
// the victim's KV swapped to host memory as InferCept's SchedulerV2 does
// (`swap_preempt`; the MARS repo's V1 port recomputes it), plus
// the repo's pin housekeeping shared with Continuum: a pin is released when
// now ≥ until and no waiting request of its session is queued, or when its
// session ended a later round; when the waiting head does not fit while
// nothing runs, the pin with the latest `until` is released.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "sched/fcfs.h"
#include "sched/kind_table.h"
#include "sched/policy.h"
#include "sched/registry.h"

namespace tandem::sched {

inline constexpr ParamSpec kInferceptParams[] = {
    {"fwd_s_per_token", 2e-4, 0, 1, "T_fwd slope, s/token (MARS repo; InferCept's 13B profile: 2.79e-5)"},
    {"fwd_s", 0, 0, 10, "T_fwd intercept, s (MARS repo: 0; InferCept's 13B profile: 0.0154)"},
    {"swap", 1, 0, 1, "1: swap (offload) is a choice; 0: preserve or discard only"},
    {"swap_s_per_token", 4e-5, 0, 1, "T_swap slope, s/token = KV bytes per token / link bandwidth (InferCept code)"},
    {"swap_free_tokens", 640, 0, 1e7, "tokens whose swap overlaps compute for free (InferCept scheduler.py)"},
    {"min_pin_s", 0.01, 0, 60, "a preserve TTL at or below this releases instead of pinning (MARS repo)"},
    {"swap_preempt", 1, 0, 1,
     "1: a running victim's KV is swapped to host memory (InferCept's SchedulerV2); 0: recompute (MARS repo)"},
    {"mode", 0, 0, 3,
     "0: min waste (InferCept, api_policy V); 1: discard only (D); 2: preserve only (P); 3: swap only (S)"},
};

struct InferceptParams {
  double fwd_s_per_token = 2e-4;
  double fwd_s = 0;
  bool swap = true;
  double swap_s_per_token = 4e-5;
  double swap_free_tokens = 640;
  double min_pin_s = 0.01;
  bool swap_preempt = true;
  int mode = 0;  // 0 min waste, 1 discard, 2 preserve, 3 swap (InferCept's api_policy V, D, P, S)
};

InferceptParams infercept_params(const PolicyParams& p);
std::unique_ptr<StepScheduler> make_infercept_step(const PolicyParams& p);

// The three wastes (token·seconds) and the preserve TTL (seconds).
struct InferceptWaste {
  double preserve = 0;
  double discard = 0;
  double swap = 0;
  double ttl_s = 0;
};

// Thread-safety: one thread (the engine's scheduling loop).
class InferceptStepScheduler final : public StepScheduler {
 public:
  explicit InferceptStepScheduler(InferceptParams params = {}) : params_(params) {}
  std::string_view name() const override { return "infercept"; }
  void plan(const StepInput& in, Time now, StepPlan& out) override;
  KeepPlan on_round_end(const RoundEndInfo& info, Time now) override;
  void on_tool_end(SessionId session, ToolKind kind, Duration wall, Time now) override;
  void on_session_end(SessionId session, Time now) override;

  // The wastes for context `c`, other running context `c_other` and an
  // expected tool time `tool_s`.
  InferceptWaste waste(std::uint32_t c, std::uint32_t c_other, double tool_s) const;
  double mean_s(ToolKind kind) const;
  // Kinds with durations of their own (at most kMaxToolKinds).
  std::size_t kinds() const { return kinds_.size(); }

 private:
  QueuedPins queued_;            // scratch of plan(), kept to reuse its storage
  std::vector<bool> pin_alive_;  // the same
  struct Kind {
    double sum = 0;
    std::uint64_t count = 0;
  };
  InferceptParams params_;
  KindTable<Kind> kinds_{kMaxToolKinds};  // sched/kind_table.h: the kinds used longest ago are forgotten
  std::unordered_map<SessionId, Time> last_round_end_;
  std::uint32_t max_model_len_ = 0;  // from the last StepInput; 0 = not seen yet
  VllmV1StepScheduler vllm_;         // the step itself
  StepPlan out_step_;                // its plan, reused across steps
};

}  // namespace tandem::sched
