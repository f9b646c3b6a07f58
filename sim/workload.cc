// Workloads for tandem-sim: the trace parser, the synthetic generators, the
// seeded draw with arrival times and context capping, and the tool CPU table.
//
// Determinism across standard libraries: std::mt19937_64 is specified bit for
// bit by the standard, but the <random> distributions are not (libstdc++ and
// libc++ turn the same engine output into different normals and integers).
// So every distribution here is written out — unbiased integers by rejection,
// normals by Box–Muller, exponentials by inverse CDF — and a seed gives the
// same sessions and arrival times whichever library the simulator is built
// against.
#include "sim/workload.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/parse.h"
#include "base/unique_fd.h"

namespace tandem::sim {
namespace {

using base::make_error;
using base::Result;
using nlohmann::json;

// ---------------------------------------------------------------------------
// Random numbers

// SplitMix64: turns a seed and a stream number into an independent engine
// seed, so the shuffle and the arrival gaps of make_workload() do not share a
// stream (adding sessions to the pool must not shift every arrival time).
std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t z = seed + (stream + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Thread-safety: none; one per generator run.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : gen_(seed) {}

  // Uniform in [0, 1), 53 random bits.
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }

  // Uniform integer in [0, n), n ≥ 1, without modulo bias: draws below
  // 2^64 mod n are rejected so the rest split evenly into n classes.
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t threshold = (std::uint64_t{0} - n) % n;  // (2^64 - n) mod n = 2^64 mod n
    for (;;) {
      std::uint64_t r = gen_();
      if (r >= threshold) return r % n;
    }
  }

  // Uniform integer in [lo, hi].
  std::int64_t between(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(hi - lo) + 1));
  }

  // Standard normal by Box–Muller (one of the pair; the other is dropped so
  // that each call consumes exactly two engine outputs).
  double normal() {
    double u1 = 1.0 - uniform();  // (0, 1]: log() stays finite
    double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

  double lognormal(double median, double sigma) { return median * std::exp(sigma * normal()); }

  // Exponential with the given mean, by inverse CDF.
  double exponential(double mean) { return -mean * std::log(1.0 - uniform()); }

 private:
  std::mt19937_64 gen_;
};

// Rounds and clamps a drawn token count.
std::uint32_t tokens(double x, double lo, double hi) {
  return static_cast<std::uint32_t>(std::lround(std::clamp(x, lo, hi)));
}

// ---------------------------------------------------------------------------
// Trace parsing

// Token counts above this are rejected: the simulator adds them up in 32 bits.
constexpr std::int64_t kMaxTokens = std::numeric_limits<std::int32_t>::max();
constexpr double kMaxToolSeconds = 2147483648.0;  // 2^31 s: beyond any real tool call

// Where a line's errors point.
struct LineRef {
  std::string_view origin;
  std::size_t line;

  std::unexpected<base::Error> error(std::string_view what, std::string_view field) const {
    return make_error(EINVAL, fmt::format("{}:{}: {} (field {})", origin, line, what, field));
  }
  std::unexpected<base::Error> error(std::string_view what) const {
    return make_error(EINVAL, fmt::format("{}:{}: {}", origin, line, what));
  }
};

// An integer member of `round` in [min, kMaxTokens].
Result<std::uint32_t> read_tokens(const json& round, const char* key, std::int64_t min, const std::string& field,
                                  const LineRef& ref) {
  auto it = round.find(key);
  if (it == round.end()) return ref.error("missing", field);
  if (!it->is_number_integer()) return ref.error("not an integer", field);
  if (it->is_number_unsigned()) {
    auto v = it->get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(kMaxTokens)) {
      return ref.error(fmt::format("{} is larger than {}", v, kMaxTokens), field);
    }
    if (static_cast<std::int64_t>(v) < min) return ref.error(fmt::format("{} is less than {}", v, min), field);
    return static_cast<std::uint32_t>(v);
  }
  auto v = it->get<std::int64_t>();
  if (v < min) return ref.error(fmt::format("{} is less than {}", v, min), field);
  if (v > kMaxTokens) return ref.error(fmt::format("{} is larger than {}", v, kMaxTokens), field);
  return static_cast<std::uint32_t>(v);
}

