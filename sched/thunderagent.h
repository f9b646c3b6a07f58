// thunderagent: ThunderAgent's program-level pause/restore as a control half
// ([baselines] §1). Its step half is plain vLLM V1 (fcfs.h): the
// released system is an HTTP proxy in front of unmodified engines, and its
// only actuators are "hold this program's next call" and "send it to that
// backend" — here admit, pause and restore(session, engine).
//
// Mapping onto tandem:
//   program            = session; backend = engine; C_total = total_blocks × block_size
//   registered on b    = REASONING or ACTING session whose engine is b
//   global queue       = PAUSED sessions + WAITING sessions with a round submitted
//   program phase      = ThunderAgent's, not the session table's: ACTING from a
//                        round's end until the next round is submitted (the
//                        table's ACTING ends at TOOL_END); REASONING otherwise
//   c_p (tokens)       = exact context from the engine (§1.5 item 4): the
//                        submitted prompt while a round is in flight, prompt +
//                        output once it ended; shared_tokens = 0
//
// Decisions:
//   * every check_interval (Δt, 5 s): greedy resume (best-fit-decreasing over
//     one queue shared by all engines), then the thrashing check, which pauses
//     ACTING programs smallest first and then marks REASONING programs
//     smallest first (router.py order: resume first, then pause);
//   * at request boundaries (ROUND_SUBMIT, ROUND_END, TOOL_END seen by
//     on_event), the next tick runs what router.py runs at a call's arrival:
//     a brand-new program is admitted if the queue is empty and it fits,
//     otherwise it joins the queue. Nothing else happens between checks;
//   * every tick: a pending call that has waited resume_timeout_s (1800 s) is
//     force-restored without a capacity check (router.py's waiter timeout).
//
// Contract with the host (daemon or simulator), which applies the actions:
//   * pause of a session with a round in flight (a REASONING program) takes
//     effect at that round's end (ThunderAgent's marked_for_pause: the running
//     call is never interrupted); without a round in flight it takes effect at
//     once. Until the host applies it the policy keeps the session "marked"
//     and never re-emits the pause.
//   * admit carries no engine: a WAITING session is admitted onto the engine
//     its first round was submitted to, so for new programs the best-fit
//     placement is restricted to that engine (see the .cc). Restores pick the
//     engine freely (a different engine means recompute, as in ThunderAgent).
//
// The variant implemented is the "fixed" one of [baselines] §1.5 (the paper's
// semantics); every place where it differs from the released router.py
// (§1.4) is commented in the .cc, and `released_pause_loop` / `decay_mode`
// reproduce the released behaviour.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <vector>

#include "sched/policy.h"
#include "sched/registry.h"

