// MARS's admission controller (AIMD over dual pressure) and PackQueue.
// Section numbers (§) refer to [mars_code].
#include "sched/mars_control.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

namespace tandem::sched {
namespace {

// long_by_fit() (tandem's addition 10). MARS's cap of non_tail_long_cap long
// sessions is for its node: one engine, a pool of 16,384 blocks of 16 tokens
// (docs/sim.md, h100nvl-qwen3-coder-30b-a3b). tandem scales the cap to the
// node's engines or pool.
constexpr double kMarsPoolTokens = 16384.0 * 16;
// A long session is also an outlier: its first prompt more than this many
// times the median of the last first prompts. Only this value was tried.
constexpr double kLongOverMedian = 4;
// Below this many first prompts seen, MARS's absolute threshold alone.
constexpr std::size_t kMinPromptSamples = 16;

// Python's round(): half to even. W_kv uses it (§2.1, "round(W_max − …)");
// exact ties are rare in floating point, but the rule is MARS's.
double round_half_even(double x) {
  double r = std::round(x);
  if (std::fabs(x - std::trunc(x)) == 0.5) r = 2.0 * std::round(x / 2.0);
  return r;
}

std::uint32_t clamp_window(double w, std::uint32_t lo, std::uint32_t hi) {
  if (!(w >= lo)) return lo;  // also NaN
  if (w >= hi) return hi;
  return static_cast<std::uint32_t>(w);
}

Duration seconds(double s) { return Duration(std::llround(s * 1e9)); }

std::uint32_t to_u32(double v) {
  if (!(v > 0)) return 0;
  if (v >= 4294967295.0) return 4294967295u;
  return static_cast<std::uint32_t>(std::llround(v));
}

bool is_live(SessionState s) {
  return s == SessionState::kReasoning || s == SessionState::kActing || s == SessionState::kPaused;
}

}  // namespace

std::string_view to_string(MarsMode m) {
  switch (m) {
    case MarsMode::kIdle:
      return "idle";
    case MarsMode::kTail:
      return "tail_kv_drain_fit";
    case MarsMode::kLowPressureFcfs:
      return "low_pressure_fcfs";
    case MarsMode::kCpuLongFirst:
      return "cpu_overloaded_long_first";
    case MarsMode::kShortFirst:
      return "short_first";
  }
  return "?";
}

MarsControlParams mars_control_params(const PolicyParams& params) {
  MarsControlParams p;
  p.window_max = to_u32(params.get("window_max"));
  p.window_min = to_u32(params.get("window_min"));
  p.window_init = to_u32(params.get("window_init"));
  p.window_inc = to_u32(params.get("window_inc"));
  p.window_dec_factor = params.get("window_dec_factor");
  p.control_interval_s = params.get("control_interval_s");
  p.kv_target_ratio = params.get("kv_target_ratio");
  p.cpu_backlog_low = params.get("cpu_backlog_low");
  p.cpu_backlog_high = params.get("cpu_backlog_high");
  p.cpu_queue_wait_low_s = params.get("cpu_queue_wait_low_s");
  p.cpu_queue_wait_high_s = params.get("cpu_queue_wait_high_s");
  p.long_prefill_tokens = to_u32(params.get("long_prefill_tokens"));
  p.long_kv_ratio = params.get("long_kv_ratio");
  p.non_tail_long_cap = to_u32(params.get("non_tail_long_cap"));
  p.needle_wait_s = params.get("needle_wait_s");
  p.tail_quiet_s = params.get("tail_quiet_s");
  return p;
}

std::unique_ptr<ControlPolicy> make_mars_control(const PolicyParams& params) {
  return std::make_unique<MarsControl>(mars_control_params(params));
}

MarsControl::MarsControl(const MarsControlParams& params) : p_(params) {
  // The replay runner's own clamps (§2.1 "Params").
  p_.window_max = std::max<std::uint32_t>(1, p_.window_max);
  p_.window_min = std::clamp<std::uint32_t>(p_.window_min, 1, p_.window_max);
  p_.window_init = std::clamp(p_.window_init, p_.window_min, p_.window_max);
  p_.window_dec_factor = std::clamp(p_.window_dec_factor, 0.1, 0.99);
  p_.control_interval_s = std::max(0.01, p_.control_interval_s);
  p_.long_kv_ratio = std::clamp(p_.long_kv_ratio, 0.0, 1.0);
  interval_ = seconds(p_.control_interval_s);
  // §2.2: the needle wait is max(T_ctl, min(5, 1/rps)); with no rps here the
  // parameter stands for min(5, 1/rps), and T_ctl still bounds it below.
  needle_wait_ = std::max(interval_, seconds(std::max(0.0, p_.needle_wait_s)));
  tail_quiet_ = seconds(std::max(0.0, p_.tail_quiet_s));
  u_high_ = std::clamp(p_.kv_target_ratio, 0.1, 0.999);
  u_low_ = std::max(0.0, std::min(u_high_ - 0.01, u_high_ - 0.05));
  w_aimd_ = p_.window_init;
  w_cpu_ = p_.window_max;
  w_kv_ = p_.window_max;
  w_adm_ = p_.window_init;
  base_ = p_;
}

void MarsControl::note_first_prompt(std::uint32_t tokens) {
  if (tokens == 0) return;
  if (first_prompts_.size() < kPromptWindow) {
    first_prompts_.push_back(tokens);
  } else {
    first_prompts_[prompt_next_] = tokens;
  }
  prompt_next_ = (prompt_next_ + 1) % kPromptWindow;
}

void MarsControl::scale_window(std::uint32_t engines) {
  engines = std::max<std::uint32_t>(1, engines);
  if (engines == window_scale_) return;
  const double ratio = static_cast<double>(engines) / window_scale_;
  window_scale_ = engines;
  p_.window_max = base_.window_max * engines;
  p_.window_min = base_.window_min * engines;
  p_.window_init = base_.window_init * engines;
  auto scaled = [&](std::uint32_t w) { return clamp_window(std::round(w * ratio), p_.window_min, p_.window_max); };
  w_aimd_ = scaled(w_aimd_);
  w_cpu_ = scaled(w_cpu_);
  w_kv_ = scaled(w_kv_);
  w_adm_ = scaled(w_adm_);
}

void MarsControl::update_cpu(const CpuView& cpu) {
  const std::uint32_t n = cpu.tool_cores;
  if (n == 0 || ignore_cpu_) {
    // Judgement (§2.1 uses max(1, N) with N always known): with the tool cores
    // unknown there is no backlog ratio to speak of, so the CPU side neither
    // caps the window nor signals overload; KV pressure alone drives AIMD.
    w_cpu_ = p_.window_max;
    cpu_overloaded_ = false;
    cpu_healthy_for_growth_ = true;
    return;
  }
  // §2.9: the replay runner's only live CPU signal is in-flight tools over
  // workers; the queue-wait EMA is None forever there, so its terms drop out.
  const double r = static_cast<double>(cpu.active_tools) / static_cast<double>(n);
  cpu_healthy_for_growth_ = r <= p_.cpu_backlog_low;
  // §2.1: W_cpu is static — it depends on N and the thresholds, not on load.
  const double ratio = std::max(0.1, (p_.cpu_backlog_low + p_.cpu_backlog_high) / 2.0);
  w_cpu_ = clamp_window(std::ceil(static_cast<double>(n) * ratio), p_.window_min, p_.window_max);
  if (cpu_overloaded_) {
    cpu_overloaded_ = !(r <= p_.cpu_backlog_low);
  } else {
    cpu_overloaded_ = r >= p_.cpu_backlog_high;
  }
}

void MarsControl::update_kv(const NodeModel& model) {
  // Judgement (MARS has one engine): with several engines the controller sees
  // the node as one pool — free and total summed over the engines that have
  // reported stats. Whether a session fits its own engine is the step
  // scheduler's business; admission is node-level.
  std::uint64_t total = 0;
  std::uint64_t free = 0;
  for (const auto& [id, e] : model.engines()) {
    if (!e.has_stats) continue;
    total += e.kv.blocks_total;
    const std::uint32_t pinned = pinned_is_free_ ? e.kv.blocks_pinned : 0;
    free += std::min(e.kv.blocks_free + pinned, e.kv.blocks_total);
  }
  kv_known_ = total > 0;
  if (!kv_known_) {
    // Judgement, after the OpenHands copy's no-KV rule (§2.2 "OpenHands
    // variant": kv_telemetry_reliable false → kv_overloaded forced true, W_kv
    // = mars_no_kv_active_limit, no long tasks). Here W_kv = W_min; the replay
    // runner instead treats missing usage as healthy, which would admit up to
    // W_max blind. Short sessions skip the first-fit check (no budget), as in
    // the replay's _try_select; long sessions wait (see pack()).
    kv_usage_ = 0.0;
    kv_free_ = 0;
    budget_blocks_ = 0;
    w_kv_ = p_.window_min;
    kv_overloaded_ = true;
    return;
  }
  // §2.1 says vLLM's usage is 1 − free/(num_gpu_blocks − 1) (the null block);
  // the runner's own fallback, and we, use free/total.
  kv_usage_ = std::clamp(1.0 - static_cast<double>(free) / static_cast<double>(total), 0.0, 1.0);
  kv_free_ = free;
  const double kv_target = std::clamp(p_.kv_target_ratio, 0.0, 0.999);
  const auto reserve = static_cast<std::uint64_t>(std::ceil(static_cast<double>(total) * (1.0 - kv_target)));
  // §2.1 budget_blocks = max(0, free − reserve). (The runner's `or None` turns
  // free == 0 into "budget unknown"; we keep it a known 0.)
  budget_blocks_ = free > reserve ? free - reserve : 0;

  if (kv_usage_ <= u_low_) {
    w_kv_ = p_.window_max;
  } else if (kv_usage_ >= u_high_) {
    w_kv_ = p_.window_min;
  } else {
    const double span = std::max(1e-6, u_high_ - u_low_);
    const double frac = std::clamp((kv_usage_ - u_low_) / span, 0.0, 1.0);
    const double w = static_cast<double>(p_.window_max) -
                     frac * (static_cast<double>(p_.window_max) - static_cast<double>(p_.window_min));
    w_kv_ = clamp_window(round_half_even(w), p_.window_min, p_.window_max);
  }
  if (kv_overloaded_) {
    kv_overloaded_ = !(kv_usage_ <= u_low_);
  } else {
    kv_overloaded_ = kv_usage_ >= u_high_;
  }
}

void MarsControl::control(Time now) {
  // §2.1: the first call controls (last_control_time ≤ 0), later ones only
  // once T_ctl has passed; pressure flags above are tracked on every call.
  if (last_control_ && now - *last_control_ < interval_) return;
  std::uint32_t w = w_aimd_;
  if (cpu_overloaded_ || kv_overloaded_) {
    w = std::max(p_.window_min, static_cast<std::uint32_t>(std::floor(static_cast<double>(w) * p_.window_dec_factor)));
  } else if (cpu_healthy_for_growth_ && !kv_overloaded_ && kv_known_ && kv_usage_ <= u_low_ && budget_blocks_ > 0) {
    w = std::min(p_.window_max, w + p_.window_inc);
  }
  // Otherwise hold: the band between the thresholds.
  w = std::clamp(w, p_.window_min, p_.window_max);
  w = std::max(p_.window_min, std::min(w, w_cpu_));
  w = std::max(p_.window_min, std::min(w, w_kv_));
  w_aimd_ = w;  // §2.1: the caps are folded into the AIMD state
  last_control_ = now;
}

void MarsControl::tick(const NodeModel& model, Time now, Actions& out) {
  const SessionTable& table = model.sessions();
  // Long reservations last while the session is live (MARS: until the task
  // finishes). A session still WAITING was not admitted by the host; it will
  // be decided again.
  for (auto it = long_in_flight_.begin(); it != long_in_flight_.end();) {
    const Session* s = table.find(it->first);
    it = (s == nullptr || !is_live(s->state)) ? long_in_flight_.erase(it) : std::next(it);
  }
  // The latest arrival, for tail mode's "emission finished" stand-in (see
  // pack()). Every session is WAITING at the first tick after it appears
  // (only this policy's admits move it on), so scanning the waiting ones sees
  // every arrival; one opened and closed between two ticks is not seen.
  for (const Session* s : table.in_state(SessionState::kWaiting)) {
    if (!last_arrival_ || s->opened > *last_arrival_) last_arrival_ = s->opened;
  }

  update_cpu(model.cpu());
  update_kv(model);
  control(now);
  w_adm_ = std::min({w_aimd_, w_cpu_, w_kv_});
  last_mode_ = MarsMode::kIdle;
  pack(model, now, out);
}

void MarsControl::pack(const NodeModel& model, Time now, Actions& out) {
  const SessionTable& table = model.sessions();
  // §2.1 "admitted tasks still running": whole sessions, PAUSED included (a
  // paused session holds its slot, as a MARS task does between LLM calls).
  std::uint64_t live =
      table.count(SessionState::kReasoning) + table.count(SessionState::kActing) + table.count(SessionState::kPaused);
  // Unknown pressure (< 0) never reaches a threshold, which is ≥ 0.
  if (cpu_slot_psi_ >= 0 && model.cpu().psi_some_avg10 >= cpu_slot_psi_) {
    for (const Session* s : table.in_state(SessionState::kActing)) {
      if (s->blocks_held == 0) --live;  // tandem's addition 19 (free_cpu_bound_slots)
    }
  }

  // Block size per engine, looked up once per tick rather than per session.
  std::vector<std::pair<EngineId, std::uint32_t>> block_sizes;
  for (const auto& [eid, e] : model.engines()) {
    block_sizes.emplace_back(eid, e.params.block_size_or_default());
  }
  auto block_size_of = [&](EngineId eid) {
    for (const auto& [id, bs] : block_sizes) {
      if (id == eid) return bs;
    }
    return kDefaultBlockSize;
  };

  // §2.2 est(e) is the round-1 prompt; a WAITING session's submitted round
  // is its first. Judgement: a session opened with no round submitted yet
  // has est 0 — it claims no KV and counts as short (MARS's unknown → 1e12
  // comes from a failed tokenizer, not from a prompt that does not exist
  // yet; admitting it lets its runner build the prompt, as MARS admits a
  // task before its agent loop starts).
  auto est_of = [](const SessionBrief& b) { return b.round_in_flight ? b.prompt_tokens : 0u; };
  // With long_by_fit(), long also means an outlier (kLongOverMedian times
  // the median first prompt), so that a workload of only long sessions has
  // none. The median is taken once a tick, and only when a prompt is past
  // MARS's threshold.
  std::optional<double> long_floor;
  auto outlier = [&](std::uint32_t est) {
    if (!long_floor) {
      long_floor = 0.0;
      if (first_prompts_.size() >= kMinPromptSamples) {
        prompt_scratch_ = first_prompts_;
        auto mid = prompt_scratch_.begin() + static_cast<std::ptrdiff_t>(prompt_scratch_.size() / 2);
        std::nth_element(prompt_scratch_.begin(), mid, prompt_scratch_.end());
        long_floor = kLongOverMedian * static_cast<double>(*mid);
      }
    }
    return static_cast<double>(est) > *long_floor;
  };
  auto is_long = [&](std::uint32_t est) {
    if (p_.long_prefill_tokens == 0 || est <= p_.long_prefill_tokens) return false;
    return !long_by_fit_ || outlier(est);
  };
  // The backlog's sizes from the flat briefs: a full window (the common case
  // under load) then returns without touching a waiting session.
  const std::span<const SessionBrief> briefs = table.briefs(SessionState::kWaiting);
  if (briefs.empty()) return;  // MARS returns before the needle timer, too
  std::size_t backlog_long = 0;
  for (const SessionBrief& b : briefs) backlog_long += is_long(est_of(b)) ? 1 : 0;
  const std::size_t backlog_short = briefs.size() - backlog_long;

  // §2.2 tail mode needs "emission finished", which a daemon never knows.
  // Judgement: emission counts as finished once no session has arrived for
  // tail_quiet_s. Taking "no short session waiting" alone would put every
  // long-only backlog in tail mode and make needle insertion unreachable.
  const bool emission_quiet = tail_quiet_ == Duration::zero() || (last_arrival_ && now - *last_arrival_ >= tail_quiet_);
  const bool tail =
      !long_by_fit_ && p_.long_prefill_tokens > 0 && backlog_long > 0 && backlog_short == 0 && emission_quiet;

  const std::uint64_t limit = tail ? p_.window_max : w_adm_;  // tail ignores the adaptive window
  std::uint64_t slots = limit > live ? limit - live : 0;
  if (slots == 0) return;

  std::vector<Candidate>& waiting = waiting_;  // a member: its capacity stays from tick to tick
  waiting.clear();
  waiting.reserve(briefs.size());
  const std::span<const Session* const> sessions = table.in_state(SessionState::kWaiting);
  for (std::size_t k = 0; k < briefs.size(); ++k) {
    Candidate c;
    c.id = sessions[k]->id;
    c.opened = sessions[k]->opened;
    c.est = est_of(briefs[k]);
    const std::uint32_t bs = block_size_of(briefs[k].engine);
    c.blocks = (c.est + bs - 1) / bs;  // EstimateBlocks: ceil(est / block_size)
    c.is_long = is_long(c.est);
    waiting.push_back(c);
  }
  const std::uint64_t long_live = long_in_flight_.size();
  if (tail && live > long_live) slots = std::min<std::uint64_t>(slots, 1);  // soft start

  const bool low_pressure = !tail && !cpu_overloaded_ && !kv_overloaded_ && cpu_healthy_for_growth_ && kv_known_ &&
                            kv_usage_ <= u_low_ && budget_blocks_ > 0 && waiting.size() <= slots;

  // Needle insertion (§2.2): the timer starts at the first call that sees
  // waiting sessions, none short, and a free slot (the runner's order).
  if (backlog_short == 0) {
    if (!short_empty_since_) short_empty_since_ = now;
  } else {
    short_empty_since_.reset();
  }
  const Duration short_empty = short_empty_since_ ? now - *short_empty_since_ : Duration::zero();
  std::uint64_t long_slots = 0;
  bool allow_needle = false;
  if (long_by_fit_) {
    // tandem: long sessions enter by fit, smallest first after the short
    // ones, with no needle wait. MARS's cap is for its one engine and its
    // pool: tandem allows it per engine (as its window, addition 8) or per
    // MARS-sized pool of the node's KV, whichever allows more, and at least
    // one (without a tail mode, a cap of 0 would hold long sessions back for
    // good).
    double pool_tokens = 0;
    for (const auto& [eid, e] : model.engines()) {
      pool_tokens += static_cast<double>(e.kv.blocks_total) * block_size_of(eid);
    }
    const double per = std::max(static_cast<double>(model.engines().size()), pool_tokens / kMarsPoolTokens);
    const std::uint64_t cap = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(p_.non_tail_long_cap * per));
    long_slots = cap > long_live ? cap - long_live : 0;
    allow_needle = backlog_long > 0 && long_slots > 0;
  } else {
    const bool short_quiet = backlog_short == 0 && (live == 0 || short_empty >= needle_wait_);
    long_slots = p_.non_tail_long_cap > long_live ? p_.non_tail_long_cap - long_live : 0;
    allow_needle =
        !tail && p_.long_prefill_tokens > 0 && backlog_long > 0 && short_quiet && !kv_overloaded_ && long_slots > 0;
  }

