// mars (control half): MARS's External Control Plane as its preview code does
// it ([mars_code] §2.1, §2.2; replay runner `_fill_active_mars`,
// run_experiment.py L1958–2550 at 7e649f3).
//
// Every tick:
//   1. CPU pressure: r = active_tools / tool_cores, hysteresis (set at
//      r ≥ cpu_backlog_high, clear at r ≤ cpu_backlog_low), and the static cap
//      W_cpu = clamp(ceil(N · max(0.1, (low + high) / 2)), W_min, W_max).
//   2. KV pressure from the engines' KvPoolStats: usage u, hysteresis (set at
//      u ≥ 0.90, clear at u ≤ 0.85), the soft cap W_kv (linear ramp from W_max
//      at 0.85 to W_min at 0.90), and the slack budget = free − ceil(10% total).
//   3. AIMD, at most once per control_interval: ×0.7 (floor) when either side
//      is overloaded, +1 when both are healthy with slack, hold otherwise; the
//      caps W_cpu and W_kv are folded into the window.
//   4. PackQueue: slots = min(W, W_cpu, W_kv) − live sessions, then one of
//      four orderings (tail KV packing, low-pressure FCFS, CPU-overloaded
//      long-first, short-first with "needle insertion" of long sessions),
//      first-fit against the KV budget. Admissions come out in decision order.
//
// CPU signal: only active_tools / tool_cores (the count signal of §2.9). The
// tool-queue-wait EMA is dead in MARS's replay runner (§2.9: a key mismatch
// keeps it None), so the cpu_queue_wait_* parameters are declared for
// completeness and unused. PSI (CpuView::psi_some_avg10) and the eBPF run-queue
// delay are NOT used: MARS has no such signal, and `mars` reproduces MARS. The
// `tandem` policy is where they belong.
//
// Deviations and judgement calls are commented at the code that makes them,
// each naming its section of [mars_code].
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "sched/policy.h"
#include "sched/registry.h"

