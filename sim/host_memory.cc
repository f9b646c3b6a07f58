// Host memory of tandem-sim: tool memory demands and memory PSI.
#include "sim/host_memory.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <numbers>
#include <vector>

#include <fmt/format.h>

#include "base/parse.h"

namespace tandem::sim {
namespace {

constexpr double kMB = 1e6;
constexpr double kSigma = 1.2;  // tandem's choice: docs/sim.md "Host memory"
// P95 / mean of a log-normal with σ = kSigma: e^(1.645σ − σ²/2).
const double kP95OverMean = std::exp(1.6449 * kSigma - kSigma * kSigma / 2);

struct MemDefault {
  std::string_view kind;
  double p95_mb;  // 95th percentile of the call's peak, MB
};

// AgentCgroup (arXiv 2602.09345) §memory: P95 spike by command type — tests
// 518 MB (Haiku), pip installs ~233 MB; file exploration averages 4.5 MB and
// git 13.5 MB (means, turned into P95s with σ). docs/sim.md lists which kind
// takes which figure.
constexpr double kTests = 518;
constexpr double kInstall = 233;
constexpr double kPython = 234;  // GLM's test P95 (no separate figure for Python snippets)
constexpr double kExploreMean = 4.5;
constexpr double kGitMean = 13.5;

const std::vector<MemDefault>& defaults() {
  static const std::vector<MemDefault> kDefaults = [] {
    const double explore = kExploreMean * kP95OverMean;
    const double git = kGitMean * kP95OverMean;
    std::vector<MemDefault> v = {
        {"pytest", kTests},   {"unittest", kTests},  {"nosetests", kTests},  {"tox", kTests},
        {"make", kTests},     {"cargo", kTests},     {"go", kTests},         {"gcc", kTests},
        {"g++", kTests},      {"mvn", kTests},       {"gradle", kTests},     {"npm", kInstall},
        {"pip", kInstall},    {"pip3", kInstall},    {"uv", kInstall},       {"conda", kInstall},
        {"poetry", kInstall}, {"venv", kInstall},    {"apt", kInstall},      {"apt-get", kInstall},
        {"python", kPython},  {"python3", kPython},  {"jupyter", kPython},   {"notebook", kPython},
        {"node", kPython},    {"git", git},          {"Read", explore},      {"Grep", explore},
        {"Glob", explore},    {"ls", explore},       {"find", explore},      {"cat", explore},
        {"grep", explore},    {"head", explore},     {"tail", explore},      {"sed", explore},
        {"awk", explore},     {"wc", explore},       {"nl", explore},        {"pwd", explore},
        {"which", explore},   {"echo", explore},     {"rm", explore},        {"mkdir", explore},
        {"chmod", explore},   {"Edit", explore},     {"Write", explore},     {"TodoWrite", explore},
        {"Task", explore},    {"WebFetch", explore}, {"WebSearch", explore}, {"human", 0.0},
    };
    return v;
  }();
  return kDefaults;
}

// The median that gives a log-normal this P95.
double median_of(double p95_mb, double sigma) { return p95_mb / std::exp(1.6449 * sigma); }

// A uniform in [0, 1) and a standard normal from a 64-bit key.
double unit(std::uint64_t x) { return static_cast<double>(mix64(x) >> 11) * 0x1.0p-53; }

}  // namespace

std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double tool_memory_at(const ToolMemDraw& d, double x) {
  if (d.peak_bytes <= 0) return 0;
  const double base = d.peak_bytes * kResidualShare;
  if (x < d.start_s) return base;
  if (x < d.start_s + d.ramp_s) return base + (d.peak_bytes - base) * (x - d.start_s) / d.ramp_s;
  if (x < d.start_s + d.ramp_s + d.burst_s) return d.peak_bytes;
  return base;
}

ToolMemTable::ToolMemTable() {
  for (const MemDefault& d : defaults())
    table_.emplace(std::string(d.kind), ToolMemDist{median_of(d.p95_mb, kSigma), kSigma});
  fallback_ = ToolMemDist{median_of(kInstall, kSigma), kSigma};  // a shell command of unknown mix
}

const ToolMemDist& ToolMemTable::dist(std::string_view kind) const {
  auto it = table_.find(kind);
  return it == table_.end() ? fallback_ : it->second;
}

base::Result<void> ToolMemTable::apply(std::string_view spec) {
  std::vector<std::pair<std::string_view, ToolMemDist>> entries;
  if (base::trim(spec).empty() || base::trim(spec) == "on") return {};
  for (std::string_view entry : base::split(spec, ',')) {
    std::string_view e = base::trim(entry);
    auto bad = [&](std::string_view why) {
      return base::make_error(EINVAL, fmt::format("tool memory entry '{}': {}", e, why));
    };
    if (e.empty()) return bad("empty entry (want kind=P95MB[:sigma])");
    const std::size_t eq = e.find('=');
    if (eq == std::string_view::npos) return bad("want kind=P95MB[:sigma]");
    std::string_view kind = base::trim(e.substr(0, eq));
    std::string_view value = base::trim(e.substr(eq + 1));
    if (kind.empty()) return bad("empty tool kind");
    std::string_view sigma_text;
    if (const std::size_t colon = value.find(':'); colon != std::string_view::npos) {
      sigma_text = value.substr(colon + 1);
      value = value.substr(0, colon);
    }
    auto p95 = base::parse_double(value);
    if (!p95 || !(*p95 >= 0 && *p95 <= 1e6)) return bad("the P95 must be a number of MB in [0, 1e6]");
    double sigma = kind == "*" ? fallback_.sigma : dist(kind).sigma;
    if (!sigma_text.empty()) {
      auto s = base::parse_double(sigma_text);
      if (!s || !(*s >= 0 && *s <= 4)) return bad("sigma must be in [0, 4]");
      sigma = *s;
    }
    entries.emplace_back(kind, ToolMemDist{median_of(*p95 + 0.0, sigma), sigma});
  }
  for (const auto& [kind, d] : entries) {
    if (kind == "*") {
      fallback_ = d;
    } else {
      table_.insert_or_assign(std::string(kind), d);
    }
  }
  return {};
}

ToolMemDraw ToolMemTable::draw(std::string_view kind, std::uint64_t key, double nominal_s) const {
  const ToolMemDist& d = dist(kind);
  ToolMemDraw out;
  if (d.median_mib <= 0) return out;
  // Box–Muller from two independent uniforms of the key.
  const double u1 = std::max(unit(key ^ 0x51ed270b27a3f1c5ULL), 1e-300);
  const double u2 = unit(key ^ 0x2545f4914f6cdd1dULL);
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  out.peak_bytes = d.median_mib * kMB * std::exp(d.sigma * z);
  // AgentCgroup: memory changes by up to ~3 GB within 1 s and bursts last
  // 1–2 s. The ramp takes 0.25–1 s of progress (at most half the call), the
  // peak is held for 1–2 s, and the burst starts at a uniform point of the
  // call (its ramp inside it).
  const double nominal = std::max(0.0, nominal_s);
  out.ramp_s = std::max(1e-3, std::min(0.25 + 0.75 * unit(key ^ 0x6a09e667f3bcc909ULL), nominal / 2));
  out.burst_s = 1.0 + unit(key ^ 0xbb67ae8584caa73bULL);
  out.start_s = unit(key ^ 0x3c6ef372fe94f82bULL) * std::max(0.0, nominal - out.ramp_s);
  return out;
}

void HostPsi::advance(double dt, std::size_t stalled, std::size_t active) {
  if (!(dt > 0)) return;
  const bool some = stalled > 0;
  const bool full = active > 0 && stalled >= active;
  const double decay = std::exp(-dt / window_s_);
  some_ = some_ * decay + (some ? 100.0 : 0.0) * (1.0 - decay);
  full_ = full_ * decay + (full ? 100.0 : 0.0) * (1.0 - decay);
  some_total_ += some ? dt : 0;
  full_total_ += full ? dt : 0;
}

}  // namespace tandem::sim
