// ThunderAgent's capacity scheduling ([baselines] §1.4 as released,
// §1.5 as fixed). "Released:" comments name what router.py does differently.
#include "sched/thunderagent.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace tandem::sched {
namespace {

bool admitted(const Session& s) { return s.state == SessionState::kReasoning || s.state == SessionState::kActing; }

// A call held by the policy: a new program's first round, or a paused
// program's next round.
bool holds_call(const Session& s) {
  return s.round_in_flight && (s.state == SessionState::kWaiting || s.state == SessionState::kPaused);
}

}  // namespace

ThunderAgentParams thunderagent_params(const PolicyParams& p) {
  ThunderAgentParams t;
  t.check_interval = base::from_seconds(p.get("check_interval_s"));
  t.buffer_tokens = p.get("buffer_tokens");
  t.acting_weight = p.get("acting_weight");
  t.decay = static_cast<ThunderDecay>(std::clamp(static_cast<int>(std::lround(p.get("decay_mode"))), 0, 2));
  t.decay_half_life_s = p.get("decay_half_life_s");
  t.resume_timeout = base::from_seconds(p.get("resume_timeout_s"));
  t.lambda_max = p.get("lambda_max");
  t.lambda_min = p.get("lambda_min");
  t.released_pause_loop = p.flag("released_pause_loop");
  return t;
}

std::unique_ptr<ControlPolicy> make_thunderagent_control(const PolicyParams& p) {
  return std::make_unique<ThunderAgentControl>(thunderagent_params(p));
}

// ---- accounting ---------------------------------------------------------------

ThunderAgentControl::Program ThunderAgentControl::program_of(const Session& s) const {
  Program prog;
  prog.id = s.id;
  // Exact counts instead of router.py's len(json)/5 estimate and its +20 per
  // 20 streamed tokens (§1.5 item 4). While a round runs its output is not
  // reported, so the prompt stands for the whole context, as in router.py
  // at a call's arrival.
  prog.tokens = s.round_in_flight ? std::max(s.prompt_tokens, s.context_tokens) : s.context_tokens;
  // ThunderAgent's phase: ACTING from CALL_FINISH to the next CALL_ARRIVE.
  prog.acting = s.rounds_done > 0 && !s.round_in_flight;
  prog.acting_since = s.last_round_end;
  prog.marked = marks_.contains(s.id);
  return prog;
}

double ThunderAgentControl::weight(const Program& prog, bool decayed, Time now) const {
  if (!prog.acting) return prog.tokens;
  if (!decayed) return p_.acting_weight * prog.tokens;
  const double t = std::max(0.0, base::to_seconds(now - prog.acting_since));
  return prog.tokens * std::exp2(-t / p_.decay_half_life_s);
}

double ThunderAgentControl::used(const Backend& b, bool decayed, bool count_marked, Time now) const {
  double sum = 0;
  for (const Program& prog : b.programs) {
    if (prog.marked && !count_marked) continue;
    sum += weight(prog, decayed, now) + p_.buffer_tokens;
  }
  return sum;
}

Time ThunderAgentControl::pending_since(const Session& s) const {
  auto it = pending_since_.find(s.id);
  return it == pending_since_.end() ? s.state_since : it->second;
}

// ---- events -------------------------------------------------------------------

void ThunderAgentControl::on_event(const Event& event, const NodeModel& model, Time now) {
  if (const auto* e = std::get_if<RoundSubmitted>(&event)) {
    boundary_ = true;
    const Session* s = model.sessions().find(e->session);
    // The held call's timeout runs from its arrival (router.py waits on the
    // program's event when the request comes in, not when it was paused).
    if (s != nullptr && holds_call(*s) && s->round == e->round) pending_since_.emplace(e->session, now);
  } else if (std::holds_alternative<RoundEnded>(event) || std::holds_alternative<ToolEnded>(event)) {
    boundary_ = true;
  }
}

// ---- tick ---------------------------------------------------------------------

