// tandem: everything MARS does, plus the five additions of docs/architecture.md "Policies", each
// behind a switch so the simulator can ablate it.
//
// Control half (TandemControl) wraps MarsControl, which keeps doing AIMD
// admission and PackQueue, and adds:
//   1. residency      — for every session whose tool is running, the
//                       expected-value rule of residency.h picks keep (pin),
//                       offload or drop — and "drop" releases the pin to the
//                       prefix cache (free at once, the prefix kept until the
//                       LRU needs it); actions go out when the choice
//                       changes, and pins outlast the next evaluation. A
//                       session is evaluated at the first tick after its
//                       state changes and then in a rotation of at most
//                       residency_budget sessions a tick, so a tick stays
//                       bounded at 100K sessions;
//   3. cpu_weights    — sessions whose KV is being kept get a higher
//                       cpu.weight, so the tools holding scarce GPU memory
//                       finish first; everyone else gets the default back;
//   4. global_queue   — paused sessions are restored onto whichever engine
//                       has the most room, with a bonus for the engine that
//                       still caches their prefix;
//   5. growth_check   — the capacity check counts the KV that running decodes
//                       will still grow into, not only what they hold (work
//                       not yet admitted is admission's business); when
//                       the projection overflows an engine, the acting
//                       sessions that are cheapest to lose (lowest keep value
//                       per block, scored over a bounded rotating sample) are
//                       paused until it fits, and restored when pressure
//                       falls below resume_pressure.
// Step half (TandemStepScheduler) wraps MarsStepScheduler and adds:
//   2. cost_eviction  — at a tool call the round's KV is pinned (the control
//                       half refines the choice within a tick); when a step
//                       needs blocks that are not free, pins are released in
//                       increasing order of P(resume soon) × recompute cost
//                       per block freed — cheapest loss first — before MARS
//                       preempts anything. Switched off, pins go in order of
//                       expiry. A pin whose session's next round is already
//                       queued is never released: it is about to be used.
//   6. knee_quanta    — MARS's MLFQ quanta (2048 … 256 tokens) assume a
//                       step's cost grows with its tokens. On a model whose
//                       steps are weight-bound up to a large size (an MoE
//                       streaming its experts: ~1,350 tokens for
//                       Qwen3-30B-A3B on H100) small chunks cost a full step
//                       each and stretch every prefill. The quanta are scaled
//                       by saturating_tokens / smallest quantum (never below
//                       MARS's), so the smallest one is a compute-bound step.
//   7. kv_admission   — MARS also gates admission on the host CPU: a
//                       static cap of ~2.5 sessions per tool core and a
//                       multiplicative decrease while running tools outnumber
//                       the cores, whatever those tools do (most agent tools —
//                       Read, Grep, Edit — barely use a core). In the
//                       simulator every form of CPU-gated admission we tried
//                       (tool counts, PSI at 60/90/95/99 %) only lengthened
//                       sessions: holding a session back does not shorten the
//                       tools already running. tandem admits on KV pressure
//                       alone and handles CPU contention with cpu.weight.
//   8. engine_window  — MARS's admission window (30 sessions) is sized for
//                       its one engine; on a node of N engines tandem's
//                       ceiling, floor and start are N times MARS's, so
//                       short sessions that barely use KV are not queued
//                       behind a cap the GPUs do not need.
// Issue 20 (small KV pools and long pauses; docs/results.md) added:
//   9. pin_admission  — MARS's admission reads KV usage, and tandem's pins are
//                       usage MARS never had: pinned KV (which the step half
//                       releases on demand) counts as room, so KV kept for
//                       sessions in long pauses does not close the window.
//  10. long_admission — MARS admits at most two "long" sessions (first prompt
//                       > 50k tokens) at a time, and only once no short one
//                       has waited for 5 s: a rule for its 262k-token pool
//                       and its mix. tandem counts a session long only if
//                       its first prompt is also 4x the median of the last
//                       256 (a workload of only long sessions has none), and
//                       admits long ones by KV fit after the short ones, up
//                       to MARS's cap per engine or per 262k tokens of KV,
//                       whichever allows more, with no needle wait
//                       (MarsControl::long_by_fit).
//  11. prompt_projection — the growth check projects every admitted round's
//                       whole prompt plus growth (and the kept KV), not just
//                       what its prefill has allocated so far: on a pool of
//                       ~3 sessions the missing prefill remainder was what
//                       overflowed into preemptions.
//  12. queue_admission — a new session enters only if its round (whole
//                       prompt and growth) fits under resume_pressure on its
//                       engine's projection, as a restore would. It no longer
//                       also waits while a paused session's round waits to be
//                       restored: that gate cost 5-16 % of mean E2E on the
//                       validation part's small-KV pools (docs/results.md).
//                       Only a paused round passed over for
//                       restore_wait_max_s holds new sessions back, until it
//                       is restored: a stream of small sessions cannot
//                       starve it.
//  13. pending_restore — paused sessions whose next round waits are restored
//                       before those still in their tool.
//  14. host_prices    — offload's cost counts the link (its backlog and the
//                       copy time, during which the blocks stay allocated);
//                       a full host memory takes a copy only for a session
//                       expected back sooner than the copy it would evict
//                       (Belady's rule on the survival model).
//  15. pooled_prior   — a tool kind seen few times is judged by every tool
//                       this node has seen, not by the dev traces' prior
//                       (median 0.08 s): pauses never seen before (a human
//                       thinking for minutes) are learned from the node.
//  16. swap_preempt   — a running request MARS's victim rule preempts is
//                       swapped to host memory instead of recomputed.
//  17. fill_idle_budget — MARS caps every prefill chunk at its MLFQ quantum,
//                       even when nothing else wants the step: a lone long
//                       prefill then crawls at 256..2048 tokens a step (on an
//                       MoE, each such step costs a full expert sweep). When
//                       a step holds only prefills and nothing else is
//                       queued, they take the unused budget.
// Issue 20 again (4 tool cores on the H200 presets; docs/results.md):
//  19. cpu_slots      — MARS's window counts every live session, so when the
//                       tool cores are the bottleneck it fills with sessions
//                       waiting in starved tools whose KV is gone, and new
//                       sessions wait while the GPU idles. While the tools'
//                       CPU PSI (some avg10) is at or above cpu_slot_psi
//                       (90 %), an acting session with no KV on the GPU holds
//                       no slot. KV admission still decides whether a new
//                       session fits, and the growth check pauses sessions if
//                       the returning ones overflow the pool.
//  20. cpu_las        — least attained service on the tool cores: a
//                       session's cpu.weight falls 2.5x at each level of its
//                       tools' total wall time (from las_step_s, 4x apart;
//                       at most las_levels levels), so short tools finish
//                       first where the cores are the bottleneck. Needs
//                       cpu_weights.
// Issue 20 again (out of sample: long sessions on small pools):
//  21. headroom_keep  — keep a session's KV through its tool while the
//                       blocks expected back within the horizon (P x its
//                       blocks) exceed its engine's headroom, (1 -
//                       resume_pressure) x the pool. The KV price is a
//                       block's at the margin, but so large a release is
//                       not at the margin: the session came back to wait
//                       for the engine to drain that much room, at every
//                       round (mars-mixed and mars-long on
//                       h100-qwen3-30b-a3b; docs/results.md).
// With every switch off, tandem behaves as mars (the ablation baseline).
//
// Judgement calls, to be tuned by the simulator (issue 4): the horizon h
// (1 s), the decode-growth estimate (256 tokens per running session), the
// pause and resume pressures (0.9 and 0.8, tuned in tandem-sim from 1.0 and
// 0.9: docs/results.md), the critical cpu.weight (400),
// the initial pin at a tool call (2 s), the locality bonus (10 % of the pool),
// the residency budget (1,024 sessions a tick: a full rotation through 50K
// acting sessions takes about 10 s of 200 ms ticks), and the CPU pressure
// from which addition 19 frees slots (90 %: set by its meaning, since the
// tuning part never starves its tools).
// Not done yet: ordering *running* victims by cost per block inside MARS's
// priority order (MARS's own victim order is kept).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "base/id_map.h"
#include "sched/mars_control.h"
#include "sched/mars_step.h"
#include "sched/residency.h"
#include "sched/tool_model.h"

