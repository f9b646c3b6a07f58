// The pure parts of tandem-agents (testbed/replay.h).
#include "testbed/replay.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include <fmt/core.h>

#include "base/parse.h"
#include "base/stats.h"
#include "sched/registry.h"
#include "sim/host_memory.h"
#include "testbed/flags.h"

namespace tandem::testbed {
namespace {

std::expected<double, std::string> positive(std::string_view flag, std::string_view v, bool allow_zero = false) {
  auto x = base::parse_double(v);
  if (!x || *x < 0 || (!allow_zero && *x == 0)) {
    return std::unexpected(
        fmt::format("{}: '{}' is not a {} number", flag, v, allow_zero ? "non-negative" : "positive"));
  }
  return *x;
}

// A TOML basic string.
std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// Whether a policy parameter is a duration (`..._s`) or a time per unit of
// work (`..._s_per_token`, `..._us_per_pair`): what time compression divides.
// (InferCept's and Continuum's `_s_per_token` costs were once missed, so
// their live TTLs and waste terms were 16 times too long.)
bool time_valued(std::string_view name) {
  return name.ends_with("_s") || name.find("_s_per_") != std::string_view::npos ||
         name.find("_us_") != std::string_view::npos;
}

}  // namespace

std::string replay_usage() {
  return R"(usage: tandem-agents run (--trace FILE | --synthetic NAME) --tool-cores N [options]
       tandem-agents daemon-config --policy NAME [--compress C] [--subtree NAME] [--tool-cpus LIST] [--preset-file FILE]
                                   [--param NAME=VALUE]... [--tools-budget-mib N]
       tandem-agents compare RUN.json... [--json FILE] [--sim-json FILE] [--plot FILE.png]

Replays agent sessions through the live stack: each round is an HTTP request
to tandem-engine-emu with the session's id, each tool step a real process
(tandem-toolburn) started through libtandem in the session's cgroup.

run
  --trace FILE          sessions from a traces/ JSONL file
  --synthetic NAME      a synthetic workload (tandem-sim --list)
  --sessions N          sessions to draw (default: every trace session once; 20 synthetic)
  --rate R              arrivals, sessions per second of trace time (default 0.03)
  --fixed-rate          evenly spaced arrivals (default: Poisson)
  --seed S              seed for drawing sessions and arrivals (default 1)
  --compress C          divide every duration by C (default 1); the engine must run with --speedup C
  --preset NAME         the engine's preset (default h100-llama3-8b)
  --preset-file FILE    a real-time engine's preset (tandem-llama: its fitted step model, real us)
  --token-scale S       divide every round's prompt and output tokens by S (default 1)
  --tool-cores N        cores the tool processes get (for the simulator's prediction)
  --tool-cpu SPEC       CPU demand per tool kind, "pytest=1,Read=0.05,*=0.5" (as tandem-sim)
  --tool-mem-mb M       MiB a tool touches per core of its demand (default 64)
  --tool-mem SPEC       instead, each call's memory peak drawn as tandem-sim --tool-mem draws it ("on", or
                        "kind=P95MiB,..."), held for the whole call; a tool killed for memory runs again
  --tool-mem-scale X    multiplies every drawn peak (default 1)
  --host-mem-gib G      the prediction's host memory per engine (default: the machine's)
  --tools-budget-mib N  tandemd's [memory] tools_budget, for the prediction's host rules (default: none)
  --retry-delay S       trace seconds before a tool killed for memory runs again (default 5)
  --param NAME=VALUE    a parameter of the policy, as tandemd runs it (daemon-config --param): for the
                        prediction, and in the run's label
  --url URL             the engine's HTTP endpoint (default http://127.0.0.1:8000)
  --runtime-dir DIR     tandemd's runtime dir (default $TANDEM_RUNTIME_DIR, else /run/tandem)
  --toolburn PATH       the tool stand-in (default: tandem-toolburn next to this binary)
  --timeout S           give up after S wall seconds (default: 4 x the arrivals' span / C + 120)
  --out FILE            the run as JSON (the simulator's format plus the testbed's records)
  --quiet               no progress lines
daemon-config           prints tandemd.toml for a run at this compression
compare                 a side-by-side table of runs, merged JSON and a plot
)";
}

