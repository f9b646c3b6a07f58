// sched::StepScheduler over libtandem's C ABI: sim::Engine asks this adapter
// to plan each step and it asks tandem_engine_plan_step() /
// tandem_engine_keep_decision(), so the policy is the daemon's (PolicyConfig),
// "fcfs" until one arrives or while running fail-open.
//
// The conversion is plain: StepInput ↔ tandem_step_input (times as
// CLOCK_MONOTONIC ns), tandem_step_plan → StepPlan. Indices the library
// returns are checked against the input before they reach the engine. If a
// call fails (it should not: the input is built to be valid), the step is
// planned by a local "fcfs" scheduler and the failure is counted and logged
// once, so the engine never stalls on the library.
//
// Thread-safety: the engine's thread (it uses the handle).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <tandem/tandem.h>

#include "sched/policy.h"

namespace tandem::testbed {

class TandemStepScheduler final : public sched::StepScheduler {
 public:
  // `client` must outlive the adapter; nullptr plans everything locally (tests).
  explicit TandemStepScheduler(tandem_client* client);
  ~TandemStepScheduler() override;

  std::string_view name() const override;
  void plan(const sched::StepInput& in, sched::Time now, sched::StepPlan& out) override;
  sched::KeepPlan on_round_end(const sched::RoundEndInfo& info, sched::Time now) override;

  std::uint64_t failures() const { return failures_; }
  const std::string& first_failure() const { return first_failure_; }

 private:
  void failed(std::string_view call, int rc);

  tandem_client* client_;
  std::unique_ptr<sched::StepScheduler> local_;  // fcfs, for failed calls
  std::vector<tandem_step_request> requests_;
  std::vector<tandem_pinned_kv> pinned_;
  std::vector<tandem_chunk> run_;
  std::vector<std::uint32_t> preempt_;
  std::vector<std::uint32_t> swap_;
  std::vector<std::uint64_t> unpin_;
  std::uint64_t failures_ = 0;
  std::string first_failure_;
};

}  // namespace tandem::testbed
