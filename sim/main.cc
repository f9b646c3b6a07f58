// tandem-sim: every policy on the same agentic workloads (docs/sim.md).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/parse.h"
#include "sched/registry.h"
#include "sim/calibrate.h"
#include "sim/cluster.h"
#include "sim/node.h"
#include "sim/report.h"
#include "sim/verdict.h"
#include "sim/workload.h"

namespace tandem::sim {
namespace {

constexpr std::string_view kUsage = R"(usage: tandem-sim (--trace FILE | --synthetic NAME) --preset NAME [options]

workload
  --trace FILE          replay sessions from a traces/ JSONL file
  --synthetic NAME      a synthetic workload (--list shows them)
  --sessions N          sessions per run (default: every trace session once; 200 synthetic)
  --rate R              offered load, sessions per second
  --sweep R1,R2,...     several load points
  --fixed-rate          evenly spaced arrivals (default: Poisson)
  --seed S              seed for drawing sessions and arrivals (default 1)
  --seeds N             run every point with seeds S, S+1, ..., S+N-1 and report means with
                        95 % intervals (default 1)
  --source LIST         keep the trace sessions whose "source" starts with one of these prefixes
  --exclude-source LIST drop the trace sessions whose "source" starts with one of these prefixes
node
  --preset NAME         see --list
  --preset-file FILE    a preset from a JSON file instead (--calibrate writes them)
  --engines N           data-parallel engines on the node (default 2)
  --tool-cores N        host cores for tool processes (default 16)
  --token-budget N      tokens per engine step (default: the preset's, 8192)
  --max-seqs N          sequences per engine step (default: the preset's, 1024)
  --tool-cpu SPEC       CPU demand per tool kind, "pytest=1,Read=0.05,*=0.5"
  --tool-start-ms MS    each tool call's first MS ms run at one whole core (its exec and start;
                        docs/sim.md "Tools"; default 0: none)
  --tool-start-extra    the start phase runs on top of each call's time, not inside it (the live
                        replay's stand-in tool, whose wall time excludes its own start)
  --host-kv-gib G       host memory for KV copies per engine, GiB (default 128; 0 = unlimited)
host memory (docs/sim.md "Host memory"; off unless --tool-mem is given or the workload is agentic-mem)
  --tool-mem SPEC       model tool and session memory: "on" for the defaults, or per-kind P95 peaks
                        in MB, "pytest=518,Read=15:1.2,*=233" (kind=P95[:sigma])
  --host-mem-gib G      host memory for agents and tools per engine, GiB (default: the preset's, 128)
  --session-mem-mib M   resident baseline of an admitted session, MiB (default: the preset's, 185)
  --retry-delay S       a tool killed for memory runs again S seconds later (default 5)
  --tool-mem-scale X    multiplies every tool call's memory peak (default 1)
  --tool-mem-cap-mib M  no tool call's memory peak above M MiB, after the scales (default 4096, the largest
                        peak AgentCgroup measured; 0: no cap)
  --host-rules WHO      which policies get tandemd's host memory rules: none (default), tandem, all
  --tools-budget-mib M  the host rules' budget for the tools, MiB, as tandemd's [memory] tools_budget
                        (default: the host's memory less the sessions' baselines)
  --memory-cgroup V     the host's memory controller: v2 (default: the rules' throttle slows a tool in
                        reclaim) or v1 (it stops a tool that outgrows it until the limit lifts or the
                        stall kill takes it; PSI does not count the wait)
  --host-period S       the host plane samples every S seconds: the host rules decide and the policy's
                        view of host memory is refreshed (tandemd: 0.25; default 0: every control tick)
  --psi-window S        the window of memory PSI's avg10, seconds (default 10, the kernel's)
  --stall-kill-after S  the host rules kill a call stalled at its memory limit this long (default 10)
  --tick S              control tick period in seconds (default 0.05)
cluster (docs/sim.md "Multi-node")
  --nodes N[,N...]      nodes behind a router, each with its own engines, tool cores and policy
                        instance (default 1: a node alone); --rate and --sessions are per node
  --router LIST|all     round-robin, least-queue, epp, epp+tandem (needed with more than one node)
policies
  --policies LIST|all   policies to compare (default all)
  --param POLICY.KEY=V  set a policy parameter (repeatable)
  --ablate              also run tandem with each of its additions switched off
output
  --json FILE  --csv FILE  --plot FILE.png
  --jobs N              simulations run in parallel (default: the number of cores)
  --list                list presets, synthetic workloads and policies, then exit
  --quiet               no progress lines on stderr
calibration (docs/sim.md "Calibrating from a real engine")
  --calibrate STEPLOG   fit the step-time model to a real engine's steps (tandem-llama
                        --step-log) and print the fit with its error on held-back steps;
                        the pool and limits come from --preset/--preset-file
  --holdout F           share of steps held back (default 0.2)
  --preset-out FILE     write the calibrated preset as JSON
  --check STEPLOG       also report the fitted model's error on another run's steps
)";