namespace tandem::sched {

struct TandemParams {
  bool residency = true;
  bool cost_eviction = true;
  bool cpu_weights = true;
  bool global_queue = true;
  bool growth_check = true;
  bool knee_quanta = true;
  bool kv_admission = true;
  bool engine_window = true;
  double horizon_s = 1.0;
  bool offload = true;
  PriceParams price;
  CostModel cost;
  std::uint32_t cpu_weight_critical = 400;
  std::uint32_t cpu_weight_default = 100;
  // Addition 20: least attained tool time first on the tool cores.
  bool cpu_las = true;
  double las_step_s = 4.0;
  std::uint32_t las_levels = 16;  // at most this many levels below the default weight (16: until it is 1)
  std::uint32_t growth_decode_tokens = 256;
  double pause_pressure = 0.9;
  double resume_pressure = 0.8;
  double initial_pin_s = 2.0;
  double locality_bonus = 0.1;
  std::uint32_t residency_budget = 1024;
  // Additions 9–15 (issue 20: the small-KV and long-pause regimes).
  bool pin_admission = true;
  bool long_admission = true;
  bool prompt_projection = true;
  bool queue_admission = true;
  double restore_wait_max_s = 600;  // queue_admission: how long new sessions may pass a paused round (0: forever)
  bool pending_restore = true;
  bool host_prices = true;
  bool pooled_prior = true;
  bool swap_preempt = true;
  bool fill_idle_budget = true;
  // Addition 19: CPU-bound sessions without KV hold no window slot.
  bool cpu_slots = true;
  double cpu_slot_psi = 90;  // tools' CPU PSI some avg10 (%) from which it acts
  // Addition 21: keep KV while P x blocks exceeds the engine's headroom (1 - resume_pressure) x pool.
  bool headroom_keep = true;
  // Addition 18 (issue 22): admission that protects host memory.
  bool host_admission = true;
  double host_psi_high = 10.0;   // memory PSI some avg10 (%) that cuts the host window
  double host_low = 0.75;        // host memory use at or below which the window grows
  double host_high = 0.9;        // at or above which it is cut; also the projection's ceiling
  double host_interval_s = 0.2;  // AIMD control interval (MARS's T_ctl)
  double host_mean_s = 30;       // smoothing of the memory a live session holds
  bool host_peaks = true;        // judge by the highest use of the last host_mean_s, not the use now
  double max_remaining_s = 3600;
};

inline constexpr ParamSpec kTandemParams[] = {
    {"residency", 1, 0, 1, "addition 1: expected-value keep / offload / drop of KV while tools run"},
    {"cost_eviction", 1, 0, 1, "addition 2: release pins by cost per freed block (off: by expiry)"},
    {"cpu_weights", 1, 0, 1, "addition 3: higher cpu.weight for sessions whose KV is kept"},
    {"global_queue", 1, 0, 1, "addition 4: restore paused sessions onto the engine with most room"},
    {"growth_check", 1, 0, 1, "addition 5: capacity check counts the growth of running decodes; pause on overflow"},
    {"knee_quanta", 1, 0, 1, "addition 6: scale the MLFQ quanta so the smallest is a compute-bound step"},
    {"kv_admission", 1, 0, 1, "addition 7: admission follows KV pressure alone, not MARS's CPU gate"},
    {"engine_window", 1, 0, 1, "addition 8: the admission window scales with the node's engine count"},
    {"pin_admission", 1, 0, 1, "addition 9: admission counts pinned KV as room (the step half releases it on demand)"},
    {"long_admission", 1, 0, 1,
     "addition 10: long sessions (outliers past 4x the median first prompt) by KV fit, MARS's cap per engine or pool"},
    {"prompt_projection", 1, 0, 1,
     "addition 11: the growth check projects every admitted round's whole prompt, not what its prefill allocated"},
    {"queue_admission", 1, 0, 1,
     "addition 12: a new session enters only if its round fits under resume_pressure, as a restore would"},
    {"restore_wait_max_s", 600, 0, 86400,
     "with queue_admission: seconds new sessions may enter while a paused session's round waits to be restored; "
     "after that they wait until it is (0: no bound)"},
    {"pending_restore", 1, 0, 1, "addition 13: paused sessions whose next round waits are restored first"},
    {"host_prices", 1, 0, 1,
     "addition 14: offload's cost counts the link (backlog, copy time) and a full host displaces a copy only for a "
     "session expected back sooner"},
    {"pooled_prior", 1, 0, 1,
     "addition 15: a tool kind seen few times is judged by every tool this node has seen, not the dev traces' prior"},
    {"horizon_s", 1.0, 0.01, 600, "h: how far ahead a residency decision looks (seconds)"},
    {"offload", 1, 0, 1, "allow offloading KV to host memory"},
    {"idle_pressure", 0.7, 0, 1, "pool pressure (allocated + queued) below which KV is free"},
    {"full_price", 16 * 20e-6, 0, 1, "KV price at pressure 1 (GPU-seconds per block-second)"},
    {"prefill_us_per_token", 20.0, 0, 1e4, "recompute cost per token (the step-time model's b)"},
    {"attention_us_per_pair", 1.3e-3, 0, 1, "recompute attention cost per query-key pair (the step-time model's a_pf)"},
    {"swap_us_per_token", 3.3, 0, 1e4, "host-to-GPU reload cost per token (PCIe)"},
    {"cpu_weight_critical", 400, 1, 10000, "cpu.weight of sessions whose KV is kept"},
    {"cpu_weight_default", 100, 1, 10000, "cpu.weight of every other session"},
    {"cpu_las", 1, 0, 1,
     "addition 20: least attained tool time first: a session's cpu.weight falls 2.5x at each level of its tools' "
     "total wall time (needs cpu_weights)"},
    {"las_step_s", 4.0, 0.001, 1e6,
     "tools' total wall time at which cpu_las's first level ends (seconds; each next is 4x)"},
    {"las_levels", 16, 1, 16,
     "at most this many cpu_las levels below cpu_weight_default (the default: until the weight is 1; fewer bound how "
     "long the longest sessions' tools wait, at some cost in mean E2E: docs/results.md)"},
    {"headroom_keep", 1, 0, 1,
     "addition 21: keep a session's KV while P(back within the horizon) x its blocks exceeds its engine's headroom, "
     "(1 - resume_pressure) x the pool"},
    {"growth_decode_tokens", 256, 0, 1 << 20, "tokens each running session is expected to still generate"},
    {"pause_pressure", 0.9, 0.1, 2,
     "projected pressure above which acting sessions are paused (tuned in tandem-sim: docs/results.md)"},
    {"resume_pressure", 0.8, 0.05, 2, "projected pressure below which paused sessions are restored"},
    {"initial_pin_s", 2.0, 0, 600, "pin at a tool call until the control half decides (seconds)"},
    {"locality_bonus", 0.1, 0, 1, "restore bonus, as a fraction of the pool, for the engine that held the session"},
    {"swap_preempt", 1, 0, 1, "addition 16: a running request MARS preempts is swapped to host memory, not recomputed"},
    {"fill_idle_budget", 1, 0, 1,
     "addition 17: a step of prefills alone, nothing else queued, gives them its unused budget (MLFQ quanta only "
     "split the budget among requests that compete)"},
    {"max_remaining_s", 3600, 1, 1e6, "the expected rest of a pause is counted up to this (seconds)"},
    {"cpu_slots", 1, 0, 1,
     "addition 19: while the tools' CPU pressure is at or above cpu_slot_psi, an acting session with no KV on the "
     "GPU holds no admission window slot (inactive where the host reports no CPU pressure)"},
    {"cpu_slot_psi", 90, 0, 100, "tools' CPU PSI some avg10 (%) at or above which addition 19 frees slots"},
    {"host_admission", 1, 0, 1,
     "addition 18: admission also keeps host memory: an AIMD window on live sessions cut by memory PSI, kills "
     "and use, a soft cap between host_low and host_high, and room for one more session's baseline and one tool "
     "burst (inactive where the host reports no memory capacity)"},
    {"host_psi_high", 10, 0, 100, "memory PSI some avg10 (%) from which the host window is cut"},
    {"host_low", 0.75, 0, 1, "host memory use (fraction) at or below which the host window grows"},
    {"host_high", 0.9, 0, 1, "host memory use at or above which the host window is cut, and the projection's ceiling"},
    {"host_interval_s", 0.2, 0.01, 60, "host window control interval (seconds; MARS's T_ctl)"},
    {"host_mean_s", 30, 0.1, 3600, "time constant (seconds) of the average memory a live session holds"},
    {"host_peaks", 1, 0, 1,
     "addition 18's projection and fit count the highest host memory use of the last host_mean_s (the running "
     "tools' bursts), not the use now"},
    {"residency_budget", 1024, 1, 1 << 24,
     "acting sessions (re)scored per tick besides those whose state changed: bounds a tick at scale; a full "
     "rotation takes acting/budget ticks"},
};

TandemParams tandem_params(const PolicyParams& p);

// Thread-safety: one thread.
class TandemControl final : public ControlPolicy {
 public:
  TandemControl(const MarsControlParams& mars, const TandemParams& params);

