// tandem-agents' output (testbed/replay_report.h).
#include "testbed/replay_report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <map>

#include <fmt/core.h>

#include "base/parse.h"
#include "sim/report.h"

namespace tandem::testbed {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

sim::Report one_run_report(const RunSummary& r, const sim::Metrics& m, const std::vector<double>& e2e, double wall_s) {
  sim::Report rep;
  rep.preset = r.preset;
  rep.workload = r.workload;
  sim::Run run;
  run.policy = r.policy;
  run.rate = r.rate;
  run.sessions = r.sessions;
  run.metrics = m;
  run.e2e_s = e2e;
  run.wall_s = wall_s;
  rep.runs.push_back(std::move(run));
  return rep;
}

// A JSON value or, when absent, a default (status documents come from
// another process and may lack a key).
template <class T, class J>
T get_or(const J& j, std::initializer_list<const char*> path, T fallback) {
  const J* at = &j;
  for (const char* key : path) {
    if (!at->is_object() || !at->contains(key)) return fallback;
    at = &(*at)[key];
  }
  if (at->is_null()) return fallback;
  try {
    return at->template get<T>();
  } catch (const nlohmann::json::exception&) {
    return fallback;
  }
}

struct ToolTotals {
  std::uint64_t calls = 0, placed = 0, verified = 0, nonzero = 0, killed = 0;
  std::uint64_t memory_kills = 0;  // OOM-killed, or killed by tandemd's memory rules
  std::uint64_t reruns = 0;        // of those, run again (--tool-mem)
  double peak_mb_max = 0, peak_mb_sum = 0, cpu_s = 0;
  std::vector<double> overhead_ms;  // call − run, wall milliseconds
};

ToolTotals tool_totals(const std::vector<SessionLog>& logs) {
  ToolTotals t;
  for (const SessionLog& s : logs) {
    for (const ToolLog& tool : s.tools) {
      ++t.calls;
      t.placed += tool.placed;
      t.verified += tool.verified;
      t.nonzero += tool.exit_code != 0;
      t.killed += tool.reason != 0;
      t.memory_kills += tool.memory_kill;
      t.reruns += tool.retried;
      t.peak_mb_max = std::max(t.peak_mb_max, tool.peak_mb);
      t.peak_mb_sum += tool.peak_mb;
      t.cpu_s += tool.cpu_s;
      t.overhead_ms.push_back(std::max(0.0, tool.call_s - tool.run_s) * 1e3);
    }
  }
  return t;
}

}  // namespace

