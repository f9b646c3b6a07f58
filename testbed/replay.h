// tandem-agents: replaying agent sessions through the live stack (issue 7,
// docs/replay.md). This header holds the parts with no I/O, so tests can feed
// them: the command line, what each tool step runs, the daemon configuration
// for a time-compressed run, and turning what a run recorded into the
// simulator's metrics (sim/metrics.h, the same code and definitions).
//
// Time compression. A run divides every duration by `compress` (C): arrivals
// come C times faster, the engine emulator runs with --speedup C, tools last
// 1/C of their trace time, and the policy's parameters that are durations
// (names ending in _s) or costs per unit of work in microseconds (names with
// _us_) are divided by C, as is the control tick. Everything the run measures
// is multiplied by C before it becomes a metric, so a run's numbers read in
// trace seconds and compare directly with tandem-sim's on the same workload.
//
// A real-time engine (tandem-llama) cannot run C times faster: its steps take
// what llama.cpp takes. Arrivals and tools are still compressed; the engine's
// preset (--preset-file: fitted to its measured steps, in real microseconds)
// says what its steps cost, the daemon gets those costs as they are, and the
// simulator's prediction runs with them multiplied by C (trace time). Token
// counts may be scaled down (--token-scale S: every round's prompt and output
// divided by S) to fit a small model on a CPU; the prediction sees the same
// scaled sessions.
#pragma once

#include <cstdint>
#include <expected>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sim/metrics.h"
#include "sim/preset.h"
#include "sim/workload.h"

namespace tandem::testbed {

// ---- the command line ---------------------------------------------------------

struct ReplayFlags {
  enum class Mode { kHelp, kRun, kDaemonConfig, kCompare };
  Mode mode = Mode::kHelp;

  // run: the workload (the simulator's: same pool, same seed, same arrivals).
  std::string trace;
  std::string synthetic;
  std::size_t sessions = 0;  // 0: every trace session once (20 for a synthetic one)
  double rate = 0.03;        // sessions per second of trace time
  bool poisson = true;
  std::uint64_t seed = 1;
  double compress = 1.0;
  // run: the node (for tool demands and the simulator's prediction).
  std::string preset = "h100-llama3-8b";
  std::string preset_file;  // a real-time engine's preset (tandem-sim --calibrate); run and daemon-config
  double token_scale = 1;   // prompts and outputs divided by this
  double tool_cores = 0;    // cores the tools get; required for run
  std::string tool_cpu;     // sim::ToolCpuTable::apply spec
  double tool_mem_mb = 64;  // MiB a tool touches per core of CPU demand
  // run: tool memory as the simulator draws it (docs/sim.md "Host memory"):
  // "" = tool_mem_mb's rule; "on" or "kind=P95MiB,..." = each call's drawn
  // peak, held for the whole call.
  std::string tool_mem;
  double tool_mem_scale = 1;  // multiplies every drawn peak
  double host_mem_gib = 0;    // the prediction's host memory (0: the preset's)
  double retry_delay_s = 5;   // trace seconds before a tool killed for memory runs again
  // run: the live stack.
  std::string url = "http://127.0.0.1:8000";
  std::string runtime_dir;  // "" = $TANDEM_RUNTIME_DIR, else /run/tandem
  std::string toolburn;     // "" = tandem-toolburn next to this binary
  double timeout_s = 0;     // wall seconds before the run gives up (0 = 4 × the trace's span / C + 120)
  std::string out;          // run: the run's JSON
  bool quiet = false;

  // daemon-config: the policy whose tandemd.toml to print.
  std::string policy;
  std::string subtree;                   // [cgroups] subtree ("" = the default)
  std::string tool_cpus;                 // [cgroups] tool_cpus ("" = all)
  std::map<std::string, double> params;  // --param NAME=VALUE (run and daemon-config): the policy's, set as given
  std::uint64_t tools_budget_mib = 0;    // [memory] tools_budget in MiB (0: none)