// One round: fills `out` except that a null/empty tool is left empty (the
// caller decides whether that ends the session).
Result<void> read_round(const json& round, std::size_t index, const LineRef& ref, RoundSpec& out) {
  const std::string prefix = fmt::format("rounds[{}]", index);
  if (!round.is_object()) return ref.error("not an object", prefix);

  auto input = read_tokens(round, "input_tokens", 1, prefix + ".input_tokens", ref);
  if (!input) return base::propagate(std::move(input.error()));
  auto output = read_tokens(round, "output_tokens", 0, prefix + ".output_tokens", ref);
  if (!output) return base::propagate(std::move(output.error()));
  out.input_tokens = *input;
  out.output_tokens = std::max<std::uint32_t>(*output, 1);  // a call generates at least one token

  out.tool.clear();
  if (auto it = round.find("tool"); it != round.end() && !it->is_null()) {
    if (!it->is_string()) return ref.error("not a string or null", prefix + ".tool");
    out.tool = it->get<std::string>();
  }

  out.tool_seconds = 0.0;
  if (auto it = round.find("tool_seconds"); it != round.end()) {
    if (!it->is_number()) return ref.error("not a number", prefix + ".tool_seconds");
    double s = it->get<double>();
    if (s < 0) return ref.error(fmt::format("{} is negative", s), prefix + ".tool_seconds");
    if (!(s <= kMaxToolSeconds)) {
      return ref.error(fmt::format("{} is larger than {}", s, kMaxToolSeconds), prefix + ".tool_seconds");
    }
    out.tool_seconds = s;
  }
  return {};
}

// One non-blank line: one session.
Result<SessionSpec> read_session(std::string_view line, const LineRef& ref, TraceStats& stats) {
  json doc;
  try {
    doc = json::parse(line);
  } catch (const json::parse_error& e) {
    return ref.error(fmt::format("not valid JSON (at byte {})", e.byte));
  } catch (const json::exception& e) {  // out_of_range: a number too large for a double (1e999)
    return ref.error(fmt::format("not valid JSON ({})", e.what()));
  }
  if (!doc.is_object()) return ref.error("not a JSON object");

  SessionSpec session;
  if (auto it = doc.find("id"); it != doc.end()) {
    if (!it->is_string()) return ref.error("not a string", "id");
    session.name = it->get<std::string>();
  }
  if (session.name.empty()) session.name = fmt::format("{}:{}", ref.origin, ref.line);
  if (auto it = doc.find("source"); it != doc.end() && !it->is_null()) {
    if (!it->is_string()) return ref.error("not a string or null", "source");
    session.source = it->get<std::string>();
  }

  auto rounds = doc.find("rounds");
  if (rounds == doc.end()) return ref.error("missing", "rounds");
  if (!rounds->is_array()) return ref.error("not an array", "rounds");
  if (rounds->empty()) return ref.error("empty array", "rounds");

  // Every round is checked, even those a mid-session final answer drops: a
  // malformed line is an error wherever the damage is.
  std::vector<RoundSpec> parsed(rounds->size());
  std::size_t i = 0;
  for (const json& round : *rounds) {
    auto ok = read_round(round, i, ref, parsed[i]);
    if (!ok) return base::propagate(std::move(ok.error()));
    ++i;
  }

  // A round without a tool is a final answer: the session ends there.
  std::size_t keep = parsed.size();
  for (std::size_t k = 0; k < parsed.size(); ++k) {
    if (parsed[k].tool.empty()) {
      keep = k + 1;
      break;
    }
  }
  stats.dropped_rounds += parsed.size() - keep;
  parsed.resize(keep);
  // Nothing follows the last round, so its tool (if the trace recorded one
  // that was cut off) is never run.
  parsed.back().tool.clear();
  parsed.back().tool_seconds = 0.0;

  stats.rounds += parsed.size();
  ++stats.sessions;
  session.rounds = std::move(parsed);
  return session;
}

