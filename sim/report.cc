// The output of tandem-sim: a fixed-width table for people, JSON and CSV for
// tools, and a gnuplot PNG.
//
// JSON and CSV share one list of metric fields (metric_fields), so the two
// schemas cannot drift apart. Files are written to "<path>.tmp" and renamed
// over <path>, so a reader never sees half a report. The plot runs gnuplot as
// a child (posix_spawnp, no shell) in a private mkdtemp directory that holds
// the script, the data and the PNG; no user-supplied path is ever spliced into
// the script — the PNG is copied to its destination afterwards — and the only
// user strings that reach gnuplot (titles, labels) are single-quoted with
// quotes doubled, under a noenhanced terminal so "_" and "^" stay literal.
#include "sim/report.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <numeric>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/unique_fd.h"

extern char** environ;  // POSIX; passed to the child as its environment

namespace tandem::sim {
namespace {

// ---------------------------------------------------------------------------
// Files.

base::Result<void> write_all(int fd, std::string_view data, const std::string& what) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return base::errno_error("write " + what);
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

// Creates or truncates `path` and writes `data` to it.
base::Result<void> write_file(const std::string& path, std::string_view data) {
  base::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) return base::errno_error("open " + path);
  if (auto r = write_all(fd.get(), data, path); !r) return r;
  // close() is where some filesystems (NFS) report a failed write.
  if (::close(fd.release()) != 0) return base::errno_error("close " + path);
  return {};
}

}  // namespace

base::Result<void> write_file_atomic(const std::string& path, std::string_view data, std::string_view what) {
  const std::string outer = fmt::format("write {} to {}", what, path);
  const std::string tmp = path + ".tmp";
  if (auto r = write_file(tmp, data); !r) {
    ::unlink(tmp.c_str());
    return base::propagate(std::move(r.error()), outer);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    auto err = base::errno_error(fmt::format("rename {} to {}", tmp, path));
    ::unlink(tmp.c_str());
    return base::propagate(std::move(err.error()), outer);
  }
  return {};
}

