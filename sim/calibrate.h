// Fitting the simulator's step-time model to a real engine's measured steps
// (docs/sim.md "Calibrating from a real engine"), and presets as JSON files
// so a fitted one can be used without recompiling (tandem-sim
// --preset-file).
//
// The input is tandem-llama's --step-log: one JSON object per step with the
// shape the simulator prices (tokens, prefill_pairs, decode_context, seqs —
// computed by the same sim::Engine that plans the real steps) and the
// measured step_us. The model is preset.h's dense form,
//
//   t = t0 + b·max(N*, N) + a_pf·pairs + a_dec·ctx + a_seq·seqs,
//
// whose weight term T_w = b·N* makes max(T_w, b·N) linear in b once the
// saturating token count N* is fixed: for every candidate N* (the observed
// token counts), the non-negative least-squares fit over every subset of the
// five coefficients is solved exactly, and the N* with the least squared
// error on the training steps wins. A seeded share of the steps is held back
// and the error reported on them, overall and per step shape.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "sim/preset.h"

namespace tandem::sim {

struct StepSample {
  StepShape shape;
  std::uint32_t decode_seqs = 0;  // of shape.seqs, those decoding one token
  double measured_us = 0;
};

// EINVAL naming the file and line of the first bad record; ENOENT/EACCES for
// the file itself.
base::Result<std::vector<StepSample>> load_step_log(const std::string& path);

// One class of step shapes on the held-back steps.
struct ShapeError {
  std::string shape;  // "decode 1", "decode 2-3", "prefill 65-256", "mixed", ...
  std::size_t steps = 0;
  double measured_median_us = 0;
  double model_median_us = 0;
  double error = 0;  // (model − measured) / measured, of the medians
};

struct StepFit {
  StepTimeModel model;
  std::size_t train_steps = 0, test_steps = 0;
  double train_rmse_us = 0;
  double test_median_abs_error = 0;  // median over held-back steps of |model − measured| / measured
  std::vector<ShapeError> shapes;    // held-back steps by shape class
};

// EINVAL with fewer than 20 steps or nothing to fit.
base::Result<StepFit> fit_step_model(std::span<const StepSample> samples, double holdout, std::uint64_t seed);
// A fitted model's error on other steps (another run's log): test_* and
// shapes filled, nothing fitted.
StepFit evaluate(const StepTimeModel& model, std::span<const StepSample> samples);
std::string describe(const StepFit& fit);  // a table for the terminal and docs

// A preset as a JSON object (every field of Preset, names as in preset.h).
std::string preset_json(const Preset& p);
// Reads one back; EINVAL naming the file and the field, or what validate()
// finds wrong. `for_calibration` accepts a preset whose step model is still
// to be fitted (all zero). The returned preset's name and doc stay valid for
// the life of the process.
base::Result<Preset> load_preset_file(const std::string& path, bool for_calibration = false);

}  // namespace tandem::sim
