// tandem: MARS plus expected-value residency, cost-per-block eviction,
// critical-path CPU weights, one queue across engines and a growth-aware
// capacity check.
#include "sched/tandem.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>
#include <type_traits>
#include <vector>

namespace tandem::sched {
namespace {

// An engine that runs, queues and pins nothing, with no admitted round on its
// way to it. Projections (rounds submitted behind paused sessions count as
// queued KV; a growth allowance can make a session bigger than the whole
// pool) must never keep it empty: paused sessions would wait for room that
// the rounds they hold back claim, and new sessions would wait behind them,
// a deadlock a live replay on a 128-block pool hit. Restores and admissions
// give such an engine one session anyway.
bool engine_idle(const NodeModel& model, const EngineView& e) {
  if (!e.has_stats || e.kv.blocks_total == 0 || e.kv.running_seqs > 0 || e.kv.waiting_seqs > 0 ||
      e.kv.blocks_pinned > 0) {
    return false;
  }
  const auto admitted = model.sessions().briefs(SessionState::kReasoning);
  return std::none_of(admitted.begin(), admitted.end(),
                      [&](const SessionBrief& s) { return s.engine == e.id && s.round_in_flight; });
}

// The blocks a round holds once its prompt and growth are in KV: an integer
// ceiling, the same number as std::ceil of the division in double (both
// operands are exact there and a non-integer quotient stays more than an ulp
// from the next integer), without the software ceil of the baseline x86-64.
std::uint64_t round_blocks(std::uint32_t prompt_tokens, std::uint32_t growth_tokens, std::uint32_t block_size) {
  const std::uint64_t bs = block_size > 0 ? block_size : kDefaultBlockSize;
  return (std::uint64_t{prompt_tokens} + growth_tokens + bs - 1) / bs;
}

}  // namespace

TandemParams tandem_params(const PolicyParams& p) {
  TandemParams t;
  t.residency = p.flag("residency");
  t.cost_eviction = p.flag("cost_eviction");
  t.cpu_weights = p.flag("cpu_weights");
  t.global_queue = p.flag("global_queue");
  t.growth_check = p.flag("growth_check");
  t.knee_quanta = p.flag("knee_quanta");
  t.kv_admission = p.flag("kv_admission");
  t.engine_window = p.flag("engine_window");
  t.horizon_s = p.get("horizon_s");
  t.offload = p.flag("offload");
  t.price.idle_pressure = p.get("idle_pressure");
  t.price.full_price = p.get("full_price");
  t.cost.prefill_us_per_token = p.get("prefill_us_per_token");
  t.cost.attention_us_per_pair = p.get("attention_us_per_pair");
  t.cost.swap_us_per_token = p.get("swap_us_per_token");
  t.cpu_weight_critical = static_cast<std::uint32_t>(p.get("cpu_weight_critical"));
  t.cpu_weight_default = static_cast<std::uint32_t>(p.get("cpu_weight_default"));
  t.cpu_las = p.flag("cpu_las");
  t.las_step_s = p.get("las_step_s");
  t.las_levels = static_cast<std::uint32_t>(p.get("las_levels"));
  t.growth_decode_tokens = static_cast<std::uint32_t>(p.get("growth_decode_tokens"));
  t.pause_pressure = p.get("pause_pressure");
  t.resume_pressure = std::min(p.get("resume_pressure"), t.pause_pressure);  // hysteresis, never inverted
  t.initial_pin_s = p.get("initial_pin_s");
  t.locality_bonus = p.get("locality_bonus");
  t.residency_budget = static_cast<std::uint32_t>(p.get("residency_budget"));
  t.pin_admission = p.flag("pin_admission");
  t.long_admission = p.flag("long_admission");
  t.prompt_projection = p.flag("prompt_projection");
  t.queue_admission = p.flag("queue_admission");
  t.restore_wait_max_s = p.get("restore_wait_max_s");
  t.pending_restore = p.flag("pending_restore");
  t.host_prices = p.flag("host_prices");
  t.pooled_prior = p.flag("pooled_prior");
  t.swap_preempt = p.flag("swap_preempt");
  t.fill_idle_budget = p.flag("fill_idle_budget");
  t.cpu_slots = p.flag("cpu_slots");
  t.cpu_slot_psi = p.get("cpu_slot_psi");
  t.headroom_keep = p.flag("headroom_keep");
  t.host_admission = p.flag("host_admission");
  t.host_psi_high = p.get("host_psi_high");
  t.host_low = p.get("host_low");
  t.host_high = std::max(p.get("host_high"), t.host_low);
  t.host_interval_s = p.get("host_interval_s");
  t.host_mean_s = p.get("host_mean_s");
  t.host_peaks = p.flag("host_peaks");
  t.max_remaining_s = p.get("max_remaining_s");
  return t;
}

// ---- control half -----------------------------------------------------------

TandemControl::TandemControl(const MarsControlParams& mars, const TandemParams& params) : mars_(mars), p_(params) {
  if (p_.kv_admission) mars_.ignore_cpu();
  if (p_.pin_admission && p_.residency) mars_.pinned_is_free();
  if (p_.long_admission) mars_.long_by_fit();
  if (p_.cpu_slots) mars_.free_cpu_bound_slots(p_.cpu_slot_psi);
}

const ResidencyDecision* TandemControl::residency_of(SessionId s) const {
  auto it = kept_.find(s);
  return it == kept_.end() ? nullptr : &it->second.decision;
}

void TandemControl::on_event(const Event& event, const NodeModel& model, Time /*now*/) {
  std::visit(
      [&](const auto& e) {
        using E = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<E, RoundSubmitted>) {
          // A round submitted while its session waits for admission is its
          // first (addition 10's median of first prompts).
          if (p_.long_admission) {
            const Session* s = model.sessions().find(e.session);
            if (s != nullptr && s->state == SessionState::kWaiting) mars_.note_first_prompt(e.prompt_tokens);
          }
        }
        if constexpr (std::is_same_v<E, RoundEnded> || std::is_same_v<E, ToolStarted> || std::is_same_v<E, ToolEnded> ||
                      std::is_same_v<E, RoundSubmitted> || std::is_same_v<E, SessionClosed> ||
                      std::is_same_v<E, KvChanged>) {
          changed_.push_back(e.session);
        }
      },
      event);
}