base::Result<std::string> read_file(const std::string& path) {
  base::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return base::errno_error("open " + path);
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return base::errno_error("read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

namespace {

// ---------------------------------------------------------------------------
// The metric fields of JSON and CSV, in schema order.

using Number = std::variant<double, std::uint64_t>;

std::vector<std::pair<std::string_view, Number>> metric_fields(const Metrics& m) {
  return {
      {"e2e_mean_s", m.e2e_mean_s},
      {"e2e_p50_s", m.e2e_p50_s},
      {"e2e_p90_s", m.e2e_p90_s},
      {"e2e_p99_s", m.e2e_p99_s},
      {"slowdown_mean", m.slowdown_mean},
      {"goodput_a1", m.goodput_a1},
      {"goodput_a2", m.goodput_a2},
      {"goodput_a3", m.goodput_a3},
      {"throughput_sps", m.throughput_sps},
      {"rounds_per_min", m.rounds_per_min},
      {"tokens_per_s", m.tokens_per_s},
      {"ttft_mean_s", m.ttft_mean_s},
      {"ttft_p99_s", m.ttft_p99_s},
      {"kv_hit_rate", m.kv_hit_rate},
      {"recomputed_tokens", m.recomputed_tokens},
      {"resume_recomputed_tokens", m.resume_recomputed_tokens},
      {"preemptions", m.preemptions},
      {"swaps", m.swaps},
      {"pinned_block_seconds", m.pinned_block_seconds},
      {"kv_waste_block_s", m.kv_waste_block_s},
      {"host_peak_blocks", m.host_peak_blocks},
      {"gpu_busy", m.gpu_busy},
      {"tool_cpu_util", m.tool_cpu_util},
      {"tool_stretch_mean", m.tool_stretch_mean},
      {"makespan_s", m.makespan_s},
      {"capped_rounds", m.capped_rounds},
      {"completed", static_cast<std::uint64_t>(m.sessions)},
  };
}

// Host memory's fields follow, only when the run modelled it: without it the
// output is what it was before host memory existed.
std::vector<std::pair<std::string_view, Number>> all_metric_fields(const Metrics& m) {
  auto v = metric_fields(m);
  // A cluster's fields, only for one: a node alone writes what it always did.
  auto cluster = [&] {
    if (m.nodes == 0) return;
    v.insert(
        v.end(),
        {{"nodes", std::uint64_t{m.nodes}}, {"moved_sessions", m.moved_sessions}, {"session_moves", m.session_moves}});
  };
  if (!m.host_memory) {
    cluster();
    return v;
  }
  v.insert(v.end(), {{"oom_kills", m.oom_kills},
                     {"oom_kills_over_host", m.oom_kills_over_host},
                     {"oom_kills_over_room", m.oom_kills_over_room},
                     {"memory_kills", m.memory_kills},
                     {"rerun_tool_s", m.rerun_tool_s},
                     {"frozen_s", m.frozen_s},
                     {"throttled_s", m.throttled_s},
                     {"stranded_block_s", m.stranded_block_s},
                     {"host_mem_peak_gib", m.host_mem_peak_gib},
                     {"mem_psi_some_pct", m.mem_psi_some_pct},
                     {"mem_psi_full_pct", m.mem_psi_full_pct}});
  cluster();
  return v;
}

// ---------------------------------------------------------------------------
// Table formatting.

// About three significant digits without an exponent where that reads well:
// 1234, 12.3, 0.500, 0.0523.
std::string compact(double x) {
  if (x == 0.0) return "0";
  if (!std::isfinite(x)) return fmt::format("{}", x);
  double a = std::fabs(x);
  if (a >= 1e7 || a < 1e-4) return fmt::format("{:.3g}", x);
  int magnitude = static_cast<int>(std::floor(std::log10(a)));
  int decimals = std::clamp(2 - magnitude, 0, 4);
  return fmt::format("{:.{}f}", x, decimals);
}

// 950, 12.3k, 4.56M, 7.89G.
std::string with_suffix(double x) {
  double a = std::fabs(x);
  if (!std::isfinite(x)) return fmt::format("{}", x);
  if (a < 1e3) return x == std::floor(x) ? fmt::format("{:.0f}", x) : fmt::format("{:.1f}", x);
  if (a < 1e6) return fmt::format("{:.1f}k", x / 1e3);
  if (a < 1e9) return fmt::format("{:.2f}M", x / 1e6);
  return fmt::format("{:.2f}G", x / 1e9);
}

std::string percent(double fraction) { return fmt::format("{:.1f}", fraction * 100.0); }

struct Table {
  std::vector<std::string> headers;
  std::size_t left_columns = 1;  // the first columns are left-aligned (the label)
  std::vector<std::vector<std::string>> rows;
  std::vector<bool> group_start;  // a blank line goes before this row
};

void print(std::ostream& os, const Table& t) {
  std::vector<std::size_t> width(t.headers.size());
  for (std::size_t c = 0; c < t.headers.size(); ++c) width[c] = t.headers[c].size();
  for (const auto& row : t.rows) {
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      if (c > 0) out += "  ";
      out += c < t.left_columns ? fmt::format("{:<{}}", cells[c], width[c]) : fmt::format("{:>{}}", cells[c], width[c]);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    os << out << '\n';
  };
  line(t.headers);
  std::size_t total = 0;
  for (std::size_t w : width) total += w;
  total += 2 * (width.empty() ? 0 : width.size() - 1);
  os << std::string(total, '-') << '\n';
  for (std::size_t r = 0; r < t.rows.size(); ++r) {
    if (r > 0 && t.group_start[r]) os << '\n';
    line(t.rows[r]);
  }
}

// Run indices by rate ascending, runs at one rate in the order they appear.
std::vector<std::size_t> order_by_rate(const std::vector<Run>& runs) {
  std::vector<std::size_t> idx(runs.size());
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  // The index breaks ties, so std::sort gives the stable order (stable_sort
  // trips a deprecation warning in libstdc++ 12 under clang).
  std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
    if (runs[a].rate != runs[b].rate) return runs[a].rate < runs[b].rate;
    return a < b;
  });
  return idx;
}

// ---------------------------------------------------------------------------
// CSV.

std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

std::string csv_number(double x) { return fmt::format("{:.9g}", x); }

// ---------------------------------------------------------------------------
// gnuplot.

// A gnuplot single-quoted string: only '' is special inside one; control
// characters would end the command, so they become spaces.
std::string gp_quote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "''";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += ' ';
    } else {
      out += c;
    }
  }
  out += '\'';
  return out;
}

// %.17g: the data files round-trip every double exactly.
std::string gp_number(double x) { return fmt::format("{:.17g}", x); }

// Thread-safety: owns a directory; not shared.
class ScratchDir {
 public:
  static base::Result<ScratchDir> create() {
    std::error_code ec;
    std::filesystem::path base = std::filesystem::temp_directory_path(ec);
    if (ec) base = "/tmp";
    std::string templ = (base / "tandem-plot-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) return base::errno_error("mkdtemp " + templ);
    return ScratchDir(std::move(templ));
  }
  ScratchDir(ScratchDir&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  ScratchDir& operator=(ScratchDir&&) = delete;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);  // best effort: nothing to report it to
  }

