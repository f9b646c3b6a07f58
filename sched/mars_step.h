// mars-mlfq: MARS's engine-side step scheduler ([mars_code] §2.3–2.5).
//
// It is vLLM V1's step (sched/fcfs.h, [baselines] §5) with three
// changes:
//   1. Order. Running requests run in (effective level, last scheduled,
//      arrival) order. Waiting requests are taken as MARS's MarsRequestQueue
//      pops them: requests preempted by recompute first (the most recently
//      preempted at the head, as vLLM's prepend leaves them), then the rest by
//      (level of the total prompt length, arrival).
//   2. MLFQ quanta. A prefill chunk is at most quanta[effective level] tokens
//      (capped by the step's token budget); decode is not capped.
//        base      = max(feedback, level(remaining prefill tokens))
//        effective = max(0, base − ⌊(now − last scheduled) / aging interval⌋)
//      A request never scheduled (new, or just preempted) ages by levels+1, so
//      its first chunk is always quanta[0]. After it runs, a chunk of at least
//      its quantum that leaves prefill to do demotes it one level (feedback+1);
//      a chunk cut short by the budget or by halving does not; decode and the
//      end of prefill reset feedback to 0.
//   3. KV pressure. When a chunk does not fit, a request in prefill halves it
//      (floor block_size) and retries; otherwise the running path preempts the
//      MARS victim — argmax over running of (level: −1 in decode, else
//      max(feedback, remaining level) — aging ignored; blocks =
//      ⌈min(computed, max_model_len) / block_size⌉; arrival) — and retries; the
//      waiting path stops admitting (head-of-line blocking). A victim already
//      scheduled this step gives back its chunk, budget and blocks (vLLM's
//      priority branch does the same). Nothing is admitted in a step that
//      preempted.
// At a round end the KV is released to the prefix cache: MARS never pins
// ([mars_code] §2.6).
//
// Judgement calls (see also MarsStepParams):
//   * MLFQ state lives here, keyed by StepRequest::id. It is swept every step:
//     a request absent from the step's input is forgotten (so one instance
//     serves one engine). A request seen waiting or preempted has its feedback
//     and last-scheduled reset, which covers admission and preemptions the
//     engine made on its own. A running request seen for the first time takes
//     StepRequest::last_scheduled (zero = never) so a scheduler attached to a
//     live engine does not treat every running request as brand new.
//   * The internal window (MARS's hard-coded 30, `overflow_window`) is kept:
//     under MARS's own control half (≤ 30 sessions, one call each) it never
//     binds, but under an admit-everything control half it is what bounds the
//     waiting set MARS looks at. It is modelled statelessly: running requests
//     and preempted ones count against it, and the earliest-arriving waiting
//     requests fill what is left. 0 turns it off.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "sched/policy.h"
#include "sched/registry.h"

