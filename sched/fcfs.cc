// vLLM V1's scheduling step and the admit-everything control half.
#include "sched/fcfs.h"

#include <algorithm>
#include <vector>

namespace tandem::sched {

void AdmitAllControl::tick(const NodeModel& model, Time /*now*/, Actions& out) {
  for (const Session* s : model.sessions().by_id()) {
    if (s->state == SessionState::kWaiting) out.admit(s->id);
  }
}

void VllmV1StepScheduler::plan(const StepInput& in, Time /*now*/, StepPlan& out) {
  KvLedger kv(in);
  std::uint32_t budget = in.token_budget;

  // The running list, which preemption shrinks from its end.
  std::vector<std::uint32_t>& running = running_;
  running.clear();
  for (std::uint32_t i = 0; i < in.requests.size(); ++i) {
    if (in.requests[i].phase == RequestPhase::kRunning) running.push_back(i);
  }
  bool preempted = false;
  for (std::size_t pos = 0; pos < running.size() && budget > 0; ++pos) {
    const std::uint32_t idx = running[pos];
    const StepRequest& r = in.requests[idx];
    const std::uint32_t n = std::min(r.tokens_wanted(), budget);
    bool scheduled = false;
    bool preempted_self = false;
    while (true) {
      if (kv.try_allocate(r, n)) {
        scheduled = true;
        break;
      }
      // The most recently admitted running request pays.
      const std::uint32_t victim = running.back();
      running.pop_back();
      kv.release(in.requests[victim].blocks_held);
      out.preempt.push_back(victim);
      preempted = true;
      if (victim == idx) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;
    if (scheduled) {
      out.run.push_back({idx, n});
      budget -= n;
    }
  }
  if (preempted) return;

  std::uint32_t seats = static_cast<std::uint32_t>(running.size());
  for (std::uint32_t i = 0; i < in.requests.size() && budget > 0 && seats < in.max_seqs; ++i) {
    const StepRequest& r = in.requests[i];
    if (r.phase == RequestPhase::kRunning) continue;
    const std::uint32_t n = std::min(r.tokens_wanted(), budget);
    if (!kv.try_allocate(r, n)) break;  // head-of-line blocking
    out.run.push_back({i, n});
    budget -= n;
    ++seats;
  }
}

}  // namespace tandem::sched