  const std::string& path() const { return path_; }
  std::string file(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// The last `max` bytes of `s`, trimmed, on one line.
std::string tail(std::string s, std::size_t max) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.size() > max) s = "..." + s.substr(s.size() - max);
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

// Runs `gnuplot <script>` with `dir` as its working directory, stdin from
// /dev/null and stdout/stderr into files there.
base::Result<void> run_gnuplot(const ScratchDir& dir, const char* script) {
  posix_spawn_file_actions_t actions;
  if (int rc = posix_spawn_file_actions_init(&actions); rc != 0) return base::make_error(rc, "spawn gnuplot");
  int rc = posix_spawn_file_actions_addchdir_np(&actions, dir.path().c_str());
  if (rc == 0) rc = posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (rc == 0) rc = posix_spawn_file_actions_addopen(&actions, 1, "gnuplot.out", O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (rc == 0) rc = posix_spawn_file_actions_addopen(&actions, 2, "gnuplot.err", O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = -1;
  if (rc == 0) {
    std::string arg0 = "gnuplot";
    std::string arg1 = script;
    char* argv[] = {arg0.data(), arg1.data(), nullptr};
    rc = posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  }
  posix_spawn_file_actions_destroy(&actions);
  if (rc == ENOENT) return base::make_error(ENOENT, "gnuplot not found in PATH (install gnuplot-nox)");
  if (rc != 0) return base::make_error(rc, "spawn gnuplot");

  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return base::errno_error("wait for gnuplot");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  std::string detail = WIFEXITED(status) ? fmt::format("gnuplot exited with status {}", WEXITSTATUS(status))
                                         : fmt::format("gnuplot killed by signal {}", WTERMSIG(status));
  if (auto err = read_file(dir.file("gnuplot.err")); err && !err->empty()) detail += ": " + tail(*err, 600);
  return base::make_error(EIO, detail);
}

struct PlotData {
  std::vector<std::string> labels;            // first-appearance order
  std::vector<std::vector<const Run*>> runs;  // per label, by rate ascending
  double max_rate = 0.0;
};

PlotData collect(const Report& report) {
  PlotData d;
  std::map<std::string, std::size_t> index;
  for (const Run& run : report.runs) {
    auto [it, inserted] = index.try_emplace(run_label(run), d.labels.size());
    if (inserted) d.labels.push_back(it->first);
  }
  d.runs.resize(d.labels.size());
  d.max_rate = report.runs.front().rate;
  for (std::size_t i : order_by_rate(report.runs)) {
    const Run& run = report.runs[i];
    d.runs[index.at(run_label(run))].push_back(&run);
    d.max_rate = std::max(d.max_rate, run.rate);
  }
  return d;
}

// Whether positive values spanning more than 20× call for a log axis (only
// when every value is positive: log scales drop the others).
bool wants_log(const std::vector<double>& values) {
  if (values.empty()) return false;
  double lo = values.front(), hi = values.front();
  for (double v : values) {
    if (!(v > 0.0) || !std::isfinite(v)) return false;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  return hi / lo > 20.0;
}

// The gnuplot script of write_plot; its data files go into `files`.
std::string plot_script(const Report& report, std::map<std::string, std::string>& files) {
  PlotData d = collect(report);
  const std::string context = fmt::format("preset {}, workload {}", report.preset, report.workload);

  std::vector<double> means;
  double min_rate = d.max_rate;
  for (const Run& run : report.runs) {
    means.push_back(run.metrics.e2e_mean_s);
    min_rate = std::min(min_rate, run.rate);
  }

  // Per label: "rate e2e_mean goodput_a3" by rate (means over seeds); the E2E
  // CDF at the top rate (every seed's sessions together).
  const std::vector<Summary> summaries = summarize(report);
  std::vector<bool> has_cdf(d.labels.size(), false);
  std::vector<double> all_e2e;
  for (std::size_t l = 0; l < d.labels.size(); ++l) {
    std::string series;
    std::vector<double> e2e;
    for (const Summary& sm : summaries) {
      if (sm.policy + sm.variant != d.labels[l] || sm.runs.empty()) continue;
      series += fmt::format("{} {} {}\n", gp_number(sm.rate), gp_number(sm.stat("e2e_mean_s").mean),
                            gp_number(sm.stat("goodput_a3").mean));
      if (sm.rate == d.max_rate) {
        for (const Run* run : sm.runs) {
          for (double v : run->e2e_s) {
            if (std::isfinite(v)) e2e.push_back(v);
          }
        }
      }
    }
    files[fmt::format("series{}.dat", l)] = std::move(series);
    std::sort(e2e.begin(), e2e.end());
    if (e2e.empty()) continue;
    has_cdf[l] = true;
    files[fmt::format("cdf{}.dat", l)] = cdf_data(e2e);
    all_e2e.insert(all_e2e.end(), e2e.begin(), e2e.end());
  }

  std::string s;
  s += "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
       "  set terminal pngcairo size 1600,1000 noenhanced font ',11'\n"
       "} else {\n"
       "  set terminal png size 1600,1000 noenhanced\n"
       "}\n"
       "set output 'plot.png'\n"
       "set encoding utf8\n";
  s += fmt::format("set multiplot title {}\n", gp_quote("tandem-sim: " + context));
  s += "set grid\nset key top left\n";

  // One rate: an explicit x range around it, as gnuplot cannot autoscale an
  // empty range without complaint.
  std::string xrange = "set autoscale x\nset offsets graph 0.03, graph 0.03, graph 0.05, 0\n";
  if (min_rate == d.max_rate) {
    double r = d.max_rate;
    double pad = r != 0.0 ? std::fabs(r) * 0.5 : 1.0;
    xrange =
        fmt::format("set offsets 0, 0, graph 0.05, 0\nset xrange [{}:{}]\n", gp_number(r - pad), gp_number(r + pad));
  }

  auto rate_panel = [&](const char* title, const char* ylabel, int column) {
    std::string p = xrange;
    p += fmt::format("set title {}\n", gp_quote(std::string(title) + " (" + context + ")"));
    p += "set xlabel 'offered rate (sessions/s)'\n";
    p += fmt::format("set ylabel {}\n", gp_quote(ylabel));
    p += "plot ";
    for (std::size_t l = 0; l < d.labels.size(); ++l) {
      if (l > 0) p += ", \\\n     ";
      // linecolor by label index: one colour per label in every panel.
      p += fmt::format("'series{}.dat' using 1:{} with linespoints lw 2 pt 7 ps 1.3 lc {} title {}", l, column, l + 1,
                       gp_quote(d.labels[l]));
    }
    p += "\n";
    return p;
  };

  // Panel 1: mean E2E vs rate, top left.
  s += "set size 0.5,0.47\nset origin 0,0.48\n";
  s += wants_log(means) ? "set logscale y\n" : "unset logscale y\nset yrange [0:*]\n";
  s += rate_panel("Mean E2E latency vs offered rate", "mean E2E (s)", 2);

  // Panel 2: goodput α = 3 vs rate, top right.
  s += "set size 0.5,0.47\nset origin 0.5,0.48\nunset logscale y\nset yrange [0:*]\n";
  s += rate_panel("Goodput (E2E <= 3 x ideal) vs offered rate", "goodput (sessions/s)", 3);

  // Panel 3: E2E CDF at the highest rate, bottom, full width.
  s += "set size 1,0.48\nset origin 0,0\nset offsets 0, 0, 0, 0\nunset logscale y\nset yrange [0:1.02]\n";
  s += "set autoscale x\nset key bottom right\n";
  s += wants_log(all_e2e) ? "set logscale x\n" : "unset logscale x\n";
  s += fmt::format("set title {}\n",
                   gp_quote(fmt::format("E2E latency CDF at {} sessions/s ({})", compact(d.max_rate), context)));
  s += "set xlabel 'E2E latency (s)'\nset ylabel 'fraction of sessions'\n";
  bool any_cdf = std::find(has_cdf.begin(), has_cdf.end(), true) != has_cdf.end();
  if (!any_cdf) {
    // Nothing completed at the top rate: an empty frame that says so.
    s += "unset logscale x\nset xrange [0:1]\n";
    s += "set label 1 'no completed sessions' at graph 0.5,0.5 center\n";
    s += "plot 2 notitle\n";
  } else {
    s += "plot ";
    bool first = true;
    for (std::size_t l = 0; l < d.labels.size(); ++l) {
      if (!has_cdf[l]) continue;
      if (!first) s += ", \\\n     ";
      first = false;
      s += fmt::format("'cdf{}.dat' using 1:2 with steps lw 2 lc {} title {}", l, l + 1, gp_quote(d.labels[l]));
    }
    s += "\n";
  }
  s += "unset multiplot\nset output\n";
  return s;
}

// "12.3 ± 0.4", or the value alone when there is no spread to show.
std::string pm(const Stat& s, std::string (*f)(double)) {
  if (s.half == 0.0) return f(s.mean);
  return f(s.mean) + " ± " + f(s.half);
}

}  // namespace

void print_summary_table(std::ostream& os, const Report& report);

std::string run_label(const Run& run) { return run.policy + run.variant; }

double t95(std::size_t dof) {
  // Two-sided 95 % quantiles of Student's t, 1 to 30 degrees of freedom.
  static constexpr double kT[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                  2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                  2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (dof == 0) return 0.0;
  return dof <= std::size(kT) ? kT[dof - 1] : 1.96;
}

Stat stat_of(std::span<const double> values) {
  Stat s;
  s.n = values.size();
  if (s.n == 0) return s;
  double sum = 0.0;
  for (double v : values) sum += v;
  s.mean = sum / static_cast<double>(s.n);
  if (s.n < 2 || !std::isfinite(s.mean)) return s;
  double ss = 0.0;
  for (double v : values) ss += (v - s.mean) * (v - s.mean);
  const double sd = std::sqrt(ss / static_cast<double>(s.n - 1));
  s.half = t95(s.n - 1) * sd / std::sqrt(static_cast<double>(s.n));
  return s;
}

double metric_value(const Metrics& m, std::string_view key) {
  for (const auto& [k, v] : all_metric_fields(m)) {
    if (k == key) return std::visit([](auto x) { return static_cast<double>(x); }, v);
  }
  return 0.0;
}

std::vector<std::string_view> metric_keys(bool host_memory, bool cluster) {
  Metrics m;
  m.host_memory = host_memory;
  m.nodes = cluster ? 2 : 0;
  std::vector<std::string_view> keys;
  for (const auto& field : all_metric_fields(m)) keys.push_back(field.first);
  return keys;
}

bool models_host_memory(const Report& report) {
  return std::any_of(report.runs.begin(), report.runs.end(), [](const Run& r) { return r.metrics.host_memory; });
}

bool models_cluster(const Report& report) {
  return std::any_of(report.runs.begin(), report.runs.end(), [](const Run& r) { return r.nodes > 0; });
}

Stat Summary::stat(std::string_view key) const {
  std::vector<double> v;
  v.reserve(runs.size());
  for (const Run* r : runs) v.push_back(metric_value(r->metrics, key));
  return stat_of(v);
}

std::vector<Summary> summarize(const Report& report) {
  std::vector<Summary> out;
  std::map<std::pair<double, std::string>, std::size_t> index;
  std::vector<std::string> labels;  // first-appearance order
  std::map<std::string, std::size_t> label_rank;
  auto rank = [&](const std::string& label) {
    auto [it, inserted] = label_rank.try_emplace(label, label_rank.size());
    return it->second;
  };
  auto entry = [&](const std::string& policy, const std::string& variant, double rate) -> Summary& {
    auto [it, inserted] = index.try_emplace({rate, policy + variant}, out.size());
    if (inserted) {
      Summary s;
      s.policy = policy;
      s.variant = variant;
      s.rate = rate;
      out.push_back(std::move(s));
    }
    return out[it->second];
  };
  for (const Run& r : report.runs) {
    rank(run_label(r));
    Summary& s = entry(r.policy, r.variant, r.rate);
    s.sessions = r.sessions;
    s.runs.push_back(&r);
  }
  for (const FailedRun& f : report.failed) {
    rank(f.policy + f.variant);
    entry(f.policy, f.variant, f.rate).failed.push_back(f.seed);
  }
  for (Summary& s : out) {
    std::sort(s.runs.begin(), s.runs.end(), [](const Run* a, const Run* b) { return a->seed < b->seed; });
    std::sort(s.failed.begin(), s.failed.end());
  }
  std::sort(out.begin(), out.end(), [&](const Summary& a, const Summary& b) {
    if (a.rate != b.rate) return a.rate < b.rate;
    return label_rank.at(a.policy + a.variant) < label_rank.at(b.policy + b.variant);
  });
  return out;
}

std::size_t seed_count(const Report& report) {
  std::vector<std::uint64_t> seeds;
  seeds.reserve(report.runs.size() + report.failed.size());
  for (const Run& r : report.runs) seeds.push_back(r.seed);
  for (const FailedRun& f : report.failed) seeds.push_back(f.seed);
  std::sort(seeds.begin(), seeds.end());
  return static_cast<std::size_t>(std::unique(seeds.begin(), seeds.end()) - seeds.begin());
}

void print_summary_table(std::ostream& os, const Report& report) {
  const std::vector<Summary> summaries = summarize(report);
  Table latency;
  latency.headers = {"label",  "rate", "seeds",    "e2e mean",   "e2e p99", "slowdown",    "gp a=3",
                     "sess/s", "ttft", "kv hit %", "recomputed", "preempt", "pinned blk-s"};
  auto pct = [](double f) { return fmt::format("{:.1f}", f * 100.0); };
  auto two = [](double f) { return fmt::format("{:.2f}", f); };
  for (std::size_t k = 0; k < summaries.size(); ++k) {
    const Summary& s = summaries[k];
    const bool group_start = k == 0 || s.rate != summaries[k - 1].rate;
    std::string label = s.policy + s.variant;
    std::string seeds = fmt::format("{}", s.runs.size());
    if (!s.failed.empty()) seeds += fmt::format(" ({} failed)", s.failed.size());
    if (s.runs.empty()) {
      latency.rows.push_back({label, compact(s.rate), seeds, "failed", "", "", "", "", "", "", "", "", ""});
    } else {
      latency.rows.push_back({label, compact(s.rate), seeds, pm(s.stat("e2e_mean_s"), compact),
                              compact(s.stat("e2e_p99_s").mean), pm(s.stat("slowdown_mean"), two),
                              pm(s.stat("goodput_a3"), compact), pm(s.stat("throughput_sps"), compact),
                              compact(s.stat("ttft_mean_s").mean), pct(s.stat("kv_hit_rate").mean),
                              with_suffix(s.stat("recomputed_tokens").mean), with_suffix(s.stat("preemptions").mean),
                              with_suffix(s.stat("pinned_block_seconds").mean)});
    }
    latency.group_start.push_back(group_start);
  }
  os << fmt::format(
      "\nMean over {} seeds ± the half-width of the 95 % interval (times in s; rate, goodput, throughput in "
      "sessions/s; gp a=3: sessions with E2E <= 3 x ideal; later columns: means)\n",
      seed_count(report));
  print(os, latency);
}

namespace {

// Host memory, one line per label and rate (means over the seeds); only when
// the runs modelled it.
void print_memory_table(std::ostream& os, const Report& report) {
  if (!models_host_memory(report)) return;
  const std::vector<Summary> summaries = summarize(report);
  Table t;
  t.headers = {"label",   "rate",           "oom kills", "mem kills",  "rerun tool s", "frozen s",
               "stall s", "stranded blk-s", "peak GiB",  "psi some %", "psi full %"};
  for (std::size_t k = 0; k < summaries.size(); ++k) {
    const Summary& s = summaries[k];
    if (s.runs.empty()) continue;
    auto mean = [&](std::string_view key) { return s.stat(key).mean; };
    t.rows.push_back({s.policy + s.variant, compact(s.rate), pm(s.stat("oom_kills"), compact),
                      compact(mean("memory_kills")), compact(mean("rerun_tool_s")), compact(mean("frozen_s")),
                      compact(mean("throttled_s")), with_suffix(mean("stranded_block_s")),
                      compact(mean("host_mem_peak_gib")), fmt::format("{:.2f}", mean("mem_psi_some_pct")),
                      fmt::format("{:.2f}", mean("mem_psi_full_pct"))});
    t.group_start.push_back(k == 0 || s.rate != summaries[k - 1].rate);
  }
  os << "\nHost memory (means over seeds; oom kills: the kernel's, mem kills: the host rule's; stall: tool "
        "seconds stalled on memory; stranded: pinned KV block-seconds behind frozen or stalled tools; psi: share "
        "of the makespan)\n";
  print(os, t);
}

void print_table_inner(std::ostream& os, const Report& report) {
  os << fmt::format("tandem-sim  preset {}  workload {}  ({} run{})\n", report.preset, report.workload,
                    report.runs.size(), report.runs.size() == 1 ? "" : "s");
  if (report.runs.empty()) return;
  if (seed_count(report) > 1) {
    print_summary_table(os, report);
    return;
  }

  Table latency;
  latency.headers = {"label",  "rate",   "done",   "e2e mean", "e2e p50", "e2e p90",   "e2e p99", "slowdown",
                     "gp a=1", "gp a=2", "gp a=3", "sess/s",   "rnd/min", "ttft mean", "ttft p99"};
  Table resources;
  resources.headers = {"label",      "rate",       "kv hit %", "recomputed", "preempt", "pinned blk-s",
                       "gpu busy %", "tool cpu %", "stretch",  "makespan",   "capped",  "wall s"};

  const std::vector<std::size_t> order = order_by_rate(report.runs);
  for (std::size_t k = 0; k < order.size(); ++k) {
    const Run& run = report.runs[order[k]];
    const Metrics& m = run.metrics;
    bool group_start = k == 0 || run.rate != report.runs[order[k - 1]].rate;
    std::string label = run_label(run);
    if (label.empty()) label = "(none)";
    latency.rows.push_back({label, compact(run.rate), fmt::format("{}/{}", m.sessions, run.sessions),
                            compact(m.e2e_mean_s), compact(m.e2e_p50_s), compact(m.e2e_p90_s), compact(m.e2e_p99_s),
                            fmt::format("{:.2f}", m.slowdown_mean), compact(m.goodput_a1), compact(m.goodput_a2),
                            compact(m.goodput_a3), compact(m.throughput_sps), compact(m.rounds_per_min),
                            compact(m.ttft_mean_s), compact(m.ttft_p99_s)});
    latency.group_start.push_back(group_start);
    resources.rows.push_back(
        {label, compact(run.rate), percent(m.kv_hit_rate), with_suffix(static_cast<double>(m.recomputed_tokens)),
         fmt::format("{}", m.preemptions), with_suffix(m.pinned_block_seconds), percent(m.gpu_busy),
         percent(m.tool_cpu_util), m.tool_stretch_mean > 0.0 ? fmt::format("{:.2f}", m.tool_stretch_mean) : "-",
         compact(m.makespan_s), fmt::format("{}", m.capped_rounds), fmt::format("{:.2f}", run.wall_s)});
    resources.group_start.push_back(group_start);
  }

  os << "\nLatency and goodput (times in s; rate, goodput, throughput in sessions/s;"
        " gp a=N: sessions with E2E <= N x ideal)\n";
  print(os, latency);
  os << "\nResources (recomputed in tokens; stretch: tool wall / nominal, mean; makespan in s)\n";
  print(os, resources);
}

}  // namespace

void print_table(std::ostream& os, const Report& report) {
  print_table_inner(os, report);
  print_memory_table(os, report);
  if (models_cluster(report)) print_cluster_table(os, report);
}

void print_cluster_table(std::ostream& os, const Report& report) {
  std::vector<Summary> rows = summarize(report);
  std::erase_if(rows, [](const Summary& s) { return s.runs.empty() || s.runs.front()->nodes == 0; });
  if (rows.empty()) return;
  std::map<std::string, std::size_t> policy_rank;
  for (const Summary& s : rows) policy_rank.try_emplace(s.policy, policy_rank.size());
  std::map<std::string, std::size_t> router_rank;  // first appearance (the order they were asked for)
  for (const Run& r : report.runs) router_rank.try_emplace(r.router, router_rank.size());
  auto key = [&](const Summary& s) {
    const Run& r = *s.runs.front();
    return std::make_tuple(policy_rank.at(s.policy), s.variant.substr(0, s.variant.find('@')), r.nodes, s.rate,
                           router_rank.at(r.router));
  };
  // Sorted by key, ties in their first order: the index makes the order
  // total, so std::sort gives std::stable_sort's (which libstdc++ 12 builds
  // on a deprecated API).
  std::vector<std::size_t> order(rows.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::make_tuple(key(rows[a]), a) < std::make_tuple(key(rows[b]), b);
  });
  std::vector<Summary> sorted;
  sorted.reserve(rows.size());
  for (std::size_t i : order) sorted.push_back(std::move(rows[i]));
  rows = std::move(sorted);
  Table t;
  t.headers = {"policy", "router", "nodes",    "rate/node",  "sessions", "e2e mean", "e2e p90",
               "gp a=1", "gp a=3", "kv hit %", "recomputed", "moved",    "moves"};
  t.left_columns = 2;
  const std::size_t seeds = seed_count(report);
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const Summary& s = rows[k];
    const Run& r = *s.runs.front();
    const std::string policy = s.policy + s.variant.substr(0, s.variant.find('@'));
    t.rows.push_back({policy, r.router, fmt::format("{}", r.nodes), compact(s.rate), fmt::format("{}", s.sessions),
                      compact(s.stat("e2e_mean_s").mean), compact(s.stat("e2e_p90_s").mean),
                      compact(s.stat("goodput_a1").mean), compact(s.stat("goodput_a3").mean),
                      percent(s.stat("kv_hit_rate").mean), with_suffix(s.stat("recomputed_tokens").mean),
                      compact(s.stat("moved_sessions").mean), compact(s.stat("session_moves").mean)});
    // A blank line between groups of routers (policy, nodes, rate).
    auto group = [&](const Summary& x) {
      auto [p, v, nodes, rate, router] = key(x);
      return std::make_tuple(p, v, nodes, rate);
    };
    t.group_start.push_back(k == 0 || group(rows[k - 1]) != group(s));
  }
  os << "\nCluster (rate per node; sessions in all; times in s; goodput in sessions/s; kv hit: prompt tokens served "
        "from cache / prompt tokens; moved: sessions a router moved, moves: their moves"
     << (seeds > 1 ? fmt::format("; means over {} seeds", seeds) : std::string()) << ")\n";
  print(os, t);
}

std::string report_json(const Report& report) {
  // ordered_json keeps the documented key order, which makes diffs readable.
  nlohmann::ordered_json doc;
  doc["preset"] = report.preset;
  doc["workload"] = report.workload;
  doc["runs"] = nlohmann::ordered_json::array();
  for (const Run& run : report.runs) {
    nlohmann::ordered_json metrics = nlohmann::ordered_json::object();
    for (const auto& [key, value] : all_metric_fields(run.metrics)) {
      std::visit([&, k = key](auto v) { metrics[std::string(k)] = v; }, value);
    }
    nlohmann::ordered_json r;
    r["policy"] = run.policy;
    r["variant"] = run.variant;
    r["rate"] = run.rate;
    r["seed"] = run.seed;
    r["sessions"] = static_cast<std::uint64_t>(run.sessions);
    if (run.nodes > 0) {
      r["router"] = run.router;
      r["nodes"] = std::uint64_t{run.nodes};
    }
    r["metrics"] = std::move(metrics);
    r["wall_s"] = run.wall_s;
    doc["runs"].push_back(std::move(r));
  }
  if (!report.failed.empty()) {
    doc["failed"] = nlohmann::ordered_json::array();
    for (const FailedRun& f : report.failed) {
      doc["failed"].push_back(
          {{"policy", f.policy}, {"variant", f.variant}, {"rate", f.rate}, {"seed", f.seed}, {"reason", f.reason}});
    }
  }
  doc["summary"] = nlohmann::ordered_json::array();
  for (const Summary& s : summarize(report)) {
    nlohmann::ordered_json e;
    e["policy"] = s.policy;
    e["variant"] = s.variant;
    e["rate"] = s.rate;
    e["seeds"] = static_cast<std::uint64_t>(s.runs.size());
    e["failed"] = static_cast<std::uint64_t>(s.failed.size());
    nlohmann::ordered_json mean = nlohmann::ordered_json::object();
    nlohmann::ordered_json ci = nlohmann::ordered_json::object();
    for (std::string_view key : metric_keys(models_host_memory(report), models_cluster(report))) {
      const Stat st = s.stat(key);
      mean[std::string(key)] = st.mean;
      ci[std::string(key)] = st.half;
    }
    e["mean"] = std::move(mean);
    e["ci95"] = std::move(ci);
    doc["summary"].push_back(std::move(e));
  }
  // replace: a policy name with invalid UTF-8 must not throw out of here.
  std::string text = doc.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  text += '\n';
  return text;
}

base::Result<void> write_json(const Report& report, const std::string& path) {
  return write_file_atomic(path, report_json(report), "JSON report");
}

base::Result<void> write_csv(const Report& report, const std::string& path) {
  std::string text = "preset,workload,policy,variant,rate,seed,sessions";
  for (std::string_view key : metric_keys(models_host_memory(report), models_cluster(report))) {
    text += ',';
    text += key;
  }
  text += ",wall_s\n";
  for (const Run& run : report.runs) {
    text += fmt::format("{},{},{},{},{},{},{}", csv_field(report.preset), csv_field(report.workload),
                        csv_field(run.policy), csv_field(run.variant), csv_number(run.rate), run.seed, run.sessions);
    for (const auto& field : all_metric_fields(run.metrics)) {
      text += ',';
      text += std::visit(
          [](auto v) {
            if constexpr (std::is_same_v<decltype(v), double>) {
              return csv_number(v);
            } else {
              return fmt::format("{}", v);
            }
          },
          field.second);
    }
    text += ',';
    text += csv_number(run.wall_s);
    text += '\n';
  }
  return write_file_atomic(path, text, "CSV report");
}

base::Result<void> render_gnuplot(const std::string& script, const std::map<std::string, std::string>& files,
                                  const std::string& path) {
  const std::string outer = "write plot to " + path;
  auto dir = ScratchDir::create();
  if (!dir) return base::propagate(std::move(dir.error()), outer);
  for (const auto& [name, text] : files) {
    if (auto r = write_file(dir->file(name), text); !r) return base::propagate(std::move(r.error()), outer);
  }
  if (auto r = write_file(dir->file("plot.gp"), script); !r) return base::propagate(std::move(r.error()), outer);
  if (auto r = run_gnuplot(*dir, "plot.gp"); !r) return base::propagate(std::move(r.error()), outer);
  auto png = read_file(dir->file("plot.png"));
  if (!png) return base::propagate(std::move(png.error()), outer);
  if (png->empty()) return base::make_error(EIO, outer + ": gnuplot wrote an empty image");
  return write_file_atomic(path, *png, "plot");
}

base::Result<void> write_plot(const Report& report, const std::string& path) {
  if (report.runs.empty()) return base::make_error(EINVAL, "write plot to " + path + ": no runs to plot");
  std::map<std::string, std::string> files;
  std::string script = plot_script(report, files);
  return render_gnuplot(script, files, path);
}

std::string cdf_data(std::vector<double> values) {
  std::erase_if(values, [](double v) { return !std::isfinite(v); });
  if (values.empty()) return "";
  std::sort(values.begin(), values.end());
  std::string cdf = fmt::format("{} 0\n", gp_number(values.front()));
  for (std::size_t i = 0; i < values.size(); ++i) {
    cdf += fmt::format("{} {}\n", gp_number(values[i]),
                       gp_number(static_cast<double>(i + 1) / static_cast<double>(values.size())));
  }
  return cdf;
}

}  // namespace tandem::sim