namespace tandem::sched {

// Where f(t) = 2^-(t/h) weights the tokens of ACTING programs (§1.5 item 3).
enum class ThunderDecay : std::uint8_t {
  kNone = 0,            // acting tokens count acting_weight × c everywhere
  kResumeOnly = 1,      // released router.py with --use-acting-token-decay
  kCheckAndResume = 2,  // the paper (Eq. 7): thrashing check, admission and resume
};

// The doc line of each entry ends with its source.
inline constexpr ParamSpec kThunderAgentParams[] = {
    {"check_interval_s", 5.0, 0.01, 3600.0,
     "period Δt of the capacity check, seconds (router.py scheduler_interval; paper Δt = 5)"},
    {"buffer_tokens", 100.0, 0.0, 1e6,
     "decode headroom counted per registered program, tokens (router.py BUFFER_PER_PROGRAM)"},
    {"acting_weight", 1.0, 0.0, 1.0,
     "weight w of ACTING programs' tokens where no decay applies (router.py --acting-token-weight)"},
    {"decay_mode", 2.0, 0.0, 2.0,
     "0 none, 1 resume only (released router.py), 2 check + admission + resume (paper Eq. 7; [baselines] §1.5)"},
    {"decay_half_life_s", 1.0, 1e-3, 3600.0,
     "h in f(t) = 2^-(t/h), t = seconds since the program entered ACTING (router.py: h = 1 s)"},
    {"resume_timeout_s", 1800.0, 1.0, 1e7,
     "a call held this long is force-restored without a capacity check (router.py waiter timeout)"},
    {"lambda_max", 1.0, 0.1, 4.0,
     "thrashing when usage > lambda_max × C_total; restores never exceed it (paper §4.3.1: 1)"},
    {"lambda_min", 1.0, 0.1, 4.0, "restore only onto an engine whose usage < lambda_min × C_total (paper §4.3.1: 1)"},
    {"released_pause_loop", 0.0, 0.0, 1.0,
     "1 = released pause loop: marking a REASONING program does not lower usage, so every one is marked "
     "(router.py before PR #34)"},
};

struct ThunderAgentParams {
  Duration check_interval = std::chrono::seconds(5);
  double buffer_tokens = 100.0;
  double acting_weight = 1.0;
  ThunderDecay decay = ThunderDecay::kCheckAndResume;
  double decay_half_life_s = 1.0;
  Duration resume_timeout = std::chrono::seconds(1800);
  double lambda_max = 1.0;
  double lambda_min = 1.0;
  bool released_pause_loop = false;
};

// REQUIRES: `p` was validated against kThunderAgentParams.
ThunderAgentParams thunderagent_params(const PolicyParams& p);
std::unique_ptr<ControlPolicy> make_thunderagent_control(const PolicyParams& p);

// Thread-safety: one thread (the host's control loop).
class ThunderAgentControl final : public ControlPolicy {
 public:
  explicit ThunderAgentControl(ThunderAgentParams params = {}) : p_(params) {}
  std::string_view name() const override { return "thunderagent"; }
  void on_event(const Event& event, const NodeModel& model, Time now) override;
  void tick(const NodeModel& model, Time now, Actions& out) override;

  const ThunderAgentParams& params() const { return p_; }
  // Whether a pause was emitted for `s` that the host has not applied yet.
  bool marked(SessionId s) const { return marks_.contains(s); }

 private:
  struct Program {
    SessionId id = 0;
    double tokens = 0;
    bool acting = false;
    Time acting_since{};
    bool marked = false;
    bool placed_now = false;  // admitted or restored in this tick
  };
  struct Backend {
    EngineId id = kNoEngine;
    double capacity = 0;  // C_total in tokens
    std::vector<Program> programs;
  };
  struct Mark {
    std::uint32_t round = 0;  // the session's round when the pause was emitted
  };
  // One tick's view: the engines with a known capacity and what is
  // registered on them, updated as the tick decides.
  using Ledger = std::map<EngineId, Backend>;

  Program program_of(const Session& s) const;
  double weight(const Program& prog, bool decayed, Time now) const;
  double used(const Backend& b, bool decayed, bool count_marked, Time now) const;
  Time pending_since(const Session& s) const;

  void prune(const NodeModel& model);
  Ledger build_ledger(const NodeModel& model) const;
  void force_timeouts(const NodeModel& model, Ledger& ledger, Time now, Actions& out);
  void admit_arrivals(const NodeModel& model, Ledger& ledger, Time now, Actions& out);
  void greedy_resume(const NodeModel& model, Ledger& ledger, Time now, Actions& out);
  void pause_until_safe(const NodeModel& model, Backend& b, Time now, Actions& out);

  ThunderAgentParams p_;
  bool checked_ = false;  // a periodic check has run
  Time next_check_{};
  bool boundary_ = false;                    // a request boundary since the last tick
  std::map<SessionId, Mark> marks_;          // paused while REASONING, not yet applied
  std::map<SessionId, EngineId> origin_;     // engine a PAUSED session was paused on
  std::map<SessionId, Time> pending_since_;  // when a held call (WAITING/PAUSED) arrived
  std::set<SessionId> queued_;               // WAITING sessions already put in the queue
  std::set<SessionId> decided_;              // sessions placed in the current tick
};

}  // namespace tandem::sched