// tandem's switches (sched/tandem.h), one ablation run each.
constexpr std::string_view kAdditions[] = {
    "residency",       "cost_eviction", "cpu_weights",   "global_queue",   "growth_check",      "knee_quanta",
    "kv_admission",    "engine_window", "pin_admission", "long_admission", "prompt_projection", "queue_admission",
    "pending_restore", "host_prices",   "pooled_prior",  "swap_preempt",   "fill_idle_budget",  "host_admission",
    "cpu_slots",       "cpu_las",       "headroom_keep"};

struct Options {
  std::string trace;
  std::string synthetic;
  std::string preset;
  std::string preset_file;
  std::string calibrate;
  std::string preset_out;
  std::string check;
  double holdout = 0.2;
  std::optional<std::size_t> sessions;
  std::vector<double> rates;
  bool poisson = true;
  std::uint64_t seed = 1;
  std::uint64_t seeds = 1;
  std::vector<std::string> sources;
  std::vector<std::string> exclude_sources;
  std::uint32_t engines = 2;
  double tool_cores = 16;
  double tool_start_ms = 0;
  bool tool_start_extra = false;
  double stall_kill_after_s = 10;
  double host_kv_gib = 128;
  std::optional<std::uint32_t> token_budget;
  std::optional<std::uint32_t> max_seqs;
  std::string tool_cpu;
  std::string tool_mem;
  std::string host_rules = "none";
  std::string memory_cgroup = "v2";
  double tools_budget_mib = 0;
  std::optional<double> host_mem_gib;
  std::optional<double> session_mem_mib;
  double retry_delay_s = 5;
  double host_period_s = 0;
  double psi_window_s = 10;
  double tool_mem_scale = 1;
  std::optional<double> tool_mem_cap_mib;  // unset: sim::kToolMemCapMib
  double tick_s = 0.05;
  std::vector<std::string> policies;
  std::map<std::string, std::map<std::string, double>> params;
  bool ablate = false;
  std::string json, csv, plot;
  unsigned jobs = 0;
  bool list = false;
  bool quiet = false;
  std::vector<std::uint32_t> nodes;  // empty: a node alone
  std::vector<Router> routers;
};

int usage_error(const std::string& what) {
  std::cerr << "tandem-sim: " << what << " (see --help)\n";
  return 2;
}

template <typename T>
std::optional<T> parse_number(std::string_view s) {
  if constexpr (std::is_floating_point_v<T>) {
    auto v = base::parse_double(s);
    if (!v || !std::isfinite(*v)) return std::nullopt;
    return static_cast<T>(*v);
  } else {
    auto v = base::parse_int<std::int64_t>(s);
    if (!v || *v < 0) return std::nullopt;
    return static_cast<T>(*v);
  }
}