namespace tandem::sched {

struct MarsControlParams {
  std::uint32_t window_max = 30;   // W_max, --mars-active-pool-size
  std::uint32_t window_min = 4;    // W_min (clamped to [1, W_max])
  std::uint32_t window_init = 30;  // W_init (clamped to [W_min, W_max])
  std::uint32_t window_inc = 1;    // additive increase per control tick
  double window_dec_factor = 0.7;  // multiplicative decrease (clamped to [0.1, 0.99])
  double control_interval_s = 0.2;
  double kv_target_ratio = 0.9;  // u_high; u_low = u_high − 0.05; reserve = 1 − target
  double cpu_backlog_low = 1.0;  // active_tools / tool_cores
  double cpu_backlog_high = 4.0;
  double cpu_queue_wait_low_s = 2.0;          // unused: see the file comment
  double cpu_queue_wait_high_s = 5.0;         // unused: see the file comment
  std::uint32_t long_prefill_tokens = 50000;  // est > this is "long"; 0 = no long class
  double long_kv_ratio = 0.95;                // tail budget = floor(free · ratio)
  std::uint32_t non_tail_long_cap = 2;        // long sessions in flight outside tail mode
  double needle_wait_s = 5.0;                 // short queue empty this long → long may enter
  double tail_quiet_s = 10.0;                 // no arrival this long → "emission finished"
};

inline constexpr ParamSpec kMarsControlParams[] = {
    {"window_max", 30, 1, 4096, "admission window ceiling W_max (MARS --mars-active-pool-size; replay 30)"},
    {"window_min", 4, 1, 4096, "admission window floor W_min (clamped to [1, window_max]; replay 4)"},
    {"window_init", 30, 1, 4096, "initial window (clamped to [window_min, window_max]); MARS starts at the max"},
    {"window_inc", 1, 0, 4096, "AIMD additive increase per control tick when CPU and KV are healthy"},
    {"window_dec_factor", 0.7, 0.1, 0.99, "AIMD multiplicative decrease (floor) per control tick under overload"},
    {"control_interval_s", 0.2, 0.01, 60, "minimum seconds between AIMD updates (pressure is tracked every tick)"},
    {"kv_target_ratio", 0.9, 0.1, 0.999,
     "KV usage that sets kv_overloaded (clears at 0.05 below); 1 - ratio of the pool is kept as reserve"},
    {"cpu_backlog_low", 1, 0, 1024,
     "active_tools / tool_cores at or below which CPU overload clears and the window may grow"},
    {"cpu_backlog_high", 4, 0, 1024, "active_tools / tool_cores at or above which the CPU is overloaded"},
    {"cpu_queue_wait_low_s", 2, 0, 3600,
     "declared for completeness, unused: MARS's tool-queue-wait EMA is dead in its replay runner"},
    {"cpu_queue_wait_high_s", 5, 0, 3600,
     "declared for completeness, unused: MARS's tool-queue-wait EMA is dead in its replay runner"},
    {"long_prefill_tokens", 50000, 0, 1e9,
     "a waiting session whose submitted prompt exceeds this many tokens is long (0 = no long class)"},
    {"long_kv_ratio", 0.95, 0.01, 1, "tail mode packs long sessions into floor(free KV blocks x this ratio)"},
    {"non_tail_long_cap", 2, 0, 4096, "long sessions in flight allowed outside tail mode (needle insertion)"},
    {"needle_wait_s", 5, 0, 3600,
     "a long session may be needle-inserted once no short session has waited for this long (or none is live)"},
    {"tail_quiet_s", 10, 0, 3600,
     "tail mode needs no new session for this long (stand-in for MARS's 'emission finished'; 0 = off)"},
};

MarsControlParams mars_control_params(const PolicyParams& params);
std::unique_ptr<ControlPolicy> make_mars_control(const PolicyParams& params);

// Which PackQueue ordering the last tick used (§2.2).
enum class MarsMode : std::uint8_t {
  kIdle,             // nothing waiting, or no free slot: PackQueue did not run
  kTail,             // only long sessions queued: first-fit in arrival order against the tail budget
  kLowPressureFcfs,  // healthy and the whole backlog fits the slots: arrival order
  kCpuLongFirst,     // CPU overloaded: largest estimate first
  kShortFirst,       // default: smallest estimate first, long sessions by needle insertion
};

std::string_view to_string(MarsMode m);

// Thread-safety: one thread (the host's control loop).
class MarsControl final : public ControlPolicy {
 public:
  explicit MarsControl(const MarsControlParams& params);

  std::string_view name() const override { return "mars"; }
  void tick(const NodeModel& model, Time now, Actions& out) override;
  // Sets the window ceiling and floor to `engines` times the configured ones
  // (MARS's window of 30 is for its one engine). The AIMD state is scaled
  // with them. MARS itself never calls this; `tandem` does with its engine
  // count (tandem.h, addition 8). `engines` ≥ 1.
  void scale_window(std::uint32_t engines);
  // Stops the CPU side from capping or shrinking the window: admission
  // follows KV pressure alone. MARS itself never calls this; `tandem` does
  // (tandem.h, addition 7).
  void ignore_cpu() { ignore_cpu_ = true; }
  // Counts pinned blocks as free in the KV pressure admission sees. MARS
  // never pins; `tandem` pins KV it can release on demand (tandem.h).
  void pinned_is_free() { pinned_is_free_ = true; }
  // Long sessions as tandem takes them (tandem.h, addition 10): a session
  // is long only if its first prompt is also more than 4 times the median of
  // the last 256 first prompts (note_first_prompt; MARS's threshold alone
  // until 16 are noted), so a workload of only long sessions has none. Long
  // ones enter by KV fit after the short ones, with no needle wait and no
  // tail mode, up to non_tail_long_cap (MARS's cap on its one engine with a
  // 262k-token pool) per engine or per 262k tokens of the node's KV pool,
  // whichever allows more, and at least one. MARS itself never calls this.
  void long_by_fit() { long_by_fit_ = true; }
  // A session's first prompt (its first round, submitted while it waits for
  // admission), for long_by_fit()'s median; 0 is ignored.
  void note_first_prompt(std::uint32_t tokens);
  // While the tools' CPU pressure (CpuView::psi_some_avg10) is at or above
  // `psi` (%), an acting session with no KV on the GPU holds no window slot:
  // the window bounds the sessions competing for the GPU, and one that waits
  // in a starved tool with its KV gone is not among them. MARS itself never
  // calls this; `tandem` does (tandem.h, addition 19). Unknown pressure
  // (< 0) never frees a slot.
  void free_cpu_bound_slots(double psi) { cpu_slot_psi_ = psi; }

