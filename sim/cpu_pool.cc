// Weighted processor sharing of the tool cores.
#include "sim/cpu_pool.h"

#include <algorithm>
#include <cmath>

namespace tandem::sim {
namespace {

constexpr double kMinDemand = 0.001;
constexpr double kEpsilon = 1e-9;

}  // namespace

void CpuPool::start(std::uint64_t tool, std::uint64_t group, double demand_cores, double nominal_s, Time now,
                    double start_cpu_s) {
  advance(now);
  tools_[tool] = Tool{.group = group,
                      .demand = std::max(kMinDemand, demand_cores),
                      .remaining_s = std::max(0.0, nominal_s),
                      .start_left = start_cpu_s > 0 ? start_cpu_s : 0,
                      .nominal_s = std::max(0.0, nominal_s)};
  reshare(now);
}

bool CpuPool::stop(std::uint64_t tool, Time now) {
  advance(now);
  const bool found = tools_.erase(tool) != 0;
  reshare(now);
  return found;
}

void CpuPool::set_weight(std::uint64_t group, double weight, Time now) {
  advance(now);
  groups_[group].weight = std::max(1.0, weight);
  reshare(now);
}

void CpuPool::set_quota(std::uint64_t group, double cores, Time now) {
  advance(now);
  groups_[group].quota = std::max(0.0, cores);
  reshare(now);
}

void CpuPool::forget_group(std::uint64_t group) { groups_.erase(group); }

void CpuPool::set_speed(std::uint64_t tool, double speed, Time now) {
  auto it = tools_.find(tool);
  if (it == tools_.end() || it->second.speed == speed) return;
  advance(now);
  it->second.speed = std::clamp(speed, 0.0, 1.0);
  reshare(now);
}

double CpuPool::progress(std::uint64_t tool, Time now) {
  auto it = tools_.find(tool);
  if (it == tools_.end()) return 0;
  advance(now);
  return it->second.nominal_s - it->second.remaining_s;
}

void CpuPool::advance(Time now) {
  if (now <= last_) return;
  const double dt = std::chrono::duration<double>(now - last_).count();
  for (auto& [id, t] : tools_) {
    // A start phase that ends inside dt leaves the rest of dt at the same
    // rate (the rate was shared for the start phase's demand; the next
    // reshare, at the completion this phase's end schedules, corrects it).
    double cpu = dt * t.rate;
    core_seconds_ += cpu;
    if (t.start_left > 0) {
      t.start_wall_s += t.rate > 0 ? std::min(dt, t.start_left / t.rate) : dt;
      const double used = std::min(cpu, t.start_left);
      t.start_left -= used;
      cpu -= used;
      if (t.start_left <= kEpsilon) t.start_left = 0;
    }
    t.remaining_s = std::max(0.0, t.remaining_s - cpu / t.demand);
  }
  const double decay = std::exp(-dt / 10.0);
  psi_ = psi_ * decay + (contended_ ? 100.0 : 0.0) * (1.0 - decay);
  last_ = now;
}

void CpuPool::reshare(Time now) {
  // Water-filling: tools sorted by cap / weight; each gets min(cap, λ·weight).
  struct Entry {
    std::uint64_t id;
    Tool* tool;
    double cap;
    double weight;
  };
  std::vector<Entry> entries;
  entries.reserve(tools_.size());
  double total_cap = 0;
  for (auto& [id, t] : tools_) {
    auto g = groups_.find(t.group);
    const double weight = g != groups_.end() ? g->second.weight : 100.0;
    const double quota = g != groups_.end() ? g->second.quota : 0.0;
    const double want = (t.start_left > 0 ? 1.0 : t.demand) * t.speed;
    const double cap = quota > 0 ? std::min(want, quota) : want;
    entries.push_back({id, &t, cap, weight});
    total_cap += cap;
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    const double ka = a.cap / a.weight;
    const double kb = b.cap / b.weight;
    if (ka != kb) return ka < kb;
    return a.id < b.id;
  });
  double left = cores_;
  double weights = 0;
  for (const Entry& e : entries) weights += e.weight;
  for (const Entry& e : entries) {
    const double fair = weights > 0 ? left * e.weight / weights : 0;
    const double r = std::min(e.cap, fair);
    e.tool->rate = r;
    left = std::max(0.0, left - r);
    weights -= e.weight;
  }
  contended_ = total_cap > cores_ + kEpsilon;
  // The next completion, or the next end of a start phase (a reshare point).
  next_.reset();
  for (auto& [id, t] : tools_) {
    if (t.rate <= 0) continue;
    const double s = t.start_left > 0 ? t.start_left / t.rate : t.remaining_s * t.demand / t.rate;
    const Time at = now + std::chrono::duration_cast<base::Duration>(std::chrono::duration<double>(s)) +
                    base::Duration(1);  // round up: never complete before the work is done
    if (!next_ || at < *next_) next_ = at;
  }
}

std::vector<std::uint64_t> CpuPool::complete(Time now, std::vector<double>* start_walls) {
  advance(now);
  std::vector<std::uint64_t> done;
  for (auto& [id, t] : tools_) {
    if (t.start_left <= 0 && t.remaining_s <= 1e-9) done.push_back(id);
  }
  std::sort(done.begin(), done.end());
  if (start_walls != nullptr) start_walls->clear();
  for (std::uint64_t id : done) {
    if (start_walls != nullptr) start_walls->push_back(tools_.at(id).start_wall_s);
    tools_.erase(id);
  }
  reshare(now);
  return done;
}

}  // namespace tandem::sim