std::expected<ReplayFlags, std::string> parse_replay_flags(std::span<const std::string_view> args) {
  ReplayFlags f;
  if (args.empty()) return std::unexpected("a command is needed: run, daemon-config or compare (see --help)");
  const std::string_view cmd = args[0];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") return f;
  if (cmd == "run") {
    f.mode = ReplayFlags::Mode::kRun;
  } else if (cmd == "daemon-config") {
    f.mode = ReplayFlags::Mode::kDaemonConfig;
  } else if (cmd == "compare") {
    f.mode = ReplayFlags::Mode::kCompare;
  } else {
    return std::unexpected(fmt::format("unknown command '{}' (run, daemon-config or compare)", cmd));
  }
  using Mode = ReplayFlags::Mode;
  struct Known {
    std::string_view flag;
    Mode mode;
    bool takes_value;
  };
  static constexpr Known kKnown[] = {
      {"--trace", Mode::kRun, true},
      {"--synthetic", Mode::kRun, true},
      {"--sessions", Mode::kRun, true},
      {"--rate", Mode::kRun, true},
      {"--fixed-rate", Mode::kRun, false},
      {"--seed", Mode::kRun, true},
      {"--compress", Mode::kRun, true},
      {"--preset", Mode::kRun, true},
      {"--preset-file", Mode::kRun, true},
      {"--token-scale", Mode::kRun, true},
      {"--tool-cores", Mode::kRun, true},
      {"--tool-cpu", Mode::kRun, true},
      {"--tool-mem-mb", Mode::kRun, true},
      {"--tool-mem", Mode::kRun, true},
      {"--tool-mem-scale", Mode::kRun, true},
      {"--host-mem-gib", Mode::kRun, true},
      {"--retry-delay", Mode::kRun, true},
      {"--param", Mode::kRun, true},
      {"--tools-budget-mib", Mode::kRun, true},
      {"--url", Mode::kRun, true},
      {"--runtime-dir", Mode::kRun, true},
      {"--toolburn", Mode::kRun, true},
      {"--timeout", Mode::kRun, true},
      {"--out", Mode::kRun, true},
      {"--quiet", Mode::kRun, false},
      {"--policy", Mode::kDaemonConfig, true},
      {"--subtree", Mode::kDaemonConfig, true},
      {"--tool-cpus", Mode::kDaemonConfig, true},
      {"--json", Mode::kCompare, true},
      {"--sim-json", Mode::kCompare, true},
      {"--plot", Mode::kCompare, true},
  };
  for (std::size_t i = 1; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (a == "--help" || a == "-h") {
      f.mode = Mode::kHelp;
      return f;
    }
    if (!a.starts_with("--")) {
      if (f.mode != Mode::kCompare) return std::unexpected(fmt::format("unexpected argument '{}'", a));
      f.inputs.emplace_back(a);
      continue;
    }
    auto [flag, value, has_value] = split_flag(a);
    const Known* k = nullptr;
    for (const Known& c : kKnown) {
      if (c.flag == flag) k = &c;
    }
    // --compress, --preset-file, --param and --tools-budget-mib belong to run
    // and daemon-config.
    const bool shared =
        (flag == "--compress" || flag == "--preset-file" || flag == "--param" || flag == "--tools-budget-mib") &&
        f.mode == Mode::kDaemonConfig;
    if (k == nullptr || (k->mode != f.mode && !shared)) {
      return std::unexpected(fmt::format("unknown flag '{}' for '{}' (see --help)", flag, cmd));
    }
    if (!k->takes_value) {
      if (has_value) return std::unexpected(fmt::format("{} takes no value", flag));
    } else if (!has_value) {
      if (i + 1 >= args.size()) return std::unexpected(fmt::format("{} needs a value", flag));
      value = args[++i];
    }
    if (k->takes_value && value.empty()) return std::unexpected(fmt::format("{}: empty value", flag));
    if (flag == "--trace") {
      f.trace = value;
    } else if (flag == "--synthetic") {
      f.synthetic = value;
    } else if (flag == "--sessions") {
      auto n = base::parse_int<std::size_t>(value);
      if (!n || *n == 0) return std::unexpected(fmt::format("--sessions: '{}' is not a positive integer", value));
      f.sessions = *n;
    } else if (flag == "--rate") {
      auto x = positive(flag, value);
      if (!x) return std::unexpected(x.error());
      f.rate = *x;
    } else if (flag == "--fixed-rate") {
      f.poisson = false;
    } else if (flag == "--seed") {
      auto n = base::parse_int<std::uint64_t>(value);
      if (!n) return std::unexpected(fmt::format("--seed: '{}' is not a non-negative integer", value));
      f.seed = *n;
    } else if (flag == "--compress") {
      auto x = positive(flag, value);
      if (!x) return std::unexpected(x.error());
      if (*x > 1000) return std::unexpected(fmt::format("--compress: {} is above 1000", value));
      f.compress = *x;
    } else if (flag == "--preset") {
      f.preset = value;
    } else if (flag == "--preset-file") {
      f.preset_file = value;
    } else if (flag == "--token-scale") {
      auto x = positive(flag, value);
      if (!x) return std::unexpected(x.error());
      if (*x > 10000) return std::unexpected(fmt::format("--token-scale: {} is above 10000", value));
      f.token_scale = *x;
    } else if (flag == "--tool-cores") {
      auto x = positive(flag, value);
      if (!x) return std::unexpected(x.error());
      f.tool_cores = *x;
    } else if (flag == "--tool-cpu") {
      f.tool_cpu = value;
    } else if (flag == "--tool-mem-mb") {
      auto x = positive(flag, value, true);
      if (!x) return std::unexpected(x.error());
      if (*x > 65536) return std::unexpected(fmt::format("--tool-mem-mb: {} is above 65536", value));
      f.tool_mem_mb = *x;
    } else if (flag == "--tool-mem") {
      if (value != "on") {
        sim::ToolMemTable table;
        if (auto r = table.apply(value); !r) return std::unexpected("--tool-mem: " + r.error().message());
      }
      f.tool_mem = value;
    } else if (flag == "--tool-mem-scale" || flag == "--host-mem-gib" || flag == "--retry-delay") {
      auto x = positive(flag, value, flag == "--retry-delay");
      if (!x) return std::unexpected(x.error());
      if (*x > 1e6) return std::unexpected(fmt::format("{}: {} is above 1e6", flag, value));
      (flag == "--tool-mem-scale" ? f.tool_mem_scale
       : flag == "--host-mem-gib" ? f.host_mem_gib
                                  : f.retry_delay_s) = *x;
    } else if (flag == "--param") {
      const std::size_t eq = value.find('=');
      if (eq == std::string_view::npos || eq == 0) {
        return std::unexpected(fmt::format("--param: '{}' is not NAME=VALUE", value));
      }
      auto x = base::parse_double(value.substr(eq + 1));
      if (!x || !std::isfinite(*x)) return std::unexpected(fmt::format("--param: '{}' has no number", value));
      f.params[std::string(value.substr(0, eq))] = *x;
    } else if (flag == "--tools-budget-mib") {
      auto n = base::parse_int<std::uint64_t>(value);
      if (!n || *n > (std::uint64_t{1} << 30)) {
        return std::unexpected(fmt::format("--tools-budget-mib: '{}' is not a size in MiB", value));
      }
      f.tools_budget_mib = *n;
    } else if (flag == "--url") {
      if (!value.starts_with("http://")) {
        return std::unexpected(fmt::format("--url: '{}' is not an http:// URL", value));
      }
      f.url = value;
    } else if (flag == "--runtime-dir") {
      f.runtime_dir = value;
    } else if (flag == "--toolburn") {
      f.toolburn = value;
    } else if (flag == "--timeout") {
      auto x = positive(flag, value);
      if (!x) return std::unexpected(x.error());
      f.timeout_s = *x;
    } else if (flag == "--out") {
      f.out = value;
    } else if (flag == "--quiet") {
      f.quiet = true;
    } else if (flag == "--policy") {
      f.policy = value;
    } else if (flag == "--subtree") {
      if (value.find('/') != std::string_view::npos || value == "." || value == "..") {
        return std::unexpected(fmt::format("--subtree: '{}' is not a single folder name", value));
      }
      f.subtree = value;
    } else if (flag == "--tool-cpus") {
      f.tool_cpus = value;
    } else if (flag == "--json") {
      f.json = value;
    } else if (flag == "--sim-json") {
      f.sim_json = value;
    } else if (flag == "--plot") {
      f.plot = value;
    }
  }
  switch (f.mode) {
    case Mode::kRun:
      if (f.trace.empty() == f.synthetic.empty()) return std::unexpected("run needs one of --trace or --synthetic");
      if (f.tool_cores <= 0) return std::unexpected("run needs --tool-cores (the cores the tools get)");
      break;
    case Mode::kDaemonConfig:
      if (f.policy.empty()) return std::unexpected("daemon-config needs --policy");
      break;
    case Mode::kCompare:
      if (f.inputs.empty()) return std::unexpected("compare needs at least one run file");
      break;
    case Mode::kHelp:
      break;
  }
  return f;
}