void TandemControl::tick(const NodeModel& model, Time now, Actions& out) {
  if (p_.engine_window) mars_.scale_window(static_cast<std::uint32_t>(model.engines().size()));
  mars_out_.clear();
  mars_.tick(model, now, mars_out_);  // admission: AIMD + PackQueue, unchanged
  const Duration horizon = base::from_seconds(p_.horizon_s);
  const Duration interval = last_tick_ ? now - *last_tick_ : horizon;
  last_tick_ = now;
  const SessionTable& table = model.sessions();
  const auto acting = table.in_state(SessionState::kActing);
  const std::size_t budget = p_.residency_budget;
  // Ticks until the rotation comes back to a session: pins must outlast it.
  const Duration rotation = interval * static_cast<std::int64_t>((acting.size() + budget - 1) / budget);

  std::sort(changed_.begin(), changed_.end());
  changed_.erase(std::unique(changed_.begin(), changed_.end()), changed_.end());
  if (p_.residency || p_.cpu_weights) {
    // Sessions whose state changed: decided now, not at their rotation turn.
    for (SessionId id : changed_) {
      const Session* s = table.find(id);
      if (s != nullptr && s->state == SessionState::kActing) {
        evaluate(model, *s, now, rotation, out);
      } else {
        release(id, s, out);
      }
    }
    // A bounded rotation through what residency holds, so sessions that left
    // ACTING are released even when the host forwards no events.
    auto it = kept_.lower_bound(kept_cursor_);
    for (std::size_t n = std::min(budget, kept_.size()); n > 0; --n) {
      if (it == kept_.end()) it = kept_.begin();
      const SessionId id = it->first;
      ++it;
      const Session* s = table.find(id);
      if (s == nullptr || s->state != SessionState::kActing) release(id, s, out);
    }
    kept_cursor_ = it == kept_.end() ? 0 : it->first;
    // A bounded rotation through the acting sessions.
    const std::size_t n = std::min(budget, acting.size());
    for (std::size_t j = 0; j < n; ++j) {
      const Session* s = acting[(acting_cursor_ + j) % acting.size()];
      if (!std::binary_search(changed_.begin(), changed_.end(), s->id)) evaluate(model, *s, now, rotation, out);
    }
    acting_cursor_ = acting.empty() ? 0 : (acting_cursor_ + n) % acting.size();
  }
  changed_.clear();
  paused_waiting_ = false;
  pressure_.clear();
  if (p_.growth_check) check_growth(model, now, out);
  hold_for_waiting_restores(model, now);
  // MARS's admissions, last: with queue_admission a new session enters only
  // if its round fits under resume_pressure on its engine, as a restore
  // would. (It used to wait behind every paused session whose round waits
  // to be restored as well: that cost 5-16 % of mean E2E on the validation
  // sessions with small KV pools, where short new sessions then queued
  // behind long paused ones; docs/results.md.)
  std::set<EngineId> forced;  // idle engines given a session this tick
  // Addition 18: host memory's share of admission.
  const bool host_gate = p_.host_admission && host_control(model, now);
  const HostMemoryView& mem = model.host_memory();
  const std::uint64_t live_now =
      table.count(SessionState::kReasoning) + table.count(SessionState::kActing) + table.count(SessionState::kPaused);
  std::uint64_t host_admitted = 0;
  auto host_allows = [&] {
    if (!host_gate) return true;
    const std::uint64_t live = live_now + host_admitted;
    if (live == 0) return true;  // progress: an empty node always takes one
    if (static_cast<double>(live) >= host_window_) return false;
    // Projected: what is used now, the baselines of the sessions admitted
    // this tick and of this one, and room for one more tool burst.
    const std::uint64_t used = p_.host_peaks ? std::max(host_use_, mem.used_bytes) : mem.used_bytes;
    const double projected = static_cast<double>(used) +
                             static_cast<double>((host_admitted + 1) * mem.session_baseline_bytes) +
                             static_cast<double>(mem.tool_peak_p95_bytes);
    return projected <= p_.host_high * static_cast<double>(mem.capacity_bytes);
  };
  for (const Action& a : mars_out_.list()) {
    if (a.kind == ActionKind::kAdmit && host_gate) {
      if (!host_allows()) continue;
      ++host_admitted;
    }
    if (a.kind != ActionKind::kAdmit || !p_.queue_admission || !p_.growth_check) {
      out.add_action(a);
      continue;
    }
    const Session* s = model.sessions().find(a.session);
    // Behind a paused round passed over for restore_wait_max_s.
    if (s != nullptr && std::find(held_.begin(), held_.end(), s->engine) != held_.end()) continue;
    const EngineView* e = s != nullptr ? model.engine(s->engine) : nullptr;
    if (s == nullptr || e == nullptr || !e->has_stats || e->kv.blocks_total == 0) {
      out.add_action(a);
      continue;
    }
    const double need =
        static_cast<double>(round_blocks(s->prompt_tokens, p_.growth_decode_tokens, e->params.block_size)) /
        e->kv.blocks_total;
    double& pr = pressure_[s->engine];
    const double limit = std::max(p_.resume_pressure, std::min(1.0, need));
    // An idle engine takes one new session whatever the projection says (see
    // engine_idle()): projections must not keep it empty.
    if (pr + need > limit && !(engine_idle(model, *e) && forced.insert(s->engine).second)) continue;
    pr += need;
    out.add_action(a);
  }
}