// Parses argv into `o`; returns an exit code to stop with, or nullopt.
std::optional<int> parse_args(int argc, char** argv, Options& o) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    auto value = [&]() -> std::optional<std::string_view> {
      if (i + 1 >= args.size()) return std::nullopt;
      return args[++i];
    };
    auto need = [&](std::string_view flag) -> std::optional<std::string_view> {
      auto v = value();
      if (!v) usage_error(std::string(flag) + " needs a value");
      return v;
    };
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (a == "--list") {
      o.list = true;
    } else if (a == "--quiet") {
      o.quiet = true;
    } else if (a == "--ablate") {
      o.ablate = true;
    } else if (a == "--fixed-rate") {
      o.poisson = false;
    } else if (a == "--tool-start-extra") {
      o.tool_start_extra = true;
    } else if (a == "--trace" || a == "--synthetic" || a == "--preset" || a == "--tool-cpu" || a == "--json" ||
               a == "--csv" || a == "--plot" || a == "--preset-file" || a == "--calibrate" || a == "--preset-out" ||
               a == "--check" || a == "--tool-mem" || a == "--host-rules" || a == "--memory-cgroup") {
      auto v = need(a);
      if (!v) return 2;
      std::string& dst = a == "--trace"           ? o.trace
                         : a == "--synthetic"     ? o.synthetic
                         : a == "--preset"        ? o.preset
                         : a == "--preset-file"   ? o.preset_file
                         : a == "--calibrate"     ? o.calibrate
                         : a == "--preset-out"    ? o.preset_out
                         : a == "--check"         ? o.check
                         : a == "--tool-cpu"      ? o.tool_cpu
                         : a == "--tool-mem"      ? o.tool_mem
                         : a == "--host-rules"    ? o.host_rules
                         : a == "--memory-cgroup" ? o.memory_cgroup
                         : a == "--json"          ? o.json
                         : a == "--csv"           ? o.csv
                                                  : o.plot;
      dst = std::string(*v);
      if (dst.empty()) return usage_error(std::string(a) + " needs a non-empty value");
    } else if (a == "--holdout") {
      auto v = need(a);
      if (!v) return 2;
      auto d = parse_number<double>(*v);
      if (!d || *d < 0 || *d >= 0.9) return usage_error("--holdout: '" + std::string(*v) + "' is not in [0, 0.9)");
      o.holdout = *d;
    } else if (a == "--rate" || a == "--sweep") {
      auto v = need(a);
      if (!v) return 2;
      o.rates.clear();
      for (std::string_view part : base::split(*v, ',')) {
        auto r = parse_number<double>(base::trim(part));
        if (!r || *r <= 0) return usage_error(std::string(a) + ": '" + std::string(part) + "' is not a positive rate");
        o.rates.push_back(*r);
      }
      if (o.rates.empty()) return usage_error(std::string(a) + " needs at least one rate");
    } else if (a == "--source" || a == "--exclude-source") {
      auto v = need(a);
      if (!v) return 2;
      auto& dst = a == "--source" ? o.sources : o.exclude_sources;
      for (std::string_view p : base::split(*v, ',')) {
        if (!base::trim(p).empty()) dst.emplace_back(base::trim(p));
      }
      if (dst.empty()) return usage_error(std::string(a) + " needs at least one source prefix");
    } else if (a == "--sessions" || a == "--engines" || a == "--token-budget" || a == "--max-seqs" || a == "--seed" ||
               a == "--seeds" || a == "--jobs") {
      auto v = need(a);
      if (!v) return 2;
      auto n = parse_number<std::uint64_t>(*v);
      if (!n || (*n == 0 && a != "--seed")) {
        return usage_error(std::string(a) + ": '" + std::string(*v) + "' is not a positive integer");
      }
      if (a == "--sessions") o.sessions = n;
      if (a == "--engines") {
        if (*n > 64) return usage_error("--engines: at most 64");
        o.engines = static_cast<std::uint32_t>(*n);
      }
      if (a == "--token-budget") o.token_budget = static_cast<std::uint32_t>(std::min<std::uint64_t>(*n, 1 << 20));
      if (a == "--max-seqs") o.max_seqs = static_cast<std::uint32_t>(std::min<std::uint64_t>(*n, 1 << 16));
      if (a == "--seed") o.seed = *n;
      if (a == "--seeds") {
        if (*n > 1000) return usage_error("--seeds: at most 1000");
        o.seeds = *n;
      }
      if (a == "--jobs") o.jobs = static_cast<unsigned>(std::min<std::uint64_t>(*n, 256));
    } else if (a == "--tool-cores" || a == "--tick") {
      auto v = need(a);
      if (!v) return 2;
      auto d = parse_number<double>(*v);
      if (!d || *d <= 0) return usage_error(std::string(a) + ": '" + std::string(*v) + "' is not a positive number");
      (a == "--tick" ? o.tick_s : o.tool_cores) = *d;
    } else if (a == "--host-mem-gib" || a == "--session-mem-mib" || a == "--retry-delay" || a == "--tool-mem-scale" ||
               a == "--tool-mem-cap-mib" || a == "--tools-budget-mib" || a == "--host-period" || a == "--psi-window" ||
               a == "--stall-kill-after") {
      auto v = need(a);
      if (!v) return 2;
      auto d = parse_number<double>(*v);
      const bool positive =
          a == "--host-mem-gib" || a == "--tools-budget-mib" || a == "--psi-window" || a == "--stall-kill-after";
      if (!d || *d < 0 || (positive && *d == 0)) {
        return usage_error(std::string(a) + ": '" + std::string(*v) + "' is not a number " +
                           (positive ? "> 0" : ">= 0"));
      }
      if (a == "--host-mem-gib") o.host_mem_gib = d;
      if (a == "--session-mem-mib") o.session_mem_mib = d;
      if (a == "--retry-delay") o.retry_delay_s = *d;
      if (a == "--tools-budget-mib") o.tools_budget_mib = *d;
      if (a == "--host-period") o.host_period_s = *d;
      if (a == "--psi-window") o.psi_window_s = *d;
      if (a == "--stall-kill-after") o.stall_kill_after_s = *d;
      if (a == "--tool-mem-scale") o.tool_mem_scale = *d;
      if (a == "--tool-mem-cap-mib") o.tool_mem_cap_mib = d;
    } else if (a == "--tool-start-ms") {
      auto v = need(a);
      if (!v) return 2;
      auto d = parse_number<double>(*v);
      if (!d || *d < 0 || *d > 60000) {
        return usage_error("--tool-start-ms: '" + std::string(*v) + "' is not a number of ms in [0, 60000]");
      }
      o.tool_start_ms = *d;
    } else if (a == "--host-kv-gib") {
      auto v = need(a);
      if (!v) return 2;
      auto d = parse_number<double>(*v);
      if (!d || *d < 0) return usage_error("--host-kv-gib: '" + std::string(*v) + "' is not a number >= 0");
      o.host_kv_gib = *d;
    } else if (a == "--nodes") {
      auto v = need(a);
      if (!v) return 2;
      o.nodes.clear();
      for (std::string_view part : base::split(*v, ',')) {
        const std::string p(base::trim(part));
        auto n = parse_number<std::uint64_t>(p);
        if (!n) return usage_error("--nodes: '" + p + "' is not a number of nodes");
        if (*n == 0) return usage_error("--nodes: 0 nodes; a cluster needs at least 1");
        if (*n > kMaxNodes) {
          return usage_error("--nodes: " + p + " nodes; a cluster has at most " + std::to_string(kMaxNodes));
        }
        o.nodes.push_back(static_cast<std::uint32_t>(*n));
      }
      if (o.nodes.empty()) return usage_error("--nodes needs at least one node count");
    } else if (a == "--router") {
      auto v = need(a);
      if (!v) return 2;
      o.routers.clear();
      for (std::string_view part : base::split(*v, ',')) {
        const std::string_view name = base::trim(part);
        if (name == "all") {
          for (std::string_view r : router_names()) o.routers.push_back(*parse_router(r));
          continue;
        }
        auto r = parse_router(name);
        if (!r) return usage_error("--router: " + r.error().context());
        o.routers.push_back(*r);
      }
      if (o.routers.empty()) return usage_error("--router needs a router");
    } else if (a == "--policies") {
      auto v = need(a);
      if (!v) return 2;
      o.policies.clear();
      for (std::string_view p : base::split(*v, ',')) o.policies.emplace_back(base::trim(p));
    } else if (a == "--param") {
      auto v = need(a);
      if (!v) return 2;
      const auto dot = v->find('.');
      const auto eq = v->find('=');
      if (dot == std::string_view::npos || eq == std::string_view::npos || dot > eq) {
        return usage_error("--param wants POLICY.KEY=VALUE, got '" + std::string(*v) + "'");
      }
      auto d = parse_number<double>(v->substr(eq + 1));
      if (!d) return usage_error("--param " + std::string(*v) + ": the value is not a number");
      o.params[std::string(v->substr(0, dot))][std::string(v->substr(dot + 1, eq - dot - 1))] = *d;
    } else {
      return usage_error("unknown argument '" + std::string(a) + "'");
    }
  }
  return std::nullopt;
}