ToolStep tool_step(const sim::RoundSpec& round, const sim::ToolCpuTable& cpus, double compress,
                   double mem_mb_per_core) {
  ToolStep t;
  const double demand = std::max(0.001, cpus.demand(round.tool));  // CpuPool's floor
  t.wall_s = round.tool_seconds / compress;
  t.cpu_s = demand * t.wall_s;
  t.mem_mb = static_cast<std::uint64_t>(std::max(1.0, std::round(demand * mem_mb_per_core)));
  if (mem_mb_per_core == 0) t.mem_mb = 0;
  return t;
}

void scale_tokens(std::vector<sim::SessionSpec>& sessions, double scale) {
  if (scale == 1.0) return;
  auto div = [&](std::uint32_t t) {
    return static_cast<std::uint32_t>(std::max(1.0, std::round(static_cast<double>(t) / scale)));
  };
  for (sim::SessionSpec& s : sessions) {
    for (sim::RoundSpec& r : s.rounds) {
      r.input_tokens = div(r.input_tokens);
      r.output_tokens = div(r.output_tokens);
    }
  }
}

sim::Preset trace_time_preset(const sim::Preset& real, double compress) {
  sim::Preset p = real;
  sim::StepTimeModel& m = p.step;
  m.t0_us *= compress;
  m.weights_us *= compress;
  m.b_us_per_token *= compress;
  m.a_pf_us_per_pair *= compress;
  m.a_dec_us_per_token *= compress;
  m.a_seq_us *= compress;
  m.expert_bytes *= compress;  // the expert term is bytes / bandwidth: scale its time through the bytes
  p.swap_us_per_token *= compress;
  p.swap_fixed_us *= compress;
  return p;
}

