// Builders shared by the step-scheduler tests: a time in milliseconds and a
// request in a given phase (running requests hold the blocks their computed
// tokens need, in 16-token blocks).
#pragma once

#include <chrono>
#include <cstdint>

#include "sched/policy.h"

namespace tandem::sched::test {

inline Time ms(std::int64_t v) { return Time(std::chrono::milliseconds(v)); }

inline StepRequest req(std::uint64_t id, SessionId session, RequestPhase phase, std::uint32_t prompt,
                       std::uint32_t computed, Time arrival, bool last_round = false) {
  StepRequest r;
  r.id = id;
  r.session = session;
  r.phase = phase;
  r.prompt_tokens = prompt;
  r.computed_tokens = computed;
  r.blocks_held = phase == RequestPhase::kRunning ? (computed + 15) / 16 : 0;
  r.arrival = arrival;
  r.last_round = last_round;
  return r;
}

}  // namespace tandem::sched::test