bool TandemControl::host_control(const NodeModel& model, Time now) {
  const HostMemoryView& mem = model.host_memory();
  if (mem.capacity_bytes == 0) return false;
  const double window_max = static_cast<double>(mars_.params().window_max);
  const double window_min = std::max<double>(1.0, static_cast<double>(model.engines().size()));
  if (host_window_ == 0) host_window_ = window_max;
  if (last_host_control_ && now - *last_host_control_ < base::from_seconds(p_.host_interval_s)) return true;
  last_host_control_ = now;
  const double capacity = static_cast<double>(mem.capacity_bytes);
  const double use = static_cast<double>(mem.used_bytes) / capacity;
  // With host_peaks the projection and the fit count the highest use of the
  // last host_mean_s: the running tools' bursts come and go within seconds,
  // and a session admitted between two of them meets the next.
  host_use_ = mem.used_bytes;
  if (p_.host_peaks) {
    while (!host_recent_.empty() && host_recent_.back().second <= mem.used_bytes) host_recent_.pop_back();
    host_recent_.emplace_back(now, mem.used_bytes);
    while (now - host_recent_.front().first > base::from_seconds(p_.host_mean_s)) host_recent_.pop_front();
    host_use_ = host_recent_.front().second;
  }
  const bool killed = mem.kills > host_kills_;
  host_kills_ = mem.kills;
  // What a live session holds on average (its baseline and its share of the
  // tools' memory), smoothed over host_mean_s: the host holds about
  // (host_high · capacity − one tool burst) / that many sessions.
  const SessionTable& table = model.sessions();
  const std::uint64_t live =
      table.count(SessionState::kReasoning) + table.count(SessionState::kActing) + table.count(SessionState::kPaused);
  if (live > 0) {
    const double per = static_cast<double>(host_use_) / static_cast<double>(live);
    const double dt = last_host_mean_ ? base::to_seconds(now - *last_host_mean_) : p_.host_mean_s;
    const double a = 1.0 - std::exp(-dt / std::max(1e-3, p_.host_mean_s));
    host_mean_ = host_mean_ > 0 ? host_mean_ + a * (per - host_mean_) : per;
    last_host_mean_ = now;
  }
  double fit = window_max;
  if (host_mean_ > 0) {
    fit = (p_.host_high * capacity - static_cast<double>(mem.tool_peak_p95_bytes)) / host_mean_;
  }
  // AIMD as MARS's (+1, ×0.7 per interval; [mars_code] §2.1),
  // driven by the host: memory PSI, kills and use; it grows only while the
  // window is below what the host holds.
  double w = host_window_;
  if (mem.psi_some_avg10 >= p_.host_psi_high || killed || use >= p_.host_high) {
    w = std::floor(w * 0.7);
  } else if (use <= p_.host_low && w < fit) {
    w += 1;
  }
  w = std::min(w, std::max(window_min, std::floor(fit)));
  // The soft cap, as MARS's W_kv: the ceiling at or below host_low, the floor
  // at or above host_high, linear between, so the window eases down as the
  // host fills instead of toggling at one threshold.
  if (use > p_.host_low) {
    const double frac = std::clamp((use - p_.host_low) / std::max(1e-6, p_.host_high - p_.host_low), 0.0, 1.0);
    w = std::min(w, std::round(window_max - frac * (window_max - window_min)));
  }
  host_window_ = std::clamp(w, window_min, window_max);
  return true;
}