std::map<std::string, double> cost_params(const sim::Preset& p, double scale) {
  return {{"prefill_us_per_token", p.step.b_us_per_token * scale},
          {"attention_us_per_pair", p.step.a_pf_us_per_pair * scale},
          {"swap_us_per_token", p.swap_us_per_token * scale}};
}

std::expected<DaemonConfig, std::string> daemon_config(std::string_view policy, double compress,
                                                       std::string_view subtree, std::string_view tool_cpus,
                                                       const sim::Preset* realtime,
                                                       const std::map<std::string, double>& overrides,
                                                       std::uint64_t tools_budget_mib) {
  const sched::PolicyEntry* entry = sched::find_policy(policy);
  if (entry == nullptr) {
    std::string known;
    for (const sched::PolicyEntry& e : sched::policy_registry())
      known += (known.empty() ? "" : ", ") + std::string(e.name);
    return std::unexpected(fmt::format("unknown policy '{}' (known: {})", policy, known));
  }
  if (!(compress > 0) || !std::isfinite(compress)) return std::unexpected("the compression must be a positive number");
  DaemonConfig c;
  c.tick_ms = static_cast<std::uint32_t>(std::max(1.0, std::round(50.0 / compress)));
  const std::map<std::string, double> costs =
      realtime != nullptr ? cost_params(*realtime, 1.0) : std::map<std::string, double>{};
  for (const sched::ParamSpec& p : entry->params) {
    if (auto it = costs.find(std::string(p.name)); it != costs.end()) {
      c.params[it->first] = std::clamp(it->second, p.min, p.max);
      continue;
    }
    if (!time_valued(p.name) || compress == 1.0) continue;
    double v = p.default_value / compress;
    if (v < p.min) {
      c.clamped.push_back(fmt::format("{}: wanted {:.6g}, held at {:.6g}", p.name, v, p.min));
      v = p.min;
    }
    c.params[std::string(p.name)] = v;
  }
  for (const auto& [name, v] : overrides) {
    const auto spec = std::ranges::find(entry->params, name, &sched::ParamSpec::name);
    if (spec == entry->params.end()) {
      return std::unexpected(fmt::format("--param: policy '{}' has no parameter '{}'", policy, name));
    }
    if (v < spec->min || v > spec->max) {
      return std::unexpected(fmt::format("--param: {} = {} is outside {} .. {}", name, v, spec->min, spec->max));
    }
    c.params[name] = v;
  }
  std::string t = fmt::format(
      "# tandemd for a tandem-agents run compressed {}x (tandem-agents daemon-config):\n"
      "# the policy's durations{}, and the tick, divided by {}.\n"
      "[policy]\nname = {}\ntick_ms = {}\n",
      compress,
      realtime != nullptr ? " (its per-work costs are the real-time engine's preset's)" : " and per-work costs",
      compress, toml_string(policy), c.tick_ms);
  if (!c.params.empty()) {
    t += "\n[policy.params]\n";
    for (const auto& [name, v] : c.params) t += fmt::format("{} = {:.9g}\n", name, v);
  }
  t += "\n[cgroups]\nmode = \"auto\"\n";
  if (!subtree.empty()) t += fmt::format("subtree = {}\n", toml_string(subtree));
  if (!tool_cpus.empty()) t += fmt::format("tool_cpus = {}\n", toml_string(tool_cpus));
  if (tools_budget_mib != 0) t += fmt::format("\n[memory]\ntools_budget = \"{}M\"\n", tools_budget_mib);
  c.toml = std::move(t);
  return c;
}

