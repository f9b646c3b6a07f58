// The policy table and parameter validation.
#include "sched/registry.h"

#include <cassert>

#include <fmt/format.h>

#include "sched/fcfs.h"

namespace tandem::sched {
namespace {

std::unique_ptr<ControlPolicy> fcfs_control(const PolicyParams&) { return std::make_unique<AdmitAllControl>("fcfs"); }
std::unique_ptr<StepScheduler> fcfs_step(const PolicyParams&) { return std::make_unique<VllmV1StepScheduler>(); }

const PolicyEntry kRegistry[] = {
    {"fcfs",
     "no coordination: admit everything; vLLM V1 steps (FCFS, chunked prefill, preempt newest by recompute)",
     {},
     fcfs_control,
     fcfs_step},
};

}  // namespace

base::Result<PolicyParams> PolicyParams::create(std::string_view policy, std::span<const ParamSpec> specs,
                                                const std::map<std::string, double>& values) {
  PolicyParams p;
  for (const ParamSpec& spec : specs) p.values_.emplace(std::string(spec.name), spec.default_value);
  for (const auto& [key, value] : values) {
    auto it = p.values_.find(key);
    if (it == p.values_.end()) {
      std::string known;
      for (const ParamSpec& spec : specs) known += fmt::format("{}{}", known.empty() ? "" : ", ", spec.name);
      return base::make_error(EINVAL, fmt::format("policy {}: unknown parameter '{}' (it takes: {})", policy, key,
                                                  known.empty() ? "none" : known));
    }
    for (const ParamSpec& spec : specs) {
      if (spec.name == key && !(value >= spec.min && value <= spec.max)) {
        return base::make_error(
            EINVAL, fmt::format("policy {}: {} = {} is outside [{}, {}]", policy, key, value, spec.min, spec.max));
      }
    }
    it->second = value;
  }
  return p;
}

double PolicyParams::get(std::string_view name) const {
  auto it = values_.find(name);
  assert(it != values_.end() && "undeclared policy parameter");
  return it == values_.end() ? 0.0 : it->second;
}

std::span<const PolicyEntry> policy_registry() { return kRegistry; }

const PolicyEntry* find_policy(std::string_view name) {
  for (const PolicyEntry& e : kRegistry) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

base::Result<PolicyInstance> make_policy(std::string_view name, const std::map<std::string, double>& values) {
  const PolicyEntry* entry = find_policy(name);
  if (entry == nullptr) {
    std::string known;
    for (const PolicyEntry& e : kRegistry) known += fmt::format("{}{}", known.empty() ? "" : ", ", e.name);
    return base::make_error(ENOENT, fmt::format("unknown policy '{}' (known: {})", name, known));
  }
  auto params = PolicyParams::create(name, entry->params, values);
  if (!params) return base::propagate(std::move(params.error()));
  PolicyInstance inst;
  inst.control = entry->make_control(*params);
  inst.step = entry->make_step(*params);
  inst.params = std::move(*params);
  return inst;
}

}  // namespace tandem::sched