void TandemControl::evaluate(const NodeModel& model, const Session& s, Time now, Duration rotation, Actions& out) {
  const Duration horizon = base::from_seconds(p_.horizon_s);
  Residence residence = Residence::kKeep;
  ResidencyDecision d;
  const bool las = p_.cpu_weights && p_.cpu_las;
  // Residency decides only for a session with KV on the GPU; least attained
  // service weighs every acting session, since its level grows with the
  // running call whether or not its KV stayed.
  const bool resident = s.blocks_held > 0;
  if (p_.residency && resident) {
    const EngineView* engine = model.engine(s.engine);
    ResidencyInput in;
    const Time since = s.tool != 0 ? s.tool_started : s.last_round_end;
    in.p_return_within_horizon = model.tools().p_return_within(s.tool, now - since, horizon, p_.pooled_prior);
    in.horizon_s = p_.horizon_s;
    in.context_tokens = s.context_tokens;
    in.blocks = s.blocks_held;
    in.price = engine != nullptr ? kv_price(*engine, p_.price) : 0.0;
    in.offload_allowed = p_.offload;
    if (p_.headroom_keep && engine != nullptr && engine->has_stats && p_.resume_pressure < 1.0) {
      in.headroom_blocks = (1.0 - p_.resume_pressure) * engine->kv.blocks_total;
    }
    offload_terms(model, s, now, in);
    d = decide_residency(in, p_.cost);
    residence = d.residence;
  } else if (p_.residency) {
    if (!las) return;                            // nothing on the GPU to decide about
    residence = d.residence = Residence::kDrop;  // nothing kept: not critical
  }

  auto [it, fresh] = kept_.try_emplace(s.id);
  Kept& k = it->second;
  if (p_.residency && resident) {
    const bool changed = fresh || k.decision.residence != residence;
    switch (residence) {
      case Residence::kKeep:
        // The pin must outlast the next evaluation (a rotation away) by a horizon.
        if (changed || k.pinned_until - now < rotation + horizon) {
          k.pinned_until = now + std::max(2 * horizon, rotation + 2 * horizon);
          out.pin(s.id, k.pinned_until);
        }
        break;
      case Residence::kOffload:
        if (changed) out.offload(s.id);
        break;
      case Residence::kDrop:
        // "Drop" releases the pin to the prefix cache: the blocks become
        // free at once, and the prefix survives until the LRU needs them,
        // which an explicit drop would throw away for nothing.
        if (changed) out.unpin(s.id);
        break;
    }
  }
  if (p_.residency) k.decision = d;
  if (las) {
    if (fresh) {
      // A new tool phase: the cgroup has the default, or the level an
      // earlier phase left.
      const std::uint32_t* level = las_level_.find(s.id);
      k.weight = level != nullptr ? *level : 0;
    }
    const std::uint32_t w = las_weight(s, now, residence == Residence::kKeep);
    if (w != k.weight_or(p_.cpu_weight_default)) {
      out.set_cpu_weight(s.id, w);
      k.weight = w;
    }
  } else if (p_.cpu_weights) {
    const bool critical = residence == Residence::kKeep;
    if (critical && k.weight != p_.cpu_weight_critical) {
      out.set_cpu_weight(s.id, p_.cpu_weight_critical);
      k.weight = p_.cpu_weight_critical;
    } else if (!critical && k.weight == p_.cpu_weight_critical) {
      out.set_cpu_weight(s.id, p_.cpu_weight_default);
      k.weight = p_.cpu_weight_default;
    }
  }
}

void TandemControl::offload_terms(const NodeModel& model, const Session& s, Time now, ResidencyInput& in) const {
  if (!p_.host_prices) return;
  const EngineView* e = model.engine(s.engine);
  if (e == nullptr || !e->has_stats) return;
  in.link_wait_s = base::to_seconds(e->kv.offload_backlog);
  const std::uint64_t total = e->kv.host_blocks_total;
  if (total == 0) return;  // unlimited or unknown host memory
  // A copy larger than all host memory cannot be made.
  if (s.blocks_held > total) {
    in.offload_allowed = false;
    return;
  }
  // Host memory's price is the copy a new one displaces: with no room left,
  // the host evicts its least recently used copy. Belady's rule on the
  // survival model: displace it only if this session is expected back sooner
  // than that copy's (idle the longest, kind unknown: every tool's pooled
  // history decides).
  if (e->kv.blocks_offloaded + s.blocks_held <= total) return;
  const Time since = s.tool != 0 ? s.tool_started : s.last_round_end;
  const double mine = model.tools().remaining_s(s.tool, now - since, p_.max_remaining_s, p_.pooled_prior);
  // Kind 0 is never observed: the prior alone, which is the pool with pooled_prior.
  const double oldest = model.tools().remaining_s(0, e->kv.host_oldest_idle, p_.max_remaining_s, p_.pooled_prior);
  if (mine >= oldest) in.offload_allowed = false;
}

std::uint32_t TandemControl::las_weight(const Session& s, Time now, bool critical) const {
  double attained = base::to_seconds(s.tool_time);
  if (s.tool != 0) attained += base::to_seconds(now - s.tool_started);
  // Levels of 4x: below las_step_s the default weight (a session that
  // stays there costs no cgroup write), each next level 2.5x less, down to
  // a weight of 1 or las_levels levels, whichever comes first.
  double w = p_.cpu_weight_default;
  std::uint32_t level = 0;
  for (double t = p_.las_step_s; attained >= t && w > 1 && level < p_.las_levels; t *= 4, ++level) w /= 2.5;
  if (critical) w *= static_cast<double>(p_.cpu_weight_critical) / p_.cpu_weight_default;
  return static_cast<std::uint32_t>(std::clamp(std::lround(w), 1L, 10000L));
}