void ThunderAgentControl::prune(const NodeModel& model) {
  const SessionTable& table = model.sessions();
  std::erase_if(marks_, [&](const auto& kv) {
    const Session* s = table.find(kv.first);
    // Gone, paused (applied), or a later round was submitted: the host did
    // not apply the pause at the boundary, so the mark is void.
    return s == nullptr || !admitted(*s) || s->round != kv.second.round;
  });
  std::erase_if(origin_, [&](const auto& kv) {
    const Session* s = table.find(kv.first);
    return s == nullptr || (s->state != SessionState::kPaused && !marks_.contains(kv.first));
  });
  std::erase_if(pending_since_, [&](const auto& kv) {
    const Session* s = table.find(kv.first);
    return s == nullptr || !holds_call(*s);
  });
  std::erase_if(queued_, [&](SessionId id) {
    const Session* s = table.find(id);
    return s == nullptr || s->state != SessionState::kWaiting;
  });
}

ThunderAgentControl::Ledger ThunderAgentControl::build_ledger(const NodeModel& model) const {
  Ledger ledger;
  for (const auto& [id, view] : model.engines()) {
    // C_total from the engine's Hello, as router.py reads
    // vllm:cache_config_info once at start-up; the KV stats stand in only if
    // the Hello had none. An engine without either is skipped, like a
    // backend without cache_config.
    std::uint64_t blocks =
        view.params.total_blocks != 0 ? view.params.total_blocks : (view.has_stats ? view.kv.blocks_total : 0);
    double capacity = static_cast<double>(blocks) * view.params.block_size;
    if (capacity <= 0) continue;
    ledger[id] = Backend{id, capacity, {}};
  }
  for (const Session* s : model.sessions().by_id()) {
    if (!admitted(*s)) continue;
    auto it = ledger.find(s->engine);
    if (it != ledger.end()) it->second.programs.push_back(program_of(*s));
  }
  return ledger;
}

void ThunderAgentControl::tick(const NodeModel& model, Time now, Actions& out) {
  prune(model);
  decided_.clear();
  Ledger ledger = build_ledger(model);
  // The waiter's own timer: not tied to Δt.
  force_timeouts(model, ledger, now, out);

  if (!checked_ || now >= next_check_) {
    checked_ = true;
    next_check_ = now + p_.check_interval;
    boundary_ = false;
    greedy_resume(model, ledger, now, out);  // router.py: resume first, then pause
    for (auto& [id, b] : ledger) pause_until_safe(model, b, now, out);
    // Whoever is still WAITING is in the queue now.
    for (const Session* s : model.sessions().by_id()) {
      if (s->state == SessionState::kWaiting && s->round_in_flight && !decided_.contains(s->id)) queued_.insert(s->id);
    }
  } else if (boundary_) {
    boundary_ = false;
    admit_arrivals(model, ledger, now, out);
  }
}

// router.py: a held call waits at most 1800 s, then its program is restored
// on its origin backend (a never-placed one on the backend with the fewest
// programs), with no capacity check.
void ThunderAgentControl::force_timeouts(const NodeModel& model, Ledger& ledger, Time now, Actions& out) {
  std::vector<std::tuple<Time, SessionId>> due;
  for (const Session* s : model.sessions().by_id()) {
    if (holds_call(*s) && now - pending_since(*s) >= p_.resume_timeout) due.emplace_back(pending_since(*s), s->id);
  }
  std::sort(due.begin(), due.end());
  for (const auto& [since, id] : due) {
    const Session& s = *model.sessions().find(id);
    Program prog = program_of(s);
    prog.placed_now = true;
    if (s.state == SessionState::kWaiting) {
      // Deviation: admit has no engine, so "never placed" means the engine
      // its round was submitted to, not the one with the fewest programs.
      out.admit(id);
      decided_.insert(id);
      if (auto it = ledger.find(s.engine); it != ledger.end()) it->second.programs.push_back(prog);
      continue;
    }
    EngineId target = kNoEngine;
    if (auto o = origin_.find(id); o != origin_.end() && model.engine(o->second) != nullptr) {
      target = o->second;
    } else if (model.engine(s.engine) != nullptr) {
      target = s.engine;  // paused by someone else (or before a restart): its latest engine
    } else {
      std::size_t fewest = ~std::size_t{0};
      for (const auto& [eid, b] : ledger) {
        if (b.programs.size() < fewest) {
          fewest = b.programs.size();
          target = eid;
        }
      }
    }
    if (target == kNoEngine) continue;  // no engine at all: keep holding it
    out.restore(id, target);
    decided_.insert(id);
    if (auto it = ledger.find(target); it != ledger.end()) it->second.programs.push_back(prog);
  }
}