ordered_json run_document(const RunSummary& r) {
  ordered_json doc = ordered_json::parse(sim::report_json(one_run_report(r, r.measured, r.e2e_s, r.wall_s)));
  if (r.predicted) {
    doc["predicted"] = ordered_json::parse(sim::report_json(one_run_report(r, *r.predicted, r.predicted_e2e_s, 0)));
  } else {
    doc["predicted"] = nullptr;
  }
  ordered_json tb;
  tb["compress"] = r.compress;
  tb["policy"] = r.policy;
  tb["wall_s"] = r.wall_s;
  tb["tool_start_ms"] = r.tool_start_ms;
  tb["timed_out"] = r.timed_out;
  tb["interrupted"] = r.interrupted;
  if (!r.prediction_error.empty()) tb["prediction_error"] = r.prediction_error;

  const json& d = r.daemon_first;
  tb["daemon"] = {
      {"reachable", !d.is_null()},
      {"policy", get_or<std::string>(d, {"policy"}, "")},
      {"cgroups", get_or<json>(d, {"host", "cgroups"}, "off")},
      {"telemetry_mode", get_or<std::string>(d, {"host", "telemetry_mode"}, "off")},
      {"tools_prepared", get_or<std::uint64_t>(r.daemon_last, {"host", "tools_prepared"}, 0)},
      {"tools_killed", get_or<std::uint64_t>(r.daemon_last, {"host", "tools_killed"}, 0)},
      {"throttles", get_or<std::uint64_t>(r.daemon_last, {"host", "throttles"}, 0)},
      {"freezes", get_or<std::uint64_t>(r.daemon_last, {"host", "freezes"}, 0)},
      {"peak_tools_memory_bytes", r.peak_tools_memory},
      // wall seconds tools waited at a memory limit (v1 under_oom), summed over calls
      {"tools_memory_stalled_s", get_or<double>(r.daemon_last, {"host", "tools_memory_stalled_seconds"}, 0)},
  };
  // null where the kernel has no PSI
  const auto or_null = [](double v) { return std::isnan(v) ? json(nullptr) : json(v); };
  tb["memory_psi"] = {{"some_pct", or_null(r.mem_psi_some_pct)}, {"full_pct", or_null(r.mem_psi_full_pct)}};
  const json& e = r.engine_stats;
  tb["engine"] = {
      {"name", get_or<std::string>(e, {"engine_name"}, "")},
      {"speedup", get_or<double>(e, {"speedup"}, 0)},
      {"steps", get_or<std::uint64_t>(e, {"engine", "steps"}, 0)},
      {"busy_s", get_or<double>(e, {"time", "busy_s"}, 0)},
      {"late_s", get_or<double>(e, {"time", "late_s"}, 0)},
      {"late_unrecovered_s", get_or<double>(e, {"time", "late_unrecovered_s"}, 0)},
      {"violations", get_or<std::uint64_t>(e, {"engine", "violations"}, 0)},
      {"scheduler_failures", get_or<std::uint64_t>(e, {"scheduler_failures"}, 0)},
      {"directives", get_or<json>(e, {"directives"}, json::object())},
      {"rounds_failed", get_or<std::uint64_t>(e, {"rounds", "failed"}, 0)},
  };
  std::uint64_t completed = 0, rounds = 0;
  ordered_json failed = ordered_json::array();
  ToolTotals t;
  if (r.logs != nullptr) {
    for (const SessionLog& s : *r.logs) {
      completed += s.complete;
      rounds += s.rounds.size();
      if (!s.complete) failed.push_back({{"name", s.name}, {"error", s.error}});
    }
    t = tool_totals(*r.logs);
  }
  tb["sessions"] = {{"total", r.sessions}, {"completed", completed}, {"failed", failed}};
  tb["rounds"] = rounds;
  tb["tools"] = {{"calls", t.calls},
                 {"placed", t.placed},
                 {"verified_in_session_cgroup", t.verified},
                 {"nonzero_exit", t.nonzero},
                 {"killed", t.killed},
                 {"memory_kills", t.memory_kills},
                 {"rerun_after_memory_kill", t.reruns},
                 {"cpu_s", t.cpu_s},
                 {"peak_mb_max", t.peak_mb_max},
                 {"peak_mb_mean", t.calls ? t.peak_mb_sum / static_cast<double>(t.calls) : 0.0},
                 {"long_threshold_wall_s", kLongToolWallS},
                 {"stretch_long_mean", r.long_stretch},
                 {"predicted_stretch_long_mean", r.predicted_long_stretch},
                 // Starting a call and collecting it, beyond the tool's own run (wall ms, not compressed).
                 {"overhead_ms_p50", sim::percentile(t.overhead_ms, 50)},
                 {"overhead_ms_p90", sim::percentile(t.overhead_ms, 90)}};
  // Every tool call: [kind, nominal s, run s, call s, cpu s, peak MiB], wall seconds (compressed).
  ordered_json calls = ordered_json::array();
  if (r.logs != nullptr) {
    for (const SessionLog& s : *r.logs) {
      for (const ToolLog& tool : s.tools) {
        calls.push_back({tool.kind, tool.nominal_s, tool.run_s, tool.call_s, tool.cpu_s, tool.peak_mb});
      }
    }
  }
  tb["tool_calls"] = std::move(calls);
  // Every round: [session index, submit, first token, end, prompt tokens, cached tokens], wall seconds
  // since the run's start (compressed), so a slow first token can be traced to its session and time.
  ordered_json round_log = ordered_json::array();
  if (r.logs != nullptr) {
    for (std::size_t i = 0; i < r.logs->size(); ++i) {
      for (const RoundLog& round : (*r.logs)[i].rounds) {
        round_log.push_back(
            {i, round.submit_s, round.first_token_s, round.end_s, round.prompt_tokens, round.cached_tokens});
      }
    }
  }
  tb["round_log"] = std::move(round_log);
  tb["e2e_s"] = r.e2e_s;
  tb["ttft_s"] = r.ttft_s;
  tb["predicted_e2e_s"] = r.predicted_e2e_s;
  tb["predicted_ttft_s"] = r.predicted_ttft_s;
  doc["testbed"] = std::move(tb);
  return doc;
}

