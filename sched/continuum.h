// continuum: TTL pinning of a round's KV while its tool runs, with
// program-level FCFS — as the MARS preview repo configures `continuum` and
// `continuum_dy` ([mars_code] §2.5, §2.7, §4; [baselines] §2).
//
// At a round end that a tool follows, the KV is pinned for a TTL:
//   fixed (`continuum`): TTL = ttl_s (2.0 s) iff the running mean of that tool
//     kind's observed durations is ≤ threshold_s (2.0 s); a kind never
//     observed has mean 0 and is pinned (the repo's cold start);
//   dynamic (`continuum_dy`): TTL = argmax over τ ∈ {0} ∪ {observed durations}
//     of  P(D ≤ τ)·(T·η + reload) − τ,  0 if the best reward ≤ 0; D is the
//     kind's samples if it has more than min_samples, else all samples; with
//     ≤ min_samples samples in all, TTL = ttl_s. reload = reload_s_per_token ×
//     context tokens; T = mean of the last delay_window preempt→reschedule
//     delays (0 if none); η = −Pearson(k, N−k) over finished programs (k =
//     rounds a program had finished when a request arrived, N = its rounds),
//     1 with fewer than 2 samples or no spread.
// A TTL ≤ min_pin_s is no pin (release to the prefix cache). The last round
// of a session (no tool follows) is never pinned.
//
// Each step:
//   1. a pin is released when now ≥ until and no waiting request of its
//      session is queued, or when its session has ended a round since it was
//      pinned (the repo drops every older pin of a job at a round end);
//   2. running requests in running order (vLLM V1); when blocks do not fit:
//      if ≤ 1 request runs and a pin is held, the pin with the latest `until`
//      is released (retry; this is not a preemption); otherwise the running
//      request of the session that arrived most recently is preempted by
//      recompute, preferring requests that are not on their last round
//      (`pop_running_request_based_on_last_step`);
//   3. only if nothing was preempted: waiting requests, those whose session
//      holds a pin first, each group by session first arrival (program-level
//      FCFS); strict head-of-line blocking, and when the head does not fit
//      while nothing runs and a pin is held, the latest-`until` pin is
//      released (the next step uses the space).
//
// Constants (all MARS repo, vllm-continuum estimate_with_func.py/scheduler.py;
// the first two are also Continuum's public code): FIXED_THRESHOLD_CONTINUUM
// 2.0 s (threshold and TTL), pin cutoff 0.01 s, record_threshold_k 100,
// reload 2e-4 s/token, delay window 200.
// Deviations: the repo measures a tool's duration as next arrival − previous
// departure of the job; the simulator feeds the tool's wall time
// (on_tool_end), and in an engine libtandem measures it as the repo does
// (libclient/coordinator.h). The repo keeps every duration it ever saw; a
// scheduler that runs for months cannot, so the dynamic variant keeps the
// newest sample_window (32,768) per kind and in all, more than any of our
// simulated runs observes, and at most kMaxToolKinds kinds (a kind forgotten
// at that bound counts as never observed again, sched/kind_table.h).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "sched/kind_table.h"
#include "sched/policy.h"
#include "sched/registry.h"
#include "sched/sorted_window.h"

