// Node presets for tandem-sim: the engine limits, KV pool and step-time model
// of one GPU serving one model. docs/sim.md "Presets" gives every number's
// source (the H200 variants are derived from the H100 ones there); a preset
// fitted to a real engine's measured steps is a JSON file (sim/calibrate.h).
//
// Step time:
//   t = t0 + T_lin(N) + a_pf·Σ_prefill c_i·(p_i + c_i/2) + a_dec·Σ_decode ctx_j + a_seq·n_seqs
//   dense: T_lin(N) = max(T_w, b·N)
//   MoE:   T_lin(N) = max(T_dense_w + L_moe·E(N)·B_exp/BW, b·N),  E(N) = n_exp·(1 − (1 − k/n_exp)^N)
// N counts tokens computed this step (prefix-cache hits are not computed);
// p_i counts the tokens a prefill chunk attends to before it (hits included).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "base/result.h"

namespace tandem::sim {

// What one step computes, for the step-time model.
struct StepShape {
  std::uint64_t tokens = 0;          // N: prefill chunk tokens + one per decode
  double prefill_pairs = 0.0;        // Σ c_i·(p_i + c_i/2)
  std::uint64_t decode_context = 0;  // Σ ctx_j over decoding sequences
  std::uint32_t seqs = 0;            // sequences in the batch
};

struct StepTimeModel {
  double t0_us = 0;
  double weights_us = 0;  // T_w (dense) or T_dense_w (MoE)
  double b_us_per_token = 0;
  double a_pf_us_per_pair = 0;
  double a_dec_us_per_token = 0;
  double a_seq_us = 0;
  // MoE expert term (moe_layers == 0: dense).
  std::uint32_t moe_layers = 0;
  std::uint32_t experts = 0;
  std::uint32_t top_k = 0;
  double expert_bytes = 0;
  double hbm_bytes_per_us = 0;

  // T_lin(N), microseconds.
  double linear_us(std::uint64_t tokens) const;
  // Microseconds of one step; 0 for an empty step.
  double step_us(const StepShape& s) const;
  // The fewest tokens whose compute term b·N reaches the weight term: the
  // smallest compute-bound step (0 when b is 0).
  std::uint32_t saturating_tokens() const;
};

struct Preset {
  std::string_view name;
  std::string_view doc;
  std::uint32_t block_size = 16;
  std::uint32_t gpu_blocks = 0;
  std::uint32_t token_budget = 8192;  // max_num_batched_tokens
  std::uint32_t max_seqs = 1024;      // max_num_seqs
  std::uint32_t max_model_len = 131072;
  StepTimeModel step;
  double swap_us_per_token = 0;          // host ↔ GPU copy of KV over PCIe
  double swap_fixed_us = 0;              // per transfer
  std::uint32_t kv_bytes_per_token = 0;  // BF16 K and V of every layer (sizes host memory in blocks)
  // Host memory for agents and their tools, per engine (the node has engines ×
  // this), GiB; KV copies have their own (SimConfig::host_kv_gib). docs/sim.md
  // "Host memory" gives the sources.
  double host_mem_gib = 128;
  double session_mem_mib = 185;  // what an agent session holds resident (its runtime)
};

std::span<const Preset> presets();
// ENOENT naming the unknown preset and listing the known ones.
base::Result<Preset> find_preset(std::string_view name);
// EINVAL naming the first impossible field (no blocks, a budget below one
// block, max_model_len that cannot fit the pool, a negative coefficient…).
base::Result<void> validate(const Preset& p);

}  // namespace tandem::sim
