// HostPlane's periodic side (daemon/host_plane.h): what host_tick() does every
// tick and every kHostPeriod. It samples node and tool pressure, gives the
// policy its CPU view, applies the memory rules (sched/host_memory.h) to the
// tool calls' cgroups, and runs the warm pool: refill and shrinking, and the
// removal of ended calls' cgroups. Requests (placement, policy actions,
// session ends) and setup are in host_plane.cc.
#include "daemon/host_plane.h"

#include <fcntl.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace tandem::daemon {
namespace {

using base::Time;

std::string pool_dir(sched::SessionId s, std::uint64_t seq) {
  return fmt::format("tools/{:016x}/{}{}", s, kPoolPrefix, seq);
}

// Node pressure: some avg10 of a /proc/pressure file.
std::optional<double> node_psi(const std::string& path) {
  auto text = cpu::read_file(AT_FDCWD, path.c_str());
  if (!text) return std::nullopt;
  auto psi = cpu::parse_psi(*text);
  if (!psi) return std::nullopt;
  return psi->some.avg10;
}

}  // namespace

std::optional<sched::CpuView> HostPlane::host_tick(Time now, const sched::NodeModel& model) {
  if (sampled_ && now - last_sample_ < kHostPeriod) {
    pool_tick(now, false);
    return view_;
  }
  sampled_ = true;
  last_sample_ = now;

  // Orphans of a previous run: adopted once their session is live again.
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    SessionCg& s = it->second;
    if (s.orphan) {
      const sched::Session* live = model.sessions().find(it->first);
      if (live != nullptr && live->state != sched::SessionState::kDone) {
        s.orphan = false;
        ++sessions_adopted_;
        spdlog::info("host: session {:016x} adopted with {} tool calls", it->first, s.calls.size());
      } else if (now >= s.orphan_deadline) {
        spdlog::info("host: session {:016x} was not claimed within {} s: reaping its tools", it->first,
                     std::chrono::duration<double>(config_.adopt_grace).count());
        ++sessions_reaped_;
        for (auto& [call, c] : s.calls) {
          if (telemetry_) telemetry_->untrack(c.node.id);
        }
        for (const cpu::Node& n : s.leftovers) {
          if (telemetry_) telemetry_->untrack(n.id);
        }
        if (telemetry_) telemetry_->forget_group(it->first);
        pool_ready_ -= s.ready.size();
        pool_dropped_ += s.ready.size();
        s.ready.clear();
        bury(std::move(s.node));
        it = sessions_.erase(it);
        continue;
      }
    }
    std::erase_if(s.leftovers, [&](const cpu::Node& n) {
      auto procs = cgroups_->processes(n);
      if (!procs || !procs->empty() || !cgroups_->remove(n)) return false;
      if (telemetry_) telemetry_->untrack(n.id);
      return true;
    });
    ++it;
  }
  retry_burials();
  pool_tick(now, true);  // also every ended call whose leftovers have gone since the last period

  // Pressure and telemetry.
  memory_psi_ = node_psi(proc_root_ + "/pressure/memory").value_or(-1.0);
  cpu_psi_ = -1.0;
  if (cgroups_->has_v2()) {
    if (auto p = cgroups_->pressure(tools_, "cpu")) cpu_psi_ = p->some.avg10;
  }
  if (cpu_psi_ < 0) cpu_psi_ = node_psi(proc_root_ + "/pressure/cpu").value_or(-1.0);
  view_.tool_cores = tool_cores_;
  view_.psi_some_avg10 = cpu_psi_;
  view_.runq_delay_p50 = {};
  if (telemetry_) {
    on_events();
    std::array<std::uint64_t, bpf::kRunqBuckets> hist{};
    for (const auto& [group, st] : telemetry_->sample()) {
      for (std::size_t i = 0; i < bpf::kRunqBuckets; ++i) hist[i] += st.runq_hist[i];
    }
    std::uint64_t total = 0;
    std::array<std::uint64_t, bpf::kRunqBuckets> delta{};
    for (std::size_t i = 0; i < bpf::kRunqBuckets; ++i) {
      delta[i] = hist[i] >= runq_last_[i] ? hist[i] - runq_last_[i] : 0;
      total += delta[i];
    }
    runq_last_ = hist;
    if (total > 0) {
      std::uint64_t seen = 0;
      for (std::size_t i = 0; i < bpf::kRunqBuckets; ++i) {
        seen += delta[i];
        if (seen * 2 >= total) {
          // Bucket i holds [2^(i-1), 2^i) µs (bucket 0: under 1 µs); report its middle.
          const double us = i == 0 ? 0.5 : 0.75 * static_cast<double>(std::uint64_t{1} << i);
          view_.runq_delay_p50 =
              std::chrono::duration_cast<base::Duration>(std::chrono::duration<double, std::micro>(us));
          break;
        }
      }
    }
  }
  memory_rules(now, model);
  return view_;
}

