// MARS's step: vLLM V1's step with MLFQ order and quanta, chunk halving and
// priority-aligned victims (the design comment is in mars_step.h).
#include "sched/mars_step.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

namespace tandem::sched {
namespace {

// Tokens already in KV (running) or available from the prefix cache (waiting):
// the point the next chunk starts from, as KvLedger counts it.
std::uint32_t start_of(const StepRequest& r) {
  return r.phase == RequestPhase::kRunning ? r.computed_tokens : r.cached_tokens;
}
bool prefilling(const StepRequest& r) { return start_of(r) < r.prompt_tokens; }

std::uint32_t as_u32(double v) { return static_cast<std::uint32_t>(std::llround(v)); }

}  // namespace

MarsStepParams mars_step_params(const PolicyParams& p) {
  MarsStepParams m;
  m.levels = std::clamp(as_u32(p.get("levels")), 1u, kMarsMaxLevels);
  for (std::uint32_t k = 0; k < kMarsMaxLevels; ++k) {
    m.quanta[k] = std::max(1u, as_u32(p.get("quantum_" + std::to_string(k))));
  }
  for (std::uint32_t k = 0; k + 1 < kMarsMaxLevels; ++k) {
    m.thresholds[k] = as_u32(p.get("threshold_" + std::to_string(k)));
    // Levels must not overlap: a threshold below the previous one is raised to it.
    if (k > 0) m.thresholds[k] = std::max(m.thresholds[k], m.thresholds[k - 1]);
  }
  m.aging_interval = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(p.get("aging_interval_s")));
  m.chunk_halving = p.flag("chunk_halving");
  m.overflow_window = as_u32(p.get("overflow_window"));
  m.program_quanta = p.flag("program_quanta");
  return m;
}

std::unique_ptr<StepScheduler> make_mars_step(const PolicyParams& p) {
  return std::make_unique<MarsStepScheduler>(mars_step_params(p));
}

std::uint32_t MarsStepScheduler::level_for(std::uint32_t tokens) const {
  std::uint32_t level = 0;
  while (level + 1 < params_.levels && tokens > params_.thresholds[level]) ++level;
  return level;
}

const MarsRequestState* MarsStepScheduler::state(std::uint64_t id) const {
  auto it = states_.find(id);
  // An entry not refreshed in the latest step is stale (awaiting the sweep).
  return it == states_.end() || it->second.seen_step != step_ ? nullptr : &it->second;
}

std::size_t MarsStepScheduler::remembered() const {
  return static_cast<std::size_t>(
      std::count_if(states_.begin(), states_.end(), [this](const auto& e) { return e.second.seen_step == step_; }));
}

std::uint32_t MarsStepScheduler::program_level(SessionId session) const {
  if (!params_.program_quanta) return 0;
  auto it = service_.find(session);
  if (it == service_.end()) return 0;
  return level_for(static_cast<std::uint32_t>(
      std::min<std::uint64_t>(it->second.tokens, std::numeric_limits<std::uint32_t>::max())));
}

std::uint32_t MarsStepScheduler::effective_level(const StepRequest& r, Time now) const {
  return effective_level(r, state(r.id), now);
}

std::uint32_t MarsStepScheduler::effective_level(const StepRequest& r, const MarsRequestState* s, Time now) const {
  if (!prefilling(r)) return 0;  // decode is level 0
  // Never scheduled: MARS sets last_scheduled to now − interval·(levels+1),
  // which ages any base level to 0.
  if (s == nullptr || !s->last_scheduled) return 0;
  const std::uint32_t base = std::max(s->feedback, level_for(r.prompt_tokens - start_of(r)));
  std::uint64_t aging = 0;
  if (params_.aging_interval > Duration::zero() && now > *s->last_scheduled) {
    aging = static_cast<std::uint64_t>((now - *s->last_scheduled) / params_.aging_interval);
  }
  return aging >= base ? 0 : base - static_cast<std::uint32_t>(aging);
}