  std::string_view name() const override { return "tandem"; }
  void on_event(const Event& event, const NodeModel& model, Time now) override;
  void tick(const NodeModel& model, Time now, Actions& out) override;

  const MarsControl& mars() const { return mars_; }
  std::optional<std::uint32_t> admission_window() const override { return mars_.window(); }
  // What residency last decided for a session (nullptr if none).
  const ResidencyDecision* residency_of(SessionId s) const;

 private:
  struct Kept {
    ResidencyDecision decision;
    Time pinned_until{};
    std::uint32_t weight = 0;  // last cpu.weight sent, 0 = none
    // What the cgroup has: the last weight sent, else `default_weight`.
    std::uint32_t weight_or(std::uint32_t default_weight) const { return weight != 0 ? weight : default_weight; }
  };

  // Residency and CPU weight of one session, now.
  void evaluate(const NodeModel& model, const Session& s, Time now, Duration rotation, Actions& out);
  // cpu_las: the cpu.weight of a session by its tools' total wall time
  // (with the running call's so far), times critical / default if critical.
  std::uint32_t las_weight(const Session& s, Time now, bool critical) const;
  // A session left ACTING or is gone: give back its weight, forget it.
  void release(SessionId id, const Session* s, Actions& out);
  void check_growth(const NodeModel& model, Time now, Actions& out);
  // After check_growth: which paused rounds still wait, since when, and
  // which engine each holds new sessions off (restore_wait_max_s): the one
  // with the least projected pressure with global_queue, else its own.
  void hold_for_waiting_restores(const NodeModel& model, Time now);
  // The residency inputs of offload: host price, link wait, remaining pause.
  void offload_terms(const NodeModel& model, const Session& s, Time now, ResidencyInput& in) const;
  // Projected pool pressure of `e` including the growth of its running rounds.
  double projected_pressure(const EngineView& e, std::uint64_t running_rounds) const;
  // Addition 18: updates the host window; false when the host reports no
  // memory (nothing to gate on).
  bool host_control(const NodeModel& model, Time now);