void HostPlane::memory_rules(Time now, const sched::NodeModel& model) {
  // The tools' memory, call by call; the rule itself is sched/host_memory.h,
  // which tandem-sim runs too.
  tools_memory_ = 0;
  const base::Duration since_sample = last_memory_sample_ ? now - *last_memory_sample_ : base::Duration{};
  last_memory_sample_ = now;
  std::vector<sched::MemoryCall> calls;
  std::vector<std::pair<SessionCg*, Call*>> where;
  for (auto& [id, s] : sessions_) {
    const sched::Session* live = model.sessions().find(id);
    s.priority_class = live != nullptr ? live->priority_class : 0;
    s.pinned = live != nullptr && live->residency == sched::Residency::kPinned;
    for (auto& [call, c] : s.calls) {
      sched::MemoryCall mc;
      mc.session = id;
      mc.call = call;
      auto u = cgroups_->usage(c.node);
      mc.sampled = u.has_value();
      if (u) {
        account_cpu(c, *u);
        account_memory(c, *u);
        c.memory_bytes = u->memory_bytes.value_or(0);
        tools_memory_ += c.memory_bytes;
        mc.stalled = u->memory_stalled;
        if (u->memory_stalled && !c.ended) tools_memory_stalled_ += since_sample;
      }
      mc.memory_bytes = c.memory_bytes;
      mc.limit_high = c.limits.memory_high && *c.limits.memory_high != cpu::kUnlimited ? *c.limits.memory_high : 0;
      mc.ended = c.ended;
      mc.low_priority = c.low_priority;
      mc.frozen = c.frozen;
      mc.priority_class = s.priority_class;
      mc.protected_session = s.pinned;
      mc.stalled_since = c.stalled_since;
      calls.push_back(mc);
      where.emplace_back(&s, &c);
    }
  }

  const auto before = memory_rule_.level();
  std::vector<sched::MemoryVerdict> verdicts;
  memory_rule_.decide(now, memory_psi_, tools_memory_, calls, verdicts);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    Call& c = *where[i].second;
    c.stalled_since = calls[i].stalled_since;
    if (verdicts[i].kill) {
      ++memory_kills_;
      kill_call(calls[i].session, calls[i].call, c, ipc::ToolExitReason::kKilledMemory,
                fmt::format("stalled at its memory limit ({} MiB) for {} s", c.memory_bytes >> 20,
                            std::chrono::duration<double>(config_.stall_kill_after).count()));
    }
  }
  const Pressure level = static_cast<Pressure>(memory_rule_.level());
  if (memory_rule_.level() != before) {
    spdlog::info("host: memory pressure {} → {} (PSI some avg10 {:.1f} %, tools {} MiB)", static_cast<int>(before),
                 static_cast<int>(level), memory_psi_, tools_memory_ >> 20);
  }
  pressure_ = level;

  for (auto& [id, s] : sessions_) {
    // Protection: memory.low for pinned sessions (v2 only; skipped elsewhere).
    const bool protect = s.pinned && config_.protect_low != 0;
    if (protect != s.protected_low) {
      cpu::Limits l;
      l.memory_low = protect ? config_.protect_low : 0;
      (void)cgroups_->apply(s.node, l);
      s.protected_low = protect;
    }
  }
  for (std::size_t i = 0; i < calls.size(); ++i) {
    Call& c = *where[i].second;
    const sched::MemoryVerdict& v = verdicts[i];
    if (c.ended) continue;
    if (v.throttle != c.throttled) {
      cpu::Limits l;
      if (v.throttle) {
        l.memory_high = v.hold_bytes;
      } else {
        l.memory_high = c.limits.memory_high.value_or(cpu::kUnlimited);
        l.memory_max = c.limits.memory_max.value_or(cpu::kUnlimited);
      }
      auto r = cgroups_->apply(c.node, l);
      if (r) {
        c.throttled = v.throttle;
        if (v.throttle) ++throttles_;
      } else {
        spdlog::debug("host: memory.high of {}: {}", c.node.rel, r.error().message());
      }
    }
    if (v.freeze != c.frozen) {
      auto r = cgroups_->freeze(c.node, v.freeze);
      if (r) {
        c.frozen = v.freeze;
        if (v.freeze) ++freezes_;
        spdlog::info("host: {} tool call {} of session {:016x}", v.freeze ? "froze" : "thawed", calls[i].call,
                     calls[i].session);
      }
    }
  }
}