// router.py at CALL_ARRIVE of a brand-new program: if anything is queued, the
// newcomer queues behind it; otherwise it is placed if
// remaining_b >= tokens + buffer, and queued if not.
void ThunderAgentControl::admit_arrivals(const NodeModel& model, Ledger& ledger, Time now, Actions& out) {
  bool queue_nonempty = false;
  std::vector<std::tuple<Time, SessionId>> arrivals;
  for (const Session* s : model.sessions().by_id()) {
    if (decided_.contains(s->id)) continue;
    if (s->state == SessionState::kPaused || queued_.contains(s->id)) {
      queue_nonempty = true;
    } else if (s->state == SessionState::kWaiting && s->round_in_flight) {
      arrivals.emplace_back(pending_since(*s), s->id);
    }
  }
  std::sort(arrivals.begin(), arrivals.end());
  // Judgement: the paper's decay applies here when it applies to the check
  // (decay_mode 2); router.py uses the undecayed remaining_b. Programs
  // marked for pause still hold their KV, so they count.
  const bool decayed = p_.decay == ThunderDecay::kCheckAndResume;
  for (const auto& [since, id] : arrivals) {
    const Session& s = *model.sessions().find(id);
    Program prog = program_of(s);
    auto it = ledger.find(s.engine);
    // Deviation: router.py places the newcomer on the least-loaded backend
    // with room; admit carries no engine, so only its own engine is tried.
    if (!queue_nonempty && it != ledger.end()) {
      Backend& b = it->second;
      const double remaining = p_.lambda_max * b.capacity - used(b, decayed, true, now);
      if (remaining >= prog.tokens + p_.buffer_tokens) {
        out.admit(id);
        decided_.insert(id);
        prog.placed_now = true;
        b.programs.push_back(prog);
        continue;
      }
    }
    queued_.insert(id);
    queue_nonempty = true;
  }
}

// router.py _greedy_resume: choose from the one queue (pending calls, then new
// programs, then the rest; smallest first in each group) what fits in the sum
// of all engines' room, then place largest first, each on the engine with the
// most room.
void ThunderAgentControl::greedy_resume(const NodeModel& model, Ledger& ledger, Time now, Actions& out) {
  const double buf = p_.buffer_tokens;
  const bool decayed = p_.decay != ThunderDecay::kNone;
  struct Cap {
    EngineId engine;
    double room;
  };
  std::vector<Cap> caps;
  double total = 0;
  for (auto& [id, b] : ledger) {
    // Marked programs count: they hold KV until their round ends (router.py
    // does not subtract future_paused_tokens here either).
    const double u = used(b, decayed, true, now);
    // Fixed (§1.5 item 2): restore only below lambda_min × C, never above
    // lambda_max × C. Released: remaining > 100 only (λ = 1).
    if (u >= p_.lambda_min * b.capacity) continue;
    const double room = p_.lambda_max * b.capacity - u;
    if (room <= buf) continue;
    caps.push_back({id, room});
    total += room;
  }
  if (caps.empty()) return;

  struct Cand {
    int group;  // 1: paused with a pending call, 2: new program, 3: paused, no call
    double tokens;
    SessionId id;
    bool waiting;
    EngineId engine;  // a WAITING session's engine
  };
  std::vector<Cand> cands;
  for (const Session* s : model.sessions().by_id()) {
    if (decided_.contains(s->id)) continue;
    const double tokens = program_of(*s).tokens;
    if (s->state == SessionState::kPaused) {
      cands.push_back({s->round_in_flight ? 1 : 3, tokens, s->id, false, kNoEngine});
    } else if (s->state == SessionState::kWaiting && s->round_in_flight) {
      cands.push_back({2, tokens, s->id, true, s->engine});
    }
  }
  std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
    return std::tie(a.group, a.tokens, a.id) < std::tie(b.group, b.tokens, b.id);
  });
  // Selection does not stop at the first misfit: a smaller program further
  // down may still fit (router.py walks the whole list).
  std::vector<Cand> sel;
  double cum = 0;
  for (const Cand& c : cands) {
    if (cum + c.tokens + buf <= total) {
      sel.push_back(c);
      cum += c.tokens + buf;
    }
  }
  if (sel.empty()) return;
  std::sort(sel.begin(), sel.end(),
            [](const Cand& a, const Cand& b) { return a.tokens != b.tokens ? a.tokens > b.tokens : a.id < b.id; });
  const double smallest_need = sel.back().tokens + buf;
  auto by_room = [](const Cap& a, const Cap& b) { return a.room != b.room ? a.room > b.room : a.engine < b.engine; };
  std::sort(caps.begin(), caps.end(), by_room);

  for (const Cand& c : sel) {
    if (caps.empty() || smallest_need > caps.front().room) break;
    const double need = c.tokens + buf;
    std::size_t slot = 0;
    if (c.waiting) {
      // Deviation: admit carries no engine, so a new program can only be
      // placed on the engine its round was submitted to.
      auto it = std::find_if(caps.begin(), caps.end(), [&](const Cap& cap) { return cap.engine == c.engine; });
      if (it == caps.end()) continue;
      slot = static_cast<std::size_t>(it - caps.begin());
    }
    if (need > caps[slot].room) continue;
    const EngineId engine = caps[slot].engine;
    if (c.waiting) {
      out.admit(c.id);
    } else {
      out.restore(c.id, engine);
    }
    decided_.insert(c.id);
    Program prog = program_of(*model.sessions().find(c.id));
    prog.placed_now = true;
    ledger[engine].programs.push_back(prog);
    caps[slot].room -= need;
    if (caps[slot].room <= buf) caps.erase(caps.begin() + static_cast<std::ptrdiff_t>(slot));
    std::sort(caps.begin(), caps.end(), by_room);
  }
}