// ---------------------------------------------------------------------------
// Synthetic generators

struct ToolKind {
  std::string_view name;
  std::uint32_t weight;  // relative frequency
};

// An entry of `table` with probability proportional to its `weight`.
template <class T, std::size_t N>
const T& pick(Rng& rng, const std::array<T, N>& table) {
  std::uint64_t total = 0;
  for (const T& e : table) total += e.weight;
  std::uint64_t r = rng.below(total);
  for (const T& e : table) {
    if (r < e.weight) return e;
    r -= e.weight;
  }
  return table.back();  // unreachable: r < total
}

// MARS regimes (see the doc strings below for the numbers).
constexpr std::array<ToolKind, 7> kMarsTools{{
    {"python", 25},
    {"pytest", 15},
    {"pip", 5},
    {"git", 15},
    {"Read", 20},
    {"Edit", 10},
    {"Grep", 10},
}};

std::vector<RoundSpec> mars_session(Rng& rng, bool long_input) {
  const auto n = static_cast<std::size_t>(rng.between(4, 8));
  std::uint32_t input = long_input ? static_cast<std::uint32_t>(rng.between(50000, 100000))
                                   : tokens(rng.lognormal(4096, 0.5), 1024, 16384);
  std::vector<RoundSpec> rounds(n);
  for (std::size_t i = 0; i < n; ++i) {
    RoundSpec& r = rounds[i];
    r.input_tokens = input;
    r.output_tokens = tokens(rng.lognormal(160, 0.6), 50, 500);
    if (i + 1 < n) {
      r.tool = pick(rng, kMarsTools).name;
      r.tool_seconds = std::min(rng.lognormal(0.5, 1.5), 120.0);
    }
    // The next prompt carries this one, the answer and the tool's output.
    input += r.output_tokens + static_cast<std::uint32_t>(rng.between(300, 1500));
  }
  return rounds;
}

std::vector<RoundSpec> mars_short(Rng& rng) { return mars_session(rng, false); }
std::vector<RoundSpec> mars_long(Rng& rng) { return mars_session(rng, true); }
std::vector<RoundSpec> mars_mixed(Rng& rng) { return mars_session(rng, rng.uniform() < 0.2); }

// Agentic: tool kinds with the dev trace's frequencies (its 16 most common
// kinds, 92% of its tool calls, plus Task: sub-agents, its longest calls) and
// per-kind durations fitted to the trace's per-kind median and tail. `shell` marks commands run through a shell whose
// harness timed out at 30 s (the spike at 30.0 s in the trace).
struct AgenticTool {
  std::string_view name;
  std::uint32_t weight;
  double median_s;
  double sigma;
  bool shell;
};
constexpr std::array<AgenticTool, 17> kAgenticTools{{
    {"python", 3010, 0.6, 2.6, true},
    {"Read", 2145, 0.04, 0.75, false},
    {"git", 1625, 0.29, 2.9, true},
    {"TodoWrite", 1398, 0.024, 0.56, false},
    {"Edit", 1225, 0.037, 0.44, false},
    {"pytest", 1190, 1.9, 2.2, true},
    {"Grep", 1128, 0.061, 0.8, false},
    {"cat", 885, 0.015, 2.3, true},
    {"ls", 873, 0.076, 0.64, true},
    {"Write", 704, 0.04, 1.26, false},
    {"pip", 585, 6.9, 1.6, true},
    {"find", 508, 0.14, 1.7, true},
    {"grep", 493, 0.061, 0.84, true},
    {"rm", 243, 1.05, 0.76, true},
    {"Glob", 226, 0.064, 0.69, false},
    {"echo", 213, 0.01, 1.9, true},
    {"Task", 41, 79.0, 0.6, false},
}};