base::Result<void> write_run(const RunSummary& run, const std::string& path) {
  std::string text = run_document(run).dump(2, ' ', false, ordered_json::error_handler_t::replace);
  text += '\n';
  return sim::write_file_atomic(path, text, "run");
}

void print_run(std::FILE* out, const RunSummary& r) {
  const sim::Metrics& m = r.measured;
  fmt::print(out, "run: policy {}, {} of {} sessions completed in {:.1f} s wall (compressed {}x)\n", r.policy,
             m.sessions, r.sessions, r.wall_s, r.compress);
  fmt::print(out,
             "  measured   E2E mean {:.1f} s  p90 {:.1f} s  p99 {:.1f} s  goodput(a=3) {:.4f}/s  TTFT mean {:.2f} s  "
             "KV hit {:.1f} %  tool stretch {:.2f}\n",
             m.e2e_mean_s, m.e2e_p90_s, m.e2e_p99_s, m.goodput_a3, m.ttft_mean_s, m.kv_hit_rate * 100,
             m.tool_stretch_mean);
  if (r.predicted) {
    const sim::Metrics& p = *r.predicted;
    fmt::print(out,
               "  simulated  E2E mean {:.1f} s  p90 {:.1f} s  p99 {:.1f} s  goodput(a=3) {:.4f}/s  TTFT mean {:.2f} s  "
               "KV hit {:.1f} %  tool stretch {:.2f}  (each tool's start: {:.1f} ms of CPU, measured)\n",
               p.e2e_mean_s, p.e2e_p90_s, p.e2e_p99_s, p.goodput_a3, p.ttft_mean_s, p.kv_hit_rate * 100,
               p.tool_stretch_mean, r.tool_start_ms);
  } else {
    fmt::print(out, "  simulated  (no prediction: {})\n", r.prediction_error);
  }
}

// ---- compare -------------------------------------------------------------------

namespace {

struct Loaded {
  std::string path;
  ordered_json doc;
  std::string label;  // the policy
  const ordered_json& run() const { return doc["runs"][0]; }
  const ordered_json& metrics() const { return doc["runs"][0]["metrics"]; }
  const ordered_json& tb() const { return doc["testbed"]; }
  bool has_prediction() const { return doc.contains("predicted") && doc["predicted"].is_object(); }
  const ordered_json& predicted() const { return doc["predicted"]["runs"][0]["metrics"]; }
};

base::Result<Loaded> load_run(const std::string& path) {
  auto text = sim::read_file(path);
  if (!text) return std::unexpected(std::move(text.error()));
  Loaded l;
  l.path = path;
  l.doc = ordered_json::parse(*text, nullptr, false);
  if (l.doc.is_discarded() || !l.doc.contains("runs") || !l.doc["runs"].is_array() || l.doc["runs"].size() != 1 ||
      !l.doc.contains("testbed") || !l.doc["runs"][0].contains("metrics")) {
    return base::make_error(EINVAL, path + ": not a tandem-agents run file (write one with tandem-agents run --out)");
  }
  l.label = l.doc["runs"][0].value("policy", "?");
  return l;
}

// "v2 cpuacct,freezer /sys/fs/…; v1 cpu /sys/fs/…" without the paths.
std::string hierarchies(const ordered_json& cgroups) {
  if (!cgroups.is_string()) return "off";
  const std::string text = cgroups.get<std::string>();
  std::string out;
  for (std::string_view part : base::split(text, ';', true)) {
    part = base::trim(part);
    if (auto sp = part.rfind(' '); sp != std::string_view::npos && part.substr(sp + 1).starts_with('/')) {
      part = part.substr(0, sp);
    }
    out += (out.empty() ? "" : ", ") + std::string(part);
  }
  return out.empty() ? "off" : out;
}

std::string num(double x) {
  if (!std::isfinite(x)) return "-";
  const double a = std::fabs(x);
  if (a == 0) return "0";
  if (a >= 1e6) return fmt::format("{:.3g}M", x / 1e6);
  if (a >= 1000) return fmt::format("{:.0f}", x);
  if (a >= 100) return fmt::format("{:.1f}", x);
  if (a >= 1) return fmt::format("{:.2f}", x);
  return fmt::format("{:.3g}", x);
}

}  // namespace