void HostPlane::pool_tick(Time now, bool period) {
  recycle(period ? SIZE_MAX : kRecycleBatch, period);  // each period: every ended call, as before the pool
  if (config_.pool_max == 0) return;
  const double period_s = std::chrono::duration<double>(kHostPeriod).count();
  const double horizon_s = std::chrono::duration<double>(kPoolHorizon).count();
  std::uint32_t target_sum = 0;
  struct Want {
    sched::SessionId id;
    SessionCg* s;
    std::uint32_t target;
  };
  std::vector<Want> want;  // sessions under their target
  std::uint32_t budget = kPoolBatch;
  for (auto& [id, s] : sessions_) {
    if (s.calls_in_period > 0) s.last_call = now;
    if (period) {
      // EWMA with weight 1/2 per kHostPeriod: a burst lifts it at once, an idle second takes it to 1/16.
      s.rate = 0.5 * s.rate + 0.5 * static_cast<double>(s.calls_in_period) / period_s;
      s.calls_in_period = 0;
    }
    std::uint32_t target = 0;
    if (s.called && !s.orphan && now - s.last_call < config_.pool_idle) {
      const double ahead = std::ceil(s.rate * horizon_s) + 1.0;
      target = static_cast<std::uint32_t>(std::min<double>(ahead, config_.pool_per_session));
    }
    target_sum += target;
    // Shrink first: what it frees may fill another session.
    while (s.ready.size() > target && budget > 0) {
      cpu::Node n = std::move(s.ready.back());
      s.ready.pop_back();
      --pool_ready_;
      (void)drop_ready(std::move(n));
      --budget;
    }
    if (s.ready.size() < target) want.push_back({id, &s, target});
  }
  pool_target_ = target_sum;
  // Grow one at a time round the sessions, so that one busy session cannot
  // take a tick's whole batch or the whole pool while another has none.
  bool progress = true;
  while (progress && budget > 0 && pool_ready_ < config_.pool_max) {
    progress = false;
    for (auto& [id, s, target] : want) {
      if (s->ready.size() >= target || budget == 0 || pool_ready_ >= config_.pool_max) continue;
      --budget;
      auto made = cgroups_->create(pool_dir(id, ++pool_seq_));
      if (!made) {
        if (++pool_errors_ == 1) spdlog::warn("host: warm pool: {} (retried each tick)", made.error().message());
        return;  // the next tick tries again
      }
      auto applied = cgroups_->apply(*made, pool_limits_);
      if (!applied) {
        ++pool_errors_;
        spdlog::warn("host: warm pool: limits of {}: {}", made->rel, applied.error().message());
        (void)cgroups_->remove(*made);
        return;
      }
      ++pool_made_;
      ++pool_ready_;
      s->ready.push_back(std::move(*made));
      progress = true;
    }
  }
}