std::vector<RoundSpec> agentic(Rng& rng) {
  const auto n = static_cast<std::size_t>(std::lround(std::clamp(rng.lognormal(36, 0.45), 2.0, 145.0)));
  std::uint32_t input = tokens(rng.lognormal(13000, 0.6), 700, 32768);
  std::vector<RoundSpec> rounds(n);
  for (std::size_t i = 0; i < n; ++i) {
    RoundSpec& r = rounds[i];
    r.input_tokens = input;
    r.output_tokens = tokens(rng.lognormal(120, 1.256), 1, 8192);
    if (i + 1 < n) {
      const AgenticTool& kind = pick(rng, kAgenticTools);
      r.tool = kind.name;
      double s = std::min(rng.lognormal(kind.median_s, kind.sigma), 600.0);
      // Drawn even when unused so every call consumes the same draws.
      bool timed_out = rng.uniform() < 0.8;
      if (kind.shell && s > 30.0 && timed_out) s = 30.0;
      r.tool_seconds = s;
    }
    input += r.output_tokens + tokens(rng.lognormal(300, 1.3), 0, 16384);
  }
  return rounds;
}

// Long contexts with long pauses: interactive coding-agent sessions of the
// kind in the second held-out set (median context about 100k tokens,
// a human's think time between turns with p50 22 s and p90 about 14 min, 38
// rounds per session at p50, tool time p50 8.5 s). A turn ends after a round
// with probability 1/6; the pause that follows is the human ("human", no
// CPU). Every other round is followed by a multi-second tool.
constexpr std::array<ToolKind, 6> kPauseTools{{
    {"python", 30},
    {"pytest", 25},
    {"bash", 15},
    {"git", 10},
    {"npm", 10},
    {"pip", 10},
}};

std::vector<RoundSpec> long_pause(Rng& rng) {
  const auto n = static_cast<std::size_t>(std::lround(std::clamp(rng.lognormal(38, 0.45), 4.0, 145.0)));
  std::uint32_t input = tokens(rng.lognormal(60000, 0.3), 20000, 100000);
  std::vector<RoundSpec> rounds(n);
  for (std::size_t i = 0; i < n; ++i) {
    RoundSpec& r = rounds[i];
    r.input_tokens = input;
    r.output_tokens = tokens(rng.lognormal(200, 1.0), 1, 8192);
    // Drawn for every round so each consumes the same draws.
    const bool turn_ends = rng.uniform() < 1.0 / 6.0;
    const double think = std::min(rng.lognormal(22, 2.84), 3600.0);  // p90 = 22·e^(1.2816·2.84) ≈ 840 s
    const ToolKind& kind = pick(rng, kPauseTools);
    const double tool = std::min(rng.lognormal(8.5, 1.2), 600.0);
    if (i + 1 < n) {
      r.tool = turn_ends ? "human" : std::string(kind.name);
      r.tool_seconds = turn_ends ? think : tool;
    }
    input += r.output_tokens + tokens(rng.lognormal(800, 1.0), 0, 16384);
  }
  return rounds;
}

// MARS's long-input regime (arXiv 2604.26963 §6.1): agent tasks whose
// request-level prompt volume — the prompt tokens of all of a task's LLM
// calls — averages 125K to 263K. Tasks as MARS's replay runs them (at most 8
// rounds, [mars_code] §2.0): rounds uniform in [4, 8], first
// prompt lognormal(median m, sigma 0.6) clamped to [2000, 200000], each later
// prompt = previous prompt + output (lognormal(300, 0.8), [50, 8192]) +
// uniform [500, 3000] tokens of tool output; MARS's tool mix (as mars-short).
// m = 12,200 gives a mean volume of about 125K, m = 31,100 about 263K
// (workload_test checks both within 3 %).
std::vector<RoundSpec> mars_ilr(Rng& rng, double median_first_prompt) {
  const auto n = static_cast<std::size_t>(rng.between(4, 8));
  std::uint32_t input = tokens(rng.lognormal(median_first_prompt, 0.6), 2000, 200000);
  std::vector<RoundSpec> rounds(n);
  for (std::size_t i = 0; i < n; ++i) {
    RoundSpec& r = rounds[i];
    r.input_tokens = input;
    r.output_tokens = tokens(rng.lognormal(300, 0.8), 50, 8192);
    if (i + 1 < n) {
      r.tool = pick(rng, kMarsTools).name;
      r.tool_seconds = std::min(rng.lognormal(0.5, 1.5), 120.0);
    }
    input += r.output_tokens + static_cast<std::uint32_t>(rng.between(500, 3000));
  }
  return rounds;
}
std::vector<RoundSpec> mars_ilr_125k(Rng& rng) { return mars_ilr(rng, 12200); }
std::vector<RoundSpec> mars_ilr_263k(Rng& rng) { return mars_ilr(rng, 31100); }