void TandemControl::release(SessionId id, const Session* s, Actions& out) {
  auto it = kept_.find(id);
  if (p_.cpu_weights && p_.cpu_las) {
    if (s == nullptr || s->state == SessionState::kDone) {
      las_level_.erase(id);  // its cgroup is gone with it
    } else if (it != kept_.end()) {
      // At the time it left ACTING: a paused session's running call counts
      // up to its pause.
      const std::uint32_t w = las_weight(*s, s->state_since, false);
      if (w != it->second.weight_or(p_.cpu_weight_default)) out.set_cpu_weight(id, w);
      if (w != p_.cpu_weight_default) {
        las_level_[id] = w;
      } else {
        las_level_.erase(id);
      }
    }
    if (it != kept_.end()) kept_.erase(it);
    return;
  }
  if (it == kept_.end()) return;
  // Give back a raised weight while the session lives (a closed session's
  // cgroup is gone with it).
  if (s != nullptr && s->state != SessionState::kDone && it->second.weight == p_.cpu_weight_critical) {
    out.set_cpu_weight(id, p_.cpu_weight_default);
  }
  kept_.erase(it);
}

double TandemControl::projected_pressure(const EngineView& e, std::uint64_t running_rounds) const {
  if (!e.has_stats || e.kv.blocks_total == 0) return 0.0;
  const double block_size = e.params.block_size_or_default();
  // What admitted work holds now, plus what its running rounds will still
  // grow into (growth_decode_tokens each). Rounds of sessions still waiting
  // for admission are not counted: admission (MARS's KV budget) decides
  // whether they start, and they raise the KV price instead.
  const double growth = static_cast<double>(running_rounds) * p_.growth_decode_tokens / block_size;
  const double allocated = static_cast<double>(e.kv.blocks_total - e.kv.blocks_free);
  return (allocated + growth) / e.kv.blocks_total;
}

