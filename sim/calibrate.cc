// Step-time fit and preset files.
#include "sim/calibrate.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace tandem::sim {
namespace {

using nlohmann::json;

constexpr std::size_t kCoef = 5;  // t0, b, a_pf, a_dec, a_seq
using Row = std::array<double, kCoef>;

Row features(const StepSample& s, double n_star) {
  return {1.0, std::max(n_star, static_cast<double>(s.shape.tokens)), s.shape.prefill_pairs,
          static_cast<double>(s.shape.decode_context), static_cast<double>(s.shape.seqs)};
}

// Least squares over the coefficients in `mask` (others 0), by the normal
// equations with Gaussian elimination; false when singular.
bool solve_subset(const std::vector<Row>& x, const std::vector<double>& y, unsigned mask, Row& out) {
  std::vector<std::size_t> cols;
  for (std::size_t j = 0; j < kCoef; ++j) {
    if (mask & (1u << j)) cols.push_back(j);
  }
  const std::size_t k = cols.size();
  std::vector<std::vector<double>> a(k, std::vector<double>(k + 1, 0.0));
  for (std::size_t i = 0; i < x.size(); ++i) {
    for (std::size_t r = 0; r < k; ++r) {
      for (std::size_t c = 0; c < k; ++c) a[r][c] += x[i][cols[r]] * x[i][cols[c]];
      a[r][k] += x[i][cols[r]] * y[i];
    }
  }
  for (std::size_t c = 0; c < k; ++c) {
    std::size_t piv = c;
    for (std::size_t r = c + 1; r < k; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[piv][c])) piv = r;
    }
    if (std::abs(a[piv][c]) < 1e-12 * (1.0 + std::abs(a[c][c]))) return false;
    std::swap(a[piv], a[c]);
    for (std::size_t r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (std::size_t cc = c; cc <= k; ++cc) a[r][cc] -= f * a[c][cc];
    }
  }
  out.fill(0.0);
  for (std::size_t r = 0; r < k; ++r) out[cols[r]] = a[r][k] / a[r][r];
  return true;
}

double sse(const std::vector<Row>& x, const std::vector<double>& y, const Row& c) {
  double e = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    double p = 0;
    for (std::size_t j = 0; j < kCoef; ++j) p += c[j] * x[i][j];
    e += (p - y[i]) * (p - y[i]);
  }
  return e;
}

// Non-negative least squares, exactly: the best feasible subset solution.
bool nnls(const std::vector<Row>& x, const std::vector<double>& y, Row& best, double& best_sse) {
  bool found = false;
  for (unsigned mask = 1; mask < (1u << kCoef); ++mask) {
    Row c{};
    if (!solve_subset(x, y, mask, c)) continue;
    if (std::any_of(c.begin(), c.end(), [](double v) { return v < 0; })) continue;
    const double e = sse(x, y, c);
    if (!found || e < best_sse) {
      found = true;
      best = c;
      best_sse = e;
    }
  }
  return found;
}

std::string bucket(std::uint64_t n) {
  if (n <= 1) return "1";
  if (n <= 3) return "2-3";
  if (n <= 7) return "4-7";
  if (n <= 15) return "8-15";
  if (n <= 31) return "16-31";
  if (n <= 64) return "32-64";
  if (n <= 256) return "65-256";
  if (n <= 1024) return "257-1024";
  return ">1024";
}

std::string shape_class(const StepSample& s) {
  const std::uint64_t prefill = s.shape.tokens - std::min<std::uint64_t>(s.shape.tokens, s.decode_seqs);
  if (prefill == 0) return "decode " + bucket(s.decode_seqs);
  if (s.decode_seqs == 0) return "prefill " + bucket(prefill);
  return "mixed, prefill " + bucket(prefill);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

base::Error bad_file(const std::string& path, std::size_t line, const std::string& what) {
  return base::Error(EINVAL, fmt::format("{}:{}: {}", path, line, what));
}

}  // namespace

base::Result<std::vector<StepSample>> load_step_log(const std::string& path) {
  std::ifstream in(path);
  if (!in) return base::make_error(errno != 0 ? errno : ENOENT, fmt::format("{}: {}", path, std::strerror(errno)));
  std::vector<StepSample> out;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return std::unexpected(bad_file(path, n, "not a JSON object"));
    StepSample s;
    try {
      s.shape.tokens = j.at("tokens").get<std::uint64_t>();
      s.shape.prefill_pairs = j.at("prefill_pairs").get<double>();
      s.shape.decode_context = j.at("decode_context").get<std::uint64_t>();
      s.shape.seqs = j.at("seqs").get<std::uint32_t>();
      s.decode_seqs = j.value("decode_seqs", 0u);
      s.measured_us = j.at("step_us").get<double>();
    } catch (const json::exception& e) {
      return std::unexpected(bad_file(path, n,
                                      fmt::format("a step needs tokens, prefill_pairs, decode_context, "
                                                  "seqs and step_us ({})",
                                                  e.what())));
    }
    if (!(s.measured_us > 0) || !std::isfinite(s.measured_us) || s.shape.seqs == 0) {
      return std::unexpected(bad_file(path, n, "step_us must be positive and seqs at least 1"));
    }
    out.push_back(s);
  }
  return out;
}