  MarsControl mars_;
  TandemParams p_;
  std::map<SessionId, Kept> kept_;  // sessions residency has decided for
  // cpu_las: the level's weight a session's cgroup kept when its last tool
  // phase ended, for the sessions whose level is below the default. The
  // next phase starts from it (kept_ does not outlive a phase), so it does
  // not send a weight the cgroup already has. Empty while every session's
  // tools stay under las_step_s.
  base::IdMap<std::uint32_t> las_level_;
  // From on_event: handled first at the next tick, in ascending order
  // (sorted and made unique there; a vector, not a set: an event costs no
  // allocation).
  std::vector<SessionId> changed_;
  std::size_t acting_cursor_ = 0;  // rotation through the ACTING sessions
  std::size_t growth_cursor_ = 0;  // the growth check's rotation through them
  SessionId kept_cursor_ = 0;      // rotation through kept_
  // The growth check's engine id → its index in model.engines(), rebuilt
  // each tick (a member: a map made each tick would draw a random seed).
  base::IdMap<std::uint32_t> load_of_;
  std::optional<Time> last_tick_;
  Actions mars_out_;                     // MARS's actions of this tick, before admission is filtered
  std::map<EngineId, double> pressure_;  // projected pressure after this tick's restores
  bool paused_waiting_ = false;          // a paused session's round could not be restored
  // Paused sessions whose round waits to be restored, by id, with the tick
  // that first saw it waiting (restore_wait_max_s); rebuilt each tick.
  std::vector<std::pair<SessionId, Time>> restore_waits_;
  std::vector<std::pair<SessionId, Time>> restore_waits_next_;  // scratch
  std::vector<SessionId> restored_;                             // restored this tick (scratch)
  // Engines new sessions may not enter: one's paused round has waited
  // restore_wait_max_s and will be restored there first (few: a vector).
  std::vector<EngineId> held_;
  // Addition 18's state.
  double host_window_ = 0;  // live sessions host memory allows (0: not started)
  std::uint64_t host_kills_ = 0;
  std::optional<Time> last_host_control_;
  double host_mean_ = 0;  // bytes a live session holds, smoothed
  std::optional<Time> last_host_mean_;
  // host_peaks: the use sampled every host_interval_s over the last
  // host_mean_s, as a sliding maximum (decreasing use from the front).
  std::deque<std::pair<Time, std::uint64_t>> host_recent_;
  std::uint64_t host_use_ = 0;  // what the gate counts as used: now, or the recent peak