base::Result<void> compare_runs(std::FILE* out, std::span<const std::string> inputs, const std::string& json_path,
                                const std::string& sim_json_path, const std::string& plot_path) {
  std::vector<Loaded> runs;
  for (const std::string& p : inputs) {
    auto l = load_run(p);
    if (!l) return std::unexpected(std::move(l.error()));
    runs.push_back(std::move(*l));
  }
  const Loaded& base = runs.front();
  for (const Loaded& l : runs) {
    const auto same = [&](const char* what, const ordered_json& a, const ordered_json& b) -> base::Result<void> {
      if (a != b) {
        return base::make_error(EINVAL, fmt::format("{} and {} are runs of different {} ({} vs {})", base.path, l.path,
                                                    what, a.dump(), b.dump()));
      }
      return {};
    };
    if (auto r = same("workloads", base.doc["workload"], l.doc["workload"]); !r) return r;
    if (auto r = same("presets", base.doc["preset"], l.doc["preset"]); !r) return r;
    if (auto r = same("rates", base.run()["rate"], l.run()["rate"]); !r) return r;
    if (auto r = same("session counts", base.run()["sessions"], l.run()["sessions"]); !r) return r;
    if (auto r = same("compressions", base.tb()["compress"], l.tb()["compress"]); !r) return r;
  }

  // The table: one row per metric; a column per run, the ratio of the last
  // to the first when there are two, then the simulator's prediction per run.
  struct Row {
    std::string name;
    using Get = std::function<double(const ordered_json& metrics, const ordered_json& tb)>;
    Get measured;   // from the run's metrics and testbed records
    Get simulated;  // from the prediction's metrics and the testbed records; null: the simulator has none
  };
  const auto metric = [](const char* key) {
    return [key](const ordered_json& m, const ordered_json&) { return m.value(key, NAN); };
  };
  const auto pct = [](const char* key) {
    return [key](const ordered_json& m, const ordered_json&) { return m.value(key, NAN) * 100; };
  };
  const std::vector<Row> rows = {
      {"sessions completed", metric("completed"), metric("completed")},
      {"E2E mean (s)", metric("e2e_mean_s"), metric("e2e_mean_s")},
      {"E2E p90 (s)", metric("e2e_p90_s"), metric("e2e_p90_s")},
      {"E2E p99 (s)", metric("e2e_p99_s"), metric("e2e_p99_s")},
      {"slowdown mean", metric("slowdown_mean"), metric("slowdown_mean")},
      {"goodput a=3 (sessions/s)", metric("goodput_a3"), metric("goodput_a3")},
      {"throughput (sessions/s)", metric("throughput_sps"), metric("throughput_sps")},
      {"rounds per minute", metric("rounds_per_min"), metric("rounds_per_min")},
      {"TTFT mean (s)", metric("ttft_mean_s"), metric("ttft_mean_s")},
      {"TTFT p99 (s)", metric("ttft_p99_s"), metric("ttft_p99_s")},
      {"KV hit rate (%)", pct("kv_hit_rate"), pct("kv_hit_rate")},
      {"recomputed tokens", metric("recomputed_tokens"), metric("recomputed_tokens")},
      {"preemptions", metric("preemptions"), metric("preemptions")},
      {"GPU busy (%)", pct("gpu_busy"), pct("gpu_busy")},
      {"tool CPU use (%)", pct("tool_cpu_util"), pct("tool_cpu_util")},
      {"mean tool stretch", metric("tool_stretch_mean"), metric("tool_stretch_mean")},
      {"mean tool stretch, calls >= 10 ms wall",
       [](const ordered_json&, const ordered_json& tb) {
         return get_or<double>(tb, {"tools", "stretch_long_mean"}, NAN);
       },
       [](const ordered_json&, const ordered_json& tb) {
         return get_or<double>(tb, {"tools", "predicted_stretch_long_mean"}, NAN);
       }},
      {"peak tool memory, node (MiB)",
       [](const ordered_json&, const ordered_json& tb) {
         return get_or<double>(tb, {"daemon", "peak_tools_memory_bytes"}, NAN) / (1024.0 * 1024.0);
       },
       nullptr},
      {"peak tool memory, one call (MiB)",
       [](const ordered_json&, const ordered_json& tb) {
         return get_or<double>(tb, {"tools", "peak_mb_max"}, NAN);
       },
       nullptr},
      {"tool time stalled at a memory limit (trace s, summed over calls)",
       [](const ordered_json&, const ordered_json& tb) {
         return get_or<double>(tb, {"daemon", "tools_memory_stalled_s"}, NAN) * get_or<double>(tb, {"compress"}, NAN);
       },
       metric("throttled_s")},
      {"memory stall, node PSI some (% of the run)",
       [](const ordered_json&, const ordered_json& tb) {
         return get_or<double>(tb, {"memory_psi", "some_pct"}, NAN);
       },
       metric("mem_psi_some_pct")},
      {"memory stall, node PSI full (% of the run)",
       [](const ordered_json&, const ordered_json& tb) {
         return get_or<double>(tb, {"memory_psi", "full_pct"}, NAN);
       },
       metric("mem_psi_full_pct")},
      {"tool calls killed for memory",
       [](const ordered_json&, const ordered_json& tb) {
         return get_or<double>(tb, {"tools", "memory_kills"}, NAN);
       },
       // the kernel's OOM kills and the rules' stall kills, as live
       [](const ordered_json& m, const ordered_json&) {
         return m.value("oom_kills", NAN) + m.value("memory_kills", 0.0);
       }},
      {"tool call overhead p50 (wall ms)",
       [](const ordered_json&, const ordered_json& tb) {
         return get_or<double>(tb, {"tools", "overhead_ms_p50"}, NAN);
       },
       nullptr},
      {"tool start CPU per call (wall ms; the prediction's start phase)",
       [](const ordered_json&, const ordered_json& tb) { return get_or<double>(tb, {"tool_start_ms"}, NAN); }, nullptr},
      {"makespan (s)", metric("makespan_s"), metric("makespan_s")},
  };
  const bool ratio = runs.size() == 2;
  std::vector<std::string> header = {"metric"};
  for (const Loaded& l : runs) header.push_back(l.label);
  if (ratio) header.push_back(fmt::format("{}/{}", runs[1].label, runs[0].label));
  for (const Loaded& l : runs) header.push_back("sim " + l.label);
  std::vector<std::vector<std::string>> table = {header};
  for (const Row& row : rows) {
    std::vector<std::string> line = {row.name};
    std::vector<double> vals;
    for (const Loaded& l : runs) {
      vals.push_back(row.measured(l.metrics(), l.tb()));
      line.push_back(num(vals.back()));
    }
    if (ratio) {
      line.push_back(vals[0] != 0 && std::isfinite(vals[0]) && std::isfinite(vals[1])
                         ? fmt::format("{:.2f}x", vals[1] / vals[0])
                         : "-");
    }
    for (const Loaded& l : runs) {
      line.push_back(row.simulated && l.has_prediction() ? num(row.simulated(l.predicted(), l.tb())) : "-");
    }
    table.push_back(std::move(line));
  }
  std::vector<std::size_t> width(header.size(), 0);
  for (const auto& line : table) {
    for (std::size_t i = 0; i < line.size(); ++i) width[i] = std::max(width[i], line[i].size());
  }
  const double compress = base.tb().value("compress", 1.0);
  fmt::print(out, "{} sessions of {} at {} sessions/s on {}, compressed {}x (times in trace seconds)\n",
             base.run().value("sessions", 0), base.doc.value("workload", ""), base.run().value("rate", 0.0),
             base.doc.value("preset", ""), compress);
  for (std::size_t r = 0; r < table.size(); ++r) {
    std::string s;
    for (std::size_t i = 0; i < table[r].size(); ++i) {
      s += i == 0 ? fmt::format("{:<{}}", table[r][i], width[i]) : fmt::format("  {:>{}}", table[r][i], width[i]);
    }
    fmt::print(out, "{}\n", s);
    if (r == 0) fmt::print(out, "{}\n", std::string(s.size(), '-'));
  }
  for (const Loaded& l : runs) {
    const ordered_json& tb = l.tb();
    fmt::print(
        out,
        "{}: {} tool calls, {} in a cgroup of their own, {} seen there by the tool itself; tandemd cgroups: {}; "
        "telemetry: {}; engine late by {:.2f} s in all ({:.2f} s not made up) over {:.0f} s of run\n",
        l.label, get_or<std::uint64_t>(tb, {"tools", "calls"}, 0), get_or<std::uint64_t>(tb, {"tools", "placed"}, 0),
        get_or<std::uint64_t>(tb, {"tools", "verified_in_session_cgroup"}, 0),
        hierarchies(get_or<ordered_json>(tb, {"daemon", "cgroups"}, "off")),
        get_or<std::string>(tb, {"daemon", "telemetry_mode"}, "off"), get_or<double>(tb, {"engine", "late_s"}, 0),
        get_or<double>(tb, {"engine", "late_unrecovered_s"}, 0), get_or<double>(tb, {"wall_s"}, 0));
  }

  if (!json_path.empty() || !sim_json_path.empty()) {
    ordered_json measured = {
        {"preset", base.doc["preset"]}, {"workload", base.doc["workload"]}, {"runs", ordered_json::array()}};
    ordered_json simulated = measured;
    ordered_json testbed = ordered_json::object();
    for (const Loaded& l : runs) {
      measured["runs"].push_back(l.run());
      testbed[l.label] = l.tb();
      if (l.has_prediction()) simulated["runs"].push_back(l.doc["predicted"]["runs"][0]);
    }
    measured["testbed"] = std::move(testbed);
    if (!json_path.empty()) {
      if (auto w = sim::write_file_atomic(json_path, measured.dump(2) + "\n", "results"); !w) return w;
    }
    if (!sim_json_path.empty()) {
      if (auto w = sim::write_file_atomic(sim_json_path, simulated.dump(2) + "\n", "predictions"); !w) return w;
    }
  }

  if (!plot_path.empty()) {
    std::map<std::string, std::string> files;
    std::string e2e_plot, ttft_plot;
    const auto add = [&](std::string& plot, const std::string& file, const ordered_json& values, std::size_t color,
                         const std::string& title, bool dashed) {
      std::vector<double> v;
      for (const ordered_json& x : values) v.push_back(x.get<double>());
      std::string data = sim::cdf_data(std::move(v));
      if (data.empty()) return;
      files[file] = std::move(data);
      if (!plot.empty()) plot += ", \\\n     ";
      plot += fmt::format("'{}' using 1:2 with steps lw 2 lc {} {} title '{}'", file, color, dashed ? "dt 2" : "dt 1",
                          title);
    };
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const ordered_json& tb = runs[i].tb();
      add(e2e_plot, fmt::format("e2e{}.dat", i), tb["e2e_s"], i + 1, runs[i].label, false);
      add(e2e_plot, fmt::format("e2e_sim{}.dat", i), tb["predicted_e2e_s"], i + 1, runs[i].label + " (sim)", true);
      add(ttft_plot, fmt::format("ttft{}.dat", i), tb["ttft_s"], i + 1, runs[i].label, false);
      add(ttft_plot, fmt::format("ttft_sim{}.dat", i), tb["predicted_ttft_s"], i + 1, runs[i].label + " (sim)", true);
    }
    if (e2e_plot.empty()) return base::make_error(EINVAL, "write plot to " + plot_path + ": no completed sessions");
    std::string s =
        "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
        "  set terminal pngcairo size 1600,700 noenhanced font ',11'\n"
        "} else {\n"
        "  set terminal png size 1600,700 noenhanced\n"
        "}\n"
        "set output 'plot.png'\nset encoding utf8\nset grid\nset key bottom right\nset yrange [0:1.02]\n";
    s += fmt::format(
        "set multiplot layout 1,2 title '{} sessions of {} at {}/s, {}, compressed {}x: live (solid), "
        "tandem-sim (dashed)'\n",
        base.run().value("sessions", 0), base.doc.value("workload", ""), base.run().value("rate", 0.0),
        base.doc.value("preset", ""), compress);
    s += "set title 'Session E2E latency CDF'\nset xlabel 'E2E (trace s)'\nset ylabel 'fraction of sessions'\n";
    s += "plot " + e2e_plot + "\n";
    s += "set title 'Round TTFT CDF'\nset xlabel 'TTFT (trace s, log)'\nset ylabel 'fraction of rounds'\n"
         "set logscale x\n";
    s += ttft_plot.empty() ? "plot 2 notitle\n" : "plot " + ttft_plot + "\n";
    s += "unset multiplot\nset output\n";
    if (auto r = sim::render_gnuplot(s, files, plot_path); !r) return r;
  }
  return {};
}

}  // namespace tandem::testbed