bool HostPlane::drop_ready(cpu::Node node) {
  ++pool_dropped_;
  if (cgroups_->remove_leaf(node)) return true;
  auto r = cgroups_->remove(node);
  if (r) return true;
  // Never held a process, so this is odd; the folder's removal retries it.
  spdlog::debug("host: removing pooled cgroup {}: {}", node.rel, r.error().message());
  return false;
}

void HostPlane::recycle(std::size_t budget, bool all) {
  if (ended_waiting_ == 0 && !all) return;
  std::size_t waiting = 0;
  for (auto& [id, s] : sessions_) {
    for (auto it = s.calls.begin(); it != s.calls.end();) {
      Call& c = it->second;
      if (!c.ended) {
        ++it;
        continue;
      }
      if (budget == 0) {
        ++waiting;
        ++it;
        continue;
      }
      --budget;
      if (auto u = cgroups_->usage(c.node)) {
        account_cpu(c, *u);
        account_memory(c, *u);
      }
      // One rmdir per hierarchy; a busy cgroup (leftovers) or one with child
      // cgroups fails it whole, and then takes the careful way. Leftovers (or
      // a failed removal): the host period's sweep looks again.
      if (!cgroups_->remove_leaf(c.node)) {
        auto procs = cgroups_->processes(c.node);
        if (!procs || !procs->empty() || !cgroups_->remove(c.node)) {
          ++it;
          continue;
        }
      }
      if (telemetry_) telemetry_->untrack(c.node.id);
      remember_peak(c);
      it = s.calls.erase(it);
    }
  }
  ended_waiting_ = waiting;
}

void HostPlane::account_memory(Call& c, const cpu::Usage& u) {
  c.peak_bytes = std::max({c.peak_bytes, u.memory_peak.value_or(0), u.memory_bytes.value_or(0)});
  if (u.oom_kills > c.oom_kills) {
    memory_kills_ += u.oom_kills - c.oom_kills;
    c.oom_kills = u.oom_kills;
  }
}

void HostPlane::remember_peak(const Call& c) {
  if (c.peak_bytes == 0) return;  // never read: no sample to learn from
  peaks_.push_back(c.peak_bytes);
  if (peaks_.size() > kRecentPeaks) peaks_.pop_front();
  std::vector<std::uint64_t> p(peaks_.begin(), peaks_.end());
  const std::size_t k = std::min(p.size() - 1, (p.size() * 95 + 99) / 100 - 1);
  std::nth_element(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(k), p.end());
  peak_p95_ = p[k];
}

std::optional<sched::HostMemoryView> HostPlane::host_memory() const {
  if (!sampled_) return std::nullopt;
  sched::HostMemoryView v;
  // What tandem can see and bound: the tools' memory against [memory]
  // tools_budget. Agents' own processes live outside tandem's cgroups, so
  // a session's baseline is not known here (0).
  v.capacity_bytes = config_.tools_budget;
  v.used_bytes = tools_memory_;
  v.psi_some_avg10 = memory_psi_;
  v.kills = memory_kills_;
  v.tool_peak_p95_bytes = peak_p95_;
  return v;
}

void HostPlane::account_cpu(Call& c, const cpu::Usage& u) {
  if (!u.cpu_ns || *u.cpu_ns <= c.cpu_ns) return;
  tools_cpu_ns_ += *u.cpu_ns - c.cpu_ns;
  c.cpu_ns = *u.cpu_ns;
}

}  // namespace tandem::daemon