  // compare: run files in, a table out, and the merged files.
  std::vector<std::string> inputs;
  std::string json;      // measured runs, the simulator's --json format
  std::string sim_json;  // the simulator's predictions for the same runs
  std::string plot;      // PNG
};

// "tandem-agents run|daemon-config|compare ..."; "--flag value" or
// "--flag=value". The error names the flag or argument.
std::expected<ReplayFlags, std::string> parse_replay_flags(std::span<const std::string_view> args);
std::string replay_usage();

// ---- what a run does ------------------------------------------------------------

// Every round's prompt and output tokens divided by `scale` (rounded, at
// least 1).
void scale_tokens(std::vector<sim::SessionSpec>& sessions, double scale);
// A real-time engine's preset in trace time: its step and swap costs × C.
sim::Preset trace_time_preset(const sim::Preset& real, double compress);
// tandem's cost parameters (prefill_us_per_token, attention_us_per_pair,
// swap_us_per_token) from a preset's step model, times `scale`.
std::map<std::string, double> cost_params(const sim::Preset& p, double scale);

// The stand-in process for one tool step: `tandem-toolburn --cpu-seconds
// cpu_s --wall-seconds wall_s --mem-mb mem_mb`, all compressed.
struct ToolStep {
  double wall_s = 0;
  double cpu_s = 0;
  std::uint64_t mem_mb = 0;
};
// The tool's CPU demand d (cores, from `cpus`, as the simulator's CpuPool
// uses it): cpu = d · wall; memory = d · mem_mb_per_core MiB, at least 1.
ToolStep tool_step(const sim::RoundSpec& round, const sim::ToolCpuTable& cpus, double compress, double mem_mb_per_core);

// tandemd.toml for `policy` at compression `compress`: the policy's
// duration and cost parameters divided by it (those that would fall below
// their minimum are held there and listed in `clamped`), the tick too
// (50 ms / C, at least 1 ms), cgroups on when possible, telemetry auto.
// Errors name an unknown policy.
struct DaemonConfig {
  std::string toml;
  std::map<std::string, double> params;  // what was set
  std::vector<std::string> clamped;      // "name: wanted X, held at MIN"
  std::uint32_t tick_ms = 50;
};
// With `realtime` (a real-time engine's preset), tandem's cost parameters
// are that preset's, undivided: the engine's steps are not compressed.
// `overrides` set parameters as given, after compression (errors name an
// unknown one or one out of its range); `tools_budget_mib` writes [memory]
// tools_budget.
std::expected<DaemonConfig, std::string> daemon_config(std::string_view policy, double compress,
                                                       std::string_view subtree, std::string_view tool_cpus,
                                                       const sim::Preset* realtime = nullptr,
                                                       const std::map<std::string, double>& overrides = {},
                                                       std::uint64_t tools_budget_mib = 0);

// ---- what a run recorded ----------------------------------------------------------

// Wall-clock seconds since the run's start.
struct RoundLog {
  double submit_s = 0;
  double first_token_s = 0;
  double end_s = 0;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t cached_tokens = 0;
};
struct ToolLog {
  std::string kind;
  double nominal_s = 0;  // compressed
  double run_s = 0;      // the tool's own wall time, start of main() to its report (its stretch)
  double wall_s = 0;     // the call's, spawn to exit (tandem_tool_result.wall_ns)
  double call_s = 0;     // the runner's: asking for the spawn to having the result
  double cpu_s = 0;
  double peak_mb = 0;
  int exit_code = 0;
  int reason = 0;            // tandem_tool_exit_reason
  bool placed = false;       // it ran in a cgroup of its own
  bool verified = false;     // its /proc/self/cgroup named its session's tools/ folder
  bool memory_kill = false;  // OOM-killed, or killed by tandemd's memory rules
  bool retried = false;      // killed for memory and run again (--tool-mem)
};
struct SessionLog {
  std::string name;
  double arrival_s = 0;  // scheduled (arrival in the trace / C)
  double finish_s = 0;   // end of its last round
  bool complete = false;
  std::string error;  // why not
  std::vector<RoundLog> rounds;
  std::vector<ToolLog> tools;
};

// Engine counters over the run (deltas of tandem-engine-emu's /stats).
struct EngineTotals {
  std::uint64_t prompt_tokens = 0, reused_tokens = 0, new_tokens = 0, recomputed_tokens = 0, computed_tokens = 0;
  std::uint64_t preemptions = 0;
  double busy_s = 0;                // the emulator's modelled (trace) seconds; a real-time engine's real ones
  double pinned_block_seconds = 0;  // real seconds
};

// The simulator's records and counters from a run's logs, in trace seconds
// (wall × compress). A tool's stretch is its own run time over its nominal
// time: what contention did to it. Starting it (the cgroup, exec) is a cost
// of the call, reported apart (call_s − run_s), as the simulator has none. Only complete sessions count, as in the
// simulator; `ideal_s` is indexed like `sessions` (sim::ideal_times of the workload).
struct Assembled {
  std::vector<sim::SessionRecord> records;
  sim::RunCounters counters;
  std::vector<double> ttft_s;  // every round's, trace seconds
};
Assembled assemble(std::span<const SessionLog> sessions, std::span<const double> ideal_s, const EngineTotals& engine,
                   double compress, double tool_cores, std::uint64_t capped_rounds);

// Mean actual / nominal over the calls whose nominal time is at least
// `min_nominal_s` (pairs of nominal, actual); 0 when there are none. A tool's
// process costs a few milliseconds of its own whatever its trace time
// (exec, the C++ runtime, touching its memory), so under strong compression
// the calls that last a few milliseconds stretch for that reason alone:
// this is the stretch contention causes, on the calls long enough to show it.
constexpr double kLongToolWallS = 0.010;  // compressed (wall) seconds
double mean_stretch(std::span<const std::pair<double, double>> calls, double min_nominal_s);

// The CPU a tool call used beyond what its step asked for (fork, exec, the
// C++ runtime, its report): the median, in wall seconds, over the calls that
// ran to the end (exit 0, not killed); 0 when there are none. The prediction
// runs it, in trace seconds, as each call's start phase on top of its time
// (sim::SimConfig::tool_start_s, docs/replay.md "The prediction").
double tool_start_cpu_s(std::span<const SessionLog> sessions, const sim::ToolCpuTable& cpus);

// Whether tandemd's cgroups (its status's host.cgroups, "v2 cpuacct,freezer
// /path; v1 memory /path; ...") put the memory controller on cgroup v1.
bool memory_on_v1(std::string_view cgroups);

}  // namespace tandem::testbed