std::uint32_t MarsStepScheduler::quantum(const StepInput& in, std::uint32_t level) const {
  const double scaled = static_cast<double>(params_.quanta[level]) * quantum_scale_;
  return static_cast<std::uint32_t>(std::min<double>(scaled, in.token_budget));
}

MarsRequestState& MarsStepScheduler::touch(const StepRequest& r) {
  auto [it, inserted] = states_.try_emplace(r.id);
  MarsRequestState& s = it->second;
  // Not seen in the previous step: it left and came back (or the entry is
  // stale, awaiting the sweep), so it starts afresh.
  const bool fresh = inserted || s.seen_step + 1 != step_;
  if (fresh) s = MarsRequestState{};
  s.seen_step = step_;
  if (r.phase != RequestPhase::kRunning) {
    // Waiting or preempted: MARS resets feedback on admission and preemption,
    // and a request out of the running list has no service to age from.
    s.feedback = 0;
    s.last_scheduled.reset();
    if (r.phase == RequestPhase::kWaiting) s.preempt_seq = 0;
  } else if (fresh && r.last_scheduled != Time{}) {
    s.last_scheduled = r.last_scheduled;
  }
  return s;
}

void MarsStepScheduler::plan(const StepInput& in, Time now, StepPlan& out) {
  ++step_;
  const std::uint32_t n_req = static_cast<std::uint32_t>(in.requests.size());
  std::vector<MarsRequestState*> st(n_req);
  for (std::uint32_t i = 0; i < n_req; ++i) st[i] = &touch(in.requests[i]);

  ChunkLedger plan(in);
  std::vector<std::uint32_t> quantum_of(n_req, 0);  // 0: not capped (decode)
  std::vector<bool> gone(n_req, false);             // preempted this step

  for (std::uint32_t i = 0; i < n_req; ++i) {
    const StepRequest& r = in.requests[i];
    if (!prefilling(r)) continue;
    // program_level() is 0 with program_quanta off: MARS's own level then.
    quantum_of[i] = quantum(in, std::max(effective_level(r, st[i], now), program_level(r.session)));
  }

  // 1. Running requests by (effective level, last scheduled, arrival).
  std::vector<std::uint32_t> running;
  for (std::uint32_t i = 0; i < n_req; ++i) {
    if (in.requests[i].phase == RequestPhase::kRunning) running.push_back(i);
  }
  // Keys are computed once: nothing that feeds them changes for a request
  // still running during this pass (only victims' state is reset, and a
  // victim is gone).
  using RunKey = std::tuple<std::uint32_t, Time, Time, std::uint32_t>;
  std::vector<RunKey> run_keys(n_req);
  for (std::uint32_t i : running) {
    const StepRequest& r = in.requests[i];
    const Time last = st[i]->last_scheduled.value_or(Time::min());  // never: first within its level
    run_keys[i] = RunKey(effective_level(r, st[i], now), last, r.arrival, i);
  }
  // Running order is consumed from a min-heap: only the requests the budget
  // reaches are ordered (a step schedules tens of hundreds), O(n + k log n).
  std::vector<std::uint32_t> order = running;
  auto run_after = [&](std::uint32_t a, std::uint32_t b) { return run_keys[a] > run_keys[b]; };
  std::make_heap(order.begin(), order.end(), run_after);
  auto heap_end = order.end();

  // MARS's victim: argmax of (level, blocks, arrival) over what still runs;
  // the first in running order wins a full tie (Python's max()). Keys are
  // fixed within the step, so the first preemption builds a max-heap of them
  // (running position breaking ties) and each victim pops what is gone off
  // its top: O(n + v log n) for v victims, and nothing when none is needed.
  using VictimKey = std::tuple<int, std::uint32_t, Time>;
  std::vector<VictimKey> victim_keys;
  std::vector<std::uint32_t> position;
  std::vector<std::uint32_t> victims;
  auto victim_below = [&](std::uint32_t a, std::uint32_t b) {
    if (victim_keys[a] != victim_keys[b]) return victim_keys[a] < victim_keys[b];
    return position[a] > position[b];
  };
  auto pick_victim = [&]() {
    if (victim_keys.empty()) {
      victim_keys.resize(n_req);
      position.resize(n_req);
      for (std::uint32_t pos = 0; pos < running.size(); ++pos) {
        const std::uint32_t i = running[pos];
        const StepRequest& r = in.requests[i];
        const int level =
            prefilling(r) ? static_cast<int>(std::max(st[i]->feedback, level_for(r.prompt_tokens - start_of(r)))) : -1;
        victim_keys[i] =
            VictimKey(level, plan.kv().blocks_for(std::min(r.computed_tokens, in.max_model_len)), r.arrival);
        position[i] = pos;
      }
      victims = running;
      std::make_heap(victims.begin(), victims.end(), victim_below);
    }
    while (gone[victims.front()]) {
      std::pop_heap(victims.begin(), victims.end(), victim_below);
      victims.pop_back();
    }
    return victims.front();  // the request being scheduled is always a candidate
  };

  bool preempted = false;
  while (heap_end != order.begin()) {
    if (plan.budget() == 0) break;
    std::pop_heap(order.begin(), heap_end, run_after);
    --heap_end;
    const std::uint32_t idx = *heap_end;
    if (gone[idx]) continue;
    const StepRequest& r = in.requests[idx];
    std::uint32_t attempt = std::min(r.tokens_wanted(), plan.budget());
    if (quantum_of[idx] != 0) attempt = std::min(attempt, quantum_of[idx]);
    bool preempted_self = false;
    while (true) {
      if (plan.try_schedule(r, idx, attempt)) break;
      if (params_.chunk_halving && prefilling(r) && attempt > in.block_size) {
        attempt = std::max(in.block_size, attempt / 2);
        continue;
      }
      const std::uint32_t v = pick_victim();
      gone[v] = true;
      preempted = true;
      plan.preempt(in.requests[v], v);  // a chunk already scheduled this step comes back too
      out.preempt.push_back(v);
      st[v]->feedback = 0;
      st[v]->last_scheduled.reset();
      st[v]->preempt_seq = ++preempt_seq_;
      if (v == idx) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;
  }

  // 2. Waiting requests, only if nothing was preempted (as vLLM).
  if (!preempted) {
    std::uint32_t seats = static_cast<std::uint32_t>(running.size());
    std::vector<std::uint32_t> queued;   // preempted: always inside the window
    std::vector<std::uint32_t> waiting;  // by arrival
    for (std::uint32_t i = 0; i < n_req; ++i) {
      const RequestPhase ph = in.requests[i].phase;
      if (ph == RequestPhase::kPreempted) queued.push_back(i);
      if (ph == RequestPhase::kWaiting) waiting.push_back(i);
    }
    auto by_arrival = [&](std::uint32_t a, std::uint32_t b) {
      return std::tuple(in.requests[a].arrival, a) < std::tuple(in.requests[b].arrival, b);
    };
    if (params_.overflow_window != 0) {
      const std::size_t used = running.size() + queued.size();
      const std::size_t room = params_.overflow_window > used ? params_.overflow_window - used : 0;
      if (waiting.size() > room) {
        // Only the earliest `room` arrivals are looked at; the rest sits in
        // MARS's FCFS overflow. partial_sort: O(n log room), not O(n log n).
        std::partial_sort(waiting.begin(), waiting.begin() + static_cast<std::ptrdiff_t>(room), waiting.end(),
                          by_arrival);
        waiting.resize(room);
      }
    }
    // MarsRequestQueue: prepended (preempted) requests at the head, the most
    // recently preempted first; then (level of the whole prompt, arrival).
    // Requests the engine preempted on its own (seq 0) follow ours. Keys are
    // computed once, not inside the comparator.
    queued.insert(queued.end(), waiting.begin(), waiting.end());
    using WaitKey = std::tuple<int, std::int64_t, Time, std::uint32_t>;
    std::vector<std::pair<WaitKey, std::uint32_t>> keyed;
    keyed.reserve(queued.size());
    for (std::uint32_t i : queued) {
      const StepRequest& r = in.requests[i];
      if (r.phase == RequestPhase::kPreempted) {
        keyed.emplace_back(WaitKey(0, -static_cast<std::int64_t>(st[i]->preempt_seq), r.arrival, i), i);
      } else {
        keyed.emplace_back(WaitKey(1, static_cast<std::int64_t>(level_for(r.prompt_tokens)), r.arrival, i), i);
      }
    }
    std::sort(keyed.begin(), keyed.end());
    for (std::size_t k = 0; k < keyed.size(); ++k) queued[k] = keyed[k].second;

    for (std::uint32_t idx : queued) {
      if (plan.budget() == 0 || seats >= in.max_seqs) break;
      const StepRequest& r = in.requests[idx];
      std::uint32_t attempt = std::min(r.tokens_wanted(), plan.budget());
      if (quantum_of[idx] != 0) attempt = std::min(attempt, quantum_of[idx]);
      bool admitted = false;
      while (true) {
        if (plan.try_schedule(r, idx, attempt)) {
          admitted = true;
          break;
        }
        if (!(params_.chunk_halving && prefilling(r) && attempt > in.block_size)) break;
        attempt = std::max(in.block_size, attempt / 2);
      }
      if (!admitted) break;  // head-of-line blocking, no skipping
      st[idx]->preempt_seq = 0;
      ++seats;
    }
  }

  // Work conservation (not MARS): a step of prefills alone, with every
  // queued request scheduled, gives its unused budget to those prefills.
  if (params_.fill_idle_budget && !preempted && plan.budget() > 0) {
    std::vector<ScheduledChunk> chunks;
    plan.emit(chunks);
    bool lone = !chunks.empty();
    std::size_t scheduled = 0;
    for (const ScheduledChunk& c : chunks) {
      const StepRequest& r = in.requests[c.request];
      lone = lone && prefilling(r) && start_of(r) + c.tokens < r.prompt_tokens + 1;
      ++scheduled;
    }
    lone = lone && scheduled == static_cast<std::size_t>(n_req);
    if (lone) {
      for (const ScheduledChunk& c : chunks) {
        const StepRequest& r = in.requests[c.request];
        const std::uint32_t left = r.prompt_tokens - std::min(r.prompt_tokens, start_of(r) + c.tokens);
        const std::uint32_t extra = std::min(left, plan.budget());
        if (extra > 0) (void)plan.try_extend(r, c.request, extra);
        if (plan.budget() == 0) break;
      }
    }
  }

  plan.emit(out.run);

  // 3. MLFQ feedback for what runs.
  for (const ScheduledChunk& c : out.run) {
    const StepRequest& r = in.requests[c.request];
    MarsRequestState& s = *st[c.request];
    if (params_.program_quanta) service_[r.session].tokens += c.tokens;
    s.last_scheduled = now;
    if (!prefilling(r) || start_of(r) + c.tokens >= r.prompt_tokens) {
      s.feedback = 0;  // in decode, or entering it
    } else if (c.tokens >= quantum_of[c.request]) {
      s.feedback = std::min(s.feedback + 1, params_.levels - 1);
    }
  }

  // Forget requests that left the engine. Swept every 64 steps (and when the
  // table has grown past twice the queue): memory stays bounded without a
  // pass over every remembered request each step.
  if (step_ % 64 == 0 || states_.size() > 2 * static_cast<std::size_t>(n_req) + 64) {
    std::erase_if(states_, [this](const auto& kv_pair) { return kv_pair.second.seen_step != step_; });
  }
  if (params_.program_quanta) {
    for (const StepRequest& r : in.requests) {
      auto it = service_.find(r.session);
      if (it != service_.end()) it->second.last_seen = now;
    }
    if (step_ % 64 == 0) {
      std::erase_if(service_, [now](const auto& e) { return now - e.second.last_seen > kProgramForget; });
    }
  }
}

}  // namespace tandem::sched