using Generator = std::vector<RoundSpec> (*)(Rng&);

// The doc strings restate the constants of the generators above: change both together.
constexpr std::array<SyntheticSpec, 8> kSynthetic{{
    {"mars-short",
     "MARS short-input regime. Per session: rounds uniform in [4, 8]; first prompt lognormal(median 4096, "
     "sigma 0.5) tokens clamped to [1024, 16384]; each later prompt = previous prompt + previous output + "
     "uniform [300, 1500] new tokens (tool output); output lognormal(median 160, sigma 0.6) clamped to "
     "[50, 500]; tool after every round but the last, kind drawn from python 25%, pytest 15%, pip 5%, git 15%, "
     "Read 20%, Edit 10%, Grep 10%; tool seconds lognormal(median 0.5, sigma 1.5) capped at 120."},
    {"mars-long", "MARS long-input regime: as mars-short but the first prompt is uniform in [50000, 100000] tokens."},
    {"mars-mixed", "MARS mix: each session is mars-long with probability 0.2, else mars-short."},
    {"agentic",
     "Shaped like the dev trace (agentic_dev.jsonl). Per session: rounds = lognormal(median 36, sigma 0.45) "
     "rounded, clamped to [2, 145] (mean ~40, p90 ~64); first prompt lognormal(median 13000, sigma 0.6) "
     "clamped to [700, 32768]; each later prompt = previous prompt + previous output + lognormal(median 300, "
     "sigma 1.3) new tokens clamped to [0, 16384] (mean ~700); output lognormal(median 120, sigma 1.256) "
     "clamped to [1, 8192] (p90 ~600); after every round but the last a tool, its kind drawn with the trace's "
     "call counts and its seconds lognormal(median, sigma) of that kind, capped at 600 s (kind count median/sigma, "
     "* = shell command): python* 3010 0.6/2.6, Read 2145 0.04/0.75, git* 1625 0.29/2.9, TodoWrite 1398 "
     "0.024/0.56, Edit 1225 0.037/0.44, pytest* 1190 1.9/2.2, Grep 1128 0.061/0.8, cat* 885 0.015/2.3, ls* 873 "
     "0.076/0.64, Write 704 0.04/1.26, pip* 585 6.9/1.6, find* 508 0.14/1.7, grep* 493 0.061/0.84, rm* 243 "
     "1.05/0.76, Glob 226 0.064/0.69, echo* 213 0.01/1.9, Task 41 79/0.6; a shell command past 30 s is cut to "
     "30 s (harness timeout) with probability 0.8. Overall tool seconds: median ~0.07, p90 ~5, p99 ~30, "
     "mean ~3 (trace: 0.08, 7, 30, 2.4)."},
    {"long-pause",
     "Long contexts, long pauses (interactive coding agents; the issue's second held-out set: median context "
     "~100k, human think time p50 22 s / p90 ~14 min, 38 rounds p50, tool p50 8.5 s). Per session: rounds = "
     "lognormal(median 38, sigma 0.45) rounded, clamped to [4, 145]; first prompt lognormal(median 60000, sigma "
     "0.3) clamped to [20000, 100000]; each later prompt = previous prompt + previous output + lognormal(median "
     "800, sigma 1.0) new tokens clamped to [0, 16384]; output lognormal(median 200, sigma 1.0) clamped to [1, "
     "8192]; after every round but the last, with probability 1/6 the turn ends and the human thinks "
     "(kind 'human', no CPU) lognormal(median 22 s, sigma 2.84) capped at 3600 s, else a tool drawn from "
     "python 30%, pytest 25%, bash 15%, git 10%, npm 10%, pip 10% for lognormal(median 8.5 s, sigma 1.2) "
     "capped at 600 s."},
    {"mars-ilr-125k",
     "MARS's long-input regime (arXiv 2604.26963 sec. 6.1) at its low end: mean request-level prompt volume "
     "(prompt tokens of all of a task's calls) ~125K. Per task: rounds uniform in [4, 8]; first prompt "
     "lognormal(median 12200, sigma 0.6) clamped to [2000, 200000]; each later prompt = previous prompt + "
     "output + uniform [500, 3000] tool-output tokens; output lognormal(median 300, sigma 0.8) clamped to "
     "[50, 8192]; tools as mars-short."},
    {"mars-ilr-263k",
     "As mars-ilr-125k at the high end of MARS's range: first prompt median 31100, mean volume ~263K."},
    {"agentic-mem",
     "Memory-heavy agents (issue 22): sessions as agentic, and each session scales every tool call's memory "
     "peak by lognormal(median 4, sigma 1.0) (AgentCgroup, arXiv 2602.09345: tool peaks of 2-4 GB per task "
     "against P95s of 233-518 MB per command, and peak memory varying 20x across tasks, CV 147 %). Turns the "
     "host memory model on (docs/sim.md \"Host memory\")."},
}};
constexpr std::array<Generator, 8> kGenerators{mars_short,    mars_long,     mars_mixed, agentic, long_pause,
                                               mars_ilr_125k, mars_ilr_263k, agentic};  // kSynthetic's order