 public:
  double host_window() const { return host_window_; }  // for tests
};

// Thread-safety: one thread.
class TandemStepScheduler final : public StepScheduler {
 public:
  TandemStepScheduler(const MarsStepParams& mars, const TandemParams& params)
      : mars_(with_fill(mars, params.fill_idle_budget)), p_(params) {}

  std::string_view name() const override { return "tandem"; }
  void plan(const StepInput& in, Time now, StepPlan& out) override;
  KeepPlan on_round_end(const RoundEndInfo& info, Time now) override;
  void on_tool_end(SessionId session, ToolKind kind, Duration wall, Time now) override;
  void on_session_end(SessionId session, Time now) override;

  // GPU-seconds per block that releasing `pin` would cost (higher = keep longer).
  // A pin this scheduler did not see made (its engine pinned it before the
  // scheduler attached) is priced as `block_size`-token blocks, all full.
  double release_cost_per_block(const PinnedKv& pin, std::uint32_t block_size, Time now) const;

 private:
  static MarsStepParams with_fill(MarsStepParams m, bool fill) {
    m.fill_idle_budget = fill;
    return m;
  }
  struct PinInfo {
    ToolKind tool = 0;
    std::uint32_t context_tokens = 0;
    Time since{};
  };

  MarsStepScheduler mars_;
  TandemParams p_;
  QueuedPins queued_;   // scratch of plan(), kept to reuse its storage
  StepPlan mars_plan_;  // the same: MARS's plan of the step, reused across steps
  ToolDurationModel tools_;
  std::map<SessionId, PinInfo> pins_;
};

std::unique_ptr<ControlPolicy> make_tandem_control(const PolicyParams& p);
std::unique_ptr<StepScheduler> make_tandem_step(const PolicyParams& p);

}  // namespace tandem::sched
