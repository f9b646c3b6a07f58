// The step-time model against [calibration] §7's hand-derived numbers, and
// preset validation.
#include "sim/preset.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace tandem::sim {
namespace {

const Preset& preset(std::string_view name) {
  for (const Preset& p : presets()) {
    if (p.name == name) return p;
  }
  throw std::runtime_error("no preset");
}

StepShape decode(std::uint32_t batch, std::uint64_t ctx) {
  return {.tokens = batch, .decode_context = batch * ctx, .seqs = batch};
}
StepShape prefill(std::uint32_t chunk, std::uint32_t prefix) {
  return {.tokens = chunk, .prefill_pairs = chunk * (prefix + chunk / 2.0), .seqs = 1};
}

TEST(StepTime, LlamaMatchesCalibrationSection7) {
  const StepTimeModel& m = preset("h100-llama3-8b").step;
  // B=1, ctx 1k: 500 + max(5500, 20) + 0.06·1000 + 5 = 6065 µs.
  EXPECT_DOUBLE_EQ(m.step_us(decode(1, 1000)), 6065.0);
  // B=32 @8k ≈ 21.5 ms; B=128 @1k ≈ 14.3 ms.
  EXPECT_NEAR(m.step_us(decode(32, 8000)), 21.5e3, 0.1e3);
  EXPECT_NEAR(m.step_us(decode(128, 1000)), 14.3e3, 0.1e3);
  // 2048-token chunk, empty cache: 500 + 40960 + 1.3e-3·2048·1024 + 5 ≈ 44 ms.
  EXPECT_NEAR(m.step_us(prefill(2048, 0)), 44.2e3, 0.1e3);
  // 512-token chunk ≈ 10.9 ms.
  EXPECT_NEAR(m.step_us(prefill(512, 0)), 10.9e3, 0.1e3);
}

TEST(StepTime, QwenExpertTermMatchesCalibration) {
  const StepTimeModel& m = preset("h100-qwen3-30b-a3b").step;
  EXPECT_NEAR(m.step_us(decode(1, 1000)), 5.2e3, 0.1e3);
  EXPECT_NEAR(m.step_us(decode(8, 1000)), 12.6e3, 0.3e3);
  EXPECT_NEAR(m.step_us(decode(128, 1000)), 31e3, 0.5e3);
  EXPECT_NEAR(m.step_us(prefill(512, 0)), 24.8e3, 0.3e3);
  // Distinct experts saturate: 1, 8 and 10k tokens touch 8, ~51 and 128 experts.
  EXPECT_NEAR(m.linear_us(1), 870 + 48.0 * 8 * 9437184 / 2.8e6, 1e-6);
  EXPECT_NEAR(m.linear_us(10000), std::max(870 + 48.0 * 128 * 9437184 / 2.8e6, 16.0 * 10000), 1e-6);
}

TEST(StepTime, SaturatingTokensIsWhereComputeOvertakesWeights) {
  // Llama: T_w / b = 5500 / 20 = 275 tokens.
  EXPECT_EQ(preset("h100-llama3-8b").step.saturating_tokens(), 275u);
  // Qwen: every expert is touched long before; (870 + 48·128·9.44 MB / 2.8 TB/s) / 16 ≈ 1,349.
  const StepTimeModel& q = preset("h100-qwen3-30b-a3b").step;
  const std::uint32_t n = q.saturating_tokens();
  EXPECT_NEAR(n, (870 + 48.0 * 128 * 9437184 / 2.8e6) / 16, 1.0);
  EXPECT_GE(16.0 * n, q.linear_us(n) - 1e-9);
  EXPECT_LT(16.0 * (n - 1), q.linear_us(n - 1));
}

TEST(StepTime, EmptyStepTakesNoTime) { EXPECT_EQ(preset("h100-llama3-8b").step.step_us({}), 0.0); }

TEST(StepTime, H200IsFasterOnMemoryBoundStepsOnly) {
  const StepTimeModel& h100 = preset("h100-llama3-8b").step;
  const StepTimeModel& h200 = preset("h200-llama3-8b").step;
  EXPECT_LT(h200.step_us(decode(1, 1000)), h100.step_us(decode(1, 1000)));
  // Compute-bound prefill: the same b per token.
  EXPECT_NEAR(h200.linear_us(8192), h100.linear_us(8192), 1e-9);
  EXPECT_GT(preset("h200-llama3-8b").gpu_blocks, preset("h100-llama3-8b").gpu_blocks);
}

TEST(StepTime, H100NvlScalesTheQwenModelByTheDatasheet) {
  const Preset& nvl = preset("h100nvl-qwen3-coder-30b-a3b");
  const StepTimeModel& h100 = preset("h100-qwen3-30b-a3b").step;
  // Weight- and expert-bound decode: faster by 3.9 / 3.35 TB/s on the memory terms.
  const double bw = 3.35 / 3.9;
  EXPECT_NEAR(nvl.step.linear_us(1), h100.linear_us(1) * bw, 1e-6);
  // Compute-bound prefill: slower by 989.5 / 835.5 TFLOPS.
  EXPECT_NEAR(nvl.step.linear_us(8192), h100.linear_us(8192) * 989.5 / 835.5, 1e-6);
  // MARS runs max_model_len 262,144 at gpu_memory_utilization 0.90: one such
  // request fits the pool (1.5 MiB blocks of 16 tokens).
  EXPECT_EQ(nvl.max_model_len, 262144u);
  EXPECT_GE(static_cast<std::uint64_t>(nvl.gpu_blocks) * nvl.block_size, nvl.max_model_len);
  // 0.90 x 93.1 GiB - 56.87 weights - 2.68 activations - 0.27 non-torch, over 1.5 MiB: within 1 % of the pool.
  EXPECT_NEAR((0.90 * 93.1 - 56.87 - 2.68 - 0.27) * 1024 / 1.5, nvl.gpu_blocks, 0.01 * nvl.gpu_blocks);
}

TEST(Preset, EveryBuiltInPresetIsValid) {
  for (const Preset& p : presets()) EXPECT_TRUE(validate(p)) << p.name;
}

TEST(Preset, UnknownNameListsTheKnownOnes) {
  auto r = find_preset("a100-gpt2");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOENT);
  EXPECT_NE(r.error().context().find("h100-llama3-8b"), std::string::npos);
  EXPECT_NE(r.error().context().find("a100-gpt2"), std::string::npos);
}

TEST(Preset, ImpossiblePresetsAreRefusedByName) {
  Preset p = preset("h100-llama3-8b");
  p.gpu_blocks = 0;
  EXPECT_NE(validate(p).error().context().find("no blocks"), std::string::npos);
  p = preset("h100-llama3-8b");
  p.max_model_len = p.gpu_blocks * p.block_size + 1;
  EXPECT_NE(validate(p).error().context().find("max_model_len"), std::string::npos);
  p = preset("h100-llama3-8b");
  p.token_budget = 8;
  EXPECT_NE(validate(p).error().context().find("token_budget"), std::string::npos);
  p = preset("h100-llama3-8b");
  p.step.a_dec_us_per_token = -1;
  EXPECT_FALSE(validate(p));
  p = preset("h100-qwen3-30b-a3b");
  p.step.top_k = 200;
  EXPECT_FALSE(validate(p));
}

}  // namespace
}  // namespace tandem::sim