constexpr std::size_t kAgenticMem = 7;  // draws a memory scale per session
static_assert(kSynthetic.size() == kGenerators.size());

// ---------------------------------------------------------------------------
// Tool CPU defaults, in cores.

struct CpuDefault {
  std::string_view kind;
  double cores;
};
constexpr CpuDefault kCpuDefaults[] = {
    // Interpreters, test runners, package managers, compilers: CPU-bound.
    {"python", 1.0},
    {"python3", 1.0},
    {"pytest", 1.0},
    {"pip", 1.0},
    {"pip3", 1.0},
    {"uv", 1.0},
    {"venv", 1.0},
    {"conda", 1.0},
    {"poetry", 1.0},
    {"tox", 1.0},
    {"pylint", 1.0},
    {"unittest", 1.0},
    {"nosetests", 1.0},
    {"jupyter", 1.0},
    {"sphinx", 1.0},
    {"sphinx-build", 1.0},
    {"npm", 1.0},
    {"node", 1.0},
    {"make", 1.0},
    {"cargo", 1.0},
    {"go", 1.0},
    {"gcc", 1.0},
    {"g++", 1.0},
    {"mvn", 1.0},
    {"gradle", 1.0},
    {"ffmpeg", 1.0},
    // Shells running a script of unknown mix; archives and package installs
    // that mostly wait on I/O or the network.
    {"bash", 0.5},
    {"sh", 0.5},
    {"cli_tool", 0.5},
    {"apt", 0.5},
    {"apt-get", 0.5},
    {"tar", 0.5},
    {"unzip", 0.5},
    // git: index and object I/O with some hashing and diffing.
    {"git", 0.3},
    // Shell utilities: short, mostly I/O.
    {"ls", 0.1},
    {"cat", 0.1},
    {"find", 0.1},
    {"grep", 0.1},
    {"rg", 0.1},
    {"sed", 0.1},
    {"awk", 0.1},
    {"head", 0.1},
    {"tail", 0.1},
    {"wc", 0.1},
    {"cd", 0.1},
    {"echo", 0.1},
    {"printf", 0.1},
    {"mkdir", 0.1},
    {"rm", 0.1},
    {"cp", 0.1},
    {"mv", 0.1},
    {"diff", 0.1},
    {"sort", 0.1},
    {"pwd", 0.1},
    {"which", 0.1},
    {"nl", 0.1},
    {"chmod", 0.1},
    {"touch", 0.1},
    {"file", 0.1},
    {"od", 0.1},
    {"xxd", 0.1},
    {"ps", 0.1},
    {"kill", 0.1},
    {"pkill", 0.1},
    {"tmux", 0.1},
    {"curl", 0.1},
    {"wget", 0.1},
    {"gh", 0.1},
    // Waiting on purpose, and a human thinking between turns (long-pause).
    {"sleep", 0.0},
    {"human", 0.0},
    // Harness tools: in-process file I/O and bookkeeping in the agent.
    {"Read", 0.05},
    {"Edit", 0.05},
    {"Write", 0.05},
    {"MultiEdit", 0.05},
    {"Grep", 0.05},
    {"Glob", 0.05},
    {"LS", 0.05},
    {"TodoWrite", 0.05},
    {"NotebookEdit", 0.05},
    {"BashOutput", 0.05},
    {"KillShell", 0.05},
    // Network tools, and sub-agents (whose LLM calls are accounted elsewhere).
    {"WebFetch", 0.02},
    {"WebSearch", 0.02},
    {"Task", 0.02},
    {"TaskOutput", 0.02},
};
constexpr double kDefaultFallback = 0.5;
constexpr double kMaxCores = 64.0;

}  // namespace