void list_everything() {
  std::cout << "presets:\n";
  for (const Preset& p : presets()) std::cout << "  " << p.name << "  " << p.doc << "\n";
  std::cout << "synthetic workloads:\n";
  for (const SyntheticSpec& s : synthetic_workloads()) std::cout << "  " << s.name << "  " << s.doc << "\n";
  std::cout << "policies:\n";
  for (const sched::PolicyEntry& e : sched::policy_registry()) std::cout << "  " << e.name << "  " << e.summary << "\n";
}

struct Job {
  std::size_t rate_index;
  std::size_t seed_index = 0;
  std::string policy;
  std::string variant;
  std::map<std::string, double> params;
  std::size_t nodes_index = 0;  // a cluster's: into Options::nodes
  Router router = Router::kRoundRobin;
  bool cluster = false;
};

// The preset of --preset or --preset-file (for --calibrate, one whose step
// model is still to be fitted).
base::Result<Preset> chosen_preset(const Options& o) {
  if (o.preset.empty() == o.preset_file.empty()) {
    return base::make_error(EINVAL, "give exactly one of --preset NAME or --preset-file FILE");
  }
  return o.preset_file.empty() ? find_preset(o.preset) : load_preset_file(o.preset_file, !o.calibrate.empty());
}

// --calibrate: the fit, printed, and the preset with it written.
int calibrate(const Options& o) {
  auto base_preset = chosen_preset(o);
  if (!base_preset) return usage_error(base_preset.error().context());
  auto steps = load_step_log(o.calibrate);
  if (!steps) return usage_error("--calibrate: " + steps.error().context());
  auto fit = fit_step_model(*steps, o.holdout, o.seed);
  if (!fit) {
    std::cerr << "tandem-sim: --calibrate " << o.calibrate << ": " << fit.error().context() << "\n";
    return 1;
  }
  std::cout << describe(*fit);
  if (!o.check.empty()) {
    auto other = load_step_log(o.check);
    if (!other) return usage_error("--check: " + other.error().context());
    const StepFit e = evaluate(fit->model, *other);
    std::cout << "\non " << o.check << " (" << e.test_steps << " steps, not fitted on): median |error| "
              << 100.0 * e.test_median_abs_error << " %\n";
    for (const ShapeError& s : e.shapes) {
      std::cout << "  " << s.shape << ": " << s.steps << " steps, measured median " << s.measured_median_us
                << " us, model " << s.model_median_us << " us (" << (s.error >= 0 ? "+" : "") << 100.0 * s.error
                << " %)\n";
    }
  }
  Preset p = *base_preset;
  p.step = fit->model;
  if (auto v = validate(p); !v) {
    std::cerr << "tandem-sim: the calibrated preset is not valid: " << v.error().context() << "\n";
    return 1;
  }
  if (!o.preset_out.empty()) {
    std::FILE* f = std::fopen(o.preset_out.c_str(), "we");
    const std::string text = preset_json(p);
    if (f == nullptr || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0) {
      std::cerr << "tandem-sim: --preset-out " << o.preset_out << ": cannot write\n";
      return 1;
    }
    std::cout << "wrote " << o.preset_out << "\n";
  }
  return 0;
}