void TandemControl::check_growth(const NodeModel& model, Time now, Actions& out) {
  const Duration horizon = base::from_seconds(p_.horizon_s);
  // Per engine, in model.engines() order (ids ascending): its running rounds,
  // from the REASONING sessions only, and the blocks they will hold (whole
  // prompts plus growth). A flat array, not maps: this walks every reasoning
  // session each tick. A round on an engine that has left counts nowhere.
  struct Load {
    EngineId id;
    std::uint32_t block_size;
    std::uint64_t running = 0;
    double demand = 0;
  };
  std::vector<Load> loads;
  loads.reserve(model.engines().size());
  for (const auto& [eid, e] : model.engines()) loads.push_back({eid, e.params.block_size});
  // Engine id → its Load: a hash lookup a session, where a binary search
  // over the engines was half the walk's cost (callgrind, daemon_bench).
  load_of_.clear();
  for (std::size_t i = 0; i < loads.size(); ++i) load_of_[loads[i].id] = static_cast<std::uint32_t>(i);
  // The sessions' briefs, not the sessions: a flat array, in cache.
  for (const SessionBrief& s : model.sessions().briefs(SessionState::kReasoning)) {
    if (!s.round_in_flight) continue;
    const std::uint32_t* index = load_of_.find(s.engine);
    if (index == nullptr) continue;  // its engine has left
    Load* l = &loads[*index];
    ++l->running;
    l->demand += static_cast<double>(round_blocks(s.prompt_tokens, p_.growth_decode_tokens, l->block_size));
  }
  std::map<EngineId, double> pressure;
  std::size_t i = 0;
  for (const auto& [eid, e] : model.engines()) {
    const Load& l = loads[i++];
    if (p_.prompt_projection && e.has_stats && e.kv.blocks_total > 0) {
      // What admitted work will hold: every running or queued round's whole
      // prompt and growth (not only what its prefill allocated so far), and
      // the KV kept for acting sessions (pins and copies in flight).
      const double kept = e.kv.blocks_pinned;
      pressure[eid] = std::max(projected_pressure(e, l.running), (l.demand + kept) / e.kv.blocks_total);
    } else {
      pressure[eid] = projected_pressure(e, l.running);
    }
  }
  // Pausing frees memory for someone: an engine where nothing waits (no
  // queued round, no demand still to allocate) is left alone however full.
  std::map<EngineId, bool> contended;
  for (const auto& [eid, e] : model.engines()) contended[eid] = e.kv.waiting_seqs > 0 || e.queued_blocks > 0;

  // Overflow: pause the acting sessions that are cheapest to lose (lowest
  // keep value per block), freeing their KV, until the projection fits. At
  // most residency_budget acting sessions are scored a tick, continuing a
  // rotation, so an overflow at 100K sessions costs a bounded tick; the
  // victims are the cheapest of that sample, and the next tick continues.
  bool overflow = false;
  for (const auto& [eid, e] : model.engines())
    overflow = overflow || (contended[eid] && pressure[eid] > p_.pause_pressure);
  if (overflow) {
    struct Victim {
      double value_per_block;
      SessionId id;
      EngineId engine;
      std::uint32_t blocks;
      std::uint32_t context;
    };
    std::vector<Victim> victims;
    const auto acting = model.sessions().in_state(SessionState::kActing);
    const std::size_t n = std::min<std::size_t>(p_.residency_budget, acting.size());
    for (std::size_t j = 0; j < n; ++j) {
      const Session* s = acting[(growth_cursor_ + j) % acting.size()];
      if (s->blocks_held == 0 || !contended[s->engine] || pressure[s->engine] <= p_.pause_pressure) continue;
      Time since = s->tool != 0 ? s->tool_started : s->last_round_end;
      double p = model.tools().p_return_within(s->tool, now - since, horizon, p_.pooled_prior);
      double value = p * p_.cost.recompute_s(s->context_tokens);
      victims.push_back({value / s->blocks_held, s->id, s->engine, s->blocks_held, s->context_tokens});
    }
    growth_cursor_ = acting.empty() ? 0 : (growth_cursor_ + n) % acting.size();
    std::sort(victims.begin(), victims.end(), [](const Victim& a, const Victim& b) {
      return std::tie(a.value_per_block, a.id) < std::tie(b.value_per_block, b.id);
    });
    for (const Victim& v : victims) {
      const EngineView* e = model.engine(v.engine);
      if (e == nullptr || pressure[v.engine] <= p_.pause_pressure) continue;
      out.pause(v.id);
      // Offload if it beats recompute, counting host memory and the link.
      bool offload = false;
      if (const Session* vs = model.sessions().find(v.id); vs != nullptr && p_.offload) {
        ResidencyInput in;
        in.context_tokens = v.context;
        in.blocks = v.blocks;
        in.price = kv_price(*e, p_.price);
        offload_terms(model, *vs, now, in);
        offload = in.offload_allowed && decide_residency(in, p_.cost).offload_cost < p_.cost.recompute_s(v.context);
      }
      if (offload) {
        out.offload(v.id);
      } else {
        out.unpin(v.id);  // to the prefix cache (see evaluate())
      }
      kept_[v.id].decision = {offload ? Residence::kOffload : Residence::kDrop, 0};
      pressure[v.engine] -= static_cast<double>(v.blocks) / e->kv.blocks_total;
    }
  }

  // Restore paused sessions, oldest first, while the projection stays under
  // resume_pressure: onto the engine with the most room (one queue across
  // engines, with a bonus for the engine that still caches the prefix), or,
  // without global_queue, only onto the engine they came from.
  const bool room_somewhere = std::any_of(pressure.begin(), pressure.end(), [&](const auto& ep) {
    const EngineView* e = model.engine(ep.first);
    return e != nullptr && e->has_stats && ep.second < 1.0;
  });
  pressure_ = pressure;
  auto any_paused_round = [&] {
    for (const Session* s : model.sessions().in_state(SessionState::kPaused)) {
      if (s->round_in_flight) return true;
    }
    return false;
  };
  // Progress (engine_idle()): the oldest paused session with a round waiting
  // goes to an idle engine, its own first.
  auto restore_onto_idle = [&] {
    const Session* oldest = nullptr;
    for (const Session* s : model.sessions().in_state(SessionState::kPaused)) {
      if (!s->round_in_flight) continue;
      if (oldest == nullptr || std::tie(s->state_since, s->id) < std::tie(oldest->state_since, oldest->id)) oldest = s;
    }
    if (oldest == nullptr) return false;
    EngineId target = kNoEngine;
    if (const EngineView* own = model.engine(oldest->engine); own != nullptr && engine_idle(model, *own)) {
      target = oldest->engine;
    } else if (p_.global_queue) {
      for (const auto& [eid, e] : model.engines()) {
        if (engine_idle(model, e)) {
          target = eid;
          break;
        }
      }
    }
    if (target == kNoEngine) return false;
    out.restore(oldest->id, target);
    restored_.push_back(oldest->id);
    return true;
  };
  if (!room_somewhere) {  // nothing can be restored: skip sorting the paused
    paused_waiting_ = any_paused_round();
    if (paused_waiting_) restore_onto_idle();
    return;
  }
  std::vector<const Session*> paused(model.sessions().in_state(SessionState::kPaused).begin(),
                                     model.sessions().in_state(SessionState::kPaused).end());
  // Oldest first; with pending_restore, those whose next round waits before
  // those still in their tool (restoring one of these holds room nobody uses yet).
  std::sort(paused.begin(), paused.end(), [&](const Session* a, const Session* b) {
    const bool pa = p_.pending_restore && !a->round_in_flight;
    const bool pb = p_.pending_restore && !b->round_in_flight;
    return std::tie(pa, a->state_since, a->id) < std::tie(pb, b->state_since, b->id);
  });
  bool restored = false;
  for (const Session* s : paused) {
    EngineId best = kNoEngine;
    double best_room = 0;
    std::uint64_t need_blocks = 0;
    for (const auto& [eid, e] : model.engines()) {
      if (!e.has_stats || e.kv.blocks_total == 0) continue;
      if (!p_.global_queue && eid != s->engine) continue;
      const double total = e.kv.blocks_total;
      const double block_size = e.params.block_size_or_default();
      const double need = (s->context_tokens + p_.growth_decode_tokens) / block_size;
      // A session too big for the headroom resume_pressure leaves even on an
      // empty engine waits for an engine with nothing else projected on it
      // (limit = need / total, so room is minus the rest of the projection).
      const double limit = std::max(p_.resume_pressure, std::min(1.0, need / total));
      double room = (limit - pressure[eid]) * total - need;
      if (room < 0) continue;
      if (eid == s->engine) room += p_.locality_bonus * total;
      if (best == kNoEngine || room > best_room) {
        best = eid;
        best_room = room;
        need_blocks = static_cast<std::uint64_t>(need);
      }
    }
    if (best == kNoEngine) {
      if (s->round_in_flight) paused_waiting_ = true;
      continue;
    }
    out.restore(s->id, best);
    restored_.push_back(s->id);
    restored = true;
    pressure[best] += static_cast<double>(need_blocks) / model.engine(best)->kv.blocks_total;
  }
  if (!restored && paused_waiting_) restore_onto_idle();
  pressure_ = pressure;
}

