// The policy table and parameter validation.
#include "sched/registry.h"

#include <array>
#include <cassert>

#include <fmt/format.h>

#include "sched/autellix.h"
#include "sched/continuum.h"
#include "sched/fcfs.h"
#include "sched/infercept.h"
#include "sched/mars_control.h"
#include "sched/mars_step.h"
#include "sched/tandem.h"
#include "sched/thunderagent.h"

namespace tandem::sched {
namespace {

std::unique_ptr<ControlPolicy> fcfs_control(const PolicyParams&) { return std::make_unique<AdmitAllControl>("fcfs"); }
std::unique_ptr<ControlPolicy> autellix_control(const PolicyParams&) {
  return std::make_unique<AdmitAllControl>("autellix");
}
std::unique_ptr<ControlPolicy> infercept_control(const PolicyParams&) {
  return std::make_unique<AdmitAllControl>("infercept");
}
std::unique_ptr<ControlPolicy> continuum_control(const PolicyParams&) {
  return std::make_unique<AdmitAllControl>("continuum");
}
std::unique_ptr<StepScheduler> fcfs_step(const PolicyParams&) { return std::make_unique<VllmV1StepScheduler>(); }

// One policy whose halves take separate parameter tables declares both.
template <std::size_t N, std::size_t M>
constexpr std::array<ParamSpec, N + M> concat(const ParamSpec (&a)[N], const ParamSpec (&b)[M]) {
  std::array<ParamSpec, N + M> out{};
  for (std::size_t i = 0; i < N; ++i) out[i] = a[i];
  for (std::size_t i = 0; i < M; ++i) out[N + i] = b[i];
  return out;
}

template <std::size_t N, std::size_t M>
constexpr std::array<ParamSpec, N + M> concat(const std::array<ParamSpec, N>& a, const ParamSpec (&b)[M]) {
  std::array<ParamSpec, N + M> out{};
  for (std::size_t i = 0; i < N; ++i) out[i] = a[i];
  for (std::size_t i = 0; i < M; ++i) out[N + i] = b[i];
  return out;
}

constexpr auto kMarsParams = concat(kMarsControlParams, kMarsStepParams);
constexpr auto kTandemAllParams = concat(kMarsParams, kTandemParams);

const PolicyEntry kRegistry[] = {
    {"fcfs",
     "no coordination: admit everything; vLLM V1 steps (FCFS, chunked prefill, preempt newest by recompute)",
     {},
     fcfs_control,
     fcfs_step},
    {"autellix",
     "Autellix PLAS: program-level attained-service MLFQ (4 queues, quanta 2048..256) with anti-starvation "
     "(beta 2.0), constants as the MARS repo configures it; admit everything",
     kAutellixParams, autellix_control, make_autellix_step},
    {"infercept",
     "InferCept: FCFS vLLM steps; at each tool call keep, discard or swap the KV by minimum memory waste; admit "
     "everything",
     kInferceptParams, infercept_control, make_infercept_step},
    {"continuum",
     "Continuum: pinned-program-first FCFS; at each tool call pin the KV for 2 s if the tool's mean time is at most "
     "2 s (continuum_dy = 1: the dynamic TTL); admit everything",
     kContinuumParams, continuum_control, make_continuum_step},
    {"thunderagent",
     "ThunderAgent (paper variant): program-level pause/restore with a periodic capacity check, acting programs "
     "paused smallest first, best-fit restore across engines; vLLM V1 steps",
     kThunderAgentParams, make_thunderagent_control, fcfs_step},
    {"mars",
     "MARS as coded: dual-pressure AIMD admission and PackQueue; MLFQ steps with priority-aligned eviction and "
     "chunk halving",
     kMarsParams, make_mars_control, make_mars_step},
    {"tandem",
     "ours: everything in mars plus expected-value KV residency, eviction by cost per freed block, critical-path "
     "CPU weights, one queue across engines and a growth-aware capacity check (each switchable for ablation)",
     kTandemAllParams, make_tandem_control, make_tandem_step},
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