// ---------------------------------------------------------------------------

Result<std::vector<SessionSpec>> parse_trace(std::string_view text, std::string_view origin, TraceStats* stats) {
  std::vector<SessionSpec> sessions;
  TraceStats counted;
  std::size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    std::size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    line = base::trim(line);  // also drops a CRLF's '\r'
    if (line.empty()) continue;
    auto session = read_session(line, LineRef{origin, line_no}, counted);
    if (!session) return base::propagate(std::move(session.error()));
    sessions.push_back(std::move(*session));
  }
  if (stats != nullptr) *stats = counted;
  return sessions;
}

Result<std::vector<SessionSpec>> load_trace(const std::string& path, TraceStats* stats) {
  base::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return base::errno_error("open trace '" + path + "'");
  std::string text;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return base::errno_error("read trace '" + path + "'");
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  return parse_trace(text, path, stats);
}

std::vector<SessionSpec> filter_by_source(std::span<const SessionSpec> pool, std::span<const std::string> include,
                                          std::span<const std::string> exclude) {
  auto matches = [](const std::string& source, std::span<const std::string> prefixes) {
    return std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return source.starts_with(p); });
  };
  std::vector<SessionSpec> out;
  for (const SessionSpec& s : pool) {
    if ((include.empty() || matches(s.source, include)) && !matches(s.source, exclude)) out.push_back(s);
  }
  return out;
}

std::span<const SyntheticSpec> synthetic_workloads() { return kSynthetic; }

Result<std::vector<SessionSpec>> synthetic_pool(std::string_view name, std::size_t count, std::uint64_t seed) {
  std::size_t which = kSynthetic.size();
  for (std::size_t i = 0; i < kSynthetic.size(); ++i) {
    if (kSynthetic[i].name == name) which = i;
  }
  if (which == kSynthetic.size()) {
    std::string known;
    for (const auto& s : kSynthetic) known += (known.empty() ? "" : ", ") + std::string(s.name);
    return make_error(ENOENT, fmt::format("unknown synthetic workload '{}' (known: {})", name, known));
  }
  if (count == 0) return make_error(EINVAL, fmt::format("synthetic workload '{}': 0 sessions", name));

  // Sessions are drawn one after another from one engine, so a pool of n is
  // a prefix of a pool of n + k with the same seed.
  Rng rng(seed);
  std::vector<SessionSpec> pool(count);
  for (std::size_t i = 0; i < count; ++i) {
    pool[i].name = fmt::format("{}-{}", name, i);
    pool[i].rounds = kGenerators[which](rng);
    if (which == kAgenticMem) pool[i].mem_scale = rng.lognormal(4.0, 1.0);
  }
  return pool;
}