void TandemControl::hold_for_waiting_restores(const NodeModel& model, Time now) {
  held_.clear();
  restore_waits_next_.clear();
  if (!p_.queue_admission || !p_.growth_check || p_.restore_wait_max_s <= 0) {
    restore_waits_.clear();
    restored_.clear();
    return;
  }
  const Duration max_wait = base::from_seconds(p_.restore_wait_max_s);
  // With a global queue a waiting round goes first to the engine with the
  // least projected pressure: the same one for every round, so found once.
  EngineId least_loaded = kNoEngine;
  if (p_.global_queue) {
    double least = 0;
    for (const auto& [eid, pr] : pressure_) {
      const EngineView* e = model.engine(eid);
      if (e == nullptr || !e->has_stats || (least_loaded != kNoEngine && pr >= least)) continue;
      least_loaded = eid;
      least = pr;
    }
  }
  std::sort(restored_.begin(), restored_.end());
  for (const Session* s : model.sessions().in_state(SessionState::kPaused)) {
    if (!s->round_in_flight || std::binary_search(restored_.begin(), restored_.end(), s->id)) continue;
    auto it = std::lower_bound(restore_waits_.begin(), restore_waits_.end(), std::pair(s->id, Time::min()));
    const Time since = it != restore_waits_.end() && it->first == s->id ? it->second : now;
    restore_waits_next_.emplace_back(s->id, since);
    if (now - since < max_wait) continue;
    // Only the engine it will be restored to drains: the least loaded, else its own.
    const EngineId target = least_loaded != kNoEngine ? least_loaded : s->engine;
    if (std::find(held_.begin(), held_.end(), target) == held_.end()) held_.push_back(target);
  }
  std::sort(restore_waits_next_.begin(), restore_waits_next_.end());
  restore_waits_.swap(restore_waits_next_);
  restored_.clear();
}

// ---- step half --------------------------------------------------------------

KeepPlan TandemStepScheduler::on_round_end(const RoundEndInfo& info, Time now) {
  if (!p_.residency || !info.tool_follows) return {KeepDecision::kRelease, {}};  // MARS: release
  pins_[info.session] = PinInfo{info.tool, info.context_tokens, now};
  return {KeepDecision::kPin, now + base::from_seconds(p_.initial_pin_s)};
}

void TandemStepScheduler::on_tool_end(SessionId /*session*/, ToolKind kind, Duration wall, Time /*now*/) {
  tools_.observe(kind, wall);
}

void TandemStepScheduler::on_session_end(SessionId session, Time now) {
  pins_.erase(session);
  mars_.on_session_end(session, now);
}

double TandemStepScheduler::release_cost_per_block(const PinnedKv& pin, std::uint32_t block_size, Time now) const {
  auto it = pins_.find(pin.session);
  ToolKind tool = it != pins_.end() ? it->second.tool : 0;
  Time since = it != pins_.end() ? it->second.since : pin.pinned_at;
  std::uint32_t context = it != pins_.end() ? it->second.context_tokens : pin.blocks * block_size;
  double p = tools_.p_return_within(tool, now - since, base::from_seconds(p_.horizon_s), p_.pooled_prior);
  return p * p_.cost.recompute_s(context) / std::max<std::uint32_t>(1, pin.blocks);
}