// router.py _pause_until_safe, with PR #34's fix (§1.5 item 1): a marked
// program no longer counts against the check, so the loop stops once the
// projected usage fits.
void ThunderAgentControl::pause_until_safe(const NodeModel& model, Backend& b, Time now, Actions& out) {
  // Fixed: decay in the check only in the paper's mode. Released: the check
  // always uses acting_weight.
  const bool decayed = p_.decay == ThunderDecay::kCheckAndResume;
  const bool count_marked = p_.released_pause_loop;
  double remaining = p_.lambda_max * b.capacity - used(b, decayed, count_marked, now);
  // Victim: smallest c first (S_pause = 1/c + I(acting)); ties by id.
  // Judgement: a program placed in this tick is never a victim in the same
  // tick (router.py could restore and pause it in one check when the resume
  // and check metrics differ).
  auto pick = [&](bool acting) {
    auto best = b.programs.end();
    for (auto it = b.programs.begin(); it != b.programs.end(); ++it) {
      if (it->marked || it->placed_now || it->acting != acting) continue;
      if (best == b.programs.end() || std::tie(it->tokens, it->id) < std::tie(best->tokens, best->id)) best = it;
    }
    return best;
  };
  while (remaining < 0) {
    if (auto it = pick(true); it != b.programs.end()) {
      // An ACTING program's KV is already released to the prefix cache: pause
      // = take it off the engine's books and hold its next call.
      out.pause(it->id);
      origin_[it->id] = b.id;
      remaining += weight(*it, decayed, now) + p_.buffer_tokens;
      b.programs.erase(it);
      continue;
    }
    if (auto it = pick(false); it != b.programs.end()) {
      // A REASONING program finishes its call; the host pauses it at the
      // round's end. It stays on the books (its KV is still held) but marked.
      out.pause(it->id);
      origin_[it->id] = b.id;
      const Session* s = model.sessions().find(it->id);
      marks_[it->id] = Mark{s != nullptr ? s->round : 0};
      it->marked = true;
      // Released: marking did not lower the checked usage, so the loop went
      // on to mark every REASONING program.
      if (!p_.released_pause_loop) remaining += it->tokens + p_.buffer_tokens;
      continue;
    }
    break;
  }
}

}  // namespace tandem::sched