Result<Workload> make_workload(std::span<const SessionSpec> pool, std::string_view name, const ArrivalSpec& arrivals) {
  if (pool.empty()) return make_error(EINVAL, fmt::format("workload '{}': empty session pool", name));
  if (!std::isfinite(arrivals.rate_sps) || arrivals.rate_sps <= 0) {
    return make_error(EINVAL,
                      fmt::format("workload '{}': arrival rate {} is not a positive number", name, arrivals.rate_sps));
  }
  if (arrivals.max_model_len < 2) {
    return make_error(EINVAL, fmt::format("workload '{}': max_model_len {} < 2", name, arrivals.max_model_len));
  }

  const std::size_t count = arrivals.sessions == 0 ? pool.size() : arrivals.sessions;
  Rng shuffle_rng(stream_seed(arrivals.seed, 0));
  Rng arrival_rng(stream_seed(arrivals.seed, 1));
  const std::uint32_t max_len = arrivals.max_model_len;
  const std::uint32_t max_output = max_len / 2;

  Workload w;
  w.name = std::string(name);
  w.sessions.reserve(count);
  std::vector<std::size_t> order(pool.size());
  double t = 0.0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t pass = i / pool.size();
    const std::size_t slot = i % pool.size();
    if (slot == 0) {
      // A fresh Fisher–Yates shuffle for every pass over the pool.
      for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
      for (std::size_t k = order.size() - 1; k > 0; --k) {
        std::swap(order[k], order[shuffle_rng.below(k + 1)]);
      }
    }
    SessionSpec s = pool[order[slot]];
    if (pass > 0) s.name += fmt::format("#{}", pass + 1);

    if (arrivals.poisson) {
      if (i > 0) t += arrival_rng.exponential(1.0 / arrivals.rate_sps);
      s.arrival_s = t;
    } else {
      s.arrival_s = static_cast<double>(i) / arrivals.rate_sps;
    }

    for (RoundSpec& r : s.rounds) {
      r.output_tokens = std::min(r.output_tokens, max_output);
      // 64-bit sum: a hand-built pool may hold counts near 2^32.
      if (std::uint64_t{r.input_tokens} + r.output_tokens > max_len) {
        r.input_tokens = max_len - r.output_tokens;
        r.capped = true;
      }
      if (r.capped) ++w.capped_rounds;
    }
    w.rounds += s.rounds.size();
    w.sessions.push_back(std::move(s));
  }
  return w;
}

// ---------------------------------------------------------------------------

ToolCpuTable::ToolCpuTable() : fallback_(kDefaultFallback) {
  for (const auto& d : kCpuDefaults) table_.emplace(std::string(d.kind), d.cores);
}

double ToolCpuTable::demand(std::string_view kind) const {
  auto it = table_.find(kind);
  return it == table_.end() ? fallback_ : it->second;
}

base::Result<void> ToolCpuTable::apply(std::string_view spec) {
  // Parse everything first, then commit: a bad entry changes nothing.
  std::vector<std::pair<std::string_view, double>> entries;
  if (base::trim(spec).empty()) return {};
  for (std::string_view entry : base::split(spec, ',')) {
    std::string_view e = base::trim(entry);
    auto bad = [&](std::string_view why) { return make_error(EINVAL, fmt::format("tool cpu entry '{}': {}", e, why)); };
    std::size_t eq = e.find('=');
    if (e.empty()) return bad("empty entry (want kind=cores)");
    if (eq == std::string_view::npos) return bad("want kind=cores");
    std::string_view kind = base::trim(e.substr(0, eq));
    std::string_view value = base::trim(e.substr(eq + 1));
    if (kind.empty()) return bad("empty tool kind");
    auto cores = base::parse_double(value);
    if (!cores) return bad(fmt::format("'{}' is not a number", value));
    if (!(*cores >= 0.0 && *cores <= kMaxCores)) return bad(fmt::format("cores must be in [0, {}]", kMaxCores));
    entries.emplace_back(kind, *cores + 0.0);  // + 0.0 turns -0 into 0
  }
  for (const auto& [kind, cores] : entries) {
    if (kind == "*") {
      fallback_ = cores;
    } else {
      table_.insert_or_assign(std::string(kind), cores);
    }
  }
  return {};
}

}  // namespace tandem::sim