  // Read-only state, for tests and `tandemctl`.
  const MarsControlParams& params() const { return p_; }
  std::uint32_t window() const { return w_aimd_; }  // W_aimd (caps folded in at each control)
  std::optional<std::uint32_t> admission_window() const override { return w_aimd_; }
  std::uint32_t w_cpu() const { return w_cpu_; }
  std::uint32_t w_kv() const { return w_kv_; }
  std::uint32_t w_adm() const { return w_adm_; }  // min(W_aimd, W_cpu, W_kv) at the last tick
  bool cpu_overloaded() const { return cpu_overloaded_; }
  bool kv_overloaded() const { return kv_overloaded_; }
  bool kv_known() const { return kv_known_; }
  double kv_usage() const { return kv_usage_; }                   // 0 when unknown
  std::uint64_t budget_blocks() const { return budget_blocks_; }  // 0 when unknown
  MarsMode last_mode() const { return last_mode_; }
  std::size_t first_prompts_noted() const { return first_prompts_.size(); }  // at most 256
  // Long sessions admitted and still live, with the blocks reserved for each.
  const std::map<SessionId, std::uint64_t>& long_in_flight() const { return long_in_flight_; }

 private:
  struct Candidate {
    SessionId id = 0;
    Time opened{};
    std::uint64_t est = 0;     // tokens
    std::uint64_t blocks = 0;  // ceil(est / block size)
    bool is_long = false;
  };

  void update_cpu(const CpuView& cpu);
  void update_kv(const NodeModel& model);
  void control(Time now);
  void pack(const NodeModel& model, Time now, Actions& out);

  MarsControlParams p_;
  bool ignore_cpu_ = false;
  bool pinned_is_free_ = false;
  bool long_by_fit_ = false;
  double cpu_slot_psi_ = -1;  // free_cpu_bound_slots(); < 0: off
  MarsControlParams base_;    // the configured windows, before scale_window()
  std::uint32_t window_scale_ = 1;
  Duration interval_{};
  Duration needle_wait_{};
  Duration tail_quiet_{};

  // AIMD and pressure state (§2.1).
  std::uint32_t w_aimd_ = 0;
  std::uint32_t w_cpu_ = 0;
  std::uint32_t w_kv_ = 0;
  std::uint32_t w_adm_ = 0;
  bool cpu_overloaded_ = false;
  bool cpu_healthy_for_growth_ = true;
  bool kv_overloaded_ = false;
  bool kv_known_ = false;
  double u_high_ = 0.9;  // kv_overloaded sets at or above
  double u_low_ = 0.85;  // and clears at or below
  double kv_usage_ = 0.0;
  std::uint64_t kv_free_ = 0;
  std::uint64_t budget_blocks_ = 0;
  std::optional<Time> last_control_;

  // PackQueue state (§2.2).
  std::optional<Time> short_empty_since_;
  static constexpr std::size_t kPromptWindow = 256;
  std::vector<std::uint32_t> first_prompts_;  // note_first_prompt(): the last kPromptWindow, a ring
  std::size_t prompt_next_ = 0;
  std::vector<std::uint32_t> prompt_scratch_;  // pack()'s copy for the median
  std::optional<Time> last_arrival_;
  std::map<SessionId, std::uint64_t> long_in_flight_;
  std::vector<Candidate> waiting_;  // pack()'s, kept for its capacity
  MarsMode last_mode_ = MarsMode::kIdle;
};

}  // namespace tandem::sched