namespace tandem::sched {

inline constexpr std::uint32_t kMarsMaxLevels = 4;

struct MarsStepParams {
  std::uint32_t levels = 4;  // 1..kMarsMaxLevels
  // Tokens per prefill chunk at each level, capped by the step's token budget.
  std::array<std::uint32_t, kMarsMaxLevels> quanta{2048, 1024, 512, 256};
  // A remaining (or, for the waiting order, total) prompt of at most
  // thresholds[k] tokens is at level k; above the last one it is at levels−1.
  // Non-decreasing (mars_step_params() enforces it).
  std::array<std::uint32_t, kMarsMaxLevels - 1> thresholds{2048, 8192, 32768};
  Duration aging_interval = std::chrono::seconds(30);  // zero: no aging
  bool chunk_halving = true;
  std::uint32_t overflow_window = 30;  // running + waiting looked at; 0 = unbounded
  // Not MARS: when a step would leave budget unused with nothing but prefill
  // in it and nothing left waiting, the prefills take the rest of the budget
  // in scheduling order (tandem.h, addition 17). The quanta then only split
  // the budget between requests that compete for it.
  bool fill_idle_budget = false;
  // Not MARS, off by default: a prefill chunk's quantum is at least that of
  // its session's level by the tokens it has had scheduled across all its
  // rounds (Autellix's program-level attained service, on the same
  // thresholds), so the continuations of sessions that have had much service
  // take smaller chunks. docs/results.md ("Autellix's edge at light load")
  // gives why it stays off.
  bool program_quanta = false;
};

inline constexpr ParamSpec kMarsStepParams[] = {
    {"levels", 4, 1, kMarsMaxLevels, "MLFQ levels (MARS: 4)"},
    {"quantum_0", 2048, 1, 1 << 20, "prefill tokens per step at level 0 (capped by the token budget)"},
    {"quantum_1", 1024, 1, 1 << 20, "prefill tokens per step at level 1"},
    {"quantum_2", 512, 1, 1 << 20, "prefill tokens per step at level 2"},
    {"quantum_3", 256, 1, 1 << 20, "prefill tokens per step at level 3"},
    {"threshold_0", 2048, 0, 1 << 30, "remaining prefill tokens up to which a request is at level 0"},
    {"threshold_1", 8192, 0, 1 << 30, "remaining prefill tokens up to which a request is at level 1"},
    {"threshold_2", 32768, 0, 1 << 30, "remaining prefill tokens up to which a request is at level 2"},
    {"aging_interval_s", 30, 0, 86400, "seconds unscheduled that promote a request one level (0: no aging)"},
    {"chunk_halving", 1, 0, 1, "halve a prefill chunk that does not fit, down to one block, before preempting"},
    {"overflow_window", 30, 0, 1 << 20, "running + waiting requests MARS considers (0: all)"},
    {"program_quanta", 0, 0, 1,
     "not MARS: a prefill's quantum is at least its session's level by service over all its rounds (Autellix's "
     "PLAS; off: docs/results.md)"},
};

// REQUIRES: `p` was validated against kMarsStepParams.
MarsStepParams mars_step_params(const PolicyParams& p);
std::unique_ptr<StepScheduler> make_mars_step(const PolicyParams& p);

// What the scheduler remembers about one request.
struct MarsRequestState {
  std::uint32_t feedback = 0;          // demotions by service, 0..levels−1
  std::optional<Time> last_scheduled;  // nullopt: never (new or preempted)
  std::uint64_t preempt_seq = 0;       // when this scheduler last preempted it; 0 = never
  std::uint64_t seen_step = 0;         // sweep mark
};

// Thread-safety: one thread (the engine's scheduling loop).
class MarsStepScheduler final : public StepScheduler {
 public:
  static constexpr std::string_view kName = "mars-mlfq";

  explicit MarsStepScheduler(MarsStepParams params = {}) : params_(params) {}

  std::string_view name() const override { return kName; }
  void plan(const StepInput& in, Time now, StepPlan& out) override;
  // MARS frees KV at every round end and relies on prefix caching.
  KeepPlan on_round_end(const RoundEndInfo& /*info*/, Time /*now*/) override { return {KeepDecision::kRelease, {}}; }
  void on_session_end(SessionId session, Time /*now*/) override { service_.erase(session); }

  const MarsStepParams& params() const { return params_; }
  // Multiplies every quantum (still capped by the step's token budget). MARS
  // itself never calls this; `tandem` scales its quanta to the engine's
  // compute-bound step size (tandem.h, addition 6). `scale` ≥ 1.
  void set_quantum_scale(double scale) { quantum_scale_ = scale < 1.0 ? 1.0 : scale; }
  // The level of a prompt with `tokens` tokens still to prefill.
  std::uint32_t level_for(std::uint32_t tokens) const;
  // `r`'s effective level at `now` from what this scheduler remembers of it
  // (a request it does not know counts as never scheduled).
  std::uint32_t effective_level(const StepRequest& r, Time now) const;
  // nullptr if the request is not remembered.
  const MarsRequestState* state(std::uint64_t id) const;
  // Requests remembered from the latest step.
  std::size_t remembered() const;
  // program_quanta: the level of `session` by the tokens it has had
  // scheduled (0 when off or unknown).
  std::uint32_t program_level(SessionId session) const;
  // A session's service is forgotten at on_session_end (libtandem calls it
  // on CLOSE), or once none of its requests has been seen for this long (a
  // session that ended while its engine ran without a daemon).
  static constexpr Duration kProgramForget = std::chrono::hours(1);

 private:
  std::uint32_t effective_level(const StepRequest& r, const MarsRequestState* s, Time now) const;
  std::uint32_t quantum(const StepInput& in, std::uint32_t level) const;
  double quantum_scale_ = 1.0;
  MarsRequestState& touch(const StepRequest& r);

  MarsStepParams params_;
  std::unordered_map<std::uint64_t, MarsRequestState> states_;
  struct Service {
    std::uint64_t tokens = 0;
    Time last_seen{};
  };
  std::unordered_map<SessionId, Service> service_;  // program_quanta only
  std::uint64_t step_ = 0;
  std::uint64_t preempt_seq_ = 0;
};

}  // namespace tandem::sched
