// Nova's SM partitioning: profile validation, Pareto front, knee, SM_dec and
// the partition chooser (see sm_partition.h for the definitions and why).
#include "sched/sm_partition.h"

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cmath>

#include <fmt/format.h>

namespace tandem::sched {

base::Result<StageProfile> StageProfile::create(std::string_view stage, std::vector<ProfileRow> rows) {
  if (rows.empty()) return base::make_error(EINVAL, fmt::format("profile '{}': no rows", stage));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const ProfileRow& r = rows[i];
    auto bad = [&](std::string_view what) {
      return base::make_error(EINVAL, fmt::format("profile '{}' row {}: {}", stage, i, what));
    };
    if (r.sm_count == 0) return bad("sm_count 0");
    if (i > 0 && r.sm_count <= rows[i - 1].sm_count) {
      return bad(fmt::format("sm_count {} not above row {}'s {}", r.sm_count, i - 1, rows[i - 1].sm_count));
    }
    // The negated comparisons also reject NaN.
    if (!(r.latency_s > 0.0) || !std::isfinite(r.latency_s)) {
      return bad(fmt::format("latency_s {} not finite and > 0", r.latency_s));
    }
    if (!(r.throughput >= 0.0) || !std::isfinite(r.throughput)) {
      return bad(fmt::format("throughput {} not finite and >= 0", r.throughput));
    }
  }
  return StageProfile(std::string(stage), std::move(rows));
}

namespace {

bool dominates(const ProfileRow& a, const ProfileRow& b) {
  const double ea = a.per_sm();
  const double eb = b.per_sm();
  return a.latency_s <= b.latency_s && ea >= eb && (a.latency_s < b.latency_s || ea > eb);
}

}  // namespace

std::vector<ProfileRow> pareto_front(const StageProfile& profile) {
  // Profiles have a handful of rows (one per partition size), so the
  // quadratic scan is the clearest correct choice.
  std::vector<ProfileRow> front;
  for (const ProfileRow& r : profile.rows()) {
    const bool dominated =
        std::ranges::any_of(profile.rows(), [&](const ProfileRow& other) { return dominates(other, r); });
    if (!dominated) front.push_back(r);
  }
  return front;  // rows() is sorted by sm_count, so the front is too
}

std::uint32_t sm_op(std::span<const ProfileRow> front) {
  assert(!front.empty());
  auto score = [](const ProfileRow& r) { return r.per_sm() / r.latency_s; };
  const ProfileRow* best = &front.front();
  for (const ProfileRow& r : front.subspan(1)) {
    // Ties to the lower latency: Nova's first target is latency.
    if (score(r) > score(*best) || (score(r) == score(*best) && r.latency_s < best->latency_s)) best = &r;
  }
  return best->sm_count;
}

base::Result<void> validate(const SmDecParams& p) {
  if (p.total == 0) return base::make_error(EINVAL, "sm partition: total 0");
  if (p.granularity == 0) return base::make_error(EINVAL, "sm partition: granularity 0");
  if (p.sm_min == 0 || p.sm_min > p.total) {
    return base::make_error(EINVAL, fmt::format("sm partition: sm_min {} not in [1, total {}]", p.sm_min, p.total));
  }
  if (!(p.alpha >= 0.0) || !std::isfinite(p.alpha)) {
    return base::make_error(EINVAL, fmt::format("sm partition: alpha {} not finite and >= 0", p.alpha));
  }
  return {};
}

std::uint32_t sm_dec(std::uint32_t sm_op, std::uint32_t n_pend, const SmDecParams& p) {
  assert(validate(p).has_value());
  const std::uint64_t g = p.granularity;
  auto round_up = [g](std::uint64_t v) { return (v + g - 1) / g * g; };
  const auto lo = static_cast<std::uint32_t>(std::min<std::uint64_t>(round_up(p.sm_min), p.total));

  // In double: α·(N_pend − 1) may exceed any integer SM count.
  const double pending = static_cast<double>(std::max<std::uint32_t>(n_pend, 1) - 1);
  const double raw = static_cast<double>(sm_op) - p.alpha * pending;
  if (raw <= static_cast<double>(lo)) return lo;
  if (raw >= static_cast<double>(p.total)) return p.total;
  const auto up = round_up(static_cast<std::uint64_t>(std::ceil(raw)));
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(up, p.total));
}

base::Result<PartitionChooser> PartitionChooser::create(std::vector<std::uint32_t> decode_sms,
                                                        std::uint32_t grow_hold) {
  if (decode_sms.empty()) return base::make_error(EINVAL, "partition pool: no partitions");
  if (grow_hold == 0) return base::make_error(EINVAL, "partition pool: grow_hold 0");
  for (std::size_t i = 0; i < decode_sms.size(); ++i) {
    if (decode_sms[i] == 0) return base::make_error(EINVAL, fmt::format("partition pool: index {}: 0 decode SMs", i));
    if (i > 0 && decode_sms[i] <= decode_sms[i - 1]) {
      return base::make_error(EINVAL, fmt::format("partition pool: index {}: {} decode SMs not above index {}'s {}", i,
                                                  decode_sms[i], i - 1, decode_sms[i - 1]));
    }
  }
  return PartitionChooser(std::move(decode_sms), grow_hold);
}

std::size_t PartitionChooser::target(std::uint32_t sm_dec) const {
  const auto it = std::ranges::lower_bound(decode_sms_, sm_dec);
  if (it == decode_sms_.end()) return decode_sms_.size() - 1;
  return static_cast<std::size_t>(it - decode_sms_.begin());
}

std::size_t PartitionChooser::choose(std::uint32_t sm_dec) {
  const std::size_t want = target(sm_dec);
  if (!has_current_ || want <= current_) {
    // First decision, a shrink (prefill needs the SMs now) or a hold: apply,
    // and any grow streak is broken.
    has_current_ = true;
    current_ = want;
    grow_streak_ = 0;
    return current_;
  }
  if (grow_streak_ == 0 || want < grow_min_target_) grow_min_target_ = want;
  if (++grow_streak_ >= grow_hold_) {
    current_ = grow_min_target_;
    grow_streak_ = 0;
  }
  return current_;
}

}  // namespace tandem::sched