namespace tandem::sched {

inline constexpr ParamSpec kContinuumParams[] = {
    {"continuum_dy", 0, 0, 1, "1: dynamic TTL (argmax of expected reward over observed durations); 0: fixed TTL"},
    {"threshold_s", 2.0, 0, 3600, "fixed: pin only if the tool kind's mean duration is <= this (MARS repo)"},
    {"ttl_s", 2.0, 0, 3600, "fixed TTL, and the dynamic variant's cold-start TTL (MARS repo)"},
    {"min_pin_s", 0.01, 0, 60, "a TTL at or below this is no pin (MARS repo)"},
    {"min_samples", 100, 0, 1e6, "dynamic: samples needed before durations are trusted (MARS repo)"},
    {"reload_s_per_token", 2e-4, 0, 1, "dynamic: recompute cost of the context, s/token (MARS repo)"},
    {"delay_window", 200, 1, 1e6, "dynamic: preempt->reschedule delays averaged for T (MARS repo)"},
    {"sample_window", 32768, 1, 1e6,
     "dynamic: the newest tool durations kept, per kind and in all (the MARS repo keeps every one)"},
};

struct ContinuumParams {
  bool dynamic = false;
  double threshold_s = 2.0;
  double ttl_s = 2.0;
  double min_pin_s = 0.01;
  std::uint32_t min_samples = 100;
  double reload_s_per_token = 2e-4;
  std::uint32_t delay_window = 200;
  std::uint32_t sample_window = 32768;
};

ContinuumParams continuum_params(const PolicyParams& p);
std::unique_ptr<StepScheduler> make_continuum_step(const PolicyParams& p);

// Thread-safety: one thread (the engine's scheduling loop).
class ContinuumStepScheduler final : public StepScheduler {
 public:
  explicit ContinuumStepScheduler(ContinuumParams params = {}) : params_(params) {}
  std::string_view name() const override { return params_.dynamic ? "continuum_dy" : "continuum"; }
  void plan(const StepInput& in, Time now, StepPlan& out) override;
  KeepPlan on_round_end(const RoundEndInfo& info, Time now) override;
  void on_tool_end(SessionId session, ToolKind kind, Duration wall, Time now) override;
  void on_session_end(SessionId session, Time now) override;

  // The TTL (seconds) a round end with a following tool of `kind` and
  // `context_tokens` gets now; 0 = no pin.
  double ttl_for(ToolKind kind, std::uint32_t context_tokens) const;
  // Mean observed duration of `kind` (0 if never observed).
  double mean_s(ToolKind kind) const;
  // Kinds with durations of their own (at most kMaxToolKinds).
  std::size_t kinds() const { return kinds_.size(); }
  // The dynamic variant's inputs, exposed for tests.
  double queue_delay_s() const;
  double eta() const;

 private:
  // Scratch of plan(), kept to reuse its storage from step to step.
  QueuedPins queued_;
  std::vector<char> pin_alive_;                                 // per StepInput::pinned entry
  std::vector<std::uint32_t> running_;                          // running request indices, in running order
  std::vector<SessionId> pinned_sessions_;                      // sessions still pinned, sorted
  using WaitKey = std::tuple<bool, Time, bool, std::uint32_t>;  // (not pinned, first arrival, not preempted, index)
  std::vector<WaitKey> keyed_;
  struct Kind {
    double sum = 0;
    std::uint64_t count = 0;
    SortedWindow samples;  // dynamic only: the newest sample_window
  };
  struct Session {
    Time first_arrival = Time::max();
    Time last_round_end = Time::min();
    std::uint32_t rounds_done = 0;
    std::vector<std::uint32_t> k_at_arrival;  // dynamic: rounds done when each request arrived
  };
  double dynamic_ttl(ToolKind kind, std::uint32_t context_tokens) const;

  ContinuumParams params_;
  KindTable<Kind> kinds_{kMaxToolKinds};  // sched/kind_table.h: the kinds used longest ago are forgotten
  SortedWindow all_;                      // dynamic: the newest samples of every kind
  std::unordered_map<SessionId, Session> sessions_;
  std::vector<Session*> session_of_;                       // request index → its session, for one plan()
  std::unordered_map<std::uint64_t, std::uint64_t> seen_;  // request id → the last plan() that saw it
  std::unordered_map<std::uint64_t, Time> preempted_at_;   // for the queue delay T
  std::uint64_t generation_ = 0;
  std::deque<double> delays_;
  // η's running sums over (k, N−k) pairs of finished programs.
  double eta_n_ = 0, eta_x_ = 0, eta_y_ = 0, eta_xx_ = 0, eta_yy_ = 0, eta_xy_ = 0;
};

}  // namespace tandem::sched