Assembled assemble(std::span<const SessionLog> sessions, std::span<const double> ideal_s, const EngineTotals& engine,
                   double compress, double tool_cores, std::uint64_t capped_rounds) {
  Assembled a;
  const double c = compress;
  for (std::size_t i = 0; i < sessions.size(); ++i) {
    const SessionLog& s = sessions[i];
    for (const ToolLog& t : s.tools) {
      ++a.counters.tool_calls;
      a.counters.tool_cpu_core_s += t.cpu_s * c;
      if (t.nominal_s > 0) {
        a.counters.tool_stretch_sum += t.run_s / t.nominal_s;
        ++a.counters.tool_stretch_calls;
      }
    }
    if (!s.complete) continue;
    sim::SessionRecord r;
    r.arrival_s = s.arrival_s * c;
    r.finish_s = std::max(s.finish_s, s.arrival_s) * c;
    r.ideal_s = i < ideal_s.size() ? ideal_s[i] : 0.0;
    r.rounds = static_cast<std::uint32_t>(s.rounds.size());
    for (const RoundLog& round : s.rounds) {
      r.ttft_s.push_back(std::max(0.0, round.first_token_s - round.submit_s) * c);
      a.ttft_s.push_back(r.ttft_s.back());
    }
    if (r.ideal_s > 0) a.records.push_back(std::move(r));
  }
  sim::RunCounters& k = a.counters;
  k.prompt_tokens = engine.prompt_tokens;
  k.reused_tokens = engine.reused_tokens;
  k.new_tokens = engine.new_tokens;
  k.recomputed_tokens = engine.recomputed_tokens;
  k.computed_tokens = engine.computed_tokens;
  k.preemptions = engine.preemptions;
  k.pinned_block_seconds = engine.pinned_block_seconds * c;
  k.gpu_busy_s = engine.busy_s;
  k.engines = 1;
  k.tool_cores = static_cast<std::uint32_t>(std::max(1.0, std::round(tool_cores)));
  k.capped_rounds = capped_rounds;
  return a;
}

double mean_stretch(std::span<const std::pair<double, double>> calls, double min_nominal_s) {
  double sum = 0;
  std::size_t n = 0;
  for (const auto& [nominal, actual] : calls) {
    if (nominal <= 0 || nominal < min_nominal_s) continue;
    sum += actual / nominal;
    ++n;
  }
  return n ? sum / static_cast<double>(n) : 0.0;
}

double tool_start_cpu_s(std::span<const SessionLog> sessions, const sim::ToolCpuTable& cpus) {
  std::vector<double> extra;
  for (const SessionLog& s : sessions) {
    for (const ToolLog& t : s.tools) {
      if (t.exit_code != 0 || t.memory_kill || t.reason != 0) continue;
      const double asked = std::max(0.001, cpus.demand(t.kind)) * t.nominal_s;  // as tool_step() asks
      extra.push_back(std::max(0.0, t.cpu_s - asked));
    }
  }
  return extra.empty() ? 0.0 : base::median(extra);
}

bool memory_on_v1(std::string_view cgroups) {
  for (std::string_view entry : base::split(cgroups, ';')) {
    entry = base::trim(entry);
    if (!entry.starts_with("v1 ")) continue;
    entry.remove_prefix(3);
    const std::string_view controllers = entry.substr(0, entry.find(' '));
    for (std::string_view c : base::split(controllers, ',')) {
      if (c == "memory") return true;
    }
  }
  return false;
}

}  // namespace tandem::testbed
