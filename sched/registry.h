// The policy registry: one explicit table (no self-registration) mapping a
// name to both halves of a policy and the parameters it takes.
//
// Every parameter is declared with its default, its range and a line of
// documentation, so the daemon's config validation, `tandemctl policy` and
// the tandemd.toml(5) man page all come from this one table.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "sched/policy.h"

namespace tandem::sched {

struct ParamSpec {
  std::string_view name;
  double default_value;
  double min;
  double max;
  std::string_view doc;
};

// A policy's parameters after validation: every key declared, every value in
// range, defaults filled in. Thread-safety: a value type.
class PolicyParams {
 public:
  PolicyParams() = default;
  // Errors name the unknown key or the value out of range (EINVAL).
  static base::Result<PolicyParams> create(std::string_view policy, std::span<const ParamSpec> specs,
                                           const std::map<std::string, double>& values);
  // REQUIRES: `name` is a declared parameter.
  double get(std::string_view name) const;
  bool flag(std::string_view name) const { return get(name) != 0.0; }
  const std::map<std::string, double, std::less<>>& values() const { return values_; }

 private:
  std::map<std::string, double, std::less<>> values_;
};

struct PolicyEntry {
  std::string_view name;
  std::string_view summary;  // what it is and where it comes from
  std::span<const ParamSpec> params;
  std::unique_ptr<ControlPolicy> (*make_control)(const PolicyParams&);
  std::unique_ptr<StepScheduler> (*make_step)(const PolicyParams&);
};

std::span<const PolicyEntry> policy_registry();
const PolicyEntry* find_policy(std::string_view name);

struct PolicyInstance {
  std::unique_ptr<ControlPolicy> control;
  std::unique_ptr<StepScheduler> step;
  PolicyParams params;
};

// Both halves of `name` with `values` validated against its parameters.
// Errors: ENOENT for an unknown policy (the message lists the known ones),
// EINVAL for a bad parameter.
base::Result<PolicyInstance> make_policy(std::string_view name, const std::map<std::string, double>& values = {});

}  // namespace tandem::sched