  auto by_arrival = [](const Candidate& a, const Candidate& b) {
    return a.opened != b.opened ? a.opened < b.opened : a.id < b.id;
  };
  auto by_est_then_arrival = [&](const Candidate& a, const Candidate& b) {
    return a.est != b.est ? a.est < b.est : by_arrival(a, b);
  };

  std::vector<const Candidate*> selected;
  bool budget_known = kv_known_;
  std::uint64_t remaining = budget_blocks_;
  // First-fit against the slack budget (§2.2, every mode but tail).
  auto try_select = [&](const Candidate& c) {
    if (selected.size() >= slots) return false;
    // Judgement (OpenHands "no_kv_short_only", §2.2): with no KV telemetry a
    // long session is never admitted outside tail mode.
    if (c.is_long && !kv_known_ && !long_by_fit_) return false;
    if (budget_known) {
      if (c.blocks > remaining) return false;
      remaining -= c.blocks;
    }
    selected.push_back(&c);
    return true;
  };

  if (tail) {
    last_mode_ = MarsMode::kTail;
    std::sort(waiting.begin(), waiting.end(), by_arrival);  // all long, by the tail condition
    if (!kv_known_) {
      // Judgement: the replay's tail rule without KV info (§2.2: "admit the
      // single smallest long task, and only if no long task is in flight"),
      // not the OpenHands copy's "never", which would starve long sessions
      // for good on engines that do not report KV stats.
      if (long_live == 0) selected.push_back(&*std::min_element(waiting.begin(), waiting.end(), by_est_then_arrival));
    } else {
      // §2.2: tail budget from the *current* free blocks (the runner's cached
      // fallback for free == 0 is not kept: it becomes a budget of 1).
      const auto tail_budget = std::max<std::uint64_t>(
          1, static_cast<std::uint64_t>(std::floor(static_cast<double>(kv_free_) * p_.long_kv_ratio)));
      std::uint64_t pending = 0;
      for (const auto& [id, blocks] : long_in_flight_) pending += blocks;
      std::uint64_t rem = tail_budget > pending ? tail_budget - pending : 0;
      for (const Candidate& c : waiting) {
        if (selected.size() >= slots || rem == 0) break;
        if (c.blocks > rem) continue;  // first-fit with skipping, in arrival order
        rem -= c.blocks;
        selected.push_back(&c);
      }
      // Deadlock escape: nothing fits and no long KV is in flight — admit the
      // oldest long session even though it exceeds the tail budget.
      if (selected.empty() && pending == 0) selected.push_back(&waiting.front());
    }
  } else if (low_pressure) {
    last_mode_ = MarsMode::kLowPressureFcfs;
    std::sort(waiting.begin(), waiting.end(), by_arrival);
    std::uint64_t long_left = long_slots;
    for (const Candidate& c : waiting) {
      if (selected.size() >= slots) break;
      if (c.is_long && (!allow_needle || long_left == 0)) continue;
      if (try_select(c) && c.is_long) --long_left;
    }
  } else if (cpu_overloaded_) {
    last_mode_ = MarsMode::kCpuLongFirst;
    // Largest estimate first, ties older first; no long cap here (§2.2).
    std::sort(waiting.begin(), waiting.end(), [&](const Candidate& a, const Candidate& b) {
      return a.est != b.est ? a.est > b.est : by_arrival(a, b);
    });
    for (const Candidate& c : waiting) {
      if (selected.size() >= slots) break;
      try_select(c);
    }
  } else {
    last_mode_ = MarsMode::kShortFirst;
    std::sort(waiting.begin(), waiting.end(), by_est_then_arrival);
    for (const Candidate& c : waiting) {
      if (selected.size() >= slots) break;
      if (!c.is_long) try_select(c);
    }
    if (allow_needle && selected.size() < slots) {
      std::uint64_t long_left = long_slots;
      for (const Candidate& c : waiting) {
        if (selected.size() >= slots || long_left == 0) break;
        if (c.is_long && try_select(c)) --long_left;
      }
    }
  }

  for (const Candidate* c : selected) {
    out.admit(c->id);
    // Only long sessions are KV reservations (§2.2, tail accounting).
    if (c->is_long) long_in_flight_[c->id] = c->blocks;
  }
}

}  // namespace tandem::sched