base::Result<StepFit> fit_step_model(std::span<const StepSample> samples, double holdout, std::uint64_t seed) {
  if (samples.size() < 20) {
    return base::make_error(EINVAL, fmt::format("{} steps: a fit needs at least 20", samples.size()));
  }
  if (!(holdout >= 0.0 && holdout < 0.9)) return base::make_error(EINVAL, "the held-back share must be in [0, 0.9)");
  std::vector<std::size_t> order(samples.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  const auto n_test = static_cast<std::size_t>(std::floor(holdout * static_cast<double>(samples.size())));
  std::vector<StepSample> train, test;
  for (std::size_t i = 0; i < order.size(); ++i) (i < n_test ? test : train).push_back(samples[order[i]]);

  std::set<std::uint64_t> candidates = {1};
  for (const StepSample& s : train) candidates.insert(s.shape.tokens);
  std::vector<double> y;
  y.reserve(train.size());
  for (const StepSample& s : train) y.push_back(s.measured_us);
  Row best{};
  double best_sse = 0;
  double best_n = 1;
  bool found = false;
  std::vector<Row> x(train.size());
  for (std::uint64_t n_star : candidates) {
    for (std::size_t i = 0; i < train.size(); ++i) x[i] = features(train[i], static_cast<double>(n_star));
    Row c{};
    double e = 0;
    if (!nnls(x, y, c, e)) continue;
    if (!found || e < best_sse) {
      found = true;
      best = c;
      best_sse = e;
      best_n = static_cast<double>(n_star);
    }
  }
  if (!found) return base::make_error(EINVAL, "no non-negative fit exists for these steps");

  StepFit fit;
  fit.model.t0_us = best[0];
  fit.model.b_us_per_token = best[1];
  fit.model.weights_us = best[1] * best_n;
  fit.model.a_pf_us_per_pair = best[2];
  fit.model.a_dec_us_per_token = best[3];
  fit.model.a_seq_us = best[4];
  fit.train_steps = train.size();
  fit.test_steps = test.size();
  fit.train_rmse_us = std::sqrt(best_sse / static_cast<double>(train.size()));

  const StepFit errors =
      evaluate(fit.model, test.empty() ? std::span<const StepSample>(train) : std::span<const StepSample>(test));
  fit.test_median_abs_error = errors.test_median_abs_error;
  fit.shapes = errors.shapes;
  return fit;
}

StepFit evaluate(const StepTimeModel& model, std::span<const StepSample> samples) {
  StepFit fit;
  fit.model = model;
  fit.test_steps = samples.size();
  std::vector<double> rel;
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> by_shape;
  for (const StepSample& s : samples) {
    const double p = model.step_us(s.shape);
    rel.push_back(std::abs(p - s.measured_us) / s.measured_us);
    auto& [measured, predicted] = by_shape[shape_class(s)];
    measured.push_back(s.measured_us);
    predicted.push_back(p);
  }
  fit.test_median_abs_error = median(rel);
  for (auto& [name, mm] : by_shape) {
    ShapeError e;
    e.shape = name;
    e.steps = mm.first.size();
    e.measured_median_us = median(mm.first);
    e.model_median_us = median(mm.second);
    e.error = (e.model_median_us - e.measured_median_us) / e.measured_median_us;
    fit.shapes.push_back(e);
  }
  return fit;
}

std::string describe(const StepFit& f) {
  const StepTimeModel& m = f.model;
  std::string s = fmt::format(
      "step time = {:.1f} + max({:.1f}, {:.4f}·N) + {:.3g}·pairs + {:.3g}·ctx + {:.2f}·seqs  (µs; saturating at "
      "N = {})\n",
      m.t0_us, m.weights_us, m.b_us_per_token, m.a_pf_us_per_pair, m.a_dec_us_per_token, m.a_seq_us,
      m.saturating_tokens());
  s += fmt::format("fitted on {} steps (RMSE {:.1f} µs); {} held back: median |error| {:.1f} %\n", f.train_steps,
                   f.train_rmse_us, f.test_steps, 100.0 * f.test_median_abs_error);
  s += fmt::format("{:<26} {:>6} {:>14} {:>12} {:>8}\n", "held-back steps by shape", "steps", "measured med",
                   "model med", "error");
  for (const ShapeError& e : f.shapes) {
    s += fmt::format("{:<26} {:>6} {:>11.0f} µs {:>9.0f} µs {:>+7.1f}%\n", e.shape, e.steps, e.measured_median_us,
                     e.model_median_us, 100.0 * e.error);
  }
  return s;
}

std::string preset_json(const Preset& p) {
  const StepTimeModel& m = p.step;
  json j = {{"name", p.name},
            {"doc", p.doc},
            {"block_size", p.block_size},
            {"gpu_blocks", p.gpu_blocks},
            {"token_budget", p.token_budget},
            {"max_seqs", p.max_seqs},
            {"max_model_len", p.max_model_len},
            {"swap_us_per_token", p.swap_us_per_token},
            {"swap_fixed_us", p.swap_fixed_us},
            {"host_mem_gib", p.host_mem_gib},
            {"session_mem_mib", p.session_mem_mib},
            {"step",
             {{"t0_us", m.t0_us},
              {"weights_us", m.weights_us},
              {"b_us_per_token", m.b_us_per_token},
              {"a_pf_us_per_pair", m.a_pf_us_per_pair},
              {"a_dec_us_per_token", m.a_dec_us_per_token},
              {"a_seq_us", m.a_seq_us},
              {"moe_layers", m.moe_layers},
              {"experts", m.experts},
              {"top_k", m.top_k},
              {"expert_bytes", m.expert_bytes},
              {"hbm_bytes_per_us", m.hbm_bytes_per_us}}}};
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

base::Result<Preset> load_preset_file(const std::string& path, bool for_calibration) {
  std::ifstream in(path);
  if (!in) return base::make_error(errno != 0 ? errno : ENOENT, fmt::format("{}: {}", path, std::strerror(errno)));
  const json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return base::make_error(EINVAL, path + ": not a JSON object");
  // Names and docs live as long as the process: a preset refers to them.
  static std::mutex mu;
  static std::deque<std::string> strings;
  Preset p;
  const char* field = "name";
  try {
    std::string name = j.at("name").get<std::string>();
    std::string doc = j.value("doc", std::string());
    field = "block_size";
    p.block_size = j.at("block_size").get<std::uint32_t>();
    field = "gpu_blocks";
    p.gpu_blocks = j.at("gpu_blocks").get<std::uint32_t>();
    field = "token_budget";
    p.token_budget = j.value("token_budget", p.token_budget);
    field = "max_seqs";
    p.max_seqs = j.value("max_seqs", p.max_seqs);
    field = "max_model_len";
    p.max_model_len = j.value("max_model_len", p.max_model_len);
    field = "swap_us_per_token";
    p.swap_us_per_token = j.value("swap_us_per_token", 0.0);
    field = "swap_fixed_us";
    p.swap_fixed_us = j.value("swap_fixed_us", 0.0);
    field = "host_mem_gib";
    p.host_mem_gib = j.value("host_mem_gib", p.host_mem_gib);
    field = "session_mem_mib";
    p.session_mem_mib = j.value("session_mem_mib", p.session_mem_mib);
    field = "step";
    const json& s = j.at("step");
    StepTimeModel& m = p.step;
    m.t0_us = s.value("t0_us", 0.0);
    m.weights_us = s.value("weights_us", 0.0);
    m.b_us_per_token = s.value("b_us_per_token", 0.0);
    m.a_pf_us_per_pair = s.value("a_pf_us_per_pair", 0.0);
    m.a_dec_us_per_token = s.value("a_dec_us_per_token", 0.0);
    m.a_seq_us = s.value("a_seq_us", 0.0);
    m.moe_layers = s.value("moe_layers", 0u);
    m.experts = s.value("experts", 0u);
    m.top_k = s.value("top_k", 0u);
    m.expert_bytes = s.value("expert_bytes", 0.0);
    m.hbm_bytes_per_us = s.value("hbm_bytes_per_us", 0.0);
    std::lock_guard lock(mu);
    p.name = strings.emplace_back(std::move(name));
    p.doc = strings.emplace_back(std::move(doc));
  } catch (const json::exception& e) {
    return base::make_error(EINVAL, fmt::format("{}: '{}': {}", path, field, e.what()));
  }
  Preset check = p;
  if (for_calibration) check.step.b_us_per_token = 1;  // any step model: the fit replaces it
  if (auto v = validate(check); !v) return base::make_error(EINVAL, fmt::format("{}: {}", path, v.error().context()));
  return p;
}

}  // namespace tandem::sim