int run(const Options& o) {
  if (!o.calibrate.empty()) return calibrate(o);
  if (o.trace.empty() == o.synthetic.empty())
    return usage_error("give exactly one of --trace FILE or --synthetic NAME");
  if (o.rates.empty()) return usage_error("give --rate R or --sweep R1,R2,...");
  // A cluster: --router with --nodes. --nodes 1 alone is the node alone.
  const bool cluster = !o.routers.empty();
  if (cluster && o.nodes.empty()) return usage_error("--router needs --nodes N (the cluster's size)");
  if (!cluster && std::any_of(o.nodes.begin(), o.nodes.end(), [](std::uint32_t n) { return n > 1; })) {
    return usage_error(
        "--nodes with more than one node needs --router (round-robin, least-queue, epp, epp+tandem or all)");
  }
  // The node counts of the workloads: 1 for a node alone.
  const std::vector<std::uint32_t> node_counts = cluster ? o.nodes : std::vector<std::uint32_t>{1};
  auto preset = chosen_preset(o);
  if (!preset) return usage_error(preset.error().context());

  SimConfig base_config;
  base_config.preset = *preset;
  base_config.limits.token_budget = o.token_budget.value_or(preset->token_budget);
  base_config.limits.max_seqs = o.max_seqs.value_or(preset->max_seqs);
  base_config.engines = o.engines;
  base_config.tool_cores = o.tool_cores;
  base_config.tool_start_s = o.tool_start_ms / 1000;
  base_config.tool_start_extra = o.tool_start_extra;
  if (o.tool_start_extra && o.tool_start_ms == 0) return usage_error("--tool-start-extra needs --tool-start-ms");
  base_config.host_kv_gib = o.host_kv_gib;
  base_config.tick_s = o.tick_s;
  if (base_config.limits.token_budget < preset->block_size) {
    return usage_error("--token-budget must be at least one KV block (" + std::to_string(preset->block_size) + ")");
  }
  if (!o.tool_cpu.empty()) {
    if (auto r = base_config.tool_cpu.apply(o.tool_cpu); !r) return usage_error("--tool-cpu: " + r.error().context());
  }
  // Host memory: modelled with --tool-mem, or for the memory-heavy family.
  base_config.tool_mem = !o.tool_mem.empty() || o.synthetic == "agentic-mem";
  if (!o.tool_mem.empty() && o.tool_mem != "on") {
    if (auto r = base_config.tool_mem_table.apply(o.tool_mem); !r) {
      return usage_error("--tool-mem: " + r.error().context());
    }
  }
  if (o.host_rules != "tandem" && o.host_rules != "all" && o.host_rules != "none") {
    return usage_error("--host-rules: '" + o.host_rules + "' is not tandem, all or none");
  }
  base_config.host_rules = o.host_rules;
  if (o.memory_cgroup != "v1" && o.memory_cgroup != "v2") {
    return usage_error("--memory-cgroup: '" + o.memory_cgroup + "' is not v1 or v2");
  }
  base_config.memory_v1 = o.memory_cgroup == "v1";
  base_config.tools_budget_mib = o.tools_budget_mib;
  base_config.host_mem_gib = o.host_mem_gib.value_or(0);
  base_config.session_mem_mib = o.session_mem_mib.value_or(-1);
  base_config.retry_delay_s = o.retry_delay_s;
  base_config.host_period_s = o.host_period_s;
  base_config.psi_window_s = o.psi_window_s;
  base_config.host_rule_config.stall_kill_after = base::from_seconds(o.stall_kill_after_s);
  base_config.tool_mem_scale = o.tool_mem_scale;
  base_config.tool_mem_cap_mib = o.tool_mem_cap_mib.value_or(sim::kToolMemCapMib);
  if (!base_config.tool_mem &&
      (o.host_mem_gib || o.session_mem_mib || o.tool_mem_scale != 1 || o.tool_mem_cap_mib.has_value() ||
       o.tools_budget_mib > 0 || o.host_period_s > 0 || o.psi_window_s != 10 || o.stall_kill_after_s != 10)) {
    return usage_error(
        "--host-mem-gib, --session-mem-mib, --tool-mem-scale, --tool-mem-cap-mib, --tools-budget-mib, "
        "--host-period, --psi-window and --stall-kill-after need --tool-mem (or --synthetic agentic-mem)");
  }

  // Policies: validate every name and parameter before running anything.
  std::vector<std::string> policies = o.policies;
  if (policies.empty() || (policies.size() == 1 && policies[0] == "all")) {
    policies.clear();
    for (const sched::PolicyEntry& e : sched::policy_registry()) policies.emplace_back(e.name);
  }
  for (const auto& [policy, values] : o.params) {
    if (std::find(policies.begin(), policies.end(), policy) == policies.end() && !(o.ablate && policy == "tandem")) {
      return usage_error("--param for policy '" + policy + "', which is not being run");
    }
  }
  std::vector<Job> variants;
  auto params_of = [&](const std::string& p) {
    auto it = o.params.find(p);
    return it == o.params.end() ? std::map<std::string, double>{} : it->second;
  };
  variants.reserve(policies.size() + std::size(kAdditions));
  for (const std::string& p : policies) variants.push_back({0, 0, p, "", params_of(p)});
  if (o.ablate) {
    for (std::string_view add : kAdditions) {
      auto values = params_of("tandem");
      values[std::string(add)] = 0;
      variants.push_back({0, 0, "tandem", "-" + std::string(add), values});
    }
  }
  for (const Job& v : variants) {
    auto inst = sched::make_policy(v.policy, v.params);
    if (!inst) return usage_error(inst.error().context());
  }

  // The session pool.
  std::vector<SessionSpec> pool;
  std::string workload_name;
  if (!o.trace.empty()) {
    TraceStats stats;
    auto loaded = load_trace(o.trace, &stats);
    if (!loaded) {
      std::cerr << "tandem-sim: " << loaded.error().context() << "\n";
      return 2;
    }
    pool = std::move(*loaded);
    workload_name = o.trace.substr(o.trace.find_last_of('/') + 1);
    if (!o.sources.empty() || !o.exclude_sources.empty()) {
      pool = filter_by_source(pool, o.sources, o.exclude_sources);
      if (pool.empty()) return usage_error("--source/--exclude-source leave no session of " + o.trace);
      std::string split;
      for (const std::string& p : o.sources) split += (split.empty() ? "" : ",") + p;
      for (const std::string& p : o.exclude_sources) split += (split.empty() ? "!" : ",!") + p;
      workload_name += "[" + split + "]";
      if (!o.quiet) std::cerr << "tandem-sim: " << pool.size() << " sessions match the source filter\n";
    }
    if (!o.quiet) {
      std::cerr << "tandem-sim: " << stats.sessions << " sessions, " << stats.rounds << " rounds from " << o.trace
                << (stats.dropped_rounds
                        ? " (" + std::to_string(stats.dropped_rounds) + " rounds after a final answer dropped)"
                        : "")
                << "\n";
    }
  } else {
    if (!o.sources.empty() || !o.exclude_sources.empty()) {
      return usage_error("--source and --exclude-source apply to --trace only");
    }
    workload_name = o.synthetic;
  }

  // One workload (and T_ideal) per rate and seed, shared by every policy. A
  // synthetic pool is drawn with the seed too: each seed is a fresh sample.
  const std::size_t n_seeds = static_cast<std::size_t>(o.seeds);
  // A cluster of N nodes gets N times the sessions at N times the rate: the
  // load per node is what --rate and --sessions say.
  std::vector<Workload> workloads;  // [nodes][rate][seed], flattened
  std::vector<std::vector<double>> ideals;
  for (const std::uint32_t scale : node_counts) {
    for (std::size_t r = 0; r < o.rates.size(); ++r) {
      for (std::size_t k = 0; k < n_seeds; ++k) {
        const std::uint64_t seed = o.seed + k;
        std::vector<SessionSpec> drawn;
        if (!o.synthetic.empty()) {
          // A cluster's sessions are drawn fresh, not the pool repeated.
          auto gen = synthetic_pool(o.synthetic, o.sessions.value_or(200) * scale, seed);
          if (!gen) return usage_error(gen.error().context());
          drawn = std::move(*gen);
        }
        ArrivalSpec a;
        a.rate_sps = o.rates[r] * scale;
        a.poisson = o.poisson;
        a.seed = seed;
        a.max_model_len = preset->max_model_len;
        const std::vector<SessionSpec>& from = o.synthetic.empty() ? pool : drawn;
        // A synthetic pool is already the cluster's size; a trace's is one node's.
        a.sessions = o.sessions ? *o.sessions * scale : o.synthetic.empty() ? from.size() * scale : from.size();
        auto w = make_workload(from, workload_name, a);
        if (!w) return usage_error(w.error().context());
        ideals.push_back(ideal_times(*w, base_config));
        workloads.push_back(std::move(*w));
      }
    }
  }
  if (!o.quiet && workloads.front().capped_rounds > 0) {
    std::cerr << "tandem-sim: " << workloads.front().capped_rounds << " of " << workloads.front().rounds
              << " rounds capped at max_model_len " << preset->max_model_len << "\n";
  }

  std::vector<Job> jobs;
  for (std::size_t r = 0; r < o.rates.size(); ++r) {
    for (std::size_t k = 0; k < n_seeds; ++k) {
      for (const Job& v : variants) {
        if (!cluster) {
          Job j = v;
          j.rate_index = r;
          j.seed_index = k;
          jobs.push_back(std::move(j));
          continue;
        }
        for (std::size_t n = 0; n < node_counts.size(); ++n) {
          for (Router router : o.routers) {
            Job j = v;
            j.rate_index = r;
            j.seed_index = k;
            j.nodes_index = n;
            j.router = router;
            j.cluster = true;
            jobs.push_back(std::move(j));
          }
        }
      }
    }
  }
  std::vector<Run> runs(jobs.size());
  std::vector<std::string> failures(jobs.size());
  std::atomic<std::size_t> next{0};
  std::mutex log_mutex;
  auto worker = [&] {
    for (std::size_t i = next++; i < jobs.size(); i = next++) {
      const Job& job = jobs[i];
      SimConfig config = base_config;
      config.policy = job.policy;
      config.params = job.params;
      const auto t0 = std::chrono::steady_clock::now();
      const std::size_t w_index = (job.nodes_index * o.rates.size() + job.rate_index) * n_seeds + job.seed_index;
      auto result = job.cluster ? simulate_cluster(workloads[w_index], config, ideals[w_index],
                                                   {node_counts[job.nodes_index], job.router, o.seed + job.seed_index})
                                : simulate(workloads[w_index], config, ideals[w_index]);
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      Run& run = runs[i];
      run.policy = job.policy;
      run.variant = job.variant;
      if (job.cluster) {
        run.router = std::string(router_name(job.router));
        run.nodes = node_counts[job.nodes_index];
        run.variant += "@" + run.router + "/" + std::to_string(run.nodes);
      }
      run.rate = o.rates[job.rate_index];
      run.seed = o.seed + job.seed_index;
      run.sessions = workloads[w_index].sessions.size();
      run.wall_s = wall;
      if (!result) {
        failures[i] = result.error().context();
      } else if (result->violations != 0 || result->rejected_events != 0) {
        failures[i] = std::to_string(result->violations) + " model violations, " +
                      std::to_string(result->rejected_events) + " rejected events; first: " + result->first_violation;
      } else {
        run.metrics = compute_metrics(result->sessions, result->counters);
        for (const SessionRecord& s : result->sessions) run.e2e_s.push_back(s.finish_s - s.arrival_s);
      }
      if (!o.quiet) {
        std::lock_guard lock(log_mutex);
        std::fprintf(stderr, "tandem-sim: %-22s rate %-6g seed %-4llu %s (%.1f s)\n", run_label(run).c_str(), run.rate,
                     static_cast<unsigned long long>(run.seed), failures[i].empty() ? "done" : "FAILED", wall);
      }
    }
  };
  unsigned n_threads = o.jobs != 0 ? o.jobs : std::max(1u, std::thread::hardware_concurrency());
  n_threads = std::min<unsigned>(n_threads, static_cast<unsigned>(jobs.size()));
  std::vector<std::thread> threads;
  threads.reserve(n_threads);
  for (unsigned t = 0; t < n_threads; ++t) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();

  int rc = 0;
  Report report;
  report.preset = std::string(preset->name);
  report.workload = workload_name;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (!failures[i].empty()) {
      std::cerr << "tandem-sim: " << run_label(runs[i]) << " at rate " << runs[i].rate << " seed " << runs[i].seed
                << " failed: " << failures[i] << "\n";
      report.failed.push_back({runs[i].policy, runs[i].variant, runs[i].rate, runs[i].seed, failures[i]});
      rc = 1;
      continue;
    }
    report.runs.push_back(std::move(runs[i]));
  }
  print_table(std::cout, report);
  // The goal check compares policies on one node; a cluster's table is its own.
  if (!cluster && std::find(policies.begin(), policies.end(), "tandem") != policies.end() && policies.size() > 1) {
    print_verdict(std::cout, judge(report));
  }
  auto write = [&](const std::string& path, base::Result<void> (*fn)(const Report&, const std::string&)) {
    if (path.empty()) return;
    if (auto r = fn(report, path); !r) {
      std::cerr << "tandem-sim: " << r.error().context() << "\n";
      rc = 1;
    } else {
      std::cout << "wrote " << path << "\n";
    }
  };
  write(o.json, write_json);
  write(o.csv, write_csv);
  if (!o.plot.empty()) {
    // The plot shows the policies; ablation variants (in the table, JSON and
    // CSV) would crowd its legend.
    Report plotted = report;
    std::erase_if(plotted.runs, [](const Run& r) { return !r.variant.empty(); });
    if (auto r = write_plot(plotted.runs.empty() ? report : plotted, o.plot); !r) {
      std::cerr << "tandem-sim: " << r.error().context() << "\n";
      rc = 1;
    } else {
      std::cout << "wrote " << o.plot << "\n";
    }
  }
  return rc;
}

}  // namespace
}  // namespace tandem::sim

int main(int argc, char** argv) {
  tandem::sim::Options o;
  if (auto rc = tandem::sim::parse_args(argc, argv, o)) return *rc;
  if (o.list) {
    tandem::sim::list_everything();
    return 0;
  }
  return tandem::sim::run(o);
}