void TandemStepScheduler::plan(const StepInput& in, Time now, StepPlan& out) {
  std::uint32_t free_blocks = in.free_blocks;
  // A pin whose session's next round is already queued is that request's
  // prefix (it counts the blocks as its own): it never expires, and it is
  // released only when the step cannot fit otherwise, after every other pin.
  SessionId head = 0;  // what vLLM would try first
  for (const StepRequest& r : in.requests) {
    if (r.phase != RequestPhase::kRunning) {
      head = r.session;
      break;
    }
  }
  queued_.start(in);
  std::vector<const PinnedKv*> live;
  std::vector<const PinnedKv*> reserved;  // pins of queued sessions other than the head's
  for (const PinnedKv& pin : in.pinned) {
    if (queued_.contains(pin.session)) {
      if (pin.session != head) reserved.push_back(&pin);
    } else if (now >= pin.until) {  // expired
      out.unpin.push_back(pin.session);
      free_blocks += pin.blocks;
      pins_.erase(pin.session);
    } else {
      live.push_back(&pin);
    }
  }

  // Blocks this step wants: each running request's next chunk, plus the
  // waiting request at the head of the queue.
  StepInput probe = in;
  probe.free_blocks = free_blocks;
  KvLedger kv(probe);
  std::uint64_t demand = 0;
  bool head_counted = false;
  for (const StepRequest& r : in.requests) {
    if (r.phase != RequestPhase::kRunning && head_counted) continue;
    demand += kv.blocks_needed(r, std::min(r.tokens_wanted(), in.token_budget));
    if (r.phase != RequestPhase::kRunning) head_counted = true;
  }

  auto key = [&](const PinnedKv* p) {
    double order = p_.cost_eviction ? release_cost_per_block(*p, in.block_size, now)
                                    : base::to_seconds(p->until.time_since_epoch());
    return std::tuple(order, p->session);
  };
  auto by_key = [&](const PinnedKv* a, const PinnedKv* b) { return key(a) < key(b); };
  std::vector<StepRequest> requests;  // a copy, only when a queued request loses its pin
  // Releases pins of `group`, cheapest first, until the step's demand fits;
  // what it released leaves `group`.
  auto release_until_fit = [&](std::vector<const PinnedKv*>& group, bool queued_pins) {
    std::sort(group.begin(), group.end(), by_key);
    std::size_t released = 0;
    for (; released < group.size() && demand > free_blocks; ++released) {
      const PinnedKv* p = group[released];
      out.unpin.push_back(p->session);
      free_blocks += p->blocks;
      pins_.erase(p->session);
      if (!queued_pins) continue;
      // Its request now draws its prefix hit from the free pool, as vLLM counts a hit on unreferenced blocks.
      if (requests.empty()) requests.assign(in.requests.begin(), in.requests.end());
      for (StepRequest& r : requests) {
        if (r.session == p->session && r.phase != RequestPhase::kRunning) r.blocks_held = 0;
      }
    }
    group.erase(group.begin(), group.begin() + static_cast<std::ptrdiff_t>(released));
  };
  if (demand > free_blocks) {
    release_until_fit(live, false);
    release_until_fit(reserved, true);
  }

  StepInput adjusted = in;
  adjusted.free_blocks = free_blocks;
  if (!requests.empty()) adjusted.requests = requests;
  if (p_.knee_quanta && in.saturating_tokens > 0) {
    const MarsStepParams& m = mars_.params();
    const std::uint32_t smallest = *std::min_element(m.quanta.begin(), m.quanta.begin() + m.levels);
    mars_.set_quantum_scale(static_cast<double>(in.saturating_tokens) / std::max(1u, smallest));
  }
  StepPlan& mars_plan = mars_plan_;
  mars_plan.clear();
  mars_.plan(adjusted, now, mars_plan);
  // Progress: MARS picks its own head (MLFQ order), which need not be the one
  // counted above. If nothing runs and nothing could be scheduled while
  // requests wait, pins (queued sessions' too, cheapest first) go until
  // every waiting request's next chunk fits: a pool held by pins of sessions
  // whose rounds all wait must not stall the engine for ever.
  const bool any_running = std::any_of(in.requests.begin(), in.requests.end(),
                                       [](const StepRequest& r) { return r.phase == RequestPhase::kRunning; });
  if (mars_plan.run.empty() && !any_running && (!live.empty() || !reserved.empty())) {
    demand = 0;
    for (const StepRequest& r : adjusted.requests) {
      if (r.phase != RequestPhase::kRunning) {
        demand = std::max<std::uint64_t>(demand, kv.blocks_needed(r, std::min(r.tokens_wanted(), in.token_budget)));
      }
    }
    if (demand > free_blocks) {
      release_until_fit(live, false);
      release_until_fit(reserved, true);
    }
  }
  // Swapped, not moved: both plans keep their storage from step to step.
  out.run.swap(mars_plan.run);
  // With swap_preempt the victims' KV goes to host memory instead of being
  // recomputed (the engine recomputes when host memory cannot take it).
  (p_.swap_preempt ? out.swap : out.preempt).swap(mars_plan.preempt);
  out.unpin.insert(out.unpin.end(), mars_plan.unpin.begin(), mars_plan.unpin.end());
}

std::unique_ptr<ControlPolicy> make_tandem_control(const PolicyParams& p) {
  return std::make_unique<TandemControl>(mars_control_params(p), tandem_params(p));
}

std::unique_ptr<StepScheduler> make_tandem_step(const PolicyParams& p) {
  return std::make_unique<TandemStepScheduler>(mars_step_params(p), tandem_params(p));
}

}  // namespace tandem::sched
