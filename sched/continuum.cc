// Continuum step scheduler (see continuum.h for the algorithm and sources).
#include "sched/continuum.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <tuple>

namespace tandem::sched {

ContinuumParams continuum_params(const PolicyParams& p) {
  ContinuumParams c;
  c.dynamic = p.flag("continuum_dy");
  c.threshold_s = p.get("threshold_s");
  c.ttl_s = p.get("ttl_s");
  c.min_pin_s = p.get("min_pin_s");
  c.min_samples = static_cast<std::uint32_t>(p.get("min_samples"));
  c.reload_s_per_token = p.get("reload_s_per_token");
  c.delay_window = static_cast<std::uint32_t>(p.get("delay_window"));
  c.sample_window = static_cast<std::uint32_t>(p.get("sample_window"));
  return c;
}

std::unique_ptr<StepScheduler> make_continuum_step(const PolicyParams& p) {
  return std::make_unique<ContinuumStepScheduler>(continuum_params(p));
}

double ContinuumStepScheduler::mean_s(ToolKind kind) const {
  const Kind* k = kinds_.find(kind);
  if (k == nullptr || k->count == 0) return 0.0;  // unknown counts as 0 (the repo's cold start)
  return k->sum / static_cast<double>(k->count);
}

double ContinuumStepScheduler::queue_delay_s() const {
  if (delays_.empty()) return 0.0;
  double sum = 0;
  for (double d : delays_) sum += d;
  return sum / static_cast<double>(delays_.size());
}

double ContinuumStepScheduler::eta() const {
  if (eta_n_ < 2) return 1.0;
  const double num = eta_n_ * eta_xy_ - eta_x_ * eta_y_;
  const double den_x = eta_n_ * eta_xx_ - eta_x_ * eta_x_;
  const double den_y = eta_n_ * eta_yy_ - eta_y_ * eta_y_;
  if (den_x <= 0 || den_y <= 0) return 1.0;
  return -std::clamp(num / std::sqrt(den_x * den_y), -1.0, 1.0);
}

double ContinuumStepScheduler::ttl_for(ToolKind kind, std::uint32_t context_tokens) const {
  if (params_.dynamic) return dynamic_ttl(kind, context_tokens);
  return mean_s(kind) > params_.threshold_s ? 0.0 : params_.ttl_s;
}

double ContinuumStepScheduler::dynamic_ttl(ToolKind kind, std::uint32_t context_tokens) const {
  const double base = queue_delay_s() * eta() + params_.reload_s_per_token * context_tokens;
  if (base <= 0) return 0.0;
  if (all_.size() <= params_.min_samples) return params_.ttl_s;  // cold start
  const Kind* k = kinds_.find(kind);
  const std::vector<double>& records =
      (k != nullptr && k->samples.size() > params_.min_samples) ? k->samples.sorted() : all_.sorted();
  if (records.empty()) return 0.0;
  // τ ∈ {0} ∪ records, ascending; the first best wins. P(D ≤ τ) for a
  // sample τ is the position after its last copy, so one walk finds them all.
  const auto n = static_cast<double>(records.size());
  double best_tau = 0;
  double best = -std::numeric_limits<double>::infinity();
  auto consider = [&](double tau, std::size_t at_or_below) {
    const double reward = static_cast<double>(at_or_below) / n * base - tau;
    if (reward > best) {
      best = reward;
      best_tau = tau;
    }
  };
  consider(0.0, static_cast<std::size_t>(std::upper_bound(records.begin(), records.end(), 0.0) - records.begin()));
  for (std::size_t i = 0; i < records.size(); ++i) {
    if (records[i] > 0 && (i + 1 == records.size() || records[i + 1] != records[i])) consider(records[i], i + 1);
  }
  return best <= 0 ? 0.0 : best_tau;
}

KeepPlan ContinuumStepScheduler::on_round_end(const RoundEndInfo& info, Time now) {
  Session& s = sessions_[info.session];
  ++s.rounds_done;
  s.last_round_end = now;
  if (!info.tool_follows) {
    // The program's last round: its (k, N − k) pairs feed η.
    const double total = s.rounds_done;
    for (std::uint32_t k : s.k_at_arrival) {
      const double x = k;
      const double y = total - x;
      eta_n_ += 1;
      eta_x_ += x;
      eta_y_ += y;
      eta_xx_ += x * x;
      eta_yy_ += y * y;
      eta_xy_ += x * y;
    }
    s.k_at_arrival.clear();
    return {};
  }
  const double ttl = ttl_for(info.tool, info.context_tokens);
  if (ttl <= params_.min_pin_s) return {};
  return {KeepDecision::kPin, now + base::from_seconds(ttl)};
}

void ContinuumStepScheduler::on_tool_end(SessionId /*session*/, ToolKind kind, Duration wall, Time /*now*/) {
  const double s = std::max(0.0, base::to_seconds(wall));
  Kind& k = kinds_.use(kind);
  k.sum += s;
  ++k.count;
  if (params_.dynamic) {
    k.samples.add(s, params_.sample_window);
    all_.add(s, params_.sample_window);
  }
}

void ContinuumStepScheduler::on_session_end(SessionId session, Time /*now*/) { sessions_.erase(session); }

void ContinuumStepScheduler::plan(const StepInput& in, Time now, StepPlan& out) {
  ++generation_;
  const auto n_req = static_cast<std::uint32_t>(in.requests.size());
  queued_.start(in);
  QueuedPins& waiting_sessions = queued_;
  session_of_.resize(n_req);
  for (std::uint32_t i = 0; i < n_req; ++i) {
    const StepRequest& r = in.requests[i];
    Session& s = sessions_[r.session];
    session_of_[i] = &s;  // the map's nodes stay put for the rest of plan()
    auto [it, inserted] = seen_.try_emplace(r.id, generation_);
    if (inserted) s.k_at_arrival.push_back(s.rounds_done);
    it->second = generation_;
    s.first_arrival = std::min(s.first_arrival, r.arrival);
  }
  std::erase_if(seen_, [&](const auto& kv) { return kv.second != generation_; });
  std::erase_if(preempted_at_, [&](const auto& kv) { return !seen_.contains(kv.first); });

  ChunkLedger plan(in);
  std::vector<char>& pin_alive = pin_alive_;
  pin_alive.assign(in.pinned.size(), 1);
  auto unpin = [&](std::size_t k) {
    pin_alive[k] = 0;
    out.unpin.push_back(in.pinned[k].session);
    // A queued request of the same session counts these blocks as its own
    // (StepRequest::blocks_held): released, they stay its prefix hit, now
    // drawn from the free pool, so the ledger gains nothing.
    if (!waiting_sessions.contains(in.pinned[k].session)) plan.kv().release(in.pinned[k].blocks);
  };
  // The live pin with the latest end (the first of equals).
  auto latest_pin = [&]() -> std::ptrdiff_t {
    std::ptrdiff_t best = -1;
    for (std::size_t k = 0; k < in.pinned.size(); ++k) {
      if (pin_alive[k] != 0 && (best < 0 || in.pinned[k].until > in.pinned[static_cast<std::size_t>(best)].until)) {
        best = static_cast<std::ptrdiff_t>(k);
      }
    }
    return best;
  };

  // 1. Expiry sweep: a pin outlives its TTL while its session's next request waits.
  for (std::size_t k = 0; k < in.pinned.size(); ++k) {
    const PinnedKv& p = in.pinned[k];
    auto s = sessions_.find(p.session);
    const bool superseded = s != sessions_.end() && p.pinned_at < s->second.last_round_end;
    const bool expired = now >= p.until && !waiting_sessions.contains(p.session);
    if (superseded || expired) unpin(k);
  }

  auto first_arrival = [&](std::uint32_t idx) { return session_of_[idx]->first_arrival; };

  // 2. Running requests in running order.
  std::vector<std::uint32_t>& running = running_;
  running.clear();
  for (std::uint32_t i = 0; i < n_req; ++i) {
    if (in.requests[i].phase == RequestPhase::kRunning) running.push_back(i);
  }
  bool preempted = false;
  for (std::size_t pos = 0; pos < running.size() && plan.budget() > 0; ++pos) {
    const std::uint32_t idx = running[pos];
    const StepRequest& r = in.requests[idx];
    const std::uint32_t n = std::min(r.tokens_wanted(), plan.budget());
    bool preempted_self = false;
    while (true) {
      if (plan.try_schedule(r, idx, n)) break;
      std::size_t vpos = running.size() - 1;
      if (running.size() <= 1) {
        // Nothing else to preempt: give up the longest-lived pin first.
        if (std::ptrdiff_t k = latest_pin(); k >= 0) {
          unpin(static_cast<std::size_t>(k));
          continue;
        }
        // No pin either (the repo raises here): preempt the request itself, as vLLM does.
      } else {
        // The session that arrived last pays, sparing requests on their last round.
        std::ptrdiff_t best = -1;
        for (bool last_round_ok : {false, true}) {
          for (std::size_t k = 0; k < running.size(); ++k) {
            if (!last_round_ok && in.requests[running[k]].last_round) continue;
            if (best < 0 || first_arrival(running[k]) > first_arrival(running[static_cast<std::size_t>(best)])) {
              best = static_cast<std::ptrdiff_t>(k);
            }
          }
          if (best >= 0) break;
        }
        vpos = static_cast<std::size_t>(best);
      }
      const std::uint32_t victim = running[vpos];
      plan.preempt(in.requests[victim], victim);  // a chunk already scheduled this step comes back too
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(vpos));
      if (vpos < pos) --pos;
      out.preempt.push_back(victim);
      preempted_at_[in.requests[victim].id] = now;
      preempted = true;
      if (victim == idx) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;
  }
  if (preempted) {
    plan.emit(out.run);
    return;
  }

  // 3. Waiting: sessions holding a pin first, then program-level FCFS.
  // The sessions still pinned (a dozen or so), sorted for a binary search.
  std::vector<SessionId>& pinned_sessions = pinned_sessions_;
  pinned_sessions.clear();
  for (std::size_t k = 0; k < in.pinned.size(); ++k) {
    if (pin_alive[k] != 0) pinned_sessions.push_back(in.pinned[k].session);
  }
  std::sort(pinned_sessions.begin(), pinned_sessions.end());
  auto pinned = [&](SessionId s) { return std::binary_search(pinned_sessions.begin(), pinned_sessions.end(), s); };
  // Keys are computed once per request, not inside the comparator.
  std::vector<WaitKey>& keyed = keyed_;
  keyed.clear();
  for (std::uint32_t i = 0; i < n_req; ++i) {
    const StepRequest& r = in.requests[i];
    if (r.phase == RequestPhase::kRunning) continue;
    // Preempted requests were prepended to the queue; ties keep queue order.
    keyed.emplace_back(!pinned(r.session), first_arrival(i), r.phase != RequestPhase::kPreempted, i);
  }
  std::sort(keyed.begin(), keyed.end());
  auto seats = static_cast<std::uint32_t>(running.size());
  for (const WaitKey& key : keyed) {
    if (plan.budget() == 0 || seats >= in.max_seqs) break;
    const std::uint32_t idx = std::get<3>(key);
    const StepRequest& r = in.requests[idx];
    const std::uint32_t n = std::min(r.tokens_wanted(), plan.budget());
    if (!plan.try_schedule(r, idx, n)) {
      // Head-of-line blocking; with nothing running, a pin makes room for the next step.
      if (seats == 0) {
        if (std::ptrdiff_t k = latest_pin(); k >= 0) unpin(static_cast<std::size_t>(k));
      }
      break;
    }
    ++seats;
    if (auto it = preempted_at_.find(r.id); it != preempted_at_.end()) {
      delays_.push_back(base::to_seconds(now - it->second));
      while (delays_.size() > params_.delay_window) delays_.pop_front();
      preempted_at_.erase(it);
    }
  }
  plan.emit(out.run);
}

}  // namespace tandem::sched
