// Presets and the step-time model ([calibration] §0, §5, §7).
#include "sim/preset.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <string>

namespace tandem::sim {
namespace {

// H100 80 GB, vLLM at gpu_memory_utilization 0.90 ([calibration] §5).
constexpr StepTimeModel kLlama8bH100{.t0_us = 500,
                                     .weights_us = 5500,
                                     .b_us_per_token = 20.0,
                                     .a_pf_us_per_pair = 1.3e-3,
                                     .a_dec_us_per_token = 0.060,
                                     .a_seq_us = 5.0};
constexpr StepTimeModel kQwen30bH100{.t0_us = 3000,
                                     .weights_us = 870,
                                     .b_us_per_token = 16.0,
                                     .a_pf_us_per_pair = 1.97e-3,
                                     .a_dec_us_per_token = 0.045,
                                     .a_seq_us = 5.0,
                                     .moe_layers = 48,
                                     .experts = 128,
                                     .top_k = 8,
                                     .expert_bytes = 9437184,
                                     .hbm_bytes_per_us = 2.8e6};
// H200 141 GB (DERIVED, docs/sim.md): memory-bound terms scale with HBM
// bandwidth 3.35 → 4.8 TB/s (× 0.698); compute terms are the same Hopper SMs.
constexpr double kH200Bw = 3.35 / 4.8;
constexpr StepTimeModel kLlama8bH200{.t0_us = 500,
                                     .weights_us = 5500 * kH200Bw,
                                     .b_us_per_token = 20.0,
                                     .a_pf_us_per_pair = 1.3e-3,
                                     .a_dec_us_per_token = 0.060 * kH200Bw,
                                     .a_seq_us = 5.0};
constexpr StepTimeModel kQwen30bH200{.t0_us = 3000,
                                     .weights_us = 870 * kH200Bw,
                                     .b_us_per_token = 16.0,
                                     .a_pf_us_per_pair = 1.97e-3,
                                     .a_dec_us_per_token = 0.045 * kH200Bw,
                                     .a_seq_us = 5.0,
                                     .moe_layers = 48,
                                     .experts = 128,
                                     .top_k = 8,
                                     .expert_bytes = 9437184,
                                     .hbm_bytes_per_us = 2.8e6 / kH200Bw};

// H100 NVL (MARS's GPU, arXiv 2604.26963) serving Qwen3-Coder-30B-A3B-Instruct
// (DERIVED, docs/sim.md): the model has Qwen3-30B-A3B's shape (48 layers,
// 128 experts top-8 of 3 × 2048 × 768 BF16, 4 KV heads of 128), so the
// H100 model is kept and scaled by the NVL's datasheet against the SXM's:
// memory-bound terms by HBM bandwidth 3.35 → 3.9 TB/s (× 0.859), compute
// terms by dense BF16 989.5 → 835.5 TFLOPS (× 1.184). t0 and a_seq are the
// host's, unchanged.
constexpr double kNvlBw = 3.35 / 3.9;
constexpr double kNvlCompute = 989.5 / 835.5;
constexpr StepTimeModel kQwen30bH100Nvl{.t0_us = 3000,
                                        .weights_us = 870 * kNvlBw,
                                        .b_us_per_token = 16.0 * kNvlCompute,
                                        .a_pf_us_per_pair = 1.97e-3 * kNvlCompute,
                                        .a_dec_us_per_token = 0.045 * kNvlBw,
                                        .a_seq_us = 5.0,
                                        .moe_layers = 48,
                                        .experts = 128,
                                        .top_k = 8,
                                        .expert_bytes = 9437184,
                                        .hbm_bytes_per_us = 2.8e6 / kNvlBw};

const Preset kPresets[] = {
    {.name = "h100-llama3-8b",
     .doc = "Llama-3.1-8B BF16 on one H100 80 GB: 27,500 KV blocks (440k tokens), 8192-token steps, 1024 seqs",
     .gpu_blocks = 27500,
     .max_model_len = 131072,
     .step = kLlama8bH100,
     .swap_us_per_token = 3.3,
     .swap_fixed_us = 30,
     .kv_bytes_per_token = 131072},
    {.name = "h100-qwen3-30b-a3b",
     .doc = "Qwen3-30B-A3B BF16 (MoE, 128 experts, top-8) on one H100 80 GB: 7,200 KV blocks (115k tokens)",
     .gpu_blocks = 7200,
     .max_model_len = 114688,
     .step = kQwen30bH100,
     .swap_us_per_token = 2.5,
     .swap_fixed_us = 30,
     .kv_bytes_per_token = 98304},
    {.name = "h200-llama3-8b",
     .doc = "Llama-3.1-8B BF16 on one H200 141 GB: 55,600 KV blocks (890k tokens), 4.8 TB/s",
     .gpu_blocks = 55600,
     .max_model_len = 131072,
     .step = kLlama8bH200,
     .swap_us_per_token = 3.3,
     .swap_fixed_us = 30,
     .kv_bytes_per_token = 131072},
    {.name = "h200-qwen3-30b-a3b",
     .doc = "Qwen3-30B-A3B BF16 on one H200 141 GB: 45,000 KV blocks (720k tokens), 4.8 TB/s",
     .gpu_blocks = 45000,
     .max_model_len = 131072,
     .step = kQwen30bH200,
     .swap_us_per_token = 2.5,
     .swap_fixed_us = 30,
     .kv_bytes_per_token = 98304},
    {.name = "h100nvl-qwen3-coder-30b-a3b",
     .doc = "MARS's node: Qwen3-Coder-30B-A3B BF16 on one H100 NVL 94 GB: 16,384 KV blocks (262k tokens, "
            "max_model_len 262,144 as MARS runs it), 3.9 TB/s",
     .gpu_blocks = 16384,
     .max_model_len = 262144,
     .step = kQwen30bH100Nvl,
     .swap_us_per_token = 2.5,
     .swap_fixed_us = 30,
     .kv_bytes_per_token = 98304},
};

std::unexpected<base::Error> invalid(std::string_view preset, std::string_view what) {
  return base::make_error(EINVAL, std::string("preset ") + std::string(preset) + ": " + std::string(what));
}

}  // namespace

double StepTimeModel::linear_us(std::uint64_t tokens) const {
  const double compute = b_us_per_token * static_cast<double>(tokens);
  double weights = weights_us;
  if (moe_layers != 0 && tokens != 0) {
    const double miss = 1.0 - static_cast<double>(top_k) / static_cast<double>(experts);
    const double touched = static_cast<double>(experts) * (1.0 - std::pow(miss, static_cast<double>(tokens)));
    weights += static_cast<double>(moe_layers) * touched * expert_bytes / hbm_bytes_per_us;
  }
  return std::max(weights, compute);
}

double StepTimeModel::step_us(const StepShape& s) const {
  if (s.seqs == 0) return 0.0;
  return t0_us + linear_us(s.tokens) + a_pf_us_per_pair * s.prefill_pairs +
         a_dec_us_per_token * static_cast<double>(s.decode_context) + a_seq_us * s.seqs;
}

std::uint32_t StepTimeModel::saturating_tokens() const {
  if (!(b_us_per_token > 0)) return 0;
  // b·N grows linearly and the weight term is non-decreasing and bounded: bisect.
  std::uint32_t lo = 1;
  std::uint32_t hi = 1u << 24;
  auto compute_bound = [&](std::uint32_t n) { return b_us_per_token * n >= linear_us(n) - 1e-9; };
  if (!compute_bound(hi)) return hi;
  while (lo < hi) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    if (compute_bound(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

std::span<const Preset> presets() { return kPresets; }

base::Result<Preset> find_preset(std::string_view name) {
  std::string known;
  for (const Preset& p : kPresets) {
    if (p.name == name) return p;
    known += known.empty() ? "" : ", ";
    known += p.name;
  }
  return base::make_error(ENOENT, "unknown preset '" + std::string(name) + "' (known: " + known + ")");
}

base::Result<void> validate(const Preset& p) {
  if (p.block_size == 0) return invalid(p.name, "block_size must be at least 1");
  if (p.gpu_blocks == 0) return invalid(p.name, "the KV pool has no blocks");
  if (p.max_seqs == 0) return invalid(p.name, "max_seqs must be at least 1");
  if (p.token_budget < p.block_size) {
    return invalid(p.name, "token_budget is smaller than one KV block");
  }
  if (p.max_model_len < 2) return invalid(p.name, "max_model_len must be at least 2");
  if (static_cast<std::uint64_t>(p.max_model_len) > static_cast<std::uint64_t>(p.gpu_blocks) * p.block_size) {
    return invalid(p.name, "max_model_len does not fit the KV pool (one request could never run)");
  }
  const StepTimeModel& m = p.step;
  for (double v : {m.t0_us, m.weights_us, m.b_us_per_token, m.a_pf_us_per_pair, m.a_dec_us_per_token, m.a_seq_us,
                   p.swap_us_per_token, p.swap_fixed_us}) {
    if (!std::isfinite(v) || v < 0) {
      return invalid(p.name, "step-time and swap coefficients must be finite and >= 0");
    }
  }
  if (m.t0_us + m.weights_us + m.b_us_per_token <= 0) {
    return invalid(p.name, "a step must take time (t0, weights and b are all 0)");
  }
  if (m.moe_layers != 0 && (m.experts == 0 || m.top_k == 0 || m.top_k > m.experts || !(m.hbm_bytes_per_us > 0))) {
    return invalid(p.name, "MoE term needs experts >= top_k >= 1 and a positive bandwidth");
  }
  if (!(p.host_mem_gib > 0) || !std::isfinite(p.host_mem_gib) || !(p.session_mem_mib >= 0) ||
      !std::isfinite(p.session_mem_mib)) {
    return invalid(p.name, "host_mem_gib must be > 0 and session_mem_mib >= 0");
  }
  return {};
}

}  // namespace tandem::sim
