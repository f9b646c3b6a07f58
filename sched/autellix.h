// autellix: program-level attained service (PLAS) MLFQ, as the MARS preview
// repo configures it ([mars_code] §4; [baselines] §4).
//
// Every session (program) accumulates attained service: each token its
// requests are scheduled, across rounds. A request takes its queue from its
// program's service when the scheduler first sees it:
//
//   service < q1_service → Q0,  < q2_service → Q1,  < q3_service → Q2,  else Q3
//
// Each queue has a token quantum (2048, 1024, 512, 256); a chunk capped at the
// request's remaining quantum that still leaves work demotes it one queue.
// Anti-starvation: a request not in Q0 whose
//
//   (program wait + request wait) / (program service at arrival + request service) ≥ β
//
// moves to the back of Q0 and its own wait and service restart from zero
// (wait tokens: every step, each request not scheduled gains the step's total
// scheduled tokens). Running requests run in (queue, arrival) order; waiting
// ones FIFO inside each queue, Q0 first, preempted requests at the head of
// their queue. Under KV pressure the victim is argmax (queue, blocks, arrival).
// Preemption is by swap, as in the paper (§5: Autellix runs on vLLM 0.6.1 and
// swaps preempted calls' KV to host memory, StepPlan::swap); the MARS repo's
// port preempts by recompute because vLLM V1 cannot swap (`swap_preempt = 0`).
// Recompute is what livelocked it here: the victim key picks the largest
// request of the lowest queue, a long context in prefill, whose progress a
// recompute throws away, so on a pool that holds about one such context it
// was preempted again before it ever finished (docs/results.md).
// Admission follows the paper's engine too (`reserve_prompt`): vLLM 0.6.1's
// block manager allocates a call's whole prompt when it is admitted, so a
// waiting call joins the batch only if its whole prompt fits beside what the
// running calls' prompts still need ("if engine.can_fit(c) … else break",
// Alg. 1). Admitting by chunk instead (vLLM V1, `reserve_prompt = 0`) lets
// dozens of long prompts share the pool a quantum at a time, none able to
// finish: on mars-long every call's prefill grew until the pool was full,
// the largest was swapped out, and it came back to do the same (a livelock
// of the hosting, not of PLAS). With nothing running, the head is admitted
// whatever its size, so a prompt larger than the free pool cannot block the
// queue for ever.
//
// Constants, by source:
//   MARS repo (vllm-continuum scheduler.py L149–151): service thresholds
//     2048/8192/32768 tokens, quanta 2048/1024/512/256, β = 2.0, victim key.
//   Paper (arXiv 2502.13965, Alg. 1): the structure — queue by program
//     service at arrival, quantum demotion, wait/service ≥ β promotion to Q1;
//     the paper gives no numbers.
//   Third-party ports (kungfu-team/autellix, Crystalclear9/Autellix): 7 queues,
//     β = 8 in decode steps — not used; listed so the difference is on record.
// Not modelled: the repo's optional "switch to FCFS after N finished jobs"
// tail mode (off by default there).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "sched/policy.h"
#include "sched/registry.h"

namespace tandem::sched {

inline constexpr ParamSpec kAutellixParams[] = {
    {"q1_service", 2048, 1, 1e9, "program service (tokens) from which a request enters Q1 (MARS repo)"},
    {"q2_service", 8192, 1, 1e9, "program service (tokens) from which a request enters Q2 (MARS repo)"},
    {"q3_service", 32768, 1, 1e9, "program service (tokens) from which a request enters Q3 (MARS repo)"},
    {"quantum0", 2048, 1, 1e7, "Q0 token quantum before demotion (MARS repo)"},
    {"quantum1", 1024, 1, 1e7, "Q1 token quantum before demotion (MARS repo)"},
    {"quantum2", 512, 1, 1e7, "Q2 token quantum before demotion (MARS repo)"},
    {"quantum3", 256, 1, 1e7, "Q3 token quantum (MARS repo)"},
    {"beta", 2.0, 0.01, 1e6,
     "anti-starvation: promote to Q0 when wait/service tokens >= beta (MARS repo; third-party ports use 8)"},
    {"swap_preempt", 1, 0, 1,
     "1: preempt by swapping the victim's KV to host memory (paper); 0: by recompute (MARS repo)"},
    {"reserve_prompt", 1, 0, 1,
     "1: admit a call only if its whole prompt fits (vLLM 0.6.1, the paper's engine); 0: by chunk (vLLM V1)"},
};

struct AutellixParams {
  static constexpr int kQueues = 4;
  // Thresholds, ascending (the converter makes them so).
  std::uint64_t service_threshold[kQueues - 1] = {2048, 8192, 32768};
  std::uint32_t quantum[kQueues] = {2048, 1024, 512, 256};
  double beta = 2.0;
  bool swap_preempt = true;
  bool reserve_prompt = true;
};

AutellixParams autellix_params(const PolicyParams& p);
std::unique_ptr<StepScheduler> make_autellix_step(const PolicyParams& p);

// Thread-safety: one thread (the engine's scheduling loop).
class AutellixStepScheduler final : public StepScheduler {
 public:
  explicit AutellixStepScheduler(AutellixParams params = {}) : params_(params) {}
  std::string_view name() const override { return "autellix"; }
  void plan(const StepInput& in, Time now, StepPlan& out) override;
  void on_session_end(SessionId session, Time now) override;

  // For tests and traces: the queue a request is in (-1 if unknown), a
  // program's attained service.
  int queue_of(std::uint64_t request_id) const;
  std::uint64_t program_service(SessionId session) const;
  // The queue a request of a program with `service` tokens enters.
  int queue_for_service(std::uint64_t service) const;

 private:
  struct Program {
    std::uint64_t service = 0;  // every scheduled token, all rounds
    std::uint64_t wait = 0;     // wait tokens of its finished requests
  };
  struct Req {
    SessionId session = 0;
    int queue = 0;
    std::uint32_t quanta_left = 0;
    std::uint64_t service_at_arrival = 0;  // program service when first seen
    std::uint64_t service = 0;             // since arrival or the last promotion
    std::uint64_t wait = 0;                // since arrival or the last promotion
    std::int64_t seq = 0;                  // FIFO position inside its waiting queue
    std::uint64_t seen = 0;                // the last plan() that saw it
  };

  std::uint32_t quantum_for(int queue, std::uint32_t token_budget) const;

  AutellixParams params_;
  std::unordered_map<SessionId, Program> programs_;
  std::unordered_map<std::uint64_t, Req> reqs_;
  std::uint64_t generation_ = 0;
  std::int64_t next_back_seq_ = 1;    // appends to a queue's tail
  std::int64_t next_front_seq_ = -1;  // prepends (preempted requests)
  // Scratch, kept to avoid reallocating every step.
  std::vector<std::uint32_t> running_;
  std::vector<std::uint32_t> waiting_;
  std::vector<Req*> req_of_;  // request index → its state, for one plan()
};

}  // namespace tandem::sched
